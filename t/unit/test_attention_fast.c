/* The fast attention's split logic (kernels/attention_fast.h) on the CPU: every row's chunks
 * cover its key range in order, aligned to absolute positions, at most the cap (the default
 * and others) and within the launch's grid; and a host emulation of the kernel's arithmetic (fp32
 * tiles of online softmax in the log2 domain, chunks merged in ascending order) against a double
 * reference with a relative bound, sliding windows and peaked scores included. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/f16.h"
#include "kernels/attention_fast.h"
#include "tap.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static double urand(void) /* [-1, 1) */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) / 4503599627370496.0 - 1.0;
}

/* every (p, window) under cap and least chunk: chunks a power-of-two multiple of least,
 * aligned, contiguous, ascending, non-empty, the fewest that fit cap, within the grid of the
 * longest range */
static void test_splits(int64_t cap, int64_t least)
{
    const int64_t windows[] = {0, 1, 5, 8, 64, 100, 1024, 4096};
    const int64_t max_ctx = 140000;
    long bad_cover = 0, bad_align = 0, bad_count = 0, bad_min = 0, bad_grid = 0, rows = 0;
    for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
        int64_t win = windows[w];
        int64_t max_len = win > 0 ? win : max_ctx;
        for (int64_t p = 0; p < max_ctx; p += p < 9000 ? 1 : 997) {
            int64_t first = muse_attn_first(p, win);
            int64_t c = muse_attn_chunk(first, p, cap, least), n = muse_attn_count(first, p, c);
            rows++;
            bad_cover += first < 0 || first > p || (win > 0 && p - first + 1 > win) ||
                         (win == 0 && first != 0) || (win > 0 && p >= win && p - first + 1 != win);
            bad_align += c < least || c % least || (c & (c - 1)) != 0;
            bad_count += n < 1 || n > cap;
            bad_min += c > least && muse_attn_count(first, p, c / 2) <= cap;
            bad_grid += n > muse_attn_max_splits(max_len, cap);
            int64_t next = first;
            for (int64_t s = 0; s < n; s++) {
                int64_t lo, hi;
                muse_attn_split_range(first, p, c, s, &lo, &hi);
                bad_cover += lo != next || hi < lo || hi > p;
                bad_align +=
                    (s > 0 && lo % c != 0) || (hi < p && (hi + 1) % c != 0) || lo / c != hi / c;
                next = hi + 1;
            }
            bad_cover += next != p + 1;
        }
    }
    ok(bad_cover == 0, "cap %lld, least %lld, %ld rows: the splits cover [first, p] in order",
       (long long)cap, (long long)least, rows);
    ok(bad_align == 0, "cap %lld: chunks are %lld * 2^k, every boundary on an absolute multiple",
       (long long)cap, (long long)least);
    ok(bad_count == 0, "cap %lld: 1 to %lld splits a row", (long long)cap, (long long)cap);
    ok(bad_min == 0, "cap %lld: the smallest chunk that fits, never coarser than it must",
       (long long)cap);
    ok(bad_grid == 0, "cap %lld: no row needs more splits than max_splits of its longest range",
       (long long)cap);
}

static void test_split_sizes(void)
{
    const int64_t cap = MUSE_ATTN_MAX_SPLITS, t = MUSE_ATTN_TILE;
    is_int(muse_attn_chunk(0, 4095, cap, t), 64, "context 4096: chunks of 64");
    is_int(muse_attn_count(0, 4095, 64), 64, "context 4096: 64 splits");
    is_int(muse_attn_chunk(0, 32767, cap, t), 256, "context 32768: chunks of 256");
    is_int(muse_attn_chunk(0, 131071, cap, t), 1024, "context 131072: chunks of 1024");
    is_int(muse_attn_count(0, 131071, 1024), 128, "context 131072: 128 splits");
    is_int(muse_attn_chunk(0, 131071, 64, t), 2048, "cap 64, context 131072: chunks of 2048");
    is_int(muse_attn_chunk(0, 131071, 256, t), 512, "cap 256, context 131072: chunks of 512");
    is_int(muse_attn_chunk(0, 4095, 256, t), 64, "cap 256, context 4096: the tile still the least");
    is_int(muse_attn_chunk(0, 4095, cap, 256), 256, "least 256, context 4096: chunks of 256");
    is_int(muse_attn_chunk(0, 100, cap, 256), 256, "least 256, context 101: one chunk of 256");
    is_int(muse_attn_chunk(0, 32767, cap, 256), 256, "least 256, context 32768: as least 64");
    is_int(muse_attn_chunk(0, 131071, cap, 256), 1024, "least 256, context 131072: as least 64");
    is_int(muse_attn_chunk(0, MUSE_ATTN_LEAST_CHUNK - 1, cap, MUSE_ATTN_LEAST_CHUNK),
           MUSE_ATTN_LEAST_CHUNK, "the default least chunk is a chunk");
    ok(MUSE_ATTN_LEAST_CHUNK % MUSE_ATTN_TILE == 0 && MUSE_ATTN_MOST_CHUNK % MUSE_ATTN_TILE == 0,
       "the least and most chunks are whole tiles");
    is_int(muse_attn_max_splits(8, cap), 2, "window 8: a range spans at most 2 chunks");
    is_int(muse_attn_max_splits(1 << 20, cap), cap, "long contexts: the cap");
    is_int(muse_attn_max_splits(1 << 20, 256), 256, "long contexts: a larger cap");
    is_int(muse_attn_ws_row_bytes(64, 64, 4096, cap), 64 * 65 * 66 * 4,
           "workspace: a row's (max, sum, acc) per head and split (4096 keys: up to 65 tiles)");
    is_int(muse_attn_ws_row_bytes(64, 64, 4096, 64), 64 * 64 * 66 * 4, "cap 64: 64 splits");
    is_int(muse_attn_ws_row_bytes(64, 64, 131072, 256), 64 * 256 * 66 * 4,
           "workspace at cap 256: twice the splits of the default");
}

