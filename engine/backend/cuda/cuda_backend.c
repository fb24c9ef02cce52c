/* The CUDA backend: every operation of backend.h on one GPU, each a kernel of kernels/ that
 * equals the CPU reference (cpu_backend.c) bit for bit where it can (the same fixed-order
 * double sums, no contraction) and within the harness's relative bounds everywhere. Everything
 * is allocated and uploaded at start (weights once, sized from the options); a round copies
 * its batch into pinned staging, launches kernels on one stream and allocates nothing; the
 * first failing CUDA call is kept with its file:line and end_round reports it (sticky: the
 * context is not used again). Each round is captured as a CUDA graph and replayed through one
 * executable graph a row bucket (MUSE_CUDA_GRAPHS=0: eager launches; the bits are the same).
 * One rank per process for now. */
#include <math.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "base/clock.h"
#include "model/shard.h"
#include "kernels/attention.cuh"
#include "kernels/embed.cuh"
#include "kernels/fault.cuh"
#include "kernels/head.cuh"
#include "kernels/linear.cuh"
#include "kernels/moe.cuh"
#include "kernels/norm.cuh"
#include "kernels/qk_rope.cuh"
#include "kernels/sample.cuh"
#include "kernels/swiglu.cuh"

enum {
    PROF_BEGIN,
    PROF_END,
    PROF_EMBED,
    PROF_NORM,
    PROF_ADD_NORM,
    PROF_DENSE,
    PROF_EXL3,
    PROF_QK,
    PROF_ATTENTION,
    PROF_SWIGLU,
    PROF_MOE,
    PROF_HEAD,
    PROF_SAMPLE,
    PROF_OPS
};
static const char *const prof_names[PROF_OPS] = {"begin_round (host)",
                                                 "end_round (host)",
                                                 "embed",
                                                 "norm",
                                                 "add_norm",
                                                 "linear dense",
                                                 "linear exl3",
                                                 "qk_norm_rope",
                                                 "attention",
                                                 "swiglu",
                                                 "moe",
                                                 "head",
                                                 "sample"};

/* One uploaded tensor: its host bytes and where they are on the device. */
typedef struct {
    const uint8_t *host;
    size_t bytes, off;
} dev_tensor;

typedef struct {
    muse_backend base;
    int device;
    cudaStream_t st;
    int failed;
    char err[400];
    /* weights: every tensor of the pack in one allocation, found by host address */
    uint8_t *wdev;
    dev_tensor *tensors;
    size_t n_tensors;
    float **vec;         /* [n_vecs] device copies of the fp32 weight vectors */
    float *vec_block;    /* their storage */
    float **router_bias; /* [layers] or NULL entries */
    float **expert_norm; /* [layers] [E, H] */
    muse_k_lin *lin;     /* [n_linears] host copies of the descriptors */
    muse_k_lin *lin_dev; /* [n_linears] on the device */
    muse_k_lin *experts; /* [layers][3][E] on the device: gate, up, down */
    float *cb_tables[3]; /* the codebooks' 65536 values */
    /* activations */
    float **acts;
    long *act_width;
    int n_acts;
    /* round staging: host (pinned) and device */
    long rows, real_rows, wanted, real_wanted;
    int32_t *h_tokens, *h_seqs, *h_want, *h_tables, *h_drawn;
    int64_t *h_positions, *h_draw_pos;
    muse_k_sampling *h_sampling;
    float *h_logits;
    int32_t *d_tokens, *d_seqs, *d_want, *d_tables, *d_drawn;
    int64_t *d_positions, *d_draw_pos;
    muse_k_sampling *d_sampling;
    int do_sample, return_logits, in_round;
    muse_act logits;
    /* CUDA graphs: each round is captured and replayed through one executable graph a row
     * bucket (updated in place when the next capture of the bucket differs) */
    int graphs, capturing;
    cudaGraphExec_t execs[MUSE_MAX_BUCKETS + 1];
    /* MUSE_CUDA_PROFILE=1: each op timed with events (eager, synchronized), printed at exit */
    int prof;
    cudaEvent_t ev0, ev1;
    double prof_ms[PROF_OPS];
    long prof_n[PROF_OPS];
    int weight_bits;
    /* KV: per layer, fp16 */
    uint16_t **k_cache, **v_cache;
    int64_t *kv_cap;
    long kv_width;
    uint16_t *snapshots;
    /* workspaces */
    float *ws_a;
    double *ws_t;
    float *router_logits, *sel_w, *eg, *eu, *ea, *zg, *zs, *xsel, *raw, *weights;
    int32_t *sel, *pair_src;
} cuda_backend;

static cuda_backend *cu(muse_backend *be)
{
    return (cuda_backend *)be;
}

/* Keeps the first failure with where it happened; returns -1 on failure. */
static int cuda_ok(cuda_backend *c, int rc, const char *what, const char *file, int line)
{
    if (rc == 0) return 0;
    if (!c->failed)
        snprintf(c->err, sizeof c->err, "%s:%d: %s: %s", file, line, what,
                 cudaGetErrorString((cudaError_t)rc));
    c->failed = 1;
    return -1;
}
#define CHECK(c, call) cuda_ok((c), (int)(call), #call, __FILE__, __LINE__)

static void prof_begin(cuda_backend *c)
{
    if (c->prof && !c->failed) CHECK(c, cudaEventRecord(c->ev0, c->st));
}

static void prof_end(cuda_backend *c, int op)
{
    float ms = 0;
    if (!c->prof || c->failed || CHECK(c, cudaEventRecord(c->ev1, c->st)) ||
        CHECK(c, cudaEventSynchronize(c->ev1)) ||
        CHECK(c, cudaEventElapsedTime(&ms, c->ev0, c->ev1)))
        return;
    c->prof_ms[op] += ms;
    c->prof_n[op]++;
}

static void prof_host(cuda_backend *c, int op, int64_t since)
{
    if (!c->prof) return;
    c->prof_ms[op] += (double)(muse_now_ns() - since) / 1e6;
    c->prof_n[op]++;
}

