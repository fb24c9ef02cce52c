/* The prompt cache: KV blocks (shared through the pool's reference counts) and the
 * sliding-window state at block-aligned prefix points, keyed by a SHA-256 chain over the
 * cache scope and the token blocks, so two scopes never share an entry. LRU within a byte
 * budget; the used bytes count every held block once (nested prefixes of one prompt share
 * blocks) plus each entry's sliding snapshot and bookkeeping. */
#ifndef MUSE_PROMPT_CACHE_H
#define MUSE_PROMPT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/kv_pool.h"

typedef struct {
    uint8_t key[32];
    int64_t n_blocks; /* the prefix is n_blocks * MUSE_KV_BLOCK tokens */
    int32_t *blocks;
    int slot; /* the backend's snapshot slot holding the sliding window at the prefix end (-1: none)
               */
    uint64_t bytes, last_used; /* bytes: the snapshot and bookkeeping, not the shared blocks */
} muse_pcache_entry;

typedef struct muse_pcache muse_pcache;

/* n_slots snapshot slots of slot_bytes each (the backend allocated them at start); with
 * slot_bytes 0 (no sliding layers) entries need none. */
muse_pcache *muse_pcache_create(uint64_t budget_bytes, muse_kv_pool *kv, uint64_t block_bytes,
                                int n_slots, uint64_t slot_bytes);
/* Snapshot slots a budget can pay for (each with its entry's bookkeeping). */
int muse_pcache_slots_for(uint64_t budget_bytes, uint64_t slot_bytes);
void muse_pcache_destroy(muse_pcache *pc);

/* keys[i] identifies the prefix of i + 1 blocks of tokens under scope. */
void muse_pcache_keys(const char *scope, size_t scope_len, const int32_t *tokens, int64_t n_blocks,
                      uint8_t (*keys)[32]);
/* The entry for a key (marked most recently used), or NULL. */
const muse_pcache_entry *muse_pcache_find(muse_pcache *pc, const uint8_t key[32]);
/* Keeps blocks[0..n_blocks) (referenced) and takes a snapshot slot, evicting least recently
 * used entries to stay within budget and free a slot. Returns the entry, whose slot the
 * caller then fills, or NULL when it can never fit or the key is present. */
const muse_pcache_entry *muse_pcache_insert(muse_pcache *pc, const uint8_t key[32],
                                            int64_t n_blocks, const int32_t *blocks);
/* Drops the least recently used entry; 0 when empty. */
int muse_pcache_evict_one(muse_pcache *pc);

typedef struct {
    uint64_t budget_bytes, used_bytes, entries, hits, misses;
} muse_pcache_stats;
void muse_pcache_count(muse_pcache *pc, int hit);
void muse_pcache_stats_get(const muse_pcache *pc, muse_pcache_stats *out);

#endif
