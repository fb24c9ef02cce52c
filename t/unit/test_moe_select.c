/* kernels/moe_select.h: the fast selection's place count split over S threads (the parts added,
 * as the kernel's shuffles add them) equals the one-thread count and the serial top-k's order,
 * over random rows of keys with many ties, E 1 to 300, every S the kernel can take; and the
 * split stays within a block of 1024 threads and a warp's lanes. */
#include <stdint.h>
#include <string.h>

#include "kernels/moe_select.h"
#include "tap.h"

static uint64_t rng = 0x2545F4914F6CDD1Du;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* the serial selection's order: repeatedly the largest key left, the lower expert at a tie */
static void serial_order(const float *k, int E, int *order)
{
    unsigned char taken[300] = {0};
    for (int p = 0; p < E; p++) {
        int best = 0;
        while (taken[best]) best++; /* E - p > 0 experts are left */
        for (int y = best + 1; y < E; y++)
            if (!taken[y] && k[y] > k[best]) best = y;
        taken[best] = 1;
        order[p] = best;
    }
}

int main(void)
{
    int bad_sum = 0, bad_order = 0, rows = 0, ties = 0;
    for (int E = 1; E <= 300; E += E < 20 ? 1 : 37)
        for (int rep = 0; rep < 40; rep++) {
            float k[300];
            int levels = rep % 2 ? 3 : 1000; /* few levels: many ties */
            for (int y = 0; y < E; y++) k[y] = (float)(rnd() % (unsigned)levels) * 0.125f - 1.0f;
            int order[300], at[300];
            serial_order(k, E, order);
            memset(at, 0xFF, sizeof at);
            for (int S = 1; S <= 32; S *= 2)
                for (int x = 0; x < E; x++) {
                    int whole = muse_select_place_part(k, E, x, 0, 1), sum = 0;
                    for (int part = 0; part < S; part++)
                        sum += muse_select_place_part(k, E, x, part, S);
                    bad_sum += sum != whole;
                    if (S == 32) at[whole] = x;
                }
            for (int p = 0; p < E; p++) bad_order += at[p] != order[p];
            for (int y = 1; y < E; y++) ties += k[y] == k[0];
            rows++;
        }
    diag("%d rows, %d ties with a row's first key", rows, ties);
    ok(bad_sum == 0, "S parts of a place add up to the one-thread place, S 1 to 32");
    ok(bad_order == 0, "the places are the serial top-k's order (lower expert first at a tie)");
    ok(ties > rows, "the rows exercise ties");
    int good = 1;
    for (long keys = 1; keys <= 4096; keys++) {
        int s = muse_select_split(keys);
        good &= s >= 1 && s <= 32 && 32 % s == 0 && (keys * s <= 1024 || s == 1);
    }
    ok(good, "the split: a power of two up to 32, keys x split within 1024 threads or 1");
    is_int(muse_select_split(96), 8, "one row of 96 experts: 8 threads a key");
    is_int(muse_select_split(384), 2, "four rows of 96: 2 threads a key");
    return done_testing();
}
