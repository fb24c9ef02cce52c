/* backend/stage_pack.h: the round's one staging copy. For many row and wanted counts: every
 * array aligned, none overlapping another, each fitting the pack sized for the most rows; then
 * a stage of distinct values packed into poisoned memory, only the round's copy moved into a
 * second poisoned buffer (the device's), and every array read back there at its offset: each
 * equal to the stage, the tables through the highest sequence's row, nothing read beyond. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/stage_pack.h"
#include "tap.h"

#define MAX_ROWS 300
#define SEQS     6
#define BPS      9 /* blocks per sequence */

typedef struct { /* the kernel's sampling record's size and alignment (launch.h) */
    float t;
    int32_t k;
    float p, mp;
    uint64_t seed;
    int32_t masked;
} rec;

static void test_layouts(void)
{
    muse_stage_pack most = muse_stage_pack_layout(MAX_ROWS, MAX_ROWS, sizeof(rec), SEQS * BPS);
    int good = 1, n = 0;
    for (size_t R = 1; R <= MAX_ROWS; R += R < 40 ? 1 : 37)
        for (size_t W = 0; W <= R; W += W < 5 ? 1 : 23) {
            muse_stage_pack p = muse_stage_pack_layout(R, W, sizeof(rec), SEQS * BPS);
            size_t off[] = {p.positions, p.draw_pos, p.sampling, p.tokens,
                            p.seqs,      p.want,     p.tables};
            size_t len[] = {R * 8, W * 8, W * sizeof(rec), R * 4, R * 4, W * 4, SEQS * BPS * 4};
            for (int i = 0; i < 7; i++) {
                good &= off[i] % 16 == 0;
                good &= off[i] + len[i] <= (i < 6 ? off[i + 1] : p.bytes); /* in order, apart */
            }
            good &= p.bytes <= most.bytes;
            good &= muse_stage_pack_copy(&p, -1, BPS) == p.tables;
            good &= muse_stage_pack_copy(&p, SEQS - 1, BPS) == p.bytes;
            n++;
        }
    ok(good, "%d layouts: arrays 16-byte aligned, in order, apart, within the largest pack", n);
}

/* A stage of R rows (W wanted) on sequences seq_of(i), packed and copied as a round does. */
static void test_round(long R, long W, long real, int top_seq)
{
    int32_t tokens[MAX_ROWS], seqs[MAX_ROWS], want[MAX_ROWS], tables[SEQS * BPS];
    int64_t positions[MAX_ROWS], draw_pos[MAX_ROWS];
    rec samp[MAX_ROWS] = {{0}};
    for (long i = 0; i < R; i++) {
        tokens[i] = (int32_t)(1000 + 7 * i);
        seqs[i] = i < real ? (int32_t)(i % (top_seq + 1)) : -1;
        positions[i] = 500000 + 13 * i;
        want[i] = (int32_t)(R - 1 - i);
        draw_pos[i] = 900000 + 3 * i;
        samp[i] =
            (rec){0.5f + (float)i, (int32_t)i, 0.9f, 0.01f, 77u + (uint64_t)i, (int32_t)(i & 1)};
    }
    for (int i = 0; i < SEQS * BPS; i++) tables[i] = 40 + i;
    muse_round_stage s = {.rows = R,
                          .real_rows = real,
                          .wanted = W,
                          .real_wanted = W,
                          .tokens = tokens,
                          .seqs = seqs,
                          .want = want,
                          .positions = positions,
                          .draw_pos = draw_pos,
                          .tables = tables};
    muse_stage_pack p = muse_stage_pack_layout((size_t)R, (size_t)W, sizeof(rec), SEQS * BPS);
    long top = muse_stage_pack_max_seq(&s);
    size_t copy = muse_stage_pack_copy(&p, top, BPS);
    unsigned char *host = malloc(p.bytes), *dev = malloc(p.bytes);
    memset(host, 0xA5, p.bytes);
    memset(dev, 0x5A, p.bytes);
    muse_stage_pack_fill(&p, host, &s, samp, sizeof(rec), copy);
    memcpy(dev, host, copy);
    int good = top == top_seq;
    good &= !memcmp(dev + p.tokens, tokens, (size_t)R * 4);
    good &= !memcmp(dev + p.seqs, seqs, (size_t)R * 4);
    good &= !memcmp(dev + p.positions, positions, (size_t)R * 8);
    good &= !memcmp(dev + p.want, want, (size_t)W * 4);
    good &= !memcmp(dev + p.draw_pos, draw_pos, (size_t)W * 8);
    good &= !memcmp(dev + p.sampling, samp, (size_t)W * sizeof(rec));
    good &= !memcmp(dev + p.tables, tables, (size_t)(top_seq + 1) * BPS * 4);
    for (size_t b = copy; b < p.bytes; b++) good &= dev[b] == 0x5A; /* the rows not read */
    ok(good,
       "%ld rows (%ld real, %ld wanted), sequences 0..%d: every array read back at its "
       "offset, tables through row %d, %zu of %zu bytes copied",
       R, real, W, top_seq, top_seq, copy, p.bytes);
    free(host);
    free(dev);
}

int main(void)
{
    test_layouts();
    test_round(1, 1, 1, 0);
    test_round(4, 3, 3, 2);
    test_round(33, 1, 30, 4);
    test_round(MAX_ROWS, MAX_ROWS, MAX_ROWS - 5, SEQS - 1);
    return done_testing();
}
