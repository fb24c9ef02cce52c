/* The CPU reference backend: every operation of backend.h in plain C with fp32 sums in a
 * fixed order, so a row's result never depends on the batch, the chunking or the threads.
 * With --ranks N it holds N ranks in one process, each with only its shard of the weights,
 * its KV heads and its own activations, run one after another; sums across ranks go in rank
 * order, as they would between devices. In a world of several processes (--tp-world) it holds
 * one rank and does its sums and the head's gather through the communicator (tp/comm.h), in the
 * same rank order, so the bits equal one process holding every rank. */
#include <math.h>

#include "backend/backend.h"
#include "base/clock.h"
#include "base/threadpool.h"
#include "model/kv_addr.h"
#include "model/shard.h"
#include "tp/comm.h"

/* One rank: its shard views of the weights (by linear id), heads, KV cache and snapshots. */
typedef struct {
    muse_rank_heads heads;
    muse_linear *views; /* [n_linears] */
    long kv_width;      /* (kv1 - kv0) * head_dim: what its cache holds a position */
    /* KV cache, per layer, fp16: sliding layers a ring [max_seqs][cap][kv_width]; full layers
     * (cap 0) blocks [n_blocks][MUSE_KV_BLOCK][kv_width] found through the block tables */
    uint16_t **k_cache, **v_cache;
    uint16_t *snapshots; /* [snapshot_slots][snapshot_bytes / 2] */
} cpu_rank;

typedef struct {
    muse_backend base;
    muse_pool *pool;
    int threads;
    float **scratch;       /* [threads][scratch_floats] */
    double **attn_scratch; /* [threads][context + head_dim]: scores, then the sum of V */
    size_t scratch_floats;
    void *exl3_ws;                  /* EXL3 linear workspace, sized for the largest linear */
    float *(*acts)[MUSE_MAX_RANKS]; /* every alloc(): [max_rows, act_width[i]] a rank */
    long *act_width;
    long (*act_cols)[MUSE_MAX_RANKS]; /* the columns a rank's buffer holds now (its shard) */
    int n_acts;
    int n_ranks;
    cpu_rank rank[MUSE_MAX_RANKS];
    muse_comm *comm;   /* a world of processes: the link to the other ranks; NULL: none */
    int world;         /* ranks of the world: n_ranks, or the processes' --tp-world */
    int first_rank;    /* the world's rank of this process's rank 0 */
    float *head_parts; /* rank 0 of a world: every rank's logits slice, [max_rows, head n] */
    /* staging, fixed at start (backend.h muse_round_stage): the round's batch padded to its
     * bucket, the wanted rows padded the same way, sampling, the round's block tables; the ops
     * read its arrays directly, and its counts through rows .. real_wanted */
    muse_round_stage stage;
    long rows, real_rows, wanted, real_wanted; /* stage's, copied at begin_round */
    int32_t *drawn;                            /* [max_rows] */
    int do_sample, return_logits, in_round;
    muse_act logits;         /* the head's output of this round */
    muse_sampler **samplers; /* one per pool thread */
    int64_t *kv_cap;         /* per layer: ring positions of a sliding layer, 0 for a full one */
    /* MoE workspace */
    float *router_logits; /* [R, E] */
    int32_t *sel;         /* [R, k] selected experts */
    float *sel_w;         /* [R, k] their weights */
    int32_t *rows_of;     /* [R] rows routed to one expert */
    float *xg, *zg;       /* [R, H] gathered inputs, expert outputs */
    float *eg, *eu, *ea;  /* [R, I_moe max] */
    float *xsel;          /* [R, H] head inputs of the wanted rows */
    float *zr;            /* [R, H] another rank's partial MLP outputs */
} cpu_backend;

static float *act_r(cpu_backend *c, muse_act a, int r)
{
    MUSE_CHECK(a >= 0 && a < c->n_acts && r >= 0 && r < c->n_ranks);
    return c->acts[a][r];
}

/* Rank 0's buffer: what tools read and the sampler draws from. */
static float *act(cpu_backend *c, muse_act a)
{
    return act_r(c, a, 0);
}

/* A rank's view of a linear (the whole linear with one rank). */
static const muse_linear *view(cpu_backend *c, const muse_linear *l, int r)
{
    return &c->rank[r].views[l->id];
}

static cpu_backend *cpu(muse_backend *be)
{
    return (cpu_backend *)be;
}

/* ---- fixed-order sums ----
 * The reference sums in double and rounds to fp32 where an operation's output is fp32: more
 * precise than the fp32 accumulation the contract asks for, so fp16 rounding points flip
 * only where the exact value sits on a boundary. */

/* 4 lanes then a fixed tree: the same order for every call with the same n. */
static inline double dot_f64(const float *a, const float *b, long n)
{
    double acc[4] = {0, 0, 0, 0};
    long i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++) acc[l] += (double)a[i + l] * (double)b[i + l];
    double tail = 0;
    for (; i < n; i++) tail += (double)a[i] * (double)b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + tail;
}

static inline double rms_scale(const float *x, long n, double eps)
{
    return 1.0 / sqrt(dot_f64(x, x, n) / (double)n + eps);
}

static inline float sigmoid_f(float x)
{
    return (float)(1.0 / (1.0 + exp(-(double)x)));
}

/* ---- operations ---- */

static muse_act cpu_alloc(muse_backend *be, long rows, long width)
{
    cpu_backend *c = cpu(be);
    MUSE_CHECK(!c->in_round && width > 0 && rows > 0 && rows <= be->opts.max_rows);
    c->acts = realloc(c->acts, (size_t)(c->n_acts + 1) * sizeof *c->acts);
    c->act_width = realloc(c->act_width, (size_t)(c->n_acts + 1) * sizeof *c->act_width);
    c->act_cols = realloc(c->act_cols, (size_t)(c->n_acts + 1) * sizeof *c->act_cols);
    MUSE_CHECK(c->acts && c->act_width && c->act_cols);
    size_t floats = (size_t)rows * (size_t)width;
    for (int r = 0; r < c->n_ranks; r++) {
        c->acts[c->n_acts][r] = MUSE_CALLOC(floats, sizeof(float));
        c->act_cols[c->n_acts][r] = width;
        be->ranks[r].workspace += floats * sizeof(float);
    }
    c->act_width[c->n_acts] = width;
    return c->n_acts++;
}

