/* muse-bench stages: where one decode round's time goes, stage by stage (attention, routed and
 * shared experts, router, norms, head, sampler, host time, launch gaps), each against its bytes
 * floor. The backend's ops are wrapped: each call's time goes to the stage of what it computes,
 * from the backend's profile where it has one (cuda, MUSE_CUDA_PROFILE: device time by events,
 * the moe in parts), else from the host clock around the call (cpu: its ops are synchronous). */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/muse_common.h"
#include "bench.h"
#include "bench_engine.h"
#include "bench_ops.h"
#include "bench_table.h"

enum { MAX_PROF = 64 };

static const char *const stage_names[BENCH_ST_N] = {
    "embed",          "norms",          "attention",     "dense mlp",  "router",
    "routed experts", "shared experts", "moe (unsplit)", "all_reduce", "head",
    "sampler",        "host time",      "launch gaps"};
static const char *const stage_what[BENCH_ST_N] = {
    "embed + rms",
    "norm, add_norm, add_norm + norm",
    "q k v gate, qk norm + rope, kv write + attention, o",
    "gate/up + swiglu, down (dense layers)",
    "router logits + top-k selection",
    "the selected experts, their output norms, the combine",
    "the shared experts",
    "router + routed + shared: the backend times the moe op whole",
    "sums across ranks",
    "lm_head, multiplier, softcap",
    "the token draw",
    "begin_round + end_round on the host",
    "step wall - every stage above (launches, waits, host work between ops)"};

/* The wrapped backend's state: one at a time (muse-bench runs one backend). */
static struct {
    const muse_backend_ops *inner;
    muse_backend_ops outer;
    muse_backend *be;
    int active, profiled;
    int depth; /* > 0 inside a wrapped op: a backend calling its own ops is counted once */
    double s[BENCH_ST_N];
    long calls[BENCH_ST_N];
    muse_prof_entry prev[MAX_PROF];
    int nprev;
} W;

/* The stage a profile entry's time goes to when the call was of stage st: the moe's parts go
 * to their own stages. */
static int entry_stage(int st, const char *name)
{
    if (st != BENCH_ST_MOE) return st;
    if (!strcmp(name, "moe router + selection")) return BENCH_ST_ROUTER;
    if (!strcmp(name, "moe routed experts") || !strcmp(name, "moe expert norms + combine"))
        return BENCH_ST_ROUTED;
    if (!strcmp(name, "moe shared experts")) return BENCH_ST_SHARED;
    return BENCH_ST_MOE;
}

static int64_t tick(void)
{
    return muse_now_ns();
}

/* A call of stage st that began at t0 has returned: its time into the stages. */
static void tock(int st, int64_t t0)
{
    if (!W.active) return;
    if (!W.profiled) {
        W.s[st] += (double)(muse_now_ns() - t0) / 1e9;
        W.calls[st]++;
        return;
    }
    muse_prof_entry now[MAX_PROF];
    int n = W.inner->profile(W.be, now, MAX_PROF);
    for (int i = 0; i < n && i < W.nprev; i++) {
        double d = now[i].ms - W.prev[i].ms;
        long c = now[i].calls - W.prev[i].calls;
        if (!c && d == 0) continue;
        int to = entry_stage(st, now[i].name);
        W.s[to] += d / 1e3;
        W.calls[to] += c;
    }
    memcpy(W.prev, now, (size_t)n * sizeof *now);
    W.nprev = n;
}

#define WRAP(st, call)                                                                             \
    do {                                                                                           \
        if (W.depth++) {                                                                           \
            W.inner->call;                                                                         \
        } else {                                                                                   \
            int64_t t0_ = tick();                                                                  \
            W.inner->call;                                                                         \
            tock(st, t0_);                                                                         \
        }                                                                                          \
        W.depth--;                                                                                 \
    } while (0)

static void w_embed(muse_backend *be, muse_act out)
{
    WRAP(BENCH_ST_EMBED, embed(be, out));
}

static void w_norm(muse_backend *be, muse_act x, long width, const muse_vec *w,
                   muse_norm_weight mode, float eps, int round16, muse_act out)
{
    WRAP(BENCH_ST_NORMS, norm(be, x, width, w, mode, eps, round16, out));
}

static void w_add_norm(muse_backend *be, muse_act h, muse_act y, long width, const muse_vec *w,
                       float eps)
{
    WRAP(BENCH_ST_NORMS, add_norm(be, h, y, width, w, eps));
}

static void w_add_norm_norm(muse_backend *be, muse_act h, muse_act y, long width, const muse_vec *w,
                            float eps, const muse_vec *next_w, muse_norm_weight next_mode,
                            float next_eps, muse_act out)
{
    WRAP(BENCH_ST_NORMS, add_norm_norm(be, h, y, width, w, eps, next_w, next_mode, next_eps, out));
}

