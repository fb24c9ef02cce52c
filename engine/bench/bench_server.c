/* muse-bench server and stamp-engine: nginx + ngx_muse_module measured over HTTP (added latency,
 * SSE events/s, /health req/s), and the ring-server engine whose tokens carry their publish
 * time. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "bench.h"
#include "bench_http.h"
#include "bench_table.h"
#include "base/flags.h"
#include "base/muse_common.h"
#include "serve/ring_server.h"

int bench_cmd_server(int argc, char **argv)
{
    const char *url = NULL;
    long long requests = 0, conc = 0, max_tokens = 256;
    double max_s = 20;
    bool as_json = false;
    static const char *const modes[] = {"latency", "sse", "health", "all", NULL};
    int mode_i = 3;
    const muse_flag table[] = {
        MUSE_FLAG_S("url", &url, "URL", "http://127.0.0.1:PORT (127.0.0.1 only)", .required = true),
        MUSE_FLAG_E("mode", &mode_i, modes, "what to measure"),
        MUSE_FLAG_L("requests", &requests, 1, 100000000, "N", "requests a measure",
                    .def = "by mode"),
        MUSE_FLAG_L("concurrency", &conc, 1, 1000, "C", "connections at once", .def = "by mode"),
        MUSE_FLAG_L("max-tokens", &max_tokens, 1, 1000000, "N", "tokens a request"),
        MUSE_FLAG_D("seconds", &max_s, 0.1, 600, "S", "longest a measure runs"),
        MUSE_FLAG_B("json", &as_json, "print JSON instead of a table"),
    };
    int prc = bench_parse_flags(
        "server", "Added latency (with stamp-engine), SSE events/s, /health req/s; raw sockets.\n",
        table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    const char *mode = modes[mode_i];
    bench_http_load proto = {0};
    if (!url || bench_http_parse_url(url, &proto.target))
        return bench_usage_error("server",
                                 "--url http://127.0.0.1:PORT is required (127.0.0.1 only)");
    bool all = strcmp(mode, "all") == 0;
    if (!all && strcmp(mode, "latency") && strcmp(mode, "sse") && strcmp(mode, "health"))
        return bench_usage_error("server", "--mode is latency, sse, health or all");
    signal(SIGPIPE, SIG_IGN);
    static const char *const cols[] = {"measure", "requests", "conc", "errors", "value",
                                       "unit",    "p50",      "p99",  "seconds"};
    bench_table t;
    bench_table_begin(&t, "server", "nginx + ngx_muse_module + engine over HTTP/1.1 on 127.0.0.1",
                      cols, 9, as_json);
    bench_table_note(&t, "url", url);
    if (all || !strcmp(mode, "latency")) {
        bench_http_load b = proto;
        b.mode = BENCH_HTTP_SSE;
        b.requests = requests ? requests : 20;
        b.max_tokens = max_tokens;
        double s = bench_http_load_run(&b, 1, max_s);
        if (b.stamped) {
            double p50 = bench_quantile(b.lat_us, b.nlat, 0.5),
                   p99 = bench_quantile(b.lat_us, b.nlat, 0.99);
            const char *cells[] = {"added latency (engine stamp -> client)",
                                   bench_fmt("%.0f", b.done),
                                   "1",
                                   bench_fmt("%.0f", b.errors),
                                   bench_fmt("%.0f", b.stamped),
                                   "events",
                                   bench_fmt("%.1f", p50),
                                   bench_fmt("%.1f", p99),
                                   bench_fmt("%.2f", s)};
            bench_table_row(&t, cells);
        }
        double g50 = bench_quantile(b.gap_us, b.ngap, 0.5),
               g99 = bench_quantile(b.gap_us, b.ngap, 0.99);
        const char *cells[] = {
            "inter-arrival per stream (us)", bench_fmt("%.0f", b.done),   "1",
            bench_fmt("%.0f", b.errors),     bench_fmt("%.0f", b.events), "events",
            bench_fmt("%.1f", g50),          bench_fmt("%.1f", g99),      bench_fmt("%.2f", s)};
        bench_table_row(&t, cells);
        bench_http_load_free(&b);
    }
    if (all || !strcmp(mode, "sse")) {
        bench_http_load b = proto;
        b.mode = BENCH_HTTP_SSE;
        b.requests = requests ? requests : 200;
        b.max_tokens = max_tokens;
        int c = conc ? (int)conc : 16;
        double s = bench_http_load_run(&b, c, max_s);
        const char *cells[] = {"SSE data events/s",
                               bench_fmt("%.0f", b.done),
                               bench_fmt("%.0f", c),
                               bench_fmt("%.0f", b.errors),
                               bench_fmt("%.0f", (double)b.events / s),
                               "events/s",
                               "-",
                               "-",
                               bench_fmt("%.2f", s)};
        bench_table_row(&t, cells);
        bench_http_load_free(&b);
    }
    if (all || !strcmp(mode, "health")) {
        bench_http_load b = proto;
        b.mode = BENCH_HTTP_HEALTH;
        b.requests = requests ? requests : 50000;
        int c = conc ? (int)conc : 16;
        double s = bench_http_load_run(&b, c, max_s);
        double p50 = bench_quantile(b.req_us, b.nreq, 0.5),
               p99 = bench_quantile(b.req_us, b.nreq, 0.99);
        const char *cells[] = {"/health keep-alive req/s (us)",
                               bench_fmt("%.0f", b.done),
                               bench_fmt("%.0f", c),
                               bench_fmt("%.0f", b.errors),
                               bench_fmt("%.0f", (double)b.done / s),
                               "req/s",
                               bench_fmt("%.1f", p50),
                               bench_fmt("%.1f", p99),
                               bench_fmt("%.2f", s)};
        bench_table_row(&t, cells);
        bench_http_load_free(&b);
    }
    bench_table_end(&t);
    return 0;
}

/* ---- stamp-engine: a ring-server engine whose every token carries its publish time ---- */

