/* qk_norm_rope (fast path): one warp a (row, head), QK_HEADS heads a block. The sum of squares
 * in double, lane d, d + 32, ... then a warp butterfly (fast_rows.cuh: every lane the same
 * bits), so a head's bits depend on nothing but the head; then each element and each NEOX pair
 * exactly as kernels/qk_rope.cu (scaled in double to fp32, rotated in double, fp16). Lane d
 * owns the pair (d, d + half) of every d < half it visits, and reads nothing another lane writes.
 */
#include "common.cuh"
#include "fast_rows.cuh"
#include "pdl.cuh"
#include "qk_rope_fast.cuh"

#define QK_HEADS 4

/* Shape: grid (ceil(heads / QK_HEADS), rows), block 32 * QK_HEADS. */
__global__ void k_qk_norm_rope_fast(float *x, long heads, long hd, const int64_t *positions,
                                    double theta, double eps)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long r = blockIdx.y, hh = (long)blockIdx.x * QK_HEADS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (hh >= heads) return; /* a whole warp: the shuffles below see only full warps */
    float *v = x + (r * heads + hh) * hd;
    double acc = 0;
    for (long d = lane; d < hd; d += 32) acc += (double)v[d] * (double)v[d];
    double s = k_fr_scale(k_fr_warp_sum(acc), hd, eps);
    long half = hd / 2;
    double p = (double)positions[r];
    for (long d = lane; d < hd; d += 32) {
        if (theta != 0 && d < half) {
            double angle = p * pow(theta, -2.0 * (double)d / (double)hd);
            double cs = cos(angle), sn = sin(angle);
            double x1 = (float)((double)v[d] * s), x2 = (float)((double)v[d + half] * s);
            v[d] = muse_round_f16((float)(x1 * cs - x2 * sn));
            v[d + half] = muse_round_f16((float)(x2 * cs + x1 * sn));
        } else if (theta == 0 || d >= 2 * half) {
            v[d] = muse_round_f16((float)((double)v[d] * s));
        }
    }
}

MUSE_K_API int muse_k_qk_norm_rope_fast(const muse_k_ctx *ctx, float *x, long heads, long head_dim,
                                        double theta, double eps)
{
    if (ctx->rows <= 0 || heads <= 0 || head_dim <= 0) return 0;
    dim3 grid((unsigned)((heads + QK_HEADS - 1) / QK_HEADS), (unsigned)ctx->rows);
    return k_launch(k_qk_norm_rope_fast, grid, 32 * QK_HEADS, 0, ctx->st, x, heads, head_dim,
                    ctx->positions, theta, eps);
}