static void test_rescale(void)
{
    ok(muse_attn_rescale(-INFINITY, -INFINITY) == 0.0f, "an empty partial merges as 0, not NaN");
    ok(muse_attn_rescale(-INFINITY, 3.0f) == 0.0f, "an empty partial against a real max: 0");
    ok(muse_attn_rescale(2.0f, 2.0f) == 1.0f, "the max partial keeps weight 1");
    ok(fabsf(muse_attn_rescale(1.0f, 3.0f) - 0.25f) < 1e-7f, "2^(m - mx)");
}

#define HD 64
#define G  4

typedef struct {
    float m, l, acc[HD];
} partial;

/* The kernel's arithmetic for one query head over split [lo, hi]: tiles of 64 aligned
 * positions, fp32 scores (d order, fma), log2 domain, the running max, sum and accumulator. */
static void emulate_split(const float *q, const uint16_t *k, const uint16_t *v, int64_t lo,
                          int64_t hi, float scale_l2, partial *pt)
{
    pt->m = -INFINITY;
    pt->l = 0;
    for (int d = 0; d < HD; d++) pt->acc[d] = 0;
    for (int64_t base = lo / MUSE_ATTN_TILE * MUSE_ATTN_TILE; base <= hi; base += MUSE_ATTN_TILE) {
        float s[MUSE_ATTN_TILE], mx = -INFINITY;
        for (int i = 0; i < MUSE_ATTN_TILE; i++) {
            int64_t at = base + i;
            float acc = 0;
            if (at >= lo && at <= hi)
                for (int d = 0; d < HD; d++) acc = fmaf(q[d], muse_f16_to_f32(k[at * HD + d]), acc);
            s[i] = at >= lo && at <= hi ? acc * scale_l2 : -INFINITY;
            mx = fmaxf(mx, s[i]);
        }
        float m_new = fmaxf(pt->m, mx), sum = 0;
        for (int i = 0; i < MUSE_ATTN_TILE; i++) sum += s[i] = muse_attn_rescale(s[i], m_new);
        float alpha = muse_attn_rescale(pt->m, m_new);
        pt->m = m_new;
        pt->l = fmaf(pt->l, alpha, sum);
        for (int d = 0; d < HD; d++) {
            float a = pt->acc[d] * alpha;
            for (int i = 0; i < MUSE_ATTN_TILE; i++) {
                int64_t at = base + i;
                float vv = at >= lo && at <= hi ? muse_f16_to_f32(v[at * HD + d]) : 0.0f;
                a = fmaf(s[i], vv, a);
            }
            pt->acc[d] = a;
        }
    }
}

/* Two consecutive rows of one sequence paired at every grid column x of [0, splits + 1): each
 * (row, split) taken exactly once, and where both rows take a split at one x it is the same
 * absolute chunk (so one staged tile range serves both). Rows that may not pair are refused. */
