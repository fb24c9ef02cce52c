/* The CUDA backend: every operation of backend.h on one GPU or several ranks, each a kernel of
 * kernels/ that equals the CPU reference (cpu_backend.c) bit for bit where it can (the same
 * fixed-order double sums, no contraction) and within the harness's relative bounds
 * everywhere. Everything is allocated and uploaded at start (weights once a GPU, sized from
 * the options); a round copies its batch into pinned staging, launches kernels on each rank's
 * stream and allocates nothing; the first failing CUDA call is kept with its rank and
 * file:line and end_round reports it (sticky: the context is not used again). Each round is
 * captured as a CUDA graph and replayed through one executable graph a row bucket
 * (MUSE_CUDA_GRAPHS=0: eager launches; the bits are the same).
 * With --ranks N / --gpus LIST each rank holds its shard's descriptors (model/shard.h, the CPU
 * backend's rules), its activations, workspaces, KV heads and snapshot slots, and runs every
 * operation on its own stream. A GPU holding one rank of several uploads only what that rank
 * reads: the tensors it reads whole and its shard of each split linear, packed compactly
 * (muse_shard_pack); ranks sharing a GPU read one whole upload of the pack. Sums across ranks
 * go in rank order through kernels/all_reduce.cu, reading every rank's partial (one GPU, or
 * peers over NVLink), or after an NCCL all-gather where GPUs lack peer access. */
#include <math.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/nccl_dl.h"
#include "base/clock.h"
#include "model/shard.h"
#include "kernels/all_reduce.cuh"
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

_Static_assert(MUSE_K_MAX_PARTS == MUSE_MAX_RANKS, "the all-reduce kernel takes every rank");

/* NCCL's all-gather instead of peer reads from this size up, where NCCL is loaded */
#define NCCL_MIN_BYTES (1 << 20)

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
    PROF_ALL_REDUCE,
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
                                                 "all_reduce",
                                                 "head",
                                                 "sample"};

/* One uploaded tensor: its host bytes and where they are in a GPU's copy of the pack. */
typedef struct {
    const uint8_t *host;
    size_t bytes, off;
} dev_tensor;

/* The upload's progress line: bytes really sent to one GPU, of all it will get. */
typedef struct {
    double t0, shown;
    size_t sent, all;
    int device;
} upload_meter;

#define NOT_UP SIZE_MAX /* a tensor not on the rank's GPU, or a linear not packed for it */

/* One rank: its GPU and stream, its shard, its buffers. */
typedef struct {
    int device;
    int owner; /* the rank whose upload it reads: the first rank on its GPU (itself if alone) */
    cudaStream_t st;
    cudaEvent_t ev_ready, ev_done, ev_join; /* the all-reduce's two barriers; graph fork/join */
    muse_rank_heads heads;
    long kv_width; /* (kv1 - kv0) * head_dim: what its cache holds a position */
    /* the replicated weights of its GPU (the owner's allocations) */
    uint8_t *wdev; /* the pack's tensors (alone: those it reads), found by host address */
    /* alone on its GPU among several ranks: wdev holds tensor i at toff[i] (NOT_UP: not there)
     * and linear id packed at pack_at + pack_off[id] (NOT_UP: read through toff); both NULL
     * where wdev is the whole pack at the shared offsets (one rank, or ranks sharing a GPU) */
    size_t *toff, *pack_off, pack_at;
    upload_meter up;
    float **vec;         /* [n_vecs] device copies of the fp32 weight vectors */
    float *vec_block;    /* their storage */
    float **router_bias; /* [layers] or NULL entries */
    float **expert_norm; /* [layers] [E, H] */
    float *cb_tables[3]; /* the codebooks' 65536 values */
    /* its shard: views of the linears (shard.h) and their device descriptors */
    muse_linear *views;  /* [n_linears] */
    muse_k_lin *lin;     /* [n_linears] host copies of the descriptors */
    muse_k_lin *lin_dev; /* [n_linears] on the device */
    muse_k_lin *experts; /* [layers][3][E] on the device: gate, up, down */
    /* round staging on its GPU */
    int32_t *d_tokens, *d_seqs, *d_want, *d_tables, *d_drawn;
    int64_t *d_positions, *d_draw_pos;
    muse_k_sampling *d_sampling;
    /* KV: per layer, fp16, its KV heads */
    uint16_t **k_cache, **v_cache;
    uint16_t *snapshots;
    /* workspaces */
    float *ws_a;
    double *ws_t;
    float *router_logits, *sel_w, *eg, *eu, *ea, *zg, *zs, *xsel, *raw, *weights;
    int32_t *sel, *pair_src;
    float *red;    /* [red_floats] a rank-order sum before it is copied back (ranks > 1) */
    float *gather; /* [ranks][red_floats] NCCL's all-gather of the partials (NCCL only) */
    ncclComm_t comm;
} cuda_rank;

typedef struct {
    muse_backend base;
    int n_ranks;
    cuda_rank rank[MUSE_MAX_RANKS];
    int multi_dev;         /* ranks on more than one GPU: cudaSetDevice before each rank's work */
    int peers;             /* every pair of distinct GPUs reads the other's memory (peer access) */
    const muse_nccl *nccl; /* loaded where ranks sit on distinct GPUs (NULL: peer reads only) */
    int nccl_always;       /* MUSE_CUDA_REDUCE=nccl: every sum through NCCL, not only large ones */
    size_t red_floats;
    int failed, failed_rank, at; /* at: the rank being driven, for the error's text */
    char err[400];
    /* the host side of the pack's upload: shared by every GPU's copy (same offsets) */
    dev_tensor *tensors;
    size_t n_tensors, pack_bytes;
    /* activations: a buffer a rank, and the columns each rank's holds now (its shard) */
    float *(*acts)[MUSE_MAX_RANKS];
    long *act_width;
    long (*act_cols)[MUSE_MAX_RANKS];
    int n_acts;
    /* round staging: host (pinned), copied to every rank's GPU */
    long rows, real_rows, wanted, real_wanted;
    int32_t *h_tokens, *h_seqs, *h_want, *h_tables, *h_drawn;
    int64_t *h_positions, *h_draw_pos;
    muse_k_sampling *h_sampling;
    float *h_logits;
    int do_sample, return_logits, in_round;
    muse_act logits;
    int64_t *kv_cap; /* per layer: ring positions of a sliding layer, 0 for a full one */
    /* CUDA graphs: each round is captured (every rank's stream, forked from and joined into
     * rank 0's) and replayed through one executable graph a row bucket (updated in place when
     * the next capture of the bucket differs). Ranks on several GPUs launch eagerly: one graph
     * spanning devices is not relied on. */
    int graphs, capturing;
    cudaGraphExec_t execs[MUSE_MAX_BUCKETS + 1];
    /* MUSE_CUDA_PROFILE=1: each op timed with events on rank 0's stream (eager, synchronized),
     * printed at exit */
    int prof;
    cudaEvent_t ev0, ev1;
    double prof_ms[PROF_OPS];
    long prof_n[PROF_OPS];
    int weight_bits;
} cuda_backend;

static cuda_backend *cu(muse_backend *be)
{
    return (cuda_backend *)be;
}

/* Keeps the first failure with its rank and where it happened; returns -1 on failure. */
static int cuda_ok(cuda_backend *c, int rc, const char *what, const char *file, int line)
{
    if (rc == 0) return 0;
    if (!c->failed) {
        snprintf(c->err, sizeof c->err, "%s:%d: %s: %s", file, line, what,
                 cudaGetErrorString((cudaError_t)rc));
        c->failed_rank = c->at;
    }
    c->failed = 1;
    return -1;
}
#define CHECK(c, call) cuda_ok((c), (int)(call), #call, __FILE__, __LINE__)

/* The sticky failure as end_round and begin_round report it. */
static int device_error(cuda_backend *c, muse_err *e)
{
    return muse_fail(e,
                     "device error on rank %d (cuda, GPU %d): %s; the context cannot be used "
                     "again",
                     c->failed_rank, c->rank[c->failed_rank].device, c->err);
}

/* Makes rank r's GPU current (not inside a capture: graphs are one GPU's, set at begin). */
static cuda_rank *on(cuda_backend *c, int r)
{
    c->at = r;
    if (!c->capturing || c->multi_dev) CHECK(c, cudaSetDevice(c->rank[r].device));
    return &c->rank[r];
}

static void prof_begin(cuda_backend *c)
{
    if (c->prof && !c->failed) CHECK(c, cudaEventRecord(c->ev0, c->rank[0].st));
}

