/* muse-bench concurrent and prompt: the serving engine measured through its HTTP API
 * (/v1/completions with prompts of token ids, streamed): tokens/s per stream and in aggregate,
 * time to first token, whether concurrent streams produce the tokens they produce alone, and
 * prompt processing speed cold and from the prompt cache. */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "bench_http.h"
#include "bench_serving.h"
#include "bench_table.h"
#include "base/flags.h"
#include "base/muse_common.h"
#include "pack/pack_random.h"

/* GET /health: the model name, context_length and lanes. */
static int serving_health(serving *sv, muse_err *e)
{
    bench_http_exchange x = {.method = "GET", .path = "/health"};
    int rc = bench_http_exchange_run(&sv->target, &x, 1, 30);
    cJSON *root = NULL;
    if (rc || x.status != 200) {
        rc = muse_fail(e, "GET /health: %s (status %d); is the server up at --url?",
                       x.error[0] ? x.error : "no healthy reply", x.status);
        goto out;
    }
    root = cJSON_ParseWithLength(x.body_out.p, x.body_out.len);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(root, "context_length");
    const cJSON *streams = cJSON_GetObjectItemCaseSensitive(root, "streams");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(streams, "max");
    if (!cJSON_IsString(model) || !cJSON_IsNumber(ctx) || !cJSON_IsNumber(max)) {
        rc = muse_fail(e, "GET /health: the reply lacks model, context_length or streams.max");
        goto out;
    }
    snprintf(sv->model, sizeof sv->model, "%s", model->valuestring);
    sv->context = (long long)ctx->valuedouble;
    sv->lanes = (long long)max->valuedouble;
out:
    cJSON_Delete(root);
    bench_http_exchange_free(&x);
    return rc;
}

/* Token id j of the prompt named by salt: spread over [0, id_range) so no two prompts share a
 * prefix (the prompt cache matches prefixes). */
static int32_t prompt_id(const serving *sv, uint64_t salt, long long j)
{
    return (int32_t)(muse_mix64(salt * 0x9E3779B97F4A7C15ull + (uint64_t)j + 1) %
                     (uint64_t)sv->id_range);
}

/* The /v1/completions body: a streamed completion of prompt `salt` (n ids) with a fixed seed,
 * and the request's response_format when sv has one. */
static void completion_body(const serving *sv, uint64_t salt, long long n, long long max_tokens,
                            double temperature, muse_buf *out)
{
    char tmp[256];
    out->len = 0;
    int k = snprintf(tmp, sizeof tmp, "{\"model\":\"%s\",\"stream\":true,", sv->model);
    muse_buf_add(out, tmp, (size_t)k);
    if (sv->response_format) {
        muse_buf_add(out, "\"response_format\":", 18);
        muse_buf_add(out, sv->response_format, strlen(sv->response_format));
        muse_buf_add(out, ",", 1);
    }
    k = snprintf(tmp, sizeof tmp,
                 "\"stream_options\":{\"include_usage\":true},\"max_tokens\":%lld,"
                 "\"temperature\":%g,\"seed\":%llu,\"prompt\":[",
                 max_tokens, temperature, (unsigned long long)(salt % 1000000007ull));
    muse_buf_add(out, tmp, (size_t)k);
    for (long long j = 0; j < n; j++) {
        k = snprintf(tmp, sizeof tmp, "%s%d", j ? "," : "", (int)prompt_id(sv, salt, j));
        muse_buf_add(out, tmp, (size_t)k);
    }
    muse_buf_add(out, "]}", 2);
}

/* The error message of a non-200 reply ({"error":{"message":...}}), or the transport's. */
static void reply_error(const bench_http_exchange *x, char *out, size_t n)
{
    if (x->error[0]) {
        snprintf(out, n, "%s", x->error);
        return;
    }
    cJSON *root = cJSON_ParseWithLength(x->body_out.p ? x->body_out.p : "", x->body_out.len);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(root, "error"), "message");
    snprintf(out, n, "HTTP %d: %.200s", x->status,
             cJSON_IsString(msg) ? msg->valuestring : "(no error message)");
    cJSON_Delete(root);
}

