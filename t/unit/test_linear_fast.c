/* The fast EXL3 product's index and bit logic (kernels/linear_fast.h) on the CPU against
 * engine/pack/exl3.c: lane states vs muse_exl3_tile_states, lane elements vs the position map,
 * the two-stage decode vs muse_exl3_state_value for every state of every codebook, the k split
 * and its divisions as multiplies, the transposed form's block widths. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/linear_fast.h"
#include "pack/exl3.h"
#include "pack/exl3_tile.h"
#include "tap.h"

static uint64_t rng_state = 0x1234567u;
static uint32_t rng32(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 16);
}

/* every lane's 8 states equal the reference's states of its positions, for random tiles and
 * the all-ones / all-zero edge tiles, at every bits */
static void test_lane_states(void)
{
    for (int bits = 1; bits <= 8; bits++) {
        int bad = 0, nwords = muse_fast_nwords(bits), nwin = muse_fast_nwin(bits);
        for (int trial = 0; trial < 300; trial++) {
            uint16_t tile[16 * 8];
            for (int i = 0; i < 16 * bits; i++)
                tile[i] = trial == 0 ? 0xFFFFu : trial == 1 ? 0 : (uint16_t)rng32();
            uint32_t words[8 * 8];
            for (int j = 0; j < 8 * bits; j++)
                words[j] = (uint32_t)tile[2 * j] | (uint32_t)tile[2 * j + 1] << 16;
            uint16_t ref[256];
            muse_exl3_tile_states(tile, bits, ref);
            for (int lane = 0; lane < 32; lane++) {
                uint32_t st[8];
                muse_fast_lane_states(words, bits, nwords, nwin, lane, st);
                for (int j = 0; j < 8; j++) bad += st[j] != ref[8 * lane + j];
            }
        }
        ok(bad == 0, "bits %d: lane states equal muse_exl3_tile_states (nwords %d, nwin %d)", bits,
           nwords, nwin);
        ok(nwords >= 2 && nwords <= 3 && nwin >= 1 && nwin <= nwords,
           "bits %d: a lane reads 2 or 3 words", bits);
    }
}

/* the same against the shared MUSE_HD tile helpers (pack/exl3_tile.h): states and decode */
static void test_tile_header(void)
{
    int bad = 0;
    for (int bits = 1; bits <= 8; bits++) {
        uint16_t tile[16 * 8];
        uint32_t words[8 * 8];
        for (int i = 0; i < 16 * bits; i++) tile[i] = (uint16_t)rng32();
        for (int j = 0; j < 8 * bits; j++) words[j] = muse_exl3_word(tile, j);
        for (int lane = 0; lane < 32; lane++) {
            uint32_t st[8];
            muse_fast_lane_states(words, bits, muse_fast_nwords(bits), muse_fast_nwin(bits), lane,
                                  st);
            for (int j = 0; j < 8; j++) {
                int r, c, rr, cc;
                muse_fast_lane_element(lane, j, &r, &c);
                muse_exl3_elem(8 * lane + j, &rr, &cc);
                bad += st[j] != muse_exl3_state(tile, bits, 8 * lane + j) || r != rr || c != cc;
                for (int cb = 0; cb < 3; cb++)
                    bad += muse_fast_fp_stage_host(cb, muse_fast_int_stage(cb, st[j])) !=
                           muse_exl3_decode(cb, st[j]);
            }
        }
    }
    ok(bad == 0, "lane states, elements and decode equal pack/exl3_tile.h's");
}

static void test_lane_elements(void)
{
    int bad = 0, seen[16][16];
    memset(seen, 0, sizeof seen);
    for (int p = 0; p < 256; p++) {
        int r, c, rr, cc;
        muse_exl3_position_element(p, &r, &c);
        muse_fast_lane_element(p / 8, p % 8, &rr, &cc);
        bad += r != rr || c != cc;
        seen[rr][cc]++;
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) bad += seen[r][c] != 1;
    ok(bad == 0, "lane elements are the position map, each element once");
    /* the mma B fragment: register q of an n8 half holds rows 2(lane%4) + 8q + {0,1} */
    int r, c;
    muse_fast_lane_element(5, 2, &r, &c);
    ok(r == 10 && c == 1, "lane 5, j 2: row 10, column 1 (B fragment b2 of the first n8)");
    muse_fast_lane_element(31, 7, &r, &c);
    ok(r == 15 && c == 15, "lane 31, j 7: row 15, column 15");
}