/* A layer's o is attention's; every other single linear of the forward is a dense down. */
static int linear_stage(const muse_backend *be, const muse_linear *l)
{
    const muse_model *m = be->model;
    for (int i = 0; i < (int)m->cfg.num_layers; i++)
        if (l == &m->layers[i].o) return BENCH_ST_ATTENTION;
    return BENCH_ST_DENSE;
}

static void w_linear(muse_backend *be, const muse_linear *l, muse_act x, int round16, muse_act y)
{
    WRAP(linear_stage(be, l), linear(be, l, x, round16, y));
}

static void w_linears(muse_backend *be, int n, const muse_linear *const *ls, muse_act x,
                      int round16, const muse_act *ys)
{
    WRAP(BENCH_ST_ATTENTION, linears(be, n, ls, x, round16, ys));
}

static void w_swiglu_linear(muse_backend *be, const muse_linear *gate, const muse_linear *up,
                            muse_act x, muse_act g, muse_act u, muse_act out)
{
    WRAP(BENCH_ST_DENSE, swiglu_linear(be, gate, up, x, g, u, out));
}

static void w_qk_norm_rope(muse_backend *be, muse_act x, long heads, long head_dim, double theta,
                           float eps)
{
    WRAP(BENCH_ST_ATTENTION, qk_norm_rope(be, x, heads, head_dim, theta, eps));
}

static void w_attention(muse_backend *be, int layer, muse_act q, muse_act k, muse_act v, muse_act g,
                        muse_act o)
{
    WRAP(BENCH_ST_ATTENTION, attention(be, layer, q, k, v, g, o));
}

static void w_swiglu(muse_backend *be, muse_act gate, muse_act up, long width, muse_act out)
{
    WRAP(BENCH_ST_DENSE, swiglu(be, gate, up, width, out));
}

static void w_moe(muse_backend *be, const muse_layer *ly, muse_act b, muse_act y)
{
    WRAP(BENCH_ST_MOE, moe(be, ly, b, y));
}

static void w_all_reduce(muse_backend *be, muse_act x, long width)
{
    WRAP(BENCH_ST_ALL_REDUCE, all_reduce(be, x, width));
}

static void w_head(muse_backend *be, muse_act x, muse_act logits)
{
    WRAP(BENCH_ST_HEAD, head(be, x, logits));
}

static void w_sample(muse_backend *be, muse_act logits)
{
    WRAP(BENCH_ST_SAMPLER, sample(be, logits));
}

static int w_begin_round(muse_backend *be, const muse_round *r, muse_err *e)
{
    int64_t t0 = tick();
    int rc = W.inner->begin_round(be, r, e);
    tock(BENCH_ST_HOST, t0);
    return rc;
}

static int w_end_round(muse_backend *be, muse_round_out *out, muse_err *e)
{
    int64_t t0 = tick();
    int rc = W.inner->end_round(be, out, e);
    tock(BENCH_ST_HOST, t0);
    return rc;
}

/* Puts the wrappers in front of be's ops (inactive until stages_count). */
static void stages_wrap(muse_backend *be)
{
    memset(&W, 0, sizeof W);
    W.inner = be->ops;
    W.be = be;
    W.outer = *be->ops;
    W.outer.embed = w_embed;
    W.outer.norm = w_norm;
    W.outer.add_norm = w_add_norm;
    W.outer.add_norm_norm = w_add_norm_norm;
    W.outer.linear = w_linear;
    W.outer.linears = w_linears;
    W.outer.swiglu_linear = w_swiglu_linear;
    W.outer.qk_norm_rope = w_qk_norm_rope;
    W.outer.attention = w_attention;
    W.outer.swiglu = w_swiglu;
    W.outer.moe = w_moe;
    W.outer.all_reduce = w_all_reduce;
    W.outer.head = w_head;
    W.outer.sample = w_sample;
    W.outer.begin_round = w_begin_round;
    W.outer.end_round = w_end_round;
    be->ops = &W.outer;
}

/* From now on calls count; the profile's totals so far are the baseline. */
static void stages_count(void)
{
    W.nprev = W.inner->profile ? W.inner->profile(W.be, W.prev, MAX_PROF) : 0;
    W.profiled = W.nprev > 0;
    W.active = 1;
}

/* The real ops back before the backend is destroyed. */
static void stages_unwrap(void)
{
    if (W.be) W.be->ops = W.inner;
    W.be = NULL;
}

/* ---- the command ---- */

typedef struct {
    const char *backend, *json, *baseline, *kernels;
    muse_kernels path;
    bench_weights w;
    long long tokens, context, streams, threads, copy_mib;
} stages_flags;

static const char *const stages_cols[] = {"stage",     "what",     "ms a step",  "% of step",
                                          "MB a step", "floor ms", "% of floor", "calls a step"};
