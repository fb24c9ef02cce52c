/* KV block pool and prompt cache: reference counts, scopes, LRU, and the byte budget. */
#include <stdlib.h>

#include "model/kv_pool.h"
#include "serve/prompt_cache.h"
#include "tap.h"

int main(void)
{
    muse_kv_pool kv;
    muse_kv_pool_init(&kv, 40, 2, 16 * 40);
    is_int(kv.n_free, 40, "a new pool has every block free");
    is_int(muse_kv_ensure(&kv, 0, 33), 0, "33 positions take 3 blocks");
    is_int(kv.n_free, 37, "three blocks are taken");
    is_int(muse_kv_blocks_needed(&kv, 0, 48), 0, "a third block covers positions up to 47");
    is_int(muse_kv_ensure(&kv, 1, 16 * 38), -1, "a request past the free blocks is refused");
    is_int(kv.n_free, 37, "a refused request takes nothing");

    /* tokens: two prompts sharing a 2-block prefix, and another scope */
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++) a[i] = b[i] = (i * 7 + 3) % 1000;
    b[40] = 999;
    uint8_t ka[4][32], kb[4][32], kc[4][32];
    muse_pcache_keys("team-a", 6, a, 4, ka);
    muse_pcache_keys("team-a", 6, b, 4, kb);
    muse_pcache_keys("team-b", 6, a, 4, kc);
    ok(memcmp(ka[1], kb[1], 32) == 0, "the same tokens under one scope give the same prefix key");
    ok(memcmp(ka[2], kb[2], 32) != 0, "a different block gives a different key from there on");
    ok(memcmp(ka[0], kc[0], 32) != 0 && memcmp(ka[3], kc[3], 32) != 0,
       "another scope never gives the same key");

    uint64_t block_bytes = 1000, entry_overhead = sizeof(muse_pcache_entry);
    uint64_t budget = 3 * (2 * block_bytes + 100 + entry_overhead); /* three 2-block entries */
    int slots = muse_pcache_slots_for(budget, 100);
    ok(slots >= 3 && (uint64_t)slots * (100 + entry_overhead) <= budget,
       "the budget pays for %d snapshot slots, no more", slots);
    muse_pcache *pc = muse_pcache_create(budget, &kv, block_bytes, slots, 100);
    const int32_t *t0 = muse_kv_table(&kv, 0);
    const muse_pcache_entry *first = muse_pcache_insert(pc, ka[1], 2, t0);
    ok(first && first->slot >= 0 && first->slot < slots, "a prefix of 2 blocks is kept in a slot");
    is_int(kv.refs[t0[0]], 2, "a kept block is held by the sequence and the cache");
    ok(muse_pcache_insert(pc, ka[1], 2, t0) == NULL, "the same key is kept once");
    ok(muse_pcache_find(pc, kb[1]) != NULL, "another prompt with the same prefix finds it");
    ok(muse_pcache_find(pc, kc[1]) == NULL, "another scope does not");
    muse_kv_release(&kv, 0);
    is_int(kv.n_free, 38, "releasing the sequence frees the block the cache does not hold");

    /* fill past the budget: used bytes never exceed it, the least recently used goes first */
    muse_pcache_stats st;
    int over = 0;
    uint8_t keys[12][32];
    for (int i = 0; i < 12; i++) {
        int32_t toks[32];
        for (int j = 0; j < 32; j++) toks[j] = i * 100 + j;
        uint8_t k2[2][32];
        muse_pcache_keys("fill", 4, toks, 2, k2);
        memcpy(keys[i], k2[1], 32);
        muse_kv_ensure(&kv, 1, 32);
        muse_pcache_insert(pc, keys[i], 2, muse_kv_table(&kv, 1));
        muse_kv_release(&kv, 1);
        if (i == 9) muse_pcache_find(pc, keys[8]); /* 8 becomes the most recently used */
        muse_pcache_stats_get(pc, &st);
        over |= st.used_bytes > budget;
    }
    ok(!over, "used bytes never exceed the budget while filling it four times over");
    is_int(st.entries, 3, "the budget holds three entries");
    ok(muse_pcache_find(pc, keys[11]) && muse_pcache_find(pc, keys[10]) &&
           muse_pcache_find(pc, keys[8]),
       "the most recently used entries stay");
    ok(!muse_pcache_find(pc, keys[9]) && !muse_pcache_find(pc, ka[1]),
       "the least recently used went");
    is_int(kv.n_free, 40 - 6, "evicted entries gave their blocks back (3 entries x 2 blocks held)");
    ok(muse_pcache_insert(pc, keys[0], 100, muse_kv_table(&kv, 0)) == NULL,
       "an entry larger than the whole budget is not kept");
    while (muse_pcache_evict_one(pc)) continue;
    is_int(kv.n_free, 40, "an empty cache holds no block");

    /* nested prefixes of one prompt share blocks: each block is charged once */
    muse_kv_ensure(&kv, 0, 48);
    const muse_pcache_entry *e2 = muse_pcache_insert(pc, ka[1], 2, muse_kv_table(&kv, 0));
    int slot2 = e2 ? e2->slot : -1;
    const muse_pcache_entry *e3 = muse_pcache_insert(pc, ka[2], 3, muse_kv_table(&kv, 0));
    ok(e3 && slot2 >= 0 && e3->slot != slot2, "two live entries hold two different slots");
    muse_kv_release(&kv, 0);
    muse_pcache_stats_get(pc, &st);
    is_int(st.used_bytes, 3 * block_bytes + 2 * (100 + entry_overhead),
           "prefixes of 2 and 3 blocks cost 3 blocks and two snapshots");
    while (muse_pcache_evict_one(pc)) continue;
    muse_pcache_count(pc, 1);
    muse_pcache_count(pc, 0);
    muse_pcache_count(pc, 0);
    muse_pcache_stats_get(pc, &st);
    ok(st.hits == 1 && st.misses == 2 && st.used_bytes == 0, "hits, misses and bytes are counted");
    muse_pcache_destroy(pc);

    /* fewer slots than the budget would allow: a slot is freed by evicting the oldest entry */
    pc = muse_pcache_create(budget, &kv, block_bytes, 2, 100);
    muse_kv_ensure(&kv, 0, 64);
    const muse_pcache_entry *s0 = muse_pcache_insert(pc, ka[0], 1, muse_kv_table(&kv, 0));
    const muse_pcache_entry *s1 = muse_pcache_insert(pc, ka[1], 2, muse_kv_table(&kv, 0));
    ok(s0 && s1, "two entries take the two slots");
    const muse_pcache_entry *s2 = muse_pcache_insert(pc, ka[2], 3, muse_kv_table(&kv, 0));
    muse_pcache_stats_get(pc, &st);
    ok(s2 && st.entries == 2 && !muse_pcache_find(pc, ka[0]) && muse_pcache_find(pc, ka[1]),
       "a third entry evicts the least recently used one for its slot");
    muse_kv_release(&kv, 0);
    muse_pcache_destroy(pc);
    pc = muse_pcache_create(budget, &kv, block_bytes, 0, 100);
    muse_kv_ensure(&kv, 0, 16);
    ok(muse_pcache_insert(pc, ka[0], 1, muse_kv_table(&kv, 0)) == NULL,
       "with no slots nothing that needs a snapshot is kept");
    muse_pcache_destroy(pc);
    pc = muse_pcache_create(budget, &kv, block_bytes, 0, 0);
    const muse_pcache_entry *ns = muse_pcache_insert(pc, ka[0], 1, muse_kv_table(&kv, 0));
    ok(ns && ns->slot == -1, "a model without sliding layers keeps entries without a slot");
    muse_kv_release(&kv, 0);
    muse_pcache_destroy(pc);
    muse_kv_pool_destroy(&kv);
    return done_testing();
}
