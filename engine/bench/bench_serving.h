/* What the serving benchmarks share (bench_serving.c): the server, one streamed completion as
 * the client saw it, and running a batch of them. */
#ifndef MUSE_BENCH_SERVING_H
#define MUSE_BENCH_SERVING_H

#include <stdbool.h>
#include <stdint.h>

#include "base/flags.h"
#include "bench_http.h"

enum { MAX_LIST = 16, MAX_STREAMS = 256 };

/* Where the server is and what it says about itself. */
typedef struct {
    bench_http_target target;
    char model[128];
    long long context; /* /health context_length */
    long long lanes;   /* /health streams.max */
    long long id_range;
    double timeout_s;
    const char *response_format; /* JSON of the requests' response_format, or NULL */
} serving;

/* One streamed completion as the client saw it. */
typedef struct {
    bool ok;
    char error[256];
    double ttft_ms;        /* request sent -> first SSE event showing a token */
    double decode_tok_s;   /* (tokens - 1) / (finish event - first token event) */
    double engine_ttft_ms; /* muse.ttft_ms */
    long long completion_tokens, prompt_tokens, cached_tokens;
    char token_sha[72];
    int64_t sent_ns, first_ns, finish_ns;
} stream_result;

/* GET /health through url; 0, or non-zero after printing why. */
int serving_start(const char *cmd, const char *url, serving *sv);
/* n streamed /v1/completions at once (prompt and seed named by salts[i]); results in res[n]. */
void run_streams(const serving *sv, const uint64_t *salts, int n, long long prompt_tokens,
                 long long max_tokens, double temperature, stream_result *res);

/* The flags the serving commands share. */
#define SERVING_FLAGS(sv, url, salt, as_json)                                                      \
    MUSE_FLAG_S("url", &(url), "URL", "http://127.0.0.1:PORT (127.0.0.1 only)"),                   \
        MUSE_FLAG_L("id-range", &(sv).id_range, 2, 1 << 30, "N",                                   \
                    "prompt ids in [0, N) (below the pack's vocabulary)"),                         \
        MUSE_FLAG_L("salt", &(salt), 0, 1LL << 62, "N", "names the prompts",                       \
                    .def = "the time, so every run is cold"),                                      \
        MUSE_FLAG_D("timeout", &(sv).timeout_s, 1, 86400, "S",                                     \
                    "seconds a request batch may take"),                                           \
        MUSE_FLAG_B("json", &(as_json), "print JSON instead of a table")

#endif
