/* qk_norm_rope: per head, unweighted rms, RoPE NEOX at the row's position, fp16. */
#ifndef MUSE_K_QK_ROPE_CUH
#define MUSE_K_QK_ROPE_CUH
#include "launch.h"
/* x [R, heads * head_dim] in place; theta 0: no rotation; ctx: st, rows, positions */
MUSE_K_API int muse_k_qk_norm_rope(const muse_k_ctx *ctx, float *x, long heads, long head_dim,
                                   double theta, double eps);
#endif
