/* linear_fast: the fast EXL3 product y = x W (linear_fast.cuh). Step 1 and 3 (prepare, finish)
 * are the exact path's math (linear_fast_ends.cu); step 2 here: t = a Wq on tensor cores by
 * mma.sync, or for blocks of 64 rows and more by wgmma (linear_fast_wg.cu; linear_fast_ws.cu
 * with the warps specialized), the same bits.
 * A block is 4 warps x NTW n-tiles (128 or 64 columns) x MT m-tiles (16 rows each; rows >= R
 * read as zero and are never written) x one k split. The trellis and the A rows of KC k-tiles
 * a stage go to shared memory by cp.async (NS stages in flight: FB_STAGES, a decode step's 2 of
 * 16 k-tiles, f_dec_variant); each lane decodes its 8 states of a tile (linear_fast.h) in
 * registers straight into the mma B fragment and applies it to every m-tile of the block (a
 * decode step of at most 8 rows: TR, the fragment as mma's A operand, the rows as B).
 * Partials [split][R][n] fp32, added in split order by the finish.
 * Batch invariance: an output element is the mma chain over its split's k-tiles in ascending
 * order from its own A row and B column; MT, NTW, KC, TR, the m-group and R change which rows and
 * columns share a block or a stage, never that chain, and the split is a function of (k, n)
 * (muse_fast_splits). Built without -fmad=false (mk/fast.mk): this file's only floating-point
 * arithmetic is the mma and explicit __hadd2 / __hfma2 intrinsics, which no contraction flag
 * changes. */
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "linear_fast.h"
#include "linear_fast_ends.cuh"
#include "linear_fast_prod.cuh"
#include "mma.cuh"
#include "pdl.cuh"

#define FB_WARPS 4
/* n-tiles a warp, NTW: 2 (a block of 128 columns), or 1 (64 columns: twice the blocks where a
 * launch would leave SMs idle; a column's chain is the same either way) */
#define FB_STAGES 3
/* m-tiles a block MT: 1 up to 16 rows, else 2, 4 or 8 (muse_fast_block_mt). k-tiles a
 * pipeline stage, KC: 8 at 1 and 2 m-tiles (half the stage's loads, barrier and waits a
 * k-tile), 4 at 4 and 8 (three stages of 128 rows stay in shared memory 3 blocks an SM); 16
 * at one m-tile and 2 bits (f_dec_variant) */

/* step 2: grid (sum over the launch's linears of nblk * splits * mgroups), 128 threads; MB:
 * the blocks an SM its registers are capped for (0: none, the PTX of __launch_bounds__(128)) */
template <int CB, int BITS, int MT, int NTW, int KC, int MB, int NS = FB_STAGES, int TR = 0>
__global__ void __launch_bounds__(128, MB) k_fast_product(fast_prod p)
{
    static_assert(!TR || MT == 1, "the transposed form is one m-tile's");
    static_assert(!TR || KC % 2 == 0, "the transposed form loads two k-tiles' rows at once");
    constexpr int FB_NT = FB_WARPS * NTW; /* n-tiles a block */
    constexpr int FB_KC = KC;
    constexpr int FB_AROW = KC * 16 + 8; /* halves a staged A row: padded, ldmatrix conflict-free */
    constexpr int A_ROWS = TR ? 8 : MT * 16; /* rows staged: TR, a block of at most 8 rows */
    extern __shared__ __align__(16) unsigned char f_sm[];
    constexpr int A_HALVES = A_ROWS * FB_AROW;
    constexpr int B_WORDS = FB_KC * FB_NT * 8 * BITS;
    constexpr int STAGE_BYTES = A_HALVES * 2 + B_WORDS * 4;
    K_PDL_NEXT();
    int li, mg, sp, nb;
    f_place(p, blockIdx.x, li, mg, sp, nb);
    const fast_lin &L = p.l[li];
    int64_t ntiles = L.n / 16;
    int64_t kt0 = f_split_at(L, sp), kt1 = f_split_at(L, sp + 1);
    long R = p.R, m0 = (long)mg * MT * 16, rend = R; /* R: the partials' row count */
    const uint16_t *trellis = L.trellis;
    int64_t tiles_ld = L.tiles_ld;
    bool aligned = L.aligned;
    if (L.descs && !f_group_take(p, L, mg, ntiles, trellis, tiles_ld, aligned, m0, rend)) return;
    int64_t tn0 = (int64_t)nb * FB_NT;
    int th = threadIdx.x, warp = th / 32, lane = th % 32;
    int mt_live = (int)((rend - m0 + 15) / 16);
    mt_live = mt_live < MT ? mt_live : MT;
    int nstages = (int)((kt1 - kt0 + FB_KC - 1) / FB_KC);

    /* stage st: A rows m0.., k-tiles kt0 + st*KC.., and the block's 8 tiles of each k-tile.
     * A thread's chunks are fixed for the block (c = th + 128 i): their sources, destinations
     * and row/column validity are set here once; a stage adds its stride and, in the last
     * stage only, checks the k bound. */
    constexpr int A_CHR = FB_KC * 2;          /* 16-byte chunks of a staged A row */
    constexpr int CH_ROW = FB_NT * 2 * BITS;  /* 16-byte chunks of one k-tile's 8 tiles */
    constexpr int B_CH = FB_KC * CH_ROW;      /* of a stage */
    constexpr int B_PER = (B_CH + 127) / 128; /* a thread's B chunks */
    constexpr int A_RP = 128 / A_CHR;         /* rows the block stages at once */
    constexpr int A_PASSES = A_ROWS / A_RP;
    const int a_ch = th % A_CHR, a_row = th / A_CHR; /* rows a_row + A_RP i, i < A_PASSES */
    const uint16_t *a_src = L.a + (m0 + a_row) * L.k + kt0 * 16 + a_ch * 8;
    const int a_dst = a_row * FB_AROW + a_ch * 8;
    unsigned a_rows_ok = 0;
#pragma unroll
    for (int i = 0; i < A_PASSES; i++) a_rows_ok |= (unsigned)(m0 + a_row + A_RP * i < rend) << i;
    /* one m-tile (a decode step: 16 rows staged, one of them real): the rows past rend zeroed
     * in every stage buffer once and never loaded (at 8 m-tiles they stay loads that zero-fill:
     * with this branch there too, 6144x4096 at 256 rows ran 5% slower on the H200) */
    if (MT == 1)
#pragma unroll
        for (int i = 0; i < A_PASSES; i++)
            if (!(a_rows_ok >> i & 1))
                for (int b = 0; b < NS; b++)
                    *(uint4 *)(f_sm + b * STAGE_BYTES + (a_dst + A_RP * i * FB_AROW) * 2) =
                        make_uint4(0, 0, 0, 0);
    const uint16_t *b_src[B_PER];
    int b_dst[B_PER], b_kk[B_PER];
    bool b_ok[B_PER];
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
        int c = th + 128 * i, kk = c / CH_ROW, ch = c % CH_ROW;
        b_ok[i] = (B_CH % 128 == 0 || c < B_CH) && tn0 + ch / (2 * BITS) < ntiles;
        b_kk[i] = kk;
        b_src[i] = trellis + ((kt0 + kk) * tiles_ld + tn0) * 16 * BITS + (int64_t)ch * 8;
        b_dst[i] = kk * FB_NT * 8 * BITS + ch * 4;
    }
    const int64_t b_step = (int64_t)FB_KC * tiles_ld * 16 * BITS;
    /* set once and kept: an empty asm stops the compiler recomputing these in every stage */
    asm volatile("" : "+r"(a_rows_ok));
    int64_t b_step_b = b_step * 2; /* bytes */
    asm volatile("" : "+l"(b_step_b));
    int l_widx[3], l_sh; /* the lane's words in a tile, for every tile */
    muse_fast_lane_words(BITS, muse_fast_nwords(BITS), lane, l_widx, &l_sh);
    /* the lane's word places with the warp's tile offset folded in, set once: an empty asm
     * keeps the compiler from recomputing them (from lane and warp) in every stage */
    int l_wo[3];