static void test_decode(void)
{
    static const char *names[3] = {"3inst", "mcg", "mul1"};
    for (int cb = 0; cb < 3; cb++) {
        int bad = 0, bad_s = 0;
        for (uint32_t s = 0; s < 65536; s++) {
            uint32_t v = muse_fast_int_stage(cb, s);
            if (cb == MUSE_FAST_CB_MUL1) {
                uint32_t x = s * 0x83DCD12Du;
                uint32_t sum =
                    1024 + (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24);
                bad_s += v > 0xFFFFu || muse_f16_to_f32((uint16_t)v) != (float)sum;
            }
            bad += muse_fast_fp_stage_host(cb, v) != muse_exl3_state_value(s, (muse_codebook)cb);
        }
        ok(bad == 0, "%s: the two-stage decode equals muse_exl3_state_value for all 65536",
           names[cb]);
        if (cb == MUSE_FAST_CB_MUL1)
            ok(bad_s == 0, "mul1: 0x6400 + byte sum is the fp16 of 1024 + byte sum");
    }
    ok((int)MUSE_FAST_CB_3INST == (int)MUSE_CB_3INST && (int)MUSE_FAST_CB_MCG == (int)MUSE_CB_MCG &&
           (int)MUSE_FAST_CB_MUL1 == (int)MUSE_CB_MUL1,
       "the codebook ids are muse_codebook's");
}

static void test_splits(void)
{
    static const int64_t shapes[][2] = {{6144, 4096},  {6144, 3072},   {3072, 6144}, {6144, 512},
                                        {8192, 28672}, {6144, 202112}, {128, 128},   {256, 384}};
    int bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t k = shapes[i][0], n = shapes[i][1], kt = k / 16;
        int s = muse_fast_splits(k, n, MUSE_FAST_SPLIT_TARGET);
        diag("%lld x %lld: %d splits", (long long)k, (long long)n, s);
        bad += s < 1 || s > MUSE_FAST_MAX_SPLITS;
        /* the splits tile [0, kt) in order, each at least MIN_SPLIT_KT k-tiles where kt allows */
        bad += muse_fast_split_begin(kt, s, 0) != 0 || muse_fast_split_begin(kt, s, s) != kt;
        for (int j = 0; j < s; j++) {
            int64_t len = muse_fast_split_begin(kt, s, j + 1) - muse_fast_split_begin(kt, s, j);
            bad += len < 1 || (kt >= MUSE_FAST_MIN_SPLIT_KT && len < MUSE_FAST_MIN_SPLIT_KT);
        }
    }
    ok(bad == 0, "splits cover k in order, sizes within bounds");
    is_int(muse_fast_splits(6144, 4096, MUSE_FAST_SPLIT_TARGET), 13, "6144 x 4096: 13 splits");
    is_int(muse_fast_splits(4096, 6144, MUSE_FAST_SPLIT_TARGET), 9, "4096 x 6144: 9 splits");
    is_int(muse_fast_splits(6144, 3072, MUSE_FAST_GROUP_TARGET / 8), 3,
           "an expert's 6144 x 3072 at 8 a token: 3 splits (as at the plain target of 264)");
    is_int(muse_fast_splits(6144, 202112, MUSE_FAST_SPLIT_TARGET), 1, "the head: no split");
}

/* muse_fast_divq is n / d at the divisors' edges (1, powers of two and their neighbours, 2^31 -
 * 1) and the small ones, for numerators at 0, near multiples of d, near 2^31 and at random; and
 * it places every k split of every k the kernels take at muse_fast_split_begin's k-tile */
