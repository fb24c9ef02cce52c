/* The memory plan: how the engine splits memory between the KV pool, the prompt cache, the
 * workspace, the request areas and the reserve, per rank, computed once at start. */
#ifndef MUSE_MEMORY_PLAN_H
#define MUSE_MEMORY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define MUSE_PLAN_MAX_RANKS 8

/* What one rank holds. The first terms are planned before the backend exists; the measured
 * ones are what it allocated (muse_memory_plan_measured). */
typedef struct {
    int rank;
    uint64_t kv_block_bytes;     /* one block: every full layer's K and V for MUSE_KV_BLOCK */
    int64_t blocks_per_stream;   /* a stream's whole context */
    int64_t cache_blocks;        /* what the prompt cache budget adds to the pool */
    int64_t kv_blocks;           /* the pool: --kv-blocks, else streams x blocks_per_stream +
                                  * cache_blocks, at most INT32_MAX */
    uint64_t prompt_cache_bytes; /* the prompt cache's budget (KV blocks + sliding state) */
    uint64_t request_bytes;      /* the shared segment's request areas, every slot */
    uint64_t reserve_bytes;      /* kept for the rest of the machine */
    uint64_t weights_bytes;      /* measured: the rank's shard plus the replicated tensors */
    uint64_t kv_bytes;           /* measured: the pool and the sliding layers' rings */
    uint64_t pool_bytes;         /* measured: of kv_bytes, the pool */
    uint64_t workspace_bytes;    /* measured: activations and scratch */
} muse_rank_plan;

typedef struct {
    int streams, slots; /* lanes; request slots (lanes + queue) */
    int64_t context;
    int n_ranks; /* tensor-parallel ranks (--ranks); every rank plans the same terms */
    muse_rank_plan ranks[MUSE_PLAN_MAX_RANKS];
} muse_memory_plan;

/* What the plan is made from: the serve flags and the model's KV bytes a position. */
typedef struct {
    int streams, queue;
    int64_t context;
    int64_t kv_blocks; /* 0: every stream's whole context plus the prompt cache budget */
    double prompt_cache_gib, reserve_gib;
    uint64_t request_bytes;      /* one slot's request area */
    uint64_t kv_bytes_per_token; /* full-attention KV of one position on one rank; 0: no model */
    int ranks;                   /* 0 or 1: one */
} muse_memory_opts;

void muse_memory_plan_make(const muse_memory_opts *o, muse_memory_plan *p);

/* Records what the backend allocated for a rank. */
void muse_memory_plan_measured(muse_memory_plan *p, int rank, uint64_t weights_bytes,
                               uint64_t kv_bytes, uint64_t pool_bytes, uint64_t workspace_bytes);

/* What admission can still hand out on a rank: the free pool blocks, and the rings of the
 * free lanes. */
uint64_t muse_memory_plan_left(const muse_memory_plan *p, int rank, uint64_t free_blocks,
                               int free_lanes);

/* The plan as one line a rank (for the start-up print); the length written. */
size_t muse_memory_plan_text(const muse_memory_plan *p, char *buf, size_t len);

#endif
