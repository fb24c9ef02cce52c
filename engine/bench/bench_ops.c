/* muse-bench kernels: every operation of the backend seam (the cases of check/op_cases.c) on a
 * backend, repeated inside rounds and timed on the host around end_round, which waits for the
 * device; an empty round's time is subtracted. Each row sets the time against the bytes the
 * operation must move over the copy bandwidth measured in the same run (its bytes floor). */
#include <math.h>
#include <stdlib.h>

#include "base/clock.h"
#include "base/muse_common.h"
#include "bench.h"
#include "bench_ops.h"

#define MAX_ROW_COUNTS 8

/* ---- the weights ---- */

int bench_weights_load(const bench_weights *w, const char *backend, muse_model *m, muse_err *e)
{
    if (muse_model_flags_check(w->dir, w->synthetic, w->config, w->bits, w->codebook, e)) return -1;
    if (w->dir) return muse_model_load(w->dir, m, e);
    muse_synthetic syn = {w->config,   (uint64_t)w->synthetic,   (int)w->bits,
                          w->codebook, !strcmp(backend, "cuda"), 0};
    return muse_model_synthetic(&syn, m, e);
}

/* ---- bytes ---- */

static double linear_weight_bytes(const muse_linear *l)
{
    if (l->kind == MUSE_LIN_EXL3) /* trellis at bits a weight, fp16 suh [k] and svh [n] */
        return (double)l->k * (double)l->n * l->exl3.bits / 8.0 + 2.0 * (double)(l->k + l->n);
    return (double)l->k * (double)l->n * (double)muse_dtype_size(l->w->dtype);
}

static double linear_bytes(const muse_linear *l, long R)
{
    return linear_weight_bytes(l) + 4.0 * (double)R * (double)(l->k + l->n);
}

static double mlp_weight_bytes(const muse_mlp *p)
{
    return linear_weight_bytes(&p->gate) + linear_weight_bytes(&p->up) +
           linear_weight_bytes(&p->down);
}

/* KV of layer i read once for rows at ctx .. ctx+R-1 (a sliding layer: its window), fp16 K
 * and V, plus the rows' K and V written, q, g, k, v in and o out (fp32). */
static double attention_bytes(const muse_config *c, int i, long R, int64_t ctx)
{
    double Q = (double)(c->n_heads * c->head_dim), KV = (double)(c->n_kv_heads * c->head_dim);
    double span = (double)(ctx + R);
    if (c->attn_kind[i] == MUSE_ATTN_SLIDING && c->sliding_window + R - 1 < ctx + R)
        span = (double)(c->sliding_window + R - 1);
    return span * KV * 2.0 * 2.0 + (double)R * (KV * 2.0 * 2.0 + 3.0 * Q * 4.0 + 2.0 * KV * 4.0);
}

/* Router, the experts R uniformly routed rows are expected to touch, the shared experts. */
static double moe_bytes(const muse_model *m, const muse_layer *ly, long R)
{
    const muse_config *c = &m->cfg;
    double E = (double)c->num_experts, K = (double)c->num_experts_per_tok,
           H = (double)c->hidden_size;
    double touched = E * (1.0 - pow(1.0 - K / E, (double)R));
    double b = E * H * (double)muse_dtype_size(ly->router->dtype) + (ly->router_bias.v ? E * 4 : 0);
    b += touched * (mlp_weight_bytes(&ly->experts[0]) + (c->expert_output_norm ? H * 4.0 : 0));
    if (c->num_shared_experts > 0) b += mlp_weight_bytes(&ly->shared);
    return b + 2.0 * (double)R * H * 4.0;
}