/* Writes the whole activation to every rank (a replicated value). */
static void cpu_write(muse_backend *be, muse_act a, const float *src, long rows)
{
    cpu_backend *c = cpu(be);
    MUSE_CHECK(rows >= 0 && rows <= be->opts.max_rows);
    for (int r = 0; r < c->n_ranks; r++) {
        memcpy(act_r(c, a, r), src, (size_t)rows * (size_t)c->act_width[a] * sizeof(float));
        c->act_cols[a][r] = c->act_width[a];
    }
}

/* Reads rank 0's buffer; a value split by columns across ranks is gathered in rank order. */
static void cpu_read(muse_backend *be, muse_act a, float *dst, long rows)
{
    cpu_backend *c = cpu(be);
    MUSE_CHECK(rows >= 0 && rows <= be->opts.max_rows);
    long W = c->act_width[a], at = 0;
    if (c->n_ranks == 1 || c->act_cols[a][0] == W) {
        memcpy(dst, act(c, a), (size_t)rows * (size_t)W * sizeof(float));
        return;
    }
    for (int r = 0; r < c->n_ranks; r++) {
        long w = c->act_cols[a][r];
        for (long i = 0; i < rows; i++)
            memcpy(dst + i * W + at, act_r(c, a, r) + i * w, (size_t)w * sizeof(float));
        at += w;
    }
}

/* Copies the batch into staging (backend.c muse_backend_stage, the CUDA backend's too); the
 * ops read the stage's host arrays as they are. */
static int cpu_begin_round(muse_backend *be, const muse_round *r, muse_err *e)
{
    cpu_backend *c = cpu(be);
    MUSE_CHECK(!c->in_round);
    muse_backend_stage(be, r, &c->stage);
    c->real_rows = c->stage.real_rows;
    c->rows = c->stage.rows;
    c->real_wanted = c->stage.real_wanted;
    c->wanted = c->stage.wanted;
    c->do_sample = r->sampling != NULL;
    c->return_logits = r->return_logits;
    c->logits = -1;
    c->in_round = 1;
    (void)e;
    return 0;
}

static int cpu_end_round(muse_backend *be, muse_round_out *out, muse_err *e)
{
    cpu_backend *c = cpu(be);
    MUSE_CHECK(c->in_round);
    c->in_round = 0;
    memset(out, 0, sizeof *out);
    if (c->comm && muse_comm_error(c->comm, e)) return -1; /* a rank of the world stopped */
    if (be->fault_pending) /* test hooks force the device-failure path */
        return muse_fail(e, "device error on rank 0 (cpu): injected by a test hook; the "
                            "context cannot be used again");
    out->wanted = c->real_wanted;
    out->tokens = c->do_sample ? c->drawn : NULL;
    out->logits = c->return_logits && c->logits >= 0 ? act(c, c->logits) : NULL;
    return 0;
}

static void cpu_embed(muse_backend *be, muse_act out_a)
{
    cpu_backend *c = cpu(be);
    const muse_model *m = be->model;
    long H = (long)m->cfg.hidden_size;
    float *out = act(c, out_a);
    for (int k = 1; k < c->n_ranks; k++) c->act_cols[out_a][k] = H;
    for (long r = 0; r < c->rows; r++) {
        float *row = out + r * H;
        muse_model_embed_row(m, c->stage.tokens[r], row);
        double s = rms_scale(row, H, m->cfg.rms_norm_eps);
        for (long j = 0; j < H; j++) row[j] = (float)(row[j] * s);
    }
    /* every rank holds the same replicated residual stream */
    for (int k = 1; k < c->n_ranks; k++)
        memcpy(act_r(c, out_a, k), out, (size_t)(c->rows * H) * sizeof *out);
}

static void norm_rows(const float *x, long rows, long width, const float *w, muse_norm_weight mode,
                      float eps, int round16, float *out)
{
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * width;
        float *o = out + r * width;
        double s = rms_scale(xr, width, eps);
        for (long j = 0; j < width; j++) {
            float v = (float)(xr[j] * s);
            if (mode == MUSE_NORM_PLUS1) v *= 1.0f + w[j];
            if (mode == MUSE_NORM_PLAIN) v *= w[j];
            o[j] = round16 ? muse_round_f16(v) : v;
        }
    }
}

static void cpu_norm(muse_backend *be, muse_act x, long width, const muse_vec *w,
                     muse_norm_weight mode, float eps, int round16, muse_act out)
{
    cpu_backend *c = cpu(be);
    for (int r = 0; r < c->n_ranks; r++) {
        norm_rows(act_r(c, x, r), c->rows, width, w ? w->v : NULL, mode, eps, round16,
                  act_r(c, out, r));
        c->act_cols[out][r] = width;
    }
}

static void cpu_add_norm(muse_backend *be, muse_act h_a, muse_act y_a, long width,
                         const muse_vec *wv, float eps)
{
    cpu_backend *c = cpu(be);
    const float *w = wv->v;
    for (int k = 0; k < c->n_ranks; k++) {
        float *h = act_r(c, h_a, k);
        const float *y = act_r(c, y_a, k);
        for (long r = 0; r < c->rows; r++) {
            const float *yr = y + r * width;
            double s = rms_scale(yr, width, eps);
            for (long j = 0; j < width; j++) h[r * width + j] += (float)(yr[j] * s) * (1.0f + w[j]);
        }
    }
}

typedef struct {
    cpu_backend *c;
    const muse_linear *l;
    const float *x;
    long rows;
    int round16;
    float *y;
} dense_job;

/* Columns [begin, end): each weight row converted once, then dotted with every input row. */
static void dense_cols(void *ctx, long begin, long end, int thread)
{
    dense_job *j = ctx;
    float *wrow = j->c->scratch[thread];
    long k = (long)j->l->k, n = (long)j->l->n;
    for (long col = begin; col < end; col++) {
        muse_dense_row(j->l, col, wrow);
        for (long r = 0; r < j->rows; r++) {
            float v = (float)dot_f64(j->x + r * k, wrow, k);
            j->y[r * n + col] = j->round16 ? muse_round_f16(v) : v;
        }
    }
}