/* Whether a chunk shows generated text: the role chunk sent at admission has none. */
static bool has_text(const cJSON *o)
{
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(choice, "text");
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(choice, "delta");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(delta, "content");
    return (cJSON_IsString(text) && text->valuestring[0]) ||
           (cJSON_IsString(content) && content->valuestring[0]);
}

static void read_event(const cJSON *o, const bench_sse_event *ev, stream_result *r)
{
    const cJSON *msg =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), "message");
    if (cJSON_IsString(msg) && !r->error[0])
        snprintf(r->error, sizeof r->error, "error event: %.200s", msg->valuestring);
    const cJSON *muse = cJSON_GetObjectItemCaseSensitive(o, "muse");
    /* The first token shows as text, or (text held back, e.g. half a UTF-8 character) as the
     * finish chunk. */
    if (!r->first_ns && (has_text(o) || cJSON_IsObject(muse))) r->first_ns = ev->t_ns;
    if (cJSON_IsObject(muse)) {
        const cJSON *sha = cJSON_GetObjectItemCaseSensitive(muse, "token_sha");
        const cJSON *ttft = cJSON_GetObjectItemCaseSensitive(muse, "ttft_ms");
        if (cJSON_IsString(sha))
            snprintf(r->token_sha, sizeof r->token_sha, "%s", sha->valuestring);
        if (cJSON_IsNumber(ttft)) r->engine_ttft_ms = ttft->valuedouble;
        r->finish_ns = ev->t_ns;
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(usage)) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
        const cJSON *cached = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details"), "cached_tokens");
        if (cJSON_IsNumber(ct)) r->completion_tokens = (long long)ct->valuedouble;
        if (cJSON_IsNumber(pt)) r->prompt_tokens = (long long)pt->valuedouble;
        if (cJSON_IsNumber(cached)) r->cached_tokens = (long long)cached->valuedouble;
    }
}

/* Reads one streamed completion: the finish chunk's muse object and the usage chunk. */
static void read_stream(const bench_http_exchange *x, stream_result *r)
{
    *r = (stream_result){.sent_ns = x->sent_ns, .completion_tokens = -1};
    if (x->error[0] || x->status != 200) {
        reply_error(x, r->error, sizeof r->error);
        return;
    }
    for (size_t i = 0; i < x->nevents; i++) {
        const bench_sse_event *ev = &x->events[i];
        cJSON *o = cJSON_ParseWithLength(x->body_out.p + ev->at, ev->len);
        if (o) read_event(o, ev, r);
        cJSON_Delete(o);
    }
    if (r->error[0]) return;
    if (!x->nevents || !r->token_sha[0] || r->completion_tokens < 0) {
        snprintf(r->error, sizeof r->error,
                 "the stream ended without the muse finish chunk or the usage (%zu events; see "
                 "the nginx error log, e.g. muse_idle_timeout)",
                 x->nevents);
        return;
    }
    int64_t first = r->first_ns;
    r->ttft_ms = (double)(first - x->sent_ns) / 1e6;
    r->decode_tok_s =
        r->completion_tokens > 1 && r->finish_ns > first
            ? (double)(r->completion_tokens - 1) * 1e9 / (double)(r->finish_ns - first)
            : NAN;
    r->ok = true;
}

/* Runs n streamed completions at once; results in res[n]. */
void run_streams(const serving *sv, const uint64_t *salts, int n, long long prompt_tokens,
                 long long max_tokens, double temperature, stream_result *res)
{
    bench_http_exchange *ex = MUSE_CALLOC((size_t)n, sizeof *ex);
    muse_buf *bodies = MUSE_CALLOC((size_t)n, sizeof *bodies);
    for (int i = 0; i < n; i++) {
        completion_body(sv, salts[i], prompt_tokens, max_tokens, temperature, &bodies[i]);
        ex[i] = (bench_http_exchange){.method = "POST",
                                      .path = "/v1/completions",
                                      .body = bodies[i].p,
                                      .body_len = bodies[i].len};
    }
    bench_http_exchange_run(&sv->target, ex, n, sv->timeout_s);
    for (int i = 0; i < n; i++) {
        read_stream(&ex[i], &res[i]);
        if (!res[i].ok) fprintf(stderr, "muse-bench: request failed: %s\n", res[i].error);
        bench_http_exchange_free(&ex[i]);
        free(bodies[i].p);
    }
    free(bodies);
    free(ex);
}

