/* linear_fast.h: the index and bit logic of the fast EXL3 product (kernels/linear_fast.cu) as
 * MUSE_HD helpers, so t/unit/test_linear_fast.c checks on the CPU what the kernel runs: the k
 * split and its divisions as multiplies, the block widths, the 8 trellis states a lane of a warp
 * pulls out of its tile, the integer stage of each codebook's decode and the fp16 stage the
 * device does with one __hadd2 / __hfma2. */
#ifndef MUSE_K_LINEAR_FAST_H
#define MUSE_K_LINEAR_FAST_H

#include <stdint.h>

#include "base/f16.h"
#include "base/host_device.h"

/* A fixed SM count (never queried: the split must not depend on the GPU) and the blocks the
 * split aims at for one linear at one m-group: 3 blocks an SM of an H200 (on it the whole
 * one-GPU shape decodes 0.2-0.4 ms a round faster than at 2, its prompt 1.5% slower). The MoE's
 * experts aim at MUSE_FAST_GROUP_TARGET over the K pairs of a token (the engine's). */
#define MUSE_FAST_SMS          132
#define MUSE_FAST_SPLIT_TARGET (3 * MUSE_FAST_SMS)
#define MUSE_FAST_GROUP_TARGET (4 * MUSE_FAST_SMS)
#define MUSE_FAST_BLOCK_COLS   128 /* columns a product block covers: 4 warps x 2 n-tiles */
#define MUSE_FAST_MIN_SPLIT_KT 8   /* k-tiles a split covers at least (two pipeline stages) */
#define MUSE_FAST_MAX_SPLITS   32
#define MUSE_FAST_MT_MAX       8 /* m-tiles a block holds at most (128 rows) */
/* ... a plain product's block: 4 took 1-33% less time than 8 at 64 to 1024 rows of 6144x4096
 * (H200, 2026-12-02, exl3-fast-check --many), the 234 registers of 8 leaving 2 blocks an SM */
#define MUSE_FAST_MT_PLAIN     4

enum { MUSE_FAST_CB_3INST = 0, MUSE_FAST_CB_MCG = 1, MUSE_FAST_CB_MUL1 = 2 };

/* The number of k splits of a k x n linear: a function of (k, n) and the target only, never of
 * the row count, so every row of every batch sums its k range in the same pieces. */
MUSE_HD int muse_fast_splits(int64_t k, int64_t n, int target)
{
    int64_t kt = k / 16, nb = (n + MUSE_FAST_BLOCK_COLS - 1) / MUSE_FAST_BLOCK_COLS;
    int64_t s = nb > 0 ? (target + nb - 1) / nb : 1;
    int64_t smax = kt / MUSE_FAST_MIN_SPLIT_KT;
    if (smax > MUSE_FAST_MAX_SPLITS) smax = MUSE_FAST_MAX_SPLITS;
    if (s > smax) s = smax;
    return s < 1 ? 1 : (int)s;
}

/* Whether a launch of the transposed form (blocks of at most 8 rows: a decode step's) takes
 * 64-column blocks, wide its 128-column blocks, rows its rows (grouped: the MoE's pairs, 8 for
 * one token of 8 experts): policy 0 never; 2 below 16 an SM (the other forms' rule); 1 never at
 * one row or grouped, else as 2. Only which blocks hold which columns: the bits are the same.
 * H200, 2026-12-04, the whole one-GPU shape (a round's p50): one token 15.30 ms with every
 * launch at 128 columns (0), 15.61 at 64 (2), 15.98 and 16.9 with the two mixed (plain
 * launches 128, the experts 64; or by waves); 2, 4 and 8 tokens 0.2-2.3% faster at 2 than at
 * 0 (their experts then in groups of 16 rows: not this form). */
MUSE_HD int muse_fast_tr_narrow(long wide, long rows, int grouped, int policy)
{
    if (policy == 0 || (policy == 1 && (rows == 1 || grouped))) return 0;
    return wide < 16L * MUSE_FAST_SMS;
}

/* The fewest m-tiles (1, 2, 4, 8) that hold rows rows, at most `most`. */
MUSE_HD int muse_fast_fit_mt(int64_t rows, int most)
{
    int mt = 1;
    while (mt < most && 16 * mt < rows) mt *= 2;
    return mt;
}

