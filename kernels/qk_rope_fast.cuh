/* qk_norm_rope on the fast path: per head, unweighted rms, RoPE NEOX, fp16; a warp a head. */
#ifndef MUSE_K_QK_ROPE_FAST_CUH
#define MUSE_K_QK_ROPE_FAST_CUH
#include "launch.h"
/* x [R, heads * head_dim] in place; theta 0: no rotation; ctx: st, rows, positions */
MUSE_K_API int muse_k_qk_norm_rope_fast(const muse_k_ctx *ctx, float *x, long heads, long head_dim,
                                        double theta, double eps);
#endif
