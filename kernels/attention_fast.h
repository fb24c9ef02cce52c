/* attention_fast.h: the split logic of the fast attention (kernels/attention_fast.cu) as MUSE_HD
 * helpers, so t/unit/test_attention_fast.c checks on the CPU what the kernel runs: a row's key
 * range, the chunk size and splits made from that range alone (absolute positions, never the
 * batch), the tiles of a split, the workspace a launch needs and the merge of two partials. */
#ifndef MUSE_K_ATTENTION_FAST_H
#define MUSE_K_ATTENTION_FAST_H

#include <math.h>
#include <stdint.h>

#include "base/host_device.h"
#include "model/kv_addr.h"

#define MUSE_ATTN_TILE 64 /* positions a block stages at once; chunks are multiples */
/* The default cap: a row's key range in at most this many chunks. On the H200 one row's kv
 * write + attention at context 131072 took 451 us at 64, 246 at 128, 270 at 256, 304 at 512
 * (docs/benchmarks.md). */
#define MUSE_ATTN_MAX_SPLITS  128
#define MUSE_ATTN_MOST_SPLITS 1024 /* the largest cap a process may take (MUSE_ATTN_SPLITS) */
/* The least chunk (a tile; MUSE_ATTN_CHUNK=N for tuning, a tile * 2^j up to MUSE_ATTN_MOST_CHUNK,
 * read once a process: other bits wherever it changes a row's chunks) */
#define MUSE_ATTN_LEAST_CHUNK 64
#define MUSE_ATTN_MOST_CHUNK  4096
#define MUSE_ATTN_MAX_GROUP   16 /* query heads a block holds (a GQA group) */
#define MUSE_ATTN_WS_ROWS     64 /* rows one launch's workspace covers (more: in row groups) */

