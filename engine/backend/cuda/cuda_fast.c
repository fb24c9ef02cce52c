/* The fast kernel path on the CUDA backend (kernels/CONTRACT.md): which calls take a fast
 * kernel (EXL3 linears whose k and n are multiples of 128: kernels/linear_fast.cu, alone or
 * several of one input in one launch, gate/up with the swiglu epilogue), the workspace they
 * need, and the calls. Everything else, and everything on the exact path, runs the exact
 * kernels: the same call falls back by shape alone, so a row's path never depends on its batch. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "kernels/linear_fast.cuh"
#include "kernels/linear_fast.h"
#include "kernels/moe_fast.cuh"

/* The descriptors of rank rk's views of ls into shapes; whether the fast kernel takes them. */
static int fits(const cuda_rank *rk, const muse_linear *const *ls, int n, int epilogue,
                muse_k_lin *shapes)
{
    if (n < 1 || n > MUSE_K_FAST_MAX_LIN) return 0;
    for (int i = 0; i < n; i++) shapes[i] = rk->lin[ls[i]->id];
    return muse_k_linear_fast_fits(shapes, n, epilogue);
}

/* The largest workspace of one call over rows rows of the calls the plan makes on rank rk. */
static size_t need(const cuda_rank *rk, const muse_linear *const *ls, int n, int epilogue,
                   long rows)
{
    muse_k_lin shapes[MUSE_K_FAST_MAX_LIN];
    if (!fits(rk, ls, n, epilogue, shapes)) return 0;
    return muse_k_linear_fast_workspace(shapes, n, rows);
}

/* Whether layer i's experts take the grouped fast product on rank rk: every expert's gate, up
 * and down a fast shape, the same k, n, bits and codebook in each role (one launch's
 * template: expert 0's three descriptors, moe_shapes). */
static int moe_fits(const muse_model *m, const cuda_rank *rk, int64_t i)
{
    const muse_layer *ly = &m->layers[i];
    muse_k_lin shapes[3];
    int64_t E = m->cfg.num_experts;
    if (m->cfg.mlp_kind[i] != MUSE_MLP_MOE || E < 1 || m->cfg.num_experts_per_tok < 1 ||
        !ly->experts)
        return 0;
    for (int role = 0; role < 3; role++)
        for (int64_t x = 0; x < E; x++) {
            const muse_mlp *ex = &ly->experts[x];
            const muse_linear *l = role == 0 ? &ex->gate : role == 1 ? &ex->up : &ex->down;
            const muse_k_lin *s = &rk->lin[l->id];
            if (x == 0) {
                shapes[role] = *s;
                if (!muse_k_linear_fast_fits(s, 1, MUSE_K_EPI_NONE)) return 0;
            } else if (s->kind != shapes[role].kind || s->k != shapes[role].k ||
                       s->n != shapes[role].n || s->bits != shapes[role].bits ||
                       s->codebook != shapes[role].codebook) {
                return 0;
            }
        }
    return muse_k_linear_fast_fits(shapes, 2, MUSE_K_EPI_SWIGLU) && shapes[2].k == shapes[0].n;
}

/* A grouped launch's shapes: expert 0's gate, up and down descriptors on rank rk. */
static void moe_shapes(const cuda_rank *rk, const muse_layer *ly, muse_k_lin s[3])
{
    s[0] = rk->lin[ly->experts[0].gate.id];
    s[1] = rk->lin[ly->experts[0].up.id];
    s[2] = rk->lin[ly->experts[0].down.id];
}

/* The experts' k split target: 528 over the K pairs of a token (on the H200 against 264 / K and
 * 264: the same at one row, 7-19% faster from 4 rows; 132 and 192 / K slower) */
static int moe_target(const muse_config *cfg)
{
    return MUSE_FAST_GROUP_TARGET / (int)cfg->num_experts_per_tok; /* K >= 1: moe_fits */
}

