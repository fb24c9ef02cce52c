/* muse-bench decode and chat: forward tokens/s on a backend, and the per-request chat work
 * (rendering, reply parsing, sampling) next to one decode step. */
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "base/clock.h"
#include "bench.h"
#include "bench_engine.h"
#include "bench_ops.h"
#include "bench_table.h"
#include "text/chat.h"
#include "base/flags.h"
#include "model/forward.h"
#include "model/model.h"
#include "base/muse_common.h"
#include "pack/pack_random.h"
#include "text/reply.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

/* ---- decode step (shared by chat and decode) ---- */

static int engine_open(bench_engine *c, const char *dir, long max_rows, int64_t context,
                       int threads, muse_err *e)
{
    memset(c, 0, sizeof *c);
    if (muse_model_load(dir, &c->model, e)) return -1;
    return bench_engine_start(c, "cpu", MUSE_KERNELS_DEFAULT, max_rows, 1, context, threads, e);
}

/* Median seconds of one 1-row decode step after a short prompt, over `steps` steps. */
static double decode_step_median(bench_engine *c, int steps)
{
    double *v = MUSE_MALLOC((size_t)steps * sizeof *v);
    bench_engine_chunk(c, 0, 0, 16, 1);
    for (int i = 0; i < steps; i++) v[i] = bench_engine_chunk(c, 0, 16 + i, 1, 1);
    double m = bench_quantile(v, (size_t)steps, 0.5);
    free(v);
    return m;
}

enum { MAX_STREAM_COUNTS = 16 };

typedef struct {
    const char *backend, *json, *baseline, *kernels, *streams_s;
    muse_kernels path; /* --kernels */
    bench_weights w;
    long long tokens, prompt, threads, copy_mib;
    long long streams[MAX_STREAM_COUNTS];
    int nstreams;
    long long max_streams;
} decode_flags;

static const char *const decode_cols[] = {
    "model",         "backend",          "streams",
    "vocab",         "threads",          "prompt tok/s (64-row)",
    "decode tok/s",  "tok/s per stream", "decode p50 ms",
    "decode p99 ms", "first round ms",   "step MB",
    "floor ms",      "% of floor (p50)"};
static const char *const decode_keys[] = {"model", "backend", "streams"};

/* The model of one pack dir (NULL: the synthetic weights) on the backend, for every row. */
static int decode_open(bench_engine *c, const decode_flags *f, const char *dir, muse_err *e)
{
    memset(c, 0, sizeof *c);
    bench_weights w = f->w;
    w.dir = dir;
    if (bench_weights_load(&w, f->backend, &c->model, e)) return -1;
    long rows = f->max_streams > 64 ? (long)f->max_streams : 64;
    return bench_engine_start(c, f->backend, f->path, rows, (int)f->max_streams,
                              f->prompt + f->tokens + 2, (int)f->threads, e);
}

/* One row of S streams: each sequence's prompt in rounds of 64 rows, then a first decode round
 * timed alone (where a backend captures the row bucket's graph, once a process, as
 * llama-bench's warm-up run), then the timed decode rounds of one row a stream; -1 on error. */
static int decode_row(bench_table *t, bench_engine *c, const decode_flags *f, const char *name,
                      int S, double bw)
{
    double tp = 0, s = 0;
    for (int q = 0; q < S; q++) muse_kv_release(&c->be->kv, q); /* the row before's */
    for (int q = 0; q < S && s >= 0; q++)
        for (int64_t pos = 0; pos < f->prompt && s >= 0; pos += 64)
            tp += s = bench_engine_chunk(c, q, pos, 64, pos + 64 >= f->prompt);
    double first = s >= 0 ? bench_engine_decode(c, S, f->prompt) : -1;
    double *v = MUSE_MALLOC((size_t)f->tokens * sizeof *v), td = 0;
    s = first;
    for (long i = 0; i < f->tokens && s >= 0; i++)
        td += v[i] = s = bench_engine_decode(c, S, f->prompt + 1 + i);
    if (s < 0) {
        free(v);
        return -1;
    }
    double p50 = bench_quantile(v, (size_t)f->tokens, 0.5),
           p99 = bench_quantile(v, (size_t)f->tokens, 0.99);
    free(v);
    int thr = (int)f->threads > 0 ? (int)f->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    double st[BENCH_ST_N], bytes = 0;
    bench_decode_stage_bytes(&c->model, S, f->prompt + f->tokens / 2, st);
    for (int i = 0; i < BENCH_ST_N; i++) bytes += st[i];
    double floor_s = bytes / bw;
    const char *cells[] = {name,
                           f->backend,
                           bench_fmt("%.0f", S),
                           bench_fmt("%.0f", (double)c->vocab),
                           bench_fmt("%.0f", thr),
                           bench_fmt("%.1f", (double)(f->prompt * S) / tp),
                           bench_fmt("%.1f", (double)(f->tokens * S) / td),
                           bench_fmt("%.2f", (double)f->tokens / td),
                           bench_fmt("%.3f", p50 * 1e3),
                           bench_fmt("%.3f", p99 * 1e3),
                           bench_fmt("%.3f", first * 1e3),
                           bench_fmt("%.3f", bytes / 1e6),
                           bench_fmt("%.3f", floor_s * 1e3),
                           bench_fmt("%.1f", 100.0 * floor_s / p50)};
    bench_table_row(t, cells);
    return 0;
}

