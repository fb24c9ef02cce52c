/* embed on the fast path: out[R, H] = rms(embed[tokens]) fp32, one block a row. */
#ifndef MUSE_K_EMBED_FAST_CUH
#define MUSE_K_EMBED_FAST_CUH
#include "launch.h"
/* table [V, H] of dtype; ctx: st, rows, tokens */
MUSE_K_API int muse_k_embed_fast(const muse_k_ctx *ctx, const void *table, int dtype, long H,
                                 double eps, float *out);
#endif