static void linear_rows(cpu_backend *c, const muse_linear *l, const float *x, long rows,
                        int round16, float *y)
{
    if (l->kind == MUSE_LIN_EXL3) {
        muse_exl3_linear(&l->exl3, x, rows, y, c->exl3_ws, c->pool);
        if (round16)
            for (long i = 0; i < rows * (long)l->n; i++) y[i] = muse_round_f16(y[i]);
        return;
    }
    dense_job j = {c, l, x, rows, round16, y};
    muse_pool_run_t(c->pool, dense_cols, &j, (long)l->n);
}

static void cpu_linear(muse_backend *be, const muse_linear *l, muse_act x, int round16, muse_act y)
{
    cpu_backend *c = cpu(be);
    for (int r = 0; r < c->n_ranks; r++) {
        const muse_linear *v = view(c, l, r);
        linear_rows(c, v, act_r(c, x, r), c->rows, round16, act_r(c, y, r));
        c->act_cols[y][r] = (long)v->n;
    }
}

static void qk_rows(cpu_backend *c, float *x, long heads, long head_dim, double theta, float eps)
{
    long half = head_dim / 2;
    for (long r = 0; r < c->rows; r++) {
        double p = (double)c->stage.positions[r];
        for (long hh = 0; hh < heads; hh++) {
            float *v = x + (r * heads + hh) * head_dim;
            double s = rms_scale(v, head_dim, eps);
            for (long d = 0; d < head_dim; d++) v[d] = (float)(v[d] * s);
            if (theta != 0) {
                for (long j = 0; j < half; j++) {
                    double angle = p * pow(theta, -2.0 * (double)j / (double)head_dim);
                    double cs = cos(angle), sn = sin(angle), x1 = v[j], x2 = v[j + half];
                    v[j] = (float)(x1 * cs - x2 * sn);
                    v[j + half] = (float)(x2 * cs + x1 * sn);
                }
            }
            for (long d = 0; d < head_dim; d++) v[d] = muse_round_f16(v[d]);
        }
    }
}

/* Each rank normalizes the heads its buffer holds (its shard of q, of k, or all of k). */
static void cpu_qk_norm_rope(muse_backend *be, muse_act x_a, long heads, long head_dim,
                             double theta, float eps)
{
    cpu_backend *c = cpu(be);
    (void)heads;
    for (int r = 0; r < c->n_ranks; r++)
        qk_rows(c, act_r(c, x_a, r), c->act_cols[x_a][r] / head_dim, head_dim, theta, eps);
}

typedef struct {
    cpu_backend *c;
    const cpu_rank *rk;
    int layer;
    long hq; /* query heads of this rank */
    const float *q, *g;
    float *o;
} attn_job;

/* Element offset of position s of seq in a layer's cache: a ring slot or a block row. */
static inline size_t kv_offset(const cpu_backend *c, int layer, int seq, int64_t s, long KV)
{
    int64_t at =
        muse_kv_offset(c->stage.tables, c->base.kv.blocks_per_seq, c->kv_cap[layer], seq, s, 0, KV);
    MUSE_CHECK(at >= 0); /* the caller reserves blocks before a forward */
    return (size_t)at;
}

/* One (row, query head of the rank) per index: scores over the visible keys in position order. */
static void attn_rows(void *ctx, long begin, long end, int thread)
{
    attn_job *j = ctx;
    const muse_config *cfg = &j->c->base.model->cfg;
    long hd = (long)cfg->head_dim, Hq = (long)cfg->n_heads, Hkv = (long)cfg->n_kv_heads;
    long KV = j->rk->kv_width, group = Hq / Hkv, hq = j->hq;
    bool sliding = cfg->attn_kind[j->layer] == MUSE_ATTN_SLIDING;
    double scale = cfg->qk_scale_factor / sqrt((double)hd);
    double *scores = j->c->attn_scratch[thread];
    double *acc = scores + j->c->base.opts.context;
    for (long t = begin; t < end; t++) {
        long r = t / hq, h = t % hq;
        long kh = (j->rk->heads.q0 + h) / group - j->rk->heads.kv0; /* within the rank's cache */
        int64_t p = j->c->stage.positions[r];
        int seq = j->c->stage.seqs[r];
        float *o = j->o + (r * hq + h) * hd;
        if (seq < 0) { /* a padding row reads no cache */
            for (long d = 0; d < hd; d++) o[d] = 0;
            continue;
        }
        int64_t first =
            sliding && p - cfg->sliding_window + 1 > 0 ? p - cfg->sliding_window + 1 : 0;
        const uint16_t *kc = j->rk->k_cache[j->layer], *vc = j->rk->v_cache[j->layer];
        const float *q = j->q + (r * hq + h) * hd;
        float kf[512];
        double mx = -INFINITY;
        for (int64_t s = first; s <= p; s++) {
            const uint16_t *kr = kc + kv_offset(j->c, j->layer, seq, s, KV) + kh * hd;
            for (long d = 0; d < hd; d++) kf[d] = muse_f16_to_f32(kr[d]);
            double sc = dot_f64(q, kf, hd) * scale;
            scores[s - first] = sc;
            if (sc > mx) mx = sc;
        }
        double sum = 0;
        for (int64_t s = first; s <= p; s++) {
            scores[s - first] = exp(scores[s - first] - mx);
            sum += scores[s - first];
        }
        for (long d = 0; d < hd; d++) acc[d] = 0;
        for (int64_t s = first; s <= p; s++) {
            const uint16_t *vr = vc + kv_offset(j->c, j->layer, seq, s, KV) + kh * hd;
            double w = scores[s - first] / sum;
            for (long d = 0; d < hd; d++) acc[d] += w * muse_f16_to_f32(vr[d]);
        }
        const float *g = j->g + (r * hq + h) * hd;
        for (long d = 0; d < hd; d++) o[d] = muse_round_f16((float)acc[d] * sigmoid_f(g[d]));
    }
}

/* Each rank norms and ropes the q and k heads its buffers hold, writes its KV heads to its cache
 * (taking them out of a whole k, v when it computed all heads) and attends with its query heads. */