/* The m-tiles of a plain product's block at rows rows: 1 up to 16 rows, else the fewest that
 * hold them up to MUSE_FAST_MT_PLAIN. forced (MUSE_FAST_MANY_MT: 1, 2, 4 or 8; 0 none)
 * replaces that from 17 rows on. Fewer m-tiles a block: fewer accumulator registers and more
 * blocks an SM, each weight decoded once for every block's rows; the bits are the same. */
MUSE_HD int muse_fast_block_mt(int64_t rows, int forced)
{
    if (rows <= 16) return 1;
    if (forced == 1 || forced == 2 || forced == 4 || forced == 8) return forced;
    return muse_fast_fit_mt(rows, MUSE_FAST_MT_PLAIN);
}

/* The rows of a group of the MoE's grouped product at a round of rows rows, k_per_row experts a
 * row among experts: blocks sized for the rows an expert gets on average (ceil(rows * k / E)),
 * up to MUSE_FAST_MT_MAX m-tiles; 16 up to 16 rows a round; forced as muse_fast_block_mt. */
MUSE_HD int muse_fast_group_rows(int64_t rows, int64_t k_per_row, int64_t experts, int forced)
{
    if (rows <= 16) return 16;
    if (forced == 1 || forced == 2 || forced == 4 || forced == 8) return 16 * forced;
    int64_t e = experts > 0 ? (rows * k_per_row + experts - 1) / experts : rows;
    return 16 * muse_fast_fit_mt(e, MUSE_FAST_MT_MAX);
}

/* First k-tile of split s of kt k-tiles (split s covers [begin(s), begin(s + 1))). */
MUSE_HD int64_t muse_fast_split_begin(int64_t kt, int splits, int s)
{
    return kt * s / splits;
}

/* n / d for 0 <= n < 2^31 and 1 <= d < 2^31 as (n m) >> s, a multiply where a division by a
 * divisor known only at run time takes a subroutine on the GPU: with l = ceil(log2 d), s = 31 +
 * l and m = ceil(2^s / d) < 2^32, m d - 2^s < d <= 2^l, so n (m d - 2^s) < 2^s and the floor is
 * n / d's (Granlund and Montgomery). The host sets it once a launch. */
typedef struct {
    uint32_t m;
    int s;
} muse_fast_div;

MUSE_HD muse_fast_div muse_fast_magic(uint32_t d)
{
    int l = 0;
    while (l < 31 && ((uint32_t)1 << l) < d) l++;
    muse_fast_div v;
    v.s = 31 + l;
    v.m = (uint32_t)((((uint64_t)1 << v.s) + d - 1) / d);
    return v;
}

MUSE_HD uint32_t muse_fast_divq(uint32_t n, muse_fast_div v)
{
    return (uint32_t)((uint64_t)n * v.m >> v.s);
}

/* The top 32 bits of (hi:lo) << s, s in 0..31 (__funnelshift_l on the device). */
MUSE_HD uint32_t muse_fast_fshl(uint32_t lo, uint32_t hi, int s)
{
#ifdef __CUDA_ARCH__
    return __funnelshift_l(lo, hi, (unsigned)s);
#else
    return s ? (hi << s) | (lo >> (32 - s)) : hi;
#endif
}

/* Lane l decodes positions 8l..8l+7, whose states are the 16-bit windows ending at bits
 * (8l + j + 1) * bits: all inside the 7 * bits + 16 bits from first_bit (circular). */
MUSE_HD int muse_fast_first_bit(int bits, int lane)
{
    int s = (8 * lane + 1) * bits - 16;
    return s < 0 ? s + 256 * bits : s;
}

/* The largest first_bit % 32 over the lanes: with it, how many words a lane reads
 * (muse_fast_nwords, 2 or 3) and how many 32-bit window words it shifts into place. */
MUSE_HD int muse_fast_max_shift(int bits)
{
    int m = 0;
    for (int l = 0; l < 32; l++) {
        int s = muse_fast_first_bit(bits, l) & 31;
        m = s > m ? s : m;
    }
    return m;
}
MUSE_HD int muse_fast_nwords(int bits)
{
    return (muse_fast_max_shift(bits) + 7 * bits + 16 + 31) / 32;
}
MUSE_HD int muse_fast_nwin(int bits)
{
    return (7 * bits + 16 + 31) / 32;
}

/* The 16 bits at window bits [off, off + 16) (window bit 0 = the MSB of win[0]). */
MUSE_HD uint32_t muse_fast_window_state(const uint32_t win[3], int off)
{
    int wi = off >> 5, o = off & 31;
    if (o <= 16) return (win[wi] >> (16 - o)) & 0xFFFFu;
    return muse_fast_fshl(win[wi + 1], win[wi], o - 16) & 0xFFFFu;
}