static void test_pair(int64_t cap, int64_t least)
{
    const int64_t windows[] = {0, 8, 64, 100, 4096};
    long bad_once = 0, bad_chunk = 0, bad_refuse = 0, pairs = 0;
    for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
        int64_t win = windows[w], max_len = win > 0 ? win : 140000;
        int64_t grid = muse_attn_max_splits(max_len, cap) + 1;
        for (int64_t p = 0; p < 140000; p += p < 9000 ? 1 : 611) {
            int64_t fa = muse_attn_first(p, win), fb = muse_attn_first(p + 1, win);
            int64_t ca = muse_attn_chunk(fa, p, cap, least);
            int64_t cb = muse_attn_chunk(fb, p + 1, cap, least);
            int64_t na = muse_attn_count(fa, p, ca), nb = muse_attn_count(fb, p + 1, cb);
            int64_t xa, xb;
            if (!muse_attn_pair(3, fa, p, 3, fb, p + 1, cap, least, 0, &xa, &xb)) {
                bad_refuse += ca == cb;
                continue;
            }
            pairs++;
            bad_refuse += ca != cb;
            static unsigned char seen_a[2048], seen_b[2048];
            memset(seen_a, 0, (size_t)na);
            memset(seen_b, 0, (size_t)nb);
            for (int64_t x = 0; x < grid; x++) {
                muse_attn_pair(3, fa, p, 3, fb, p + 1, cap, least, x, &xa, &xb);
                int in_a = xa >= 0 && xa < na, in_b = xb >= 0 && xb < nb;
                if (in_a) seen_a[xa]++;
                if (in_b) seen_b[xb]++;
                if (in_a && in_b) {
                    int64_t la, ha, lb, hb;
                    muse_attn_split_range(fa, p, ca, xa, &la, &ha);
                    muse_attn_split_range(fb, p + 1, cb, xb, &lb, &hb);
                    bad_chunk += la / ca != lb / cb;
                }
            }
            for (int64_t i = 0; i < na; i++) bad_once += seen_a[i] != 1;
            for (int64_t i = 0; i < nb; i++) bad_once += seen_b[i] != 1;
        }
    }
    ok(pairs > 0 && bad_once == 0,
       "cap %lld, %ld row pairs: every (row, split) taken once over the grid's splits + 1 columns",
       (long long)cap, pairs);
    ok(bad_chunk == 0, "cap %lld: a column's two splits are one absolute chunk", (long long)cap);
    ok(bad_refuse == 0, "cap %lld: rows pair exactly where their chunk sizes agree",
       (long long)cap);
    int64_t xa, xb;
    ok(!muse_attn_pair(3, 0, 10, 4, 0, 11, cap, MUSE_ATTN_TILE, 0, &xa, &xb) &&
           !muse_attn_pair(-1, 0, 10, -1, 0, 11, cap, MUSE_ATTN_TILE, 0, &xa, &xb),
       "rows of two sequences, or padding rows, never pair");
}

static void test_mma_layout(void)
{
    const int want[17] = {0, 1, 2, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16};
    int bad = 0;
    for (int g = 1; g <= 16; g++) bad += muse_attn_gp(g) != want[g];
    ok(bad == 0, "the group rounded up to a power of two (8 -> 8, 5 -> 8, 9 -> 16)");
    ok(muse_attn_paired(256) && muse_attn_paired(4096) && !muse_attn_paired(64) &&
           !muse_attn_paired(16) && !muse_attn_paired(1),
       "prompt rounds (256 rows) pair rows, decode rounds (1-64 rows) do not");
    ok(muse_attn_paired(MUSE_ATTN_PAIR_ROWS) && MUSE_ATTN_PAIR_ROWS > MUSE_ATTN_WS_ROWS,
       "the form goes by the round's rows, more than a row group's %d", MUSE_ATTN_WS_ROWS);

    int bad_perm = 0, bad_bank = 0;
    for (int r = 0; r < 64; r++) {
        unsigned seen = 0;
        for (int c = 0; c < 8; c++) seen |= 1u << muse_attn_swz(r, c);
        bad_perm += seen != 0xFFu;
    }
    for (int r0 = 0; r0 < 64; r0 += 8)
        for (int c = 0; c < 8; c++) {
            unsigned seen = 0;
            for (int r = r0; r < r0 + 8; r++) seen |= 1u << muse_attn_swz(r, c);
            bad_bank += seen != 0xFFu;
        }
    ok(bad_perm == 0, "the swizzle permutes a key row's 8 pieces");
    ok(bad_bank == 0, "8 rows at one piece (one ldmatrix) sit at 8 different pieces");
}

/* merging an empty tile is the identity and the empty start state takes a tile as it is, bit
 * for bit (so a warp that stages tiles another row needs changes nothing of this row) */
static void test_merge(void)
{
    long bad_id = 0, bad_start = 0;
    for (int i = 0; i < 10000; i++) {
        float m = (float)(urand() * 40), l = (float)(urand() + 1.5), a = (float)(urand() * 3);
        float w1, w2, mx = muse_attn_merge(m, -INFINITY, &w1, &w2);
        float l2 = muse_attn_mix(l, w1, 0.0f, w2), a2 = muse_attn_mix(a, w1, 0.0f, w2);
        bad_id += mx != m || l2 != l || a2 != a;
        mx = muse_attn_merge(-INFINITY, m, &w1, &w2);
        l2 = muse_attn_mix(0.0f, w1, l, w2);
        a2 = muse_attn_mix(0.0f, w1, a, w2);
        bad_start += mx != m || l2 != l || a2 != a;
    }
    float w1, w2;
    float mx = muse_attn_merge(-INFINITY, -INFINITY, &w1, &w2);
    ok(bad_id == 0, "an empty tile merges as the identity, bit for bit");
    ok(bad_start == 0, "the start state merged with a tile is the tile, bit for bit");
    ok(mx == -INFINITY && w1 == 0.0f && w2 == 0.0f, "two empty partials stay empty, no NaN");
}

/* The prompt form's walk (k_attn_flash): over a span of tiles that covers the row's range (a
 * pair's union: from up to 3 tiles before its first to 3 past its last), the tiles it takes
 * (muse_attn_tile_in) and the chunk ends it merges at (muse_attn_tile_closes) are, in order,
 * exactly the combine's chunks and each chunk's tiles. */