static void cpu_attention(muse_backend *be, int layer, muse_act q, muse_act k_a, muse_act v_a,
                          muse_act g, muse_act o)
{
    cpu_backend *c = cpu(be);
    const muse_config *cfg = &be->model->cfg;
    long hd = (long)cfg->head_dim;
    double theta = cfg->rope_theta_layer[layer];
    float eps = (float)cfg->rms_norm_eps;
    for (int rr = 0; rr < c->n_ranks; rr++) {
        const cpu_rank *rk = &c->rank[rr];
        long KV = rk->kv_width, kw = c->act_cols[k_a][rr];
        long off = kw == KV ? 0 : rk->heads.kv0 * hd; /* a whole k: the rank's heads from there */
        long hq = rk->heads.q1 - rk->heads.q0;
        qk_rows(c, act_r(c, q, rr), hq, hd, theta, eps); /* the heads the attention reads */
        qk_rows(c, act_r(c, k_a, rr), kw / hd, hd, theta, eps);
        const float *k = act_r(c, k_a, rr), *v = act_r(c, v_a, rr);
        for (long r = 0; r < c->rows; r++) {
            if (c->stage.seqs[r] < 0) continue; /* padding */
            size_t at = kv_offset(c, layer, c->stage.seqs[r], c->stage.positions[r], KV);
            for (long d = 0; d < KV; d++) {
                rk->k_cache[layer][at + d] = muse_f32_to_f16(k[r * kw + off + d]);
                rk->v_cache[layer][at + d] = muse_f32_to_f16(v[r * kw + off + d]);
            }
        }
        attn_job j = {c, rk, layer, hq, act_r(c, q, rr), act_r(c, g, rr), act_r(c, o, rr)};
        muse_pool_run_t(c->pool, attn_rows, &j, c->rows * hq);
        c->act_cols[o][rr] = hq * hd;
    }
}

static void swiglu_n(const float *gate, const float *up, long n, float *out)
{
    for (long i = 0; i < n; i++) {
        double gv = gate[i];
        out[i] = muse_round_f16((float)(gv / (1.0 + exp(-gv))) * up[i]);
    }
}

static void cpu_swiglu(muse_backend *be, muse_act gate, muse_act up, long width, muse_act out)
{
    cpu_backend *c = cpu(be);
    (void)width;
    for (int r = 0; r < c->n_ranks; r++) {
        long w = c->act_cols[gate][r]; /* the rank's share of the intermediate width */
        swiglu_n(act_r(c, gate, r), act_r(c, up, r), c->rows * w, act_r(c, out, r));
        c->act_cols[out][r] = w;
    }
}

typedef struct {
    const muse_layer *ly;
    const float *b;
    long rows, H, E;
    float *out;
} router_job;

static void router_experts(void *ctx, long begin, long end, int thread)
{
    (void)thread;
    router_job *j = ctx;
    const muse_tensor *t = j->ly->router;
    float wrow[16384];
    MUSE_CHECK(j->H <= 16384);
    muse_linear fake = {.kind = MUSE_LIN_DENSE, .k = j->H, .n = j->E, .w = t, .ld = j->H};
    for (long x = begin; x < end; x++) {
        muse_dense_row(&fake, x, wrow);
        for (long r = 0; r < j->rows; r++)
            j->out[r * j->E + x] = (float)dot_f64(j->b + r * j->H, wrow, j->H);
    }
}

/* Top-k by selection key (sigmoid + bias), ties to the lower expert index. */
static void select_experts(const muse_config *cfg, const muse_layer *ly, const float *logits,
                           int32_t *sel, float *w)
{
    long E = (long)cfg->num_experts, K = (long)cfg->num_experts_per_tok;
    float s[4096], key[4096];
    bool taken[4096];
    MUSE_CHECK(E <= 4096);
    for (long x = 0; x < E; x++) {
        s[x] = sigmoid_f(logits[x]);
        key[x] = ly->router_bias.v ? s[x] + ly->router_bias.v[x] : s[x];
        taken[x] = false;
    }
    float sum = 0;
    for (long i = 0; i < K; i++) {
        long best = 0;
        while (taken[best]) best++;
        for (long x = best + 1; x < E; x++)
            if (!taken[x] && key[x] > key[best]) best = x; /* strict: the lower index keeps a tie */
        taken[best] = true;
        sel[i] = (int32_t)best;
        w[i] = s[best];
        sum += s[best];
    }
    for (long i = 0; i < K; i++) {
        if (cfg->norm_topk_prob) w[i] /= sum;
        w[i] *= (float)cfg->routed_scaling_factor;
    }
}

/* One rank's share of an MLP: its views of gate, up (by output) and down (by input). */
static void run_mlp(cpu_backend *c, const muse_mlp *mlp, int rank, const float *x, long rows,
                    float *g, float *u, float *a, float *out)
{
    const muse_linear *gate = view(c, &mlp->gate, rank);
    linear_rows(c, gate, x, rows, 1, g);
    linear_rows(c, view(c, &mlp->up, rank), x, rows, 1, u);
    swiglu_n(g, u, rows * (long)gate->n, a);
    linear_rows(c, view(c, &mlp->down, rank), a, rows, 0, out);
}

/* z[n, H] = the ranks' partial outputs of an MLP, summed in rank order. */
static void mlp_sum(cpu_backend *c, const muse_mlp *mlp, const float *x, long n, long H, float *z)
{
    if (c->comm) { /* this process's rank, then the world's sum in rank order */
        run_mlp(c, mlp, 0, x, n, c->eg, c->eu, c->ea, z);
        muse_comm_all_reduce_f32(c->comm, z, (size_t)(n * H));
        return;
    }
    for (int k = 0; k < c->n_ranks; k++) {
        float *zk = k ? c->zr : z;
        run_mlp(c, mlp, k, x, n, c->eg, c->eu, c->ea, zk);
        if (k)
            for (long i = 0; i < n * H; i++) z[i] += zk[i];
    }
}

/* Router and selection are replicated (every rank computes the same); each expert's partial
 * outputs are summed across ranks in rank order before its norm and the weighted sum. */
