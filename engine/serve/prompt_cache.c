#include "serve/prompt_cache.h"

#include "base/muse_common.h"
#include "base/sha256.h"

#include <stdbool.h>

/* Open addressing over entry slots; a slot is live when blocks != NULL. */
struct muse_pcache {
    muse_kv_pool *kv;
    uint32_t *held; /* [n_blocks] entries holding each block: a block is charged once */
    uint64_t block_bytes, budget, used, clock, hits, misses;
    size_t cap, live, tombs;
    muse_pcache_entry *slots;
    uint8_t *tomb;       /* 1: a deleted entry's slot (keeps probe chains intact) */
    uint64_t snap_bytes; /* one snapshot slot */
    int n_snaps, n_free_snaps;
    int *free_snaps; /* stack of free snapshot slots */
};

int muse_pcache_slots_for(uint64_t budget_bytes, uint64_t slot_bytes)
{
    if (!slot_bytes) return 0;
    uint64_t n = budget_bytes / (slot_bytes + sizeof(muse_pcache_entry));
    return n > 1u << 20 ? 1 << 20 : (int)n;
}

muse_pcache *muse_pcache_create(uint64_t budget_bytes, muse_kv_pool *kv, uint64_t block_bytes,
                                int n_slots, uint64_t slot_bytes)
{
    muse_pcache *pc = MUSE_CALLOC(1, sizeof *pc);
    pc->snap_bytes = slot_bytes;
    pc->n_snaps = pc->n_free_snaps = n_slots;
    pc->free_snaps = MUSE_MALLOC((size_t)(n_slots > 0 ? n_slots : 1) * sizeof *pc->free_snaps);
    for (int i = 0; i < n_slots; i++) pc->free_snaps[i] = n_slots - 1 - i;
    pc->kv = kv;
    pc->held = MUSE_CALLOC((size_t)(kv->n_blocks > 0 ? kv->n_blocks : 1), sizeof *pc->held);
    pc->block_bytes = block_bytes;
    pc->budget = budget_bytes;
    pc->cap = 64;
    pc->slots = MUSE_CALLOC(pc->cap, sizeof *pc->slots);
    pc->tomb = MUSE_CALLOC(pc->cap, 1);
    return pc;
}

static void drop(muse_pcache *pc, size_t i)
{
    muse_pcache_entry *e = &pc->slots[i];
    for (int64_t b = 0; b < e->n_blocks; b++) {
        if (--pc->held[e->blocks[b]] == 0) pc->used -= pc->block_bytes;
        muse_kv_unref(pc->kv, e->blocks[b]);
    }
    free(e->blocks);
    if (e->slot >= 0) pc->free_snaps[pc->n_free_snaps++] = e->slot;
    pc->used -= e->bytes;
    memset(e, 0, sizeof *e);
    pc->tomb[i] = 1;
    pc->live--;
    pc->tombs++;
}

void muse_pcache_destroy(muse_pcache *pc)
{
    if (!pc) return;
    for (size_t i = 0; i < pc->cap; i++)
        if (pc->slots[i].blocks) drop(pc, i);
    free(pc->slots);
    free(pc->tomb);
    free(pc->held);
    free(pc->free_snaps);
    free(pc);
}

void muse_pcache_keys(const char *scope, size_t scope_len, const int32_t *tokens, int64_t n_blocks,
                      uint8_t (*keys)[32])
{
    uint8_t prev[32];
    muse_sha256 s;
    muse_sha256_init(&s);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)scope_len >> (8 * i));
    muse_sha256_update(&s, "muse-prompt-cache-v1", 20);
    muse_sha256_update(&s, len, 8);
    muse_sha256_update(&s, scope, scope_len);
    muse_sha256_final(&s, prev);
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t le[4 * MUSE_KV_BLOCK];
        for (int t = 0; t < MUSE_KV_BLOCK; t++) {
            uint32_t id = (uint32_t)tokens[b * MUSE_KV_BLOCK + t];
            for (int k = 0; k < 4; k++) le[4 * t + k] = (uint8_t)(id >> (8 * k));
        }
        muse_sha256_init(&s);
        muse_sha256_update(&s, prev, 32);
        muse_sha256_update(&s, le, sizeof le);
        muse_sha256_final(&s, keys[b]);
        memcpy(prev, keys[b], 32);
    }
}

static size_t home(const muse_pcache *pc, const uint8_t key[32])
{
    uint64_t h;
    memcpy(&h, key, 8);
    return (size_t)(h & (pc->cap - 1));
}

