/* model/kv_addr.h: block and ring offsets of every position of a few sequences against a
 * plain computation (a walk that counts rows), ring wrap-around, the last block, unreserved
 * blocks, the snapshot window's first position and a window's runs of ring rows. */
#include <stdint.h>
#include <stdio.h>

#include "model/kv_addr.h"
#include "tap.h"

#define SEQS  3
#define BPS   5 /* blocks per sequence: 80 positions */
#define WIDTH 12

/* Block tables with no pattern an index formula could lean on; seq 2 holds 3 blocks only. */
static const int32_t tables[SEQS][BPS] = {
    {7, 2, 11, 0, 5},
    {3, 14, 9, 1, 12},
    {6, 10, 4, -1, -1},
};

static void test_blocks(void)
{
    int good = 1, checked = 0;
    for (int seq = 0; seq < SEQS; seq++) {
        /* walk the positions counting within a block, as a writer filling it would */
        int64_t in_block = 0, b = 0;
        for (int64_t s = 0; s < BPS * MUSE_KV_BLOCK; s++) {
            int32_t blk = tables[seq][b];
            for (int64_t col = 0; col < WIDTH; col += 5) {
                int64_t want = blk < 0 ? -1 : (blk * MUSE_KV_BLOCK + in_block) * WIDTH + col;
                int64_t got = muse_kv_block_offset(&tables[0][0], BPS, seq, s, col, WIDTH);
                good &= got == want;
                good &= muse_kv_offset(&tables[0][0], BPS, 0, seq, s, col, WIDTH) == want;
                if (col == 0)
                    good &= muse_kv_offset32(&tables[0][0], BPS, 0, seq, s, WIDTH) == want;
                checked++;
            }
            if (++in_block == MUSE_KV_BLOCK) in_block = 0, b++;
        }
    }
    ok(good, "block offsets of every position of %d sequences (%d checks)", SEQS, checked);
    int64_t last = BPS * MUSE_KV_BLOCK - 1;
    is_int(muse_kv_block_offset(&tables[0][0], BPS, 1, last, WIDTH - 1, WIDTH),
           (12 * MUSE_KV_BLOCK + MUSE_KV_BLOCK - 1) * WIDTH + WIDTH - 1,
           "last column of the last position of the last block");
    is_int(muse_kv_block_offset(&tables[0][0], BPS, 2, 3 * MUSE_KV_BLOCK, 0, WIDTH), -1,
           "a position past the reserved blocks: -1");
    is_int(muse_kv_block_offset(&tables[0][0], BPS, 2, 3 * MUSE_KV_BLOCK - 1, 0, WIDTH),
           (4 * MUSE_KV_BLOCK + MUSE_KV_BLOCK - 1) * WIDTH, "the last reserved position");
}

static void test_rings(void)
{
    const int64_t caps[] = {1, 7, 16, 33};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        int64_t cap = caps[i];
        int good = 1;
        for (int seq = 0; seq < SEQS; seq++) {
            int64_t slot = 0; /* the ring's slot, advanced and wrapped by hand */
            for (int64_t s = 0; s < 3 * cap + 5; s++) {
                for (int64_t col = 0; col < WIDTH; col += 3) {
                    int64_t want = (seq * cap + slot) * WIDTH + col;
                    good &= muse_kv_ring_offset(seq, s, col, cap, WIDTH) == want;
                    good &= muse_kv_offset(&tables[0][0], BPS, cap, seq, s, col, WIDTH) == want;
                    if (col == 0)
                        good &= muse_kv_offset32(&tables[0][0], BPS, cap, seq, s, WIDTH) == want;
                }
                if (++slot == cap) slot = 0;
            }
        }
        ok(good, "cap %lld: ring offsets of every position of %d sequences, wrapping 3 times",
           (long long)cap, SEQS);
    }
    is_int(muse_kv_ring_offset(1, 33, 0, 33, WIDTH), muse_kv_ring_offset(1, 0, 0, 33, WIDTH),
           "position cap reuses slot 0");
    is_int(muse_kv_ring_offset(2, 32, 4, 33, WIDTH), (2 * 33 + 32) * WIDTH + 4,
           "the ring's last slot");
}