int bench_cmd_decode(int argc, char **argv)
{
    const char *dirs[4] = {NULL};
    int ndirs = 0;
    decode_flags f = {
        .backend = "cpu", .tokens = 64, .prompt = 256, .streams_s = "1", .w = {.synthetic = -1}};
    muse_err e = {{0}};
    const muse_flag table[] = {
        MUSE_FLAG_S("backend", &f.backend, "cpu|cuda", "the backend to measure", .def = "cpu"),
        MUSE_KERNELS_FLAG(&f.kernels),
        MUSE_FLAG_R("model", dirs, &ndirs, 4, "DIR", "a pack to measure (or --synthetic-weights)"),
        BENCH_SYNTHETIC_FLAGS(f.w),
        MUSE_FLAG_S("streams", &f.streams_s, "S,S,...",
                    "sequences decoding together, a row each (a round: one row a stream)",
                    .def = "1"),
        MUSE_FLAG_L("tokens", &f.tokens, 1, 100000, "N", "decode rounds a row"),
        MUSE_FLAG_L("prompt", &f.prompt, 64, 100000, "N",
                    "prompt tokens a stream (rounded down to 64)"),
        MUSE_FLAG_L("threads", &f.threads, 0, 1024, "N", "cpu threads", .def = "0: one per core"),
        MUSE_FLAG_L("copy-mib", &f.copy_mib, 0, 65536, "MIB", "the copy bandwidth's buffer",
                    .def = "0: 1024 on cuda, 256 on cpu"),
        MUSE_FLAG_S("json", &f.json, "FILE", "also write the table as JSON to FILE (-: stdout)"),
        MUSE_FLAG_S("baseline", &f.baseline, "FILE",
                    "a previous --json FILE: a column of this run's decode p50 over its"),
    };
    int prc =
        bench_parse_flags("decode",
                          "Forward tokens/s on a backend: each stream's prompt in rows of 64, "
                          "then decode rounds of one row a stream.\n",
                          table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    if ((prc = bench_kernels_flag("decode", f.kernels, &f.path))) return prc;
    char title[200], why[512];
    f.nstreams = bench_parse_int_list("--streams", f.streams_s, 1, 256, f.streams,
                                      MAX_STREAM_COUNTS, why, sizeof why);
    if (f.nstreams <= 0) return bench_usage_error("decode", why);
    f.max_streams = 1;
    for (int i = 0; i < f.nstreams; i++)
        if (f.streams[i] > f.max_streams) f.max_streams = f.streams[i];
    if (!ndirs && f.w.synthetic < 0)
        return bench_usage_error("decode", "--model DIR (or --synthetic-weights SEED --config "
                                           "FILE) is required");
    if (!ndirs) ndirs = 1; /* the synthetic weights: one model */
    f.prompt = f.prompt / 64 * 64;
    snprintf(title, sizeof title,
             "Forward on %s: %lld prompt tokens a stream in rows of 64, a first decode round, "
             "then %lld decode rounds of one row a stream",
             f.backend, f.prompt, f.tokens);
    int as_json = f.json && !strcmp(f.json, "-");
    bench_table t;
    bench_table_open(&t, "decode", title, decode_cols, 14, as_json);
    bench_table_io io = {f.json, f.baseline, decode_keys, 3, "decode p50 ms", argc, argv};
    if (bench_table_io_setup(&t, &io, why, sizeof why)) {
        fprintf(stderr, "muse-bench decode: %s\n", why);
        bench_table_discard(&t);
        return 1;
    }
    bench_engine c;
    double bw = 0;
    int rc = 0;
    for (int d = 0; d < ndirs && !rc; d++) {
        if (decode_open(&c, &f, dirs[d], &e) ||
            (d == 0 && bench_copy_head(c.be, (long)f.copy_mib, &t, &bw, &e))) {
            fprintf(stderr, "muse-bench decode: %s\n", e.msg);
            if (c.be) bench_engine_close(&c);
            rc = 1;
            break;
        }
        if (d == 0) {
            bench_table_head(&t, "floor",
                             "the bytes of one decode round (weights read, each stream's KV at "
                             "the middle decode position) / copy bandwidth");
            bench_table_head(&t, "tok/s",
                             "decode tok/s: streams x rounds / their time (aggregate); per "
                             "stream: rounds / their time; p50, p99: of a round; the first "
                             "decode round (a row bucket's graph capture on cuda) apart");
            bench_table_header(&t);
        }
        for (int i = 0; i < f.nstreams && !rc; i++)
            rc = decode_row(&t, &c, &f, dirs[d] ? dirs[d] : c.model.dir, (int)f.streams[i], bw) ? 1
                                                                                                : 0;
        bench_engine_close(&c);
    }
    if (bench_table_end(&t)) rc = 1;
    return rc;
}

/* ---- chat: rendering, reply parsing and sampling next to a decode step ---- */

static const char chat_request[] =
    "{\"model\":\"muse-spark\",\"stream\":true,\"max_tokens\":256,\"messages\":["
    "{\"role\":\"system\",\"content\":\"You are a careful assistant for a small engineering team. "
    "Answer briefly, cite the file you read, and prefer plain words over jargon.\"},"
    "{\"role\":\"user\",\"content\":\"What is the weather in Lisbon tomorrow, and should I take "
    "an umbrella to the harbour walk in the afternoon?\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":"
    "\"function\",\"function\":{\"name\":\"weather_get\",\"arguments\":\"{\\\"city\\\":"
    "\\\"Lisbon\\\",\\\"day\\\":\\\"tomorrow\\\"}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"{\\\"city\\\":\\\"Lisbon\\\","
    "\\\"forecast\\\":\\\"light rain after 14:00, 17 C, wind 20 km/h from the north west\\\"}\"},"
    "{\"role\":\"user\",\"content\":\"Thanks. Also summarise that in one sentence for my "
    "calendar note, please.\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"weather_get\",\"description\":"
    "\"Get the forecast for a city\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\"},\"day\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]}";

static const char reply_reasoning[] =
    "The user wants a one-sentence summary of the forecast for a calendar note. The tool said "
    "light rain after 14:00, 17 C and a north-west wind of 20 km/h, so an umbrella is sensible "
    "for an afternoon walk by the harbour.";
static const char reply_content[] =
    "Lisbon tomorrow: light rain from 2 pm, 17 C, breezy from the north west, so take an "
    "umbrella for the harbour walk.";

typedef struct {
    const muse_tokenizer *tk;
    size_t bytes;
} reply_ctx;

static const uint8_t *reply_token_bytes(void *ctx, int32_t id, size_t *len)
{
    return muse_tokenizer_token_bytes(((reply_ctx *)ctx)->tk, id, len);
}

static void reply_emit(void *ctx, const muse_reply_ev *ev)
{
    ((reply_ctx *)ctx)->bytes += ev->len;
}

static int append_text(const muse_tokenizer *tk, const char *s, int32_t **ids, size_t *n,
                       size_t *cap, muse_err *e)
{
    return muse_tokenize(tk, s, strlen(s), ids, n, cap, e);
}

static void append_id(int32_t id, int32_t **ids, size_t *n, size_t *cap)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *ids = realloc(*ids, *cap * sizeof **ids);
        MUSE_CHECK(*ids);
    }
    (*ids)[(*n)++] = id;
}