#pragma unroll
    for (int i = 0; i < 3; i++) {
        l_wo[i] = warp * NTW * 8 * BITS + l_widx[i];
        asm volatile("" : "+r"(l_wo[i]));
    }
    asm volatile("" : "+r"(l_sh));
    /* k-tiles of the split and its full stages, in 32 bits (a split's k-tiles: k / 16) */
    const int kt_n = (int)(kt1 - kt0), nfull = kt_n / FB_KC;
    /* a chunk loads at stage st iff st * KC < its limit: its k-tile (kk < KC, so a full stage
     * needs no test of its own) inside the split, and its row / column valid (else limit 0) */
    const int a_klim = kt_n - a_ch / 2;
    int a_more = rend - m0 > A_RP; /* rows past the first pass: block-uniform */
    asm volatile("" : "+r"(a_more));
    int b_lim[B_PER];
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
        b_lim[i] = b_ok[i] ? kt_n - b_kk[i] : 0;
        asm volatile("" : "+r"(b_lim[i]));
    }
    /* running sources: stages load in order 0, 1, 2, ... (each part once a stage) */
    const uint16_t *a_cur = a_src, *const a_dummy = L.a;
    const int64_t a_pass = (int64_t)A_RP * L.k;
    const uint16_t *b_cur[B_PER];