int serving_start(const char *cmd, const char *url, serving *sv)
{
    if (!url || bench_http_parse_url(url, &sv->target))
        return bench_usage_error(cmd, "--url http://127.0.0.1:PORT is required (127.0.0.1 only)");
    signal(SIGPIPE, SIG_IGN);
    muse_err e = {{0}};
    if (serving_health(sv, &e)) {
        fprintf(stderr, "muse-bench %s: %s\n", cmd, e.msg);
        return 1;
    }
    return 0;
}

/* ---- concurrent: S streams at once, against each stream alone ---- */

typedef struct {
    long long prompt_tokens, tokens, reps;
    double temperature;
    uint64_t salt;
} concurrent_opts;

/* The prompt (and seed) of stream i of rep r in the row of S streams: distinct everywhere. */
static uint64_t concurrent_salt(const concurrent_opts *o, long long s, long long r, int i)
{
    return o->salt * 1000003ull + (uint64_t)s * 10007ull + (uint64_t)r * 257ull + (uint64_t)i;
}

/* One row: reps of S concurrent streams, then each of those requests again alone. */
static void concurrent_row(const serving *sv, const concurrent_opts *o, int s, bench_table *t)
{
    size_t n = (size_t)(s * o->reps);
    stream_result *res = MUSE_CALLOC(n, sizeof *res);
    uint64_t *salts = MUSE_CALLOC(n, sizeof *salts);
    double wall = 0, tokens = 0;
    for (long long r = 0; r < o->reps; r++) {
        stream_result *rr = res + r * s;
        for (int i = 0; i < s; i++) salts[r * s + i] = concurrent_salt(o, s, r, i);
        run_streams(sv, salts + r * s, s, o->prompt_tokens, o->tokens, o->temperature, rr);
        int64_t t0 = INT64_MAX, t1 = 0;
        for (int i = 0; i < s; i++) {
            if (!rr[i].ok) continue;
            tokens += (double)rr[i].completion_tokens;
            if (rr[i].sent_ns < t0) t0 = rr[i].sent_ns;
            if (rr[i].finish_ns > t1) t1 = rr[i].finish_ns;
        }
        if (t1 > t0) wall += (double)(t1 - t0) / 1e9;
    }
    /* The same requests alone, one at a time: the tokens they must match. */
    long identical = 0, compared = 0, errors = 0, cached = 0;
    double *rate = MUSE_CALLOC(n, sizeof *rate), *ttft = MUSE_CALLOC(n, sizeof *ttft);
    size_t nrate = 0, nttft = 0;
    for (size_t k = 0; k < n; k++) {
        if (!res[k].ok) {
            errors++;
            continue;
        }
        cached += res[k].cached_tokens;
        ttft[nttft++] = res[k].ttft_ms;
        if (isfinite(res[k].decode_tok_s)) rate[nrate++] = res[k].decode_tok_s;
        stream_result alone;
        run_streams(sv, &salts[k], 1, o->prompt_tokens, o->tokens, o->temperature, &alone);
        if (!alone.ok) continue;
        compared++;
        identical += strcmp(alone.token_sha, res[k].token_sha) == 0;
    }
    double rate_min = nrate ? bench_quantile(rate, nrate, 0) : NAN;
    double rate_p50 = bench_quantile(rate, nrate, 0.5);
    char same[48];
    snprintf(same, sizeof same, "%ld/%ld", identical, compared);
    const char *cells[] = {bench_fmt("%.0f", s),
                           bench_fmt("%.0f", (double)n),
                           bench_fmt("%.0f", (double)errors),
                           bench_fmt("%.2f", rate_p50),
                           bench_fmt("%.2f", rate_min),
                           bench_fmt("%.2f", wall > 0 ? tokens / wall : NAN),
                           bench_fmt("%.0f", bench_quantile(ttft, nttft, 0.5)),
                           bench_fmt("%.0f", bench_quantile(ttft, nttft, 1.0)),
                           same,
                           bench_fmt("%.0f", (double)cached)};
    bench_table_row(t, cells);
    free(rate);
    free(ttft);
    free(salts);
    free(res);
}

