/* The CPU reference backend: every operation of backend.h in plain C with fp32 sums in a
 * fixed order, so a row's result never depends on the batch, the chunking or the threads. */
#include <math.h>

#include "backend/backend.h"
#include "base/threadpool.h"

typedef struct {
    muse_backend base;
    muse_pool *pool;
    int threads;
    float **scratch;       /* [threads][scratch_floats] */
    double **attn_scratch; /* [threads][context + head_dim]: scores, then the sum of V */
    size_t scratch_floats;
    void *exl3_ws;  /* EXL3 linear workspace, sized for the largest linear */
    float **allocs; /* every alloc(), freed at destroy */
    size_t n_allocs;
    /* KV cache, per layer, fp16: sliding layers a ring [max_seqs][cap][KV]; full layers
     * (cap 0) blocks [n_blocks][MUSE_KV_BLOCK][KV] found through the block tables */
    int64_t *kv_cap;
    uint16_t **k_cache, **v_cache;
    /* MoE workspace */
    float *router_logits; /* [R, E] */
    int32_t *sel;         /* [R, k] selected experts */
    float *sel_w;         /* [R, k] their weights */
    int32_t *rows_of;     /* [R] rows routed to one expert */
    float *xg, *zg;       /* [R, H] gathered inputs, expert outputs */
    float *eg, *eu, *ea;  /* [R, I_moe max] */
    float *xsel;          /* [R, H] head inputs of the wanted rows */
} cpu_backend;

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

static float *cpu_alloc(muse_backend *be, size_t floats)
{
    cpu_backend *c = cpu(be);
    c->allocs = realloc(c->allocs, (c->n_allocs + 1) * sizeof *c->allocs);
    MUSE_CHECK(c->allocs);
    float *p = MUSE_CALLOC(floats, sizeof(float));
    c->allocs[c->n_allocs++] = p;
    be->workspace_bytes += floats * sizeof(float);
    return p;
}

static void cpu_embed(muse_backend *be, const muse_batch *b, float *out)
{
    const muse_model *m = be->model;
    long H = (long)m->cfg.hidden_size;
    for (long r = 0; r < b->rows; r++) {
        float *row = out + r * H;
        muse_model_embed_row(m, b->tokens[r], row);
        double s = rms_scale(row, H, m->cfg.rms_norm_eps);
        for (long j = 0; j < H; j++) row[j] = (float)(row[j] * s);
    }
}