/* the 32-bit form at positions toward 2^31 and rings of up to 2^31 - 1 slots, offsets past 2^32 */
static void test_offset32_far(void)
{
    const int64_t caps[] = {4096, 131072, 1000003, 2147483647};
    const int64_t pos[] = {0, 4095, 4096, 131071, 9999991, 2147483000, 2147483647};
    int good = 1;
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++)
        for (size_t p = 0; p < sizeof pos / sizeof *pos; p++)
            for (int seq = 0; seq < 63; seq += 31)
                good &= muse_kv_offset32(&tables[0][0], BPS, caps[c], seq, pos[p], 512) ==
                        muse_kv_offset(&tables[0][0], BPS, caps[c], seq, pos[p], 0, 512);
    ok(good, "the 32-bit form equals muse_kv_offset at positions to 2^31 - 1, rings to 2^31 - 1");
    int32_t big[2] = {0, 100000000}; /* one sequence's blocks; the second far out */
    is_int(muse_kv_offset32(big, 2, 0, 0, MUSE_KV_BLOCK + 3, 512),
           ((int64_t)100000000 * MUSE_KV_BLOCK + 3) * 512, "a block offset past 2^32 halves");
}

/* a group's positions from where each of its positions finds it, in blocks (with unreserved ones)
 * and rings of caps that do and do not divide 16: muse_kv_offset32's offsets */
static void test_groups(void)
{
    const int64_t caps[] = {0, 16, 17, 33, 4351};
    int good = 1, checked = 0, wrapped = 0, none = 0;
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++)
        for (int seq = 0; seq < SEQS; seq++)
            for (int64_t s0 = 0; s0 < 3 * (caps[c] > 0 ? caps[c] : 30); s0 += MUSE_KV_BLOCK) {
                if (caps[c] == 0 && s0 >= BPS * MUSE_KV_BLOCK) break;
                for (int dp = 0; dp < MUSE_KV_BLOCK; dp++) {
                    muse_kv_group g =
                        muse_kv_group_at(&tables[0][0], BPS, caps[c], seq, s0 + dp, dp);
                    for (int d = dp; d < MUSE_KV_BLOCK; d++) {
                        int64_t want =
                            muse_kv_offset32(&tables[0][0], BPS, caps[c], seq, s0 + d, WIDTH);
                        good &=
                            g.none ? want == -1 : muse_kv_group_row(g, caps[c], d) * WIDTH == want;
                        wrapped += d >= g.wd;
                        none += g.none;
                        checked++;
                    }
                }
            }
    ok(good && wrapped > 0 && none > 0,
       "a group's rows from one lookup: %d checks, %d past a ring's end, %d in unreserved blocks",
       checked, wrapped, none);
}

static void test_window(void)
{
    is_int(muse_kv_window_first(0, 8), 0, "window first: empty sequence");
    is_int(muse_kv_window_first(5, 8), 0, "window first: shorter than the window");
    is_int(muse_kv_window_first(8, 8), 0, "window first: exactly the window");
    is_int(muse_kv_window_first(20, 8), 12, "window first: the last 8 of 20");
}

/* every window [first, end) of rings of a few caps: the runs, walked row by row in order, are
 * the rows muse_kv_ring_offset gives each position; no run is empty */
static void test_ring_runs(void)
{
    const int64_t caps[] = {1, 7, 16, 33};
    int good = 1, two = 0, checked = 0;
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        int64_t cap = caps[i];
        for (int seq = 0; seq < SEQS; seq++)
            for (int64_t first = 0; first < 3 * cap; first++)
                for (int64_t end = first; end <= first + cap; end++) {
                    int64_t row[2] = {-1, -1}, n[2] = {-1, -1};
                    int runs = muse_kv_ring_runs(seq, first, end, cap, row, n);
                    good &=
                        runs == (end > first) + (end > first && first % cap + end - first > cap);
                    int64_t s = first;
                    for (int u = 0; u < runs; u++) {
                        good &= n[u] > 0;
                        for (int64_t k = 0; k < n[u]; k++, s++)
                            good &=
                                (row[u] + k) * WIDTH == muse_kv_ring_offset(seq, s, 0, cap, WIDTH);
                    }
                    good &= s == end;
                    two += runs == 2;
                    checked++;
                }
    }
    ok(good && two > 0,
       "ring runs of %d windows (%d wrapping): the rows of their positions in order", checked, two);
    int64_t row[2], n[2];
    is_int(muse_kv_ring_runs(1, 4090, 8186, 4351, row, n), 2,
           "a window of 4096 wrapping a ring of 4351");
    ok(row[0] == 4351 + 4090 && n[0] == 261 && row[1] == 4351 && n[1] == 3835,
       "its runs: 261 rows from slot 4090, then 3835 from slot 0");
}

int main(void)
{
    test_blocks();
    test_rings();
    test_offset32_far();
    test_groups();
    test_window();
    test_ring_runs();
    return done_testing();
}