double bench_op_bytes(const muse_model *m, const muse_op_case *k, long R, int64_t ctx)
{
    const muse_config *c = &m->cfg;
    double W = (double)k->in_width, r = (double)R, H = (double)c->hidden_size;
    switch (k->kid) {
    case MUSE_K_EMBED:
        return r * H * ((double)muse_dtype_size(m->embed->dtype) + 4.0) + r * 4;
    case MUSE_K_NORM:
        return (k->param % 3 ? W * 4 : 0) + 2.0 * r * W * 4;
    case MUSE_K_ADD_NORM:
        return W * 4 + 3.0 * r * W * 4;
    case MUSE_K_ADD_NORM_NORM:
        return 2.0 * W * 4 + 4.0 * r * W * 4;
    case MUSE_K_LINEARS: {
        const muse_layer *l0 = k->arg;
        return linear_weight_bytes(&l0->q) + linear_weight_bytes(&l0->k) +
               linear_weight_bytes(&l0->v) + linear_weight_bytes(&l0->gate) +
               4.0 * r * (W + (double)k->out_width);
    }
    case MUSE_K_SWIGLU_LINEAR: {
        const muse_mlp *p = k->arg;
        return linear_weight_bytes(&p->gate) + linear_weight_bytes(&p->up) +
               4.0 * r * (W + (double)k->out_width);
    }
    case MUSE_K_LINEAR_DENSE:
    case MUSE_K_LINEAR_EXL3:
    case MUSE_K_HEAD:
        return linear_bytes(k->arg, R);
    case MUSE_K_ATTN_FULL:
    case MUSE_K_ATTN_SLIDING:
        return attention_bytes(c, (int)k->param, R, ctx);
    case MUSE_K_MOE:
        return moe_bytes(m, k->arg, R);
    case MUSE_K_SAMPLE:
        return r * W * 4;
    case MUSE_K_ALL_REDUCE:
        return 0; /* one rank moves nothing */
    default:
        return muse_op_io_bytes(k, R); /* a simple op: its fp32 rows in and out */
    }
}

double bench_step_bytes(const muse_model *m, long R, int64_t ctx)
{
    const muse_config *c = &m->cfg;
    double H = (double)c->hidden_size, r = (double)R, b = 0;
    double norm = H * 4 + 2.0 * r * H * 4, add_norm = H * 4 + 3.0 * r * H * 4;
    double Q = (double)(c->n_heads * c->head_dim), KV = (double)(c->n_kv_heads * c->head_dim);
    b += r * H * ((double)muse_dtype_size(m->embed->dtype) + 4.0);
    for (int i = 0; i < (int)c->num_layers; i++) {
        const muse_layer *ly = &m->layers[i];
        b += 2 * norm + 2 * add_norm + 2.0 * r * (Q + KV) * 4; /* norms, qk_norm_rope */
        b += linear_bytes(&ly->q, R) + linear_bytes(&ly->k, R) + linear_bytes(&ly->v, R) +
             linear_bytes(&ly->gate, R) + linear_bytes(&ly->o, R);
        b += attention_bytes(c, i, R, ctx);
        if (c->mlp_kind[i] == MUSE_MLP_DENSE)
            b += linear_bytes(&ly->dense.gate, R) + linear_bytes(&ly->dense.up, R) +
                 linear_bytes(&ly->dense.down, R) + 3.0 * r * (double)c->intermediate_size * 4;
        else
            b += moe_bytes(m, ly, R);
    }
    return b + norm + linear_bytes(&m->head, R) + r * (double)c->vocab_size * 4;
}

void bench_decode_stage_bytes(const muse_model *m, long streams, int64_t ctx,
                              double out[BENCH_ST_N])
{
    const muse_config *c = &m->cfg;
    double H = (double)c->hidden_size, r = (double)streams;
    double norm = H * 4 + 2.0 * r * H * 4, add_norm = H * 4 + 3.0 * r * H * 4;
    double Q = (double)(c->n_heads * c->head_dim), KV = (double)(c->n_kv_heads * c->head_dim);
    double E = (double)c->num_experts, K = (double)c->num_experts_per_tok;
    double touched = E * (1.0 - pow(1.0 - K / E, r));
    for (int i = 0; i < BENCH_ST_N; i++) out[i] = 0;
    out[BENCH_ST_EMBED] = r * H * ((double)muse_dtype_size(m->embed->dtype) + 4.0);
    out[BENCH_ST_NORMS] = norm;
    for (int i = 0; i < (int)c->num_layers; i++) {
        const muse_layer *ly = &m->layers[i];
        out[BENCH_ST_NORMS] += 2 * norm + 2 * add_norm;
        out[BENCH_ST_ATTENTION] +=
            2.0 * r * (Q + KV) * 4 + linear_bytes(&ly->q, streams) + linear_bytes(&ly->k, streams) +
            linear_bytes(&ly->v, streams) + linear_bytes(&ly->gate, streams) +
            linear_bytes(&ly->o, streams) + r * attention_bytes(c, i, 1, ctx);
        if (c->mlp_kind[i] == MUSE_MLP_DENSE) {
            out[BENCH_ST_DENSE] +=
                linear_bytes(&ly->dense.gate, streams) + linear_bytes(&ly->dense.up, streams) +
                linear_bytes(&ly->dense.down, streams) + 3.0 * r * (double)c->intermediate_size * 4;
            continue;
        }
        /* moe_bytes split: the router, the experts touched with the activations, the shared */
        out[BENCH_ST_ROUTER] +=
            E * H * (double)muse_dtype_size(ly->router->dtype) + (ly->router_bias.v ? E * 4 : 0);
        out[BENCH_ST_ROUTED] +=
            touched * (mlp_weight_bytes(&ly->experts[0]) + (c->expert_output_norm ? H * 4.0 : 0)) +
            2.0 * r * H * 4.0;
        if (c->num_shared_experts > 0) out[BENCH_ST_SHARED] += mlp_weight_bytes(&ly->shared);
    }
    out[BENCH_ST_HEAD] = linear_bytes(&m->head, streams);
    out[BENCH_ST_SAMPLER] = r * (double)c->vocab_size * 4;
}

