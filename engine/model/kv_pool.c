#include "model/kv_pool.h"

#include "base/muse_common.h"
#include "pack/config.h"

void muse_kv_pool_init(muse_kv_pool *p, int32_t n_blocks, int max_seqs, int64_t context)
{
    p->n_blocks = n_blocks;
    p->n_free = n_blocks;
    p->free_list = MUSE_MALLOC((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof *p->free_list);
    p->refs = MUSE_CALLOC((size_t)(n_blocks > 0 ? n_blocks : 1), sizeof *p->refs);
    for (int32_t i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i; /* 0 pops first */
    p->max_seqs = max_seqs;
    p->blocks_per_seq = (context + MUSE_KV_BLOCK - 1) / MUSE_KV_BLOCK;
    size_t n = (size_t)max_seqs * (size_t)p->blocks_per_seq;
    p->tables = MUSE_MALLOC((n ? n : 1) * sizeof *p->tables);
    for (size_t i = 0; i < n; i++) p->tables[i] = -1;
}

void muse_kv_pool_destroy(muse_kv_pool *p)
{
    free(p->free_list);
    free(p->refs);
    free(p->tables);
}

int64_t muse_kv_blocks_needed(const muse_kv_pool *p, int seq, int64_t positions)
{
    const int32_t *t = muse_kv_table(p, seq);
    int64_t want = (positions + MUSE_KV_BLOCK - 1) / MUSE_KV_BLOCK, n = 0;
    MUSE_CHECK(want <= p->blocks_per_seq);
    for (int64_t b = 0; b < want; b++) n += t[b] < 0;
    return n;
}

int muse_kv_ensure(muse_kv_pool *p, int seq, int64_t positions)
{
    if (muse_kv_blocks_needed(p, seq, positions) > p->n_free) return -1;
    int32_t *t = muse_kv_table(p, seq);
    int64_t want = (positions + MUSE_KV_BLOCK - 1) / MUSE_KV_BLOCK;
    for (int64_t b = 0; b < want; b++)
        if (t[b] < 0) {
            t[b] = p->free_list[--p->n_free];
            p->refs[t[b]] = 1;
        }
    return 0;
}

void muse_kv_ref(muse_kv_pool *p, int32_t block)
{
    MUSE_CHECK(block >= 0 && block < p->n_blocks && p->refs[block] > 0);
    p->refs[block]++;
}

void muse_kv_unref(muse_kv_pool *p, int32_t block)
{
    MUSE_CHECK(block >= 0 && block < p->n_blocks && p->refs[block] > 0);
    if (--p->refs[block] == 0) p->free_list[p->n_free++] = block;
}

void muse_kv_share(muse_kv_pool *p, int seq, const int32_t *blocks, int64_t n)
{
    int32_t *t = muse_kv_table(p, seq);
    MUSE_CHECK(n <= p->blocks_per_seq);
    for (int64_t b = 0; b < n; b++) {
        MUSE_CHECK(t[b] < 0);
        muse_kv_ref(p, blocks[b]);
        t[b] = blocks[b];
    }
}

void muse_kv_release(muse_kv_pool *p, int seq)
{
    int32_t *t = muse_kv_table(p, seq);
    for (int64_t b = 0; b < p->blocks_per_seq; b++)
        if (t[b] >= 0) {
            muse_kv_unref(p, t[b]);
            t[b] = -1;
        }
}

static uint64_t layers_of(const muse_config *c, muse_attn_kind kind)
{
    uint64_t n = 0;
    for (int64_t i = 0; i < c->num_layers; i++) n += c->attn_kind[i] == kind;
    return n;
}

uint64_t muse_kv_bytes_per_token(const muse_config *c)
{
    return (uint64_t)c->num_layers * 2 * (uint64_t)(c->n_kv_heads * c->head_dim) * 2;
}

uint64_t muse_kv_full_bytes_per_token(const muse_config *c)
{
    return layers_of(c, MUSE_ATTN_FULL) * 2 * (uint64_t)(c->n_kv_heads * c->head_dim) * 2;
}

uint64_t muse_kv_snapshot_bytes(const muse_config *c)
{
    return layers_of(c, MUSE_ATTN_SLIDING) * 2 * (uint64_t)c->sliding_window *
           (uint64_t)(c->n_kv_heads * c->head_dim) * 2;
}

int64_t muse_kv_heads_per_rank(const muse_config *c, int ranks)
{
    return ranks <= 1 ? c->n_kv_heads : c->n_kv_heads >= ranks ? c->n_kv_heads / ranks : 1;
}

uint64_t muse_kv_rank_bytes(const muse_config *c, uint64_t bytes, int ranks)
{
    return bytes / (uint64_t)c->n_kv_heads * (uint64_t)muse_kv_heads_per_rank(c, ranks);
}
