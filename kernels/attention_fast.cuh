/* attention_fast: the fast path's attention over the paged cache / sliding rings (flash
 * decoding), batch-invariant: a row's bits depend on its own position, window, q, g and cache
 * only, so a prompt row equals the same row decoded alone. Within tolerance of the exact path
 * (kernels/attention.cu), not equal. The KV write stays muse_k_kv_write's. */
#ifndef MUSE_K_ATTENTION_FAST_CUH
#define MUSE_K_ATTENTION_FAST_CUH
#include <stddef.h>

#include "attention.cuh"

/* Whether the fast kernel takes the shape: head_dim 64 or 128, group 1..16. */
MUSE_K_API int muse_k_attention_fast_fits(long hd, long group);

/* The split cap of the process: a row's key range in at most this many chunks (more: more
 * blocks over a long context). MUSE_ATTN_SPLITS=N from the environment (tuning only, 1 ..
 * MUSE_ATTN_MOST_SPLITS, read once a process, so every row of the process splits alike), else
 * MUSE_ATTN_MAX_SPLITS. The workspace below is sized with it. */
MUSE_K_API int muse_k_attention_fast_cap(void);
/* Its least chunk: MUSE_ATTN_CHUNK=N from the environment (tuning only: a tile * 2^j up to
 * MUSE_ATTN_MOST_CHUNK, read once a process), else MUSE_ATTN_LEAST_CHUNK. */
MUSE_K_API int muse_k_attention_fast_least(void);

/* Bytes of workspace for hq query heads of hd at key ranges of at most max_len positions over
 * up to rows rows (a launch of more rows runs in row groups of what fits). */
MUSE_K_API size_t muse_k_attention_fast_workspace(long hq, long hd, int64_t max_len, long rows);

/* muse_k_attention's contract (the cache already written): o[R, hq * hd] = fp16(softmax(q k^T *
 * scale) v * sigmoid(g)), padding rows zeros; max_len bounds every row's key range (window, or
 * the positions a sequence's table holds). ws of ws_bytes: the caller's workspace. ctx: st,
 * rows, seqs, positions. Returns the CUDA error code (cudaErrorInvalidValue: a shape it does not
 * take or a workspace too small for one row). */
MUSE_K_API int muse_k_attention_fast(const muse_k_ctx *ctx, muse_k_kv kv, const float *q,
                                     const float *g, float *o, long hq, long hd, long group,
                                     long window, double scale, int64_t max_len, void *ws,
                                     size_t ws_bytes);
#endif