/* The ints of a rank's MoE plan (moe_fast.cuh): groups [most][4], perm [P], n_groups. */
static size_t plan_ints(const muse_config *cfg, long rows, int *most)
{
    long K = (long)cfg->num_experts_per_tok, E = (long)cfg->num_experts, P = rows * K;
    int a = muse_k_moe_max_groups(P, E, muse_k_linear_fast_group_rows(rows, K, E));
    int b = muse_k_moe_max_groups(P, E, 8); /* fewer rows: smaller groups, at most this */
    *most = a > b ? a : b;
    return (size_t)*most * 4 + (size_t)P + 4;
}

size_t cuda_fast_plan_ints(const cuda_backend *c, long rows)
{
    int most;
    if (c->base.model->cfg.num_experts_per_tok < 1) return 0;
    return plan_ints(&c->base.model->cfg, rows, &most);
}

/* The shapes of an MLP (gate, up, down) on rank rk; whether it takes muse_k_linear_fast_mlp. */
static int mlp_fits(const cuda_rank *rk, const muse_mlp *s, muse_k_lin shapes[3])
{
    shapes[0] = rk->lin[s->gate.id];
    shapes[1] = rk->lin[s->up.id];
    shapes[2] = rk->lin[s->down.id];
    return muse_k_linear_fast_fits(shapes, 2, MUSE_K_EPI_SWIGLU) &&
           muse_k_linear_fast_fits(shapes + 2, 1, MUSE_K_EPI_NONE) && shapes[2].k == shapes[0].n;
}

/* The workspace of layer i's shared experts (gate/up with the swiglu, then down) at rows rows. */
static size_t shared_need(const muse_model *m, const cuda_rank *rk, int64_t i, long rows)
{
    const muse_layer *ly = &m->layers[i];
    muse_k_lin shapes[3];
    if (m->cfg.mlp_kind[i] != MUSE_MLP_MOE || m->cfg.num_shared_experts <= 0 ||
        !mlp_fits(rk, &ly->shared, shapes))
        return 0;
    return muse_k_linear_fast_mlp_workspace(shapes, rows);
}

size_t cuda_fast_workspace(const cuda_backend *c, const cuda_rank *rk, long rows)
{
    const muse_model *m = c->base.model;
    size_t most = 0, b;
    const muse_linear *one[1];
    if (!c->sizing) (void)muse_k_linear_fast_wg(); /* asked before any capture, once a process */
#define MOST(x) ((b = (x)) > most ? (most = b) : most)
    for (int64_t i = 0; i < m->cfg.num_layers; i++) {
        const muse_layer *ly = &m->layers[i];
        const muse_linear *qkvg[4] = {&ly->q, &ly->k, &ly->v, &ly->gate};
        MOST(need(rk, qkvg, 4, MUSE_K_EPI_NONE, rows));
        for (int j = 0; j < 4; j++) one[0] = qkvg[j], MOST(need(rk, one, 1, MUSE_K_EPI_NONE, rows));
        one[0] = &ly->o, MOST(need(rk, one, 1, MUSE_K_EPI_NONE, rows));
        if (m->cfg.mlp_kind[i] == MUSE_MLP_DENSE) {
            const muse_linear *gu[2] = {&ly->dense.gate, &ly->dense.up};
            MOST(need(rk, gu, 2, MUSE_K_EPI_SWIGLU, rows));
            for (int j = 0; j < 2; j++)
                one[0] = gu[j], MOST(need(rk, one, 1, MUSE_K_EPI_NONE, rows));
            one[0] = &ly->dense.down, MOST(need(rk, one, 1, MUSE_K_EPI_NONE, rows));
        }
        muse_k_lin ex[3];
        if (rk->moe_ok && rk->moe_ok[i]) { /* cuda_fast_moe_prepare ran first */
            moe_shapes(rk, ly, ex);
            long P = rows * (long)m->cfg.num_experts_per_tok;
            MOST(muse_k_linear_fast_grouped_mlp_workspace(ex, P, moe_target(&m->cfg)));
        }
        MOST(shared_need(m, rk, i, rows));
    }
    one[0] = &m->head, MOST(need(rk, one, 1, MUSE_K_EPI_NONE, rows));
#undef MOST
    return most;
}

