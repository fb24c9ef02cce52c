/* attention_fast.h: the split logic of the fast attention (kernels/attention_fast.cu) as MUSE_HD
 * helpers, so t/unit/test_attention_fast.c checks on the CPU what the kernel runs: a row's key
 * range, the chunk size and splits made from that range alone (absolute positions, never the
 * batch), the tiles of a split, the workspace a launch needs and the merge of two partials. */
#ifndef MUSE_K_ATTENTION_FAST_H
#define MUSE_K_ATTENTION_FAST_H

#include <math.h>
#include <stdint.h>

#include "base/host_device.h"

#define MUSE_ATTN_TILE       64 /* positions a block stages at once; chunks are multiples */
/* The default cap: a row's key range in at most this many chunks. On the H200 one row's kv
 * write + attention at context 131072 took 451 us at 64, 246 at 128, 270 at 256, 304 at 512
 * (docs/benchmarks.md). */
#define MUSE_ATTN_MAX_SPLITS  128
#define MUSE_ATTN_MOST_SPLITS 1024 /* the largest cap a process may take (MUSE_ATTN_SPLITS) */
#define MUSE_ATTN_MAX_GROUP  16 /* query heads a block holds (a GQA group) */
#define MUSE_ATTN_WS_ROWS    64 /* rows one launch's workspace covers (more: in row groups) */

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

/* The chunk size of the row with key range [first, p]: the smallest MUSE_ATTN_TILE * 2^k whose
 * aligned chunks number at most cap (the process's, fixed while it runs). A function of
 * (first, p) alone. */
MUSE_HD int64_t muse_attn_chunk(int64_t first, int64_t p, int64_t cap)
{
    int64_t c = MUSE_ATTN_TILE;
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

#endif
