/* norm and add_norm: rms over a row (fixed-order double sum), then a weight. */
#ifndef MUSE_K_NORM_CUH
#define MUSE_K_NORM_CUH
#include "launch.h"
/* out[R, W] = rms(x, eps) * (1 | 1+w | w), fp16-rounded when round16. The weight of row r is
 * w + (w_row ? w_row[r] : 0) * w_stride (the MoE's per-expert norms). out may be x. ctx: st, rows */
MUSE_K_API int muse_k_norm(const muse_k_ctx *ctx, const float *x, long width, const float *w,
                           long w_stride, const int32_t *w_row, int mode, double eps, int round16,
                           float *out);
/* h[R, W] += (1 + w) * rms(y, eps); ctx: st, rows */
MUSE_K_API int muse_k_add_norm(const muse_k_ctx *ctx, float *h, const float *y, long width,
                               const float *w, double eps);
#endif
