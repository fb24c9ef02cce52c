/* The memory plan's arithmetic (see memory_plan.h): pool blocks, budgets and what is left. */
#include "serve/memory_plan.h"

#include <stdio.h>
#include <string.h>

#include "base/flags.h"
#include "model/kv_pool.h"

void muse_memory_plan_make(const muse_memory_opts *o, muse_memory_plan *p)
{
    memset(p, 0, sizeof *p);
    p->streams = o->streams;
    p->slots = o->streams + o->queue;
    p->context = o->context;
    p->n_ranks =
        o->ranks > 1 ? (o->ranks < MUSE_PLAN_MAX_RANKS ? o->ranks : MUSE_PLAN_MAX_RANKS) : 1;
    muse_rank_plan *r = &p->ranks[0];
    r->kv_block_bytes = MUSE_KV_BLOCK * o->kv_bytes_per_token;
    r->blocks_per_stream = (o->context + MUSE_KV_BLOCK - 1) / MUSE_KV_BLOCK;
    r->prompt_cache_bytes = muse_gib_bytes(o->prompt_cache_gib);
    r->reserve_bytes = muse_gib_bytes(o->reserve_gib);
    r->request_bytes = (uint64_t)p->slots * o->request_bytes;
    /* the pool holds every stream's context, plus what the prompt cache may keep */
    if (!o->kv_blocks && r->kv_block_bytes)
        r->cache_blocks = (int64_t)(o->prompt_cache_gib * 1073741824.0 / (double)r->kv_block_bytes);
    int64_t blocks =
        o->kv_blocks ? o->kv_blocks : o->streams * r->blocks_per_stream + r->cache_blocks;
    r->kv_blocks = blocks > INT32_MAX ? INT32_MAX : blocks;
    for (int i = 1; i < p->n_ranks; i++) {
        p->ranks[i] = *r;
        p->ranks[i].rank = i;
    }
}

void muse_memory_plan_measured(muse_memory_plan *p, int rank, uint64_t weights_bytes,
                               uint64_t kv_bytes, uint64_t pool_bytes, uint64_t workspace_bytes)
{
    if (rank < 0 || rank >= p->n_ranks) return;
    p->ranks[rank].weights_bytes = weights_bytes;
    p->ranks[rank].kv_bytes = kv_bytes;
    p->ranks[rank].pool_bytes = pool_bytes;
    p->ranks[rank].workspace_bytes = workspace_bytes;
}

uint64_t muse_memory_plan_left(const muse_memory_plan *p, int rank, uint64_t free_blocks,
                               int free_lanes)
{
    if (rank < 0 || rank >= p->n_ranks) return 0;
    const muse_rank_plan *r = &p->ranks[rank];
    uint64_t rings = r->kv_bytes > r->pool_bytes && p->streams
                         ? (r->kv_bytes - r->pool_bytes) / (uint64_t)p->streams
                         : 0;
    return free_blocks * r->kv_block_bytes + rings * (uint64_t)(free_lanes > 0 ? free_lanes : 0);
}

static double mib(uint64_t bytes)
{
    return (double)bytes / 1048576.0;
}

size_t muse_memory_plan_text(const muse_memory_plan *p, char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = 0;
    for (int i = 0; i < p->n_ranks && at < len; i++) {
        const muse_rank_plan *r = &p->ranks[i];
        int w = snprintf(buf + at, len - at,
                         "%srank %d: weights %.1f MiB, KV %.1f MiB (pool %lld blocks of %.3f MiB, "
                         "%lld a stream, "
                         "%lld for the prompt cache; rings %.1f MiB), prompt cache %.1f MiB, "
                         "workspace %.1f MiB, requests %.1f MiB (%d slots), reserve %.1f MiB",
                         i ? "\n" : "", r->rank, mib(r->weights_bytes), mib(r->kv_bytes),
                         (long long)r->kv_blocks, mib(r->kv_block_bytes),
                         (long long)r->blocks_per_stream, (long long)r->cache_blocks,
                         mib(r->kv_bytes > r->pool_bytes ? r->kv_bytes - r->pool_bytes : 0),
                         mib(r->prompt_cache_bytes), mib(r->workspace_bytes), mib(r->request_bytes),
                         p->slots, mib(r->reserve_bytes));
        if (w < 0) break;
        at += (size_t)w;
    }
    return at < len ? at : (len ? len - 1 : 0);
}
