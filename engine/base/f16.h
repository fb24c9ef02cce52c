/* fp16 and bf16 to and from fp32, exact IEEE, round to nearest even (NaN stays NaN, quiet):
 * one copy for the CPU backend and the kernels (kernels/common.cuh), so both round alike. */
#ifndef MUSE_F16_H
#define MUSE_F16_H

#include <stdint.h>
#include <string.h>

#include "base/host_device.h"

MUSE_HD float muse_bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
MUSE_HD uint32_t muse_f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

MUSE_HD float muse_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0x1F) return muse_bits_to_f32(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        /* subnormal: mant * 2^-24, exact in fp32 */
        float v = (float)mant * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return muse_bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

MUSE_HD uint16_t muse_f32_to_f16(float f)
{
    uint32_t x = muse_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {
        /* result is subnormal or zero: scale so the integer part is the fp16 mantissa */
        if (ax < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14 + (112 - (e-127)) ... m >> (shift) gives 2^-24 units */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* The value an fp16 store would keep. */
MUSE_HD float muse_round_f16(float f)
{
    return muse_f16_to_f32(muse_f32_to_f16(f));
}

MUSE_HD float muse_bf16_to_f32(uint16_t b)
{
    return muse_bits_to_f32((uint32_t)b << 16);
}
MUSE_HD uint16_t muse_f32_to_bf16(float f)
{
    uint32_t x = muse_f32_to_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif
