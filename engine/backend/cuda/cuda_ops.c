/* The CUDA backend's operations: each op of backend.h on every rank's stream through the
 * kernels of kernels/, and the ops table. */

#include <math.h>

#include "backend/cuda/cuda_internal.h"
#include "kernels/linear_fast.cuh"

#include "kernels/attention.cuh"
#include "kernels/attention_fast.cuh"
#include "kernels/embed.cuh"
#include "kernels/embed_fast.cuh"
#include "kernels/head.cuh"
#include "kernels/linear.cuh"
#include "kernels/moe.cuh"
#include "kernels/moe_combine_fast.cuh"
#include "kernels/moe_fast.cuh"
#include "kernels/norm.cuh"
#include "kernels/norm_fast.cuh"
#include "kernels/qk_rope.cuh"
#include "kernels/qk_rope_fast.cuh"
#include "kernels/sample.cuh"
#include "kernels/sample_fast.cuh"
#include "kernels/swiglu.cuh"
#include "kernels/swiglu_fast.cuh"

/* Whether the small operations take their fast kernels (chosen at start: a row's path never
 * depends on its batch). */
static int fast_small(const cuda_backend *c)
{
    return c->base.kernels == MUSE_KERNELS_FAST;
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
        muse_k_ctx kc = kctx(rk, c->rows);
        const void *table = dev_ptr(c, rk, m->embed->data);
        int dt = kdtype(m->embed->dtype);
        if (fast_small(c))
            CHECK(c, muse_k_embed_fast(&kc, table, dt, H, m->cfg.rms_norm_eps, act_r(c, out, r)));
        else
            CHECK(c, muse_k_embed(&kc, table, dt, H, m->cfg.rms_norm_eps, act_r(c, out, r)));
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

/* A norm's weight mode as the kernels name it. */
static int kmode_of(muse_norm_weight mode)
{
    return mode == MUSE_NORM_PLUS1   ? MUSE_K_NORM_PLUS1
           : mode == MUSE_NORM_PLAIN ? MUSE_K_NORM_PLAIN
                                     : MUSE_K_NORM_NONE;
}

static void cuda_norm(muse_backend *be, muse_act x, long width, const muse_vec *w,
                      muse_norm_weight mode, float eps, int round16, muse_act out)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    int kmode = kmode_of(mode);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        muse_k_ctx kc = kctx(rk, c->rows);
        const float *wv = mode == MUSE_NORM_NONE ? NULL : vec(c, rk, w);
        if (fast_small(c))
            CHECK(c, muse_k_norm_fast(&kc, act_r(c, x, r), width, wv, kmode, (double)eps, round16,
                                      act_r(c, out, r)));
        else
            CHECK(c, muse_k_norm(&kc, act_r(c, x, r), width, wv, 0, NULL, kmode, (double)eps,
                                 round16, act_r(c, out, r)));
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
        muse_k_ctx kc = kctx(rk, c->rows);
        if (fast_small(c))
            CHECK(c, muse_k_add_norm_fast(&kc, act_r(c, h, r), act_r(c, y, r), width, vec(c, rk, w),
                                          (double)eps));
        else
            CHECK(c, muse_k_add_norm(&kc, act_r(c, h, r), act_r(c, y, r), width, vec(c, rk, w),
                                     (double)eps));
    }
    prof_end(c, PROF_ADD_NORM);
}

/* add_norm and the norm after it in one fast launch; the exact path runs the two ops. */
static void cuda_add_norm_norm(muse_backend *be, muse_act h, muse_act y, long width,
                               const muse_vec *w, float eps, const muse_vec *next_w,
                               muse_norm_weight next_mode, float next_eps, muse_act out)
{
    cuda_backend *c = cu(be);
    if (!fast_small(c)) {
        muse_backend_add_norm_norm_parts(be, h, y, width, w, eps, next_w, next_mode, next_eps, out);
        return;
    }
    if (c->failed) return;
    prof_begin(c);
    int kmode = kmode_of(next_mode);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        muse_k_ctx kc = kctx(rk, c->rows);
        const float *nw = next_mode == MUSE_NORM_NONE ? NULL : vec(c, rk, next_w);
        CHECK(c, muse_k_add_norm_norm_fast(&kc, act_r(c, h, r), act_r(c, y, r), width,
                                           vec(c, rk, w), (double)eps, nw, kmode, (double)next_eps,
                                           act_r(c, out, r)));
        c->act_cols[out][r] = width;
    }
    prof_end(c, PROF_ADD_NORM_NORM);
}