static void *dalloc(cuda_backend *c, size_t bytes, uint64_t *account)
{
    void *p = NULL;
    if (c->failed) return NULL;
    if (CHECK(c, cudaMalloc(&p, bytes ? bytes : 1))) return NULL;
    if (account) *account += bytes;
    return p;
}

/* The device address of host bytes inside an uploaded tensor (NULL for NULL). */
static const void *dev_ptr(const cuda_backend *c, const void *host)
{
    if (!host) return NULL;
    const uint8_t *h = host;
    size_t lo = 0, hi = c->n_tensors;
    while (lo < hi) { /* the last tensor starting at or below h */
        size_t mid = (lo + hi) / 2;
        if (c->tensors[mid].host <= h)
            lo = mid + 1;
        else
            hi = mid;
    }
    MUSE_CHECK(lo > 0);
    const dev_tensor *t = &c->tensors[lo - 1];
    MUSE_CHECK(h < t->host + (t->bytes ? t->bytes : 1));
    return c->wdev + t->off + (size_t)(h - t->host);
}

static int kdtype(muse_dtype dt)
{
    return dt == MUSE_DT_F16 ? MUSE_K_F16 : dt == MUSE_DT_BF16 ? MUSE_K_BF16 : MUSE_K_F32;
}

static float *act(cuda_backend *c, muse_act a)
{
    MUSE_CHECK(a >= 0 && a < c->n_acts);
    return c->acts[a];
}

/* ---- start-up ---- */

static int by_host(const void *a, const void *b)
{
    const dev_tensor *x = a, *y = b;
    return x->host < y->host ? -1 : x->host > y->host;
}

static int upload_weights(cuda_backend *c)
{
    const muse_model *m = c->base.model;
    size_t n = muse_st_count(m->st), total = 0;
    c->tensors = MUSE_CALLOC(n ? n : 1, sizeof *c->tensors);
    for (size_t i = 0; i < n; i++) {
        const muse_tensor *t = muse_st_at(m->st, i);
        c->tensors[c->n_tensors++] = (dev_tensor){t->data, t->nbytes, 0};
    }
    qsort(c->tensors, c->n_tensors, sizeof *c->tensors, by_host);
    for (size_t i = 0; i < c->n_tensors; i++) {
        c->tensors[i].off = total;
        total += (c->tensors[i].bytes + 255) / 256 * 256;
    }
    c->wdev = dalloc(c, total, &c->base.ranks[0].weights);
    double t0 = muse_now_s(), shown = t0;
    size_t sent = 0, all = 0;
    for (size_t i = 0; i < c->n_tensors; i++) all += c->tensors[i].bytes;
    for (size_t i = 0; i < c->n_tensors && !c->failed; i++) {
        CHECK(c, cudaMemcpy(c->wdev + c->tensors[i].off, c->tensors[i].host, c->tensors[i].bytes,
                            cudaMemcpyHostToDevice));
        sent += c->tensors[i].bytes;
        double now = muse_now_s();
        if (now - shown >= 1.0 || (shown > t0 && i + 1 == c->n_tensors)) {
            /* a large pack takes minutes: say how far, how fast and how long is left */
            double rate = (double)sent / (now - t0);
            fprintf(stderr,
                    "muse-engine: uploading weights to GPU %d: %.2f of %.2f GB, %.2f GB/s, %.0f s "
                    "left\n",
                    c->device, (double)sent / 1e9, (double)all / 1e9, rate / 1e9,
                    rate > 0 ? (double)(all - sent) / rate : 0.0);
            shown = now;
        }
    }
    return c->failed ? -1 : 0;
}

static void upload_vec(cuda_backend *c, const muse_vec *v, size_t *at)
{
    if (!v->v || v->id < 0 || c->failed) return;
    float *d = c->vec_block + *at;
    *at += (size_t)v->n;
    CHECK(c, cudaMemcpy(d, v->v, (size_t)v->n * sizeof(float), cudaMemcpyHostToDevice));
    c->vec[v->id] = d;
}

static int upload_vectors(cuda_backend *c)
{
    const muse_model *m = c->base.model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, E = (long)cfg->num_experts, L = (long)cfg->num_layers;
    size_t floats = (size_t)H * (size_t)(4 * L + 1), at = 0;
    for (long i = 0; i < L; i++)
        if (cfg->mlp_kind[i] == MUSE_MLP_MOE) floats += (size_t)E * (size_t)(H + 1);
    c->vec = MUSE_CALLOC((size_t)(m->n_vecs > 0 ? m->n_vecs : 1), sizeof *c->vec);
    c->router_bias = MUSE_CALLOC((size_t)L, sizeof *c->router_bias);
    c->expert_norm = MUSE_CALLOC((size_t)L, sizeof *c->expert_norm);
    c->vec_block = dalloc(c, floats * sizeof(float), &c->base.ranks[0].weights);
    for (long i = 0; i < L && !c->failed; i++) {
        const muse_layer *ly = &m->layers[i];
        upload_vec(c, &ly->input_norm, &at);
        upload_vec(c, &ly->post_attn_norm, &at);
        upload_vec(c, &ly->pre_ff_norm, &at);
        upload_vec(c, &ly->post_ff_norm, &at);
        if (cfg->mlp_kind[i] != MUSE_MLP_MOE) continue;
        if (ly->router_bias.v) {
            c->router_bias[i] = c->vec_block + at;
            at += (size_t)E;
            CHECK(c, cudaMemcpy(c->router_bias[i], ly->router_bias.v, (size_t)E * sizeof(float),
                                cudaMemcpyHostToDevice));
        }
        if (ly->expert_norm) {
            c->expert_norm[i] = c->vec_block + at;
            for (long x = 0; x < E && !c->failed; x++) {
                CHECK(c, cudaMemcpy(c->vec_block + at, ly->expert_norm[x].v,
                                    (size_t)H * sizeof(float), cudaMemcpyHostToDevice));
                if (ly->expert_norm[x].id >= 0) c->vec[ly->expert_norm[x].id] = c->vec_block + at;
                at += (size_t)H;
            }
        }
    }
    upload_vec(c, &m->final_norm, &at);
    MUSE_CHECK(at <= floats);
    return c->failed ? -1 : 0;
}

