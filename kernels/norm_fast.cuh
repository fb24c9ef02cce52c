/* norm, add_norm and add_norm_norm on the fast path: one block a row, the rms in a fixed tree
 * (fast_rows.cuh), each element's arithmetic the exact kernel's (kernels/norm.cu). */
#ifndef MUSE_K_NORM_FAST_CUH
#define MUSE_K_NORM_FAST_CUH
#include "launch.h"
/* out[R, W] = rms(x, eps) * (1 | 1+w | w), fp16-rounded when round16; out may be x. ctx: st, rows
 */
MUSE_K_API int muse_k_norm_fast(const muse_k_ctx *ctx, const float *x, long width, const float *w,
                                int mode, double eps, int round16, float *out);
/* The same with row r's weight w + w_row[r] * w_stride (the MoE's per-expert output norms). */
MUSE_K_API int muse_k_norm_fast_rows(const muse_k_ctx *ctx, const float *x, long width,
                                     const float *w, long w_stride, const int32_t *w_row, int mode,
                                     double eps, int round16, float *out);
/* h[R, W] += (1 + w) * rms(y, eps); ctx: st, rows */
MUSE_K_API int muse_k_add_norm_fast(const muse_k_ctx *ctx, float *h, const float *y, long width,
                                    const float *w, double eps);
/* add_norm, then out[R, W] = fp16(rms(h, next_eps) * (1 | 1+next_w | next_w)) in one launch;
 * out may alias neither h nor y. ctx: st, rows */
MUSE_K_API int muse_k_add_norm_norm_fast(const muse_k_ctx *ctx, float *h, const float *y,
                                         long width, const float *w, double eps,
                                         const float *next_w, int next_mode, double next_eps,
                                         float *out);
#endif