static void cpu_moe(muse_backend *be, const muse_layer *ly, muse_act b_a, muse_act y_a)
{
    cpu_backend *c = cpu(be);
    const float *b = act(c, b_a);
    float *y = act(c, y_a);
    long rows = c->rows;
    const muse_config *cfg = &be->model->cfg;
    long H = (long)cfg->hidden_size, E = (long)cfg->num_experts, K = (long)cfg->num_experts_per_tok;
    router_job rj = {ly, b, rows, H, E, c->router_logits};
    muse_pool_run_t(c->pool, router_experts, &rj, E);
    for (long r = 0; r < rows; r++)
        select_experts(cfg, ly, c->router_logits + r * E, c->sel + r * K, c->sel_w + r * K);
    memset(y, 0, (size_t)(rows * H) * sizeof *y);
    /* ascending expert index, so each row sums its experts in that order */
    for (long x = 0; x < E; x++) {
        long n = 0;
        for (long r = 0; r < rows; r++)
            for (long i = 0; i < K; i++)
                if (c->sel[r * K + i] == x) c->rows_of[n++] = (int32_t)r;
        if (!n) continue;
        for (long i = 0; i < n; i++)
            memcpy(c->xg + i * H, b + (long)c->rows_of[i] * H, (size_t)H * sizeof(float));
        mlp_sum(c, &ly->experts[x], c->xg, n, H, c->zg);
        if (cfg->expert_output_norm)
            norm_rows(c->zg, n, H, ly->expert_norm[x].v, MUSE_NORM_PLUS1, (float)cfg->rms_norm_eps,
                      0, c->zg);
        for (long i = 0; i < n; i++) {
            long r = c->rows_of[i];
            float w = 0;
            for (long q = 0; q < K; q++)
                if (c->sel[r * K + q] == x) w = c->sel_w[r * K + q];
            for (long d = 0; d < H; d++) y[r * H + d] += w * c->zg[i * H + d];
        }
    }
    if (cfg->num_shared_experts > 0) {
        mlp_sum(c, &ly->shared, b, rows, H, c->zg);
        for (long i = 0; i < rows * H; i++) y[i] += c->zg[i];
    }
    for (int k = 1; k < c->n_ranks; k++) {
        memcpy(act_r(c, y_a, k), y, (size_t)(rows * H) * sizeof *y);
        c->act_cols[y_a][k] = H;
    }
}

/* x = x_0 + x_1 + ... in rank order, then every rank holds the sum. */
static void cpu_all_reduce(muse_backend *be, muse_act x, long width)
{
    cpu_backend *c = cpu(be);
    float *sum = act(c, x);
    long n = c->rows * width;
    if (c->comm) { /* the ranks of other processes; a failure shows at end_round */
        muse_comm_all_reduce_f32(c->comm, sum, (size_t)n);
        return;
    }
    if (c->n_ranks == 1) return; /* one rank holds the whole sum */
    for (int k = 1; k < c->n_ranks; k++) {
        const float *xk = act_r(c, x, k);
        for (long i = 0; i < n; i++) sum[i] += xk[i];
    }
    for (int k = 1; k < c->n_ranks; k++) memcpy(act_r(c, x, k), sum, (size_t)n * sizeof *sum);
}

/* A world of processes: this rank's vocabulary slice goes to rank 0, which lays every rank's
 * side by side in rank order (as one process does below), then the multiplier and softcap. */
static void head_world(cpu_backend *c, long n, float *logits)
{
    const muse_model *m = c->base.model;
    long V = (long)m->cfg.vocab_size;
    double mult = m->cfg.output_multiplier, cap = m->cfg.final_logit_softcapping;
    size_t bytes[MUSE_MAX_RANKS] = {0};
    long lo[MUSE_MAX_RANKS] = {0}, w[MUSE_MAX_RANKS] = {0};
    for (int k = 0; k < c->world; k++) {
        int64_t a, b;
        muse_shard_range(m, &m->head, k, c->world, &a, &b);
        lo[k] = (long)a;
        w[k] = (long)(b - a);
        bytes[k] = (size_t)(n * w[k]) * sizeof(float);
    }
    const muse_linear *v = view(c, &m->head, 0);
    MUSE_CHECK((long)v->n == w[c->first_rank]);
    linear_rows(c, v, c->xsel, n, 0, logits);
    if (muse_comm_gather(c->comm, logits, bytes, c->head_parts) || c->comm->rank) return;
    const float *part = c->head_parts;
    for (int k = 0; k < c->world; k++) {
        long keep = lo[k] + w[k] > V ? V - lo[k] : w[k]; /* padding past the vocabulary drops */
        for (long r = 0; r < n && keep > 0; r++)
            memcpy(logits + r * V + lo[k], part + r * w[k], (size_t)keep * sizeof *logits);
        part += n * w[k];
    }
    for (long i = 0; i < n * V; i++) {
        double z = (double)logits[i] * mult;
        logits[i] = (float)(cap > 0 ? cap * tanh(z / cap) : z);
    }
}

/* Each rank computes its vocabulary slice; the slices are laid side by side in rank order in
 * rank 0's buffer, [wanted, vocab_size], where the sampler reads them. */
static void cpu_head(muse_backend *be, muse_act x_a, muse_act logits_a)
{
    cpu_backend *c = cpu(be);
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, V = (long)cfg->vocab_size, N = (long)m->head.n;
    long n = c->wanted;
    const float *x = act(c, x_a);
    float *logits = act(c, logits_a);
    c->logits = logits_a;
    for (long i = 0; i < n; i++)
        memcpy(c->xsel + i * H, x + (long)c->stage.want[i] * H, (size_t)H * sizeof(float));
    if (!n) return;
    double mult = cfg->output_multiplier, cap = cfg->final_logit_softcapping;
    if (c->comm) {
        head_world(c, n, logits);
        return;
    }
    if (c->n_ranks == 1) {
        linear_rows(c, &m->head, c->xsel, n, 0, logits);
        for (long r = 0; r < n; r++)
            for (long j = 0; j < V; j++) {
                double z = (double)logits[r * N + j] * mult;
                logits[r * V + j] = (float)(cap > 0 ? cap * tanh(z / cap) : z);
            }
        return;
    }
    long lo[MUSE_MAX_RANKS] = {0}, w[MUSE_MAX_RANKS] = {0};
    for (int k = 0; k < c->n_ranks; k++) {
        const muse_linear *v = view(c, &m->head, k);
        int64_t a, b;
        muse_shard_range(m, &m->head, k, c->n_ranks, &a, &b);
        lo[k] = (long)a;
        w[k] = (long)v->n;
        linear_rows(c, v, c->xsel, n, 0, act_r(c, logits_a, k));
    }
    for (long r = n - 1; r >= 0; r--) /* rank 0's rows to stride V, last row first */
        memmove(logits + r * V, logits + r * w[0], (size_t)w[0] * sizeof *logits);
    for (int k = 1; k < c->n_ranks; k++) {
        long keep = lo[k] + w[k] > V ? V - lo[k] : w[k]; /* padding past the vocabulary drops */
        for (long r = 0; r < n && keep > 0; r++)
            memcpy(logits + r * V + lo[k], act_r(c, logits_a, k) + r * w[k],
                   (size_t)keep * sizeof *logits);
    }
    for (long i = 0; i < n * V; i++) {
        double z = (double)logits[i] * mult;
        logits[i] = (float)(cap > 0 ? cap * tanh(z / cap) : z);
    }
}

