/* The scheduler's glue to the prompt cache: the prefix points a prompt may be kept at, a new
 * lane resumed from the longest cached prefix, and prefixes kept as a prompt reaches them. */
#include "serve/sched_lane.h"

/* Prefix points worth keeping: after each end of a message (system block, earlier turns),
 * the end of the prompt, and the last block that leaves a token to read (what the same prompt
 * sent again resumes from), each rounded down to a block. Ascending, no repeats. */
void muse_lane_cache_plan(muse_sched *s, lane *l)
{
    int64_t n = (int64_t)l->req.n_prompt, last = -1;
    l->cuts = MUSE_MALLOC((size_t)(n / MUSE_KV_BLOCK + 2) * sizeof *l->cuts);
    for (int64_t i = 0; i <= n; i++) {
        bool end = i == n || l->req.prompt[i] == s->ids.eot || l->req.prompt[i] == s->ids.eom;
        if (!end) continue;
        int64_t cuts[2] = {(n - 1) / MUSE_KV_BLOCK * MUSE_KV_BLOCK,
                           n / MUSE_KV_BLOCK * MUSE_KV_BLOCK};
        if (i < n) cuts[0] = cuts[1] = (i + 1) / MUSE_KV_BLOCK * MUSE_KV_BLOCK;
        for (int k = 0; k < 2; k++)
            if (cuts[k] > l->cached && cuts[k] > last) l->cuts[l->n_cuts++] = last = cuts[k];
    }
}

/* Resumes a new lane from the longest cached prefix that leaves a token to read. */
void muse_lane_cache_resume(muse_sched *s, lane *l, const char *scope, size_t scope_len)
{
    int64_t n_blocks = (int64_t)l->req.n_prompt / MUSE_KV_BLOCK;
    int seq = (int)(l - s->lanes);
    l->keys = MUSE_MALLOC((size_t)(n_blocks ? n_blocks : 1) * sizeof *l->keys);
    muse_pcache_keys(scope, scope_len, l->req.prompt, n_blocks, l->keys);
    const muse_pcache_entry *hit = NULL;
    for (int64_t b = ((int64_t)l->req.n_prompt - 1) / MUSE_KV_BLOCK; b > 0 && !hit; b--)
        hit = muse_pcache_find(s->cache, l->keys[b - 1]);
    if (((int64_t)l->req.n_prompt - 1) / MUSE_KV_BLOCK > 0)
        muse_pcache_count(s->cache, hit != NULL);
    if (hit) {
        muse_kv_share(&s->be->kv, seq, hit->blocks, hit->n_blocks);
        l->cached = l->fed = hit->n_blocks * MUSE_KV_BLOCK;
        if (hit->slot >= 0) muse_forward_snapshot(s->fwd, 0, seq, l->cached, hit->slot);
    }
    muse_lane_cache_plan(s, l);
}

/* After a forward: a lane whose prompt just reached a prefix point leaves it in the cache. */
void muse_lane_cache_keep(muse_sched *s, lane *l)
{
    while (l->next_cut < l->n_cuts && l->cuts[l->next_cut] <= l->fed) {
        int64_t cut = l->cuts[l->next_cut++], n_blocks = cut / MUSE_KV_BLOCK;
        if (cut != l->fed || muse_pcache_find(s->cache, l->keys[n_blocks - 1])) continue;
        int seq = (int)(l - s->lanes);
        const muse_pcache_entry *kept = muse_pcache_insert(
            s->cache, l->keys[n_blocks - 1], n_blocks, muse_kv_table(&s->be->kv, seq));
        if (kept && kept->slot >= 0) muse_forward_snapshot(s->fwd, 1, seq, cut, kept->slot);
    }
}
