/* embed: out[R, H] = rms(embed[tokens]) fp32, the residual stream's start. */
#ifndef MUSE_K_EMBED_CUH
#define MUSE_K_EMBED_CUH
#include "launch.h"
/* table [V, H] of dtype; ctx: st, rows, tokens */
MUSE_K_API int muse_k_embed(const muse_k_ctx *ctx, const void *table, int dtype, long H, double eps,
                            float *out);
#endif
