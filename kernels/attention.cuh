/* attention: the KV write into paged fp16 blocks / sliding rings, then causal (or sliding
 * window) softmax attention with the output gate. */
#ifndef MUSE_K_ATTENTION_CUH
#define MUSE_K_ATTENTION_CUH
#include "launch.h"
/* Where a layer's cache lives: cap > 0 a ring [max_seqs][cap][kv_width]; cap 0 blocks
 * [n_blocks][16][kv_width] through tables [max_seqs][blocks_per_seq]. */
typedef struct {
    uint16_t *k, *v;
    int64_t cap;
    const int32_t *tables;
    int64_t blocks_per_seq;
    long kv_width;
} muse_k_kv;
/* k, v rows of kv_width floats at stride ld (>= kv_width: a rank's heads out of a whole k) to
 * the cache at each row's (seq, position); rows with seq < 0 skip. ctx: st, rows, seqs,
 * positions */
MUSE_K_API int muse_k_kv_write(const muse_k_ctx *ctx, muse_k_kv kv, const float *k, const float *v,
                               long ld);
/* o[R, Hq * hd] = fp16(softmax(q k^T * scale) v * sigmoid(g)) over positions
 * [max(0, p - window + 1) or 0, p] of the row's sequence; query head h reads KV head
 * h / group; padding rows (seq < 0) get zeros. ctx: st, rows, seqs, positions */
MUSE_K_API int muse_k_attention(const muse_k_ctx *ctx, muse_k_kv kv, const float *q, const float *g,
                                float *o, long hq, long hd, long group, long window, double scale);
#endif