/* y = x W over rows rows with rank rk's descriptor of linear l (x rows of its k floats), y rows
 * at y_stride (its n unless the head lays its slice into a wider row). */
static void run_linear(cuda_backend *c, cuda_rank *rk, const muse_linear *l, const float *x,
                       long rows, int round16, float *y, long y_stride)
{
    const muse_k_lin *d = &rk->lin[l->id];
    if (cuda_fast_fits(c, &l, 1, MUSE_K_EPI_NONE)) {
        cuda_fast_run(c, rk, 0, &l, 1, x, (long)d->k, rows, round16, &y, &y_stride,
                      MUSE_K_EPI_NONE);
        return;
    }
    muse_k_ctx kc = kctx(rk, rows);
    CHECK(c, muse_k_linear(&kc, rk->lin_dev + l->id, d, NULL, NULL, x, (long)d->k, round16, y,
                           y_stride, rk->ws_a, rk->ws_t));
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
    prof_end(c, c->rank[0].lin[l->id].kind == MUSE_K_EXL3 ? PROF_LINEAR_EXL3 : PROF_LINEAR_DENSE);
}

/* The linears of one input in one fast launch a step where the fast kernel takes them all,
 * else one linear after another (the exact path, or a shape it does not take). */
static void cuda_linears(muse_backend *be, int n, const muse_linear *const *ls, muse_act x,
                         int round16, const muse_act *ys)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    if (!cuda_fast_fits(c, ls, n, MUSE_K_EPI_NONE)) {
        muse_backend_linears_parts(be, n, ls, x, round16, ys);
        return;
    }
    prof_begin(c);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        float *y[MUSE_MAX_FUSED];
        long stride[MUSE_MAX_FUSED];
        for (int i = 0; i < n; i++) {
            y[i] = act_r(c, ys[i], r);
            stride[i] = (long)rk->lin[ls[i]->id].n;
            c->act_cols[ys[i]][r] = stride[i];
        }
        cuda_fast_run(c, rk, 0, ls, n, act_r(c, x, r), (long)rk->lin[ls[0]->id].k, c->rows, round16,
                      y, stride, MUSE_K_EPI_NONE);
    }
    prof_end(c, PROF_LINEARS);
}

/* gate and up with the swiglu epilogue in one fast call, else linear, linear, swiglu. */
static void cuda_swiglu_linear(muse_backend *be, const muse_linear *gate, const muse_linear *up,
                               muse_act x, muse_act g, muse_act u, muse_act out)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    const muse_linear *gu[2] = {gate, up};
    if (!cuda_fast_fits(c, gu, 2, MUSE_K_EPI_SWIGLU)) {
        muse_backend_swiglu_linear_parts(be, gate, up, x, g, u, out);
        return;
    }
    prof_begin(c);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        long n = (long)rk->lin[gate->id].n;
        float *y[2] = {act_r(c, out, r), NULL};
        long stride[2] = {n, n};
        cuda_fast_run(c, rk, 0, gu, 2, act_r(c, x, r), (long)rk->lin[gate->id].k, c->rows, 1, y,
                      stride, MUSE_K_EPI_SWIGLU);
        c->act_cols[out][r] = n;
    }
    prof_end(c, PROF_SWIGLU_LINEAR);
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
        muse_k_ctx kc = kctx(rk, c->rows);
        long hr = c->act_cols[x][r] / head_dim; /* the heads this rank's buffer holds */
        if (fast_small(c))
            CHECK(c,
                  muse_k_qk_norm_rope_fast(&kc, act_r(c, x, r), hr, head_dim, theta, (double)eps));
        else
            CHECK(c, muse_k_qk_norm_rope(&kc, act_r(c, x, r), hr, head_dim, theta, (double)eps));
    }
    prof_end(c, PROF_QK_NORM_ROPE);
}

static muse_k_kv layer_kv(cuda_backend *c, const cuda_rank *rk, int layer)
{
    muse_k_kv kv = {rk->k_cache[layer], rk->v_cache[layer],        c->kv_cap[layer],
                    rk->d_tables,       c->base.kv.blocks_per_seq, rk->kv_width};
    return kv;
}

