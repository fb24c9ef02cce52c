/* norm and add_norm: rms over a row (fixed-order double sum), then a weight. */
#ifndef MUSE_K_NORM_CUH
#define MUSE_K_NORM_CUH
#include "launch.h"
/* out[R, W] = rms(x, eps) * (1 | 1+w | w), fp16-rounded when round16. The weight of row r is
 * w + (w_row ? w_row[r] : 0) * w_stride (the MoE's per-expert norms). out may be x. */
MUSE_K_API int muse_k_norm(const float *x, long rows, long width, const float *w, long w_stride,
                           const int32_t *w_row, int mode, double eps, int round16, float *out,
                           cudaStream_t st);
/* h[R, W] += (1 + w) * rms(y, eps) */
MUSE_K_API int muse_k_add_norm(float *h, const float *y, long rows, long width, const float *w,
                               double eps, cudaStream_t st);
#endif