/* Rank 0's stream waits for every rank's (eager): an op's time is its slowest rank's. */
static void prof_end(cuda_backend *c, int op)
{
    float ms = 0;
    if (!c->prof || c->failed) return;
    for (int r = 1; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        if (CHECK(c, cudaEventRecord(rk->ev_join, rk->st)) ||
            CHECK(c, cudaStreamWaitEvent(c->rank[0].st, rk->ev_join, 0)))
            return;
    }
    on(c, 0);
    if (CHECK(c, cudaEventRecord(c->ev1, c->rank[0].st)) ||
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

/* On the current GPU (the caller made rank's current). */
static void *dalloc(cuda_backend *c, size_t bytes, uint64_t *account)
{
    void *p = NULL;
    if (c->failed) return NULL;
    if (CHECK(c, cudaMalloc(&p, bytes ? bytes : 1))) return NULL;
    if (account) *account += bytes;
    return p;
}

/* The index of the pack's tensor holding host bytes h (c->tensors is sorted by host). */
static size_t tensor_at(const cuda_backend *c, const uint8_t *h)
{
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
    return lo - 1;
}

/* The device address of host bytes inside an uploaded tensor, in rank's GPU copy. */
static const void *dev_ptr(const cuda_backend *c, const cuda_rank *rk, const void *host)
{
    if (!host) return NULL;
    const uint8_t *h = host;
    size_t i = tensor_at(c, h), off = rk->toff ? rk->toff[i] : c->tensors[i].off;
    MUSE_CHECK(off != NOT_UP); /* a GPU alone uploads every tensor it reads through here */
    return rk->wdev + off + (size_t)(h - c->tensors[i].host);
}

static int kdtype(muse_dtype dt)
{
    return dt == MUSE_DT_F16 ? MUSE_K_F16 : dt == MUSE_DT_BF16 ? MUSE_K_BF16 : MUSE_K_F32;
}

static float *act_r(cuda_backend *c, muse_act a, int r)
{
    MUSE_CHECK(a >= 0 && a < c->n_acts && r >= 0 && r < c->n_ranks);
    return c->acts[a][r];
}

/* ---- start-up ---- */

static int by_host(const void *a, const void *b)
{
    const dev_tensor *x = a, *y = b;
    return x->host < y->host ? -1 : x->host > y->host;
}

/* Where each tensor goes in a GPU's copy of the pack (the same for every GPU). */
static void lay_out_tensors(cuda_backend *c)
{
    const muse_model *m = c->base.model;
    size_t n = muse_st_count(m->st);
    c->tensors = MUSE_CALLOC(n ? n : 1, sizeof *c->tensors);
    for (size_t i = 0; i < n; i++) {
        const muse_tensor *t = muse_st_at(m->st, i);
        c->tensors[c->n_tensors++] = (dev_tensor){t->data, t->nbytes, 0};
    }
    qsort(c->tensors, c->n_tensors, sizeof *c->tensors, by_host);
    for (size_t i = 0; i < c->n_tensors; i++) {
        c->tensors[i].off = c->pack_bytes;
        c->pack_bytes += (c->tensors[i].bytes + 255) / 256 * 256;
    }
}

static void meter_start(upload_meter *u, int device, size_t all)
{
    u->t0 = u->shown = muse_now_s();
    u->sent = 0;
    u->all = all;
    u->device = device;
}

/* bytes more sent; last: the final line (shown when any line was) */
static void meter_add(upload_meter *u, size_t bytes, int last)
{
    u->sent += bytes;
    double now = muse_now_s();
    if (now - u->shown >= 1.0 || (u->shown > u->t0 && last)) {
        /* a large pack takes minutes: say how far, how fast and how long is left */
        double rate = (double)u->sent / (now - u->t0);
        fprintf(stderr,
                "muse-engine: uploading weights to GPU %d: %.2f of %.2f GB, %.2f GB/s, %.0f s "
                "left\n",
                u->device, (double)u->sent / 1e9, (double)u->all / 1e9, rate / 1e9,
                rate > 0 ? (double)(u->all - u->sent) / rate : 0.0);
        u->shown = now;
    }
}

/* The whole pack at the shared offsets: one rank, or the first of the ranks sharing a GPU. */
static int upload_weights(cuda_backend *c, int r)
{
    cuda_rank *rk = &c->rank[r];
    rk->wdev = dalloc(c, c->pack_bytes, &c->base.ranks[r].weights);
    size_t all = 0;
    for (size_t i = 0; i < c->n_tensors; i++) all += c->tensors[i].bytes;
    meter_start(&rk->up, rk->device, all);
    for (size_t i = 0; i < c->n_tensors && !c->failed; i++) {
        CHECK(c, cudaMemcpy(rk->wdev + c->tensors[i].off, c->tensors[i].host, c->tensors[i].bytes,
                            cudaMemcpyHostToDevice));
        meter_add(&rk->up, c->tensors[i].bytes, i + 1 == c->n_tensors);
    }
    return c->failed ? -1 : 0;
}

/* ---- a GPU holding one rank of several: only what the rank reads ---- */

/* Rank r is the only rank on its GPU, and there are others: it uploads its shard alone.
 * Ranks sharing a GPU keep one whole upload (their shards together are the whole pack). */
static int alone(const cuda_backend *c, int r)
{
    if (c->n_ranks < 2) return 0;
    for (int q = 0; q < c->n_ranks; q++)
        if (q != r && c->rank[q].device == c->rank[r].device) return 0;
    return 1;
}

typedef struct {
    cuda_backend *c;
    int r;
    uint8_t *whole; /* [n_tensors] read whole through dev_ptr: uploaded as they are */
    size_t packed;  /* bytes of the packed linears so far */
    int failed;
    muse_err *e;
} shard_job;

static void mark(shard_job *j, const void *host)
{
    if (host) j->whole[tensor_at(j->c, host)] = 1;
}

/* Every tensor linear l reads (its descriptor points into them through dev_ptr). */
static void mark_linear(shard_job *j, const muse_linear *l)
{
    if (l->kind == MUSE_LIN_DENSE) {
        mark(j, l->w->data);
        return;
    }
    const muse_exl3_weight *w = &l->exl3;
    const void *parts[] = {w->trellis, w->suh, w->svh, w->su, w->sv, w->bias};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) mark(j, parts[i]);
}

/* The rank's view of l is all of it (replicated, or a split the rules leave whole). */
static int view_whole(const shard_job *j, const muse_linear *l)
{
    int64_t lo, hi;
    muse_shard_range(j->c->base.model, l, j->r, j->c->n_ranks, &lo, &hi);
    return l->shard == MUSE_SHARD_REPLICATED ||
           (lo == 0 && hi == (l->shard == MUSE_SHARD_INPUT ? l->k : l->n));
}

static void mark_whole_view(void *ctx, const muse_linear *l)
{
    shard_job *j = ctx;
    if (view_whole(j, l)) mark_linear(j, l);
}

/* A split view is packed, unless its weight is uploaded whole anyway (a tied head reads the
 * embeddings): then it reads that upload as the shared path does. */
static void place_packed(void *ctx, const muse_linear *l)
{
    shard_job *j = ctx;
    cuda_rank *rk = &j->c->rank[j->r];
    if (j->failed || view_whole(j, l)) return;
    const void *w = l->kind == MUSE_LIN_DENSE ? l->w->data : (const void *)l->exl3.trellis;
    if (j->whole[tensor_at(j->c, w)]) {
        mark_linear(j, l);
        return;
    }
    int64_t lo, hi;
    muse_linear v;
    muse_shard_range(j->c->base.model, l, j->r, j->c->n_ranks, &lo, &hi);
    if (muse_shard_view(l, lo, hi, j->r == 0, &v, j->e)) {
        j->failed = 1;
        return;
    }
    rk->pack_off[l->id] = j->packed;
    j->packed += muse_shard_packed_bytes(&v); /* a multiple of 256: the next stays aligned */
}

/* Which tensors go whole and where each packed linear goes; then the whole tensors' upload.
 * The packed linears follow in upload_linears, where their descriptors are made. */
static int upload_shard(cuda_backend *c, int r, muse_err *e)
{
    cuda_rank *rk = &c->rank[r];
    const muse_model *m = c->base.model;
    size_t nl = (size_t)(m->n_linears > 0 ? m->n_linears : 1), nt = c->n_tensors ? c->n_tensors : 1;
    shard_job j = {c, r, MUSE_CALLOC(nt, 1), 0, 0, e};
    rk->pack_off = MUSE_CALLOC(nl, sizeof *rk->pack_off);
    rk->toff = MUSE_CALLOC(nt, sizeof *rk->toff);
    for (size_t i = 0; i < nl; i++) rk->pack_off[i] = NOT_UP;
    mark(&j, m->embed->data); /* the embeddings and routers every rank reads whole */
    for (int64_t i = 0; i < m->cfg.num_layers; i++)
        if (m->cfg.mlp_kind[i] == MUSE_MLP_MOE) mark(&j, m->layers[i].router->data);
    muse_model_each_linear(m, mark_whole_view, &j);
    muse_model_each_linear(m, place_packed, &j);
    size_t at = 0, all = j.packed;
    for (size_t i = 0; i < c->n_tensors; i++) {
        rk->toff[i] = j.whole[i] ? at : NOT_UP;
        if (j.whole[i]) at += (c->tensors[i].bytes + 255) / 256 * 256; /* as the shared layout */
        if (j.whole[i]) all += c->tensors[i].bytes;
    }
    rk->pack_at = at;
    if (!j.failed) rk->wdev = dalloc(c, at + j.packed, &c->base.ranks[r].weights);
    meter_start(&rk->up, rk->device, all);
    for (size_t i = 0; i < c->n_tensors && !j.failed && !c->failed; i++) {
        if (!j.whole[i]) continue;
        CHECK(c, cudaMemcpy(rk->wdev + rk->toff[i], c->tensors[i].host, c->tensors[i].bytes,
                            cudaMemcpyHostToDevice));
        meter_add(&rk->up, c->tensors[i].bytes, rk->up.sent + c->tensors[i].bytes >= all);
    }
    free(j.whole);
    return j.failed || c->failed ? -1 : 0;
}

static void upload_vec(cuda_backend *c, cuda_rank *rk, const muse_vec *v, size_t *at)
{
    if (!v->v || v->id < 0 || c->failed) return;
    float *d = rk->vec_block + *at;
    *at += (size_t)v->n;
    CHECK(c, cudaMemcpy(d, v->v, (size_t)v->n * sizeof(float), cudaMemcpyHostToDevice));
    rk->vec[v->id] = d;
}

static int upload_vectors(cuda_backend *c, int r)
{
    cuda_rank *rk = &c->rank[r];
    const muse_model *m = c->base.model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, E = (long)cfg->num_experts, L = (long)cfg->num_layers;
    size_t floats = (size_t)H * (size_t)(4 * L + 1), at = 0;
    for (long i = 0; i < L; i++)
        if (cfg->mlp_kind[i] == MUSE_MLP_MOE) floats += (size_t)E * (size_t)(H + 1);
    rk->vec = MUSE_CALLOC((size_t)(m->n_vecs > 0 ? m->n_vecs : 1), sizeof *rk->vec);
    rk->router_bias = MUSE_CALLOC((size_t)L, sizeof *rk->router_bias);
    rk->expert_norm = MUSE_CALLOC((size_t)L, sizeof *rk->expert_norm);
    rk->vec_block = dalloc(c, floats * sizeof(float), &c->base.ranks[r].weights);
    for (long i = 0; i < L && !c->failed; i++) {
        const muse_layer *ly = &m->layers[i];
        upload_vec(c, rk, &ly->input_norm, &at);
        upload_vec(c, rk, &ly->post_attn_norm, &at);
        upload_vec(c, rk, &ly->pre_ff_norm, &at);
        upload_vec(c, rk, &ly->post_ff_norm, &at);
        if (cfg->mlp_kind[i] != MUSE_MLP_MOE) continue;
        if (ly->router_bias.v) {
            rk->router_bias[i] = rk->vec_block + at;
            at += (size_t)E;
            CHECK(c, cudaMemcpy(rk->router_bias[i], ly->router_bias.v, (size_t)E * sizeof(float),
                                cudaMemcpyHostToDevice));
        }
        if (ly->expert_norm) {
            rk->expert_norm[i] = rk->vec_block + at;
            for (long x = 0; x < E && !c->failed; x++) {
                CHECK(c, cudaMemcpy(rk->vec_block + at, ly->expert_norm[x].v,
                                    (size_t)H * sizeof(float), cudaMemcpyHostToDevice));
                if (ly->expert_norm[x].id >= 0) rk->vec[ly->expert_norm[x].id] = rk->vec_block + at;
                at += (size_t)H;
            }
        }
    }
    upload_vec(c, rk, &m->final_norm, &at);
    MUSE_CHECK(at <= floats);
    return c->failed ? -1 : 0;
}

/* The codebook tables every EXL3 linear of the pack uses, on rank r's GPU. */
static void codebook_need(void *ctx, const muse_linear *l)
{
    int *need = ctx;
    if (l->kind == MUSE_LIN_EXL3) need[l->exl3.cb] = 1;
}

static int upload_codebooks(cuda_backend *c, int r)
{
    cuda_rank *rk = &c->rank[r];
    int need[3] = {0, 0, 0};
    muse_model_each_linear(c->base.model, codebook_need, need);
    for (int cb = 0; cb < 3 && !c->failed; cb++) {
        if (!need[cb]) continue;
        rk->cb_tables[cb] = dalloc(c, 65536 * sizeof(float), &c->base.ranks[r].weights);
        if (rk->cb_tables[cb])
            CHECK(c, cudaMemcpy(rk->cb_tables[cb], muse_exl3_value_table(cb), 65536 * sizeof(float),
                                cudaMemcpyHostToDevice));
    }
    return c->failed ? -1 : 0;
}

typedef struct {
    cuda_backend *c;
    int r;
    int failed;
    muse_err *e;
    uint8_t *stage; /* a packed view on the host before its upload (GPU alone), cap bytes */
    size_t cap;
} rank_job;

/* Where descriptor pointers point: into the rank's upload of the pack (stage NULL), or into
 * one packed view at dev, staged at stage on the host. */
typedef struct {
    const cuda_backend *c;
    const cuda_rank *rk;
    const uint8_t *stage;
    uint8_t *dev;
} addr_map;

static const void *addr(const addr_map *a, const void *host)
{
    if (!a->stage) return dev_ptr(a->c, a->rk, host);
    return host ? a->dev + ((const uint8_t *)host - a->stage) : NULL;
}

/* The device descriptor of view l, its pointers through a. */
static void fill_desc(const addr_map *a, const muse_linear *l, muse_k_lin *d)
{
    memset(d, 0, sizeof *d);
    if (l->kind == MUSE_LIN_DENSE) {
        d->kind = MUSE_K_DENSE;
        d->dtype = kdtype(l->w->dtype);
        d->k = l->k;
        d->n = l->n;
        d->w = addr(a, l->w->data);
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
    d->trellis = addr(a, w->trellis);
    d->tiles_ld = w->tiles_ld ? w->tiles_ld : w->n / 16;
    d->suh = addr(a, w->suh);
    d->svh = addr(a, w->svh);
    d->su = addr(a, w->su);
    d->sv = addr(a, w->sv);
    d->bias = addr(a, w->bias);
    d->table = a->rk->cb_tables[w->cb];
}

/* A GPU alone: view l packed on the host, uploaded to its place, described there (the same
 * weights at the same indices: dense rows k long, a trellis row of the view's tiles alone). */
static void describe_packed(rank_job *j, const muse_linear *l, muse_k_lin *d)
{
    cuda_backend *c = j->c;
    cuda_rank *rk = &c->rank[j->r];
    size_t bytes = muse_shard_packed_bytes(l);
    if (bytes > j->cap) {
        free(j->stage);
        j->stage = MUSE_MALLOC(bytes);
        j->cap = bytes;
    }
    muse_tensor t;
    muse_linear p;
    muse_shard_pack(l, j->stage, &t, &p);
    addr_map a = {c, rk, j->stage, rk->wdev + rk->pack_at + rk->pack_off[l->id]};
    if (CHECK(c, cudaMemcpy(a.dev, j->stage, bytes, cudaMemcpyHostToDevice))) {
        j->failed = 1;
        return;
    }
    meter_add(&rk->up, bytes, rk->up.sent + bytes >= rk->up.all);
    fill_desc(&a, &p, d);
}

/* Rank r's view of one linear (the CPU backend's rules) and its device descriptor. */
static void describe(void *ctx, const muse_linear *whole)
{
    rank_job *j = ctx;
    cuda_backend *c = j->c;
    cuda_rank *rk = &c->rank[j->r];
    int64_t lo, hi;
    muse_shard_range(c->base.model, whole, j->r, c->n_ranks, &lo, &hi);
    muse_linear *l = &rk->views[whole->id];
    if (j->failed || muse_shard_view(whole, lo, hi, j->r == 0, l, j->e)) {
        j->failed = 1;
        return;
    }
    muse_k_lin *d = &rk->lin[l->id];
    if (rk->pack_off && rk->pack_off[l->id] != NOT_UP) {
        describe_packed(j, l, d);
        return;
    }
    addr_map a = {c, rk, NULL, NULL};
    fill_desc(&a, l, d);
}

typedef struct {
    size_t a, t; /* EXL3 workspace floats / doubles a row */
} exl3_need;

/* Sized from the whole linears: a rank's views are never wider. */
static void exl3_size(void *ctx, const muse_linear *l)
{
    exl3_need *n = ctx;
    if (l->kind != MUSE_LIN_EXL3) return;
    if ((size_t)l->exl3.k > n->a) n->a = (size_t)l->exl3.k;
    if ((size_t)l->exl3.n > n->t) n->t = (size_t)l->exl3.n;
}

static int upload_linears(cuda_backend *c, int r, muse_err *e)
{
    cuda_rank *rk = &c->rank[r];
    const muse_model *m = c->base.model;
    const muse_config *cfg = &m->cfg;
    uint64_t *acct = &c->base.ranks[r].weights;
    long E = (long)cfg->num_experts, L = (long)cfg->num_layers;
    size_t nl = (size_t)(m->n_linears > 0 ? m->n_linears : 1);
    rk->views = MUSE_CALLOC(nl, sizeof *rk->views);
    rk->lin = MUSE_CALLOC(nl, sizeof *rk->lin);
    rank_job j = {c, r, 0, e, NULL, 0};
    muse_model_each_linear(m, describe, &j);
    free(j.stage);
    if (j.failed) return -1;
    if (c->failed) return -1;
    rk->lin_dev = dalloc(c, (size_t)m->n_linears * sizeof *rk->lin, acct);
    if (rk->lin_dev)
        CHECK(c, cudaMemcpy(rk->lin_dev, rk->lin, (size_t)m->n_linears * sizeof *rk->lin,
                            cudaMemcpyHostToDevice));
    if (E > 0) {
        size_t per = (size_t)(3 * E);
        muse_k_lin *h = MUSE_CALLOC(per * (size_t)L, sizeof *h);
        for (long i = 0; i < L; i++) {
            const muse_layer *ly = &m->layers[i];
            if (cfg->mlp_kind[i] != MUSE_MLP_MOE) continue;
            for (long x = 0; x < E; x++) {
                h[(size_t)i * per + (size_t)x] = rk->lin[ly->experts[x].gate.id];
                h[(size_t)i * per + (size_t)(E + x)] = rk->lin[ly->experts[x].up.id];
                h[(size_t)i * per + (size_t)(2 * E + x)] = rk->lin[ly->experts[x].down.id];
            }
        }
        rk->experts = dalloc(c, per * (size_t)L * sizeof *h, acct);
        if (rk->experts)
            CHECK(c,
                  cudaMemcpy(rk->experts, h, per * (size_t)L * sizeof *h, cudaMemcpyHostToDevice));
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
    c->acts = realloc(c->acts, (size_t)(c->n_acts + 1) * sizeof *c->acts);
    c->act_width = realloc(c->act_width, (size_t)(c->n_acts + 1) * sizeof *c->act_width);
    c->act_cols = realloc(c->act_cols, (size_t)(c->n_acts + 1) * sizeof *c->act_cols);
    MUSE_CHECK(c->acts && c->act_width && c->act_cols);
    memset(c->acts[c->n_acts], 0, sizeof c->acts[c->n_acts]);
    c->act_width[c->n_acts] = width;
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        float *p = dalloc(c, bytes, &be->ranks[r].workspace);
        c->acts[c->n_acts][r] = p;
        c->act_cols[c->n_acts][r] = width;
        /* on the rank's stream: a cudaMemset runs on the legacy stream, which the non-blocking
         * rank streams do not wait for, so it could land after the first round's writes */
        if (p) CHECK(c, cudaMemsetAsync(p, 0, bytes, rk->st));
    }
    if (c->failed) { /* kept, so destroy frees what this call got */
        c->n_acts++;
        return -1;
    }
    return c->n_acts++;
}

/* Writes the whole activation to every rank (a replicated value). */
static void cuda_write(muse_backend *be, muse_act a, const float *src, long rows)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(rows >= 0 && rows <= be->opts.max_rows);
    size_t bytes = (size_t)rows * (size_t)c->act_width[a] * sizeof(float);
    for (int r = 0; r < c->n_ranks && !c->failed; r++) {
        cuda_rank *rk = on(c, r);
        /* on the rank's own stream, then waited for: a plain cudaMemcpy runs on the legacy
         * stream, which the non-blocking rank streams do not wait for, and from pageable memory
         * it may return before the last bytes land, so the next round's kernels could read
         * them early */
        if (!CHECK(c, cudaMemcpyAsync(act_r(c, a, r), src, bytes, cudaMemcpyHostToDevice, rk->st)))
            CHECK(c, cudaStreamSynchronize(rk->st));
        c->act_cols[a][r] = c->act_width[a];
    }
}

/* Reads rank 0's buffer; a value split by columns across ranks is gathered in rank order. */
static void cuda_read(muse_backend *be, muse_act a, float *dst, long rows)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(rows >= 0 && rows <= be->opts.max_rows);
    long W = c->act_width[a], at = 0;
    size_t bytes = (size_t)rows * (size_t)W * sizeof(float);
    if (c->n_ranks == 1 || c->act_cols[a][0] == W) {
        on(c, 0);
        if (c->failed || CHECK(c, cudaMemcpy(dst, act_r(c, a, 0), bytes, cudaMemcpyDeviceToHost)))
            for (size_t i = 0; i < bytes / sizeof(float); i++) dst[i] = NAN; /* never stale */
        return;
    }
    for (int r = 0; r < c->n_ranks && !c->failed && rows > 0; r++) {
        long w = c->act_cols[a][r];
        on(c, r);
        CHECK(c, cudaMemcpy2D(dst + at, (size_t)W * sizeof(float), act_r(c, a, r),
                              (size_t)w * sizeof(float), (size_t)w * sizeof(float), (size_t)rows,
                              cudaMemcpyDeviceToHost));
        at += w;
    }
    if (c->failed)
        for (size_t i = 0; i < bytes / sizeof(float); i++) dst[i] = NAN;
}