/* Each streamed request gets --tokens content deltas "t<CLOCK_MONOTONIC ns at emit>", --gap-us
 * apart, so the client's receive time minus the stamp is the transport's added latency (one
 * machine, one clock). */
typedef struct {
    int used, step;
    muse_slot_ref ref;
    uint32_t flags;
    int64_t next_ns;
} stamp_stream;

static volatile sig_atomic_t stamp_stop;
static void on_stamp_signal(int sig)
{
    (void)sig;
    stamp_stop = 1;
}

static int stamp_step(muse_server *s, stamp_stream *st, long tokens, long gap_us)
{
    char buf[512];
    int n;
    if (!(st->flags & MUSE_REQ_STREAM)) {
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"b\",\"object\":\"chat.completion\",\"model\":\"muse-spark\","
                     "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                     "\"x\"},\"finish_reason\":\"stop\"}]}");
        return muse_server_emit(s, st->ref, MUSE_EV_BODY, 0, buf, (size_t)n) != 1;
    }
    if (st->step < tokens)
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
                     "\"delta\":{\"content\":\"t%lld\"}}]}",
                     (long long)muse_now_ns());
    else if (st->step == tokens)
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
                     "\"delta\":{},\"finish_reason\":\"length\"}]}");
    else
        return 1;
    int rc = muse_server_emit(s, st->ref, MUSE_EV_DATA, 0, buf, (size_t)n);
    if (rc < 0) return 1;
    if (rc == 0) {
        st->step++;
        st->next_ns = muse_now_ns() + gap_us * 1000;
    }
    return 0;
}

static void stamp_health(muse_server *s, int running, int slots)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf,
                     "{\"status\":\"ok\",\"model\":\"muse-spark\",\"engine\":{\"pid\":%d,"
                     "\"version\":\"bench\",\"uptime_s\":1},\"streams\":{\"running\":%d,"
                     "\"queued\":0,\"max\":%d},\"context_length\":4096}",
                     (int)getpid(), running, slots);
    muse_server_set_health(s, buf, (size_t)n);
}

