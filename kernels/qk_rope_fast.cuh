/* qk_norm_rope on the fast path: per head, unweighted rms, RoPE NEOX, fp16; a warp a head. */
#ifndef MUSE_K_QK_ROPE_FAST_CUH
#define MUSE_K_QK_ROPE_FAST_CUH
#include "attention.cuh"
#include "launch.h"
/* x [R, heads * head_dim] in place; theta 0: no rotation; ctx: st, rows, positions */
MUSE_K_API int muse_k_qk_norm_rope_fast(const muse_k_ctx *ctx, float *x, long heads, long head_dim,
                                        double theta, double eps);
/* The attention's inputs in one launch: q [R, hq * head_dim] and k [R, hk * head_dim] as
 * muse_k_qk_norm_rope_fast does them, then k's columns [off, off + kv.kv_width) and v's (v
 * [R, hk * head_dim]) to the cache as muse_k_kv_write writes them; the same bits as those three
 * launches. ctx: st, rows, seqs, positions */
MUSE_K_API int muse_k_attn_in_fast(const muse_k_ctx *ctx, float *q, long hq, float *k, long hk,
                                   const float *v, long head_dim, long off, muse_k_kv kv,
                                   double theta, double eps);
#endif