static void test_flash_walk(int64_t cap, int64_t least)
{
    const int64_t windows[] = {0, 1, 8, 64, 100, 4096};
    long bad_tiles = 0, bad_close = 0, rows = 0;
    for (size_t w = 0; w < sizeof windows / sizeof *windows; w++)
        for (int64_t p = 0; p < 140000; p += p < 9000 ? 1 : 613) {
            int64_t win = windows[w], first = muse_attn_first(p, win);
            int64_t c = muse_attn_chunk(first, p, cap, least), n = muse_attn_count(first, p, c);
            int64_t pad0 = (p % 4) * MUSE_ATTN_TILE, pad1 = (p / 4 % 4) * MUSE_ATTN_TILE;
            int64_t b0 = first / MUSE_ATTN_TILE * MUSE_ATTN_TILE - pad0;
            int64_t s = 0, lo, hi;
            muse_attn_split_range(first, p, c, 0, &lo, &hi);
            rows++;
            for (int64_t base = b0 < 0 ? 0 : b0; base <= p + pad1; base += MUSE_ATTN_TILE) {
                int in = muse_attn_tile_in(first, p, base);
                /* the tile belongs to chunk s: it meets [lo, hi] of split s */
                int want_in = s < n && base <= hi && base + MUSE_ATTN_TILE - 1 >= lo;
                bad_tiles += in != want_in;
                if (!in) continue;
                int closes = muse_attn_tile_closes(p, c, base);
                int want_close = base + MUSE_ATTN_TILE - 1 >= hi;
                bad_close += closes != want_close;
                if (closes && ++s < n) muse_attn_split_range(first, p, c, s, &lo, &hi);
            }
            bad_close += s != n;
        }
    ok(bad_tiles == 0, "cap %lld, least %lld, %ld rows: the walk takes each chunk's tiles in order",
       (long long)cap, (long long)least, rows);
    ok(bad_close == 0, "cap %lld, least %lld: it merges at each chunk's last tile, n times",
       (long long)cap, (long long)least);
}

/* x as fp16 high part and the fp16 of the rest, as the kernel's am_split2 */
static void split16(float x, float *hi, float *lo)
{
    *hi = muse_f16_to_f32(muse_f32_to_f16(x));
    *lo = muse_f16_to_f32(muse_f32_to_f16(x - *hi));
}

/* The tensor-core split's arithmetic for one head over [lo, hi]: per 64-key tile, scores from
 * q's fp16 high and low parts (each k-step's 16 products summed, then added in fp32), the tile's
 * own max and p, the sum of p, O = p v from p's high and low parts, merged in tile order. */
static void emulate_split_mma(const float *q, const uint16_t *k, const uint16_t *v, int64_t lo,
                              int64_t hi, float scale_l2, partial *pt)
{
    float qh[HD], ql[HD];
    for (int d = 0; d < HD; d++) split16(q[d], &qh[d], &ql[d]);
    pt->m = -INFINITY;
    pt->l = 0;
    for (int d = 0; d < HD; d++) pt->acc[d] = 0;
    for (int64_t base = lo / MUSE_ATTN_TILE * MUSE_ATTN_TILE; base <= hi; base += MUSE_ATTN_TILE) {
        float s[MUSE_ATTN_TILE], mt = -INFINITY, lt = 0, o[HD];
        for (int i = 0; i < MUSE_ATTN_TILE; i++) {
            int64_t at = base + i;
            float acc = 0;
            for (int kk = 0; kk < HD / 16 && at >= lo && at <= hi; kk++)
                for (int part = 0; part < 2; part++) {
                    double sum = 0;
                    for (int d = 16 * kk; d < 16 * kk + 16; d++)
                        sum += (double)(part ? ql[d] : qh[d]) * muse_f16_to_f32(k[at * HD + d]);
                    acc = (float)(acc + sum);
                }
            s[i] = at >= lo && at <= hi ? acc * scale_l2 : -INFINITY;
            mt = fmaxf(mt, s[i]);
        }
        for (int i = 0; i < MUSE_ATTN_TILE; i++) lt += s[i] = muse_attn_rescale(s[i], mt);
        for (int d = 0; d < HD; d++) {
            float acc = 0;
            for (int kk = 0; kk < MUSE_ATTN_TILE / 16; kk++)
                for (int part = 0; part < 2; part++) {
                    double sum = 0;
                    for (int i = 16 * kk; i < 16 * kk + 16; i++) {
                        int64_t at = base + i;
                        float ph, pl;
                        split16(s[i], &ph, &pl);
                        if (at >= lo && at <= hi)
                            sum += (double)(part ? pl : ph) * muse_f16_to_f32(v[at * HD + d]);
                    }
                    acc = (float)(acc + sum);
                }
            o[d] = acc;
        }
        float w1, w2;
        pt->m = muse_attn_merge(pt->m, mt, &w1, &w2);
        pt->l = muse_attn_mix(pt->l, w1, lt, w2);
        for (int d = 0; d < HD; d++) pt->acc[d] = muse_attn_mix(pt->acc[d], w1, o[d], w2);
    }
}