/* Where lane's words sit in a tile of 8 * bits words (lane-constant, set once a kernel): the
 * indices of the nwords words it reads (wrapping around the tile) and the shift that aligns
 * its first state. */
MUSE_HD void muse_fast_lane_words(int bits, int nwords, int lane, int widx[3], int *shift)
{
    int first = muse_fast_first_bit(bits, lane), nw = 8 * bits, w0 = first >> 5;
    for (int i = 0; i < 3; i++) widx[i] = i < nwords ? (w0 + i >= nw ? w0 + i - nw : w0 + i) : 0;
    *shift = first & 31;
}

/* __byte_perm(a, b, sel) (PRMT): result byte i is byte (sel >> 4 i) & 7 of b:a (0-3 from a,
 * 4-7 from b); the sign-replicate mode is not used. */
MUSE_HD uint32_t muse_fast_prmt(uint32_t a, uint32_t b, uint32_t sel)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, sel);
#else
    uint64_t ba = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)(ba >> 8 * ((sel >> 4 * i) & 7) & 0xFFu) << 8 * i;
    return r;
#endif
}

/* The 8 states of a lane from the tile's words at its muse_fast_lane_words places. At 2 bits
 * state j is (W >> (16 - 2 j)) & 0xFFFF of one window word W: from W and W shifted left by 2,
 * 4 and 6 (multiplies, off the ALU pipe) each state is one shift or one byte permute, where a
 * shift and a mask would be two ALU instructions. */
MUSE_HD void muse_fast_lane_states_at(const uint32_t *words, const int widx[3], int s, int bits,
                                      int nwords, int nwin, uint32_t st[8])
{
    uint32_t w[4] = {0, 0, 0, 0}, win[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++)
        if (i < nwords) w[i] = words[widx[i]];
    /* a word not read holds no bit the lane needs (nwords covers the widest lane) */
    for (int i = 0; i < 3; i++)
        if (i < nwin) win[i] = muse_fast_fshl(w[i + 1], w[i], s);
    if (bits == 2) {
        uint32_t W = win[0], W2 = W * 4u, W4 = W * 16u, W6 = W * 64u;
        st[0] = W >> 16; /* the permutes below: ptxas turns (W << 2) >> 16 back into two ops */
        st[1] = muse_fast_prmt(W2, 0, 0x4432);
        st[2] = muse_fast_prmt(W4, 0, 0x4432);
        st[3] = muse_fast_prmt(W6, 0, 0x4432);
        st[4] = muse_fast_prmt(W, 0, 0x4421);
        st[5] = muse_fast_prmt(W2, 0, 0x4421);
        st[6] = muse_fast_prmt(W4, 0, 0x4421);
        st[7] = muse_fast_prmt(W6, 0, 0x4421);
        return;
    }
    for (int j = 0; j < 8; j++) st[j] = muse_fast_window_state(win, j * bits);
}

/* The 8 states of lane's positions from the tile's 8 * bits words (word j = v[2j] | v[2j+1] <<
 * 16 of the stored uint16 v, the stream MSB first). nwords/nwin: muse_fast_nwords/_nwin(bits),
 * passed in so the kernel's compile-time values are the ones used. */
MUSE_HD void muse_fast_lane_states(const uint32_t *words, int bits, int nwords, int nwin, int lane,
                                   uint32_t st[8])
{
    int widx[3], s;
    muse_fast_lane_words(bits, nwords, lane, widx, &s);
    muse_fast_lane_states_at(words, widx, s, bits, nwords, nwin, st);
}

/* Row and column within the tile of lane's j-th state (the mma B fragment layout). */
MUSE_HD void muse_fast_lane_element(int lane, int j, int *r, int *c)
{
    *r = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1);
    *c = lane / 4 + 8 * (j >> 2);
}

/* The wgmma form's shared memory (linear_fast_wg.cu): a stage's A rows and decoded B columns
 * (4 k-tiles, 64 k) as K-major rows of 128 bytes in the 128-byte swizzle, the 16-byte chunk c
 * (k 8c .. 8c + 7) of row r at r * 128 + (c ^ r % 8) * 16, so the 8 rows a tensor core reads at
 * once sit in 8 bank groups (unswizzled they shared one: H200 ncu, shared memory 83% busy).
 * Byte offset of row r's chunk c: */
