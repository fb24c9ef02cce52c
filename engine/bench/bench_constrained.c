/* muse-bench constrained: tokens/s of streams held to a JSON Schema (response_format
 * json_schema) against the same streams free (same prompts, seeds and max_tokens), through the
 * server's HTTP API, so the engine's whole path is in it: the mask, its copy into the sampler,
 * the masked draw, the automaton's step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "base/muse_common.h"
#include "bench.h"
#include "bench_serving.h"
#include "bench_table.h"

typedef struct {
    double *rate; /* tok/s per stream */
    size_t nrate;
    double *full; /* the same, of the streams that ran to max_tokens (equal lengths) */
    size_t nfull;
    double tokens, wall, ttft_sum;
    long requests, errors, nttft;
} mode_stats;

static void add_batch(mode_stats *m, const stream_result *r, int n, long long max_tokens)
{
    int64_t t0 = INT64_MAX, t1 = 0;
    for (int i = 0; i < n; i++) {
        m->requests++;
        if (!r[i].ok) {
            m->errors++;
            continue;
        }
        m->tokens += (double)r[i].completion_tokens;
        m->ttft_sum += r[i].ttft_ms;
        m->nttft++;
        if (isfinite(r[i].decode_tok_s)) m->rate[m->nrate++] = r[i].decode_tok_s;
        if (isfinite(r[i].decode_tok_s) && r[i].completion_tokens == max_tokens)
            m->full[m->nfull++] = r[i].decode_tok_s;
        if (r[i].sent_ns < t0) t0 = r[i].sent_ns;
        if (r[i].finish_ns > t1) t1 = r[i].finish_ns;
    }
    if (t1 > t0) m->wall += (double)(t1 - t0) / 1e9;
}

static void row(bench_table *t, int s, const char *mode, mode_stats *m, double ratio)
{
    long ok = m->requests - m->errors;
    const char *cells[] = {bench_fmt("%.0f", (double)s),
                           mode,
                           bench_fmt("%.0f", (double)m->requests),
                           bench_fmt("%.0f", (double)m->errors),
                           ok ? bench_fmt("%.1f", m->tokens / (double)ok) : "-",
                           bench_fmt("%.2f", bench_quantile(m->rate, m->nrate, 0.5)),
                           bench_fmt("%.0f", (double)m->nfull),
                           bench_fmt("%.2f", bench_quantile(m->full, m->nfull, 0.5)),
                           bench_fmt("%.2f", m->wall > 0 ? m->tokens / m->wall : NAN),
                           m->nttft ? bench_fmt("%.0f", m->ttft_sum / (double)m->nttft) : "-",
                           isfinite(ratio) ? bench_fmt("%.3f", ratio) : "-"};
    bench_table_row(t, cells);
}

/* The response_format of the requests: {"type":"json_schema","json_schema":{...}}. */
static char *response_format(const char *path, muse_err *e)
{
    char *text = NULL;
    size_t len = 0;
    if (muse_read_file(path, (size_t)16 << 20, &text, &len, e)) return NULL;
    cJSON *schema = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(schema)) {
        cJSON_Delete(schema);
        muse_fail(e, "--schema %s: not a JSON object (a JSON Schema)", path);
        return NULL;
    }
    cJSON *rf = cJSON_CreateObject(), *js = cJSON_CreateObject();
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON_AddStringToObject(js, "name", "bench");
    cJSON_AddItemToObject(js, "schema", schema);
    cJSON_AddItemToObject(rf, "json_schema", js);
    char *out = cJSON_PrintUnformatted(rf);
    cJSON_Delete(rf);
    return out;
}

