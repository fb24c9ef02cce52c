/* pack/exl3_tile.h, the host/device tile helpers: the spec's state test vectors, codebook
 * check values and RMS, position <-> element, and states and decodes against independent
 * slow references (bit by bit; the codebook formulas in double). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "pack/exl3_tile.h"
#include "tap.h"

static uint64_t rng_state = 0x5EED;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const char *const cb_names[3] = {"3INST", "MCG", "MUL1"};

/* bit i of the tile's 256*bits-bit stream, MSB first within each little-endian word */
static int stream_bit(const uint16_t *tile, int i)
{
    int j = i / 32, off = i % 32;
    uint32_t word = (uint32_t)tile[2 * j] + (uint32_t)tile[2 * j + 1] * 65536u;
    return (int)((word >> (31 - off)) & 1u);
}

static uint32_t slow_state(const uint16_t *tile, int bits, int p)
{
    int total = 256 * bits;
    uint32_t s = 0;
    for (int i = 0; i < 16; i++)
        s = s * 2 + (uint32_t)stream_bit(tile, ((p + 1) * bits - 16 + i + total) % total);
    return s;
}

/* The spec's codebooks in double: the sums are exact there, then one fp16 rounding. */
static double slow_half(uint32_t h)
{
    int sign = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24); /* no inf/NaN after the mask */
    return sign ? -v : v;
}
static uint16_t slow_decode(int cb, uint32_t x)
{
    double v;
    if (cb == MUSE_CB_MUL1) {
        x *= 0x83DCD12Du;
        double s = 1024 + (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24);
        v = s * slow_half(0x1EEE) + slow_half(0xC931);
    } else {
        x = cb == MUSE_CB_3INST ? x * 89226354u + 64248484u : x * 0xCBAC1FEDu;
        x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
        v = slow_half(x & 0xFFFF) + slow_half(x >> 16);
    }
    return muse_f32_to_f16((float)v); /* the exact double is an fp32 value too */
}

static void test_words_and_vectors(void)
{
    uint16_t t[4] = {0x4567, 0x0123, 0xCDEF, 0x89AB};
    is_int(muse_exl3_word(t, 0), 0x01234567u, "word 0 = v[0] | v[1] << 16");
    is_int(muse_exl3_word(t, 1), 0x89ABCDEFu, "word 1 = v[2] | v[3] << 16");
    struct {
        int bits;
        uint16_t states[4];
    } vec[] = {
        {4, {0xDEF0, 0xEF01, 0xF012, 0x0123}},
        {3, {0xCBB8, 0x5DC1, 0xEE0A, 0x7053}},
        {2, {0x6C6C, 0xB1B1, 0xC6C6, 0x1B1B}},
    };
    for (int v = 0; v < 3; v++) {
        int bits = vec[v].bits;
        uint16_t tile[16 * 8] = {0};
        /* symbols p mod 2^bits, packed MSB first into the words */
        for (int p = 0; p < 256; p++)
            for (int b = 0; b < bits; b++) {
                int i = p * bits + b, j = i / 32, off = i % 32;
                uint32_t bit = ((uint32_t)(p % (1 << bits)) >> (bits - 1 - b)) & 1u;
                tile[2 * j + (off < 16)] |= (uint16_t)(bit << (15 - off % 16));
            }
        int good = 1;
        for (int p = 0; p < 4; p++) good &= muse_exl3_state(tile, bits, p) == vec[v].states[p];
        ok(good, "bits %d, symbols p mod %d: states of p=0..3 are %04X %04X %04X %04X", bits,
           1 << bits, muse_exl3_state(tile, bits, 0), muse_exl3_state(tile, bits, 1),
           muse_exl3_state(tile, bits, 2), muse_exl3_state(tile, bits, 3));
    }
}

static void test_states_random(void)
{
    for (int bits = 1; bits <= 8; bits++) {
        int good = 1;
        for (int rep = 0; rep < 50; rep++) {
            uint16_t tile[16 * 8];
            for (int i = 0; i < 16 * bits; i++) tile[i] = (uint16_t)rng_next();
            for (int p = 0; p < 256; p++)
                good &= muse_exl3_state(tile, bits, p) == slow_state(tile, bits, p);
        }
        ok(good, "bits %d: every state of 50 random tiles equals the bit-by-bit reader", bits);
    }
}

static void test_positions(void)
{
    int seen[256] = {0}, good = 1;
    for (int p = 0; p < 256; p++) {
        int r = -1, c = -1;
        muse_exl3_elem(p, &r, &c);
        good &= r >= 0 && r < 16 && c >= 0 && c < 16;
        if (r >= 0 && r < 16 && c >= 0 && c < 16) seen[r * 16 + c]++;
        good &= muse_exl3_pos(r, c) == p;
        /* the spec's formula, written out */
        int lane = p / 8, j = p % 8;
        good &= r == 2 * (lane % 4) + j % 2 + 8 * (j / 2 % 2) && c == lane / 4 + 8 * (j / 4);
    }
    for (int i = 0; i < 256; i++) good &= seen[i] == 1;
    ok(good, "elem(p) is the spec's element, a bijection, and pos(elem(p)) = p for all 256");
    good = 1;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            int rr, cc;
            muse_exl3_elem(muse_exl3_pos(r, c), &rr, &cc);
            good &= rr == r && cc == c;
        }
    ok(good, "elem(pos(r, c)) = (r, c) for all 256 elements");
}

/* The spec's check values and RMS are test_exl3.c's (through exl3.c, which decodes with this
 * header); here every state against an independent reading of the formula. */
static void test_codebooks(void)
{
    for (int cb = 0; cb < 3; cb++) {
        int same = 1;
        for (uint32_t s = 0; s < 65536; s++) same &= muse_exl3_decode(cb, s) == slow_decode(cb, s);
        ok(same, "%s: all 65536 decodes equal the spec's formula in double", cb_names[cb]);
    }
    is_int(muse_exl3_decode(7, 0), 0, "an unknown codebook decodes to 0");
}

int main(void)
{
    test_words_and_vectors();
    test_states_random();
    test_positions();
    test_codebooks();
    return done_testing();
}
