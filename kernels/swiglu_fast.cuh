/* swiglu on the fast path: out = fp16(silu(gate) * up), elementwise, four a thread. */
#ifndef MUSE_K_SWIGLU_FAST_CUH
#define MUSE_K_SWIGLU_FAST_CUH
#include "launch.h"
/* gate, up, out: [rows, width] floats (out may alias neither); ctx: st, rows */
MUSE_K_API int muse_k_swiglu_fast(const muse_k_ctx *ctx, const float *gate, const float *up,
                                  long width, float *out);
#endif