#pragma unroll
    for (int i = 0; i < B_PER; i++) b_cur[i] = b_src[i];
    /* stage st's A rows (the prepare's output) and its trellis (the weights, which no kernel
     * writes): two parts, so a plain product's first trellis stages load before the wait */
    auto load_a = [&](int st, int boff, bool more = true) {
        uint16_t *as = (uint16_t *)(f_sm + boff);
        const uint16_t *as_src = a_cur;
        a_cur += FB_KC * 16;
        bool a_k_ok = st * FB_KC < a_klim;
#pragma unroll
        for (int i = 0; i < A_PASSES; i++) {
            if (MT == 1 && i > 0 && !more) break; /* a decode step: one pass has every row */
            if (MT == 1 && !(a_rows_ok >> i & 1)) continue;
            bool ok = (a_rows_ok >> i & 1) && a_k_ok;
            k_cp16(as + a_dst + A_RP * i * FB_AROW, ok ? as_src + i * a_pass : a_dummy, ok);
        }
    };
    auto load_b = [&](int st, int boff, bool al) {
        unsigned char *base = f_sm + boff;
        uint32_t *bs = (uint32_t *)(base + A_HALVES * 2);
        bool ok[B_PER];
        const uint16_t *src[B_PER];
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            ok[i] = st * FB_KC < b_lim[i];
            src[i] = b_cur[i];
            b_cur[i] = (const uint16_t *)((const char *)b_cur[i] + b_step_b);
        }
        if (al) {
#pragma unroll
            for (int i = 0; i < B_PER; i++) {
                if (B_CH % 128 != 0 && th + 128 * i >= B_CH) break;
                k_cp16(bs + b_dst[i], ok[i] ? src[i] : trellis, ok[i]);
            }
        } else { /* a 2-byte aligned trellis: plain loads, visible after the stage's sync */
#pragma unroll
            for (int i = 0; i < B_PER; i++) {
                if (B_CH % 128 != 0 && th + 128 * i >= B_CH) break;
                uint32_t *dst = bs + b_dst[i];
                for (int q = 0; q < 4; q++)
                    dst[q] =
                        ok[i] ? (uint32_t)src[i][2 * q] | (uint32_t)src[i][2 * q + 1] << 16 : 0;
            }
        }
    };

    float acc[MT][NTW][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NTW; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[mt][nt][h][q] = 0.0f;

    /* the prologue's NS - 1 stages: a plain product's trellis first, then the wait, then A (at 3
     * stages commit groups {B0, B1, A0}, {A1}: stage s still lands with group s); grouped, {B0,
     * A0}, {B1, A1} */
    if (!L.descs)
        for (int st = 0; st < NS - 1; st++)
            if (st < nstages) load_b(st, st * STAGE_BYTES, aligned);
    K_PDL_WAIT(); /* before A, and before the partials are written */
    for (int st = 0; st < NS - 1; st++) {
        if (st < nstages) {
            if (L.descs) load_b(st, st * STAGE_BYTES, aligned);
            load_a(st, st * STAGE_BYTES);
        }
        k_cp_commit();
    }
    /* byte offsets of stage st's buffer (st % NS) and of stage st + NS - 1's */
    int cbuf = 0, lbuf = (NS - 1) * STAGE_BYTES;
    for (int st = 0; st < nstages; st++) {
        k_cp_wait<NS - 2>();
        __syncthreads(); /* stage st landed; every warp is done with stage st - 1's buffer */
        if (st + NS - 1 < nstages) {
            const int lb = lbuf; /* stage st + NS - 1's buffer: the one before st's */
            /* the aligned test once, around both parts: their cp.asyncs in one block */
            if (aligned && (MT > 1 || !a_more)) { /* a decode step's rows: one pass */
                load_a(st + NS - 1, lb, false);
                load_b(st + NS - 1, lb, true);
            } else if (aligned) {
                load_a(st + NS - 1, lb);
                load_b(st + NS - 1, lb, true);
            } else {
                load_a(st + NS - 1, lb);
                load_b(st + NS - 1, lb, false);
            }
        }
        k_cp_commit();
        const unsigned char *base = f_sm + cbuf;
        lbuf = cbuf;
        cbuf = cbuf == (NS - 1) * STAGE_BYTES ? 0 : cbuf + STAGE_BYTES;
        const uint16_t *as = (const uint16_t *)base;
        const uint32_t *bs = (const uint32_t *)(base + A_HALVES * 2);
        const bool full_st = st < nfull;
        int nkt = kt_n - st * FB_KC; /* read only where !full_st */
        /* k-tile kk of the stage: decode the warp's tiles, then every m-tile's mma in k order
         * (TR: the rows' B fragment xt of this k-tile, or NULL: loaded here) */
        auto ktile = [&](int kk, const uint32_t *xt) {
            uint32_t bf[NTW][4];
#pragma unroll
            for (int nt = 0; nt < NTW; nt++)
                f_tile_frag_at<CB, BITS>(bs + (kk * FB_NT + nt) * 8 * BITS, l_wo, l_sh, bf[nt]);
            if constexpr (TR) { /* t^T = Wq^T a^T: the tile as the A operand, 8 rows as B */
                uint32_t xf[2];
                if (xt)
                    xf[0] = xt[0], xf[1] = xt[1];
                else
                    k_ldsm2(xf, as + (lane % 8) * FB_AROW + kk * 16 + (lane / 8 % 2) * 8);
#pragma unroll
                for (int nt = 0; nt < NTW; nt++) {
                    uint32_t wa[4];
#pragma unroll
                    for (int q = 0; q < 4; q++) wa[q] = bf[nt][muse_fast_wr_breg(q)];
                    k_mma16816(acc[0][nt][0], wa, xf[0], xf[1]);
                }
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (MT > 1 && mt >= mt_live) break; /* one m-tile: always live (m0 < rend) */
                    uint32_t af[4];
                    k_ldsm4(af, as + (mt * 16 + lane % 16) * FB_AROW + kk * 16 + (lane / 16) * 8);
#pragma unroll
                    for (int nt = 0; nt < NTW; nt++) {
                        k_mma16816(acc[mt][nt][0], af, bf[nt][0], bf[nt][1]);
                        k_mma16816(acc[mt][nt][1], af, bf[nt][2], bf[nt][3]);
                    }
                }
            }
        };
        /* two k-tiles' rows by one ldmatrix.x4 (lanes 16-31: kk + 1's); mcg's stages of 16
         * only, where ptxas keeps the block's register allocation (45 -> 47; 3inst 46 -> 52,
         * mul1 40 -> 48 and mcg's stages of 8 36 -> 44 would cost blocks an SM) */
        if (full_st && TR && CB == MUSE_FAST_CB_MCG && KC == 16) {
#pragma unroll
            for (int kk = 0; kk < FB_KC; kk += 2) {
                uint32_t x4[4];
                k_ldsm4(x4, as + (lane % 8) * FB_AROW + (kk + lane / 16) * 16 + (lane / 8 % 2) * 8);
                ktile(kk, x4);
                ktile(kk + 1, x4 + 2);
            }
        } else if (full_st) {
#pragma unroll
            for (int kk = 0; kk < FB_KC; kk++) ktile(kk, NULL);
        } else {
            for (int kk = 0; kk < nkt; kk++) ktile(kk, NULL);
        }
    }
    k_cp_wait<0>();

    if constexpr (TR) { /* c0, c1: column lane/4, rows 2(lane%4) + {0,1}; c2, c3: column + 8 */
#pragma unroll
        for (int e = 0; e < 2; e++) {
            long row = m0 + 2 * (lane % 4) + e;
            if (row >= rend) continue;
            float *prow = L.part + ((long)sp * R + row) * L.n + (tn0 + warp * NTW) * 16 + lane / 4;
#pragma unroll
            for (int nt = 0; nt < NTW; nt++) {
                if (tn0 + warp * NTW + nt >= ntiles) continue;
                prow[nt * 16] = acc[0][nt][0][e];
                prow[nt * 16 + 8] = acc[0][nt][0][2 + e];
            }
        }
    } else {
        /* c0, c1: row lane/4, columns 2(lane%4) + {0,1}; c2, c3: row lane/4 + 8; a row's address
         * once, its n-tiles at constant offsets */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                long row = m0 + mt * 16 + lane / 4 + 8 * half;
                if (row >= rend) continue;
                float *prow =
                    L.part + ((long)sp * R + row) * L.n + (tn0 + warp * NTW) * 16 + 2 * (lane % 4);
#pragma unroll
                for (int nt = 0; nt < NTW; nt++) {
                    if (tn0 + warp * NTW + nt >= ntiles) continue;
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        *(float2 *)(prow + nt * 16 + h * 8) =
                            make_float2(acc[mt][nt][h][2 * half], acc[mt][nt][h][2 * half + 1]);
                }
            }
    }
}

/* checks: grid (k/16 * n/16 tiles), 32 threads: the product's decode of each tile, unscaled */
template <int CB, int BITS>
__global__ void k_fast_decode(const uint16_t *trellis, int64_t tiles_ld, int64_t n, uint16_t *w)
{
    __shared__ uint32_t words[8 * BITS];
    int64_t ntiles = n / 16, t = blockIdx.x, tk = t / ntiles, tn = t % ntiles;
    const uint16_t *tile = trellis + (tk * tiles_ld + tn) * 16 * BITS;
    int lane = threadIdx.x;
    for (int i = lane; i < 8 * BITS; i += 32)
        words[i] = (uint32_t)tile[2 * i] | (uint32_t)tile[2 * i + 1] << 16;
    __syncwarp();
    uint32_t bf[4];
    f_tile_frag<CB, BITS>(words, lane, bf);
    for (int j = 0; j < 8; j++) {
        int r, c;
        muse_fast_lane_element(lane, j, &r, &c);
        w[(tk * 16 + r) * n + tn * 16 + c] = (uint16_t)(bf[j / 2] >> (16 * (j & 1)));
    }
}

typedef void (*prod_fn)(fast_prod);
typedef void (*dec_fn)(const uint16_t *, int64_t, int64_t, uint16_t *);

template <int CB, int BITS, int MT, int NTW, int KC, int MB, int NS = FB_STAGES, int TR = 0>
static int f_stage_bytes(void)
{
    return NS * ((TR ? 8 : MT * 16) * (KC * 16 + 8) * 2 + KC * FB_WARPS * NTW * 8 * BITS * 4);
}