static void test_magic_div(void)
{
    uint32_t ds[200];
    int nd = 0;
    for (uint32_t d = 1; d <= 64; d++) ds[nd++] = d;
    for (int b = 7; b < 31; b++)
        ds[nd++] = 1u << b, ds[nd++] = (1u << b) - 1, ds[nd++] = (1u << b) + 1;
    ds[nd++] = 0x7FFFFFFFu;
    ds[nd++] = 1000003u;
    long bad = 0, tried = 0;
    for (int i = 0; i < nd; i++) {
        uint32_t d = ds[i];
        muse_fast_div v = muse_fast_magic(d);
        uint32_t edge[] = {0,
                           1,
                           d - 1,
                           d,
                           d + 1,
                           0x7FFFFFFFu,
                           0x7FFFFFFEu,
                           0x7FFFFFFFu / d * d,
                           0x7FFFFFFFu / d * d - 1};
        for (size_t j = 0; j < sizeof edge / sizeof edge[0]; j++) {
            uint32_t n = edge[j] & 0x7FFFFFFFu;
            bad += muse_fast_divq(n, v) != n / d, tried++;
        }
        for (int j = 0; j < 20000; j++) {
            uint32_t n = (j & 1 ? rng32() << 16 ^ rng32() : rng32() % 65536) & 0x7FFFFFFFu;
            bad += muse_fast_divq(n, v) != n / d, tried++;
        }
    }
    diag("%ld divisions", tried);
    ok(bad == 0, "n / d as a multiply and a shift for n < 2^31 at every divisor tried");
    bad = 0;
    for (int64_t k = 128; k < (1 << 26); k = k * 3 / 2 / 128 * 128 + 128)
        for (int S = 1; S <= MUSE_FAST_MAX_SPLITS; S++) {
            muse_fast_div v = muse_fast_magic((uint32_t)S);
            for (int s = 0; s <= S; s++)
                bad += muse_fast_divq((uint32_t)(k / 16) * (uint32_t)s, v) !=
                       muse_fast_split_begin(k / 16, S, s);
        }
    ok(bad == 0, "the split bounds by the multiply equal muse_fast_split_begin's, k < 2^26");
}

/* the transposed form's block widths by policy: 0 never 64 columns, 2 below 16 blocks an SM at
 * every row count, 1 as 2 for plain launches past one row and never else */
static void test_tr_narrow(void)
{
    int bad = 0;
    for (long w = 1; w < 20000; w += 7)
        for (long r = 1; r <= 8; r++)
            for (int g = 0; g < 2; g++) {
                bad += muse_fast_tr_narrow(w, r, g, 0);
                bad += muse_fast_tr_narrow(w, r, g, 2) != (w < 2112);
                bad += muse_fast_tr_narrow(w, r, g, 1) != (!g && r > 1 && w < 2112);
            }
    ok(bad == 0, "transposed form: 64-column blocks by policy 0, 1 and 2");
}

/* the block's m-tiles and the MoE's group rows: the fewest tiles that hold the rows (a plain
 * product's at most 4, a group's at most 8), forced values only from 17 rows on, invalid forced
 * values ignored */
static void test_block_mt(void)
{
    int bad = 0;
    for (int64_t r = 1; r <= 4096; r++) {
        int mt = muse_fast_block_mt(r, 0);
        int want = r <= 16 ? 1 : r <= 32 ? 2 : 4;
        bad += mt != want;
        bad += muse_fast_fit_mt(r, 8) != (r <= 16 ? 1 : r <= 32 ? 2 : r <= 64 ? 4 : 8);
        for (int f = 0; f <= 9; f++) {
            int valid = f == 1 || f == 2 || f == 4 || f == 8;
            bad += muse_fast_block_mt(r, f) != (r <= 16 ? 1 : valid ? f : want);
        }
    }
    ok(bad == 0, "block m-tiles: 1 to 16 rows 1, then the fewest of 2, 4 that hold them");
    is_int(muse_fast_group_rows(1, 8, 96, 0), 16, "one row a round: groups of 16");
    is_int(muse_fast_group_rows(16, 8, 96, 8), 16, "16 rows a round: 16 even when forced");
    is_int(muse_fast_group_rows(64, 8, 96, 0), 16, "64 rows, 8 of 96 (6 a expert): 16");
    is_int(muse_fast_group_rows(256, 8, 96, 0), 32, "256 rows, 8 of 96 (22 a expert): 32");
    is_int(muse_fast_group_rows(512, 8, 96, 0), 64, "512 rows, 8 of 96 (43 a expert): 64");
    is_int(muse_fast_group_rows(2048, 8, 96, 0), 128, "2048 rows, 8 of 96: 128");
    is_int(muse_fast_group_rows(256, 8, 32, 0), 64, "256 rows, 8 of 32 (64 a expert): 64");
    is_int(muse_fast_group_rows(64, 8, 96, 8), 128, "64 rows forced 8: 128");
    is_int(muse_fast_group_rows(64, 8, 0, 0), 64, "no experts: blocks for the round's rows");
}

/* The weight a 3inst/mcg state stands for is its two fp16 halves' sum rounded to fp16 (the fp16
 * stage). Left unrounded (both halves through the mma, one instruction fewer a weight and a
 * half) it differs by at most half an fp16 ulp; the rel L2 that makes on a product's outputs
 * (k 6144, 256 columns, fp16-exact Gaussian activations, sums in double) is printed: what a
 * fast product taking that shortcut would need its bound against the exact path widened to. */
static void test_unrounded_sum(void)
{
    for (int cb = MUSE_FAST_CB_3INST; cb <= MUSE_FAST_CB_MCG; cb++) {
        int bad = 0;
        double num = 0, den = 0;
        for (int n = 0; n < 256; n++) {
            double ye = 0, yu = 0;
            for (int k = 0; k < 6144; k++) {
                double u1 = (rng32() + 1.0) / 4294967297.0, u2 = (rng32() + 1.0) / 4294967297.0;
                float x = muse_round_f16((float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2)));
                uint32_t v = muse_fast_int_stage(cb, rng32() & 0xFFFFu);
                double sum = (double)muse_f16_to_f32((uint16_t)(v & 0xFFFFu)) +
                             (double)muse_f16_to_f32((uint16_t)(v >> 16));
                double w = muse_f16_to_f32(muse_fast_fp_stage_host(cb, v));
                /* half an ulp of w: fp16 has 10 fraction bits (w normal here: |w| >= 2^-14) */
                bad += fabs(sum - w) > ldexp(1.0, ilogb(w) - 11);
                ye += (double)x * w;
                yu += (double)x * sum;
            }
            num += (ye - yu) * (ye - yu);
            den += ye * ye;
        }
        diag("%s: outputs with unrounded weights against fp16 weights: rel L2 %.2g",
             cb == MUSE_FAST_CB_MCG ? "mcg" : "3inst", sqrt(num / den));
        ok(bad == 0 && num > 0, "%s: a state's halves sum within half an fp16 ulp of its weight",
           cb == MUSE_FAST_CB_MCG ? "mcg" : "3inst");
    }
}

/* The wgmma form's places: every fp16 of a stage's A (128 rows) and B (8 tiles) of 4 k-tiles
 * lands once, at row * 128 + (k / 8 ^ row % 8) * 16 + k % 8 * 2 (the 128-byte swizzle) */
