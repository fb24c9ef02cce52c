/* muse-bench's HTTP/1.1 client on raw POSIX sockets (poll, TCP_NODELAY), 127.0.0.1 only. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"
#include "bench_http.h"
#include "base/muse_common.h"

int bench_http_parse_url(const char *url, bench_http_target *t)
{
    const char *p = url;
    if (strncmp(p, "http://", 7) != 0) return -1;
    p += 7;
    char h[64];
    size_t n = strcspn(p, ":/");
    if (n == 0 || n >= sizeof h) return -1;
    memcpy(h, p, n);
    h[n] = 0;
    if (strcmp(h, "127.0.0.1") != 0 && strcmp(h, "localhost") != 0) return -1;
    long port = 80;
    if (p[n] == ':') {
        char *end;
        port = strtol(p + n + 1, &end, 10);
        if (port < 1 || port > 65535 || (*end && *end != '/')) return -1;
    }
    memset(t, 0, sizeof *t);
    t->addr.sin_family = AF_INET;
    t->addr.sin_port = htons((uint16_t)port);
    t->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    snprintf(t->host, sizeof t->host, "127.0.0.1:%ld", port);
    return 0;
}

/* ---- load: many small requests, counted ---- */

typedef struct {
    int fd;
    int mode;
    char buf[1 << 16];
    size_t len;
    int headers_done, chunked, status;
    long content_length;
    int64_t sent_ns, last_event_ns;
} http_conn;

static int write_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_request(bench_http_load *b, http_conn *c)
{
    char req[1024];
    int n;
    if (c->mode == BENCH_HTTP_HEALTH) {
        n = snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: %s\r\n\r\n", b->target.host);
    } else {
        char body[256];
        int bn = snprintf(body, sizeof body,
                          "{\"model\":\"muse-spark\",\"stream\":true,\"max_tokens\":%ld,"
                          "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
                          b->max_tokens);
        n = snprintf(req, sizeof req,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                     "application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
                     b->target.host, bn, body);
    }
    c->len = 0;
    c->headers_done = c->chunked = c->status = 0;
    c->content_length = -1;
    c->sent_ns = muse_now_ns();
    c->last_event_ns = 0;
    return write_all(c->fd, req, (size_t)n);
}

static int conn_open(bench_http_load *b, http_conn *c)
{
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0) return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (const struct sockaddr *)&b->target.addr, sizeof b->target.addr) != 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    return send_request(b, c);
}

/* Parses the status line and headers once complete; returns the header length or 0. */
static size_t parse_headers(http_conn *c)
{
    c->buf[c->len < sizeof c->buf ? c->len : sizeof c->buf - 1] = 0;
    char *end = strstr(c->buf, "\r\n\r\n");
    if (!end) return 0;
    c->status = atoi(c->buf + 9);
    c->headers_done = 1;
    for (char *p = c->buf; p < end; p++) {
        if (strncasecmp(p, "\r\ncontent-length:", 17) == 0) c->content_length = atol(p + 17);
        if (strncasecmp(p, "\r\ntransfer-encoding: chunked", 28) == 0) c->chunked = 1;
    }
    return (size_t)(end + 4 - c->buf);
}

/* One SSE line: counts data events, the stamp latency and the inter-arrival gap. */
static void sse_line(bench_http_load *b, http_conn *c, const char *line, size_t n, int64_t t_ns)
{
    if (n < 6 || memcmp(line, "data: ", 6) != 0 ||
        (n >= 12 && memcmp(line, "data: [DONE]", 12) == 0))
        return;
    b->events++;
    if (c->last_event_ns) /* the first event's wait is time to first token, not a gap */
        bench_push_sample(&b->gap_us, &b->ngap, &b->cap_gap,
                          (double)(t_ns - c->last_event_ns) / 1e3);
    c->last_event_ns = t_ns;
    const char *key = "\"content\":\"t";
    char tmp[256];
    size_t m = n < sizeof tmp - 1 ? n : sizeof tmp - 1;
    memcpy(tmp, line, m);
    tmp[m] = 0;
    const char *p = strstr(tmp, key);
    if (p) {
        long long stamp = atoll(p + strlen(key));
        if (stamp > 0 && stamp <= t_ns) {
            bench_push_sample(&b->lat_us, &b->nlat, &b->cap_lat, (double)(t_ns - stamp) / 1e3);
            b->stamped++;
        }
    }
}