/* rel L2 of the emulated output (splits merged in ascending order) against double softmax */
typedef void split_fn(const float *, const uint16_t *, const uint16_t *, int64_t, int64_t, float,
                      partial *);

static double emulate_row(split_fn *split, const float *q, const uint16_t *k, const uint16_t *v,
                          int64_t p, int64_t window, int64_t cap, int64_t least, double scale,
                          double *den_out)
{
    int64_t first = muse_attn_first(p, window);
    int64_t c = muse_attn_chunk(first, p, cap, least), n = muse_attn_count(first, p, c);
    static partial pt[MUSE_ATTN_MOST_SPLITS];
    float scale_l2 = (float)(scale * 1.4426950408889634);
    for (int64_t s = 0; s < n; s++) {
        int64_t lo, hi;
        muse_attn_split_range(first, p, c, s, &lo, &hi);
        split(q, k, v, lo, hi, scale_l2, &pt[s]);
    }
    /* the combine: a running merge of the chunks in ascending order */
    float m = -INFINITY, l = 0, out[HD] = {0};
    for (int64_t s = 0; s < n; s++) {
        float w1, w2;
        m = muse_attn_merge(m, pt[s].m, &w1, &w2);
        l = muse_attn_mix(l, w1, pt[s].l, w2);
        for (int d = 0; d < HD; d++) out[d] = muse_attn_mix(out[d], w1, pt[s].acc[d], w2);
    }
    /* the reference: double scores, max, sum and weighted V in position order */
    double rm = -INFINITY, rs = 0, ro[HD] = {0};
    double *sc = malloc((size_t)(p - first + 1) * sizeof *sc);
    for (int64_t at = first; at <= p; at++) {
        double d0 = 0;
        for (int d = 0; d < HD; d++) d0 += (double)q[d] * muse_f16_to_f32(k[at * HD + d]);
        sc[at - first] = d0 * scale;
        if (sc[at - first] > rm) rm = sc[at - first];
    }
    for (int64_t at = first; at <= p; at++) rs += exp(sc[at - first] - rm);
    for (int64_t at = first; at <= p; at++)
        for (int d = 0; d < HD; d++)
            ro[d] += exp(sc[at - first] - rm) / rs * muse_f16_to_f32(v[at * HD + d]);
    free(sc);
    double num = 0, den = 0;
    for (int d = 0; d < HD; d++) {
        double e = (double)(out[d] / l) - ro[d];
        num += e * e;
        den += ro[d] * ro[d];
    }
    *den_out = den;
    return sqrt(num / den);
}

/* The prompt form's arithmetic (tile partials merged into the chunk's, the chunk's into the
 * row's at its last tile) against the split's partials merged by the combine: bitwise equal. */
static void test_flash_bits(void)
{
    const int64_t n_pos = 6000;
    uint16_t *k = malloc((size_t)n_pos * HD * sizeof *k),
             *v = malloc((size_t)n_pos * HD * sizeof *v);
    for (int64_t i = 0; i < n_pos * HD; i++) {
        k[i] = muse_f32_to_f16((float)urand());
        v[i] = muse_f32_to_f16((float)urand());
    }
    const int64_t ps[] = {0, 63, 64, 130, 700, 5999}, wins[] = {0, 100, 0, 0, 0, 1000};
    const int64_t caps[] = {1, 2, 4, MUSE_ATTN_MAX_SPLITS};
    long bad = 0, cases = 0;
    static partial pt[MUSE_ATTN_MOST_SPLITS];
    for (size_t ci = 0; ci < sizeof caps / sizeof *caps; ci++)
        for (size_t r = 0; r < sizeof ps / sizeof *ps; r++) {
            float q[HD], sl2 = 0.18f;
            for (int d = 0; d < HD; d++) q[d] = (float)(urand() * 6);
            int64_t p = ps[r], first = muse_attn_first(p, wins[r]);
            int64_t c = muse_attn_chunk(first, p, caps[ci], MUSE_ATTN_TILE);
            int64_t n = muse_attn_count(first, p, c), lo, hi;
            partial want = {-INFINITY, 0, {0}}, got = want, cur = want;
            for (int64_t s = 0; s < n; s++) {
                muse_attn_split_range(first, p, c, s, &lo, &hi);
                emulate_split_mma(q, k, v, lo, hi, sl2, &pt[s]);
                float w1, w2;
                want.m = muse_attn_merge(want.m, pt[s].m, &w1, &w2);
                want.l = muse_attn_mix(want.l, w1, pt[s].l, w2);
                for (int d = 0; d < HD; d++)
                    want.acc[d] = muse_attn_mix(want.acc[d], w1, pt[s].acc[d], w2);
            }
            for (int64_t base = first / MUSE_ATTN_TILE * MUSE_ATTN_TILE; base <= p;
                 base += MUSE_ATTN_TILE) {
                partial t;
                float w1, w2;
                int64_t tlo = base > first ? base : first;
                int64_t thi = base + MUSE_ATTN_TILE - 1 < p ? base + MUSE_ATTN_TILE - 1 : p;
                emulate_split_mma(q, k, v, tlo, thi, sl2, &t); /* one tile: its own partial */
                cur.m = muse_attn_merge(cur.m, t.m, &w1, &w2);
                cur.l = muse_attn_mix(cur.l, w1, t.l, w2);
                for (int d = 0; d < HD; d++)
                    cur.acc[d] = muse_attn_mix(cur.acc[d], w1, t.acc[d], w2);
                if (!muse_attn_tile_closes(p, c, base)) continue;
                got.m = muse_attn_merge(got.m, cur.m, &w1, &w2);
                got.l = muse_attn_mix(got.l, w1, cur.l, w2);
                for (int d = 0; d < HD; d++)
                    got.acc[d] = muse_attn_mix(got.acc[d], w1, cur.acc[d], w2);
                cur = (partial){-INFINITY, 0, {0}};
            }
            cases++;
            bad += memcmp(&want, &got, sizeof want) != 0 || !(want.l > 0);
        }
    ok(bad == 0,
       "%ld rows at caps 1, 2, 4 and 128: the prompt form's merges give the split's and "
       "the combine's bits",
       cases);
    free(k);
    free(v);
}