MUSE_HD int muse_fast_wg_off(int r, int c)
{
    return r * 128 + ((c ^ (r % 8)) * 16);
}

/* Byte offset of lane's B fragment word q (muse_fast_lane_element's states 2q, 2q + 1: k and
 * k + 1 of one column) of tile t of the block's 8 (columns 16 t ..), k-tile kk of the stage:
 * the two fp16 in place. */
MUSE_HD int muse_fast_wg_b_off(int t, int q, int lane, int kk)
{
    return muse_fast_wg_off(16 * t + lane / 4 + 8 * (q >> 1), 2 * kk + (q & 1)) + (lane % 4) * 4;
}

/* The register form (linear_fast_wr.cu) computes t^T = Wq^T a^T on wgmma: A register a of a
 * lane (the m16n8k16 A fragment of its warp's 16 rows: row lane / 4 + 8 (a & 1), k 2 (lane % 4)
 * + 8 (a >> 1) and the next) holds Wq^T there, which is the lane's B fragment register
 * muse_fast_wr_breg(a) of the same tile (muse_fast_lane_element's states 2q, 2q + 1). */
MUSE_HD int muse_fast_wr_breg(int a)
{
    return (a & 1) << 1 | a >> 1;
}

/* The finish sums a column's S split partials in G groups (double): group g adds the partials
 * of splits [g S / G, (g + 1) S / G) in split order from 0, then the groups' sums are added in
 * group order. A fixed order that depends on the shape alone; the register form's fused splits
 * (linear_fast_wr.cu) follow it. */
MUSE_HD int muse_fast_fin_groups(int splits)
{
    return splits >= 16 ? 4 : splits >= 8 ? 2 : 1;
}
/* The group of split s of S, and whether s is its group's first / last split. */
MUSE_HD int muse_fast_fin_group_of(int splits, int s)
{
    int G = muse_fast_fin_groups(splits), g = 0;
    while (g + 1 < G && s >= splits * (g + 1) / G) g++;
    return g;
}
MUSE_HD int muse_fast_fin_first(int splits, int s)
{
    int G = muse_fast_fin_groups(splits), g = muse_fast_fin_group_of(splits, s);
    return s == splits * g / G;
}
MUSE_HD int muse_fast_fin_last(int splits, int s)
{
    int G = muse_fast_fin_groups(splits), g = muse_fast_fin_group_of(splits, s);
    return s == splits * (g + 1) / G - 1;
}

/* The integer stage of the decode. 3INST/MCG: the word whose two fp16 halves add to the
 * weight. MUL1: the fp16 bits of s = 1024 + byte sum, an integer in [1024, 2044], which is the
 * fp16 0x6400 + (s - 1024): so one dp4a with 0x6400 as its addend gives the bits directly. */
MUSE_HD uint32_t muse_fast_int_stage(int cb, uint32_t state)
{
    if (cb == MUSE_FAST_CB_MUL1) {
        uint32_t x = state * 0x83DCD12Du;
#ifdef __CUDA_ARCH__
        return __dp4a(x, 0x01010101u, 0x6400u);
#else
        return 0x6400u + (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
#endif
    }
    uint32_t x = cb == MUSE_FAST_CB_MCG ? state * 0xCBAC1FEDu : state * 89226354u + 64248484u;
#ifdef __CUDA_ARCH__
    uint32_t r; /* (x & mask) ^ bits in one LOP3 (table 0x6A), where ptxas emits two */
    asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(r) : "r"(x), "n"(0x8FFF8FFF), "n"(0x3B603B60));
    return r;
#else
    return (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
#endif
}

/* The fp16 stage as the device computes it (one IEEE fp16 rounding: __hadd2 of the halves,
 * __hfma2(s, k_inv, k_bias)), emulated exactly on the host: the fp32 sum of two fp16 is exact
 * here, and s * k_inv + k_bias is exact in double. Returns fp16 bits. */
MUSE_HD uint16_t muse_fast_fp_stage_host(int cb, uint32_t v)
{
    if (cb == MUSE_FAST_CB_MUL1) {
        double s = (double)muse_f16_to_f32((uint16_t)v);
        double r = s * (double)muse_f16_to_f32(0x1EEE) + (double)muse_f16_to_f32(0xC931);
        return muse_f32_to_f16((float)r);
    }
    float lo = muse_f16_to_f32((uint16_t)(v & 0xFFFFu)), hi = muse_f16_to_f32((uint16_t)(v >> 16));
    return muse_f32_to_f16(lo + hi);
}

#endif