/* New bytes arrived on c. Returns 1 when the response is complete. */
static int conn_consume(bench_http_load *b, http_conn *c, int64_t t_ns)
{
    size_t hdr = 0;
    if (!c->headers_done) {
        if (!(hdr = parse_headers(c))) return 0;
        if (c->status != 200) b->errors++;
    }
    if (c->mode == BENCH_HTTP_HEALTH) {
        size_t body = c->len - hdr;
        if (c->content_length >= 0 && body >= (size_t)c->content_length) {
            size_t used = hdr + (size_t)c->content_length;
            memmove(c->buf, c->buf + used, c->len - used);
            c->len -= used;
            return 1;
        }
        if (c->chunked && c->len >= 5 && memcmp(c->buf + c->len - 5, "0\r\n\r\n", 5) == 0) {
            c->len = 0;
            return 1;
        }
        if (hdr) { /* keep the header parsed: drop it */
            memmove(c->buf, c->buf + hdr, c->len - hdr);
            c->len -= hdr;
            c->content_length = c->content_length >= 0 ? c->content_length : -1;
        }
        return 0;
    }
    if (hdr) {
        memmove(c->buf, c->buf + hdr, c->len - hdr);
        c->len -= hdr;
    }
    size_t start = 0;
    for (size_t i = 0; i < c->len; i++)
        if (c->buf[i] == '\n') {
            sse_line(b, c, c->buf + start, i - start, t_ns);
            start = i + 1;
        }
    memmove(c->buf, c->buf + start, c->len - start);
    c->len -= start;
    return 0; /* SSE ends at EOF (Connection: close) */
}

/* Runs b->requests requests over `conc` connections, for at most max_s seconds. */
double bench_http_load_run(bench_http_load *b, int conc, double max_s)
{
    http_conn *cs = MUSE_CALLOC((size_t)conc, sizeof *cs);
    struct pollfd *pf = MUSE_CALLOC((size_t)conc, sizeof *pf);
    long started = 0;
    double t0 = muse_now_s();
    for (int i = 0; i < conc; i++) {
        cs[i].fd = -1;
        cs[i].mode = b->mode;
        if (started < b->requests) {
            if (conn_open(b, &cs[i]) == 0)
                started++;
            else
                b->errors++;
        }
    }
    while (b->done < started && muse_now_s() - t0 < max_s) {
        for (int i = 0; i < conc; i++) pf[i] = (struct pollfd){cs[i].fd, POLLIN, 0};
        if (poll(pf, (nfds_t)conc, 100) < 0 && errno != EINTR) break;
        for (int i = 0; i < conc; i++) {
            http_conn *c = &cs[i];
            if (c->fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
            int64_t t = muse_now_ns();
            int finished = 0, reopen = 0;
            if (r > 0) {
                c->len += (size_t)r;
                if (conn_consume(b, c, t)) {
                    finished = 1;
                    bench_push_sample(&b->req_us, &b->nreq, &b->cap_req,
                                      (double)(t - c->sent_ns) / 1e3);
                }
                if (!finished && c->len >= sizeof c->buf - 1) c->len = 0; /* oversized: skip */
            } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
                if (c->mode == BENCH_HTTP_SSE && c->headers_done)
                    finished = 1;
                else
                    b->errors++;
                close(c->fd);
                c->fd = -1;
                reopen = 1;
            }
            if (finished) b->done++;
            if (finished && started < b->requests) {
                int rc = reopen || c->fd < 0 ? conn_open(b, c) : send_request(b, c);
                if (rc == 0)
                    started++;
                else
                    b->errors++, started++, b->done++;
            } else if (finished && c->fd >= 0 && c->mode == BENCH_HTTP_HEALTH) {
                close(c->fd);
                c->fd = -1;
            }
        }
    }
    double t = muse_now_s() - t0;
    for (int i = 0; i < conc; i++)
        if (cs[i].fd >= 0) close(cs[i].fd);
    free(cs);
    free(pf);
    return t;
}

void bench_http_load_free(bench_http_load *b)
{
    free(b->lat_us);
    free(b->gap_us);
    free(b->req_us);
}

/* ---- exchanges: whole responses with SSE event times ---- */

enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_DONE };

