/* scale: x *= s in place, fp32, elementwise (the demo of docs/gpu.md, "Adding a kernel"). */
#ifndef MUSE_K_SCALE_CUH
#define MUSE_K_SCALE_CUH
#include "launch.h"
/* x: [rows, width] floats; ctx: st, rows */
MUSE_K_API int muse_k_scale(const muse_k_ctx *ctx, float *x, long width, float s);
#endif
