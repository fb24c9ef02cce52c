/* Socket IO for the ranks' TCP links (net.h): poll-bounded reads and writes, HOST:PORT
 * parsing, listen, connect and accept with deadlines. */
#include "tp/net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Waits for events on fd until deadline: 1 ready, 0 timed out, -1 error (errno). */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int left = -1;
        if (deadline_ms >= 0) {
            int64_t d = deadline_ms - muse_now_ms_int();
            left = d > 0 ? (d > 1000000 ? 1000000 : (int)d) : 0;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0 && deadline_ms >= 0 && muse_now_ms_int() < deadline_ms) continue;
        return n;
    }
}

static int timed_out(muse_err *e, int64_t deadline_ms)
{
    (void)deadline_ms;
    return muse_fail(e, "no answer before the deadline (--tp-timeout-ms)");
}

int muse_net_write(int fd, const void *buf, size_t len, int64_t deadline_ms, muse_err *e)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(fd, POLLOUT, deadline_ms);
            if (w < 0) return muse_fail(e, "poll: %s", strerror(errno));
            if (w == 0) return timed_out(e, deadline_ms);
            continue;
        }
        return muse_fail(e, "send: %s", n < 0 ? strerror(errno) : "nothing sent");
    }
    return 0;
}

int muse_net_read(int fd, void *buf, size_t len, int64_t deadline_ms, muse_err *e)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return muse_fail(e, "closed the connection");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = wait_fd(fd, POLLIN, deadline_ms);
            if (w < 0) return muse_fail(e, "poll: %s", strerror(errno));
            if (w == 0) return timed_out(e, deadline_ms);
            continue;
        }
        return muse_fail(e, "recv: %s", strerror(errno));
    }
    return 0;
}

int muse_net_split(const char *flag, const char *hp, char *host, size_t host_len, char *port,
                   size_t port_len, muse_err *e)
{
    const char *accepted = "give HOST:PORT, e.g. 10.0.0.1:29500 or [::1]:29500";
    const char *colon, *h = hp;
    size_t hl;
    if (hp[0] == '[') { /* [IPv6]:PORT */
        const char *close = strchr(hp, ']');
        if (!close || close[1] != ':')
            return muse_fail(e, "%s %s: an [IPv6] address needs ]:PORT; %s", flag, hp, accepted);
        h = hp + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon || strchr(hp, ':') != colon)
            return muse_fail(e, "%s %s: no :PORT; %s", flag, hp, accepted);
        hl = (size_t)(colon - hp);
    }
    if (!hl || hl >= host_len)
        return muse_fail(e, "%s %s: the host is empty or too long; %s", flag, hp, accepted);
    const char *ps = colon + 1;
    size_t pl = strlen(ps);
    long v = 0;
    for (size_t i = 0; i < pl; i++) {
        if (ps[i] < '0' || ps[i] > '9' || v > 65535) {
            v = -1;
            break;
        }
        v = v * 10 + (ps[i] - '0');
    }
    if (!pl || pl >= port_len || v < 1 || v > 65535)
        return muse_fail(e, "%s %s: the port must be a number 1 .. 65535; %s", flag, hp, accepted);
    memcpy(host, h, hl);
    host[hl] = 0;
    memcpy(port, ps, pl + 1);
    return 0;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int muse_net_listen(const char *host, const char *port, muse_err *e)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) return muse_fail(e, "%s:%s: %s", host, port, gai_strerror(rc));
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 64) || set_nonblock(fd)) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return muse_fail(e, "cannot listen on %s:%s: %s", host, port, strerror(err));
    return fd;
}

int muse_net_connect(const char *host, const char *port, int64_t deadline_ms, muse_err *e)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) return muse_fail(e, "%s", gai_strerror(rc));
    int fd = -1, err = ECONNREFUSED;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline_ms);
            socklen_t sl = sizeof err;
            if (w > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) == 0 && err == 0) break;
            if (w == 0) err = ETIMEDOUT;
        } else {
            err = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) return muse_fail(e, "%s", strerror(err));
    return fd;
}

int muse_net_accept(int lfd, int64_t deadline_ms, char *peer, size_t peer_len, muse_err *e)
{
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            char h[NI_MAXHOST] = "?", p[NI_MAXSERV] = "?";
            getnameinfo((struct sockaddr *)&sa, sl, h, sizeof h, p, sizeof p,
                        NI_NUMERICHOST | NI_NUMERICSERV);
            snprintf(peer, peer_len, "%s:%s", h, p);
            return fd;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return muse_fail(e, "accept: %s", strerror(errno));
        int w = wait_fd(lfd, POLLIN, deadline_ms);
        if (w < 0) return muse_fail(e, "poll: %s", strerror(errno));
        if (w == 0) return timed_out(e, deadline_ms);
    }
}

void muse_net_tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}