static void describe(void *ctx, const muse_linear *l)
{
    cuda_backend *c = ctx;
    muse_k_lin *d = &c->lin[l->id];
    memset(d, 0, sizeof *d);
    if (l->kind == MUSE_LIN_DENSE) {
        d->kind = MUSE_K_DENSE;
        d->dtype = kdtype(l->w->dtype);
        d->k = l->k;
        d->n = l->n;
        d->w = dev_ptr(c, l->w->data);
        d->row0 = l->row0;
        d->col0 = l->col0;
        d->ld = l->ld;
        return;
    }
    const muse_exl3_weight *w = &l->exl3;
    d->kind = MUSE_K_EXL3;
    d->path = muse_k_exl3_path_env(); /* MUSE_EXL3_PATH, read at start: checks force a path */
    d->bits = w->bits;
    d->k = w->k;
    d->n = w->n;
    d->trellis = dev_ptr(c, w->trellis);
    d->tiles_ld = w->tiles_ld ? w->tiles_ld : w->n / 16;
    d->suh = dev_ptr(c, w->suh);
    d->svh = dev_ptr(c, w->svh);
    d->su = dev_ptr(c, w->su);
    d->sv = dev_ptr(c, w->sv);
    d->bias = dev_ptr(c, w->bias);
    if (!c->cb_tables[w->cb]) {
        c->cb_tables[w->cb] = dalloc(c, 65536 * sizeof(float), &c->base.ranks[0].weights);
        if (c->cb_tables[w->cb])
            CHECK(c, cudaMemcpy(c->cb_tables[w->cb], muse_exl3_value_table(w->cb),
                                65536 * sizeof(float), cudaMemcpyHostToDevice));
    }
    d->table = c->cb_tables[w->cb];
}

typedef struct {
    size_t a, t; /* EXL3 workspace floats / doubles a row */
} exl3_need;

static void exl3_size(void *ctx, const muse_linear *l)
{
    exl3_need *n = ctx;
    if (l->kind != MUSE_LIN_EXL3) return;
    if ((size_t)l->exl3.k > n->a) n->a = (size_t)l->exl3.k;
    if ((size_t)l->exl3.n > n->t) n->t = (size_t)l->exl3.n;
}

static int upload_linears(cuda_backend *c)
{
    const muse_model *m = c->base.model;
    const muse_config *cfg = &m->cfg;
    long E = (long)cfg->num_experts, L = (long)cfg->num_layers;
    c->lin = MUSE_CALLOC((size_t)(m->n_linears > 0 ? m->n_linears : 1), sizeof *c->lin);
    muse_model_each_linear(m, describe, c);
    if (c->failed) return -1;
    c->lin_dev = dalloc(c, (size_t)m->n_linears * sizeof *c->lin, &c->base.ranks[0].weights);
    if (c->lin_dev)
        CHECK(c, cudaMemcpy(c->lin_dev, c->lin, (size_t)m->n_linears * sizeof *c->lin,
                            cudaMemcpyHostToDevice));
    if (E > 0) {
        size_t per = (size_t)(3 * E);
        muse_k_lin *h = MUSE_CALLOC(per * (size_t)L, sizeof *h);
        for (long i = 0; i < L; i++) {
            const muse_layer *ly = &m->layers[i];
            if (cfg->mlp_kind[i] != MUSE_MLP_MOE) continue;
            for (long x = 0; x < E; x++) {
                h[(size_t)i * per + (size_t)x] = c->lin[ly->experts[x].gate.id];
                h[(size_t)i * per + (size_t)(E + x)] = c->lin[ly->experts[x].up.id];
                h[(size_t)i * per + (size_t)(2 * E + x)] = c->lin[ly->experts[x].down.id];
            }
        }
        c->experts = dalloc(c, per * (size_t)L * sizeof *h, &c->base.ranks[0].weights);
        if (c->experts)
            CHECK(c,
                  cudaMemcpy(c->experts, h, per * (size_t)L * sizeof *h, cudaMemcpyHostToDevice));
        free(h);
    }
    return c->failed ? -1 : 0;
}

/* ---- operations ---- */

static muse_act cuda_alloc(muse_backend *be, long width)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(!c->in_round && width > 0);
    size_t bytes = (size_t)be->opts.max_rows * (size_t)width * sizeof(float);
    float *p = dalloc(c, bytes, &be->ranks[0].workspace);
    if (!p) return -1;
    CHECK(c, cudaMemset(p, 0, bytes));
    c->acts = realloc(c->acts, (size_t)(c->n_acts + 1) * sizeof *c->acts);
    c->act_width = realloc(c->act_width, (size_t)(c->n_acts + 1) * sizeof *c->act_width);
    MUSE_CHECK(c->acts && c->act_width);
    c->acts[c->n_acts] = p;
    c->act_width[c->n_acts] = width;
    return c->n_acts++;
}

static void cuda_write(muse_backend *be, muse_act a, const float *src, long rows)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(rows >= 0 && rows <= be->opts.max_rows);
    if (c->failed) return;
    CHECK(c, cudaMemcpy(act(c, a), src, (size_t)rows * (size_t)c->act_width[a] * sizeof(float),
                        cudaMemcpyHostToDevice));
}

static void cuda_read(muse_backend *be, muse_act a, float *dst, long rows)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(rows >= 0 && rows <= be->opts.max_rows);
    size_t bytes = (size_t)rows * (size_t)c->act_width[a] * sizeof(float);
    if (c->failed || CHECK(c, cudaMemcpy(dst, act(c, a), bytes, cudaMemcpyDeviceToHost)))
        for (size_t i = 0; i < bytes / sizeof(float); i++) dst[i] = NAN; /* never stale data */
}

/* The batch into staging as the CPU backend does it: padding rows carry token 0 at position 0
 * of no sequence, padding wanted rows repeat the last wanted row. */
