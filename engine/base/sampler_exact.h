/* The sampler's exact integer steps, one copy for the host sampler (engine/text/sampler.c,
 * C11) and the GPU's (kernels/sample.cu, CUDA C++), so both draw the same token from the same
 * weights: the counter-based generator, 64 x 64 -> 128-bit products shifted down, ceil(f * w),
 * the min_p cut-off and the candidate keys. Header-only; nothing here rounds differently on
 * the two sides (integer operations, and float/double steps that are exact or single). */
#ifndef MUSE_SAMPLER_EXACT_H
#define MUSE_SAMPLER_EXACT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/host_device.h"

/* The SplitMix64 finalizer. */
MUSE_HD uint64_t muse_sx_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* muse_rand_bits (sampler.h): the finalizer chained over seed, position and stream. */
MUSE_HD uint64_t muse_sx_rand_bits(uint64_t seed, uint64_t position, uint64_t stream)
{
    const uint64_t golden = 0x9e3779b97f4a7c15ull; /* odd: multiplying by it is a bijection */
    uint64_t h = muse_sx_mix(seed + golden);
    h = muse_sx_mix(h + position * golden + 0x6a09e667f3bcc909ull);
    return muse_sx_mix(h + stream * golden + 0xbb67ae8584caa73bull);
}

/* The exact 128-bit product a * b as hi:lo (the device has an instruction for the high half). */
MUSE_HD void muse_sx_mul_u64(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo)
{
#ifdef __CUDA_ARCH__
    *hi = __umul64hi(a, b);
    *lo = a * b;
#else
    uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    *lo = (mid << 32) | (p00 & 0xffffffffu);
    *hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

/* floor(a * b / 2^shift), or the ceiling when round_up; shift in [1, 127]; result < 2^64. */
MUSE_HD uint64_t muse_sx_mul_shift(uint64_t a, uint64_t b, int shift, int round_up)
{
    uint64_t hi, lo, q, rest;
    muse_sx_mul_u64(a, b, &hi, &lo);
    if (shift < 64) {
        q = (lo >> shift) | (hi << (64 - shift));
        rest = lo & ((1ull << shift) - 1);
    } else {
        q = hi >> (shift - 64);
        rest = lo | (shift > 64 ? hi & ((1ull << (shift - 64)) - 1) : 0);
    }
    return q + (round_up && rest != 0);
}

MUSE_HD uint32_t muse_sx_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

MUSE_HD float muse_sx_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ceil(f * w) exactly, for a float f in (0, 1): f's 24-bit mantissa times w, shifted. */
MUSE_HD uint64_t muse_sx_ceil_float_times(float f, uint64_t w)
{
    int exponent;
    float mant = frexpf(f, &exponent);             /* f = mant * 2^exponent, mant in [0.5, 1) */
    uint64_t m24 = (uint64_t)(mant * 16777216.0f); /* exact: a power of two */
    int shift = 24 - exponent;
    if (shift > 127) return 1; /* f * w < 1 but positive */
    return muse_sx_mul_shift(m24, w, shift, 1);
}

/* The key cut-off for min_p: weights q >= ceil(min_p * 2^S), never above the top weight. */
MUSE_HD uint64_t muse_sx_min_p_cut(float min_p, int weight_bits)
{
    double top = (double)((uint64_t)1 << weight_bits);
    double least = ceil((double)min_p * top); /* exact: a float times a power of two */
    if (least > top) least = top;
    float f = (float)least;
    if ((double)f < least) f = nextafterf(f, INFINITY);
    return (uint64_t)muse_sx_float_bits(f) << 32;
}

/* A candidate's key: (float bits of its weight q) << 32 | ~id, so keys in descending order
 * are weights descending, ties to the lower id, and every key is unique. */
MUSE_HD uint64_t muse_sx_key(uint32_t weight_bits_of_float, int64_t id)
{
    return ((uint64_t)weight_bits_of_float << 32) | (0xffffffffu - (uint32_t)id);
}

MUSE_HD int64_t muse_sx_key_id(uint64_t key)
{
    return (int64_t)(0xffffffffu - (uint32_t)key);
}

#endif