/* Positions [first, end_pos) a resumed sequence needs from the sliding layers. */
static int64_t sliding_first(const muse_config *cfg, int64_t end_pos)
{
    return muse_kv_window_first(end_pos, cfg->sliding_window);
}

/* Draws wanted rows [begin, end) with this thread's sampler. */
static void draw_rows(void *ctx, long begin, long end, int thread)
{
    cpu_backend *c = ctx;
    long V = (long)c->base.model->cfg.vocab_size;
    const float *logits = act(c, c->logits);
    for (long i = begin; i < end; i++)
        c->drawn[i] = (int32_t)muse_sample_masked(
            c->samplers[thread], logits + i * V,
            c->stage.masks && i < c->stage.real_wanted ? c->stage.masks[i] : NULL,
            &c->stage.sampling[i], c->stage.draw_pos[i]);
}

static void cpu_sample(muse_backend *be, muse_act logits)
{
    cpu_backend *c = cpu(be);
    c->logits = logits;
    if (c->comm && c->comm->rank) return; /* rank 0 draws from the gathered logits */
    /* every draw depends only on its own logits, seed and position: the split cannot matter */
    muse_pool_run_t(c->pool, draw_rows, c, c->wanted);
}

/* Copies K then V of each sliding layer, positions ascending, between the rings and a slot: a
 * layer's window is at most two runs of its ring (muse_kv_ring_runs), as the CUDA backend's. */
static void sliding_copy(cpu_backend *c, int seq, int64_t end_pos, int slot, int save)
{
    MUSE_CHECK(!c->in_round && slot >= 0 && slot < c->base.opts.snapshot_slots);
    const muse_config *cfg = &c->base.model->cfg;
    int64_t first = sliding_first(cfg, end_pos);
    for (int r = 0; r < c->n_ranks; r++) { /* each rank keeps its heads in its own slot */
        const cpu_rank *rk = &c->rank[r];
        uint16_t *buf = rk->snapshots + (size_t)slot * (c->base.snapshot_bytes / sizeof *buf);
        long KV = rk->kv_width;
        for (int i = 0; i < (int)cfg->num_layers; i++) {
            if (cfg->attn_kind[i] != MUSE_ATTN_SLIDING) continue;
            int64_t at[2], n[2];
            MUSE_CHECK(c->kv_cap[i] > 0 && end_pos - first <= c->kv_cap[i]);
            int runs = muse_kv_ring_runs(seq, first, end_pos, c->kv_cap[i], at, n);
            for (int kv = 0; kv < 2; kv++) {
                uint16_t *cache = kv ? rk->v_cache[i] : rk->k_cache[i];
                for (int u = 0; u < runs; buf += n[u] * KV, u++) {
                    uint16_t *ring = cache + at[u] * KV;
                    size_t bytes = (size_t)(n[u] * KV) * sizeof *buf;
                    memcpy(save ? buf : ring, save ? ring : buf, bytes);
                }
            }
        }
    }
}

static void cpu_snapshot_save(muse_backend *be, int seq, int64_t end_pos, int slot)
{
    sliding_copy(cpu(be), seq, end_pos, slot, 1);
}

static void cpu_snapshot_load(muse_backend *be, int seq, int64_t end_pos, int slot)
{
    sliding_copy(cpu(be), seq, end_pos, slot, 0);
}

/* ---- copy bandwidth: memcpy split over the pool's threads, as the kernels use them ---- */
typedef struct {
    char *dst;
    const char *src;
} copy_job;

static void copy_part(void *ctx, long begin, long end)
{
    copy_job *j = ctx;
    memcpy(j->dst + ((size_t)begin << 16), j->src + ((size_t)begin << 16),
           (size_t)(end - begin) << 16);
}

/* The CPU's model name from /proc/cpuinfo ("cpu" where it has none). */
static void cpu_model_name(char *out, size_t len)
{
    char line[256];
    snprintf(out, len, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        const char *v = colon + 1;
        while (*v == ' ') v++;
        snprintf(out, len, "%s", v);
        out[strcspn(out, "\n")] = 0;
        break;
    }
    fclose(f);
}

static int cpu_copy_bandwidth(muse_backend *be, size_t bytes, double *bytes_per_s, char *device,
                              size_t device_len, muse_err *e)
{
    cpu_backend *c = cpu(be);
    MUSE_CHECK(!c->in_round);
    long chunks = (long)((bytes + 65535) >> 16); /* 64 KiB parts for the threads */
    char *a = malloc((size_t)chunks << 16), *b = malloc((size_t)chunks << 16);
    if (!a || !b) {
        free(a);
        free(b);
        return muse_fail(e, "copy bandwidth (cpu): no memory for 2 x %zu bytes", bytes);
    }
    memset(a, 1, (size_t)chunks << 16);
    memset(b, 2, (size_t)chunks << 16); /* every page mapped before the timing */
    copy_job j = {b, a};
    double best = 0;
    for (int i = 0; i < 6; i++) { /* the first copy is a warm-up */
        int64_t t0 = muse_now_ns();
        muse_pool_run(c->pool, copy_part, &j, chunks);
        double s = (double)(muse_now_ns() - t0) * 1e-9;
        if (i > 0 && (best == 0 || s < best)) best = s;
    }
    free(a);
    free(b);
    char name[160];
    cpu_model_name(name, sizeof name);
    snprintf(device, device_len, "%s, %d threads", name, c->threads);
    *bytes_per_s = best > 0 ? 2.0 * (double)((size_t)chunks << 16) / best : 0;
    return 0;
}

