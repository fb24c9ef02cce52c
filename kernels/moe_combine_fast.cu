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

/* A decode round's form (one 128-column block, K <= MC_EARLY_K slots, H <= 64 * 128): every
 * load the block makes goes out at once after the wait (the row's slots and weights, the
 * column's z of every slot, the shared experts' value, each warp's slot's sums of squares), the
 * expert norms as soon as the slots land; warp j makes slot j's scale (MC_EARLY_K warps: one
 * chain each) while the first 128 threads find the slot order from their own copy of the slots
 * (moe_order.h), so the scales' barrier is the only one. Where k_moe_combine_norm_fast's chain
 * was the sums' loads, the scales two slots a warp in turn, the order's three barriers, then z:
 * three round trips one after another. The same arithmetic in the same order: the same bits. */
#define MC_EARLY_K 8
__global__ void __launch_bounds__(MC_EARLY_K * 32)
    k_moe_combine_norm_early(const int32_t *sel, const float *w, const float *z, const double *sq,
                             const float *enorm, double eps, const float *shared, long K, long H,
                             float *y)
{
    __shared__ double s_scale[MC_EARLY_K];
    __shared__ int32_t s_at[MC_EARLY_K];
    __shared__ float s_p[MC_EARLY_K][128];
    K_PDL_NEXT();
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, k = (int)K, nb = (int)(H / 128);
    const bool col = t < 128; /* the first 128 threads: a column each */
    const long r = blockIdx.y, d = (long)blockIdx.x * 128 + (t & 127);
    const int32_t *selr = sel + r * K;
    const float *wr = w + r * K, *zr = z + r * K * H + d;
    const double *q = sq + (r * K + warp) * nb; /* the warp's slot's sums of squares */
    const int h = (int)H;                       /* H <= 64 * 128 */
    K_PDL_WAIT();
    int32_t sl[MC_EARLY_K];
    float wj[MC_EARLY_K], zj[MC_EARLY_K], ej[MC_EARLY_K];
#pragma unroll
    for (int j = 0; j < MC_EARLY_K; j++) {
        sl[j] = col && j < k ? selr[j] : -1;
        wj[j] = col && j < k ? wr[j] : 0.0f;
        zj[j] = col && j < k ? zr[j * h] : 0.0f;
    }
    float sh = col && shared ? shared[r * H + d] : 0.0f;
    /* lane's blocks lane, lane + 32 (nb <= 64), added in order from 0 as there */
    const bool live = warp < k; /* warp-uniform */
    double q0 = live && lane < nb ? q[lane] : 0.0, q1 = live && lane + 32 < nb ? q[lane + 32] : 0.0;
    /* every load above in flight before the first waits on its value (ptxas would interleave
     * the slots' loads with the norms' that need them: a round trip each) */
#pragma unroll
    for (int j = 0; j < MC_EARLY_K; j++) asm volatile("" : "+r"(sl[j]), "+f"(wj[j]), "+f"(zj[j]));
    asm volatile("" : "+f"(sh), "+d"(q0), "+d"(q1));
#pragma unroll
    for (int j = 0; j < MC_EARLY_K; j++) ej[j] = sl[j] >= 0 ? enorm[(long)sl[j] * H + d] : 0.0f;
    /* the order: slot j leads its expert; thread j's slot at its place among the leaders */
    int32_t lead[MC_EARLY_K], mine = -1;
    int n = 0;
#pragma unroll
    for (int j = 0; j < MC_EARLY_K; j++) {
        n += lead[j] = muse_moe_order_leads(sl, j);
        if (t == j && lead[j]) mine = sl[j];
    }
    if (mine >= 0) s_at[muse_moe_order_place_of(sl, lead, MC_EARLY_K, mine)] = t;
    if (live) {
        double sum = 0;
        if (lane < nb) sum += q0;
        if (lane + 32 < nb) sum += q1;
        sum = k_fr_warp_sum(sum);
        if (lane == 0) s_scale[warp] = k_fr_scale(sum, H, eps);
    }
    __syncthreads();
    if (!col) return;
#pragma unroll
    for (int j = 0; j < MC_EARLY_K; j++) {
        if (j >= k) break;
        float x = (float)((double)zj[j] * s_scale[j]);
        float v = __fmul_rn(x, __fadd_rn(1.0f, ej[j]));
        s_p[j][t] = __fmul_rn(wj[j], v); /* the thread's own column: read back by it alone */
    }
    float acc = 0;
    for (int m = 0; m < n; m++) acc = __fadd_rn(acc, s_p[s_at[m]][t]);
    if (shared) acc = __fadd_rn(acc, sh);
    y[r * H + d] = acc;
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
    if (K <= MC_EARLY_K && H / 128 <= 64)
        return k_launch(k_moe_combine_norm_early, dim3((unsigned)(H / 128), (unsigned)rows),
                        MC_EARLY_K * 32, 0, ctx->st, sel, w, z, sq, enorm, eps, shared, K, H, y);
    return k_launch(k_moe_combine_norm_fast<1>, dim3((unsigned)(H / 128), (unsigned)rows), 128, 0,
                    ctx->st, sel, w, z, sq, enorm, eps, shared, K, H, y);
}