int bench_cmd_stamp_engine(int argc, char **argv)
{
    muse_server_opts o = {.slots = 64, .socket_gid = -1};
    long long tokens = 64, gap_us = 1000, slots = 64, gid = -1;
    muse_err e = {{0}};
    const muse_flag table[] = {
        MUSE_FLAG_S("shm", &o.shm_name, "NAME", "the shared-memory segment", .required = true),
        MUSE_FLAG_S("socket", &o.socket_path, "PATH", "the doorbell socket", .required = true),
        MUSE_FLAG_L("slots", &slots, 1, 4096, "N", "request slots"),
        MUSE_FLAG_L("tokens", &tokens, 1, 1000000, "N", "tokens a request"),
        MUSE_FLAG_L("gap-us", &gap_us, 0, 10000000, "US", "between two tokens of a stream"),
        MUSE_FLAG_L("gid", &gid, -1, 1 << 30, "G", "the socket's group; -1: the process's"),
    };
    int prc = bench_parse_flags(
        "stamp-engine",
        "An engine for nginx whose tokens carry their CLOCK_MONOTONIC publish time.\n", table,
        sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    if (!o.shm_name || !o.socket_path)
        return bench_usage_error("stamp-engine", "--shm NAME and --socket PATH are required");
    o.slots = (int)slots;
    o.socket_gid = (int)gid;
    muse_server *s;
    if (muse_server_start(&o, &s, &e)) {
        fprintf(stderr, "muse-bench stamp-engine: %s\n", e.msg);
        return 1;
    }
    signal(SIGTERM, on_stamp_signal);
    signal(SIGINT, on_stamp_signal);
    signal(SIGPIPE, SIG_IGN);
    stamp_stream *sts = MUSE_CALLOC((size_t)slots, sizeof *sts);
    stamp_health(s, 0, (int)slots);
    muse_server_set_state(s, MUSE_ENGINE_SERVING);
    printf("ready\n");
    fflush(stdout);
    int64_t last_health = 0;
    while (!stamp_stop) {
        int running = 0;
        int64_t next = INT64_MAX;
        for (int i = 0; i < slots; i++) {
            stamp_stream *st = &sts[i];
            if (!st->used) continue;
            int done = muse_server_is_cancelled(s, st->ref);
            if (!done && muse_now_ns() >= st->next_ns) done = stamp_step(s, st, tokens, gap_us);
            if (done) {
                muse_server_finish(s, st->ref);
                st->used = 0;
                continue;
            }
            running++;
            if (st->next_ns < next) next = st->next_ns;
        }
        /* Sleep until the next token is due (or a request comes), never spin. */
        int64_t wait_ns = running ? next - muse_now_ns() : 50000000;
        int wait_ms = wait_ns <= 0 ? 0 : (int)(wait_ns / 1000000);
        if (wait_ns > 0 && wait_ms == 0) {
            struct timespec ts = {0, (long)wait_ns};
            nanosleep(&ts, NULL);
        } else if (wait_ns > 0 || !running) {
            muse_server_wait(s, wait_ms);
        }
        muse_request rq;
        while (muse_server_next_request(s, &rq) == 1) {
            int placed = 0;
            for (int i = 0; i < slots && !placed; i++)
                if (!sts[i].used) {
                    sts[i] = (stamp_stream){1, 0, rq.ref, rq.flags, muse_now_ns()};
                    placed = 1;
                }
            if (!placed) muse_server_finish(s, rq.ref);
        }
        if (muse_now_ns() - last_health > 200000000) {
            stamp_health(s, running, (int)slots);
            last_health = muse_now_ns();
        }
    }
    muse_server_stop(s);
    free(sts);
    return 0;
}