typedef struct {
    int fd, done;
    char head[16384]; /* status line and headers, until the blank line */
    size_t head_len;
    int headers_done, chunked, chunk_state;
    long long content_length; /* -1: until EOF or the last chunk */
    char size_line[32];
    size_t size_len;
    unsigned long long chunk_left;
    size_t scan_at; /* body_out bytes already split into lines */
} exch_conn;

enum { EXCH_MAX_BODY = 64 << 20 };

static void exch_fail(bench_http_exchange *x, exch_conn *c, const char *what)
{
    if (!x->error[0]) snprintf(x->error, sizeof x->error, "%s", what);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->done = 1;
}

/* Splits the body's new complete lines; records each SSE data event with its arrival time. */
static void exch_scan_lines(bench_http_exchange *x, exch_conn *c, int64_t t_ns)
{
    muse_buf *b = &x->body_out;
    for (size_t i = c->scan_at; i < b->len; i++) {
        if (b->p[i] != '\n') continue;
        size_t start = c->scan_at, end = i;
        c->scan_at = i + 1;
        if (end > start && b->p[end - 1] == '\r') end--;
        if (end - start < 6 || memcmp(b->p + start, "data: ", 6) != 0) continue;
        if (end - start >= 12 && memcmp(b->p + start, "data: [DONE]", 12) == 0) continue;
        if (x->nevents == x->cap_events) {
            x->cap_events = x->cap_events ? 2 * x->cap_events : 64;
            x->events = realloc(x->events, x->cap_events * sizeof *x->events);
            MUSE_CHECK(x->events);
        }
        x->events[x->nevents++] = (bench_sse_event){start + 6, end - start - 6, t_ns};
    }
}

static void exch_body_add(bench_http_exchange *x, exch_conn *c, const char *p, size_t n)
{
    if (x->body_out.len + n > EXCH_MAX_BODY) {
        exch_fail(x, c, "response body over 64 MiB");
        return;
    }
    muse_buf_add(&x->body_out, p, n);
}

/* Body bytes in chunked transfer encoding: keeps the data, drops the framing. */
static void exch_dechunk(bench_http_exchange *x, exch_conn *c, const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && !c->done) {
        if (c->chunk_state == CH_SIZE) {
            char ch = p[i++];
            if (ch != '\n') {
                if (c->size_len + 1 >= sizeof c->size_line) {
                    exch_fail(x, c, "bad chunk size");
                    return;
                }
                c->size_line[c->size_len++] = ch;
                continue;
            }
            c->size_line[c->size_len] = 0;
            c->size_len = 0;
            char *end;
            c->chunk_left = strtoull(c->size_line, &end, 16);
            if (end == c->size_line) {
                exch_fail(x, c, "bad chunk size");
                return;
            }
            c->chunk_state = c->chunk_left ? CH_DATA : CH_DONE;
            if (!c->chunk_left) c->done = 1; /* the trailer's CRLF does not matter */
        } else if (c->chunk_state == CH_DATA) {
            size_t take = n - i < c->chunk_left ? n - i : (size_t)c->chunk_left;
            exch_body_add(x, c, p + i, take);
            i += take;
            c->chunk_left -= take;
            if (!c->chunk_left) c->chunk_state = CH_DATA_END;
        } else if (c->chunk_state == CH_DATA_END) {
            if (p[i++] == '\n') c->chunk_state = CH_SIZE;
        } else {
            i = n;
        }
    }
}

static void exch_body(bench_http_exchange *x, exch_conn *c, const char *p, size_t n)
{
    if (c->chunked) {
        exch_dechunk(x, c, p, n);
        return;
    }
    if (c->content_length >= 0) {
        size_t want = (size_t)c->content_length - x->body_out.len;
        if (n > want) n = want;
    }
    exch_body_add(x, c, p, n);
    if (c->content_length >= 0 && x->body_out.len >= (size_t)c->content_length) c->done = 1;
}

