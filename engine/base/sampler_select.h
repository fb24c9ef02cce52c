/* The fast GPU sampler's selection (kernels/sample_fast.cu), one copy for the device and for
 * its CPU prototype (t/unit/test_sampler_select.c, which holds it to the host muse_sample):
 * the weight of a logit, the bins and digits of a key, and the sequential form of every step
 * the kernel runs in parallel. Everything is integer or a fixed IEEE float sequence, so the
 * order in which keys are visited can never change a result: the kernel may visit them in
 * any order and still draw the host's token. Needs base/sampler_exact.h first. */
#ifndef MUSE_SAMPLER_SELECT_H
#define MUSE_SAMPLER_SELECT_H

#include <math.h>
#include <stdint.h>

#include "base/host_device.h"
#include "base/sampler_exact.h"

/* Bins of a weight's float bits: the exponent and 5 mantissa bits (as the host sampler's), so
 * a bin fixes key bits 63..50; the other 50 are refined in 5 passes of 10-bit digits. */
#define MUSE_SS_BIN_SHIFT  18
#define MUSE_SS_BIN_BASE   (127u << (23 - MUSE_SS_BIN_SHIFT)) /* the bin of q = 1 */
#define MUSE_SS_BINS       2048                               /* 64 octaves of 32 */
#define MUSE_SS_DIGIT_BITS 10
#define MUSE_SS_DIGITS     (1 << MUSE_SS_DIGIT_BITS)
#define MUSE_SS_PASSES     5 /* 5 * 10 = the 50 bits below a bin */
#define MUSE_SS_FREE_BITS  (32 + MUSE_SS_BIN_SHIFT)

/* q = round(2^S exp((x - max) inv_t)), 0 where below 1/2 or NaN: the host sampler's
 * lane_weights for one logit, the same float operations in the same order (no contraction:
 * C11 here, -fmad=false on the device). */
MUSE_HD float muse_ss_weight(float x, float max, float inv_t, int wb)
{
    const float z_min = 0.0f - (float)(wb + 2) * 0.693147182f;
    const float round_magic = 0x1.8p23f, two23 = 0x1p23f;
    float z = (x - max) * inv_t;
    int finite = z >= z_min; /* false for NaN */
    if (!finite) z = 0;
    float kf = (z * 1.44269502f + round_magic) - round_magic;
    float r = (z - kf * 0.693359375f) - kf * -2.12194440e-4f;
    float p = 1.0f / 5040 * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int k = (int)kf;
    float q = p * muse_sx_bits_float((uint32_t)(k + (127 + wb)) << 23);
    if (q < two23) q = (q + two23) - two23; /* round to an integer */
    float top = (float)((uint64_t)1 << wb);
    if (q > top) q = top;
    return finite ? q : 0.0f;
}

/* The bin of a candidate's weight bits (bits != 0: q >= 1). */
MUSE_HD int muse_ss_bin(uint32_t bits)
{
    return (int)((bits >> MUSE_SS_BIN_SHIFT) - MUSE_SS_BIN_BASE);
}

MUSE_HD int muse_ss_key_bin(uint64_t key)
{
    return muse_ss_bin((uint32_t)(key >> 32));
}

/* Key bits of refining pass p (0: the highest 10 below the bin). */
MUSE_HD int muse_ss_shift(int pass)
{
    return MUSE_SS_FREE_BITS - MUSE_SS_DIGIT_BITS * (pass + 1);
}

MUSE_HD int muse_ss_digit(uint64_t key, int pass)
{
    return (int)((key >> muse_ss_shift(pass)) & (MUSE_SS_DIGITS - 1));
}

/* Whether key agrees with prefix on every bit above pass's digit (the bin's bits included). */
MUSE_HD int muse_ss_in_prefix(uint64_t key, uint64_t prefix, int pass)
{
    int above = muse_ss_shift(pass) + MUSE_SS_DIGIT_BITS;
    return (key >> above) == (prefix >> above);
}

MUSE_HD uint64_t muse_ss_key_weight(uint64_t key)
{
    return (uint64_t)muse_sx_bits_float((uint32_t)(key >> 32));
}

/* The bits of a weight's float below its bin (a key's weight's). */
MUSE_HD uint32_t muse_ss_low(uint32_t bits)
{
    return bits & ((1u << MUSE_SS_BIN_SHIFT) - 1);
}

/* The total weight of n weights of bin b whose muse_ss_low bits add up to low: each is (the
 * bin's leading significand bits, then its own low bits) times the bin's power of two, so the
 * sum is (n * lead + low) times it, exactly (below 2^23 every weight, an integer, has that many
 * low bits clear). Lets a kernel add 32-bit parts where a 64-bit add in shared memory is a
 * compare-and-swap loop. No overflow wherever the sum fits 64 bits, as any part of a row's
 * total does (vocab * 2^S <= 2^62): s is the sum over the bin's power of two. */