static const char *const stages_keys[] = {"stage"};

/* Each stream's prompt up to f->context in rounds of 64, then f->tokens decode rounds; their
 * seconds in v[] (NULL: not kept), the sum returned, -1 on error. */
static double stages_steps(bench_engine *c, const stages_flags *f, double *v)
{
    double s = 0, sum = 0;
    for (int q = 0; q < (int)f->streams && s >= 0; q++)
        for (int64_t pos = 0; pos < f->context && s >= 0; pos += 64) {
            long rows = f->context - pos < 64 ? (long)(f->context - pos) : 64;
            s = bench_engine_chunk(c, q, pos, rows, pos + rows >= f->context);
        }
    if (s < 0) return -1;
    if (v == NULL) stages_count();
    for (long i = 0; i < f->tokens && s >= 0; i++) {
        sum += s = bench_engine_decode(c, (int)f->streams, f->context + i);
        if (v) v[i] = s;
    }
    return s < 0 ? -1 : sum;
}

static int stages_start(bench_engine *c, const stages_flags *f, const muse_model *m, muse_err *e)
{
    memset(c, 0, sizeof *c);
    c->model = *m; /* the caller's, kept across both passes */
    long rows = f->streams > 64 ? (long)f->streams : 64;
    return bench_engine_attach(c, f->backend, f->path, rows, (int)f->streams,
                               f->context + f->tokens + 1, (int)f->threads, e);
}

static void stages_stop(bench_engine *c)
{
    stages_unwrap();
    bench_engine_detach(c);
}

/* The rows: each stage's time a step against its bytes, then host time and the gaps. */
static void stages_rows(bench_table *t, const stages_flags *f, const muse_model *m, double wall,
                        double bw)
{
    double bytes[BENCH_ST_N], steps = (double)f->tokens, known = 0;
    bench_decode_stage_bytes(m, (long)f->streams, f->context + f->tokens / 2, bytes);
    for (int i = 0; i < BENCH_ST_GAPS; i++) known += W.s[i] / steps;
    W.s[BENCH_ST_GAPS] = (wall - known) * steps;
    if (W.calls[BENCH_ST_MOE]) /* not split: the moe row has the three parts' bytes */
        bytes[BENCH_ST_MOE] =
            bytes[BENCH_ST_ROUTER] + bytes[BENCH_ST_ROUTED] + bytes[BENCH_ST_SHARED];
    for (int i = 0; i < BENCH_ST_N; i++) {
        double ms = W.s[i] / steps * 1e3, floor_ms = bytes[i] / bw * 1e3;
        int counted = bytes[i] > 0, timed = W.calls[i] > 0 || i == BENCH_ST_GAPS;
        if (!timed && !counted) continue; /* not in this model */
        const char *cells[] = {stage_names[i],
                               stage_what[i],
                               timed ? bench_fmt("%.3f", ms) : "-",
                               timed ? bench_fmt("%.1f", 100.0 * ms / (wall * 1e3)) : "-",
                               bench_fmt("%.3f", bytes[i] / 1e6),
                               bench_fmt("%.4f", floor_ms),
                               counted && timed && ms > 0 ? bench_fmt("%.1f", 100.0 * floor_ms / ms)
                                                          : "-",
                               bench_fmt("%.1f", (double)W.calls[i] / steps)};
        bench_table_row(t, cells);
    }
}