static void cpu_destroy(muse_backend *be);

static const muse_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .write = cpu_write,
    .read = cpu_read,
    .begin_round = cpu_begin_round,
    .end_round = cpu_end_round,
    .embed = cpu_embed,
    .norm = cpu_norm,
    .add_norm = cpu_add_norm,
    .add_norm_norm = muse_backend_add_norm_norm_parts,
    .linear = cpu_linear,
    .linears = muse_backend_linears_parts,
    .swiglu_linear = muse_backend_swiglu_linear_parts,
    .qk_norm_rope = cpu_qk_norm_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .moe = cpu_moe,
    .all_reduce = cpu_all_reduce,
    .head = cpu_head,
    .sample = cpu_sample,
    .snapshot_save = cpu_snapshot_save,
    .snapshot_load = cpu_snapshot_load,
    .copy_bandwidth = cpu_copy_bandwidth,
};

static size_t exl3_ws_max(const muse_model *m, long rows)
{
    size_t best = 0;
    const muse_linear *ls[16];
    for (int64_t i = 0; i < m->cfg.num_layers; i++) {
        const muse_layer *ly = &m->layers[i];
        int n = 0;
        ls[n++] = &ly->q, ls[n++] = &ly->k, ls[n++] = &ly->v, ls[n++] = &ly->gate, ls[n++] = &ly->o;
        const muse_mlp *mlps[3] = {&ly->dense, ly->experts ? &ly->experts[0] : NULL, &ly->shared};
        for (int q = 0; q < 3; q++)
            if (mlps[q]) ls[n++] = &mlps[q]->gate, ls[n++] = &mlps[q]->up, ls[n++] = &mlps[q]->down;
        for (int q = 0; q < n; q++)
            if (ls[q]->kind == MUSE_LIN_EXL3) {
                size_t s = muse_exl3_workspace_bytes(&ls[q]->exl3, rows);
                if (s > best) best = s;
            }
    }
    if (m->head.kind == MUSE_LIN_EXL3) {
        size_t s = muse_exl3_workspace_bytes(&m->head.exl3, rows);
        if (s > best) best = s;
    }
    return best;
}

typedef struct {
    const muse_model *m;
    cpu_rank *rk;
    int rank, ranks, failed;
    uint64_t full_bytes, view_bytes;
    muse_err *e;
} view_job;

/* A rank's view of one linear, by the model's sharding rules. */
static void make_view(void *ctx, const muse_linear *l)
{
    view_job *j = ctx;
    int64_t lo, hi;
    muse_shard_range(j->m, l, j->rank, j->ranks, &lo, &hi);
    muse_linear *v = &j->rk->views[l->id];
    if (!j->failed && muse_shard_view(l, lo, hi, j->rank == 0, v, j->e)) j->failed = 1;
    j->full_bytes += muse_linear_bytes(l);
    j->view_bytes += muse_linear_bytes(v);
}

muse_backend *muse_cpu_backend_create(const muse_model *m, const muse_backend_opts *o, muse_err *e)
{
    const muse_config *cfg = &m->cfg;
    int ranks = o->ranks > 0 ? o->ranks : 1;
    if (ranks > MUSE_MAX_RANKS)
        return muse_fail(e, "--ranks %d: at most %d ranks in one process", ranks, MUSE_MAX_RANKS),
               NULL;
    int tp = o->tp_world > 1 && o->comm; /* one rank of a world of processes */
    int world = tp ? o->tp_world : ranks, first = tp ? o->tp_rank : 0;
    if (muse_shard_check(cfg, world, e)) return NULL;
    if (cfg->head_dim > 512)
        return muse_fail(e, "config.json: head_dim %lld exceeds the CPU backend's limit of 512",
                         (long long)cfg->head_dim),
               NULL;
    /* the router keeps a row and the expert scores on the stack */
    if (cfg->hidden_size > 16384 || cfg->num_experts > 4096)
        return muse_fail(e,
                         "config.json: hidden_size %lld or num_experts %lld exceeds the CPU "
                         "backend's limits (16384, 4096)",
                         (long long)cfg->hidden_size, (long long)cfg->num_experts),
               NULL;
    cpu_backend *c = MUSE_CALLOC(1, sizeof *c);
    c->base.ops = &cpu_ops;
    c->base.masks = 1; /* draw_rows applies the round's token masks */
    if (muse_backend_init_common(&c->base, m, o, e)) {
        free(c);
        return NULL;
    }
    c->n_ranks = ranks;
    c->world = world;
    c->first_rank = first;
    c->comm = tp ? o->comm : NULL;
    /* each rank: only its shard of the weights (views of the mmap'd tensors), its KV heads */
    for (int r = 0; r < ranks; r++) {
        cpu_rank *rk = &c->rank[r];
        rk->views = MUSE_CALLOC((size_t)m->n_linears, sizeof *rk->views);
        view_job vj = {m, rk, first + r, world, 0, 0, 0, e};
        muse_model_each_linear(m, make_view, &vj);
        if (vj.failed) {
            for (int q = 0; q <= r; q++) free(c->rank[q].views);
            muse_kv_pool_destroy(&c->base.kv);
            free(c);
            return NULL;
        }
        /* the replicated tensors (embeddings, norms, router) on every rank, plus its shard */
        c->base.ranks[r].weights = muse_st_total_bytes(m->st) - vj.full_bytes + vj.view_bytes;
        muse_shard_heads(cfg, first + r, world, &rk->heads);
        rk->kv_width = (long)((rk->heads.kv1 - rk->heads.kv0) * cfg->head_dim);
    }
    muse_rank_mem *mem = &c->base.ranks[0];
    c->pool = muse_pool_create(o->threads);
    c->threads = muse_pool_threads(c->pool);
    long H = (long)cfg->hidden_size, R = o->max_rows, E = (long)cfg->num_experts;
    long K = (long)cfg->num_experts_per_tok;
    long Imoe = (long)(cfg->moe_intermediate_size *
                       (cfg->num_shared_experts > 1 ? cfg->num_shared_experts : 1));
    long widest = H;
    if ((long)cfg->intermediate_size > widest) widest = (long)cfg->intermediate_size;
    if (Imoe > widest) widest = Imoe;
    if ((long)(cfg->n_heads * cfg->head_dim) > widest)
        widest = (long)(cfg->n_heads * cfg->head_dim);
    c->scratch_floats = (size_t)widest;
    c->scratch = MUSE_CALLOC((size_t)c->threads, sizeof *c->scratch);
    c->attn_scratch = MUSE_CALLOC((size_t)c->threads, sizeof *c->attn_scratch);
    c->samplers = MUSE_CALLOC((size_t)c->threads, sizeof *c->samplers);
    for (int t = 0; t < c->threads; t++) {
        c->scratch[t] = MUSE_MALLOC(c->scratch_floats * sizeof(float));
        c->attn_scratch[t] = MUSE_MALLOC((size_t)(o->context + cfg->head_dim) * sizeof(double));
        c->samplers[t] = muse_sampler_create(cfg->vocab_size);
        MUSE_CHECK(c->samplers[t]);
        mem->workspace += c->scratch_floats * sizeof(float) +
                          (size_t)(o->context + cfg->head_dim) * sizeof(double);
    }
    size_t ws = exl3_ws_max(m, R);
    c->exl3_ws = ws ? MUSE_MALLOC(ws) : NULL;
    mem->workspace += ws;
    long L = (long)cfg->num_layers;
    c->kv_cap = MUSE_CALLOC((size_t)L, sizeof *c->kv_cap);
    int64_t n_blocks = c->base.kv.n_blocks;
    for (long i = 0; i < L; i++)
        if (cfg->attn_kind[i] == MUSE_ATTN_SLIDING) {
            int64_t cap = o->context;
            /* a ring: a chunk never overwrites keys it reads */
            if (cfg->sliding_window + R - 1 < cap) cap = cfg->sliding_window + R - 1;
            c->kv_cap[i] = cap;
        }
    size_t snap = (size_t)o->snapshot_slots * c->base.snapshot_bytes;
    for (int r = 0; r < ranks; r++) {
        cpu_rank *rk = &c->rank[r];
        muse_rank_mem *rm = &c->base.ranks[r];
        rk->k_cache = MUSE_CALLOC((size_t)L, sizeof *rk->k_cache);
        rk->v_cache = MUSE_CALLOC((size_t)L, sizeof *rk->v_cache);
        for (long i = 0; i < L; i++) {
            size_t rows = c->kv_cap[i] ? (size_t)o->max_seqs * (size_t)c->kv_cap[i]
                                       : (size_t)n_blocks * MUSE_KV_BLOCK;
            size_t n = rows * (size_t)rk->kv_width;
            *(c->kv_cap[i] ? &rm->sliding : &rm->kv) += 2 * n * sizeof(uint16_t);
            rk->k_cache[i] = MUSE_CALLOC(n, sizeof(uint16_t));
            rk->v_cache[i] = MUSE_CALLOC(n, sizeof(uint16_t));
        }
        rk->snapshots = MUSE_MALLOC(snap ? snap : 1);
        rm->snapshots = snap;
    }
    c->router_logits = MUSE_MALLOC((size_t)(R * E) * sizeof(float));
    c->sel = MUSE_MALLOC((size_t)(R * K) * sizeof(int32_t));
    c->sel_w = MUSE_MALLOC((size_t)(R * K) * sizeof(float));
    c->rows_of = MUSE_MALLOC((size_t)R * sizeof(int32_t));
    c->xg = MUSE_MALLOC((size_t)(R * H) * sizeof(float));
    c->zg = MUSE_MALLOC((size_t)(R * H) * sizeof(float));
    c->zr = MUSE_MALLOC((size_t)(R * H) * sizeof(float));
    c->xsel = MUSE_MALLOC((size_t)(R * H) * sizeof(float));
    if (c->comm && c->comm->rank == 0) {
        c->head_parts = MUSE_MALLOC((size_t)R * (size_t)m->head.n * sizeof(float));
        mem->workspace += (size_t)R * (size_t)m->head.n * sizeof(float);
    }
    c->eg = MUSE_MALLOC((size_t)(R * Imoe) * sizeof(float));
    c->eu = MUSE_MALLOC((size_t)(R * Imoe) * sizeof(float));
    c->ea = MUSE_MALLOC((size_t)(R * Imoe) * sizeof(float));
    mem->workspace +=
        (size_t)R * ((size_t)E * 4 + (size_t)K * 8 + 4 + (size_t)H * 12 + (size_t)Imoe * 12);
    muse_round_stage_place(&c->stage, &c->base, MUSE_MALLOC(muse_round_stage_bytes(&c->base)));
    c->drawn = MUSE_MALLOC((size_t)R * sizeof *c->drawn);
    size_t tables = (size_t)o->max_seqs * (size_t)c->base.kv.blocks_per_seq;
    mem->staging = (size_t)R * (4 * 4 + 8 * 2 + sizeof(muse_sampling)) + tables * 4;
    return &c->base;
}

static void cpu_destroy(muse_backend *be)
{
    cpu_backend *c = cpu(be);
    muse_pool_destroy(c->pool);
    for (int t = 0; t < c->threads; t++) {
        free(c->scratch[t]);
        free(c->attn_scratch[t]);
        muse_sampler_destroy(c->samplers[t]);
    }
    free(c->scratch);
    free(c->attn_scratch);
    free(c->samplers);
    free(c->exl3_ws);
    for (int i = 0; i < c->n_acts; i++)
        for (int r = 0; r < c->n_ranks; r++) free(c->acts[i][r]);
    free(c->acts);
    free(c->act_width);
    free(c->act_cols);
    for (int r = 0; r < c->n_ranks; r++) {
        cpu_rank *rk = &c->rank[r];
        for (int64_t i = 0; i < be->model->cfg.num_layers; i++) {
            free(rk->k_cache[i]);
            free(rk->v_cache[i]);
        }
        free(rk->k_cache);
        free(rk->v_cache);
        free(rk->snapshots);
        free(rk->views);
    }
    muse_kv_pool_destroy(&be->kv);
    free(c->kv_cap);
    free(c->router_logits);
    free(c->sel);
    free(c->sel_w);
    free(c->rows_of);
    free(c->xg);
    free(c->zg);
    free(c->zr);
    free(c->xsel);
    free(c->head_parts);
    free(c->eg);
    free(c->eu);
    free(c->ea);
    free(c->stage.block);
    free(c->drawn);
    free(c);
}
