/* qk_norm_rope: per head, unweighted rms, RoPE NEOX at the row's position, fp16. */
#ifndef MUSE_K_QK_ROPE_CUH
#define MUSE_K_QK_ROPE_CUH
#include "launch.h"
/* x [R, heads * head_dim] in place; positions [R] (device); theta 0: no rotation */
MUSE_K_API int muse_k_qk_norm_rope(float *x, long rows, long heads, long head_dim,
                                   const int64_t *positions, double theta, double eps,
                                   cudaStream_t st);
#endif