#define F_BITS(F, CB, ...)                                                                         \
    {                                                                                              \
        F<CB, 1, __VA_ARGS__>, F<CB, 2, __VA_ARGS__>, F<CB, 3, __VA_ARGS__>,                       \
            F<CB, 4, __VA_ARGS__>, F<CB, 5, __VA_ARGS__>, F<CB, 6, __VA_ARGS__>,                   \
            F<CB, 7, __VA_ARGS__>, F<CB, 8, __VA_ARGS__>                                           \
    }
#define F_SHAPE(F, ...)                                                                            \
    {                                                                                              \
        F_BITS(F, 0, __VA_ARGS__), F_BITS(F, 1, __VA_ARGS__), F_BITS(F, 2, __VA_ARGS__)            \
    }
/* the block shapes (m-tiles, n-tiles a warp, k-tiles a stage, blocks an SM the registers are
 * capped for; 0 uncapped): [0] one m-tile, 128 columns; [1] 8 m-tiles, 128 columns; [2] one
 * m-tile, 64 columns (stages of 8 k-tiles at one m-tile: 9% faster than 4 on the H200); [3] 4
 * m-tiles, [4] 2 m-tiles, 128 columns, capped (H200: 4 m-tiles 128 registers against 149
 * uncapped, 6144x4096 at 1024 rows 319 us against 337, 6144x3072 at 256 rows 74 against 83;
 * 2 m-tiles 80 against 128, the MoE's experts at 256 rows 2506 us against 2520) */
#define F_SHAPES(F)                                                                                \
    {                                                                                              \
        F_SHAPE(F, 1, 2, 8, 0), F_SHAPE(F, 8, 2, 4, 0), F_SHAPE(F, 1, 1, 8, 0),                    \
            F_SHAPE(F, 4, 2, 4, 4), F_SHAPE(F, 2, 2, 8, 6)                                         \
    }
#define F_NSHAPES 5
static const prod_fn f_prod[F_NSHAPES][3][8] = F_SHAPES(k_fast_product);
static int (*const f_smem_bytes[F_NSHAPES][3][8])(void) = F_SHAPES(f_stage_bytes);
#define F_DEC(CB)                                                                                  \
    {                                                                                              \
        k_fast_decode<CB, 1>, k_fast_decode<CB, 2>, k_fast_decode<CB, 3>, k_fast_decode<CB, 4>,    \
            k_fast_decode<CB, 5>, k_fast_decode<CB, 6>, k_fast_decode<CB, 7>, k_fast_decode<CB, 8> \
    }
static const dec_fn f_dec[3][8] = {F_DEC(0), F_DEC(1), F_DEC(2)};

/* The one-m-tile blocks at 2 bits (shapes [0] and [2]: a decode step's products) in stages of
 * 16 k-tiles, 2 in flight: half the table's barriers and stage bookkeeping a k-tile (its 8, 3 in
 * flight). H200, 2026-12-04, the whole one-GPU shape at one stream: 16.18-16.29 ms a round
 * against 16.52-16.60, at 4 and 16 streams the same. The same bits: a stage's k-tiles change
 * which loads share a barrier, never a column's chain. MUSE_FAST_DEC=0 from the environment
 * (tuning only, read once a process): the table's; =2: stages of 8, 2 in flight. */
#define F_DEC_DEFAULT 1
#define F_DEC_ONE(CB, NTW, KC, NS, TR)                                                             \
    {                                                                                              \
        k_fast_product<CB, 2, 1, NTW, KC, 0, NS, TR>, f_stage_bytes<CB, 2, 1, NTW, KC, 0, NS, TR>  \
    }
#define F_DEC_CB(KC, NS, TR)                                                                       \
    {                                                                                              \
        {F_DEC_ONE(0, 2, KC, NS, TR), F_DEC_ONE(0, 1, KC, NS, TR)},                                \
            {F_DEC_ONE(1, 2, KC, NS, TR), F_DEC_ONE(1, 1, KC, NS, TR)},                            \
        {                                                                                          \
            F_DEC_ONE(2, 2, KC, NS, TR), F_DEC_ONE(2, 1, KC, NS, TR)                               \
        }                                                                                          \
    }
typedef struct {
    prod_fn fn;
    int (*smem)(void);
} f_dec_form;
/* [transposed][stage form - 1][codebook][64 columns] */
static const f_dec_form f_dec_forms[2][2][3][2] = {{F_DEC_CB(16, 2, 0), F_DEC_CB(8, 2, 0)},
                                                   {F_DEC_CB(16, 2, 1), F_DEC_CB(8, 2, 1)}};
/* Launches of at most 8 rows (grouped: 8 pairs, so every group's rows too; one token of 8
 * experts) compute t^T = Wq^T a^T: the decoded tile as mma's A operand (muse_fast_wr_breg's
 * registers), the rows as its 8-column B, one mma a tile where t = a Wq takes two, half the
 * accumulators and staged rows (at 64 columns 45 registers and 17 KB, 10 blocks an SM; the
 * other form 52 and 25 KB, 9). The same bits (each output the same products summed the same way;
 * H200: every logit of main's). H200, 2026-12-04, the whole one-GPU shape: one token 15.42 ms a
 * round against 16.31; 2 to 16 tokens, with the experts in groups of 8 rows (f_tr_groups),
 * 7.6-8.4% faster. MUSE_FAST_TR=0 from the environment (tuning only, read once a process):
 * never. */
#define F_TR_DEFAULT 1
#define F_TR_NARROW  1
static int f_tr_set = -1; /* muse_k_linear_fast_tr_force: checks only */
static int f_tr_on(void)
{
    static const int env = [] {
        const char *v = getenv("MUSE_FAST_TR");
        return v && *v ? atoi(v) != 0 : F_TR_DEFAULT;
    }();
    return f_tr_set >= 0 ? f_tr_set : env;
}

MUSE_K_API void muse_k_linear_fast_tr_force(int on)
{
    f_tr_set = on;
}

static int f_dec_env(void)
{
    static const int env = [] {
        const char *v = getenv("MUSE_FAST_DEC");
        int d = v && *v ? atoi(v) : F_DEC_DEFAULT;
        return d >= 0 && d <= 2 ? d : F_DEC_DEFAULT;
    }();
    return env;
}

/* whether a one-m-tile launch of rows rows at bits bits takes the transposed form */
static int f_dec_tr(int bits, long rows)
{
    return f_dec_env() && bits == 2 && rows <= 8 && f_tr_on();
}