static void test_emulation(split_fn *split, double bound, const char *what)
{
    const int64_t n_pos = 20000;
    uint16_t *k = malloc((size_t)n_pos * HD * sizeof *k),
             *v = malloc((size_t)n_pos * HD * sizeof *v);
    for (int64_t i = 0; i < n_pos * HD; i++) {
        k[i] = muse_f32_to_f16((float)urand());
        v[i] = muse_f32_to_f16((float)urand());
    }
    const struct {
        int64_t p, window;
        double q_scale; /* larger: peaked scores, so the running max moves across chunks */
    } rows[] = {{0, 0, 1},     {1, 0, 1},       {62, 0, 1},       {63, 0, 1},
                {64, 0, 1},    {200, 0, 4},     {4095, 0, 1},     {4096, 0, 8},
                {9999, 0, 2},  {19999, 0, 1},   {19999, 0, 16},   {10, 8, 1},
                {700, 100, 4}, {5000, 4096, 1}, {19999, 4096, 8}, {129, 64, 16}};
    /* caps fewer and more than the default; the last: the default's with chunks of 4 tiles */
    const int64_t caps[] = {64, MUSE_ATTN_MAX_SPLITS, 256, MUSE_ATTN_MAX_SPLITS};
    const int64_t leasts[] = {MUSE_ATTN_TILE, MUSE_ATTN_TILE, MUSE_ATTN_TILE, 4 * MUSE_ATTN_TILE};
    double worst = 0, min_den = INFINITY;
    for (size_t ci = 0; ci < sizeof caps / sizeof *caps; ci++)
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
            int64_t cap = caps[ci], least = leasts[ci];
            for (int g = 0; g < G; g++) {
                float q[HD];
                for (int d = 0; d < HD; d++)
                    q[d] = (float)(urand() * rows[r].q_scale); /* fp32: the kernel's q */
                double den, e = emulate_row(split, q, k, v, rows[r].p, rows[r].window, cap, least,
                                            1.0 / sqrt(HD), &den);
                if (!(e <= worst)) worst = e;
                if (den < min_den) min_den = den;
            }
        }
    ok(worst <= bound,
       "%s within rel L2 %.0e of double at caps 64, 128, 256, least 256 (worst %.2e)", what, bound,
       worst);
    ok(min_den > 1e-8, "the reference outputs are not zeros (smallest |o|^2 %.2e)", min_den);
    free(k);
    free(v);
}

/* The decode ring (k_attn_split_ring) at NS buffers over a split of n tiles, its commit groups
 * modelled a thread's way: each tile issued once, before it is read; the wait that leaves NS - 2
 * younger groups pending covers the tile read; the buffer an iteration fills is the one its tile
 * before last read (every warp past it at the barrier before the issue), never the one it reads. */
static void test_ring(void)
{
    long bad_once = 0, bad_wait = 0, bad_buf = 0, cases = 0;
    for (int ns = 2; ns <= 4; ns++)
        for (int64_t n = 1; n <= 40; n++) {
            int64_t group_tile[64] = {0}; /* commit group g's tile, -1 empty */
            int groups = 0, issued[41] = {0};
            for (int64_t i = -(ns - 1); i < 0; i++) { /* the prologue */
                int64_t t = muse_attn_ring_issue(i, ns, n);
                group_tile[groups++] = t;
                if (t >= 0) issued[t]++;
            }
            for (int64_t i = 0; i < n; i++) {
                /* wait_group(ns - 2): groups [0, groups - (ns - 2)) are complete */
                int done = groups - (ns - 2), seen = 0;
                for (int g = 0; g < done; g++) seen += group_tile[g] == i;
                bad_wait += seen != 1;
                int64_t t = muse_attn_ring_issue(i, ns, n);
                if (t >= 0) {
                    issued[t]++;
                    /* the filled buffer: not this tile's, and its last tile was i - 1 */
                    bad_buf += muse_attn_ring_buf(t, ns) == muse_attn_ring_buf(i, ns) ||
                               (t - ns >= 0 && t - ns != i - 1);
                }
                group_tile[groups++] = t;
                cases++;
            }
            for (int64_t t = 0; t < n; t++) bad_once += issued[t] != 1;
        }
    ok(bad_once == 0, "the ring issues each tile once (NS 2-4, splits of 1-40 tiles)");
    ok(bad_wait == 0, "the wait leaving NS - 2 groups pending covers the tile read (%ld reads)",
       cases);
    ok(bad_buf == 0, "an iteration fills the buffer of the tile before it, never its own");
}

