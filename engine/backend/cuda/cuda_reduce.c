/* The CUDA backend's sums across ranks: in rank order through kernels/all_reduce.cu, reading
 * every rank's partial (one GPU, or peers), or after NCCL's all-gather of them. */

#include "backend/cuda/cuda_internal.h"

#include "kernels/all_reduce.cuh"

_Static_assert(MUSE_K_MAX_PARTS == MUSE_MAX_RANKS, "the all-reduce kernel takes every rank");

/* NCCL's all-gather instead of peer reads from this size up, where NCCL is loaded */
#define NCCL_MIN_BYTES (1 << 20)

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
void reduce(cuda_backend *c, float *const parts[], long n)
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
            muse_k_ctx kc = kctx(rk, c->rows);
            CHECK(c, muse_k_all_reduce(&kc, p, c->n_ranks, n, parts[r]));
        }
        return;
    }
    muse_k_parts p = {{0}};
    for (int k = 0; k < c->n_ranks; k++) p.p[k] = parts[k];
    barrier(c, 0);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        muse_k_ctx kc = kctx(rk, c->rows);
        CHECK(c, muse_k_all_reduce(&kc, p, c->n_ranks, n, rk->red));
    }
    barrier(c, 1);
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, cudaMemcpyAsync(parts[r], rk->red, bytes, cudaMemcpyDeviceToDevice, rk->st));
    }
}

/* x = x_0 + x_1 + ... in rank order, then every rank holds the sum. */
void cuda_all_reduce(muse_backend *be, muse_act x, long width)
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