/* the form for a launch's blocks (tr: f_dec_tr's), or NULL for the table's */
static const f_dec_form *f_dec_variant(int shape, int cb, int bits, int tr)
{
    int env = f_dec_env();
    if (!env || bits != 2 || (shape != 0 && shape != 2)) return NULL;
    return &f_dec_forms[tr][env - 1][cb][shape == 2];
}

MUSE_K_API int muse_k_linear_fast_split_target(void)
{
    static const int target = [] {
        const char *v = getenv("MUSE_FAST_SPLITS");
        int t = v && *v ? atoi(v) : 0;
        return t > 0 ? t : MUSE_FAST_SPLIT_TARGET;
    }();
    return target;
}

/* Launches of fewer 128-column blocks than this take 64-column blocks: MUSE_FAST_NARROW=N
 * from the environment (tuning only, read once a process; 0: never), else 16 an SM (H200,
 * 2026-12-02, the whole one-GPU shape at one stream: 52.95 tok/s against 51.2 at 8 an SM, once
 * the 64-column blocks took 48 registers; the routed experts' gate/up then 64-column too). */
static long f_narrow_set = -1; /* muse_k_linear_fast_narrow: checks only */
/* whether a launch of wide 128-column blocks (tr: the transposed form's, rows rows) takes
 * 64-column ones; the transposed form's by muse_fast_tr_narrow, its policy
 * MUSE_FAST_TR_NARROW=P from the environment (tuning only, read once a process), else
 * F_TR_NARROW */
static int f_narrow(long wide, int tr, long rows, int grouped)
{
    static const long below = [] {
        const char *v = getenv("MUSE_FAST_NARROW");
        return v && *v ? atol(v) : 16L * MUSE_FAST_SMS;
    }();
    static const int policy = [] {
        const char *v = getenv("MUSE_FAST_TR_NARROW");
        return v && *v ? atoi(v) : F_TR_NARROW;
    }();
    if (f_narrow_set >= 0) return wide < f_narrow_set;
    return tr ? muse_fast_tr_narrow(wide, rows, grouped, policy) : wide < below;
}

MUSE_K_API void muse_k_linear_fast_narrow(long below)
{
    f_narrow_set = below;
}

static int f_valid(const muse_k_lin *s)
{
    return s->kind == MUSE_K_EXL3 && s->bits >= 1 && s->bits <= 8 && s->codebook >= 0 &&
           s->codebook <= 2 && s->k > 0 && s->n > 0 && s->k % 128 == 0 && s->n % 128 == 0 &&
           s->k < (1 << 26); /* k / 16 * splits < 2^31: the kernels' split bounds in 32 bits */
}

static size_t f_align(size_t v)
{
    return (v + 255) & ~(size_t)255;
}

/* The split target of a grouped call: MUSE_FAST_GROUP_SPLITS=N from the environment (tuning
 * only, read once a process), else the caller's (muse_k_fast_groups.split_target), else the
 * plain one. At most the plain one, so muse_k_linear_fast_workspace covers it. */
static int f_group_target(const muse_k_fast_groups *g)
{
    static const int env = [] {
        const char *v = getenv("MUSE_FAST_GROUP_SPLITS");
        return v && *v ? atoi(v) : 0;
    }();
    int plain = muse_k_linear_fast_split_target(), t = env > 0 ? env : g->split_target;
    return t > 0 && t < plain ? t : plain;
}

/* the workspace of n_lin linears at rows rows split for target: a_i then part_i, each 256-byte
 * aligned */
static size_t f_layout(const muse_k_lin *shapes, int n_lin, long rows, int target, uint16_t *a[],
                       float *part[], unsigned char *ws)
{
    size_t off = 0;
    for (int i = 0; i < n_lin; i++) {
        const muse_k_lin *s = shapes + i;
        if (a) a[i] = (uint16_t *)(ws + off);
        off = f_align(off + (size_t)rows * (size_t)s->k * 2);
        if (part) part[i] = (float *)(ws + off);
        off = f_align(off + (size_t)muse_fast_splits(s->k, s->n, target) * (size_t)rows *
                                (size_t)s->n * 4);
    }
    return off;
}

MUSE_K_API size_t muse_k_linear_fast_workspace(const muse_k_lin *shapes, int n_lin, long max_rows)
{
    return f_layout(shapes, n_lin, max_rows, muse_k_linear_fast_split_target(), NULL, NULL, NULL);
}

/* Steps left out, for timing only (wrong results): set by exl3-fast-check alone, never read
 * from the environment here, so no engine can run with a step missing. */
static int f_skip_steps;

MUSE_K_API void muse_k_linear_fast_skip(int steps)
{
    f_skip_steps = steps & 15;
}

MUSE_K_API int muse_k_linear_fast_fits(const muse_k_lin *shapes, int n_lin, int epilogue)
{
    if (n_lin < 1 || n_lin > MUSE_K_FAST_MAX_LIN) return 0;
    if (epilogue == MUSE_K_EPI_SWIGLU && (n_lin != 2 || shapes[0].n != shapes[1].n)) return 0;
    for (int i = 0; i < n_lin; i++)
        if (!f_valid(shapes + i) || shapes[i].k != shapes[0].k ||
            shapes[i].codebook != shapes[0].codebook)
            return 0;
    return 1;
}

/* MUSE_FAST_MANY_MT=N from the environment (tuning only, read once a process): a block's
 * m-tiles from 17 rows on (1, 2, 4 or 8; else the fewest that hold the rows) */
static int f_many_forced(void)
{
    static const int forced = [] {
        const char *v = getenv("MUSE_FAST_MANY_MT");
        return v && *v ? atoi(v) : 0;
    }();
    return forced;
}

/* The wgmma form (linear_fast_wg.cu: blocks of 64 or 128 rows, the bits of the mma.sync form's,
 * sm_90a only) for a plain product from 65 rows (128-row blocks from 128) and a grouped one whose
 * groups hold 64 or 128 rows (H200: 6144x4096 at 4096 rows 1163 us against 1265, a 4096-token
 * prompt 3.2% faster in 2048-row rounds). MUSE_FAST_WG=0 from the environment (tuning only, read
 * once a process): never; =64 or =128: a plain product's blocks of that many rows. Returns the
 * block's 64-row halves, or 0 for mma.sync. */
