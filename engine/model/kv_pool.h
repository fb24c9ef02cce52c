/* Paged KV bookkeeping for full-attention layers: fixed-size blocks from one pool per rank,
 * a block table per sequence slot, and reference counts so the prompt cache can share a
 * prefix's blocks with new sequences. The bytes live in the backend; this owns only ids. */
#ifndef MUSE_KV_POOL_H
#define MUSE_KV_POOL_H

#include <stdint.h>

#include "model/kv_addr.h" /* MUSE_KV_BLOCK and the offsets of a row */

typedef struct {
    int32_t n_blocks;
    int32_t n_free;
    int32_t *free_list; /* stack of free block ids */
    int32_t *refs;      /* per block: sequences + cache entries holding it */
    int max_seqs;
    int64_t blocks_per_seq;
    int32_t *tables; /* [max_seqs][blocks_per_seq]: block id or -1 */
} muse_kv_pool;

void muse_kv_pool_init(muse_kv_pool *p, int32_t n_blocks, int max_seqs, int64_t context);
void muse_kv_pool_destroy(muse_kv_pool *p);

static inline int32_t *muse_kv_table(const muse_kv_pool *p, int seq)
{
    return p->tables + (int64_t)seq * p->blocks_per_seq;
}
/* Blocks seq still needs to hold positions [0, positions). */
int64_t muse_kv_blocks_needed(const muse_kv_pool *p, int seq, int64_t positions);
/* Gives seq blocks for positions [0, positions): 0, or -1 (and nothing taken) when the pool
 * has too few free blocks. */
int muse_kv_ensure(muse_kv_pool *p, int seq, int64_t positions);
/* seq's table starts with these (shared, read-only) blocks. seq must hold none yet. */
void muse_kv_share(muse_kv_pool *p, int seq, const int32_t *blocks, int64_t n);
/* Drops seq's blocks; a block goes back to the pool when nothing holds it. */
void muse_kv_release(muse_kv_pool *p, int seq);
void muse_kv_ref(muse_kv_pool *p, int32_t block);
void muse_kv_unref(muse_kv_pool *p, int32_t block);

struct muse_config;
/* Bytes of KV cache per token of one sequence (all layers, fp16 K and V, one rank). */
uint64_t muse_kv_bytes_per_token(const struct muse_config *c);
/* The same for the full-attention layers only: what the paged pool holds a token. */
uint64_t muse_kv_full_bytes_per_token(const struct muse_config *c);
/* The sliding layers' K and V of W positions: one prompt-cache snapshot. */
uint64_t muse_kv_snapshot_bytes(const struct muse_config *c);
/* KV heads one of `ranks` tensor-parallel ranks holds (one when there are fewer than ranks). */
int64_t muse_kv_heads_per_rank(const struct muse_config *c, int ranks);
/* The bytes above for one rank's share (its KV heads). */
uint64_t muse_kv_rank_bytes(const struct muse_config *c, uint64_t bytes, int ranks);

#endif
