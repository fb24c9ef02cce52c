/* muse-bench's HTTP/1.1 client on raw POSIX sockets, 127.0.0.1 only: a load generator that
 * counts SSE events and /health replies (bench_http_load), and concurrent requests that keep
 * every response with its SSE event times (bench_http_exchange). */
#ifndef MUSE_BENCH_HTTP_H
#define MUSE_BENCH_HTTP_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#include "base/muse_common.h"

/* Where the server is: from "http://127.0.0.1:PORT" (or localhost). */
typedef struct {
    struct sockaddr_in addr;
    char host[64]; /* the Host header */
} bench_http_target;

/* Parses url; -1 unless it is http://127.0.0.1[:PORT] or http://localhost[:PORT]. */
int bench_http_parse_url(const char *url, bench_http_target *t);

/* ---- load: many small requests, counted ---- */

enum { BENCH_HTTP_HEALTH, BENCH_HTTP_SSE };

typedef struct {
    bench_http_target target;
    int mode;        /* BENCH_HTTP_HEALTH: GET /health keep-alive; BENCH_HTTP_SSE: chat streams */
    long requests;   /* how many to run */
    long max_tokens; /* SSE: each chat request's max_tokens */
    long done, errors, events, stamped; /* results */
    double *lat_us, *gap_us; /* stamped latency ("t<ns>" contents), per-stream inter-arrival */
    size_t nlat, ngap, cap_lat, cap_gap;
    double *req_us; /* per-request latency (health) */
    size_t nreq, cap_req;
} bench_http_load;

/* Runs b->requests requests over conc connections for at most max_s seconds; the seconds. */
double bench_http_load_run(bench_http_load *b, int conc, double max_s);
void bench_http_load_free(bench_http_load *b);

/* ---- exchanges: a few requests at once, each response kept whole ---- */

/* One SSE "data:" event of a response (not [DONE]): its payload inside body, its arrival. */
typedef struct {
    size_t at, len;
    int64_t t_ns;
} bench_sse_event;

typedef struct {
    /* request */
    const char *method, *path; /* "POST", "/v1/completions" */
    const char *body;          /* NULL for none */
    size_t body_len;
    /* response */
    int status;              /* 0 when no response came */
    int64_t sent_ns, end_ns; /* request written; response complete (CLOCK_MONOTONIC) */
    muse_buf body_out;       /* the de-chunked body */
    bench_sse_event *events; /* SSE data events, in order */
    size_t nevents, cap_events;
    char error[160]; /* transport failure, empty when none */
} bench_http_exchange;

/* Sends every request of ex[n] at once (one connection each, Connection: close) and reads all
 * responses, for at most max_s seconds. Fills each exchange's response fields; 0 when every
 * exchange got a whole response, -1 when any did not (see its error). */
int bench_http_exchange_run(const bench_http_target *t, bench_http_exchange *ex, int n,
                            double max_s);
/* Frees the response fields (not the request's). */
void bench_http_exchange_free(bench_http_exchange *ex);

#endif