int bench_copy_head(muse_backend *be, long copy_mib, bench_table *t, double *bytes_per_s,
                    muse_err *e)
{
    if (!be->ops->copy_bandwidth)
        return muse_fail(e, "backend %s does not measure its copy bandwidth", be->ops->name);
    int cuda = !strcmp(be->ops->name, "cuda");
    size_t mib = copy_mib > 0 ? (size_t)copy_mib : cuda ? 1024 : 256;
    char device[256] = "?";
    if (be->ops->copy_bandwidth(be, mib << 20, bytes_per_s, device, sizeof device, e)) return -1;
    bench_table_head(t, "backend", be->ops->name);
    bench_table_head(t, "kernels", muse_kernels_name(be->kernels));
    bench_table_head(t, "device", device);
    char line[200];
    snprintf(line, sizeof line,
             "%.2f GB/s (read + write bytes over time: a copy of %zu MiB counts 2 x %zu MiB; "
             "%s, best of 5)",
             *bytes_per_s / 1e9, mib, mib,
             cuda ? "cudaMemcpyAsync device to device, events" : "memcpy on the backend's threads");
    bench_table_head(t, "copy bandwidth", line);
    bench_table_number(t, "copy GB/s", *bytes_per_s / 1e9);
    return 0;
}

/* ---- one operation inside a round ---- */

typedef struct {
    muse_op_acts acts;
    const muse_model *m;
    long R;      /* rows of the round */
    int64_t ctx; /* the first row's position */
    int32_t tok[4096], seqs[4096];
    int64_t pos[4096], draw[4096];
    muse_sampling sp[4096];
} bench_run;

/* The inputs op k reads, written once through its record (check/op_run.c): the values do not
 * change what a call costs. */
static void prepare(bench_run *b, const muse_op_case *k)
{
    int64_t ids[4096];
    for (long r = 0; r < b->R; r++) ids[r] = b->ctx + r;
    muse_op_run_of(k->kid)->inputs(&b->acts, k, ids, b->R);
}

/* One call of op k, inside a round (nothing allocated: prepare did it). */
static void call(bench_run *b, const muse_op_case *k)
{
    muse_op_run_of(k->kid)->call(&b->acts, k);
}

/* Seconds of one round of `calls` calls of k (k NULL: an empty round); -1 on a device error. */
static double round_s(bench_run *b, const muse_op_case *k, long calls, muse_err *e)
{
    muse_backend *be = b->acts.be;
    muse_round rd = {.rows = b->R,
                     .tokens = b->tok,
                     .positions = b->pos,
                     .seqs = b->seqs,
                     .sampling = b->sp,
                     .draw_pos = b->draw};
    muse_round_out out;
    double t0 = muse_now_s();
    if (be->ops->begin_round(be, &rd, e)) return -1;
    for (long i = 0; k && i < calls; i++) call(b, k);
    if (be->ops->end_round(be, &out, e)) return -1;
    return muse_now_s() - t0;
}

/* Median seconds of rounds of `calls` calls for >= min_s (3 to 1000 rounds); -1 on error. */
static double median_round(bench_run *b, const muse_op_case *k, long calls, double min_s,
                           muse_err *e)
{
    double v[1000], total = 0;
    int n = 0;
    while (n < 1000 && (n < 3 || total < min_s)) {
        if ((v[n] = round_s(b, k, calls, e)) < 0) return -1;
        total += v[n++];
    }
    return bench_quantile(v, (size_t)n, 0.5);
}