/* Each rank norms and ropes the q and k heads its buffers hold, writes its KV heads to its cache
 * (taking them out of a whole k, v when it computed all heads) and attends with its query heads;
 * query head h of the rank reads its cache's head h / group (its heads start on a group
 * boundary, or share one KV head). The fast path does the first three in one launch. */
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
    double theta = cfg->rope_theta_layer[layer], eps = (double)(float)cfg->rms_norm_eps;
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        long KV = rk->kv_width, kw = c->act_cols[k][r];
        long off = kw == KV ? 0 : (long)rk->heads.kv0 * hd; /* a whole k: its heads from there */
        long hq = (long)(rk->heads.q1 - rk->heads.q0);      /* the q heads it ropes and reads */
        muse_k_kv kv = layer_kv(c, rk, layer);
        muse_k_ctx kc = kctx(rk, c->rows);
        static int one = -1; /* MUSE_FAST_ATTN_IN=0: three launches (read once a process) */
        if (one < 0) one = cuda_env_on("MUSE_FAST_ATTN_IN");
        if (fast_small(c) && !one) {
            CHECK(c, muse_k_qk_norm_rope_fast(&kc, act_r(c, q, r), hq, hd, theta, eps));
            CHECK(c, muse_k_qk_norm_rope_fast(&kc, act_r(c, k, r), kw / hd, hd, theta, eps));
            CHECK(c, muse_k_kv_write(&kc, kv, act_r(c, k, r) + off, act_r(c, v, r) + off, kw));
        } else if (fast_small(c)) {
            CHECK(c, muse_k_attn_in_fast(&kc, act_r(c, q, r), hq, act_r(c, k, r), kw / hd,
                                         act_r(c, v, r), hd, off, kv, theta, eps));
        } else {
            CHECK(c, muse_k_qk_norm_rope(&kc, act_r(c, q, r), hq, hd, theta, eps));
            CHECK(c, muse_k_qk_norm_rope(&kc, act_r(c, k, r), kw / hd, hd, theta, eps));
            CHECK(c, muse_k_kv_write(&kc, kv, act_r(c, k, r) + off, act_r(c, v, r) + off, kw));
        }
        if (c->base.kernels == MUSE_KERNELS_FAST && rk->ws_attn) /* shape fits: cuda_attn.c */
            CHECK(c,
                  muse_k_attention_fast(&kc, kv, act_r(c, q, r), act_r(c, g, r), act_r(c, o, r), hq,
                                        hd, Hq / Hkv, window, scale, cuda_attn_max_len(c, layer),
                                        rk->ws_attn, rk->ws_attn_bytes));
        else
            CHECK(c, muse_k_attention(&kc, kv, act_r(c, q, r), act_r(c, g, r), act_r(c, o, r), hq,
                                      hd, Hq / Hkv, window, scale));
        c->act_cols[o][r] = hq * hd;
    }
    prof_end(c, window ? PROF_ATTN_SLIDING : PROF_ATTN_FULL);
}

static void cuda_swiglu(muse_backend *be, muse_act gate, muse_act up, long width, muse_act out)
{
    cuda_backend *c = cu(be);
    (void)width;
    if (c->failed) return;
    prof_begin(c);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        long w = c->act_cols[gate][r];     /* the rank's share of the intermediate width */
        muse_k_ctx kc = kctx(rk, c->rows); /* c->rows * w elements */
        if (fast_small(c))
            CHECK(c,
                  muse_k_swiglu_fast(&kc, act_r(c, gate, r), act_r(c, up, r), w, act_r(c, out, r)));
        else
            CHECK(c, muse_k_swiglu(&kc, act_r(c, gate, r), act_r(c, up, r), w, act_r(c, out, r)));
        c->act_cols[out][r] = w;
    }
    prof_end(c, PROF_SWIGLU);
}

/* gate, up, swiglu, down of one MLP over rows (row r of x at x_stride), per-row descriptors
 * (experts) or one linear's, on rank rk. */