static int stages_run(const stages_flags *f, int argc, char **argv)
{
    muse_err e = {{0}};
    muse_model m;
    if (bench_weights_load(&f->w, f->backend, &m, &e)) {
        fprintf(stderr, "muse-bench stages: %s\n", e.msg);
        return 1;
    }
    int cuda = !strcmp(f->backend, "cuda"), rc = 1;
    char title[300], why[512], line[256];
    snprintf(title, sizeof title,
             "One decode round on %s, stage by stage: %lld streams of one row at context %lld, "
             "%lld rounds",
             f->backend, f->streams, f->context, f->tokens);
    bench_table t;
    bench_table_open(&t, "stages", title, stages_cols, 8, f->json && !strcmp(f->json, "-"));
    bench_table_io io = {f->json, f->baseline, stages_keys, 1, "ms a step", argc, argv};
    bench_engine c;
    double *v = MUSE_MALLOC((size_t)f->tokens * sizeof *v), bw = 0;
    if (bench_table_io_setup(&t, &io, why, sizeof why)) {
        fprintf(stderr, "muse-bench stages: %s\n", why);
        goto out;
    }
    /* Pass 1, as served (cuda: graphs, no profile): the step's wall time. */
    if (cuda) unsetenv("MUSE_CUDA_PROFILE");
    if (stages_start(&c, f, &m, &e)) goto device_error;
    double sum =
        bench_copy_head(c.be, (long)f->copy_mib, &t, &bw, &e) ? -1 : stages_steps(&c, f, v);
    stages_stop(&c);
    if (sum < 0) goto device_error;
    double wall = sum / (double)f->tokens, p50 = bench_quantile(v, (size_t)f->tokens, 0.5);
    /* Pass 2, each op timed: the stages. */
    if (cuda) setenv("MUSE_CUDA_PROFILE", "1", 1);
    if (stages_start(&c, f, &m, &e)) goto device_error;
    stages_wrap(c.be);
    double psum = stages_steps(&c, f, NULL);
    int profiled = W.profiled;
    double stage_s[BENCH_ST_N];
    long stage_calls[BENCH_ST_N];
    memcpy(stage_s, W.s, sizeof stage_s);
    memcpy(stage_calls, W.calls, sizeof stage_calls);
    stages_stop(&c);
    if (cuda) unsetenv("MUSE_CUDA_PROFILE");
    if (psum < 0) goto device_error;
    memcpy(W.s, stage_s, sizeof stage_s);
    memcpy(W.calls, stage_calls, sizeof stage_calls);
    /* The gaps against the round as served where the profile slows it (it waits after each op);
     * host-clock times leave the round as it is, so against that same round. */
    double round_s = profiled ? wall : psum / (double)f->tokens;
    snprintf(line, sizeof line,
             "mean %.3f ms, p50 %.3f ms a round as served (no profile%s); %.3f ms a round with "
             "each op timed",
             wall * 1e3, p50 * 1e3, cuda ? ", graphs as MUSE_CUDA_GRAPHS says" : "",
             psum / (double)f->tokens * 1e3);
    bench_table_head(&t, "step", line);
    bench_table_number(&t, "step ms", wall * 1e3);
    bench_table_head(&t, "times",
                     profiled ? "the backend's profile (device time of each op by events, eager; "
                                "the moe in parts)"
                              : "the host clock around each op call (this backend's ops are "
                                "synchronous; the moe whole)");
    bench_table_head(&t, "shares",
                     profiled
                         ? "of the mean round as served; launch gaps = that - every stage above"
                         : "of the mean round with each op timed; launch gaps = that - every "
                           "stage above");
    bench_table_head(&t, "moe (unsplit)",
                     "where the backend times the moe whole, its row holds the bytes of router, "
                     "routed and shared experts (their rows: bytes only)");
    bench_table_number(&t, "round ms", round_s * 1e3);
    bench_table_header(&t);
    stages_rows(&t, f, &m, round_s, bw);
    rc = bench_table_end(&t) ? 1 : 0;
    goto done;
device_error:
    fprintf(stderr, "muse-bench stages: %s\n", e.msg);
out:
    bench_table_discard(&t);
done:
    free(v);
    muse_model_free(&m);
    return rc;
}

int bench_cmd_stages(int argc, char **argv)
{
    stages_flags f = {
        .backend = "cpu", .tokens = 16, .context = 256, .streams = 1, .w = {.synthetic = -1}};
    const muse_flag table[] = {
        MUSE_FLAG_S("backend", &f.backend, "cpu|cuda", "the backend to measure", .def = "cpu"),
        MUSE_KERNELS_FLAG(&f.kernels),
        MUSE_FLAG_S("model", &f.w.dir, "DIR", "the pack (or --synthetic-weights)"),
        BENCH_SYNTHETIC_FLAGS(f.w),
        MUSE_FLAG_L("tokens", &f.tokens, 1, 100000, "N", "decode rounds measured"),
        MUSE_FLAG_L("context", &f.context, 1, 1 << 20, "N", "prompt tokens before them"),
        MUSE_FLAG_L("streams", &f.streams, 1, 256, "S", "sequences decoding together"),
        MUSE_FLAG_L("threads", &f.threads, 0, 1024, "N", "cpu threads", .def = "0: one per core"),
        MUSE_FLAG_L("copy-mib", &f.copy_mib, 0, 65536, "MIB", "the copy bandwidth's buffer",
                    .def = "0: 1024 on cuda, 256 on cpu"),
        MUSE_FLAG_S("json", &f.json, "FILE", "also write the table as JSON to FILE (-: stdout)"),
        MUSE_FLAG_S("baseline", &f.baseline, "FILE",
                    "a previous --json FILE: a column of this run's ms a step over its"),
    };
    int prc = bench_parse_flags("stages",
                                "One decode round stage by stage: each stage's time, share of the "
                                "round and bytes floor.\n",
                                table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    if ((prc = bench_kernels_flag("stages", f.kernels, &f.path))) return prc;
    if (!f.w.dir && f.w.synthetic < 0)
        return bench_usage_error("stages", "--model DIR (or --synthetic-weights SEED --config "
                                           "FILE) is required");
    return stages_run(&f, argc, argv);
}