/* The staged batch to rank r's GPU, on its stream. */
static void stage_rank(cuda_backend *c, int r)
{
    cuda_rank *rk = on(c, r);
    muse_backend *be = &c->base;
    size_t R = (size_t)c->rows, tables = (size_t)be->opts.max_seqs * (size_t)be->kv.blocks_per_seq;
    cudaStream_t st = rk->st;
    CHECK(c, cudaMemcpyAsync(rk->d_tokens, c->h_tokens, R * 4, cudaMemcpyHostToDevice, st));
    CHECK(c, cudaMemcpyAsync(rk->d_positions, c->h_positions, R * 8, cudaMemcpyHostToDevice, st));
    CHECK(c, cudaMemcpyAsync(rk->d_seqs, c->h_seqs, R * 4, cudaMemcpyHostToDevice, st));
    if (c->wanted) {
        size_t w = (size_t)c->wanted;
        CHECK(c, cudaMemcpyAsync(rk->d_want, c->h_want, w * 4, cudaMemcpyHostToDevice, st));
        CHECK(c, cudaMemcpyAsync(rk->d_sampling, c->h_sampling, w * sizeof *c->h_sampling,
                                 cudaMemcpyHostToDevice, st));
        CHECK(c, cudaMemcpyAsync(rk->d_draw_pos, c->h_draw_pos, w * 8, cudaMemcpyHostToDevice, st));
    }
    CHECK(c, cudaMemcpyAsync(rk->d_tables, c->h_tables, tables * 4, cudaMemcpyHostToDevice, st));
}