#define F_WG_DEFAULT 1
static int f_wg_set = -1; /* muse_k_linear_fast_wg_force: checks only */
static int f_wg_halves(long rows, int grouped)
{
    static const int env = [] {
        const char *v = getenv("MUSE_FAST_WG");
        return v && *v ? atoi(v) : F_WG_DEFAULT;
    }();
    int mode = f_wg_set >= 0 ? f_wg_set : env;
    if (mode != 1 && mode != 64 && mode != 128) return 0;
    if (!muse_k_linear_fast_wg()) return 0;
    if (grouped) return rows >= 64 ? (int)(rows / 64 > 2 ? 2 : rows / 64) : 0;
    if (rows <= 64) return 0;
    return mode > 1 ? mode / 64 : rows >= 128 ? 2 : 1;
}

MUSE_K_API void muse_k_linear_fast_wg_force(int mode)
{
    f_wg_set = mode;
}

/* The wgmma form's kernel: one warpgroup a block (linear_fast_wg.cu), or warp-specialized
 * (linear_fast_ws.cu: 6-12% slower on the H200 at 128 to 4096 rows, 2026-12-03), the same bits.
 * MUSE_FAST_WS=0 or 1 from the environment (tuning only, read once a process), else
 * F_WS_DEFAULT. */
#define F_WS_DEFAULT 0
static int f_ws_set = -1; /* muse_k_linear_fast_ws_force: checks only */
static int f_ws_on(void)
{
    static const int env = [] {
        const char *v = getenv("MUSE_FAST_WS");
        return v && *v ? atoi(v) != 0 : F_WS_DEFAULT;
    }();
    return f_ws_set >= 0 ? f_ws_set : env;
}

MUSE_K_API void muse_k_linear_fast_ws_force(int on)
{
    f_ws_set = on;
}

/* The wgmma form with the weights as the register operand (linear_fast_wr.cu), the same bits, in
 * place of the two above where on (H200, 2026-12-03: 6144x4096 at 4096 rows 1027-1041 us
 * against 1160, a 4096-token prompt in 2048-row rounds 1767-1865 tok/s against 1547-1598):
 * MUSE_FAST_WR=0 or 1 from the environment (tuning only, read once a process), else
 * F_WR_DEFAULT. Its blocks: a group's rows; a plain product's 256 rows past 256
 * (MUSE_FAST_WR_ROWS=128 or 256: that many), 128 up to 256, or muse_k_linear_fast_wg_force's 64
 * or 128. Returns the block's 64-row units, or 0 where the form is off. */
#define F_WR_DEFAULT 1
static int f_wr_set = -1; /* muse_k_linear_fast_wr_force: checks only */
static int f_wr_units(long rows, int grouped, int mh)
{
    static const int env = [] {
        const char *v = getenv("MUSE_FAST_WR");
        return v && *v ? atoi(v) != 0 : F_WR_DEFAULT;
    }();
    static const int env_rows = [] {
        const char *v = getenv("MUSE_FAST_WR_ROWS");
        int r = v && *v ? atoi(v) : 0;
        return r == 128 || r == 256 ? r / 64 : 0;
    }();
    if (!(f_wr_set >= 0 ? f_wr_set : env) || !mh) return 0;
    if (grouped || f_wg_set == 64 || f_wg_set == 128) return mh;
    if (env_rows) return env_rows;
    return rows > 256 ? 4 : 2;
}

MUSE_K_API void muse_k_linear_fast_wr_force(int on)
{
    f_wr_set = on;
}

/* The register form's fused splits (a block runs every split of its columns and sums them as
 * the finish would: no partials out and back; the same bits) for a launch of at least this many
 * such blocks, 128 rows each: MUSE_FAST_FUSE_MIN=N from the environment (tuning only, read once
 * a process), else F_FUSE_MIN_DEFAULT; 0: never. Off by default: on the H200 (2026-12-03) the
 * fused blocks, one an SM by their group sums' 128 KB of shared memory, took 1311 us for
 * 6144x4096 at 4096 rows against 1027 unfused, a 4096-token prompt 1622 tok/s against 1812. */
#define F_FUSE_MIN_DEFAULT 0
static long f_fuse_set = -1; /* muse_k_linear_fast_fuse_force: checks only */
static long f_fuse_min(void)
{
    static const long env = [] {
        const char *v = getenv("MUSE_FAST_FUSE_MIN");
        return v && *v ? atol(v) : F_FUSE_MIN_DEFAULT;
    }();
    return f_fuse_set >= 0 ? f_fuse_set : env;
}

/* A plain product's rows a block where its splits may be fused: MUSE_FAST_FUSE_ROWS=64 from the
 * environment (tuning only, read once a process), else 128 */
static int f_fuse_rows(void)
{
    static const int rows = [] {
        const char *v = getenv("MUSE_FAST_FUSE_ROWS");
        return v && atoi(v) == 64 ? 64 : 128;
    }();
    return rows;
}

MUSE_K_API void muse_k_linear_fast_fuse_force(long min_blocks)
{
    f_fuse_set = min_blocks;
}

/* The MoE's groups of at most 8 rows for rounds of 2 to 16 rows, so a 2-bit expert's blocks
 * take the transposed form (other bits: one m-tile's blocks as for 16): H200, 2026-12-04, the
 * whole one-GPU shape at 2, 4, 8 and 16 streams 21.94, 32.38, 49.29 and 68.91 ms a round
 * against 23.49, 34.82, 53.45 and 74.68 with groups of 16, every logit the same bits.
 * MUSE_FAST_TR_GROUPS=0 from the environment (tuning only, read once a process): groups of 16.
 * Which pairs share a block, not their bits. */
#define F_TR_GROUPS_DEFAULT 1
static int f_tr_groups(void)
{
    static const int on = [] {
        const char *v = getenv("MUSE_FAST_TR_GROUPS");
        return v && *v ? atoi(v) != 0 : F_TR_GROUPS_DEFAULT;
    }();
    return on && f_tr_on() && f_dec_env();
}

MUSE_K_API int muse_k_linear_fast_group_rows(long rows, long k_per_row, long experts)
{
    if (rows > 1 && rows <= 16 && f_tr_groups()) return 8;
    return muse_fast_group_rows(rows, k_per_row, experts, f_many_forced());
}

/* The next linear whose step 1 this call's finish does (muse_k_linear_fast_mlp's down): its a,
 * its k, its descriptor (grouped: the experts'). f_run's prepared: its own step 1 left out. */
typedef struct {
    uint16_t *na;
    int64_t nk;
    muse_k_lin nd;
    const muse_k_lin *nd_descs;
} f_next;