size_t cuda_fast_side_workspace(const cuda_backend *c, const cuda_rank *rk, long rows)
{
    size_t most = 0;
    for (int64_t i = 0; i < c->base.model->cfg.num_layers; i++) {
        size_t b = shared_need(c->base.model, rk, i, rows);
        most = b > most ? b : most;
    }
    return most;
}

int cuda_fast_fits(const cuda_backend *c, const muse_linear *const *ls, int n, int epilogue)
{
    muse_k_lin shapes[MUSE_K_FAST_MAX_LIN];
    if (c->base.kernels != MUSE_KERNELS_FAST) return 0;
    for (int r = 0; r < c->n_ranks; r++)
        if (!c->rank[r].ws_fast || !fits(&c->rank[r], ls, n, epilogue, shapes)) return 0;
    return 1;
}

void cuda_fast_run(cuda_backend *c, cuda_rank *rk, int side, const muse_linear *const *ls, int n,
                   const float *x, long x_stride, long rows, int round16, float *const ys[],
                   const long strides[], int epilogue)
{
    muse_k_lin
        shapes[MUSE_K_FAST_MAX_LIN]; /* the caller asked cuda_fast_fits; the launcher checks */
    for (int i = 0; i < n; i++) shapes[i] = rk->lin[ls[i]->id];
    muse_k_ctx kc = kctx(rk, rows);
    if (side) kc.st = rk->side;
    CHECK(c, muse_k_linear_fast(&kc, shapes, n, x, x_stride, round16, ys, strides, epilogue,
                                side ? rk->ws_side : rk->ws_fast,
                                side ? rk->ws_side_bytes : rk->ws_fast_bytes));
}

int cuda_fast_mlp_fits(const cuda_backend *c, const muse_mlp *s)
{
    muse_k_lin shapes[3];
    if (c->base.kernels != MUSE_KERNELS_FAST) return 0;
    for (int r = 0; r < c->n_ranks; r++)
        if (!c->rank[r].ws_fast || !mlp_fits(&c->rank[r], s, shapes)) return 0;
    return 1;
}

void cuda_fast_mlp(cuda_backend *c, cuda_rank *rk, int side, const muse_mlp *s, const float *x,
                   long x_stride, long rows, float *mid, float *y, long y_stride)
{
    muse_k_lin shapes[3];
    mlp_fits(rk, s, shapes); /* the caller asked cuda_fast_mlp_fits; the launcher checks */
    muse_k_ctx kc = kctx(rk, rows);
    if (side) kc.st = rk->side;
    CHECK(c, muse_k_linear_fast_mlp(&kc, shapes, NULL, x, x_stride, mid, (long)shapes[0].n, y,
                                    y_stride, side ? rk->ws_side : rk->ws_fast,
                                    side ? rk->ws_side_bytes : rk->ws_fast_bytes));
}

/* moe_fits walks 3 x E descriptors: once a layer at start (before the workspace's size),
 * never in a round */
void cuda_fast_moe_prepare(const cuda_backend *c, cuda_rank *rk)
{
    const muse_model *m = c->base.model;
    size_t L = (size_t)m->cfg.num_layers;
    rk->moe_ok = MUSE_CALLOC(L ? L : 1, sizeof *rk->moe_ok);
    for (size_t i = 0; i < L; i++) rk->moe_ok[i] = (unsigned char)moe_fits(m, rk, (int64_t)i);
}

int cuda_fast_moe_fits(const cuda_backend *c, const muse_layer *ly)
{
    size_t i = (size_t)(ly - c->base.model->layers);
    if (c->base.kernels != MUSE_KERNELS_FAST) return 0;
    for (int r = 0; r < c->n_ranks; r++)
        if (!c->rank[r].ws_fast || !c->rank[r].moe_plan || !c->rank[r].moe_ok ||
            !c->rank[r].moe_ok[i])
            return 0;
    return 1;
}

/* The plan of rows rows' pairs on rank rk (moe_fast.cuh): its group size, group count and
 * its arrays in rk->moe_plan. */
typedef struct {
    int gr, mg;
    int32_t *groups, *perm, *n_groups;
} moe_plan;