/* Starts the round's capture on rank 0's stream and forks every other rank's stream from it;
 * before that, rank 0's stream waits for their staging copies (eager, outside the graph), so
 * the graph launched on it later runs after them. */
static void begin_capture(cuda_backend *c)
{
    cudaStream_t st0 = c->rank[0].st;
    for (int r = 1; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, cudaEventRecord(rk->ev_join, rk->st));
        CHECK(c, cudaStreamWaitEvent(st0, rk->ev_join, 0));
    }
    on(c, 0);
    if (c->failed || CHECK(c, cudaStreamBeginCapture(st0, cudaStreamCaptureModeThreadLocal)))
        return;
    c->capturing = 1;
    if (c->n_ranks > 1) CHECK(c, cudaEventRecord(c->rank[0].ev_join, st0));
    for (int r = 1; r < c->n_ranks; r++)
        CHECK(c, cudaStreamWaitEvent(c->rank[r].st, c->rank[0].ev_join, 0));
}

/* The batch into staging as the CPU backend does it: padding rows carry token 0 at position 0
 * of no sequence, padding wanted rows repeat the last wanted row. */
static int cuda_begin_round(muse_backend *be, const muse_round *r, muse_err *e)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(!c->in_round);
    if (c->failed) return device_error(c, e);
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
    for (int k = 0; k < c->n_ranks; k++) stage_rank(c, k);
    c->do_sample = r->sampling != NULL;
    c->return_logits = r->return_logits;
    c->logits = -1;
    c->in_round = 1;
    if (c->graphs && !c->failed) begin_capture(c);
    prof_host(c, PROF_BEGIN, t0);
    if (c->failed) return device_error(c, e);
    return 0;
}

/* Ends the round's capture (every rank's stream joined into rank 0's) and launches it through
 * the bucket's executable graph: updated in place from the new capture (same topology: only
 * parameters changed), else made again. */
static void replay(cuda_backend *c)
{
    cudaGraph_t g = NULL;
    cudaStream_t st0 = c->rank[0].st;
    for (int r = 1; r < c->n_ranks; r++) {
        CHECK(c, cudaEventRecord(c->rank[r].ev_join, c->rank[r].st));
        CHECK(c, cudaStreamWaitEvent(st0, c->rank[r].ev_join, 0));
    }
    c->at = 0; /* no cudaSetDevice inside the capture: begin_round made rank 0's GPU current */
    int ended = CHECK(c, cudaStreamEndCapture(st0, &g));
    c->capturing = 0;
    if (ended || c->failed) {
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
    if (*x) CHECK(c, cudaGraphLaunch(*x, st0));
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
    if (be->fault_pending) { /* test hooks: a real illegal address, caught by the syncs below */
        be->fault_pending = 0;
        CHECK(c, muse_k_fault_illegal_address(on(c, 0)->st));
    }
    for (int r = 0; r < c->n_ranks; r++) CHECK(c, cudaStreamSynchronize(on(c, r)->st));
    on(c, 0);
    long V = (long)be->model->cfg.vocab_size;
    cuda_rank *r0 = &c->rank[0];
    if (!c->failed && c->do_sample && c->real_wanted)
        CHECK(c, cudaMemcpy(c->h_drawn, r0->d_drawn, (size_t)c->real_wanted * 4,
                            cudaMemcpyDeviceToHost));
    if (!c->failed && c->return_logits && c->logits >= 0 && c->real_wanted)
        CHECK(c, cudaMemcpy(c->h_logits, act_r(c, c->logits, 0),
                            (size_t)c->real_wanted * (size_t)V * sizeof(float),
                            cudaMemcpyDeviceToHost));
    if (c->failed) return device_error(c, e);
    prof_host(c, PROF_END, t0);
    out->wanted = c->real_wanted;
    out->tokens = c->do_sample ? c->h_drawn : NULL;
    out->logits = c->return_logits && c->logits >= 0 ? c->h_logits : NULL;
    return 0;
}

/* Every rank embeds from its GPU's copy: the same bits on each (the replicated stream). */
static void cuda_embed(muse_backend *be, muse_act out)
{
    cuda_backend *c = cu(be);
    const muse_model *m = be->model;
    if (c->failed) return;
    prof_begin(c);
    long H = (long)m->cfg.hidden_size;
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, muse_k_embed(dev_ptr(c, rk, m->embed->data), kdtype(m->embed->dtype), rk->d_tokens,
                              c->rows, H, m->cfg.rms_norm_eps, act_r(c, out, r), rk->st));
        c->act_cols[out][r] = H;
    }
    prof_end(c, PROF_EMBED);
}

static const float *vec(cuda_backend *c, const cuda_rank *rk, const muse_vec *w)
{
    if (!w || !w->v) return NULL;
    MUSE_CHECK(w->id >= 0 && w->id < c->base.model->n_vecs && rk->vec[w->id]);
    return rk->vec[w->id];
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
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, muse_k_norm(act_r(c, x, r), c->rows, width,
                             mode == MUSE_NORM_NONE ? NULL : vec(c, rk, w), 0, NULL, kmode,
                             (double)eps, round16, act_r(c, out, r), rk->st));
        c->act_cols[out][r] = width;
    }
    prof_end(c, PROF_NORM);
}

static void cuda_add_norm(muse_backend *be, muse_act h, muse_act y, long width, const muse_vec *w,
                          float eps)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, muse_k_add_norm(act_r(c, h, r), act_r(c, y, r), c->rows, width, vec(c, rk, w),
                                 (double)eps, rk->st));
    }
    prof_end(c, PROF_ADD_NORM);
}

/* y = x W over rows rows with rank rk's descriptor of linear l (x rows of its k floats), y rows
 * at y_stride (its n unless the head lays its slice into a wider row). */
