/* kernels/moe_order.h: the combine kernel's parallel order (each slot's lead and place) equals
 * the serial walk over random rows of slots with repeats and negative indices, K 1 to 64; so
 * does the early combine's (kernels/moe_combine_fast.cu: K <= 8 slots padded with -1, a
 * leader's place by its expert). */
#include <stdint.h>
#include <string.h>

#include "kernels/moe_order.h"
#include "tap.h"

static uint64_t rng = 0x9E3779B97F4A7C15u;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* the kernel's steps on the host: leads, then each leader at its place */
static int parallel_order(const int32_t *sel, long K, int32_t *at)
{
    int32_t lead[64];
    int n = 0;
    for (int t = 0; t < K; t++) lead[t] = muse_moe_order_leads(sel, t);
    for (int t = 0; t < K; t++) {
        if (!lead[t]) continue;
        at[muse_moe_order_place(sel, lead, K, t)] = t;
        n++;
    }
    return n;
}

/* k_moe_combine_norm_early's steps: the slots padded to 8 with -1, then each leader's place by
 * its expert index */
static int early_order(const int32_t *sel, long K, int32_t *at)
{
    int32_t s8[8], lead[8];
    int n = 0;
    for (int j = 0; j < 8; j++) s8[j] = j < K ? sel[j] : -1;
    for (int j = 0; j < 8; j++) n += lead[j] = muse_moe_order_leads(s8, j);
    for (int t = 0; t < 8; t++)
        if (lead[t]) at[muse_moe_order_place_of(s8, lead, 8, s8[t])] = t;
    return n;
}

int main(void)
{
    int bad = 0, rows = 0, repeats = 0, bad_early = 0, early = 0;
    for (long K = 1; K <= 64; K++)
        for (int rep = 0; rep < 200; rep++) {
            int32_t sel[64], a[64], b[64];
            int range = rep % 3 == 0 ? (int)K + 2 : 4 * (int)K; /* few values: repeats */
            for (long i = 0; i < K; i++) sel[i] = (int32_t)(rnd() % (unsigned)range) - 1;
            memset(a, 0xFF, sizeof a);
            memset(b, 0xEE, sizeof b);
            int na = muse_moe_order_walk(sel, K, a), nb = parallel_order(sel, K, b);
            bad += na != nb || memcmp(a, b, (size_t)na * sizeof a[0]) != 0;
            if (K <= 8) {
                memset(b, 0xEE, sizeof b);
                nb = early_order(sel, K, b);
                bad_early += na != nb || memcmp(a, b, (size_t)na * sizeof a[0]) != 0;
                early++;
            }
            for (int i = 1; i < na; i++) bad += sel[a[i - 1]] >= sel[a[i]];
            repeats += na < K;
            rows++;
        }
    diag("%d rows, %d with repeats or negative indices", rows, repeats);
    ok(bad == 0, "the parallel order equals the serial walk (ascending, each expert once)");
    ok(repeats > rows / 4, "the rows exercise repeats and negative indices");
    ok(bad_early == 0 && early == 1600,
       "the early combine's order equals the walk (%d rows of K <= 8)", early);
    int32_t sel[4] = {5, -1, 2, 5}, at[4];
    int n = muse_moe_order_walk(sel, 4, at);
    ok(n == 2 && at[0] == 2 && at[1] == 0, "5, -1, 2, 5: slots 2 then 0");
    return done_testing();
}
