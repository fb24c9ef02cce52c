/* all_reduce: the rank-order sum of every rank's partial, one rank's output at a time. */
#ifndef MUSE_K_ALL_REDUCE_CUH
#define MUSE_K_ALL_REDUCE_CUH
#include "launch.h"
#define MUSE_K_MAX_PARTS 8 /* MUSE_MAX_RANKS */
/* The partials' device pointers, passed by value (a graph keeps them with the launch). */
typedef struct {
    const float *p[MUSE_K_MAX_PARTS];
} muse_k_parts;
/* out[i] = ((p[0][i] + p[1][i]) + p[2][i]) + ... for i < n, fp32 adds in rank order, as
 * cpu_backend.c cpu_all_reduce. The partials may sit on other devices (peer access enabled) or
 * be slices of one gather buffer; out must not alias any of them. ctx: st */
MUSE_K_API int muse_k_all_reduce(const muse_k_ctx *ctx, muse_k_parts parts, int n_parts, long n,
                                 float *out);
#endif