static void run_linear(cuda_backend *c, cuda_rank *rk, const muse_linear *l, const float *x,
                       long rows, int round16, float *y, long y_stride)
{
    const muse_k_lin *d = &rk->lin[l->id];
    CHECK(c, muse_k_linear(rk->lin_dev + l->id, d, NULL, NULL, x, (long)d->k, rows, round16, y,
                           y_stride, rk->ws_a, rk->ws_t, rk->st));
}

static void cuda_linear(muse_backend *be, const muse_linear *l, muse_act x, int round16, muse_act y)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        long n = (long)rk->lin[l->id].n;
        run_linear(c, rk, l, act_r(c, x, r), c->rows, round16, act_r(c, y, r), n);
        c->act_cols[y][r] = n;
    }
    prof_end(c, c->rank[0].lin[l->id].kind == MUSE_K_EXL3 ? PROF_EXL3 : PROF_DENSE);
}

/* Each rank normalizes the heads its buffer holds (its shard of q, of k, or all of k). */
static void cuda_qk_norm_rope(muse_backend *be, muse_act x, long heads, long head_dim, double theta,
                              float eps)
{
    cuda_backend *c = cu(be);
    (void)heads;
    if (c->failed) return;
    prof_begin(c);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, muse_k_qk_norm_rope(act_r(c, x, r), c->rows, c->act_cols[x][r] / head_dim,
                                     head_dim, rk->d_positions, theta, (double)eps, rk->st));
    }
    prof_end(c, PROF_QK);
}

static muse_k_kv layer_kv(cuda_backend *c, const cuda_rank *rk, int layer)
{
    muse_k_kv kv = {rk->k_cache[layer], rk->v_cache[layer],        c->kv_cap[layer],
                    rk->d_tables,       c->base.kv.blocks_per_seq, rk->kv_width};
    return kv;
}

/* Each rank writes its KV heads to its cache (taking them out of a whole k, v when it computed
 * all heads) and attends with its query heads; query head h of the rank reads its cache's head
 * h / group (its heads start on a group boundary, or share one KV head). */
static void cuda_attention(muse_backend *be, int layer, muse_act q, muse_act k, muse_act v,
                           muse_act g, muse_act o)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    const muse_config *cfg = &be->model->cfg;
    long hd = (long)cfg->head_dim, Hq = (long)cfg->n_heads, Hkv = (long)cfg->n_kv_heads;
    long window = cfg->attn_kind[layer] == MUSE_ATTN_SLIDING ? (long)cfg->sliding_window : 0;
    double scale = cfg->qk_scale_factor / sqrt((double)hd);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        long KV = rk->kv_width, kw = c->act_cols[k][r];
        long off = kw == KV ? 0 : (long)rk->heads.kv0 * hd; /* a whole k: its heads from there */
        long hq = (long)(rk->heads.q1 - rk->heads.q0);
        muse_k_kv kv = layer_kv(c, rk, layer);
        CHECK(c, muse_k_kv_write(kv, act_r(c, k, r) + off, act_r(c, v, r) + off, kw, c->rows,
                                 rk->d_seqs, rk->d_positions, rk->st));
        CHECK(c,
              muse_k_attention(kv, act_r(c, q, r), act_r(c, g, r), act_r(c, o, r), c->rows, hq, hd,
                               Hq / Hkv, window, scale, rk->d_seqs, rk->d_positions, rk->st));
        c->act_cols[o][r] = hq * hd;
    }
    prof_end(c, PROF_ATTENTION);
}

static void cuda_swiglu(muse_backend *be, muse_act gate, muse_act up, long width, muse_act out)
{
    cuda_backend *c = cu(be);
    (void)width;
    if (c->failed) return;
    prof_begin(c);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        long w = c->act_cols[gate][r]; /* the rank's share of the intermediate width */
        CHECK(c, muse_k_swiglu(act_r(c, gate, r), act_r(c, up, r), c->rows * w, act_r(c, out, r),
                               rk->st));
        c->act_cols[out][r] = w;
    }
    prof_end(c, PROF_SWIGLU);
}

/* ---- sums across ranks ---- */

/* Every rank's stream waits for the event each other rank recorded last (ev_ready or ev_done). */
static void barrier(cuda_backend *c, int done)
{
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, cudaEventRecord(done ? rk->ev_done : rk->ev_ready, rk->st));
    }
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        for (int k = 0; k < c->n_ranks; k++)
            if (k != r)
                CHECK(c, cudaStreamWaitEvent(rk->st,
                                             done ? c->rank[k].ev_done : c->rank[k].ev_ready, 0));
    }
}

/* parts[r] (n floats on rank r) = the sum over ranks in rank order, on every rank. The kernel
 * path: after a barrier (every partial written) each rank sums every rank's partial into its
 * red, and after a second barrier (no rank still reads a partial) copies it back. The NCCL
 * path: an all-gather of the partials (NCCL's own sum order is not guaranteed, so NCCL only
 * moves data), then each rank the same rank-order sum of the gathered slices, straight into
 * its partial (NCCL is done reading it when the gather completes on its stream). */
static void reduce(cuda_backend *c, float *const parts[], long n)
{
    if (c->n_ranks == 1 || n <= 0 || c->failed) return; /* one rank holds the whole sum */
    MUSE_CHECK((size_t)n <= c->red_floats);
    size_t bytes = (size_t)n * sizeof(float);
    if (c->nccl && (c->nccl_always || !c->peers || bytes >= NCCL_MIN_BYTES)) {
        ncclResult_t nr = c->nccl->GroupStart();
        for (int r = 0; r < c->n_ranks && nr == ncclSuccess; r++) {
            cuda_rank *rk = on(c, r);
            nr = c->nccl->AllGather(parts[r], rk->gather, (size_t)n, ncclFloat, rk->comm, rk->st);
        }
        ncclResult_t end = c->nccl->GroupEnd();
        if (nr == ncclSuccess) nr = end;
        if (nr != ncclSuccess) {
            if (!c->failed) { /* the rank whose call failed, as cuda_ok keeps it */
                snprintf(c->err, sizeof c->err, "%s:%d: ncclAllGather: %s", __FILE__, __LINE__,
                         c->nccl->GetErrorString(nr));
                c->failed_rank = c->at;
            }
            c->failed = 1;
            return;
        }
        for (int r = 0; r < c->n_ranks; r++) {
            cuda_rank *rk = on(c, r);
            muse_k_parts p = {{0}};
            for (int k = 0; k < c->n_ranks; k++) p.p[k] = rk->gather + (size_t)k * (size_t)n;
            CHECK(c, muse_k_all_reduce(p, c->n_ranks, n, parts[r], rk->st));
        }
        return;
    }
    muse_k_parts p = {{0}};
    for (int k = 0; k < c->n_ranks; k++) p.p[k] = parts[k];
    barrier(c, 0);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, muse_k_all_reduce(p, c->n_ranks, n, rk->red, rk->st));
    }
    barrier(c, 1);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, cudaMemcpyAsync(parts[r], rk->red, bytes, cudaMemcpyDeviceToDevice, rk->st));
    }
}

/* x = x_0 + x_1 + ... in rank order, then every rank holds the sum. */
static void cuda_all_reduce(muse_backend *be, muse_act x, long width)
{
    cuda_backend *c = cu(be);
    if (c->n_ranks == 1 || c->failed) return; /* one rank holds the whole sum */
    prof_begin(c);
    float *parts[MUSE_MAX_RANKS];
    for (int r = 0; r < c->n_ranks; r++) {
        parts[r] = act_r(c, x, r);
        c->act_cols[x][r] = width;
    }
    reduce(c, parts, c->rows * width);
    prof_end(c, PROF_ALL_REDUCE);
}

/* gate, up, swiglu, down of one MLP over rows (row r of x at x_stride), per-row descriptors
 * (experts) or one linear's, on rank rk. */
static void run_mlp(cuda_backend *c, cuda_rank *rk, const muse_k_lin *descs[3],
                    const muse_k_lin *shape[3], const int32_t *row_desc, const int32_t *row_src,
                    const float *x, long x_stride, long rows, float *out)
{
    long I = (long)shape[0]->n, H = (long)shape[2]->n;
    CHECK(c, muse_k_linear(descs[0], shape[0], row_desc, row_src, x, x_stride, rows, 1, rk->eg, I,
                           rk->ws_a, rk->ws_t, rk->st));
    CHECK(c, muse_k_linear(descs[1], shape[1], row_desc, row_src, x, x_stride, rows, 1, rk->eu, I,
                           rk->ws_a, rk->ws_t, rk->st));
    CHECK(c, muse_k_swiglu(rk->eg, rk->eu, rows * I, rk->ea, rk->st));
    CHECK(c, muse_k_linear(descs[2], shape[2], row_desc, NULL, rk->ea, I, rows, 0, out, H, rk->ws_a,
                           rk->ws_t, rk->st));
}

/* Router and selection per row (every rank the same), then every (row, slot) pair through the
 * rank's share of its expert and the shared experts; the ranks' partial outputs summed in rank
 * order (the CPU backend sums each expert's before its norm); then on every rank the expert
 * output norm and the weighted sum in ascending expert index, plus the shared experts. */
