/* Where a KV cache element lives: the offset of (seq, position, column) in a full layer's
 * paged blocks through a block table, or in a sliding layer's per-sequence ring of cap
 * positions. MUSE_HD, so the CPU backend, the CUDA host and the attention kernels address
 * alike. Rows are width elements (a rank's KV heads); col < width. */
#ifndef MUSE_KV_ADDR_H
#define MUSE_KV_ADDR_H

#include <stdint.h>

#include "base/host_device.h"

#define MUSE_KV_BLOCK 16 /* positions a block holds */

/* Sliding layer: rings [seqs][cap][width]; position s sits in slot s mod cap. */
MUSE_HD int64_t muse_kv_ring_offset(int seq, int64_t s, int64_t col, int64_t cap, int64_t width)
{
    return ((int64_t)seq * cap + s % cap) * width + col;
}

/* Full layer: blocks [n_blocks][MUSE_KV_BLOCK][width] through tables [seqs][blocks_per_seq];
 * -1 when the block holding s is not reserved (-1 in the table). */
MUSE_HD int64_t muse_kv_block_offset(const int32_t *tables, int64_t blocks_per_seq, int seq,
                                     int64_t s, int64_t col, int64_t width)
{
    int32_t blk = tables[(int64_t)seq * blocks_per_seq + s / MUSE_KV_BLOCK];
    if (blk < 0) return -1;
    return ((int64_t)blk * MUSE_KV_BLOCK + s % MUSE_KV_BLOCK) * width + col;
}

/* Either layout: a ring when cap > 0, else the blocks (-1: not reserved). */
MUSE_HD int64_t muse_kv_offset(const int32_t *tables, int64_t blocks_per_seq, int64_t cap, int seq,
                               int64_t s, int64_t col, int64_t width)
{
    if (cap > 0) return muse_kv_ring_offset(seq, s, col, cap, width);
    return muse_kv_block_offset(tables, blocks_per_seq, seq, s, col, width);
}

/* muse_kv_offset at column 0 with the position's arithmetic in 32 bits (s and a ring's cap under
 * 2^31; MUSE_KV_BLOCK a power of two): the fast attention stages keys by it, where a 64-bit
 * remainder is a long software sequence on the GPU. */
MUSE_HD int64_t muse_kv_offset32(const int32_t *tables, int64_t blocks_per_seq, int64_t cap,
                                 int seq, int64_t s, int64_t width)
{
    int64_t row;
    if (cap > 0) {
        row = (int64_t)seq * cap + (int64_t)((uint32_t)s % (uint32_t)cap);
    } else {
        int32_t blk = tables[(int64_t)seq * blocks_per_seq + (uint32_t)s / MUSE_KV_BLOCK];
        if (blk < 0) return -1;
        row = (int64_t)blk * MUSE_KV_BLOCK + (uint32_t)s % MUSE_KV_BLOCK;
    }
    return row * width;
}

/* A group: the MUSE_KV_BLOCK positions from a multiple of it, s0 + d for d < MUSE_KV_BLOCK: one
 * block of a full layer, one run of a ring (of cap >= MUSE_KV_BLOCK) that wraps at most once. So
 * one table load places them all: a kernel staging a group waits on one load, not one a
 * position. muse_kv_group_at finds the group from position p = s0 + dp of it (the first it
 * reads: a table's -1 gives none); position s0 + d (d >= dp) then sits at row r0 + d, less cap
 * from d >= wd (where the ring wraps; MUSE_KV_BLOCK: never). */
typedef struct {
    int64_t r0; /* the row of d = 0 as if unwrapped; -1 with none: the block is not reserved */
    int wd;     /* the first d that wraps */
    int none;
} muse_kv_group;

/* The table entry of p's block (a ring: 0, no load), apart from muse_kv_group_of's arithmetic so
 * that a kernel can issue the load early and use it late */
MUSE_HD int32_t muse_kv_group_entry(const int32_t *tables, int64_t blocks_per_seq, int64_t cap,
                                    int seq, int64_t p)
{
    return cap > 0 ? 0 : tables[(int64_t)seq * blocks_per_seq + (uint32_t)p / MUSE_KV_BLOCK];
}

MUSE_HD muse_kv_group muse_kv_group_of(int32_t entry, int64_t cap, int seq, int64_t p, int dp)
{
    muse_kv_group g = {-1, MUSE_KV_BLOCK, 1};
    int64_t row; /* p's */
    if (cap > 0) {
        row = (int64_t)seq * cap + (int64_t)((uint32_t)p % (uint32_t)cap);
        int64_t left = (int64_t)(seq + 1) * cap - row + dp; /* the d whose row is the ring's end */
        g.wd = left < MUSE_KV_BLOCK ? (int)left : MUSE_KV_BLOCK;
    } else {
        if (entry < 0) return g;
        row = (int64_t)entry * MUSE_KV_BLOCK + (uint32_t)p % MUSE_KV_BLOCK;
    }
    g.r0 = row - dp;
    g.none = 0;
    return g;
}

MUSE_HD muse_kv_group muse_kv_group_at(const int32_t *tables, int64_t blocks_per_seq, int64_t cap,
                                       int seq, int64_t p, int dp)
{
    return muse_kv_group_of(muse_kv_group_entry(tables, blocks_per_seq, cap, seq, p), cap, seq, p,
                            dp);
}

/* muse_kv_offset32's row of position s0 + d of group g (d at or after the p it was found at) */
MUSE_HD int64_t muse_kv_group_row(muse_kv_group g, int64_t cap, int d)
{
    return g.r0 + d - (d >= g.wd ? cap : 0);
}

/* A sliding snapshot holds the last `window` positions before end_pos, ascending from this
 * one: position s is its row s - first. */
MUSE_HD int64_t muse_kv_window_first(int64_t end_pos, int64_t window)
{
    return end_pos > window ? end_pos - window : 0;
}

/* Positions [first, end) of sequence seq's ring (end - first <= cap) as at most two runs of
 * contiguous rows, in position order: run i is n[i] rows from row[i] (the second where the ring
 * wraps). Returns the runs: a snapshot copies a layer's window in two copies, not one a row. */
MUSE_HD int muse_kv_ring_runs(int seq, int64_t first, int64_t end, int64_t cap, int64_t row[2],
                              int64_t n[2])
{
    if (first >= end) return 0;
    int64_t at = first % cap, len = end - first;
    row[0] = (int64_t)seq * cap + at;
    n[0] = len < cap - at ? len : cap - at;
    if (n[0] == len) return 1;
    row[1] = (int64_t)seq * cap;
    n[1] = len - n[0];
    return 2;
}

#endif