static void run_mlp(cuda_backend *c, cuda_rank *rk, const muse_k_lin *descs[3],
                    const muse_k_lin *shape[3], const int32_t *row_desc, const int32_t *row_src,
                    const float *x, long x_stride, long rows, float *out)
{
    long I = (long)shape[0]->n, H = (long)shape[2]->n;
    muse_k_ctx kc = kctx(rk, rows);
    CHECK(c, muse_k_linear(&kc, descs[0], shape[0], row_desc, row_src, x, x_stride, 1, rk->eg, I,
                           rk->ws_a, rk->ws_t));
    CHECK(c, muse_k_linear(&kc, descs[1], shape[1], row_desc, row_src, x, x_stride, 1, rk->eu, I,
                           rk->ws_a, rk->ws_t));
    CHECK(c, muse_k_swiglu(&kc, rk->eg, rk->eu, I, rk->ea)); /* rows * I elements */
    CHECK(c, muse_k_linear(&kc, descs[2], shape[2], row_desc, NULL, rk->ea, I, 0, out, H, rk->ws_a,
                           rk->ws_t));
}

/* The shared experts of rows rows on rank rk into out: the fast gate/up + swiglu and down
 * where the fast path takes them (side: on the side stream), else run_mlp's exact launches. */
static void run_shared(cuda_backend *c, cuda_rank *rk, const muse_mlp *s, const float *b, long H,
                       long rows, float *out, int side)
{
    if (cuda_fast_mlp_fits(c, s)) {
        cuda_fast_mlp(c, rk, side, s, b, H, rows, rk->eg, out, (long)rk->lin[s->down.id].n);
        return;
    }
    const muse_k_lin *sd[3] = {rk->lin_dev + s->gate.id, rk->lin_dev + s->up.id,
                               rk->lin_dev + s->down.id};
    const muse_k_lin *ss[3] = {&rk->lin[s->gate.id], &rk->lin[s->up.id], &rk->lin[s->down.id]};
    run_mlp(c, rk, sd, ss, NULL, NULL, b, H, rows, out);
}

/* Router and selection per row (every rank the same), then every (row, slot) pair through the
 * rank's share of its expert and the shared experts; the ranks' partial outputs summed in rank
 * order (the CPU backend sums each expert's before its norm); then on every rank the expert
 * output norm and the weighted sum in ascending expert index, plus the shared experts. The
 * fast path: the block router and the experts grouped through the fast product (cuda_fast.c). */