static int cuda_begin_round(muse_backend *be, const muse_round *r, muse_err *e)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(!c->in_round);
    if (c->failed)
        return muse_fail(e, "device error on rank 0 (cuda): %s; the context cannot be used again",
                         c->err);
    int64_t t0 = muse_now_ns();
    long R = muse_backend_bucket(be, r->rows), n = 0;
    for (long i = 0; i < r->rows; i++) {
        c->h_tokens[i] = r->tokens[i];
        c->h_positions[i] = r->positions[i];
        c->h_seqs[i] = r->seqs[i];
        if (!r->want_logits || r->want_logits[i]) c->h_want[n++] = (int32_t)i;
    }
    for (long i = r->rows; i < R; i++) {
        c->h_tokens[i] = 0;
        c->h_positions[i] = 0;
        c->h_seqs[i] = -1;
    }
    c->real_rows = r->rows;
    c->rows = R;
    c->real_wanted = n;
    c->wanted = n ? muse_backend_bucket(be, n) : 0;
    for (long i = 0; i < c->wanted; i++) {
        if (i >= n) c->h_want[i] = c->h_want[n - 1];
        muse_k_sampling s = {0, 0, 0, 0, 0};
        if (r->sampling && i < n)
            s = (muse_k_sampling){r->sampling[i].temperature, r->sampling[i].top_k,
                                  r->sampling[i].top_p, r->sampling[i].min_p, r->sampling[i].seed};
        c->h_sampling[i] = s;
        c->h_draw_pos[i] = r->sampling && r->draw_pos && i < n ? r->draw_pos[i] : 0;
    }
    int64_t bps = be->kv.blocks_per_seq;
    for (long i = 0; i < r->rows; i++) {
        int seq = r->seqs[i];
        if (i && seq == r->seqs[i - 1]) continue;
        memcpy(c->h_tables + (int64_t)seq * bps, muse_kv_table(&be->kv, seq),
               (size_t)bps * sizeof *c->h_tables);
    }
    size_t tables = (size_t)be->opts.max_seqs * (size_t)bps;
    cudaStream_t st = c->st;
    CHECK(c, cudaMemcpyAsync(c->d_tokens, c->h_tokens, (size_t)R * 4, cudaMemcpyHostToDevice, st));
    CHECK(c, cudaMemcpyAsync(c->d_positions, c->h_positions, (size_t)R * 8, cudaMemcpyHostToDevice,
                             st));
    CHECK(c, cudaMemcpyAsync(c->d_seqs, c->h_seqs, (size_t)R * 4, cudaMemcpyHostToDevice, st));
    if (c->wanted) {
        size_t w = (size_t)c->wanted;
        CHECK(c, cudaMemcpyAsync(c->d_want, c->h_want, w * 4, cudaMemcpyHostToDevice, st));
        CHECK(c, cudaMemcpyAsync(c->d_sampling, c->h_sampling, w * sizeof *c->h_sampling,
                                 cudaMemcpyHostToDevice, st));
        CHECK(c, cudaMemcpyAsync(c->d_draw_pos, c->h_draw_pos, w * 8, cudaMemcpyHostToDevice, st));
    }
    CHECK(c, cudaMemcpyAsync(c->d_tables, c->h_tables, tables * 4, cudaMemcpyHostToDevice, st));
    c->do_sample = r->sampling != NULL;
    c->return_logits = r->return_logits;
    c->logits = -1;
    c->in_round = 1;
    if (c->graphs && !c->failed &&
        !CHECK(c, cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal)))
        c->capturing = 1;
    prof_host(c, PROF_BEGIN, t0);
    if (c->failed)
        return muse_fail(e, "device error on rank 0 (cuda): %s; the context cannot be used again",
                         c->err);
    return 0;
}

/* Ends the round's capture and launches it through the bucket's executable graph: updated in
 * place from the new capture (same topology: only parameters changed), else made again. */
static void replay(cuda_backend *c)
{
    cudaGraph_t g = NULL;
    c->capturing = 0;
    if (CHECK(c, cudaStreamEndCapture(c->st, &g)) || c->failed) {
        if (g) cudaGraphDestroy(g);
        return;
    }
    int slot = MUSE_MAX_BUCKETS;
    for (int i = 0; i < c->base.n_buckets; i++)
        if (c->base.buckets[i] == c->rows) slot = i;
    cudaGraphExec_t *x = &c->execs[slot];
    if (*x) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(*x, g, &info) != cudaSuccess) {
            (void)cudaGetLastError(); /* not sticky: a different topology, made again below */
            cudaGraphExecDestroy(*x);
            *x = NULL;
        }
    }
    if (!*x) CHECK(c, cudaGraphInstantiate(x, g, 0));
    if (*x) CHECK(c, cudaGraphLaunch(*x, c->st));
    cudaGraphDestroy(g);
}

static int cuda_end_round(muse_backend *be, muse_round_out *out, muse_err *e)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(c->in_round);
    c->in_round = 0;
    memset(out, 0, sizeof *out);
    int64_t t0 = muse_now_ns();
    if (c->capturing) replay(c);
    if (be->fault_pending) { /* test hooks: a real illegal address, caught by the sync below */
        be->fault_pending = 0;
        CHECK(c, muse_k_fault_illegal_address(c->st));
    }
    CHECK(c, cudaStreamSynchronize(c->st));
    long V = (long)be->model->cfg.vocab_size;
    if (!c->failed && c->do_sample && c->real_wanted)
        CHECK(c, cudaMemcpy(c->h_drawn, c->d_drawn, (size_t)c->real_wanted * 4,
                            cudaMemcpyDeviceToHost));
    if (!c->failed && c->return_logits && c->logits >= 0 && c->real_wanted)
        CHECK(c, cudaMemcpy(c->h_logits, act(c, c->logits),
                            (size_t)c->real_wanted * (size_t)V * sizeof(float),
                            cudaMemcpyDeviceToHost));
    if (c->failed)
        return muse_fail(e, "device error on rank 0 (cuda): %s; the context cannot be used again",
                         c->err);
    prof_host(c, PROF_END, t0);
    out->wanted = c->real_wanted;
    out->tokens = c->do_sample ? c->h_drawn : NULL;
    out->logits = c->return_logits && c->logits >= 0 ? c->h_logits : NULL;
    return 0;
}