/* The first key a row at position p reads: p - window + 1 in a sliding layer, else 0. */
MUSE_HD int64_t muse_attn_first(int64_t p, int64_t window)
{
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

/* Chunks of size chunk covering [first, p], aligned to absolute multiples of chunk. */
MUSE_HD int64_t muse_attn_count(int64_t first, int64_t p, int64_t chunk)
{
    return p / chunk - first / chunk + 1;
}

/* The chunk size of the row with key range [first, p]: the smallest least * 2^k whose aligned
 * chunks number at most cap (least a MUSE_ATTN_TILE * 2^j and cap: the process's, fixed while it
 * runs). A function of (first, p) alone. */
MUSE_HD int64_t muse_attn_chunk(int64_t first, int64_t p, int64_t cap, int64_t least)
{
    int64_t c = least;
    while (muse_attn_count(first, p, c) > cap) c *= 2;
    return c;
}

/* Split s of the row (s < muse_attn_count): keys [*lo, *hi], never empty. */
MUSE_HD void muse_attn_split_range(int64_t first, int64_t p, int64_t chunk, int64_t s, int64_t *lo,
                                   int64_t *hi)
{
    int64_t c0 = (first / chunk + s) * chunk;
    *lo = c0 > first ? c0 : first;
    *hi = c0 + chunk - 1 < p ? c0 + chunk - 1 : p;
}

/* The most splits any row of key range at most max_len positions has under cap (the launch's
 * grid). */
MUSE_HD int64_t muse_attn_max_splits(int64_t max_len, int64_t cap)
{
    int64_t n = max_len > 0 ? (max_len - 1) / MUSE_ATTN_TILE + 2 : 1;
    return n < cap ? n : cap;
}

/* Bytes of workspace a row needs: per query head and split, the running max, sum and the
 * unnormalised hd-wide accumulator, fp32. */
MUSE_HD int64_t muse_attn_ws_row_bytes(int64_t hq, int64_t hd, int64_t max_len, int64_t cap)
{
    return hq * muse_attn_max_splits(max_len, cap) * (hd + 2) * (int64_t)sizeof(float);
}

/* The weight of a partial with max m in a merge whose max is mx (log2 domain): 0 for an empty
 * partial (m = -inf), so a merge never makes NaN out of -inf - -inf. */
MUSE_HD float muse_attn_rescale(float m, float mx)
{
    return m == -INFINITY ? 0.0f : exp2f(m - mx);
}

/* ---- the tensor-core split (head_dim 64): a warp a (row or row pair, KV head, split) ---- */

/* The mma's 16 rows are (row slot, query head) pairs: row i is slot i / gp, head i % gp, gp the
 * group rounded up to a power of two (1..16), so a slot's heads never straddle two slots. */
MUSE_HD int muse_attn_gp(int group)
{
    int gp = 1;
    while (gp < group) gp *= 2;
    return gp;
}

/* Two rows of one sequence at one chunk size share a warp at grid column x: x is row a's split,
 * and the same absolute chunk is row b's split *sb (out of [0, count_b): none for b). Returns
 * whether the rows pair; else the warp takes a's split x, then b's split x, one at a time. The
 * bits of a row are the same either way: its own mask, its own mma rows. */
MUSE_HD int muse_attn_pair(int seq_a, int64_t first_a, int64_t p_a, int seq_b, int64_t first_b,
                           int64_t p_b, int64_t cap, int64_t least, int64_t x, int64_t *sa,
                           int64_t *sb)
{
    int64_t ca = muse_attn_chunk(first_a, p_a, cap, least);
    int64_t cb = muse_attn_chunk(first_b, p_b, cap, least);
    *sa = x;
    *sb = x;
    if (seq_a < 0 || seq_a != seq_b || ca != cb) return 0;
    *sb = x + first_a / ca - first_b / cb;
    return 1;
}

/* Whether a launch of round_rows rows (the round's, not a row group's) pairs a sequence's rows a
 * warp: a prompt's rounds do; decode rounds, whose rows are of as many sequences, spread each
 * split over a block's warps instead (on the H200 a 16-row decode round paired took 1.3 ms
 * longer; a 4096-token prompt in rounds of 256 or 2048 rows unpaired 9-10% longer). The bits
 * are the same either way. */
#define MUSE_ATTN_PAIR_ROWS 128
MUSE_HD int muse_attn_paired(int64_t round_rows)
{
    return round_rows >= MUSE_ATTN_PAIR_ROWS;
}

/* The 16-byte piece c of key row r of a staged K or V tile sits at piece c ^ (r & 7): the 8
 * rows an ldmatrix reads at one piece land on 8 different bank groups. */
MUSE_HD int muse_attn_swz(int r, int c)
{
    return c ^ (r & 7);
}

/* ---- the prompt form (k_attn_flash): a warp walks a row's whole key range tile by tile and
 * makes the combine's merges itself, so its bits are the split's and the combine's ---- */

/* Whether the tile from base (a multiple of MUSE_ATTN_TILE) holds keys of the row's range
 * [first, p]: a warp walking two rows' tiles skips the other row's for this one. */
MUSE_HD int muse_attn_tile_in(int64_t first, int64_t p, int64_t base)
{
    return base <= p && base + MUSE_ATTN_TILE - 1 >= first;
}

/* Whether that tile is the last of one of the row's chunks (of size chunk, aligned to absolute
 * multiples): the chunk's partial then merges into the row's, as the combine merges chunks. */
MUSE_HD int muse_attn_tile_closes(int64_t p, int64_t chunk, int64_t base)
{
    return (base + MUSE_ATTN_TILE) % chunk == 0 || base + MUSE_ATTN_TILE > p;
}

/* The merge of a running partial (m, l, acc) with a tile's (mt, lt, ot), each taken at its own
 * max (log2 domain): the new max, and the weights w1 (old) and w2 (tile) so that l = lt w2 +
 * l w1 and acc = ot w2 + acc w1 (muse_attn_mix). Merging an empty tile (mt = -inf, lt = ot =
 * 0) changes nothing, bit for bit, and merging into the empty start state gives the tile. */
MUSE_HD float muse_attn_merge(float m, float mt, float *w1, float *w2)
{
    float mx = fmaxf(m, mt);
    *w1 = muse_attn_rescale(m, mx);
    *w2 = muse_attn_rescale(mt, mx);
    return mx;
}
MUSE_HD float muse_attn_mix(float acc, float w1, float ot, float w2)
{
    return fmaf(ot, w2, acc * w1);
}

/* ---- the decode form's ring (k_attn_split_ring): NS staged tiles, two barriers a tile ----
 * The split's tiles 0 .. n-1 go through NS buffers: tile t lands in buffer t % NS; the prologue
 * issues tiles 0 .. NS-2 and iteration i, once every warp is past tile i-1, issues tile i + NS-1
 * (a commit group a tile, an empty one past the split's end, so a thread's wait for tile i
 * always leaves NS - 2 younger groups pending). */

/* Buffer of tile t (a split's tiles are counted in int: positions are under 2^31). */
MUSE_HD int muse_attn_ring_buf(int t, int ns)
{
    return t % ns;
}

/* The tile iteration i issues (the prologue's, i < 0: tile NS - 1 + i for i in [-(NS-1), -1]),
 * or -1 where it is past the split's n tiles (an empty commit group). */
MUSE_HD int muse_attn_ring_issue(int i, int ns, int n)
{
    int t = i + ns - 1;
    return t < n ? t : -1;
}

/* Whether tile t of a split from base0 whose keys end at hi reads only keys below fw, the first
 * position the round writes for the row's sequence: the cache below it is the earlier rounds'
 * (a sliding ring holds window + a round's rows - 1, so this round's writes land on no key a row
 * reads), so the tile may be staged before the wait for the kernel that writes this round's keys.
 * The early tiles are a prefix of the split's. */
MUSE_HD int muse_attn_tile_early(int64_t base0, int64_t t, int64_t hi, int64_t fw)
{
    int64_t last = base0 + (t + 1) * MUSE_ATTN_TILE - 1;
    return (last < hi ? last : hi) < fw;
}

/* ---- a warp's keys of a staged tile as one KV group (am_stage_block) ----
 * Warp w of the block stages keys s0 .. s0 + 15 of a tile, s0 = base + 16 w a multiple of
 * MUSE_KV_BLOCK: one block of a full layer, one run of a ring, found with one table load at the
 * first of them the row reads (muse_kv_group_at), not a load a key. */

/* The first of the keys s0 .. s0 + MUSE_KV_BLOCK - 1 in [lo, hi], or -1 where none is */
MUSE_HD int64_t muse_attn_group_first(int64_t s0, int64_t lo, int64_t hi)
{
    int64_t p = s0 > lo ? s0 : lo;
    return p <= hi && p < s0 + MUSE_KV_BLOCK ? p : -1;
}

/* The keys of the group a row reads, as offsets d from s0: [*klo, *khi] (empty: *klo > *khi),
 * the kernel's one-time test for what muse_attn_group_key does a key */
MUSE_HD void muse_attn_group_span(int64_t s0, int64_t lo, int64_t hi, int *klo, int *khi)
{
    int64_t a = lo - s0, b = hi - s0;
    *klo = a < 0 ? 0 : a > MUSE_KV_BLOCK ? MUSE_KV_BLOCK : (int)a;
    *khi = b < -1 ? -1 : b >= MUSE_KV_BLOCK ? MUSE_KV_BLOCK - 1 : (int)b;
}

/* Key s0 + d's offset (muse_kv_offset32's) from the group g found at the first key; -1 outside
 * [lo, hi] or where the block is not reserved: staged as zeros */
MUSE_HD int64_t muse_attn_group_key(muse_kv_group g, int64_t cap, int64_t width, int64_t s0,
                                    int64_t lo, int64_t hi, int d)
{
    int64_t s = s0 + d;
    if (g.none || s < lo || s > hi) return -1;
    return muse_kv_group_row(g, cap, d) * width;
}

/* ---- the combine's weights made apart from its sums (k_attn_combine) ----
 * The fold over a row's splits in order, step s: M_s = max(M_{s-1}, m_s), w1 = rescale(M_{s-1},
 * M_s), w2 = rescale(m_s, M_s), l = mix(l, w1, l_s, w2), acc = mix(acc, w1, acc_s, w2). The
 * maxima are a running max (exact: any order gives M_s), so every step's weights can be made at
 * once before the sums, whose chain is then a multiply and an fma a step, not an exp2. */

/* M[s] = max(m0, m[0..s]) for s < n by a Hillis-Steele scan in lanes of width lanes (the
 * kernel's shuffles: offsets 1, 2, 4, .. within a lane group, then each group after the
 * groups before it), m0 taken last; the host's copy of the kernel's order, for the tests. */
MUSE_HD void muse_attn_prefix_max(const float *m, int n, float m0, int lanes, float *M)
{
    for (int s = 0; s < n; s++) M[s] = m[s];
    for (int off = 1; off < lanes; off *= 2) /* each step reads the step before's values */
        for (int s = n - 1; s >= 0; s--)
            if (s % lanes >= off) M[s] = fmaxf(M[s], M[s - off]);
    float top[64]; /* each group's total (a group's last lane), as the kernel stores them */
    for (int g = 0; g < 64; g++) top[g] = -INFINITY;
    int groups = (n + lanes - 1) / lanes;
    for (int g = 0; g < groups && g < 64; g++)
        top[g] = M[(g + 1) * lanes - 1 < n ? (g + 1) * lanes - 1 : n - 1];
    for (int s = lanes; s < n; s++) {
        float before = -INFINITY;
        for (int g = 0; g < s / lanes && g < 64; g++) before = fmaxf(before, top[g]);
        M[s] = fmaxf(before, M[s]);
    }
    for (int s = 0; s < n; s++) M[s] = fmaxf(m0, M[s]);
}

#endif