/* The three steps of one call; g NULL: plain rows, else the grouped pairs (linear_fast.cuh). */
static int f_run(const muse_k_ctx *ctx, const muse_k_lin *shapes, int n_lin,
                 const muse_k_fast_groups *g, const float *x, long x_stride, int round16,
                 float *const y[], const long y_stride[], int epilogue, void *ws, size_t ws_bytes,
                 const f_next *nx, int prepared)
{
    long rows = ctx->rows;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    if (!muse_k_linear_fast_fits(shapes, n_lin, epilogue) || rows > 65535)
        return (int)cudaErrorInvalidValue;
    if (g && (g->max_groups < 1 || g->group_rows < 8 || g->group_rows > 16 * MUSE_FAST_MT_MAX ||
              g->group_rows & (g->group_rows - 1)))
        return (int)cudaErrorInvalidValue; /* 8 (the transposed form's), 16, 32, 64 or 128 */
    uint16_t *a[MUSE_K_FAST_MAX_LIN];
    float *part[MUSE_K_FAST_MAX_LIN];
    int target = g ? f_group_target(g) : muse_k_linear_fast_split_target();
    if (f_layout(shapes, n_lin, rows, target, a, part, (unsigned char *)ws) > ws_bytes)
        return (int)cudaErrorInvalidValue;

    muse_fast_prep pp;
    pp.k = shapes[0].k;
    pp.n_lin = n_lin;
    pp.grouped = g != NULL;
    if (g) pp.g = *g;
    for (int i = 0; i < n_lin; i++) pp.d[i] = shapes[i], pp.a[i] = a[i];
    int skip = f_skip_steps;
    int err = skip & 1 || prepared ? 0 : muse_k_fast_prepare(&pp, x, x_stride, rows, st);
    if (err) return err;

    /* step 2: one launch for each run of linears with the same bits (q, k, v: usually one) */
    int mt = g ? (g->group_rows + 15) / 16 : muse_fast_block_mt(rows, f_many_forced());
    int mh = f_wg_halves(g ? g->group_rows : rows, g != NULL); /* 0: the mma.sync form */
    int nh = f_wr_units(rows, g != NULL, mh);                  /* 0: not the register form */
    long fuse_min = f_fuse_min();
    if (nh == 4 && fuse_min > 0) nh = f_fuse_rows() / 64; /* unfused 256 rows ran as fast */
    if (mh && !g) mt = 4 * (nh ? nh : mh);
    int cb = shapes[0].codebook;
    int mgroups = g ? g->max_groups : (int)((rows + 16 * mt - 1) / (16 * mt));
    int done[MUSE_K_FAST_MAX_LIN] = {0}, fused[MUSE_K_FAST_MAX_LIN] = {0};
    for (int i = 0; i < n_lin; i++) {
        if (done[i]) continue;
        fast_prod p;
        p.n_lin = 0;
        p.mgroups = mgroups;
        p.mg_div = muse_fast_magic((uint32_t)mgroups);
        p.R = rows;
        p.groups = g ? (const int4 *)g->groups : NULL;
        p.n_groups = g ? g->n_groups : NULL;
        p.skip_store = (skip & 8) != 0;
        /* the block shape: 64 columns where 128 would leave the launch under the narrow
         * threshold of blocks (more warps in flight at few rows); the bits are the same */
        long wide = 0;
        for (int j = i; j < n_lin; j++)
            if (!done[j] && shapes[j].bits == shapes[i].bits)
                wide += (long)(shapes[j].n / MUSE_FAST_BLOCK_COLS) *
                        muse_fast_splits(shapes[j].k, shapes[j].n, target) * mgroups;
        /* a block's rows: at most the round's, and a group's */
        long brows = g && g->group_rows < rows ? g->group_rows : rows;
        int tr = !mh && mt == 1 && f_dec_tr(shapes[i].bits, brows);
        int shape = mh || mt == 8                         ? 1
                    : mt == 4                             ? 3
                    : mt == 2                             ? 4
                    : f_narrow(wide, tr, rows, g != NULL) ? 2
                                                          : 0;
        int64_t cols = shape == 2 ? MUSE_FAST_BLOCK_COLS / 2 : MUSE_FAST_BLOCK_COLS;
        /* the register form's splits fused where its blocks without them are enough */
        long unsplit = 0;
        for (int j = i; j < n_lin; j++)
            if (!done[j] && shapes[j].bits == shapes[i].bits)
                unsplit += (long)(shapes[j].n / MUSE_FAST_BLOCK_COLS) * mgroups;
        int fuse = nh && nh <= 2 && fuse_min > 0 && unsplit >= fuse_min;
        long blocks = 0;
        for (int j = i; j < n_lin; j++) {
            if (done[j] || shapes[j].bits != shapes[i].bits) continue;
            done[j] = 1;
            fused[j] = fuse && muse_fast_splits(shapes[j].k, shapes[j].n, target) > 1;
            const muse_k_lin *s = shapes + j;
            fast_lin *L = &p.l[p.n_lin++];
            L->trellis = s->trellis;
            L->tiles_ld = s->tiles_ld ? s->tiles_ld : s->n / 16;
            L->k = s->k;
            L->n = s->n;
            L->a = a[j];
            L->part = part[j];
            L->descs = g ? g->descs[j] : NULL;
            L->splits = muse_fast_splits(s->k, s->n, target);
            L->sp_div = muse_fast_magic((uint32_t)L->splits);
            L->nblk = (int)((s->n + cols - 1) / cols);
            L->aligned = (uintptr_t)s->trellis % 16 == 0; /* tile rows are 32 * bits bytes */
            L->blk0 = blocks;
            blocks += (long)L->nblk * (fuse ? 1 : L->splits) * mgroups;
        }
        if (mh) { /* the wgmma form: 128 columns a block, as shape 0's */
            if (!(skip & 2))
                err = nh ? muse_k_fast_product_wr(&p, nh, fuse, cb, shapes[i].bits, blocks, st)
                      : f_ws_on() ? muse_k_fast_product_ws(&p, mh, cb, shapes[i].bits, blocks, st)
                                  : muse_k_fast_product_wg(&p, mh, cb, shapes[i].bits, blocks, st);
            if (err) return err;
            continue;
        }
        int bi = shapes[i].bits - 1;
        const f_dec_form *dv = f_dec_variant(shape, cb, shapes[i].bits, tr);
        prod_fn fn = dv ? dv->fn : f_prod[shape][cb][bi];
        int smem = dv ? dv->smem() : f_smem_bytes[shape][cb][bi]();
        if (smem > 48 * 1024) {
            err = (int)cudaFuncSetAttribute((const void *)fn,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            if (err) return err;
        }
        if (!(skip & 2)) err = k_launch(fn, (unsigned)blocks, 128, (size_t)smem, st, p);
        if (err) return err;
    }

    muse_fast_fin f;
    memset(&f, 0, sizeof f);
    f.n_lin = n_lin;
    f.round16 = round16;
    f.epilogue = epilogue;
    f.grouped = g != NULL;
    if (g) f.g = *g;
    f.blk0[0] = 0;
    for (int i = 0; i < n_lin; i++) {
        f.d[i] = shapes[i];
        f.part[i] = part[i];
        f.splits[i] = fused[i] ? 1 : muse_fast_splits(shapes[i].k, shapes[i].n, target);
        f.dsum[i] = fused[i] ? (const double *)part[i] : NULL; /* 2 splits or more: room */
        f.n[i] = shapes[i].n;
        f.y[i] = y[i];
        f.y_stride[i] = y_stride[i];
        f.blk0[i + 1] = f.blk0[i] + (long)(shapes[i].n / 128);
    }
    if (g && n_lin == 1 && epilogue == MUSE_K_EPI_NONE) f.sq = g->row_sq;
    if (nx) {
        f.na = nx->na;
        f.nk = nx->nk;
        f.nd = nx->nd;
        f.nd_descs = nx->nd_descs;
    }
    return skip & 4 ? 0 : muse_k_fast_finish(&f, rows, st);
}

MUSE_K_API int muse_k_linear_fast(const muse_k_ctx *ctx, const muse_k_lin *shapes, int n_lin,
                                  const float *x, long x_stride, int round16, float *const y[],
                                  const long y_stride[], int epilogue, void *ws, size_t ws_bytes)
{
    return f_run(ctx, shapes, n_lin, NULL, x, x_stride, round16, y, y_stride, epilogue, ws,
                 ws_bytes, NULL, 0);
}

MUSE_K_API int muse_k_linear_fast_grouped(const muse_k_ctx *ctx, const muse_k_lin *shapes,
                                          int n_lin, const muse_k_fast_groups *g, const float *x,
                                          long x_stride, int round16, float *const y[],
                                          const long y_stride[], int epilogue, void *ws,
                                          size_t ws_bytes)
{
    if (!g) return (int)cudaErrorInvalidValue;
    for (int i = 0; i < n_lin; i++)
        if (!g->descs[i]) return (int)cudaErrorInvalidValue;
    return f_run(ctx, shapes, n_lin, g, x, x_stride, round16, y, y_stride, epilogue, ws, ws_bytes,
                 NULL, 0);
}

/* MUSE_FAST_CHAIN=0 from the environment (tuning only, read once a process): the down's prepare
 * in a launch of its own, as two calls do it. The bits are the same. */
static int f_chain_on(void)
{
    static const int on = [] {
        const char *v = getenv("MUSE_FAST_CHAIN");
        return !(v && *v == '0');
    }();
    return on;
}

/* muse_k_linear_fast_mlp's workspace: the gate/up's layout, then the down's from down_off */
static size_t f_mlp_layout(const muse_k_lin s[3], long rows, int target, size_t *down_off)
{
    size_t off = f_layout(s, 2, rows, target, NULL, NULL, NULL);
    if (down_off) *down_off = off;
    return off + f_layout(s + 2, 1, rows, target, NULL, NULL, NULL);
}

MUSE_K_API size_t muse_k_linear_fast_mlp_workspace(const muse_k_lin shapes[3], long max_rows)
{
    return f_mlp_layout(shapes, max_rows, muse_k_linear_fast_split_target(), NULL);
}

MUSE_K_API size_t muse_k_linear_fast_grouped_mlp_workspace(const muse_k_lin shapes[3],
                                                           long max_pairs, int split_target)
{
    muse_k_fast_groups g;
    memset(&g, 0, sizeof g);
    g.split_target = split_target;
    return f_mlp_layout(shapes, max_pairs, f_group_target(&g), NULL);
}

MUSE_K_API int muse_k_linear_fast_mlp(const muse_k_ctx *ctx, const muse_k_lin shapes[3],
                                      const muse_k_fast_groups *g, const float *x, long x_stride,
                                      float *mid, long mid_stride, float *y, long y_stride,
                                      void *ws, size_t ws_bytes)
{
    if (!muse_k_linear_fast_fits(shapes, 2, MUSE_K_EPI_SWIGLU) ||
        !muse_k_linear_fast_fits(shapes + 2, 1, MUSE_K_EPI_NONE) || shapes[2].k != shapes[0].n)
        return (int)cudaErrorInvalidValue;
    for (int i = 0; g && i < 3; i++)
        if (!g->descs[i]) return (int)cudaErrorInvalidValue;
    int target = g ? f_group_target(g) : muse_k_linear_fast_split_target();
    size_t off;
    if (ctx->rows > 0 && f_mlp_layout(shapes, ctx->rows, target, &off) > ws_bytes)
        return (int)cudaErrorInvalidValue;
    if (ctx->rows <= 0) return 0;
    /* the down's a: the first part of its layout, which the gate/up's finish fills */
    unsigned char *wd = (unsigned char *)ws + off;
    f_next nx = {(uint16_t *)wd, shapes[2].k, shapes[2], g ? g->descs[2] : NULL};
    float *ym[2] = {mid, NULL};
    long ms[2] = {mid_stride, mid_stride};
    int chain = f_chain_on();
    int err = f_run(ctx, shapes, 2, g, x, x_stride, 1, ym, ms, MUSE_K_EPI_SWIGLU, ws, off,
                    chain ? &nx : NULL, 0);
    if (err) return err;
    muse_k_fast_groups gd;
    if (g) { /* the pairs' rows of mid are their own: no source map */
        gd = *g;
        gd.descs[0] = g->descs[2];
        for (int i = 1; i < MUSE_K_FAST_MAX_LIN; i++) gd.descs[i] = NULL;
        gd.src = NULL;
    }
    float *yd[1] = {y};
    long yds[1] = {y_stride};
    return f_run(ctx, shapes + 2, 1, g ? &gd : NULL, mid, mid_stride, 0, yd, yds, MUSE_K_EPI_NONE,
                 wd, ws_bytes - off, NULL, chain);
}

MUSE_K_API int muse_k_linear_fast_decode(const muse_k_lin *shape, uint16_t *w, cudaStream_t st)
{
    if (!f_valid(shape)) return (int)cudaErrorInvalidValue;
    int64_t ld = shape->tiles_ld ? shape->tiles_ld : shape->n / 16;
    long tiles = (long)(shape->k / 16) * (long)(shape->n / 16);
    f_dec[shape->codebook][shape->bits - 1]<<<(unsigned)tiles, 32, 0, st>>>(shape->trellis, ld,
                                                                            shape->n, w);
    return (int)cudaGetLastError();
}