/* The tiles a ring stages before the wait (muse_attn_tile_early): never one that holds a key at
 * or past the round's first written position fw within the split, a prefix of the split's tiles,
 * and at a decode row (fw = p, the split's last key) every tile but the last. */
static void test_tile_early(void)
{
    long bad_key = 0, bad_prefix = 0, bad_decode = 0, n_early = 0;
    for (int i = 0; i < 20000; i++) {
        int64_t lo = (int64_t)((urand() + 1) * 5000), hi = lo + (int64_t)((urand() + 1) * 700);
        int64_t fw = lo + (int64_t)((urand() + 0.8) * 600),
                base0 = lo / MUSE_ATTN_TILE * MUSE_ATTN_TILE;
        int64_t n = (hi - base0) / MUSE_ATTN_TILE + 1;
        int was = 1;
        for (int64_t t = 0; t < n; t++) {
            int e = muse_attn_tile_early(base0, t, hi, fw);
            for (int64_t k = base0 + t * MUSE_ATTN_TILE; e && k < base0 + (t + 1) * MUSE_ATTN_TILE;
                 k++)
                bad_key += k >= lo && k <= hi && k >= fw;
            bad_prefix += e && !was;
            was = e;
            n_early += e;
        }
        for (int64_t t = 0; t < n; t++)
            bad_decode += muse_attn_tile_early(base0, t, hi, hi) != (t < n - 1);
    }
    ok(bad_key == 0, "no early tile reads a key the round writes (%ld early tiles)", n_early);
    ok(bad_prefix == 0, "the early tiles are a prefix of the split's");
    ok(bad_decode == 0, "a decode row stages every tile but its last before the wait");
}

/* The combine with its weights made first against the sequential fold, in batches of 128
 * (head_dim 64: a row's every split at once), 64 (128) and 32 carrying the running max: l and
 * acc the same bits, with empty splits (-inf), ties, signed zeros and peaked maxima among the
 * splits. */
static void test_combine_weights(void)
{
    long bad = 0, rows = 0;
    for (int trial = 0; trial < 4000; trial++) {
        int n = 1 + (int)((urand() + 1) * 100), batch = 32 << trial % 3;
        float m[200], ls[200], as[200];
        for (int s = 0; s < n; s++) {
            double u = urand();
            m[s] = u < -0.8   ? -INFINITY
                   : u < -0.6 ? 0.0f
                   : u < -0.5 ? -0.0f
                   : u < -0.3 ? (float)(int)(urand() * 4)
                              : (float)(urand() * (trial % 3 ? 8 : 80));
            ls[s] = m[s] == -INFINITY ? 0.0f : (float)(urand() + 1.2);
            as[s] = m[s] == -INFINITY ? 0.0f : (float)urand();
        }
        float m1 = -INFINITY, l1 = 0.0f, a1 = 0.0f; /* k_attn_combine's fold */
        for (int s = 0; s < n; s++) {
            float w1, w2;
            m1 = muse_attn_merge(m1, m[s], &w1, &w2);
            l1 = muse_attn_mix(l1, w1, ls[s], w2);
            a1 = muse_attn_mix(a1, w1, as[s], w2);
        }
        float run = -INFINITY, l2 = 0.0f, a2 = 0.0f, w1[128], w2[128], M[128];
        for (int s0 = 0; s0 < n; s0 += batch) {
            int nb = n - s0 < batch ? n - s0 : batch;
            muse_attn_prefix_max(m + s0, nb, run, 32, M);
            for (int s = 0; s < nb; s++) {
                w1[s] = muse_attn_rescale(s ? M[s - 1] : run, M[s]);
                w2[s] = muse_attn_rescale(m[s0 + s], M[s]);
            }
            for (int s = 0; s < nb; s++) {
                l2 = muse_attn_mix(l2, w1[s], ls[s0 + s], w2[s]);
                a2 = muse_attn_mix(a2, w1[s], as[s0 + s], w2[s]);
            }
            run = M[nb - 1];
        }
        bad += memcmp(&l1, &l2, sizeof l1) || memcmp(&a1, &a2, sizeof a1);
        rows++;
    }
    ok(bad == 0, "the combine's weights made first: l and acc bit for bit as the fold (%ld rows)",
       rows);
    float M[40], m[40];
    for (int s = 0; s < 40; s++) m[s] = s == 33 ? 100.0f : (float)((s * 7) % 13);
    muse_attn_prefix_max(m, 40, -INFINITY, 32, M);
    long bad_scan = 0;
    float want = -INFINITY;
    for (int s = 0; s < 40; s++) bad_scan += M[s] != (want = fmaxf(want, m[s]));
    ok(bad_scan == 0 && M[39] == 100.0f, "the scan across two lane groups is the running max");
}

