/* embed: out[R, H] = rms(embed[tokens]) fp32, the residual stream's start. */
#ifndef MUSE_K_EMBED_CUH
#define MUSE_K_EMBED_CUH
#include "launch.h"
/* table [V, H] of dtype; tokens [rows] (device) */
MUSE_K_API int muse_k_embed(const void *table, int dtype, const int32_t *tokens, long rows, long H,
                            double eps, float *out, cudaStream_t st);
#endif