static void cuda_moe(muse_backend *be, const muse_layer *ly, muse_act b_a, muse_act y_a)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, E = (long)cfg->num_experts, K = (long)cfg->num_experts_per_tok;
    long i = (long)(ly - m->layers), R = c->rows;
    int shared = cfg->num_shared_experts > 0;
    float *zg[MUSE_MAX_RANKS], *zs[MUSE_MAX_RANKS];
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        const float *b = act_r(c, b_a, r);
        CHECK(c, muse_k_router(b, R, H, dev_ptr(c, rk, ly->router->data), kdtype(ly->router->dtype),
                               E, rk->router_logits, rk->st));
        CHECK(c, muse_k_select(rk->router_logits, R, E, K, rk->router_bias[i], cfg->norm_topk_prob,
                               (float)cfg->routed_scaling_factor, rk->sel, rk->sel_w, rk->st));
        const muse_k_lin *ex = rk->experts + (size_t)i * (size_t)(3 * E);
        const muse_k_lin *descs[3] = {ex, ex + E, ex + 2 * E};
        const muse_k_lin *shape[3] = {&rk->lin[ly->experts[0].gate.id],
                                      &rk->lin[ly->experts[0].up.id],
                                      &rk->lin[ly->experts[0].down.id]};
        run_mlp(c, rk, descs, shape, rk->sel, rk->pair_src, b, H, R * K, rk->zg);
        if (shared) {
            const muse_mlp *s = &ly->shared;
            const muse_k_lin *sd[3] = {rk->lin_dev + s->gate.id, rk->lin_dev + s->up.id,
                                       rk->lin_dev + s->down.id};
            const muse_k_lin *ss[3] = {&rk->lin[s->gate.id], &rk->lin[s->up.id],
                                       &rk->lin[s->down.id]};
            run_mlp(c, rk, sd, ss, NULL, NULL, b, H, R, rk->zs);
        }
        zg[r] = rk->zg;
        zs[r] = rk->zs;
    }
    reduce(c, zg, R * K * H);
    if (shared) reduce(c, zs, R * H);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        if (cfg->expert_output_norm)
            CHECK(c,
                  muse_k_norm(rk->zg, R * K, H, rk->expert_norm[i], H, rk->sel, MUSE_K_NORM_PLUS1,
                              (double)(float)cfg->rms_norm_eps, 0, rk->zg, rk->st));
        CHECK(c, muse_k_moe_combine(rk->sel, rk->sel_w, rk->zg, shared ? rk->zs : NULL, R, K, H,
                                    act_r(c, y_a, r), rk->st));
        c->act_cols[y_a][r] = H;
    }
    prof_end(c, PROF_MOE);
}

/* Each rank its vocabulary slice (shard.h: 128-row blocks); the slices are laid side by side
 * in rank order in rank 0's raw [wanted, N], where the multiplier and softcap are applied
 * into rank 0's logits [wanted, vocab_size], where the sampler reads them. */
static void cuda_head(muse_backend *be, muse_act x, muse_act logits)
{
    cuda_backend *c = cu(be);
    c->logits = logits;
    if (c->failed || !c->wanted) return;
    prof_begin(c);
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, V = (long)cfg->vocab_size, N = (long)m->head.n;
    cuda_rank *r0 = &c->rank[0];
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        long w = (long)rk->lin[m->head.id].n;
        CHECK(c, muse_k_gather_rows(act_r(c, x, r), rk->d_want, c->wanted, H, rk->xsel, rk->st));
        run_linear(c, rk, &m->head, rk->xsel, c->wanted, 0, rk->raw, r ? w : N);
        if (r) CHECK(c, cudaEventRecord(rk->ev_ready, rk->st));
    }
    on(c, 0);
    for (int r = 1; r < c->n_ranks; r++) {
        cuda_rank *rk = &c->rank[r];
        int64_t lo, hi;
        muse_shard_range(m, &m->head, r, c->n_ranks, &lo, &hi);
        size_t w = (size_t)(hi - lo) * sizeof(float);
        CHECK(c, cudaStreamWaitEvent(r0->st, rk->ev_ready, 0));
        CHECK(c, cudaMemcpy2DAsync(r0->raw + lo, (size_t)N * sizeof(float), rk->raw, w, w,
                                   (size_t)c->wanted, cudaMemcpyDefault, r0->st));
    }
    CHECK(c, muse_k_head_finish(r0->raw, c->wanted, N, V, cfg->output_multiplier,
                                cfg->final_logit_softcapping, act_r(c, logits, 0), r0->st));
    prof_end(c, PROF_HEAD);
}

/* Rank 0 draws: the logits are there. */
static void cuda_sample(muse_backend *be, muse_act logits)
{
    cuda_backend *c = cu(be);
    c->logits = logits;
    if (c->failed || !c->wanted) return;
    prof_begin(c);
    cuda_rank *r0 = on(c, 0);
    CHECK(c, muse_k_sample(act_r(c, logits, 0), c->wanted, (long)be->model->cfg.vocab_size,
                           r0->d_sampling, r0->d_draw_pos, c->weight_bits, r0->weights, r0->d_drawn,
                           r0->st));
    prof_end(c, PROF_SAMPLE);
}

/* K then V of each sliding layer, positions ascending, between the rings and a slot; each
 * rank its KV heads in its own slot. */
static void sliding_copy(cuda_backend *c, int seq, int64_t end_pos, int slot, int save)
{
    MUSE_CHECK(!c->in_round && slot >= 0 && slot < c->base.opts.snapshot_slots);
    if (c->failed) return;
    const muse_config *cfg = &c->base.model->cfg;
    int64_t first = end_pos > cfg->sliding_window ? end_pos - cfg->sliding_window : 0;
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        uint16_t *buf = rk->snapshots + (size_t)slot * (c->base.snapshot_bytes / sizeof *buf);
        long KV = rk->kv_width;
        size_t row = (size_t)KV * sizeof *buf;
        for (int i = 0; i < (int)cfg->num_layers; i++) {
            if (cfg->attn_kind[i] != MUSE_ATTN_SLIDING) continue;
            int64_t cap = c->kv_cap[i];
            for (int kv = 0; kv < 2; kv++) {
                uint16_t *cache = kv ? rk->v_cache[i] : rk->k_cache[i];
                for (int64_t s = first; s < end_pos; s++, buf += KV) {
                    uint16_t *at = cache + muse_kv_ring_offset(seq, s, 0, cap, KV);
                    CHECK(c, cudaMemcpyAsync(save ? buf : at, save ? at : buf, row,
                                             cudaMemcpyDeviceToDevice, rk->st));
                }
            }
        }
    }
    for (int r = 0; r < c->n_ranks; r++) CHECK(c, cudaStreamSynchronize(on(c, r)->st));
}

static void cuda_snapshot_save(muse_backend *be, int seq, int64_t end_pos, int slot)
{
    sliding_copy(cu(be), seq, end_pos, slot, 1);
}

static void cuda_snapshot_load(muse_backend *be, int seq, int64_t end_pos, int slot)
{
    sliding_copy(cu(be), seq, end_pos, slot, 0);
}

/* The bytes floor's yardstick (backend.h): a device-to-device copy of `bytes` on rank 0's stream,
 * timed with events, best of 5 after a warm-up; read + write counted. Self-contained: its
 * buffers and events live only here. */
static int cuda_copy_bandwidth(muse_backend *be, size_t bytes, double *bytes_per_s, char *device,
                               size_t device_len, muse_err *e)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(!c->in_round);
    const int dev = c->rank[0].device; /* rank 0's GPU: every rank's is the same kind */
    const cudaStream_t st = c->rank[0].st;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    struct cudaDeviceProp p;
    float best = 0;
    if (!c->failed && !CHECK(c, cudaSetDevice(dev)) && !CHECK(c, cudaGetDeviceProperties(&p, dev)))
        snprintf(device, device_len, "%s (device %d)", p.name, dev);
    if (!c->failed && !CHECK(c, cudaMalloc(&a, bytes)) && !CHECK(c, cudaMalloc(&b, bytes)) &&
        !CHECK(c, cudaMemsetAsync(a, 1, bytes, st)) && !CHECK(c, cudaEventCreate(&e0)) &&
        !CHECK(c, cudaEventCreate(&e1)))
        for (int i = 0; i < 6; i++) {
            float ms = 0;
            if (CHECK(c, cudaEventRecord(e0, st)) ||
                CHECK(c, cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st)) ||
                CHECK(c, cudaEventRecord(e1, st)) || CHECK(c, cudaEventSynchronize(e1)) ||
                CHECK(c, cudaEventElapsedTime(&ms, e0, e1)))
                break;
            if (i > 0 && (best == 0 || ms < best)) best = ms;
        }
    if (e0) CHECK(c, cudaEventDestroy(e0));
    if (e1) CHECK(c, cudaEventDestroy(e1));
    if (a) CHECK(c, cudaFree(a));
    if (b) CHECK(c, cudaFree(b));
    if (c->failed) return muse_fail(e, "copy bandwidth on device %d (cuda): %s", dev, c->err);
    *bytes_per_s = best > 0 ? 2.0 * (double)bytes / ((double)best * 1e-3) : 0;
    return 0;
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
    .copy_bandwidth = cuda_copy_bandwidth,
};

/* Pinned host memory every GPU of the process may copy from (portable). */
static void *halloc(cuda_backend *c, size_t bytes)
{
    void *p = NULL;
    if (c->failed) return NULL;
    if (CHECK(c, cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable))) return NULL;
    return p;
}

