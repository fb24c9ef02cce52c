/* head: the wanted rows gathered, then (after the linear) multiplier and softcap. */
#ifndef MUSE_K_HEAD_CUH
#define MUSE_K_HEAD_CUH
#include "launch.h"
/* dst[i] = src[rows[i]] for i < n, rows of width W */
MUSE_K_API int muse_k_gather_rows(const float *src, const int32_t *rows, long n, long W,
                                  float *dst, cudaStream_t st);
/* logits[i * V + j] = softcap(mult * raw[i * N + j]) for i < n, j < V (cap 0: none) */
MUSE_K_API int muse_k_head_finish(const float *raw, long n, long N, long V, double mult,
                                  double cap, float *logits, cudaStream_t st);
#endif
