/* moe: the router (fp32 logits), top-k selection and the weighted sum of expert outputs; the
 * expert MLPs themselves run through linear and swiglu on (row, slot) pairs. */
#ifndef MUSE_K_MOE_CUH
#define MUSE_K_MOE_CUH
#include "launch.h"
/* logits[R, E] = b[R, H] router^T, router [E, H] of dtype */
MUSE_K_API int muse_k_router(const float *b, long rows, long H, const void *router, int dtype,
                             long E, float *logits, cudaStream_t st);
/* Per row: top-k by sigmoid(logit) + bias (bias may be NULL), ties to the lower index;
 * sel[R, K], w[R, K] the sigmoid scores, normalized when norm_topk, times scaling. */
MUSE_K_API int muse_k_select(const float *logits, long rows, long E, long K, const float *bias,
                             int norm_topk, float scaling, int32_t *sel, float *w,
                             cudaStream_t st);
/* y[R, H] = sum over a row's K slots in ascending expert index of w * z[slot], then + shared
 * (NULL: none); z [R * K, H] the experts' outputs of each (row, slot) pair. */
MUSE_K_API int muse_k_moe_combine(const int32_t *sel, const float *w, const float *z,
                                  const float *shared, long rows, long K, long H, float *y,
                                  cudaStream_t st);
#endif