/* A tile's keys staged by the block's warps, each warp's 16 from one lookup (muse_attn_group_first,
 * muse_kv_group_at, muse_attn_group_key): every key of every tile of a row's range [lo, hi] at
 * the offset a lookup of its own gives (muse_kv_offset32), zeros (-1) outside the range and in
 * unreserved blocks; full layers through a table with holes and rings of several caps, ranges
 * that start and end inside a warp's keys. */
static void test_stage_groups(void)
{
    enum { SEQS = 2, BPS = 24, WIDTH = 40 };
    int32_t tables[SEQS * BPS];
    for (int i = 0; i < SEQS * BPS; i++) /* a shuffled block order, some unreserved */
        tables[i] = (i * 7 + 3) % 5 == 0 ? -1 : (i * 37 + 11) % (SEQS * BPS);
    const int64_t caps[] = {0, 16, 23, 64, 100};
    long bad = 0, keys = 0, lookups = 0, in = 0;
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++)
        for (int seq = 0; seq < SEQS; seq++)
            for (int r = 0; r < 60; r++) {
                int64_t lo = (int64_t)((urand() + 1.0) * 150),
                        hi = lo + (int64_t)((urand() + 1.0) * 100);
                if (hi >= BPS * MUSE_KV_BLOCK) hi = BPS * MUSE_KV_BLOCK - 1;
                if (lo > hi) lo = hi;
                for (int64_t base = lo / MUSE_ATTN_TILE * MUSE_ATTN_TILE; base <= hi;
                     base += MUSE_ATTN_TILE)
                    for (int w = 0; w < MUSE_ATTN_TILE / MUSE_KV_BLOCK; w++) {
                        int64_t s0 = base + MUSE_KV_BLOCK * w,
                                p = muse_attn_group_first(s0, lo, hi);
                        muse_kv_group g = {-1, MUSE_KV_BLOCK, 1};
                        if (p >= 0) {
                            g = muse_kv_group_at(tables, BPS, caps[c], seq, p, (int)(p - s0));
                            lookups++;
                        }
                        int klo, khi;
                        muse_attn_group_span(s0, lo, hi, &klo, &khi);
                        for (int d = 0; d < MUSE_KV_BLOCK; d++) {
                            int64_t s = s0 + d, want = -1;
                            bad += (d >= klo && d <= khi) != (s >= lo && s <= hi);
                            /* the kernel's form: one pointer for the group, less the wrap */
                            if (!g.none && d >= klo && d <= khi)
                                bad += (g.r0 * WIDTH + (int64_t)d * WIDTH -
                                        (d >= g.wd ? caps[c] * WIDTH : 0)) !=
                                       muse_attn_group_key(g, caps[c], WIDTH, s0, lo, hi, d);
                            if (s >= lo && s <= hi) {
                                want = muse_kv_offset32(tables, BPS, caps[c], seq, s, WIDTH);
                                in += want >= 0;
                            }
                            bad += muse_attn_group_key(g, caps[c], WIDTH, s0, lo, hi, d) != want;
                            keys++;
                        }
                    }
            }
    ok(bad == 0 && in > 0 && in < keys,
       "a warp's 16 staged keys from one lookup: %ld keys (%ld read), %ld lookups", keys, in,
       lookups);
}

int main(void)
{
    test_splits(64, MUSE_ATTN_TILE);
    test_splits(MUSE_ATTN_MAX_SPLITS, MUSE_ATTN_TILE);
    test_splits(256, MUSE_ATTN_TILE);
    test_splits(MUSE_ATTN_MAX_SPLITS, 4 * MUSE_ATTN_TILE);
    test_splits(MUSE_ATTN_MAX_SPLITS, MUSE_ATTN_LEAST_CHUNK);
    test_split_sizes();
    test_rescale();
    test_pair(MUSE_ATTN_MAX_SPLITS, MUSE_ATTN_TILE);
    test_pair(64, MUSE_ATTN_TILE);
    test_pair(MUSE_ATTN_MAX_SPLITS, 4 * MUSE_ATTN_TILE);
    test_mma_layout();
    test_merge();
    test_flash_walk(MUSE_ATTN_MAX_SPLITS, MUSE_ATTN_TILE);
    test_flash_walk(2, MUSE_ATTN_TILE);
    test_flash_walk(64, 4 * MUSE_ATTN_TILE);
    test_flash_bits();
    test_ring();
    test_stage_groups();
    test_tile_early();
    test_combine_weights();
    test_emulation(emulate_split, 2e-5, "the CUDA-core split: chunked fp32 online softmax");
    test_emulation(emulate_split_mma, 2e-5,
                   "the tensor-core split: fp16 high and low parts, tile partials merged");
    return done_testing();
}