static void cuda_embed(muse_backend *be, muse_act out)
{
    cuda_backend *c = cu(be);
    const muse_model *m = be->model;
    if (c->failed) return;
    prof_begin(c);
    CHECK(c, muse_k_embed(dev_ptr(c, m->embed->data), kdtype(m->embed->dtype), c->d_tokens, c->rows,
                          (long)m->cfg.hidden_size, m->cfg.rms_norm_eps, act(c, out), c->st));
    prof_end(c, PROF_EMBED);
}

static const float *vec(cuda_backend *c, const muse_vec *w)
{
    if (!w || !w->v) return NULL;
    MUSE_CHECK(w->id >= 0 && w->id < c->base.model->n_vecs && c->vec[w->id]);
    return c->vec[w->id];
}

static void cuda_norm(muse_backend *be, muse_act x, long width, const muse_vec *w,
                      muse_norm_weight mode, float eps, int round16, muse_act out)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    int kmode = mode == MUSE_NORM_PLUS1   ? MUSE_K_NORM_PLUS1
                : mode == MUSE_NORM_PLAIN ? MUSE_K_NORM_PLAIN
                                          : MUSE_K_NORM_NONE;
    CHECK(c, muse_k_norm(act(c, x), c->rows, width, mode == MUSE_NORM_NONE ? NULL : vec(c, w), 0,
                         NULL, kmode, (double)eps, round16, act(c, out), c->st));
    prof_end(c, PROF_NORM);
}

static void cuda_add_norm(muse_backend *be, muse_act h, muse_act y, long width, const muse_vec *w,
                          float eps)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    CHECK(c, muse_k_add_norm(act(c, h), act(c, y), c->rows, width, vec(c, w), (double)eps, c->st));
    prof_end(c, PROF_ADD_NORM);
}

/* y = x W over rows rows (x rows of k floats, y rows of n) with linear l's descriptor. */
static void run_linear(cuda_backend *c, const muse_linear *l, const float *x, long rows,
                       int round16, float *y)
{
    const muse_k_lin *d = &c->lin[l->id];
    CHECK(c, muse_k_linear(c->lin_dev + l->id, d, NULL, NULL, x, (long)d->k, rows, round16, y,
                           (long)d->n, c->ws_a, c->ws_t, c->st));
}

static void cuda_linear(muse_backend *be, const muse_linear *l, muse_act x, int round16, muse_act y)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    run_linear(c, l, act(c, x), c->rows, round16, act(c, y));
    prof_end(c, c->lin[l->id].kind == MUSE_K_EXL3 ? PROF_EXL3 : PROF_DENSE);
}

static void cuda_qk_norm_rope(muse_backend *be, muse_act x, long heads, long head_dim, double theta,
                              float eps)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    CHECK(c, muse_k_qk_norm_rope(act(c, x), c->rows, heads, head_dim, c->d_positions, theta,
                                 (double)eps, c->st));
    prof_end(c, PROF_QK);
}

static muse_k_kv layer_kv(cuda_backend *c, int layer)
{
    muse_k_kv kv = {c->k_cache[layer], c->v_cache[layer],         c->kv_cap[layer],
                    c->d_tables,       c->base.kv.blocks_per_seq, c->kv_width};
    return kv;
}

static void cuda_attention(muse_backend *be, int layer, muse_act q, muse_act k, muse_act v,
                           muse_act g, muse_act o)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    const muse_config *cfg = &be->model->cfg;
    long hd = (long)cfg->head_dim, Hq = (long)cfg->n_heads, Hkv = (long)cfg->n_kv_heads;
    muse_k_kv kv = layer_kv(c, layer);
    CHECK(c, muse_k_kv_write(kv, act(c, k), act(c, v), c->rows, c->d_seqs, c->d_positions, c->st));
    long window = cfg->attn_kind[layer] == MUSE_ATTN_SLIDING ? (long)cfg->sliding_window : 0;
    double scale = cfg->qk_scale_factor / sqrt((double)hd);
    CHECK(c, muse_k_attention(kv, act(c, q), act(c, g), act(c, o), c->rows, Hq, hd, Hq / Hkv,
                              window, scale, c->d_seqs, c->d_positions, c->st));
    prof_end(c, PROF_ATTENTION);
}

static void cuda_swiglu(muse_backend *be, muse_act gate, muse_act up, long width, muse_act out)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    CHECK(c, muse_k_swiglu(act(c, gate), act(c, up), c->rows * width, act(c, out), c->st));
    prof_end(c, PROF_SWIGLU);
}

/* gate, up, swiglu, down of one MLP over rows (row r of x at x_stride), per-row descriptors
 * (experts) or one linear's. */
static void run_mlp(cuda_backend *c, const muse_k_lin *descs[3], const muse_k_lin *shape[3],
                    const int32_t *row_desc, const int32_t *row_src, const float *x, long x_stride,
                    long rows, float *out)
{
    long I = (long)shape[0]->n, H = (long)shape[2]->n;
    CHECK(c, muse_k_linear(descs[0], shape[0], row_desc, row_src, x, x_stride, rows, 1, c->eg, I,
                           c->ws_a, c->ws_t, c->st));
    CHECK(c, muse_k_linear(descs[1], shape[1], row_desc, row_src, x, x_stride, rows, 1, c->eu, I,
                           c->ws_a, c->ws_t, c->st));
    CHECK(c, muse_k_swiglu(c->eg, c->eu, rows * I, c->ea, c->st));
    CHECK(c, muse_k_linear(descs[2], shape[2], row_desc, NULL, c->ea, I, rows, 0, out, H, c->ws_a,
                           c->ws_t, c->st));
}

/* Router and selection per row, then every (row, slot) pair through its expert, the expert
 * output norm, the weighted sum in ascending expert index, then the shared experts. */
static void cuda_moe(muse_backend *be, const muse_layer *ly, muse_act b_a, muse_act y_a)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, E = (long)cfg->num_experts, K = (long)cfg->num_experts_per_tok;
    long i = (long)(ly - m->layers), R = c->rows;
    const float *b = act(c, b_a);
    CHECK(c, muse_k_router(b, R, H, dev_ptr(c, ly->router->data), kdtype(ly->router->dtype), E,
                           c->router_logits, c->st));
    CHECK(c, muse_k_select(c->router_logits, R, E, K, c->router_bias[i], cfg->norm_topk_prob,
                           (float)cfg->routed_scaling_factor, c->sel, c->sel_w, c->st));
    const muse_k_lin *ex = c->experts + (size_t)i * (size_t)(3 * E);
    const muse_k_lin *descs[3] = {ex, ex + E, ex + 2 * E};
    const muse_k_lin *shape[3] = {&c->lin[ly->experts[0].gate.id], &c->lin[ly->experts[0].up.id],
                                  &c->lin[ly->experts[0].down.id]};
    run_mlp(c, descs, shape, c->sel, c->pair_src, b, H, R * K, c->zg);
    if (cfg->expert_output_norm)
        CHECK(c, muse_k_norm(c->zg, R * K, H, c->expert_norm[i], H, c->sel, MUSE_K_NORM_PLUS1,
                             (double)(float)cfg->rms_norm_eps, 0, c->zg, c->st));
    const float *shared = NULL;
    if (cfg->num_shared_experts > 0) {
        const muse_mlp *s = &ly->shared;
        const muse_k_lin *sd[3] = {c->lin_dev + s->gate.id, c->lin_dev + s->up.id,
                                   c->lin_dev + s->down.id};
        const muse_k_lin *ss[3] = {&c->lin[s->gate.id], &c->lin[s->up.id], &c->lin[s->down.id]};
        run_mlp(c, sd, ss, NULL, NULL, b, H, R, c->zs);
        shared = c->zs;
    }
    CHECK(c, muse_k_moe_combine(c->sel, c->sel_w, c->zg, shared, R, K, H, act(c, y_a), c->st));
    prof_end(c, PROF_MOE);
}

static void cuda_all_reduce(muse_backend *be, muse_act x, long width)
{
    (void)be, (void)x, (void)width; /* one rank holds the whole sum */
}

static void cuda_head(muse_backend *be, muse_act x, muse_act logits)
{
    cuda_backend *c = cu(be);
    c->logits = logits;
    if (c->failed || !c->wanted) return;
    prof_begin(c);
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, V = (long)cfg->vocab_size, N = (long)m->head.n;
    CHECK(c, muse_k_gather_rows(act(c, x), c->d_want, c->wanted, H, c->xsel, c->st));
    run_linear(c, &m->head, c->xsel, c->wanted, 0, c->raw);
    CHECK(c, muse_k_head_finish(c->raw, c->wanted, N, V, cfg->output_multiplier,
                                cfg->final_logit_softcapping, act(c, logits), c->st));
    prof_end(c, PROF_HEAD);
}

static void cuda_sample(muse_backend *be, muse_act logits)
{
    cuda_backend *c = cu(be);
    c->logits = logits;
    if (c->failed || !c->wanted) return;
    prof_begin(c);
    CHECK(c,
          muse_k_sample(act(c, logits), c->wanted, (long)be->model->cfg.vocab_size, c->d_sampling,
                        c->d_draw_pos, c->weight_bits, c->weights, c->d_drawn, c->st));
    prof_end(c, PROF_SAMPLE);
}

/* K then V of each sliding layer, positions ascending, between the rings and a slot. */
static void sliding_copy(cuda_backend *c, int seq, int64_t end_pos, int slot, int save)
{
    MUSE_CHECK(!c->in_round && slot >= 0 && slot < c->base.opts.snapshot_slots);
    if (c->failed) return;
    const muse_config *cfg = &c->base.model->cfg;
    uint16_t *buf = c->snapshots + (size_t)slot * (c->base.snapshot_bytes / sizeof *buf);
    long KV = c->kv_width;
    int64_t first = end_pos > cfg->sliding_window ? end_pos - cfg->sliding_window : 0;
    size_t row = (size_t)KV * sizeof *buf;
    for (int i = 0; i < (int)cfg->num_layers; i++) {
        if (cfg->attn_kind[i] != MUSE_ATTN_SLIDING) continue;
        int64_t cap = c->kv_cap[i];
        for (int kv = 0; kv < 2; kv++) {
            uint16_t *cache = kv ? c->v_cache[i] : c->k_cache[i];
            for (int64_t s = first; s < end_pos; s++, buf += KV) {
                uint16_t *at = cache + ((size_t)seq * (size_t)cap + (size_t)(s % cap)) * (size_t)KV;
                CHECK(c, cudaMemcpyAsync(save ? buf : at, save ? at : buf, row,
                                         cudaMemcpyDeviceToDevice, c->st));
            }
        }
    }
    CHECK(c, cudaStreamSynchronize(c->st));
}

static void cuda_snapshot_save(muse_backend *be, int seq, int64_t end_pos, int slot)
{
    sliding_copy(cu(be), seq, end_pos, slot, 1);
}

static void cuda_snapshot_load(muse_backend *be, int seq, int64_t end_pos, int slot)
{
    sliding_copy(cu(be), seq, end_pos, slot, 0);
}

static void cuda_destroy(muse_backend *be);

static const muse_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .write = cuda_write,
    .read = cuda_read,
    .begin_round = cuda_begin_round,
    .end_round = cuda_end_round,
    .embed = cuda_embed,
    .norm = cuda_norm,
    .add_norm = cuda_add_norm,
    .linear = cuda_linear,
    .qk_norm_rope = cuda_qk_norm_rope,
    .attention = cuda_attention,
    .swiglu = cuda_swiglu,
    .moe = cuda_moe,
    .all_reduce = cuda_all_reduce,
    .head = cuda_head,
    .sample = cuda_sample,
    .snapshot_save = cuda_snapshot_save,
    .snapshot_load = cuda_snapshot_load,
};

static void *halloc(cuda_backend *c, size_t bytes, uint64_t *account)
{
    void *p = NULL;
    if (c->failed) return NULL;
    if (CHECK(c, cudaMallocHost(&p, bytes ? bytes : 1))) return NULL;
    if (account) *account += bytes;
    return p;
}

/* Staging, workspaces, KV and snapshots, all sized from the options. */
static int allocate(cuda_backend *c)
{
    muse_backend *be = &c->base;
    const muse_backend_opts *o = &be->opts;
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    muse_rank_mem *mem = &be->ranks[0];
    size_t R = (size_t)o->max_rows, H = (size_t)cfg->hidden_size, E = (size_t)cfg->num_experts;
    size_t K = (size_t)cfg->num_experts_per_tok, V = (size_t)cfg->vocab_size;
    size_t N = (size_t)m->head.n, L = (size_t)cfg->num_layers;
    size_t P = R * (K > 0 ? K : 1); /* (row, slot) pairs */
    size_t rows_cap = P > R ? P : R;
    size_t I = (size_t)cfg->moe_intermediate_size;
    size_t Ish = (size_t)(cfg->num_shared_experts * cfg->moe_intermediate_size);
    size_t mlp = P * I > R * Ish ? P * I : R * Ish;
    exl3_need need = {0, 0};
    muse_model_each_linear(m, exl3_size, &need);
    c->ws_a = dalloc(c, rows_cap * need.a * sizeof(float), &mem->workspace);
    c->ws_t = dalloc(c, rows_cap * need.t * sizeof(double), &mem->workspace);
    c->router_logits = dalloc(c, R * E * sizeof(float), &mem->workspace);
    c->sel = dalloc(c, P * sizeof(int32_t), &mem->workspace);
    c->sel_w = dalloc(c, P * sizeof(float), &mem->workspace);
    c->pair_src = dalloc(c, P * sizeof(int32_t), &mem->workspace);
    c->eg = dalloc(c, mlp * sizeof(float), &mem->workspace);
    c->eu = dalloc(c, mlp * sizeof(float), &mem->workspace);
    c->ea = dalloc(c, mlp * sizeof(float), &mem->workspace);
    c->zg = dalloc(c, P * H * sizeof(float), &mem->workspace);
    c->zs = dalloc(c, R * H * sizeof(float), &mem->workspace);
    c->xsel = dalloc(c, R * H * sizeof(float), &mem->workspace);
    c->raw = dalloc(c, R * N * sizeof(float), &mem->workspace);
    c->weights = dalloc(c, R * V * sizeof(float), &mem->workspace);
    if (c->pair_src && K > 0) {
        int32_t *src = MUSE_MALLOC(P * sizeof *src);
        for (size_t p = 0; p < P; p++) src[p] = (int32_t)(p / K);
        CHECK(c, cudaMemcpy(c->pair_src, src, P * sizeof *src, cudaMemcpyHostToDevice));
        free(src);
    }
    size_t tables = (size_t)o->max_seqs * (size_t)be->kv.blocks_per_seq;
    c->d_tokens = dalloc(c, R * 4, &mem->staging);
    c->d_seqs = dalloc(c, R * 4, &mem->staging);
    c->d_want = dalloc(c, R * 4, &mem->staging);
    c->d_drawn = dalloc(c, R * 4, &mem->staging);
    c->d_positions = dalloc(c, R * 8, &mem->staging);
    c->d_draw_pos = dalloc(c, R * 8, &mem->staging);
    c->d_sampling = dalloc(c, R * sizeof *c->d_sampling, &mem->staging);
    c->d_tables = dalloc(c, tables * 4, &mem->staging);
    c->h_tokens = halloc(c, R * 4, NULL);
    c->h_seqs = halloc(c, R * 4, NULL);
    c->h_want = halloc(c, R * 4, NULL);
    c->h_drawn = halloc(c, R * 4, NULL);
    c->h_positions = halloc(c, R * 8, NULL);
    c->h_draw_pos = halloc(c, R * 8, NULL);
    c->h_sampling = halloc(c, R * sizeof *c->h_sampling, NULL);
    c->h_tables = halloc(c, tables * 4, NULL);
    c->h_logits = halloc(c, R * V * sizeof(float), NULL);
    if (c->failed) return -1;
    for (size_t i = 0; i < tables; i++) c->h_tables[i] = -1;
    CHECK(c, cudaMemcpy(c->d_tables, c->h_tables, tables * 4, cudaMemcpyHostToDevice));
    /* KV: sliding layers a ring per sequence, full layers the paged pool's blocks */
    c->kv_width = (long)(cfg->n_kv_heads * cfg->head_dim);
    c->kv_cap = MUSE_CALLOC(L, sizeof *c->kv_cap);
    c->k_cache = MUSE_CALLOC(L, sizeof *c->k_cache);
    c->v_cache = MUSE_CALLOC(L, sizeof *c->v_cache);
    for (size_t i = 0; i < L && !c->failed; i++) {
        if (cfg->attn_kind[i] == MUSE_ATTN_SLIDING) {
            int64_t cap = o->context;
            if (cfg->sliding_window + o->max_rows - 1 < cap)
                cap = cfg->sliding_window + o->max_rows - 1;
            c->kv_cap[i] = cap;
        }
        size_t rows = c->kv_cap[i] ? (size_t)o->max_seqs * (size_t)c->kv_cap[i]
                                   : (size_t)be->kv.n_blocks * MUSE_KV_BLOCK;
        size_t bytes = rows * (size_t)c->kv_width * sizeof(uint16_t);
        uint64_t *acct = c->kv_cap[i] ? &mem->sliding : &mem->kv;
        c->k_cache[i] = dalloc(c, bytes, acct);
        c->v_cache[i] = dalloc(c, bytes, acct);
        if (c->v_cache[i]) {
            CHECK(c, cudaMemset(c->k_cache[i], 0, bytes));
            CHECK(c, cudaMemset(c->v_cache[i], 0, bytes));
        }
    }
    size_t snap = (size_t)o->snapshot_slots * be->snapshot_bytes;
    c->snapshots = dalloc(c, snap, &mem->snapshots);
    return c->failed ? -1 : 0;
}

/* The kernels are SASS only (no PTX to JIT): a device runs them only when its compute
 * capability is one of the archs built (MUSE_CUDA_ARCHS, "sm_90a sm_90"). */