static void cpu_norm(muse_backend *be, const float *x, long rows, long width, const float *w,
                     muse_norm_weight mode, float eps, int round16, float *out)
{
    (void)be;
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

static void cpu_add_norm(muse_backend *be, float *h, const float *y, long rows, long width,
                         const float *w, float eps)
{
    (void)be;
    for (long r = 0; r < rows; r++) {
        const float *yr = y + r * width;
        double s = rms_scale(yr, width, eps);
        for (long j = 0; j < width; j++) h[r * width + j] += (float)(yr[j] * s) * (1.0f + w[j]);
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

static void cpu_linear(muse_backend *be, const muse_linear *l, const float *x, long rows,
                       int round16, float *y)
{
    cpu_backend *c = cpu(be);
    if (l->kind == MUSE_LIN_EXL3) {
        muse_exl3_linear(&l->exl3, x, rows, y, c->exl3_ws, c->pool);
        if (round16)
            for (long i = 0; i < rows * (long)l->n; i++) y[i] = muse_round_f16(y[i]);
        return;
    }
    dense_job j = {c, l, x, rows, round16, y};
    muse_pool_run_t(c->pool, dense_cols, &j, (long)l->n);
}

static void cpu_qk_norm_rope(muse_backend *be, float *x, const muse_batch *b, long heads,
                             long head_dim, double theta, float eps)
{
    (void)be;
    long half = head_dim / 2;
    for (long r = 0; r < b->rows; r++) {
        double p = (double)b->positions[r];
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

typedef struct {
    cpu_backend *c;
    int layer;
    const muse_batch *b;
    const float *q, *g;
    float *o;
} attn_job;

/* Element offset of position s of seq in a layer's cache: a ring slot or a block row. */
static inline size_t kv_offset(const cpu_backend *c, int layer, int seq, int64_t s, long KV)
{
    int64_t cap = c->kv_cap[layer];
    if (cap > 0) return ((size_t)seq * (size_t)cap + (size_t)(s % cap)) * (size_t)KV;
    int32_t blk = muse_kv_table(&c->base.kv, seq)[s / MUSE_KV_BLOCK];
    MUSE_CHECK(blk >= 0); /* the caller reserves blocks before a forward */
    return ((size_t)blk * MUSE_KV_BLOCK + (size_t)(s % MUSE_KV_BLOCK)) * (size_t)KV;
}

/* One (row, query head) per index: scores over the visible keys in position order. */
static void attn_rows(void *ctx, long begin, long end, int thread)
{
    attn_job *j = ctx;
    const muse_config *cfg = &j->c->base.model->cfg;
    long hd = (long)cfg->head_dim, Hq = (long)cfg->n_heads, Hkv = (long)cfg->n_kv_heads;
    long KV = Hkv * hd, group = Hq / Hkv;
    bool sliding = cfg->attn_kind[j->layer] == MUSE_ATTN_SLIDING;
    double scale = cfg->qk_scale_factor / sqrt((double)hd);
    double *scores = j->c->attn_scratch[thread];
    double *acc = scores + j->c->base.opts.context;
    for (long t = begin; t < end; t++) {
        long r = t / Hq, h = t % Hq, kh = h / group;
        int64_t p = j->b->positions[r];
        int64_t first =
            sliding && p - cfg->sliding_window + 1 > 0 ? p - cfg->sliding_window + 1 : 0;
        const uint16_t *kc = j->c->k_cache[j->layer], *vc = j->c->v_cache[j->layer];
        int seq = j->b->seqs[r];
        const float *q = j->q + (r * Hq + h) * hd;
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
        const float *g = j->g + (r * Hq + h) * hd;
        float *o = j->o + (r * Hq + h) * hd;
        for (long d = 0; d < hd; d++) o[d] = muse_round_f16((float)acc[d] * sigmoid_f(g[d]));
    }
}

static void cpu_attention(muse_backend *be, int layer, const muse_batch *b, const float *q,
                          const float *k, const float *v, const float *g, float *o)
{
    cpu_backend *c = cpu(be);
    const muse_config *cfg = &be->model->cfg;
    long KV = (long)(cfg->n_kv_heads * cfg->head_dim);
    for (long r = 0; r < b->rows; r++) {
        size_t at = kv_offset(c, layer, b->seqs[r], b->positions[r], KV);
        for (long d = 0; d < KV; d++) {
            c->k_cache[layer][at + d] = muse_f32_to_f16(k[r * KV + d]);
            c->v_cache[layer][at + d] = muse_f32_to_f16(v[r * KV + d]);
        }
    }
    attn_job j = {c, layer, b, q, g, o};
    muse_pool_run_t(c->pool, attn_rows, &j, b->rows * (long)cfg->n_heads);
}

static void cpu_swiglu(muse_backend *be, const float *gate, const float *up, long n, float *out)
{
    (void)be;
    for (long i = 0; i < n; i++) {
        double gv = gate[i];
        out[i] = muse_round_f16((float)(gv / (1.0 + exp(-gv))) * up[i]);
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
    muse_linear fake = {.kind = MUSE_LIN_DENSE, .k = j->H, .n = j->E, .w = t};
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
        key[x] = ly->router_bias ? s[x] + ly->router_bias[x] : s[x];
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

static void run_mlp(muse_backend *be, const muse_mlp *mlp, const float *x, long rows, long I,
                    float *g, float *u, float *a, float *out)
{
    cpu_linear(be, &mlp->gate, x, rows, 1, g);
    cpu_linear(be, &mlp->up, x, rows, 1, u);
    cpu_swiglu(be, g, u, rows * I, a);
    cpu_linear(be, &mlp->down, a, rows, 0, out);
}

static void cpu_moe(muse_backend *be, const muse_layer *ly, const float *b, long rows, float *y)
{
    cpu_backend *c = cpu(be);
    const muse_config *cfg = &be->model->cfg;
    long H = (long)cfg->hidden_size, E = (long)cfg->num_experts, K = (long)cfg->num_experts_per_tok;
    long I = (long)cfg->moe_intermediate_size;
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
        run_mlp(be, &ly->experts[x], c->xg, n, I, c->eg, c->eu, c->ea, c->zg);
        if (cfg->expert_output_norm)
            cpu_norm(be, c->zg, n, H, ly->expert_norm[x], MUSE_NORM_PLUS1, (float)cfg->rms_norm_eps,
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
        run_mlp(be, &ly->shared, b, rows, I * (long)cfg->num_shared_experts, c->eg, c->eu, c->ea,
                c->zg);
        for (long i = 0; i < rows * H; i++) y[i] += c->zg[i];
    }
}

static void cpu_head(muse_backend *be, const float *x, const muse_batch *b, float *logits)
{
    cpu_backend *c = cpu(be);
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, V = (long)cfg->vocab_size, N = (long)m->head.n, n = 0;
    for (long r = 0; r < b->rows; r++)
        if (!b->want_logits || b->want_logits[r])
            memcpy(c->xsel + (n++) * H, x + r * H, (size_t)H * sizeof(float));
    if (!n) return;
    cpu_linear(be, &m->head, c->xsel, n, 0, logits);
    double mult = cfg->output_multiplier, cap = cfg->final_logit_softcapping;
    for (long r = 0; r < n; r++)
        for (long j = 0; j < V; j++) {
            double z = (double)logits[r * N + j] * mult;
            logits[r * V + j] = (float)(cap > 0 ? cap * tanh(z / cap) : z);
        }
}

/* Positions [first, end_pos) a resumed sequence needs from the sliding layers. */
static int64_t sliding_first(const muse_config *cfg, int64_t end_pos)
{
    return end_pos > cfg->sliding_window ? end_pos - cfg->sliding_window : 0;
}

static size_t cpu_sliding_bytes(muse_backend *be, int64_t end_pos)
{
    const muse_config *cfg = &be->model->cfg;
    size_t layers = 0, KV = (size_t)(cfg->n_kv_heads * cfg->head_dim);
    for (int64_t i = 0; i < cfg->num_layers; i++) layers += cfg->attn_kind[i] == MUSE_ATTN_SLIDING;
    return layers * 2 * (size_t)(end_pos - sliding_first(cfg, end_pos)) * KV * sizeof(uint16_t);
}

/* Copies K then V of each sliding layer, positions ascending, between the rings and buf. */
static void sliding_copy(cpu_backend *c, int seq, int64_t end_pos, uint16_t *buf, int save)
{
    const muse_config *cfg = &c->base.model->cfg;
    long KV = (long)(cfg->n_kv_heads * cfg->head_dim);
    for (int i = 0; i < (int)cfg->num_layers; i++) {
        if (cfg->attn_kind[i] != MUSE_ATTN_SLIDING) continue;
        for (int kv = 0; kv < 2; kv++) {
            uint16_t *cache = kv ? c->v_cache[i] : c->k_cache[i];
            for (int64_t s = sliding_first(cfg, end_pos); s < end_pos; s++, buf += KV) {
                uint16_t *row = cache + kv_offset(c, i, seq, s, KV);
                if (save)
                    memcpy(buf, row, (size_t)KV * sizeof *buf);
                else
                    memcpy(row, buf, (size_t)KV * sizeof *buf);
            }
        }
    }
}

static void cpu_sliding_save(muse_backend *be, int seq, int64_t end_pos, void *dst)
{
    sliding_copy(cpu(be), seq, end_pos, dst, 1);
}

static void cpu_sliding_load(muse_backend *be, int seq, int64_t end_pos, const void *src)
{
    sliding_copy(cpu(be), seq, end_pos, (uint16_t *)(uintptr_t)src, 0);
}

static const muse_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .embed = cpu_embed,
    .norm = cpu_norm,
    .add_norm = cpu_add_norm,
    .linear = cpu_linear,
    .qk_norm_rope = cpu_qk_norm_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .moe = cpu_moe,
    .head = cpu_head,
    .sliding_bytes = cpu_sliding_bytes,
    .sliding_save = cpu_sliding_save,
    .sliding_load = cpu_sliding_load,
};

uint64_t muse_kv_bytes_per_token(const muse_config *c)
{
    return (uint64_t)c->num_layers * 2 * (uint64_t)(c->n_kv_heads * c->head_dim) * 2;
}

uint64_t muse_kv_full_bytes_per_token(const muse_config *c)
{
    uint64_t layers = 0;
    for (int64_t i = 0; i < c->num_layers; i++) layers += c->attn_kind[i] == MUSE_ATTN_FULL;
    return layers * 2 * (uint64_t)(c->n_kv_heads * c->head_dim) * 2;
}

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

muse_backend *muse_cpu_backend_create(const muse_model *m, const muse_backend_opts *o, muse_err *e)
{
    const muse_config *cfg = &m->cfg;
    if (o->max_rows <= 0 || o->max_seqs <= 0 || o->context <= 0)
        return muse_fail(e, "backend: max rows, sequences and context must be positive"), NULL;
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
    c->base.model = m;
    c->base.opts = *o;
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
    for (int t = 0; t < c->threads; t++) {
        c->scratch[t] = MUSE_MALLOC(c->scratch_floats * sizeof(float));
        c->attn_scratch[t] = MUSE_MALLOC((size_t)(o->context + cfg->head_dim) * sizeof(double));
    }
    size_t ws = exl3_ws_max(m, R);
    c->exl3_ws = ws ? MUSE_MALLOC(ws) : NULL;
    long L = (long)cfg->num_layers, KV = (long)(cfg->n_kv_heads * cfg->head_dim);
    c->kv_cap = MUSE_CALLOC((size_t)L, sizeof *c->kv_cap);
    c->k_cache = MUSE_CALLOC((size_t)L, sizeof *c->k_cache);
    c->v_cache = MUSE_CALLOC((size_t)L, sizeof *c->v_cache);
    int64_t blocks_per_seq = (o->context + MUSE_KV_BLOCK - 1) / MUSE_KV_BLOCK;
    int64_t n_blocks = o->kv_blocks > 0 ? o->kv_blocks : o->max_seqs * blocks_per_seq;
    muse_kv_pool_init(&c->base.kv, (int32_t)n_blocks, o->max_seqs, o->context);
    for (long i = 0; i < L; i++) {
        size_t n;
        if (cfg->attn_kind[i] == MUSE_ATTN_SLIDING) {
            int64_t cap = o->context;
            if (cfg->sliding_window + R - 1 < cap)
                cap = cfg->sliding_window + R -
                      1; /* a ring: a chunk never overwrites keys it reads */
            c->kv_cap[i] = cap;
            n = (size_t)o->max_seqs * (size_t)cap * (size_t)KV;
        } else {
            n = (size_t)n_blocks * MUSE_KV_BLOCK * (size_t)KV;
            c->base.kv_block_bytes += 2 * MUSE_KV_BLOCK * (uint64_t)KV * sizeof(uint16_t);
        }
        c->base.kv_bytes += 2 * n * sizeof(uint16_t);
        c->k_cache[i] = MUSE_CALLOC(n, sizeof(uint16_t));
        c->v_cache[i] = MUSE_CALLOC(n, sizeof(uint16_t));
    }
    c->router_logits = MUSE_MALLOC((size_t)(R * E) * sizeof(float));
    c->sel = MUSE_MALLOC((size_t)(R * K) * sizeof(int32_t));
    c->sel_w = MUSE_MALLOC((size_t)(R * K) * sizeof(float));
    c->rows_of = MUSE_MALLOC((size_t)R * sizeof(int32_t));
    c->xg = MUSE_MALLOC((size_t)(R * H) * sizeof(float));
    c->zg = MUSE_MALLOC((size_t)(R * H) * sizeof(float));
    c->xsel = MUSE_MALLOC((size_t)(R * H) * sizeof(float));
    c->eg = MUSE_MALLOC((size_t)(R * Imoe) * sizeof(float));
    c->eu = MUSE_MALLOC((size_t)(R * Imoe) * sizeof(float));
    c->ea = MUSE_MALLOC((size_t)(R * Imoe) * sizeof(float));
    return &c->base;
}

void muse_cpu_backend_destroy(muse_backend *be)
{
    if (!be) return;
    cpu_backend *c = cpu(be);
    muse_pool_destroy(c->pool);
    for (int t = 0; t < c->threads; t++) {
        free(c->scratch[t]);
        free(c->attn_scratch[t]);
    }
    free(c->scratch);
    free(c->attn_scratch);
    free(c->exl3_ws);
    for (size_t i = 0; i < c->n_allocs; i++) free(c->allocs[i]);
    free(c->allocs);
    for (int64_t i = 0; i < be->model->cfg.num_layers; i++) {
        free(c->k_cache[i]);
        free(c->v_cache[i]);
    }
    muse_kv_pool_destroy(&be->kv);
    free(c->kv_cap);
    free(c->k_cache);
    free(c->v_cache);
    free(c->router_logits);
    free(c->sel);
    free(c->sel_w);
    free(c->rows_of);
    free(c->xg);
    free(c->zg);
    free(c->xsel);
    free(c->eg);
    free(c->eu);
    free(c->ea);
    free(c);
}