static void test_wg_layout(void)
{
    static unsigned char seen[16384];
    int bad = 0;
    memset(seen, 0, sizeof seen);
    for (int r = 0; r < 128; r++)
        for (int k = 0; k < 64; k++) {
            int off = muse_fast_wg_off(r, k / 8) + 2 * (k % 8);
            bad += off != r * 128 + (((k / 8) ^ (r % 8)) * 16) + (k % 8) * 2;
            bad += off < 0 || off >= 16384 || seen[off]++;
        }
    ok(bad == 0, "wgmma A: 128 rows x 64 k in 128-byte swizzled rows, each fp16 once");
    memset(seen, 0, sizeof seen);
    bad = 0;
    for (int kk = 0; kk < 4; kk++)
        for (int t = 0; t < 8; t++)
            for (int lane = 0; lane < 32; lane++)
                for (int j = 0; j < 8; j++) {
                    int r, c;
                    muse_fast_lane_element(lane, j, &r, &c);
                    int n = 16 * t + c, k = 16 * kk + r;
                    int off = muse_fast_wg_b_off(t, j / 2, lane, kk) + 2 * (j & 1);
                    bad += off != n * 128 + (((k / 8) ^ (n % 8)) * 16) + (k % 8) * 2;
                    bad += off < 0 || off >= 16384 || seen[off]++;
                }
    ok(bad == 0, "wgmma B: the lanes' fragment words of 4 k-tiles x 8 tiles, swizzled, each once");
}

/* The register form: wgmma's A fragment (PTX ISA, the m64nNk16 A layout: a warp's 16 rows as
 * the m16n8k16 A fragment, register a at row lane/4 + 8 (a & 1), k 2 (lane%4) + 8 (a >> 1) + h)
 * of Wq^T is B fragment register muse_fast_wr_breg(a) of the lane's decode: its two states'
 * elements (r, c) are the A element's (k, row) */
static void test_wr_fragment(void)
{
    int bad = 0, seen[4] = {0, 0, 0, 0};
    for (int lane = 0; lane < 32; lane++)
        for (int a = 0; a < 4; a++) {
            int q = muse_fast_wr_breg(a);
            bad += q < 0 || q > 3;
            if (lane == 0) seen[q & 3]++;
            for (int h = 0; h < 2; h++) {
                int row = lane / 4 + 8 * (a & 1), k = 2 * (lane % 4) + 8 * (a >> 1) + h, r, c;
                muse_fast_lane_element(lane, 2 * q + h, &r, &c);
                bad += r != k || c != row;
            }
        }
    for (int q = 0; q < 4; q++) bad += seen[q] != 1;
    ok(bad == 0, "register form: A registers 0..3 are the B registers 0, 2, 1, 3, transposed");
}

/* The finish's groups and the fused splits' walk over them: every split in one group, groups in
 * order, each group's first and last split where the finish starts and ends its sum */
static void test_fin_groups(void)
{
    int bad = 0;
    for (int S = 1; S <= MUSE_FAST_MAX_SPLITS; S++) {
        int G = muse_fast_fin_groups(S), prev = 0;
        bad += G != (S >= 16 ? 4 : S >= 8 ? 2 : 1);
        for (int s = 0; s < S; s++) {
            int g = muse_fast_fin_group_of(S, s);
            bad += g < prev || g > prev + 1 || g >= G;
            bad += s < S * g / G || s >= S * (g + 1) / G;
            bad += muse_fast_fin_first(S, s) != (s == 0 || muse_fast_fin_group_of(S, s - 1) != g);
            bad +=
                muse_fast_fin_last(S, s) != (s == S - 1 || muse_fast_fin_group_of(S, s + 1) != g);
            prev = g;
        }
        bad += prev != G - 1;
    }
    ok(bad == 0, "finish groups: 1, 2 or 4 by splits 1..32, each split in one, first and last");
    ok(muse_fast_fin_group_of(13, 5) == 0 && muse_fast_fin_group_of(13, 6) == 1 &&
           muse_fast_fin_last(13, 5) && muse_fast_fin_first(13, 6),
       "13 splits: groups [0, 6) and [6, 13)");
}

int main(void)
{
    test_lane_states();
    test_tile_header();
    test_lane_elements();
    test_decode();
    test_splits();
    test_magic_div();
    test_tr_narrow();
    test_block_mt();
    test_unrounded_sum();
    test_wg_layout();
    test_wr_fragment();
    test_fin_groups();
    return done_testing();
}