/* The ids a model writes after <|start|>assistant: a reasoning message, then the answer. */
static int reply_tokens(const muse_tokenizer *tk, const muse_chat_ids *ci, int32_t **ids, size_t *n,
                        muse_err *e)
{
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    if (append_text(tk, " to=self", ids, n, &cap, e)) return -1;
    append_id(ci->message, ids, n, &cap);
    if (append_text(tk, reply_reasoning, ids, n, &cap, e)) return -1;
    append_id(ci->eom, ids, n, &cap);
    append_id(ci->start, ids, n, &cap);
    if (append_text(tk, "assistant to=user", ids, n, &cap, e)) return -1;
    append_id(ci->message, ids, n, &cap);
    if (append_text(tk, reply_content, ids, n, &cap, e)) return -1;
    append_id(ci->eot, ids, n, &cap);
    return 0;
}

/* Mean seconds per call of a bench body run for >= min_s (at most max_calls). */
#define TIME_LOOP(min_s, max_calls, out_s, body)                                                   \
    do {                                                                                           \
        long calls_ = 0;                                                                           \
        double t0_ = muse_now_s(), t_;                                                             \
        do {                                                                                       \
            body;                                                                                  \
            calls_++;                                                                              \
            t_ = muse_now_s() - t0_;                                                               \
        } while (t_ < (min_s) && calls_ < (max_calls));                                            \
        (out_s) = t_ / (double)calls_;                                                             \
    } while (0)

