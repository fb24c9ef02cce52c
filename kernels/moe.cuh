/* moe: the router (fp32 logits), top-k selection and the weighted sum of expert outputs; the
 * expert MLPs themselves run through linear and swiglu on (row, slot) pairs. */
#ifndef MUSE_K_MOE_CUH
#define MUSE_K_MOE_CUH
#include "launch.h"
/* Each of these: ctx st and rows. */
/* logits[R, E] = b[R, H] router^T, router [E, H] of dtype */
MUSE_K_API int muse_k_router(const muse_k_ctx *ctx, const float *b, long H, const void *router,
                             int dtype, long E, float *logits);
/* Per row: top-k by sigmoid(logit) + bias (bias may be NULL), ties to the lower index;
 * sel[R, K], w[R, K] the sigmoid scores, normalized when norm_topk, times scaling. */
MUSE_K_API int muse_k_select(const muse_k_ctx *ctx, const float *logits, long E, long K,
                             const float *bias, int norm_topk, float scaling, int32_t *sel,
                             float *w);
/* y[R, H] = sum over a row's K slots in ascending expert index of w * z[slot], then + shared
 * (NULL: none); z [R * K, H] the experts' outputs of each (row, slot) pair. */
MUSE_K_API int muse_k_moe_combine(const muse_k_ctx *ctx, const int32_t *sel, const float *w,
                                  const float *z, const float *shared, long K, long H, float *y);
#endif