int bench_cmd_constrained(int argc, char **argv)
{
    serving sv = {.id_range = 8000, .timeout_s = 1800};
    const char *url = NULL, *streams_s = "1,4", *schema_path = NULL;
    bool as_json = false;
    long long salt = (long long)time(NULL), tokens = 64, reps = 3, prompt_tokens = 64;
    double temperature = 0.8;
    const muse_flag table[] = {
        SERVING_FLAGS(sv, url, salt, as_json),
        MUSE_FLAG_S("schema", &schema_path, "FILE", "the JSON Schema the constrained streams use",
                    .required = true),
        MUSE_FLAG_S("streams", &streams_s, "1,4", "streams at once, two rows each"),
        MUSE_FLAG_L("tokens", &tokens, 2, 100000, "N", "max_tokens a stream"),
        MUSE_FLAG_L("reps", &reps, 1, 1000, "R", "repetitions a row (free and held alternate)"),
        MUSE_FLAG_L("prompt-tokens", &prompt_tokens, 1, 1000000, "P", "prompt tokens a stream"),
        MUSE_FLAG_D("temperature", &temperature, 0, 2, "T", "sampling temperature (fixed seeds)"),
    };
    int prc = bench_parse_flags(
        "constrained",
        "Streamed /v1/completions held to a JSON Schema (response_format json_schema) against\n"
        "the same requests free: tokens/s per stream and in aggregate, tokens a stream, TTFT.\n",
        table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    long long streams[MAX_LIST];
    char why[160];
    int ns = bench_parse_int_list("--streams", streams_s, 1, MAX_STREAMS, streams, MAX_LIST, why,
                                  sizeof why);
    if (ns < 0) return bench_usage_error("constrained", why);
    muse_err e = {{0}};
    char *rf = response_format(schema_path, &e);
    if (!rf) {
        fprintf(stderr, "muse-bench constrained: %s\n", e.msg);
        return 2;
    }
    int rc = serving_start("constrained", url, &sv);
    if (rc) {
        free(rf);
        return rc;
    }
    /* one held request first: the schema's compile and tables, reported apart */
    serving held = sv;
    held.response_format = rf;
    uint64_t warm_salt = (uint64_t)salt * 7919ull + 1;
    stream_result warm;
    run_streams(&held, &warm_salt, 1, prompt_tokens, 2, temperature, &warm);
    static const char *const cols[] = {"streams",
                                       "constraint",
                                       "requests",
                                       "errors",
                                       "tokens a stream",
                                       "tok/s per stream p50",
                                       "streams to max_tokens",
                                       "their tok/s p50",
                                       "aggregate tok/s",
                                       "TTFT mean ms",
                                       "held / free (streams to max_tokens)"};
    char title[256];
    snprintf(title, sizeof title,
             "Streams held to a JSON Schema vs free: %lld prompt tokens, max_tokens %lld, T %g, "
             "%lld reps a row",
             prompt_tokens, tokens, temperature, reps);
    bench_table t;
    bench_table_begin(&t, "constrained", title, cols, 11, as_json);
    for (int i = 0; i < ns; i++) {
        int s = (int)streams[i];
        size_t n = (size_t)(s * reps);
        mode_stats m[2] = {
            {.rate = MUSE_CALLOC(n, sizeof(double)), .full = MUSE_CALLOC(n, sizeof(double))},
            {.rate = MUSE_CALLOC(n, sizeof(double)), .full = MUSE_CALLOC(n, sizeof(double))}};
        stream_result *res = MUSE_CALLOC((size_t)s, sizeof *res);
        uint64_t *salts = MUSE_CALLOC((size_t)s, sizeof *salts);
        for (long long r = 0; r < reps; r++) {
            for (int j = 0; j < s; j++)
                salts[j] = (uint64_t)salt * 1000003ull + (uint64_t)s * 10007ull +
                           (uint64_t)r * 257ull + (uint64_t)j;
            for (int k = 0; k < 2; k++) { /* free first on even reps, held first on odd ones */
                int mode = (int)((r + k) & 1);
                run_streams(mode ? &held : &sv, salts, s, prompt_tokens, tokens, temperature, res);
                add_batch(&m[mode], res, s, tokens);
            }
        }
        /* a stream that stops early is faster a token (a shorter context): equal lengths */
        double f50 = bench_quantile(m[0].full, m[0].nfull, 0.5);
        double h50 = bench_quantile(m[1].full, m[1].nfull, 0.5);
        row(&t, s, "free", &m[0], NAN);
        row(&t, s, "json_schema", &m[1], h50 / f50);
        for (int k = 0; k < 2; k++) {
            free(m[k].rate);
            free(m[k].full);
        }
        free(res);
        free(salts);
    }
    bench_table_note(&t, "url", url);
    bench_table_note(&t, "schema", schema_path);
    char note[256];
    snprintf(note, sizeof note, "%s (its TTFT %.0f ms: the compile and the tables)",
             warm.ok ? "one held request first" : "the first held request failed", warm.ttft_ms);
    bench_table_note(&t, "warm-up", note);
    snprintf(note, sizeof note, "context_length %lld, %lld lanes, salt %lld", sv.context, sv.lanes,
             salt);
    bench_table_note(&t, "server", note);
    bench_table_end(&t);
    free(rf);
    return 0;
}
