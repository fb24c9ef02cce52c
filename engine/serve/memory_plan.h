/* The memory plan: how the engine splits memory between the weights, the KV pool, the sliding
 * rings, the prompt cache's snapshots, the workspace, the request areas and the reserve, per
 * rank, computed from the config and the flags before any large allocation, checked against the
 * device's memory, and later corrected by what the backend measured. */
#ifndef MUSE_MEMORY_PLAN_H
#define MUSE_MEMORY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "base/muse_common.h"
#include "pack/config.h"

#define MUSE_PLAN_MAX_RANKS 8
#define MUSE_RESERVE_ENV    "MUSE_MEMORY_RESERVE_GIB"

/* Where a rank's memory lives: the reserve's default and what the fit check counts follow it. */
typedef enum {
    MUSE_DEVICE_CPU,      /* host memory; no reserve unless given */
    MUSE_DEVICE_DISCRETE, /* a GPU of its own memory: max(1 GiB, 1/32 of it) kept back */
    MUSE_DEVICE_UNIFIED   /* a GPU sharing the host's memory: max(4 GiB, 1/10 of it) kept back */
} muse_device_kind;

/* "cpu", "discrete", "unified". */
const char *muse_device_kind_name(muse_device_kind k);

/* The default reserve of a device of device_bytes (0: unknown, then the floor). */
uint64_t muse_reserve_default_bytes(muse_device_kind k, uint64_t device_bytes);

/* The reserve in GiB: flag_gib when >= 0 (--reserve-gib), else MUSE_MEMORY_RESERVE_GIB when set
 * (a number in 0 .. 1048576, refused by name otherwise), else the device's default. */
int muse_reserve_resolve(double flag_gib, muse_device_kind k, uint64_t device_bytes, double *gib,
                         muse_err *e);

/* What one rank holds. Every term is planned from the config; weights, kv, pool, workspace and
 * snapshots are replaced by what the backend allocated (muse_memory_plan_measured). */
typedef struct {
    int rank;
    uint64_t kv_block_bytes;     /* one block: every full layer's K and V for MUSE_KV_BLOCK */
    int64_t blocks_per_stream;   /* a stream's whole context */
    int64_t cache_blocks;        /* what the prompt cache budget adds to the pool */
    int64_t kv_blocks;           /* the pool: --kv-blocks, else streams x blocks_per_stream +
                                  * cache_blocks, at most INT32_MAX */
    uint64_t prompt_cache_bytes; /* the prompt cache's budget (KV blocks + sliding state) */
    uint64_t request_bytes;      /* request areas: the shared segment's and the private copies */
    uint64_t reserve_bytes;      /* kept for the rest of the machine */
    uint64_t weights_bytes;      /* the rank's shard plus the replicated tensors */
    uint64_t kv_bytes;           /* the pool and the sliding layers' rings */
    uint64_t pool_bytes;         /* of kv_bytes, the pool */
    uint64_t workspace_bytes;    /* activations, scratch and staging */
    int snapshot_slots;          /* sliding-window snapshots the prompt cache may hold */
    uint64_t snapshots_bytes;    /* their memory */
    uint64_t total_bytes;        /* every term above plus the reserve */
    uint64_t device_bytes;       /* the rank's device memory; 0: no limit, no check */
} muse_rank_plan;

typedef struct {
    int streams, slots; /* lanes; request slots (lanes + queue) */
    int64_t context;
    int n_ranks; /* tensor-parallel ranks (--ranks); every rank plans the same terms */
    muse_device_kind device_kind;
    muse_rank_plan ranks[MUSE_PLAN_MAX_RANKS];
} muse_memory_plan;

/* What the plan is made from: the serve flags and the model's config. */
typedef struct {
    int streams, queue;
    int64_t context;
    int64_t kv_blocks; /* 0: every stream's whole context plus the prompt cache budget */
    double prompt_cache_gib;
    double reserve_gib;          /* < 0: the device's default (muse_reserve_default_bytes) */
    uint64_t request_bytes;      /* one slot's request area */
    uint64_t kv_bytes_per_token; /* without cfg: full-attention KV of one position on one rank */
    int ranks;                   /* 0 or 1: one */
    muse_device_kind device_kind;
    /* a rank's device memory; 0: no limit and no check. The CPU backend takes --device-gib; a
     * GPU backend passes its device's memory here before the plan is made. */
    uint64_t device_bytes;
    /* the model's terms from the config alone (NULL: no model, the script backend) */
    const muse_config *cfg;
    double bits, head_bits; /* EXL3 bits a weight (0: fp16) and the head's */
    long max_rows;          /* rows a round: rings and workspace */
    /* a backend's own count of its workspace and staging a rank (muse_backend_plan_memory),
     * held while muse_memory_plan_context_fits varies the context; 0: the estimate */
    uint64_t workspace_bytes;
    /* and what it holds beside the pack's tensors (fp32 copies, tables, descriptors): weights */
    uint64_t weights_extra;
    int threads; /* the CPU backend's per-thread scratch (0: one) */
} muse_memory_opts;

void muse_memory_plan_make(const muse_memory_opts *o, muse_memory_plan *p);

/* Records what the backend allocated for a rank (and recomputes its total). */
void muse_memory_plan_measured(muse_memory_plan *p, int rank, uint64_t weights_bytes,
                               uint64_t kv_bytes, uint64_t pool_bytes, uint64_t workspace_bytes,
                               uint64_t snapshots_bytes);

/* The first rank whose total exceeds its device's memory; -1 when every rank fits. */
int muse_memory_plan_misfit(const muse_memory_plan *p);

/* The refusal: every term of every rank in GiB, what is over, and the flags that fix it. */
size_t muse_memory_plan_refusal(const muse_memory_plan *p, char *buf, size_t len);

/* The longest context (tokens, a multiple of MUSE_KV_BLOCK, at most max_position_embeddings)
 * that streams lanes fit on every rank with o's other terms; 0 when not even one block fits.
 * Without a device limit or a config: max_position_embeddings (or o->context). */
int64_t muse_memory_plan_context_fits(const muse_memory_opts *o, int streams);

/* The most rows a round, of most halved down to just above o->max_rows, whose plan fits, each
 * with the workspace ws(ctx, rows) gives (0 from it: an error, stop); o->max_rows when none
 * larger fits or the device has no limit. */
long muse_memory_plan_most_rows(const muse_memory_opts *o, long most,
                                uint64_t (*ws)(void *ctx, long rows), void *ctx);

/* What admission can still hand out on a rank: the free pool blocks, and the rings of the
 * free lanes. */
uint64_t muse_memory_plan_left(const muse_memory_plan *p, int rank, uint64_t free_blocks,
                               int free_lanes);

/* The plan as one line a rank (for the start-up print); the length written. */
size_t muse_memory_plan_text(const muse_memory_plan *p, char *buf, size_t len);

/* The plan as a table, one term a line and one column a rank, in GiB (muse-engine plan). */
size_t muse_memory_plan_table(const muse_memory_plan *p, char *buf, size_t len);

#endif