/* The slot holding key, or SIZE_MAX. */
static size_t lookup(const muse_pcache *pc, const uint8_t key[32])
{
    for (size_t i = home(pc, key), n = 0; n < pc->cap; i = (i + 1) & (pc->cap - 1), n++) {
        if (pc->slots[i].blocks && memcmp(pc->slots[i].key, key, 32) == 0) return i;
        if (!pc->slots[i].blocks && !pc->tomb[i]) return SIZE_MAX;
    }
    return SIZE_MAX;
}

static void rehash(muse_pcache *pc, size_t cap)
{
    muse_pcache_entry *old = pc->slots;
    size_t old_cap = pc->cap;
    free(pc->tomb);
    pc->cap = cap;
    pc->slots = MUSE_CALLOC(cap, sizeof *pc->slots);
    pc->tomb = MUSE_CALLOC(cap, 1);
    pc->tombs = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].blocks) continue;
        size_t j = home(pc, old[i].key);
        while (pc->slots[j].blocks) j = (j + 1) & (cap - 1);
        pc->slots[j] = old[i];
    }
    free(old);
}

const muse_pcache_entry *muse_pcache_find(muse_pcache *pc, const uint8_t key[32])
{
    size_t i = lookup(pc, key);
    if (i == SIZE_MAX) return NULL;
    pc->slots[i].last_used = ++pc->clock;
    return &pc->slots[i];
}

int muse_pcache_evict_one(muse_pcache *pc)
{
    size_t oldest = SIZE_MAX;
    for (size_t i = 0; i < pc->cap; i++)
        if (pc->slots[i].blocks &&
            (oldest == SIZE_MAX || pc->slots[i].last_used < pc->slots[oldest].last_used))
            oldest = i;
    if (oldest == SIZE_MAX) return 0;
    drop(pc, oldest);
    return 1;
}

const muse_pcache_entry *muse_pcache_insert(muse_pcache *pc, const uint8_t key[32],
                                            int64_t n_blocks, const int32_t *blocks)
{
    /* an entry costs its snapshot slot and bookkeeping; its blocks cost only where no other
     * entry (a shorter prefix of the same prompt, say) holds them already */
    uint64_t bytes = pc->snap_bytes + sizeof(muse_pcache_entry);
    bool needs_slot = pc->snap_bytes > 0;
    if (n_blocks <= 0 || bytes + (uint64_t)n_blocks * pc->block_bytes > pc->budget ||
        (needs_slot && pc->n_snaps == 0) || lookup(pc, key) != SIZE_MAX)
        return NULL;
    for (;;) {
        uint64_t fresh = 0; /* recounted: an eviction may let go of blocks this entry shares */
        for (int64_t b = 0; b < n_blocks; b++) fresh += pc->held[blocks[b]] == 0;
        bool fits = pc->used + bytes + fresh * pc->block_bytes <= pc->budget;
        if ((fits && (!needs_slot || pc->n_free_snaps > 0)) || !muse_pcache_evict_one(pc)) break;
    }
    if (needs_slot && pc->n_free_snaps == 0) return NULL;
    if (2 * (pc->live + pc->tombs + 1) > pc->cap)
        rehash(pc, 2 * (pc->live + 1) > pc->cap / 2 ? pc->cap * 2 : pc->cap);
    size_t i = home(pc, key);
    while (pc->slots[i].blocks) i = (i + 1) & (pc->cap - 1);
    if (pc->tomb[i]) {
        pc->tomb[i] = 0;
        pc->tombs--;
    }
    muse_pcache_entry *e = &pc->slots[i];
    memcpy(e->key, key, 32);
    e->n_blocks = n_blocks;
    e->blocks = MUSE_MALLOC((size_t)n_blocks * sizeof *e->blocks);
    for (int64_t b = 0; b < n_blocks; b++) {
        muse_kv_ref(pc->kv, blocks[b]);
        if (pc->held[blocks[b]]++ == 0) pc->used += pc->block_bytes;
        e->blocks[b] = blocks[b];
    }
    e->slot = needs_slot ? pc->free_snaps[--pc->n_free_snaps] : -1;
    e->bytes = bytes;
    e->last_used = ++pc->clock;
    pc->used += bytes;
    pc->live++;
    return e;
}

void muse_pcache_count(muse_pcache *pc, int hit)
{
    if (hit)
        pc->hits++;
    else
        pc->misses++;
}

void muse_pcache_stats_get(const muse_pcache *pc, muse_pcache_stats *out)
{
    *out = (muse_pcache_stats){pc->budget, pc->used, pc->live, pc->hits, pc->misses};
}
