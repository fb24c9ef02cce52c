/* One 16x16 EXL3 trellis tile (design/EXL3.md "From the packed stream to 16-bit states",
 * "Codebooks"): words, tail-biting states, position <-> element and the codebook decode, as
 * MUSE_HD helpers with no tables, so the CPU reference and every kernel decode alike. */
#ifndef MUSE_EXL3_TILE_H
#define MUSE_EXL3_TILE_H

#include <stdint.h>

#include "base/f16.h"
#include "base/host_device.h"

typedef enum { MUSE_CB_3INST, MUSE_CB_MCG, MUSE_CB_MUL1 } muse_codebook;

#define MUSE_EXL3_TILE     16 /* a tile is 16x16 weights */
#define MUSE_EXL3_MAX_BITS 8

/* Word j of the tile's stream: v[2j] | v[2j+1] << 16 (little-endian uint32). */
MUSE_HD uint32_t muse_exl3_word(const uint16_t *tile, int j)
{
    return (uint32_t)tile[2 * j] | (uint32_t)tile[2 * j + 1] << 16;
}

/* The 16-bit state of position p (0..255): the window of the 256*bits-bit stream (MSB first)
 * ending at bit (p+1)*bits, taken circularly; bits 1..8, so it spans two words. */
MUSE_HD uint32_t muse_exl3_state(const uint16_t *tile, int bits, int p)
{
    int nwords = 8 * bits;
    int start = (p + 1) * bits - 16;
    if (start < 0) start += 256 * bits; /* tail-biting: position 0 wraps to the last symbols */
    int w0 = start >> 5, off = start & 31;
    int w1 = w0 + 1 == nwords ? 0 : w0 + 1;
    uint64_t pair = (uint64_t)muse_exl3_word(tile, w0) << 32 | muse_exl3_word(tile, w1);
    return (uint32_t)(pair >> (48 - off)) & 0xFFFFu;
}

/* Position p of tile element (row, col): the mma.m16n8k16 B-fragment layout, p = 8*lane + j. */
MUSE_HD int muse_exl3_pos(int row, int col)
{
    unsigned r = (unsigned)row, c = (unsigned)col; /* 0..15 */
    unsigned lane = (c & 7u) * 4u + ((r >> 1) & 3u);
    unsigned j = (r & 1u) | ((r >> 3) & 1u) << 1 | (c >> 3) << 2;
    return (int)(lane * 8u + j);
}

/* Row and column of position p (the inverse of muse_exl3_pos). */
MUSE_HD void muse_exl3_elem(int p, int *row, int *col)
{
    int lane = p >> 3, j = p & 7;
    *row = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1);
    *col = lane / 4 + 8 * (j >> 2);
}

/* The halves of x masked into fp16 values of magnitude in [2^-3, 2): their fp32 sum has at
 * most 15 significant bits, so it is exact and the fp16 conversion is the one rounding. */
MUSE_HD uint16_t muse_exl3_half_pair_sum(uint32_t x)
{
    x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
    float sum = muse_f16_to_f32((uint16_t)(x & 0xFFFFu)) + muse_f16_to_f32((uint16_t)(x >> 16));
    return muse_f32_to_f16(sum);
}

/* fp16 bits of the weight a 16-bit state decodes to (codebook a muse_codebook value; 0 for
 * an unknown one). */
MUSE_HD uint16_t muse_exl3_decode(int codebook, uint32_t state)
{
    uint32_t x = state;
    if (codebook == MUSE_CB_3INST) return muse_exl3_half_pair_sum(x * 89226354u + 64248484u);
    if (codebook == MUSE_CB_MCG) return muse_exl3_half_pair_sum(x * 0xCBAC1FEDu);
    if (codebook != MUSE_CB_MUL1) return 0;
    x *= 0x83DCD12Du;
    int32_t s =
        1024 + (int32_t)((x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24));
    /* s*k_inv + k_bias in units of 2^-18: k_inv (fp16 0x1EEE) = 1774, k_bias (0xC931) =
     * -2721792; the integer is below 2^24, so the fp32 value is exact and fp16 rounds once */
    int32_t units = s * 1774 - 2721792;
    return muse_f32_to_f16((float)units * 3.814697265625e-06f); /* * 2^-18, exact */
}

#endif