/* Rank r's staging, workspaces, KV and snapshots on its GPU, all sized from the options. */
static int allocate_rank(cuda_backend *c, int r)
{
    muse_backend *be = &c->base;
    const muse_backend_opts *o = &be->opts;
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    muse_rank_mem *mem = &be->ranks[r];
    cuda_rank *rk = on(c, r);
    size_t R = (size_t)o->max_rows, H = (size_t)cfg->hidden_size, E = (size_t)cfg->num_experts;
    size_t K = (size_t)cfg->num_experts_per_tok, V = (size_t)cfg->vocab_size;
    size_t N = (size_t)m->head.n, L = (size_t)cfg->num_layers;
    size_t P = R * (K > 0 ? K : 1); /* (row, slot) pairs */
    size_t rows_cap = P > R ? P : R;
    size_t I = (size_t)cfg->moe_intermediate_size;
    size_t Ish = (size_t)(cfg->num_shared_experts * cfg->moe_intermediate_size);
    size_t mlp = P * I > R * Ish ? P * I : R * Ish;
    size_t head_w = r ? (size_t)rk->lin[m->head.id].n : N; /* rank 0 lays out every slice */
    exl3_need need = {0, 0};
    muse_model_each_linear(m, exl3_size, &need);
    rk->ws_a = dalloc(c, rows_cap * need.a * sizeof(float), &mem->workspace);
    rk->ws_t = dalloc(c, rows_cap * need.t * sizeof(double), &mem->workspace);
    rk->router_logits = dalloc(c, R * E * sizeof(float), &mem->workspace);
    rk->sel = dalloc(c, P * sizeof(int32_t), &mem->workspace);
    rk->sel_w = dalloc(c, P * sizeof(float), &mem->workspace);
    rk->pair_src = dalloc(c, P * sizeof(int32_t), &mem->workspace);
    rk->eg = dalloc(c, mlp * sizeof(float), &mem->workspace);
    rk->eu = dalloc(c, mlp * sizeof(float), &mem->workspace);
    rk->ea = dalloc(c, mlp * sizeof(float), &mem->workspace);
    rk->zg = dalloc(c, P * H * sizeof(float), &mem->workspace);
    rk->zs = dalloc(c, R * H * sizeof(float), &mem->workspace);
    rk->xsel = dalloc(c, R * H * sizeof(float), &mem->workspace);
    rk->raw = dalloc(c, R * head_w * sizeof(float), &mem->workspace);
    if (r == 0) rk->weights = dalloc(c, R * V * sizeof(float), &mem->workspace);
    if (c->n_ranks > 1) rk->red = dalloc(c, c->red_floats * sizeof(float), &mem->workspace);
    if (c->nccl)
        rk->gather = dalloc(c, (size_t)c->n_ranks * c->red_floats * sizeof(float), &mem->workspace);
    if (rk->pair_src && K > 0) {
        int32_t *src = MUSE_MALLOC(P * sizeof *src);
        for (size_t p = 0; p < P; p++) src[p] = (int32_t)(p / K);
        CHECK(c, cudaMemcpy(rk->pair_src, src, P * sizeof *src, cudaMemcpyHostToDevice));
        free(src);
    }
    size_t tables = (size_t)o->max_seqs * (size_t)be->kv.blocks_per_seq;
    rk->d_tokens = dalloc(c, R * 4, &mem->staging);
    rk->d_seqs = dalloc(c, R * 4, &mem->staging);
    rk->d_want = dalloc(c, R * 4, &mem->staging);
    rk->d_drawn = dalloc(c, R * 4, &mem->staging);
    rk->d_positions = dalloc(c, R * 8, &mem->staging);
    rk->d_draw_pos = dalloc(c, R * 8, &mem->staging);
    rk->d_sampling = dalloc(c, R * sizeof *rk->d_sampling, &mem->staging);
    rk->d_tables = dalloc(c, tables * 4, &mem->staging);
    if (c->failed) return -1;
    CHECK(c, cudaMemcpy(rk->d_tables, c->h_tables, tables * 4, cudaMemcpyHostToDevice));
    /* KV: sliding layers a ring per sequence, full layers the paged pool's blocks */
    rk->k_cache = MUSE_CALLOC(L, sizeof *rk->k_cache);
    rk->v_cache = MUSE_CALLOC(L, sizeof *rk->v_cache);
    for (size_t i = 0; i < L && !c->failed; i++) {
        size_t rows = c->kv_cap[i] ? (size_t)o->max_seqs * (size_t)c->kv_cap[i]
                                   : (size_t)be->kv.n_blocks * MUSE_KV_BLOCK;
        size_t bytes = rows * (size_t)rk->kv_width * sizeof(uint16_t);
        uint64_t *acct = c->kv_cap[i] ? &mem->sliding : &mem->kv;
        rk->k_cache[i] = dalloc(c, bytes, acct);
        rk->v_cache[i] = dalloc(c, bytes, acct);
        if (rk->v_cache[i]) { /* on the rank's stream, before its first kv_write (cuda_alloc) */
            CHECK(c, cudaMemsetAsync(rk->k_cache[i], 0, bytes, rk->st));
            CHECK(c, cudaMemsetAsync(rk->v_cache[i], 0, bytes, rk->st));
        }
    }
    size_t snap = (size_t)o->snapshot_slots * be->snapshot_bytes;
    rk->snapshots = dalloc(c, snap, &mem->snapshots);
    return c->failed ? -1 : 0;
}

/* The host staging (once) and every rank's buffers. */
static int allocate(cuda_backend *c)
{
    muse_backend *be = &c->base;
    const muse_backend_opts *o = &be->opts;
    const muse_config *cfg = &be->model->cfg;
    size_t R = (size_t)o->max_rows, V = (size_t)cfg->vocab_size, L = (size_t)cfg->num_layers;
    size_t tables = (size_t)o->max_seqs * (size_t)be->kv.blocks_per_seq;
    on(c, 0);
    c->h_tokens = halloc(c, R * 4);
    c->h_seqs = halloc(c, R * 4);
    c->h_want = halloc(c, R * 4);
    c->h_drawn = halloc(c, R * 4);
    c->h_positions = halloc(c, R * 8);
    c->h_draw_pos = halloc(c, R * 8);
    c->h_sampling = halloc(c, R * sizeof *c->h_sampling);
    c->h_tables = halloc(c, tables * 4);
    c->h_logits = halloc(c, R * V * sizeof(float));
    if (c->failed) return -1;
    for (size_t i = 0; i < tables; i++) c->h_tables[i] = -1;
    c->kv_cap = MUSE_CALLOC(L, sizeof *c->kv_cap);
    for (size_t i = 0; i < L; i++)
        if (cfg->attn_kind[i] == MUSE_ATTN_SLIDING) {
            int64_t cap = o->context;
            /* a ring: a chunk never overwrites keys it reads */
            if (cfg->sliding_window + o->max_rows - 1 < cap)
                cap = cfg->sliding_window + o->max_rows - 1;
            c->kv_cap[i] = cap;
        }
    for (int r = 0; r < c->n_ranks; r++)
        if (allocate_rank(c, r)) return -1;
    return 0;
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

/* Every rank's GPU exists and runs these kernels. */
static int devices_check(const muse_backend_opts *o, int ranks, muse_err *e)
{
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0)
        return muse_fail(e, "--backend cuda: no usable CUDA device (%s); use --backend cpu",
                         rc != cudaSuccess ? cudaGetErrorString(rc) : "none found");
    for (int r = 0; r < ranks; r++) {
        int dev = o->devices[r];
        if (dev < 0 || dev >= count)
            return muse_fail(e,
                             "--backend cuda: device %d (rank %d) does not exist (%d found); use "
                             "0 .. %d in --gpus",
                             dev, r, count, count - 1);
        int seen = 0;
        for (int q = 0; q < r; q++) seen |= o->devices[q] == dev;
        if (!seen && arch_check(dev, e)) return -1;
    }
    return 0;
}

/* backend.h: each rank's share of its GPU's memory (a GPU's whole memory divided among the
 * ranks on it), the smallest over the ranks, from the device properties before any context
 * holds memory; the same refusals as start-up (no device, no driver, an arch not built). */
int muse_cuda_device_memory(const int *devices, int ranks, uint64_t *bytes, char *desc,
                            size_t desc_len, muse_err *e)
{
    muse_backend_opts o = {.ranks = ranks};
    /* the count first: the copy into o.devices (MUSE_MAX_RANKS entries) must not overrun */
    if (ranks < 1 || ranks > MUSE_MAX_RANKS)
        return muse_fail(e, "--ranks %d: must be 1 .. %d in one process", ranks, MUSE_MAX_RANKS);
    memcpy(o.devices, devices, (size_t)ranks * sizeof *devices);
    if (devices_check(&o, ranks, e)) return -1;
    *bytes = 0;
    for (int r = 0; r < ranks; r++) {
        struct cudaDeviceProp p;
        cudaError_t rc = cudaGetDeviceProperties(&p, devices[r]);
        if (rc != cudaSuccess)
            return muse_fail(e, "--backend cuda: device %d: %s; use --backend cpu", devices[r],
                             cudaGetErrorString(rc));
        int sharing = 1; /* rank r, and the others on its GPU */
        for (int q = 0; q < ranks; q++) sharing += q != r && devices[q] == devices[r];
        uint64_t share = (uint64_t)p.totalGlobalMem / (uint64_t)sharing;
        if (*bytes && share >= *bytes) continue;
        *bytes = share;
        snprintf(desc, desc_len, "%s (device %d%s)", p.name, devices[r],
                 sharing > 1 ? ", shared by ranks" : "");
    }
    return 0;
}

/* Peer access between every pair of distinct GPUs the ranks sit on, where the hardware has it
 * (NVLink or PCIe P2P); c->peers says whether every pair has it. */
static void enable_peers(cuda_backend *c)
{
    c->peers = 1;
    for (int a = 0; a < c->n_ranks; a++)
        for (int b = 0; b < c->n_ranks; b++) {
            int da = c->rank[a].device, db = c->rank[b].device, can = 0;
            if (da == db) continue;
            if (CHECK(c, cudaDeviceCanAccessPeer(&can, da, db))) return;
            if (!can) {
                c->peers = 0;
                continue;
            }
            on(c, a);
            cudaError_t rc = cudaDeviceEnablePeerAccess(db, 0);
            if (rc ==
                cudaErrorPeerAccessAlreadyEnabled) /* a pair seen before, or another backend */
                (void)cudaGetLastError();
            else
                CHECK(c, rc);
        }
}