/* Seconds a call of k: calls a round doubled until a round takes min_s / 8 (at most 4096), then
 * the median round less the empty round, over the calls. -1 on error. */
static double time_op(bench_run *b, const muse_op_case *k, double empty_s, double min_s,
                      long *calls_out, muse_err *e)
{
    long calls = 1;
    double t = round_s(b, k, 1, e); /* a warm-up */
    while (t >= 0 && t - empty_s < min_s / 8 && calls < 4096) t = round_s(b, k, calls *= 2, e);
    if (t < 0 || (t = median_round(b, k, calls, min_s, e)) < 0) return -1;
    *calls_out = calls;
    return t > empty_s ? (t - empty_s) / (double)calls : 0;
}

static void shape_of(const muse_model *m, const muse_op_case *k, int64_t ctx, char *out, size_t len)
{
    const muse_config *c = &m->cfg;
    const muse_linear *l = k->arg;
    switch (k->kid) {
    case MUSE_K_LINEAR_DENSE:
    case MUSE_K_LINEAR_EXL3:
    case MUSE_K_HEAD:
        if (l->kind == MUSE_LIN_EXL3)
            snprintf(out, len, "%lldx%lld exl3 %d bits", (long long)l->k, (long long)l->n,
                     l->exl3.bits);
        else
            snprintf(out, len, "%lldx%lld %s", (long long)l->k, (long long)l->n,
                     muse_dtype_name(l->w->dtype));
        break;
    case MUSE_K_ATTN_FULL:
    case MUSE_K_ATTN_SLIDING:
        snprintf(out, len, "%lldq %lldkv x %lld, ctx %lld%s", (long long)c->n_heads,
                 (long long)c->n_kv_heads, (long long)c->head_dim, (long long)ctx,
                 k->kid == MUSE_K_ATTN_SLIDING ? " (window)" : "");
        break;
    case MUSE_K_LINEARS:
        snprintf(out, len, "%ldx(%lld+%lld+%lld+%lld)", k->in_width,
                 (long long)((const muse_layer *)k->arg)->q.n,
                 (long long)((const muse_layer *)k->arg)->k.n,
                 (long long)((const muse_layer *)k->arg)->v.n,
                 (long long)((const muse_layer *)k->arg)->gate.n);
        break;
    case MUSE_K_SWIGLU_LINEAR:
        snprintf(out, len, "%ldx%ld x2", k->in_width, k->out_width);
        break;
    case MUSE_K_MOE:
        snprintf(out, len, "%lld of %lld, %lldx%lld", (long long)c->num_experts_per_tok,
                 (long long)c->num_experts, (long long)c->hidden_size,
                 (long long)c->moe_intermediate_size);
        break;
    case MUSE_K_SAMPLE:
        snprintf(out, len, "V %ld, T 0.7 top-k 40 top-p 0.9", k->in_width);
        break;
    default:
        snprintf(out, len, "width %ld", k->in_width);
        break;
    }
}

/* The cases a kernels table has: one norm (the blocks' 1+w, fp16), no all_reduce (one rank). */
static int wanted_case(const muse_op_case *k)
{
    if (k->kid == MUSE_K_NORM) return k->param == 3 + MUSE_NORM_PLUS1;
    return k->kid != MUSE_K_ALL_REDUCE;
}

/* ---- the command ---- */

typedef struct {
    const char *backend, *rows_s, *json, *baseline, *kernels;
    muse_kernels path; /* --kernels */
    bench_weights w;
    long long ctx, threads, copy_mib, device;
    double min_ms;
} kernels_flags;

/* The backend for rows up to max_rows at positions from ctx; cuda launches eagerly unless
 * MUSE_CUDA_GRAPHS says otherwise: a graph's capture would be timed on the host before the
 * device starts, where eager launches overlap it. */
static muse_backend *kernels_backend(const kernels_flags *f, const muse_model *m, long max_rows,
                                     muse_err *e)
{
    if (!strcmp(f->backend, "cuda") && !getenv("MUSE_CUDA_GRAPHS"))
        setenv("MUSE_CUDA_GRAPHS", "0", 1);
    muse_backend_opts o = {.max_rows = max_rows,
                           .max_seqs = 1,
                           .context = f->ctx + max_rows + 1,
                           .threads = (int)f->threads,
                           .kernels = f->path};
    o.devices[0] = (int)f->device;
    return muse_backend_create(f->backend, m, &o, e);
}