int bench_cmd_concurrent(int argc, char **argv)
{
    serving sv = {.id_range = 100000, .timeout_s = 1800};
    concurrent_opts o = {.prompt_tokens = 64, .tokens = 16, .reps = 2, .temperature = 0.8};
    const char *url = NULL, *streams_s = "1,2,4,8";
    bool as_json = false;
    long long salt = (long long)time(NULL);
    const muse_flag table[] = {
        SERVING_FLAGS(sv, url, salt, as_json),
        MUSE_FLAG_S("streams", &streams_s, "1,2,4,8", "streams at once, a row each"),
        MUSE_FLAG_L("tokens", &o.tokens, 2, 100000, "N", "tokens a stream"),
        MUSE_FLAG_L("reps", &o.reps, 1, 1000, "R", "repetitions a row"),
        MUSE_FLAG_L("prompt-tokens", &o.prompt_tokens, 1, 1000000, "P", "prompt tokens a stream"),
        MUSE_FLAG_D("temperature", &o.temperature, 0, 2, "T", "sampling temperature (fixed seeds)"),
    };
    int prc = bench_parse_flags(
        "concurrent",
        "S streamed /v1/completions at once (distinct prompts of token ids, fixed "
        "seeds):\ntokens/s per stream and in aggregate, TTFT, and whether each "
        "request's\nmuse.token_sha equals the one it gets alone (run again afterwards, alone).\n",
        table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    long long streams[MAX_LIST];
    char why[160];
    int ns = bench_parse_int_list("--streams", streams_s, 1, MAX_STREAMS, streams, MAX_LIST, why,
                                  sizeof why);
    if (ns < 0) return bench_usage_error("concurrent", why);
    int rc = serving_start("concurrent", url, &sv);
    if (rc) return rc;
    o.salt = (uint64_t)salt;
    static const char *const cols[] = {"streams",
                                       "requests",
                                       "errors",
                                       "tok/s per stream p50",
                                       "tok/s per stream min",
                                       "aggregate tok/s",
                                       "TTFT p50 ms",
                                       "TTFT max ms",
                                       "identical to alone",
                                       "cached tokens"};
    char title[256];
    snprintf(title, sizeof title,
             "Concurrent streamed /v1/completions: %lld prompt tokens, %lld tokens each, T %g, "
             "%lld reps a row",
             o.prompt_tokens, o.tokens, o.temperature, o.reps);
    bench_table t;
    bench_table_begin(&t, "concurrent", title, cols, 10, as_json);
    char note[256];
    for (int i = 0; i < ns; i++) {
        if (streams[i] > sv.lanes) {
            snprintf(note, sizeof note, "%lld streams > %lld lanes: the rest queue", streams[i],
                     sv.lanes);
            bench_table_note(&t, "warning", note);
        }
        concurrent_row(&sv, &o, (int)streams[i], &t);
    }
    bench_table_note(&t, "url", url);
    snprintf(note, sizeof note, "context_length %lld, %lld lanes, salt %lld", sv.context, sv.lanes,
             salt);
    bench_table_note(&t, "server", note);
    bench_table_end(&t);
    return 0;
}

/* ---- prompt: prompt tokens/s and TTFT, cold and from the prompt cache ---- */

static void prompt_row(bench_table *t, long long len, const char *kase, long long reps,
                       const stream_result *res, int n, const char *note)
{
    double ttft[64], eng[64];
    int ok = 0;
    long long cached = 0;
    for (int i = 0; i < n; i++) {
        if (!res[i].ok) continue;
        ttft[ok] = res[i].ttft_ms;
        eng[ok] = res[i].engine_ttft_ms;
        cached += res[i].cached_tokens;
        ok++;
    }
    double p50 = bench_quantile(ttft, (size_t)ok, 0.5);
    const char *cells[] = {bench_fmt("%.0f", (double)len),
                           kase,
                           bench_fmt("%.0f", (double)reps),
                           bench_fmt("%.0f", (double)(n - ok)),
                           ok ? bench_fmt("%.0f", (double)cached / ok) : "-",
                           ok ? bench_fmt("%.1f", p50) : "-",
                           ok ? bench_fmt("%.1f", bench_quantile(ttft, (size_t)ok, 1.0)) : "-",
                           ok ? bench_fmt("%.1f", bench_quantile(eng, (size_t)ok, 0.5)) : "-",
                           ok ? bench_fmt("%.1f", (double)len * 1e3 / p50) : "-",
                           note};
    bench_table_row(t, cells);
}

/* Whether argv names a server (--url): else prompt measures a backend in this process. */
static bool names_url(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--url") || !strncmp(argv[i], "--url=", 6)) return true;
    return false;
}

int bench_cmd_prompt(int argc, char **argv)
{
    if (!names_url(argc, argv)) return bench_prompt_backend(argc, argv);
    serving sv = {.id_range = 100000, .timeout_s = 1800};
    const char *url = NULL, *lengths_s = "512,4096,16384";
    bool as_json = false;
    long long salt = (long long)time(NULL), reps = 2;
    const muse_flag table[] = {
        SERVING_FLAGS(sv, url, salt, as_json),
        MUSE_FLAG_S("lengths", &lengths_s, "512,4096,16384", "prompt lengths, a row each"),
        MUSE_FLAG_L("reps", &reps, 1, 64, "R", "repetitions a row"),
    };
    int prc = bench_parse_flags(
        "prompt",
        "Prompt tokens/s and TTFT (max_tokens 1), cold and from the prompt cache; lengths\nbeyond "
        "/health context_length are reported as skipped.\n",
        table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    long long lengths[MAX_LIST];
    char why[160];
    int nl = bench_parse_int_list("--lengths", lengths_s, 1, 1 << 24, lengths, MAX_LIST, why,
                                  sizeof why);
    if (nl < 0) return bench_usage_error("prompt", why);
    int rc = serving_start("prompt", url, &sv);
    if (rc) return rc;
    static const char *const cols[] = {"prompt tokens",
                                       "case",
                                       "reps",
                                       "errors",
                                       "cached tokens",
                                       "TTFT p50 ms",
                                       "TTFT max ms",
                                       "engine TTFT p50 ms",
                                       "prompt tok/s (tokens / TTFT)",
                                       "note"};
    bench_table t;
    bench_table_begin(&t, "prompt",
                      "Prompt processing through /v1/completions (streamed, max_tokens 1): a fresh "
                      "prompt (cold), the same prompt again, and that prompt plus one token",
                      cols, 10, as_json);
    char note[256];
    for (int l = 0; l < nl; l++) {
        long long len = lengths[l];
        if (len + 1 > sv.context) {
            snprintf(note, sizeof note,
                     "skipped: %lld prompt + 1 token > context_length %lld (serve with --context "
                     ">= %lld and a pack whose max_position_embeddings allows it)",
                     len, sv.context, len + 1);
            prompt_row(&t, len, "skipped", 0, NULL, 0, note);
            continue;
        }
        /* Each rep: a fresh prompt, the same prompt again, and the same prompt plus one token
         * (a prompt cache keeps whole blocks and must leave a token to read, so the repeat
         * alone may find nothing when the length is a multiple of the block). */
        stream_result cold[64], same[64], longer[64];
        bool extend = len + 2 <= sv.context;
        for (long long r = 0; r < reps; r++) {
            uint64_t s = (uint64_t)salt * 1000003ull + (uint64_t)len * 131ull + (uint64_t)r;
            run_streams(&sv, &s, 1, len, 1, 0, &cold[r]);
            run_streams(&sv, &s, 1, len, 1, 0, &same[r]);
            if (extend) run_streams(&sv, &s, 1, len + 1, 1, 0, &longer[r]);
        }
        prompt_row(&t, len, "cold", reps, cold, (int)reps, "");
        prompt_row(&t, len, "same prompt again", reps, same, (int)reps, "");
        if (extend)
            prompt_row(&t, len + 1, "prompt + 1 token", reps, longer, (int)reps,
                       "the prompt above plus one token");
    }
    bench_table_note(&t, "url", url);
    snprintf(note, sizeof note, "context_length %lld, %lld lanes, salt %lld", sv.context, sv.lanes,
             salt);
    bench_table_note(&t, "server", note);
    bench_table_end(&t);
    return 0;
}