static void cuda_moe(muse_backend *be, const muse_layer *ly, muse_act b_a, muse_act y_a)
{
    cuda_backend *c = cu(be);
    if (c->failed) return;
    prof_begin(c);
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, E = (long)cfg->num_experts, K = (long)cfg->num_experts_per_tok;
    long i = (long)(ly - m->layers), R = c->rows;
    int shared = cfg->num_shared_experts > 0, fast = cuda_fast_moe_fits(c, ly);
    /* the shared experts on the side stream, beside the router, the selection and the routed
     * experts (joined before the combine), where the rank has a side workspace (cuda_device.c) */
    int side = shared && fast && c->rank[0].ws_side && cuda_fast_mlp_fits(c, &ly->shared);
    float *zg[MUSE_MAX_RANKS], *zs[MUSE_MAX_RANKS];
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        const float *b = act_r(c, b_a, r);
        muse_k_ctx kc = kctx(rk, R);
        if (side && !CHECK(c, cudaEventRecord(rk->ev_fork, rk->st)) &&
            !CHECK(c, cudaStreamWaitEvent(rk->side, rk->ev_fork, 0))) {
            run_shared(c, rk, &ly->shared, b, H, R, rk->zs, 1);
            CHECK(c, cudaEventRecord(rk->ev_side, rk->side));
        }
        const void *router = dev_ptr(c, rk, ly->router->data);
        int rdt = kdtype(ly->router->dtype);
        if (be->kernels == MUSE_KERNELS_FAST)
            CHECK(c, muse_k_router_fast(&kc, b, H, router, rdt, E, rk->router_logits));
        else
            CHECK(c, muse_k_router(&kc, b, H, router, rdt, E, rk->router_logits));
        if (be->kernels == MUSE_KERNELS_FAST) /* with the experts' groups where they fit */
            cuda_fast_select(c, rk, ly, R, fast);
        else
            CHECK(c, muse_k_select(&kc, rk->router_logits, E, K, rk->router_bias[i],
                                   cfg->norm_topk_prob, (float)cfg->routed_scaling_factor, rk->sel,
                                   rk->sel_w));
        prof_split(c, PROF_MOE_ROUTER);
        if (fast) {
            cuda_fast_experts(c, rk, ly, b, H, R, rk->zg);
        } else {
            const muse_k_lin *ex = rk->experts + (size_t)i * (size_t)(3 * E);
            const muse_k_lin *descs[3] = {ex, ex + E, ex + 2 * E};
            const muse_k_lin *shape[3] = {&rk->lin[ly->experts[0].gate.id],
                                          &rk->lin[ly->experts[0].up.id],
                                          &rk->lin[ly->experts[0].down.id]};
            run_mlp(c, rk, descs, shape, rk->sel, rk->pair_src, b, H, R * K, rk->zg);
        }
        prof_split(c, PROF_MOE_ROUTED);
        if (side)
            CHECK(c, cudaStreamWaitEvent(rk->st, rk->ev_side, 0));
        else if (shared)
            run_shared(c, rk, &ly->shared, b, H, R, rk->zs, 0);
        prof_split(c, PROF_MOE_SHARED);
        zg[r] = rk->zg;
        zs[r] = rk->zs;
    }
    reduce(c, zg, R * K * H);
    if (shared) reduce(c, zs, R * H);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        muse_k_ctx pairs = kctx(rk, R * K), kc = kctx(rk, R);
        double eps = (double)(float)cfg->rms_norm_eps;
        if (fast && cuda_fast_norm_in(c, rk)) { /* the down's finish summed the squares */
            CHECK(c, muse_k_moe_combine_norm_fast(&kc, rk->sel, rk->sel_w, rk->zg, rk->zsq,
                                                  rk->expert_norm[i], eps, shared ? rk->zs : NULL,
                                                  K, H, act_r(c, y_a, r)));
            c->act_cols[y_a][r] = H;
            continue;
        }
        if (cfg->expert_output_norm && be->kernels == MUSE_KERNELS_FAST)
            CHECK(c, muse_k_norm_fast_rows(&pairs, rk->zg, H, rk->expert_norm[i], H, rk->sel,
                                           MUSE_K_NORM_PLUS1, eps, 0, rk->zg));
        else if (cfg->expert_output_norm)
            CHECK(c, muse_k_norm(&pairs, rk->zg, H, rk->expert_norm[i], H, rk->sel,
                                 MUSE_K_NORM_PLUS1, eps, 0, rk->zg));
        CHECK(c, muse_k_moe_combine(&kc, rk->sel, rk->sel_w, rk->zg, shared ? rk->zs : NULL, K, H,
                                    act_r(c, y_a, r)));
        c->act_cols[y_a][r] = H;
    }
    prof_end(c, c->n_ranks > 1 ? PROF_MOE : PROF_MOE_COMBINE);
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
        muse_k_ctx wanted = kctx(rk, c->wanted);
        CHECK(c, muse_k_gather_rows(&wanted, act_r(c, x, r), H, rk->xsel));
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
    muse_k_ctx wanted = kctx(r0, c->wanted);
    CHECK(c, muse_k_head_finish(&wanted, r0->raw, N, V, cfg->output_multiplier,
                                cfg->final_logit_softcapping, act_r(c, logits, 0)));
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
    muse_k_ctx wanted = kctx(r0, c->wanted);
    long V = (long)be->model->cfg.vocab_size;
    if (fast_small(c)) /* r0->weights: muse_k_sample_fast_bytes on this path (cuda_device.c) */
        CHECK(c, muse_k_sample_fast(&wanted, act_r(c, logits, 0), V, c->weight_bits, r0->weights,
                                    r0->d_drawn));
    else
        CHECK(c, muse_k_sample(&wanted, act_r(c, logits, 0), V, c->weight_bits, r0->weights,
                               r0->d_drawn));
    prof_end(c, PROF_SAMPLE);
}

const muse_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .device_memory = cuda_device_memory,
    .alloc = cuda_alloc,
    .write = cuda_write,
    .read = cuda_read,
    .begin_round = cuda_begin_round,
    .end_round = cuda_end_round,
    .embed = cuda_embed,
    .norm = cuda_norm,
    .add_norm = cuda_add_norm,
    .add_norm_norm = cuda_add_norm_norm,
    .linear = cuda_linear,
    .linears = cuda_linears,
    .swiglu_linear = cuda_swiglu_linear,
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
    .profile = cuda_profile,
};