typedef struct {
    double parse_s, render_s, reply_tok_s, greedy_s, sampled_s;
    size_t prompt_tokens, reply_ntok, reply_bytes;
} chat_costs;

static int measure_chat(const muse_tokenizer *tk, double min_s, chat_costs *c, muse_err *e)
{
    muse_chat_ids ci;
    if (muse_chat_ids_from_tokenizer(tk, &ci, e)) return -1;
    volatile size_t sink = 0;
    TIME_LOOP(min_s, 1000000, c->parse_s, {
        cJSON *r = cJSON_Parse(chat_request);
        MUSE_CHECK(r);
        sink += (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(r, "messages"));
        cJSON_Delete(r);
    });
    cJSON *req = cJSON_Parse(chat_request);
    MUSE_CHECK(req);
    const cJSON *msgs = cJSON_GetObjectItem(req, "messages"),
                *tools = cJSON_GetObjectItem(req, "tools");
    int rc = 0;
    TIME_LOOP(min_s, 1000000, c->render_s, {
        muse_chat_render r;
        int32_t *ids = NULL;
        size_t n = 0;
        rc |= muse_chat_render_messages(msgs, tools, NULL, &ci, &r, e);
        if (rc == 0) rc |= muse_chat_render_tokens(&r, tk, &ids, &n, e);
        c->prompt_tokens = n;
        free(ids);
        muse_chat_render_free(&r);
        if (rc) break;
    });
    cJSON_Delete(req);
    if (rc) return -1;
    int32_t *rids;
    size_t rn;
    if (reply_tokens(tk, &ci, &rids, &rn, e)) return -1;
    reply_ctx rx = {tk, 0};
    muse_reply_config rcfg = {.ids = ci,
                              .parallel_tool_calls = 1,
                              .token_bytes = reply_token_bytes,
                              .token_ctx = &rx,
                              .emit = reply_emit,
                              .emit_ctx = &rx};
    muse_reply *rp;
    if (muse_reply_create(&rcfg, &rp, e)) {
        free(rids);
        return -1;
    }
    double per_reply;
    uint64_t seed = 0;
    TIME_LOOP(min_s, 1000000, per_reply, {
        muse_reply_reset(rp, seed++);
        rx.bytes = 0;
        for (size_t i = 0; i < rn; i++)
            if (muse_reply_push(rp, rids[i])) break;
        if (!muse_reply_done(rp)) muse_reply_finish(rp, "length");
    });
    c->reply_tok_s = per_reply / (double)rn;
    c->reply_ntok = rn;
    c->reply_bytes = rx.bytes;
    muse_reply_destroy(rp);
    free(rids);
    /* Sampler at the demo vocabulary. */
    const int64_t V = 202048;
    float *logits = MUSE_MALLOC((size_t)V * sizeof *logits);
    for (int64_t i = 0; i < V; i++) logits[i] = (float)(3.0 * muse_normal(11, (uint64_t)i));
    muse_sampler *s = muse_sampler_create(V);
    MUSE_CHECK(s);
    muse_sampling greedy = {.temperature = 0, .top_p = 1, .seed = 1};
    muse_sampling sampled = {.temperature = 0.7f, .top_k = 0, .top_p = 0.9f, .min_p = 0, .seed = 1};
    int64_t pos = 0;
    TIME_LOOP(min_s, 1000000, c->greedy_s, sink += (size_t)muse_sample(s, logits, &greedy, pos++));
    TIME_LOOP(min_s, 1000000, c->sampled_s,
              sink += (size_t)muse_sample(s, logits, &sampled, pos++));
    muse_sampler_destroy(s);
    free(logits);
    (void)sink;
    return 0;
}

