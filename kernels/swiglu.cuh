/* swiglu: out = fp16(silu(gate) * up), elementwise. */
#ifndef MUSE_K_SWIGLU_CUH
#define MUSE_K_SWIGLU_CUH
#include "launch.h"
/* gate, up, out: n floats (out may alias neither) */
MUSE_K_API int muse_k_swiglu(const float *gate, const float *up, long n, float *out,
                             cudaStream_t st);
#endif
