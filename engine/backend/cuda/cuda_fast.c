/* The fast kernel path on the CUDA backend (kernels/CONTRACT.md): which calls take a fast
 * kernel (EXL3 linears whose k and n are multiples of 128: kernels/linear_fast.cu, alone or
 * several of one input in one launch, gate/up with the swiglu epilogue), the workspace they
 * need, and the calls. Everything else, and everything on the exact path, runs the exact
 * kernels: the same call falls back by shape alone, so a row's path never depends on its batch. */
#include "backend/cuda/cuda_internal.h"
#include "kernels/linear_fast.cuh"

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

size_t cuda_fast_workspace(const cuda_backend *c, const cuda_rank *rk, long rows)
{
    const muse_model *m = c->base.model;
    size_t most = 0, b;
    const muse_linear *one[1];
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
    }
    one[0] = &m->head, MOST(need(rk, one, 1, MUSE_K_EPI_NONE, rows));
#undef MOST
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

void cuda_fast_run(cuda_backend *c, cuda_rank *rk, const muse_linear *const *ls, int n,
                   const float *x, long x_stride, long rows, int round16, float *const ys[],
                   const long strides[], int epilogue)
{
    muse_k_lin
        shapes[MUSE_K_FAST_MAX_LIN]; /* the caller asked cuda_fast_fits; the launcher checks */
    for (int i = 0; i < n; i++) shapes[i] = rk->lin[ls[i]->id];
    muse_k_ctx kc = kctx(rk, rows);
    CHECK(c, muse_k_linear_fast(&kc, shapes, n, x, x_stride, round16, ys, strides, epilogue,
                                rk->ws_fast, rk->ws_fast_bytes));
}