static moe_plan plan_of(const muse_config *cfg, const cuda_rank *rk, long rows)
{
    long E = (long)cfg->num_experts, P = rows * (long)cfg->num_experts_per_tok;
    int most;
    moe_plan pl;
    pl.gr = muse_k_linear_fast_group_rows(rows, (long)cfg->num_experts_per_tok, E);
    plan_ints(cfg, rows, &most);
    pl.mg = muse_k_moe_max_groups(P, E, pl.gr);
    pl.groups = rk->moe_plan;
    pl.perm = pl.groups + (size_t)most * 4;
    pl.n_groups = pl.perm + P;
    return pl;
}

void cuda_fast_select(cuda_backend *c, cuda_rank *rk, const muse_layer *ly, long rows, int grouped)
{
    const muse_config *cfg = &c->base.model->cfg;
    int64_t i = ly - c->base.model->layers;
    long E = (long)cfg->num_experts, K = (long)cfg->num_experts_per_tok;
    muse_k_ctx kc = kctx(rk, rows);
    float scaling = (float)cfg->routed_scaling_factor;
    if (!grouped) {
        CHECK(c, muse_k_select_fast(&kc, rk->router_logits, E, K, rk->router_bias[i],
                                    cfg->norm_topk_prob, scaling, rk->sel, rk->sel_w));
        return;
    }
    moe_plan pl = plan_of(cfg, rk, rows);
    CHECK(c, muse_k_select_group_fast(&kc, rk->router_logits, E, K, rk->router_bias[i],
                                      cfg->norm_topk_prob, scaling, rk->sel, rk->sel_w, pl.gr,
                                      pl.mg, pl.perm, pl.groups, pl.n_groups));
}

/* Every (row, slot) pair of rows rows through its expert on rank rk, grouped by
 * cuda_fast_select's plan: gate/up with the swiglu epilogue into rk->ea [P, I] and down into
 * z [P, n] (pair order), the down's prepare in the gate/up's finish. */
void cuda_fast_experts(cuda_backend *c, cuda_rank *rk, const muse_layer *ly, const float *b,
                       long x_stride, long rows, float *z)
{
    const muse_model *m = c->base.model;
    int64_t i = ly - m->layers;
    long E = (long)m->cfg.num_experts, P = rows * (long)m->cfg.num_experts_per_tok;
    if (CHECK(c, rk->moe_ok && rk->moe_ok[i] ? cudaSuccess : cudaErrorInvalidValue))
        return; /* the caller asked cuda_fast_moe_fits */
    muse_k_lin shapes[3];
    moe_shapes(rk, ly, shapes);
    moe_plan pl = plan_of(&m->cfg, rk, rows);
    muse_k_ctx pc = kctx(rk, P);
    const muse_k_lin *ex = rk->experts + (size_t)i * (size_t)(3 * E);
    long I = (long)shapes[0].n, H = (long)shapes[2].n;
    int target = moe_target(&m->cfg);
    muse_k_fast_groups g = {{ex, ex + E, ex + 2 * E},
                            rk->sel,
                            rk->pair_src,
                            pl.perm,
                            pl.groups,
                            pl.n_groups,
                            pl.mg,
                            pl.gr,
                            target,
                            cuda_fast_norm_in(c, rk) ? rk->zsq : NULL};
    CHECK(c, muse_k_linear_fast_mlp(&pc, shapes, &g, b, x_stride, rk->ea, I, z, H, rk->ws_fast,
                                    rk->ws_fast_bytes));
}

int cuda_env_on(const char *name)
{
    const char *v = getenv(name);
    return !(v && !strcmp(v, "0"));
}

int cuda_fast_norm_in(const cuda_backend *c, const cuda_rank *rk)
{
    static int env = -1; /* read once a process: one form a process */
    if (env < 0) env = cuda_env_on("MUSE_FAST_NORM_IN");
    const muse_config *cfg = &c->base.model->cfg;
    return env && rk->zsq && c->n_ranks == 1 && cfg->expert_output_norm &&
           cfg->hidden_size % 128 == 0 && cfg->num_experts_per_tok <= 64;
}