static int arch_check(int dev, muse_err *e)
{
    struct cudaDeviceProp p;
    cudaError_t rc = cudaGetDeviceProperties(&p, dev);
    if (rc != cudaSuccess)
        return muse_fail(e, "--backend cuda: device %d: %s; use --backend cpu", dev,
                         cudaGetErrorString(rc));
    int cc = p.major * 10 + p.minor;
    for (const char *a = MUSE_CUDA_ARCHS; (a = strstr(a, "sm_")) != NULL; a += 3)
        if (atoi(a + 3) == cc) return 0;
    return muse_fail(e,
                     "--backend cuda: device %d (%s) is sm_%d; this binary has kernels for %s "
                     "only; rebuild with CUDA_ARCHS naming %d, or use --backend cpu",
                     dev, p.name, cc, MUSE_CUDA_ARCHS, cc);
}

muse_backend *muse_cuda_backend_create(const muse_model *m, const muse_backend_opts *o, muse_err *e)
{
    const muse_config *cfg = &m->cfg;
    if (o->ranks > 1)
        return muse_fail(e,
                         "--backend cuda: --ranks %d is not supported yet (one GPU a process); "
                         "use --ranks 1, or --backend cpu for tensor parallelism",
                         o->ranks),
               NULL;
    if (cfg->head_dim > 512 || cfg->head_dim % 2)
        return muse_fail(e, "config.json: head_dim %lld exceeds the CUDA backend's limit of 512",
                         (long long)cfg->head_dim),
               NULL;
    if (cfg->num_experts > 4096)
        return muse_fail(e, "config.json: num_experts %lld exceeds the CUDA backend's limit 4096",
                         (long long)cfg->num_experts),
               NULL;
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0)
        return muse_fail(e, "--backend cuda: no usable CUDA device (%s); use --backend cpu",
                         rc != cudaSuccess ? cudaGetErrorString(rc) : "none found"),
               NULL;
    int dev = o->devices[0];
    if (dev < 0 || dev >= count)
        return muse_fail(e, "--backend cuda: device %d does not exist (%d found); use 0 .. %d", dev,
                         count, count - 1),
               NULL;
    if (arch_check(dev, e)) return NULL;
    cuda_backend *c = MUSE_CALLOC(1, sizeof *c);
    c->base.ops = &cuda_ops;
    if (muse_backend_init_common(&c->base, m, o, e)) {
        free(c);
        return NULL;
    }
    c->device = dev;
    const char *graphs = getenv("MUSE_CUDA_GRAPHS"); /* 0: launch each kernel eagerly */
    c->graphs = !(graphs && !strcmp(graphs, "0"));
    const char *prof = getenv("MUSE_CUDA_PROFILE");
    c->prof = prof && !strcmp(prof, "1");
    if (c->prof) c->graphs = 0; /* each op synchronized on its own */
    int id_bits = 0;
    while (((int64_t)1 << id_bits) < cfg->vocab_size) id_bits++;
    c->weight_bits = 62 - id_bits;
    if (!CHECK(c, cudaSetDevice(dev)))
        CHECK(c, cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    if (c->prof && !CHECK(c, cudaEventCreate(&c->ev0))) CHECK(c, cudaEventCreate(&c->ev1));
    if (c->failed || upload_weights(c) || upload_vectors(c) || upload_linears(c) || allocate(c)) {
        muse_fail(e, "--backend cuda: start-up on device %d failed: %s; use --backend cpu", dev,
                  c->err);
        cuda_destroy(&c->base);
        return NULL;
    }
    return &c->base;
}

static void cuda_destroy(muse_backend *be)
{
    cuda_backend *c = cu(be);
    if (c->prof) {
        fprintf(stderr, "cuda profile (ms total, calls, us a call):\n");
        for (int i = 0; i < PROF_OPS; i++)
            if (c->prof_n[i])
                fprintf(stderr, "  %-20s %10.3f %8ld %10.1f\n", prof_names[i], c->prof_ms[i],
                        c->prof_n[i], 1000.0 * c->prof_ms[i] / (double)c->prof_n[i]);
        cudaEventDestroy(c->ev0);
        cudaEventDestroy(c->ev1);
    }
    void *dev[] = {c->wdev,
                   c->vec_block,
                   c->lin_dev,
                   c->experts,
                   c->ws_a,
                   c->ws_t,
                   c->router_logits,
                   c->sel_w,
                   c->eg,
                   c->eu,
                   c->ea,
                   c->zg,
                   c->zs,
                   c->xsel,
                   c->raw,
                   c->weights,
                   c->sel,
                   c->pair_src,
                   c->d_tokens,
                   c->d_seqs,
                   c->d_want,
                   c->d_tables,
                   c->d_drawn,
                   c->d_positions,
                   c->d_draw_pos,
                   c->d_sampling,
                   c->snapshots,
                   c->cb_tables[0],
                   c->cb_tables[1],
                   c->cb_tables[2]};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    void *host[] = {c->h_tokens,    c->h_seqs,     c->h_want,     c->h_tables, c->h_drawn,
                    c->h_positions, c->h_draw_pos, c->h_sampling, c->h_logits};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) cudaFreeHost(host[i]);
    for (int i = 0; i < c->n_acts; i++) cudaFree(c->acts[i]);
    if (c->k_cache)
        for (int64_t i = 0; i < be->model->cfg.num_layers; i++) {
            cudaFree(c->k_cache[i]);
            cudaFree(c->v_cache[i]);
        }
    for (int i = 0; i <= MUSE_MAX_BUCKETS; i++)
        if (c->execs[i]) cudaGraphExecDestroy(c->execs[i]);
    if (c->st) cudaStreamDestroy(c->st);
    free(c->acts);
    free(c->act_width);
    free(c->k_cache);
    free(c->v_cache);
    free(c->kv_cap);
    free(c->tensors);
    free(c->vec);
    free(c->router_bias);
    free(c->expert_norm);
    free(c->lin);
    muse_kv_pool_destroy(&be->kv);
    free(c);
}
