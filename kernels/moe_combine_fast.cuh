/* moe_combine_fast: the MoE's combine with the expert output norms taken in (fast path). */
#ifndef MUSE_K_MOE_COMBINE_FAST_CUH
#define MUSE_K_MOE_COMBINE_FAST_CUH
#include "launch.h"
/* y[R, H] = sum over row r's slots in kernels/moe.cu's combine order of w[r, slot] * norm(z[r K
 * + slot]) (+ shared[r]), where norm(x) = fp32(x * s) * (1 + enorm[sel] row) as
 * muse_k_norm_fast_rows's MUSE_K_NORM_PLUS1 and s = 1 / sqrt(sum / H + eps) from the product's
 * row sums of squares sq[(r K + slot) * (H / 128) + b] (the down's finish wrote them:
 * muse_k_fast_groups.row_sq), lane l of a warp adding blocks l, l + 32, .. in order, then the
 * warp's butterfly. The norm launch goes; a row's bits are its own.
 * H a multiple of 128, K <= 64, else cudaErrorInvalidValue. ctx: st, rows (R) */
MUSE_K_API int muse_k_moe_combine_norm_fast(const muse_k_ctx *ctx, const int32_t *sel,
                                            const float *w, const float *z, const double *sq,
                                            const float *enorm, double eps, const float *shared,
                                            long K, long H, float *y);
#endif
