/* moe_combine_fast: kernels/moe.cu's combine with the expert output norms in it, a block 128
 * columns of a row as there. Each slot's scale comes from the down's finish (its row's sums of
 * squares by 128-column block, kernels/linear_fast_ends.cu), added by a warp in a fixed tree,
 * so the norm's own launch and its pass over z go; each element is then the norm's
 * fp32 steps (kernels/norm_fast.cu, mode 1 + w) and the combine's, in the combine's slot order
 * (moe_order.cuh). */
#include "common.cuh"
#include "fast_rows.cuh"
#include "moe_combine_fast.cuh"
#include "moe_order.cuh"
#include "pdl.cuh"

/* grid (ceil(H / (128 C)), R), 128 threads: C blocks of 128 columns of row r, its slots' scales
 * and order found once for the C (at 2048 rows, one block a 128 columns spent more on them than
 * on the columns: 514 us a launch where the bytes take 120) */
template <int C>
__global__ void k_moe_combine_norm_fast(const int32_t *sel, const float *w, const float *z,
                                        const double *sq, const float *enorm, double eps,
                                        const float *shared, long K, long H, float *y)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    __shared__ int32_t s_sel[MC_MAX_K], s_lead[MC_MAX_K], s_at[MC_MAX_K];
    __shared__ double s_scale[MC_MAX_K];
    __shared__ int s_n;
    long r = blockIdx.y, nb = H / 128;
    int t = threadIdx.x;
    /* slot j's scale by warp j % 4: lane l adds blocks l, l + 32, .. in order, then the warp's
     * butterfly (every load of the row's sums at once, not a chain of nb) */
    int lane = t & 31;
    for (long j = t >> 5; j < K; j += blockDim.x >> 5) {
        const double *q = sq + (r * K + j) * nb;
        double sum = 0;
        for (long b = lane; b < nb; b += 32) sum += q[b];
        sum = k_fr_warp_sum(sum);
        if (lane == 0) s_scale[j] = k_fr_scale(sum, H, eps);
    }
    /* the slot order; its barriers also publish the scales */
    int n = d_combine_order(sel + r * K, K, s_sel, s_lead, s_at, &s_n);
    for (int c = 0; c < C; c++) {
        long d = ((long)blockIdx.x * C + c) * 128 + t;
        if (d >= H) return;
        float acc = 0;
#pragma unroll 8
        for (int m = 0; m < n; m++) {
            long at = s_at[m];
            float x = (float)((double)z[(r * K + at) * H + d] * s_scale[at]);
            float v = __fmul_rn(x, __fadd_rn(1.0f, enorm[(long)s_sel[at] * H + d]));
            acc = __fadd_rn(acc, __fmul_rn(w[r * K + at], v));
        }
        if (shared) acc = __fadd_rn(acc, shared[r * H + d]);
        y[r * H + d] = acc;
    }
}

/* The 128-column blocks a launch's block takes: 8 from MC_WIDE_ROWS rows (the round's rows:
 * a decode round keeps a block each, its parallelism); a column's arithmetic is the same at any */
#define MC_WIDE_ROWS 64

MUSE_K_API int muse_k_moe_combine_norm_fast(const muse_k_ctx *ctx, const int32_t *sel,
                                            const float *w, const float *z, const double *sq,
                                            const float *enorm, double eps, const float *shared,
                                            long K, long H, float *y)
{
    long rows = ctx->rows;
    if (rows <= 0) return 0;
    if (H <= 0 || H % 128 || K < 1 || K > MC_MAX_K) return (int)cudaErrorInvalidValue;
    if (rows >= MC_WIDE_ROWS)
        return k_launch(k_moe_combine_norm_fast<8>,
                        dim3((unsigned)((H / 128 + 7) / 8), (unsigned)rows), 128, 0, ctx->st, sel,
                        w, z, sq, enorm, eps, shared, K, H, y);
    return k_launch(k_moe_combine_norm_fast<1>, dim3((unsigned)(H / 128), (unsigned)rows), 128, 0,
                    ctx->st, sel, w, z, sq, enorm, eps, shared, K, H, y);
}