int bench_cmd_chat(int argc, char **argv)
{
    const char *tok_path = NULL, *dirs[4];
    int ndirs = 0;
    bool as_json = false;
    long long threads = 0;
    double min_s = 0.5;
    muse_err e = {{0}};
    const muse_flag table[] = {
        MUSE_FLAG_S("tokenizer", &tok_path, "FILE", "a tokenizer with Muse's control tokens",
                    .required = true),
        MUSE_FLAG_R("model", dirs, &ndirs, 4, "DIR", "a pack whose decode step is the yardstick",
                    .required = true),
        MUSE_FLAG_L("threads", &threads, 0, 1024, "N", "threads", .def = "0: one per core"),
        MUSE_FLAG_D("min-s", &min_s, 0.01, 60, "S", "seconds each measure runs at least"),
        MUSE_FLAG_B("json", &as_json, "print JSON instead of a table"),
    };
    int prc = bench_parse_flags(
        "chat", "Rendering, reply parsing and sampling (V=202048) vs one decode step.\n", table,
        sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    if (!tok_path || !ndirs)
        return bench_usage_error("chat",
                                 "--tokenizer FILE (with Muse's control tokens) and --model DIR "
                                 "(repeatable) are required");
    double step_s[4];
    for (int d = 0; d < ndirs; d++) {
        bench_engine c;
        if (engine_open(&c, dirs[d], 16, 4096, (int)threads, &e)) {
            fprintf(stderr, "muse-bench chat: %s\n", e.msg);
            return 1;
        }
        step_s[d] = decode_step_median(&c, 64);
        bench_engine_close(&c);
    }
    muse_tokenizer *tk;
    if (muse_tokenizer_load(tok_path, &tk, &e)) {
        fprintf(stderr, "muse-bench chat: %s\n", e.msg);
        return 1;
    }
    chat_costs cc = {0};
    int rc = measure_chat(tk, min_s, &cc, &e);
    muse_tokenizer_free(tk);
    if (rc) {
        fprintf(stderr, "muse-bench chat: %s\n", e.msg);
        return 1;
    }
    const char *cols[7] = {"what", "us", "per"};
    char colname[4][96];
    for (int d = 0; d < ndirs; d++) {
        snprintf(colname[d], sizeof colname[d], "%% of step %s", dirs[d]);
        cols[3 + d] = colname[d];
    }
    bench_table t;
    bench_table_begin(&t, "chat",
                      "Request rendering and reply parsing (one core) next to one CPU decode step "
                      "(1 row, median of 64)",
                      cols, 3 + ndirs, as_json);
    char per_render[64], per_reply[64];
    snprintf(per_render, sizeof per_render, "request (%zu tokens)", cc.prompt_tokens);
    snprintf(per_reply, sizeof per_reply, "reply (%zu tokens)", cc.reply_ntok);
    struct {
        const char *what, *per;
        double s;
    } items[] = {{"parse request JSON", "request", cc.parse_s},
                 {"render + tokenize", per_render, cc.render_s},
                 {"reply parser push", "token", cc.reply_tok_s},
                 {"reply parser push", per_reply, cc.reply_tok_s * (double)cc.reply_ntok},
                 {"sampler greedy V=202048", "token", cc.greedy_s},
                 {"sampler T0.7 p0.9 V=202048", "token", cc.sampled_s}};
    for (size_t i = 0; i < sizeof items / sizeof *items; i++) {
        const char *cells[7] = {items[i].what, bench_fmt("%.2f", items[i].s * 1e6), items[i].per};
        for (int d = 0; d < ndirs; d++)
            cells[3 + d] = bench_fmt("%.3f", 100.0 * items[i].s / step_s[d]);
        bench_table_row(&t, cells);
    }
    for (int d = 0; d < ndirs; d++) {
        const char *cells[7] = {"decode step (1 row)", bench_fmt("%.2f", step_s[d] * 1e6), dirs[d]};
        for (int j = 0; j < ndirs; j++)
            cells[3 + j] = bench_fmt("%.1f", 100.0 * step_s[d] / step_s[j]);
        bench_table_row(&t, cells);
    }
    char rnote[96];
    snprintf(rnote, sizeof rnote, "%zu tokens (reasoning + answer), %zu bytes emitted",
             cc.reply_ntok, cc.reply_bytes);
    bench_table_note(&t, "reply", rnote);
    bench_table_note(&t, "target", "rendering + parsing < 1% of a decode step");
    bench_table_end(&t);
    return 0;
}