MUSE_HD uint64_t muse_ss_bin_weight(int bin, uint64_t n, uint64_t low)
{
    const int m = 23 - MUSE_SS_BIN_SHIFT;           /* significand bits in a bin's number */
    uint32_t hi = (uint32_t)bin + MUSE_SS_BIN_BASE; /* the exponent, then those m bits */
    int scale = (int)(hi >> m) - 150;               /* the bin's power of two: 2^(e - 127 - 23) */
    uint64_t lead = (uint64_t)((hi & ((1u << m) - 1)) | (1u << m)) << MUSE_SS_BIN_SHIFT;
    uint64_t s = n * lead + low;
    return scale >= 0 ? s << scale : s >> -scale;
}

/* Where the running total in key-descending order first passes a target: the key, and the
 * count and weight of the keys above it. */
typedef struct {
    uint64_t key, count_before, weight_before;
} muse_ss_crossing;

/* The slot of n (count, weight) slots, scanned from the top, where before + its share first
 * exceeds target; adds the slots above it to *c. The kernel finds the same slot by a parallel
 * suffix scan. -1 when no slot does (the caller's target is at least the whole total). */
MUSE_HD int muse_ss_find_slot(const uint32_t *count, const uint64_t *weight, int n, uint64_t target,
                              int by_count, muse_ss_crossing *c)
{
    for (int b = n - 1; b >= 0; b--) {
        uint64_t before = by_count ? c->count_before : c->weight_before;
        uint64_t add = by_count ? count[b] : weight[b];
        if (before + add > target) return b;
        c->count_before += count[b];
        c->weight_before += weight[b];
    }
    return -1;
}

/* The one key of keys[0..n) that agrees with prefix above pass's digit and has digit d there. */
MUSE_HD uint64_t muse_ss_only_key(const uint64_t *keys, uint64_t n, uint64_t prefix, int pass,
                                  int d)
{
    for (uint64_t i = 0; i < n; i++)
        if (muse_ss_in_prefix(keys[i], prefix, pass) && muse_ss_digit(keys[i], pass) == d)
            return keys[i];
    return 0;
}

/* The sequential crossing over a row's bin histograms and its keys laid out by bin, highest
 * bin first (a bin's keys in any order; bin b starts after the counts of the bins above it):
 * the bin, then up to 5 digit passes over its keys, stopping where one key is left. digit_count,
 * digit_weight: scratch of MUSE_SS_DIGITS. Returns 0 when target is not below the total. */
MUSE_HD int muse_ss_crossing_seq(const uint32_t *bin_count, const uint64_t *bin_weight,
                                 const uint64_t *keys, uint64_t target, int by_count,
                                 uint32_t *digit_count, uint64_t *digit_weight,
                                 muse_ss_crossing *out)
{
    muse_ss_crossing c = {0, 0, 0};
    int b = muse_ss_find_slot(bin_count, bin_weight, MUSE_SS_BINS, target, by_count, &c);
    if (b < 0) return 0;
    const uint64_t *seg = keys + c.count_before; /* the bins above hold count_before keys */
    uint64_t n = bin_count[b];
    uint64_t prefix = (uint64_t)(b + MUSE_SS_BIN_BASE) << MUSE_SS_FREE_BITS;
    if (n == 1) {
        c.key = seg[0];
        *out = c;
        return 1;
    }
    for (int pass = 0; pass < MUSE_SS_PASSES; pass++) {
        for (int d = 0; d < MUSE_SS_DIGITS; d++) digit_count[d] = 0, digit_weight[d] = 0;
        for (uint64_t i = 0; i < n; i++) {
            if (!muse_ss_in_prefix(seg[i], prefix, pass)) continue;
            int d = muse_ss_digit(seg[i], pass);
            digit_count[d]++;
            digit_weight[d] += muse_ss_key_weight(seg[i]);
        }
        int d = muse_ss_find_slot(digit_count, digit_weight, MUSE_SS_DIGITS, target, by_count, &c);
        if (d < 0) return 0;
        if (digit_count[d] == 1) {
            c.key = muse_ss_only_key(seg, n, prefix, pass, d);
            *out = c;
            return 1;
        }
        prefix |= (uint64_t)d << muse_ss_shift(pass);
    }
    c.key = prefix; /* every bit fixed: the one key of the last digit */
    *out = c;
    return 1;
}

/* Total q of the keys >= cut (the min_p cut-off): the bins above cut's, then its own keys. */
MUSE_HD uint64_t muse_ss_weight_from_seq(const uint32_t *bin_count, const uint64_t *bin_weight,
                                         const uint64_t *keys, uint64_t cut)
{
    int cb = muse_ss_key_bin(cut);
    uint64_t total = 0, start = 0;
    for (int b = MUSE_SS_BINS - 1; b > cb; b--) total += bin_weight[b], start += bin_count[b];
    if (cb < 0) return total;
    for (uint64_t i = 0; i < bin_count[cb]; i++)
        if (keys[start + i] >= cut) total += muse_ss_key_weight(keys[start + i]);
    return total;
}

#endif