/* Status line and headers; the bytes after them go to the body. */
static void exch_head(bench_http_exchange *x, exch_conn *c, const char *p, size_t n)
{
    size_t room = sizeof c->head - 1 - c->head_len;
    size_t take = n < room ? n : room;
    memcpy(c->head + c->head_len, p, take);
    size_t old = c->head_len;
    c->head_len += take;
    c->head[c->head_len] = 0;
    char *end = strstr(c->head, "\r\n\r\n");
    if (!end) {
        if (c->head_len == sizeof c->head - 1) exch_fail(x, c, "response headers over 16 KiB");
        return;
    }
    c->headers_done = 1;
    if (strncmp(c->head, "HTTP/1.", 7) != 0) {
        exch_fail(x, c, "not an HTTP/1.x response");
        return;
    }
    x->status = atoi(c->head + 9);
    for (char *h = c->head; h < end; h++) {
        if (strncasecmp(h, "\r\ncontent-length:", 17) == 0) c->content_length = atoll(h + 17);
        if (strncasecmp(h, "\r\ntransfer-encoding: chunked", 28) == 0) c->chunked = 1;
    }
    if (c->content_length > EXCH_MAX_BODY) {
        exch_fail(x, c, "response body over 64 MiB");
        return;
    }
    size_t used = (size_t)(end + 4 - c->head) - old; /* bytes of p that were header */
    if (c->content_length == 0) c->done = 1;
    if (!c->done && used < n) exch_body(x, c, p + used, n - used);
}

static int exch_send(const bench_http_target *t, bench_http_exchange *x, exch_conn *c)
{
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0) return exch_fail(x, c, "socket() failed"), -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (const struct sockaddr *)&t->addr, sizeof t->addr) != 0)
        return exch_fail(x, c, "cannot connect (is the server up?)"), -1;
    char head[512];
    int n =
        snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s",
                 x->method, x->path, t->host, x->body ? "Content-Type: application/json\r\n" : "");
    if (x->body)
        n += snprintf(head + n, sizeof head - (size_t)n, "Content-Length: %zu\r\n", x->body_len);
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    x->sent_ns = muse_now_ns();
    if (write_all(c->fd, head, (size_t)n) || (x->body && write_all(c->fd, x->body, x->body_len)))
        return exch_fail(x, c, "cannot send the request"), -1;
    return 0;
}

int bench_http_exchange_run(const bench_http_target *t, bench_http_exchange *ex, int n,
                            double max_s)
{
    exch_conn *cs = MUSE_CALLOC((size_t)n, sizeof *cs);
    struct pollfd *pf = MUSE_CALLOC((size_t)n, sizeof *pf);
    char *buf = MUSE_MALLOC(1 << 16);
    for (int i = 0; i < n; i++) {
        bench_http_exchange *x = &ex[i];
        x->status = 0;
        x->sent_ns = x->end_ns = 0;
        x->body_out = (muse_buf){0};
        x->events = NULL;
        x->nevents = x->cap_events = 0;
        x->error[0] = 0;
        cs[i] = (exch_conn){.fd = -1, .content_length = -1};
    }
    for (int i = 0; i < n; i++) exch_send(t, &ex[i], &cs[i]);
    double t0 = muse_now_s();
    int open;
    do {
        open = 0;
        for (int i = 0; i < n; i++) {
            pf[i] = (struct pollfd){cs[i].done ? -1 : cs[i].fd, POLLIN, 0};
            open += !cs[i].done;
        }
        if (!open) break;
        if (poll(pf, (nfds_t)n, 100) < 0 && errno != EINTR) break;
        for (int i = 0; i < n; i++) {
            exch_conn *c = &cs[i];
            bench_http_exchange *x = &ex[i];
            if (c->done || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t r = recv(c->fd, buf, 1 << 16, 0);
            int64_t now = muse_now_ns();
            if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (r <= 0) { /* EOF ends a body without length; anything else came short */
                if (!c->headers_done || c->chunked || c->content_length >= 0)
                    exch_fail(x, c, r < 0 ? "recv failed" : "connection closed mid-response");
                c->done = 1;
            } else if (!c->headers_done) {
                exch_head(x, c, buf, (size_t)r);
            } else {
                exch_body(x, c, buf, (size_t)r);
            }
            exch_scan_lines(x, c, now);
            if (c->done) x->end_ns = now;
        }
    } while (muse_now_s() - t0 < max_s);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (!cs[i].done) exch_fail(&ex[i], &cs[i], "no whole response within the time limit");
        if (cs[i].fd >= 0) close(cs[i].fd);
        if (ex[i].error[0]) rc = -1;
    }
    free(buf);
    free(pf);
    free(cs);
    return rc;
}

void bench_http_exchange_free(bench_http_exchange *ex)
{
    free(ex->body_out.p);
    free(ex->events);
    ex->body_out = (muse_buf){0};
    ex->events = NULL;
    ex->nevents = ex->cap_events = 0;
}