/* The round's batch: rows at ctx .. ctx+R-1 of sequence 0, each drawing with T 0.7, top-k 40,
 * top-p 0.9 (issue 20's sampler target: top-k and top-p on). */
static void round_rows(bench_run *b, long R)
{
    b->R = R;
    for (long r = 0; r < R; r++) {
        b->tok[r] = (int32_t)(muse_op_mix((uint64_t)r) % (uint64_t)b->m->cfg.vocab_size);
        b->pos[r] = b->ctx + r;
        b->seqs[r] = 0;
        b->draw[r] = b->ctx + r + 1;
        b->sp[r] = (muse_sampling){
            .temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .seed = (uint64_t)r + 1};
    }
}

/* An empty round of R rows (its inputs prepared, so every buffer is allocated before the
 * first timed round): its median seconds, as a head line of t; -1 on a device error. */
static double empty_round(bench_table *t, bench_run *b, const muse_op_case *cs, int n, long R,
                          double min_s, muse_err *e)
{
    round_rows(b, R);
    for (int i = 0; i < n; i++)
        if (wanted_case(&cs[i])) prepare(b, &cs[i]);
    double empty = median_round(b, NULL, 0, min_s, e);
    if (empty < 0) return -1;
    char head[64];
    snprintf(head, sizeof head, "empty round, %ld rows", R);
    bench_table_head(t, head, bench_fmt("%.1f us, subtracted from every round", empty * 1e6));
    return empty;
}

/* Every wanted case at R rows into t; -1 on a device error. */
static int kernels_table(bench_table *t, bench_run *b, const muse_op_case *cs, int n, long R,
                         double min_s, double bw, double empty, muse_err *e)
{
    round_rows(b, R);
    for (int i = 0; i < n; i++) {
        if (!wanted_case(&cs[i])) continue;
        prepare(b, &cs[i]);
        long calls;
        double s = time_op(b, &cs[i], empty, min_s, &calls, e);
        if (s < 0) return -1;
        double bytes = bench_op_bytes(b->m, &cs[i], R, b->ctx), floor_s = bytes / bw;
        char shape[96];
        shape_of(b->m, &cs[i], b->ctx, shape, sizeof shape);
        const char *cells[] = {cs[i].name,
                               shape,
                               bench_fmt("%.0f", (double)R),
                               bench_fmt("%.2f", s * 1e6),
                               bench_fmt("%.0f", bytes),
                               bench_fmt("%.2f", floor_s * 1e6),
                               s > 0 ? bench_fmt("%.1f", 100.0 * floor_s / s) : "-",
                               bench_fmt("%.0f", (double)calls)};
        bench_table_row(t, cells);
    }
    return 0;
}

static const char *const kernels_cols[] = {"op",    "shape",    "rows",       "us/call",
                                           "bytes", "floor us", "% of floor", "calls/round"};
static const char *const kernels_keys[] = {"op", "shape", "rows"};