/* Where ranks sit on distinct GPUs: NCCL, loaded and its communicators made, when the GPUs lack
 * peer access or MUSE_CUDA_REDUCE=nccl asks (a clear error without libnccl; then every sum goes
 * through it), and tried quietly for large messages otherwise (MUSE_CUDA_REDUCE=kernel: never). */
static int setup_nccl(cuda_backend *c, muse_err *e)
{
    int distinct = 1;
    for (int a = 0; a < c->n_ranks; a++)
        for (int b = 0; b < a; b++) distinct &= c->rank[a].device != c->rank[b].device;
    const char *mode = getenv("MUSE_CUDA_REDUCE");
    int want = mode && !strcmp(mode, "nccl"), never = mode && !strcmp(mode, "kernel");
    if (!c->peers && (!distinct || never))
        return muse_fail(e,
                         "--gpus: some GPUs of the ranks have no peer access, and %s; give GPUs "
                         "with peer access (nvidia-smi topo -m), or put the ranks on one GPU",
                         never ? "MUSE_CUDA_REDUCE=kernel rules out NCCL"
                               : "NCCL cannot hold two ranks of one GPU");
    if (never || !distinct) return 0;
    int needed = want || !c->peers; /* else NCCL only speeds up large messages */
    muse_err quiet = {{0}};
    const muse_nccl *lib = muse_nccl_load(needed ? e : &quiet);
    if (!lib) return needed ? -1 : 0;
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* no NVLink SHARP multicast: see KINDS.md */
    ncclComm_t comms[MUSE_MAX_RANKS];
    int devs[MUSE_MAX_RANKS];
    for (int r = 0; r < c->n_ranks; r++) devs[r] = c->rank[r].device;
    ncclResult_t nr = lib->CommInitAll(comms, c->n_ranks, devs);
    if (nr != ncclSuccess)
        return needed ? muse_fail(e, "--gpus: ncclCommInitAll over %d GPUs failed: %s", c->n_ranks,
                                  lib->GetErrorString(nr))
                      : 0;
    c->nccl = lib;
    c->nccl_always = want; /* docs/engine.md: =nccl forces NCCL, so a check covers that path */
    for (int r = 0; r < c->n_ranks; r++) c->rank[r].comm = comms[r];
    return 0;
}

/* Rank r's stream, events and weights and its shard's descriptors. Alone on its GPU among
 * several ranks it uploads only what it reads; ranks sharing a GPU read one whole upload of the
 * pack, made by the first of them: the simplest rule that is right, since together they read
 * most of it (the union of their shards is not worked out). */
static int start_rank(cuda_backend *c, int r, muse_err *e)
{
    cuda_rank *rk = on(c, r);
    if (c->failed || CHECK(c, cudaStreamCreateWithFlags(&rk->st, cudaStreamNonBlocking)) ||
        CHECK(c, cudaEventCreateWithFlags(&rk->ev_ready, cudaEventDisableTiming)) ||
        CHECK(c, cudaEventCreateWithFlags(&rk->ev_done, cudaEventDisableTiming)) ||
        CHECK(c, cudaEventCreateWithFlags(&rk->ev_join, cudaEventDisableTiming)))
        return -1;
    if (rk->owner == r) {
        int up = alone(c, r) ? upload_shard(c, r, e) : upload_weights(c, r);
        if (up || upload_vectors(c, r) || upload_codebooks(c, r)) return -1;
    } else {
        const cuda_rank *ow = &c->rank[rk->owner];
        rk->wdev = ow->wdev;
        rk->vec = ow->vec;
        rk->vec_block = ow->vec_block;
        rk->router_bias = ow->router_bias;
        rk->expert_norm = ow->expert_norm;
        memcpy(rk->cb_tables, ow->cb_tables, sizeof rk->cb_tables);
    }
    return upload_linears(c, r, e);
}

muse_backend *muse_cuda_backend_create(const muse_model *m, const muse_backend_opts *o, muse_err *e)
{
    const muse_config *cfg = &m->cfg;
    int ranks = o->ranks > 0 ? o->ranks : 1;
    if (ranks > MUSE_MAX_RANKS)
        return muse_fail(e, "--ranks %d: at most %d ranks in one process", ranks, MUSE_MAX_RANKS),
               NULL;
    if (muse_shard_check(cfg, ranks, e)) return NULL;
    if (cfg->head_dim > 512 || cfg->head_dim % 2)
        return muse_fail(e, "config.json: head_dim %lld exceeds the CUDA backend's limit of 512",
                         (long long)cfg->head_dim),
               NULL;
    if (cfg->num_experts > 4096)
        return muse_fail(e, "config.json: num_experts %lld exceeds the CUDA backend's limit 4096",
                         (long long)cfg->num_experts),
               NULL;
    if (devices_check(o, ranks, e)) return NULL;
    cuda_backend *c = MUSE_CALLOC(1, sizeof *c);
    c->base.ops = &cuda_ops;
    if (muse_backend_init_common(&c->base, m, o, e)) {
        free(c);
        return NULL;
    }
    c->n_ranks = ranks;
    for (int r = 0; r < ranks; r++) {
        cuda_rank *rk = &c->rank[r];
        rk->device = o->devices[r];
        rk->owner = r;
        for (int q = r - 1; q >= 0; q--)
            if (c->rank[q].device == rk->device) rk->owner = c->rank[q].owner;
        c->multi_dev |= rk->device != c->rank[0].device;
        muse_shard_heads(cfg, r, ranks, &rk->heads);
        rk->kv_width = (long)((rk->heads.kv1 - rk->heads.kv0) * cfg->head_dim);
    }
    const char *graphs = getenv("MUSE_CUDA_GRAPHS"); /* 0: launch each kernel eagerly */
    c->graphs = !(graphs && !strcmp(graphs, "0")) && !c->multi_dev;
    const char *prof = getenv("MUSE_CUDA_PROFILE");
    c->prof = prof && !strcmp(prof, "1");
    if (c->prof) c->graphs = 0; /* each op synchronized on its own */
    int id_bits = 0;
    while (((int64_t)1 << id_bits) < cfg->vocab_size) id_bits++;
    c->weight_bits = 62 - id_bits;
    size_t R = (size_t)o->max_rows, K = (size_t)cfg->num_experts_per_tok;
    c->red_floats = R * (K > 1 ? K : 1) * (size_t)cfg->hidden_size; /* moe's pairs, or x */
    lay_out_tensors(c);
    muse_err why = {{0}};
    int bad = 0;
    for (int r = 0; r < ranks && !bad; r++) bad = start_rank(c, r, &why);
    if (!bad && !c->failed && c->multi_dev) {
        enable_peers(c);
        bad = !c->failed && setup_nccl(c, &why);
    }
    on(c, 0);
    if (c->prof && !c->failed && !CHECK(c, cudaEventCreate(&c->ev0)))
        CHECK(c, cudaEventCreate(&c->ev1));
    if (bad || c->failed || allocate(c)) {
        if (why.msg[0])
            muse_fail(e, "--backend cuda: %s", why.msg);
        else
            muse_fail(e,
                      "--backend cuda: start-up on GPU %d (rank %d) failed: %s; use --backend cpu",
                      c->rank[c->failed_rank].device, c->failed_rank, c->err);
        cuda_destroy(&c->base);
        return NULL;
    }
    return &c->base;
}

static void free_rank(cuda_backend *c, int r)
{
    cuda_rank *rk = &c->rank[r];
    cudaSetDevice(rk->device);
    void *dev[] = {rk->lin_dev,    rk->experts,  rk->ws_a,    rk->ws_t,        rk->router_logits,
                   rk->sel_w,      rk->eg,       rk->eu,      rk->ea,          rk->zg,
                   rk->zs,         rk->xsel,     rk->raw,     rk->weights,     rk->sel,
                   rk->pair_src,   rk->red,      rk->gather,  rk->d_tokens,    rk->d_seqs,
                   rk->d_want,     rk->d_tables, rk->d_drawn, rk->d_positions, rk->d_draw_pos,
                   rk->d_sampling, rk->snapshots};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    for (int i = 0; i < c->n_acts; i++) cudaFree(c->acts[i][r]);
    if (rk->k_cache)
        for (int64_t i = 0; i < c->base.model->cfg.num_layers; i++) {
            cudaFree(rk->k_cache[i]);
            cudaFree(rk->v_cache[i]);
        }
    if (rk->comm && c->nccl) c->nccl->CommDestroy(rk->comm);
    if (rk->owner == r) { /* the GPU's copy of the pack */
        cudaFree(rk->wdev);
        cudaFree(rk->vec_block);
        for (int cb = 0; cb < 3; cb++) cudaFree(rk->cb_tables[cb]);
        free(rk->vec);
        free(rk->router_bias);
        free(rk->expert_norm);
    }
    if (rk->ev_ready) cudaEventDestroy(rk->ev_ready);
    if (rk->ev_done) cudaEventDestroy(rk->ev_done);
    if (rk->ev_join) cudaEventDestroy(rk->ev_join);
    if (rk->st) cudaStreamDestroy(rk->st);
    free(rk->k_cache);
    free(rk->v_cache);
    free(rk->views);
    free(rk->lin);
    free(rk->toff);
    free(rk->pack_off);
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
    void *host[] = {c->h_tokens,    c->h_seqs,     c->h_want,     c->h_tables, c->h_drawn,
                    c->h_positions, c->h_draw_pos, c->h_sampling, c->h_logits};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) cudaFreeHost(host[i]);
    for (int i = 0; i <= MUSE_MAX_BUCKETS; i++)
        if (c->execs[i]) cudaGraphExecDestroy(c->execs[i]);
    for (int r = c->n_ranks - 1; r >= 0; r--) free_rank(c, r); /* owners last */
    free(c->acts);
    free(c->act_width);
    free(c->act_cols);
    free(c->kv_cap);
    free(c->tensors);
    muse_kv_pool_destroy(&be->kv);
    free(c);
}
