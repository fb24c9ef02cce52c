/* head: the wanted rows gathered, then (after the linear) multiplier and softcap. */
#ifndef MUSE_K_HEAD_CUH
#define MUSE_K_HEAD_CUH
#include "launch.h"
/* dst[i] = src[want[i]] for i < n, rows of width W; ctx: st, rows (n), want */
MUSE_K_API int muse_k_gather_rows(const muse_k_ctx *ctx, const float *src, long W, float *dst);
/* logits[i * V + j] = softcap(mult * raw[i * N + j]) for i < n, j < V (cap 0: none); ctx: st,
 * rows (n) */
MUSE_K_API int muse_k_head_finish(const muse_k_ctx *ctx, const float *raw, long N, long V,
                                  double mult, double cap, float *logits);
#endif