/* The table of every case at every row count; the exit status. */
static int kernels_run(const kernels_flags *f, const long long *rows, int n_rows, int argc,
                       char **argv)
{
    muse_err e = {{0}};
    muse_model m;
    if (bench_weights_load(&f->w, f->backend, &m, &e)) {
        fprintf(stderr, "muse-bench kernels: %s\n", e.msg);
        return 1;
    }
    long max_rows = 1;
    for (int i = 0; i < n_rows; i++)
        if (rows[i] > max_rows) max_rows = (long)rows[i];
    muse_backend *be = kernels_backend(f, &m, max_rows, &e);
    if (!be) {
        fprintf(stderr, "muse-bench kernels: %s\n", e.msg);
        muse_model_free(&m);
        return 1;
    }
    static muse_op_case cs[MUSE_OP_MAX_CASES];
    int n = muse_op_cases(&m, cs), rc = 1;
    int as_json = f->json && !strcmp(f->json, "-");
    static bench_run b;
    memset(&b, 0, sizeof b);
    b.acts.be = be;
    b.m = &m;
    b.ctx = f->ctx;
    MUSE_CHECK(muse_kv_ensure(&be->kv, 0, f->ctx + max_rows) == 0);
    char title[1200], why[512];
    snprintf(title, sizeof title,
             "Backend operations on %s (%s): time a call, inside rounds, against its bytes floor "
             "(bytes / copy bandwidth)",
             f->backend, m.dir);
    bench_table t;
    bench_table_open(&t, "kernels", title, kernels_cols, 8, as_json);
    bench_table_io io = {f->json, f->baseline, kernels_keys, 3, "us/call", argc, argv};
    double bw, empty[MAX_ROW_COUNTS], min_s = f->min_ms / 1e3;
    if (bench_table_io_setup(&t, &io, why, sizeof why)) {
        fprintf(stderr, "muse-bench kernels: %s\n", why);
        goto out;
    }
    if (bench_copy_head(be, (long)f->copy_mib, &t, &bw, &e)) goto device_error;
    if (!strcmp(f->backend, "cuda"))
        bench_table_head(&t, "cuda graphs",
                         strcmp(getenv("MUSE_CUDA_GRAPHS"), "0") ? "on (MUSE_CUDA_GRAPHS)"
                                                                 : "off: eager launches");
    for (int r = 0; r < n_rows; r++)
        if ((empty[r] = empty_round(&t, &b, cs, n, (long)rows[r], min_s, &e)) < 0)
            goto device_error;
    bench_table_head(&t, "bytes",
                     "weights of the shard + activations in and out (fp32) + KV written and read "
                     "(fp16); moe: the experts uniform routing is expected to touch; rows padded "
                     "up to a bucket (powers of two, then the largest)");
    bench_table_header(&t);
    for (int r = 0; r < n_rows; r++)
        if (kernels_table(&t, &b, cs, n, (long)rows[r], min_s, bw, empty[r], &e)) goto device_error;
    rc = bench_table_end(&t) ? 1 : 0;
    goto done;
device_error:
    fprintf(stderr, "muse-bench kernels: %s\n", e.msg);
out:
    bench_table_discard(&t);
done:
    muse_backend_destroy(be);
    muse_model_free(&m);
    return rc;
}

int bench_cmd_kernels(int argc, char **argv)
{
    kernels_flags f = {
        .backend = "cpu", .rows_s = "1,256", .ctx = 1024, .min_ms = 100, .w = {.synthetic = -1}};
    const muse_flag table[] = {
        MUSE_FLAG_S("backend", &f.backend, "cpu|cuda", "the backend to measure", .def = "cpu"),
        MUSE_KERNELS_FLAG(&f.kernels),
        MUSE_FLAG_S("model", &f.w.dir, "DIR", "the pack (or --synthetic-weights)"),
        BENCH_SYNTHETIC_FLAGS(f.w),
        MUSE_FLAG_S("rows", &f.rows_s, "M,M,...", "rows a round (1: decode; more: a prompt)",
                    .def = "1,256"),
        MUSE_FLAG_L("context", &f.ctx, 0, 1 << 20, "N", "attention: the first row's position"),
        MUSE_FLAG_D("min-ms", &f.min_ms, 0.001, 600000, "MS", "milliseconds an op runs at least"),
        MUSE_FLAG_L("threads", &f.threads, 0, 1024, "N", "cpu threads", .def = "0: one per core"),
        MUSE_FLAG_L("device", &f.device, 0, 64, "N", "cuda: the GPU ordinal"),
        MUSE_FLAG_L("copy-mib", &f.copy_mib, 0, 65536, "MIB", "the copy bandwidth's buffer",
                    .def = "0: 1024 on cuda, 256 on cpu"),
        MUSE_FLAG_S("json", &f.json, "FILE", "also write the table as JSON to FILE (-: stdout)"),
        MUSE_FLAG_S("baseline", &f.baseline, "FILE",
                    "a previous --json FILE: a column of this run's us/call over its"),
    };
    int prc = bench_parse_flags("kernels",
                                "Every operation of the backend seam, a call's time against its "
                                "bytes floor.\n",
                                table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    if ((prc = bench_kernels_flag("kernels", f.kernels, &f.path))) return prc;
    long long rows[MAX_ROW_COUNTS];
    char why[160];
    int n_rows =
        bench_parse_int_list("--rows", f.rows_s, 1, 4096, rows, MAX_ROW_COUNTS, why, sizeof why);
    if (n_rows <= 0) return bench_usage_error("kernels", why);
    if (!f.w.dir && f.w.synthetic < 0)
        return bench_usage_error("kernels",
                                 "--model DIR (or --synthetic-weights SEED --config FILE) is "
                                 "required");
    return kernels_run(&f, rows, n_rows, argc, argv);
}
