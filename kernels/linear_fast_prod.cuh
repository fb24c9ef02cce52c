/* linear_fast_prod.cuh: what the forms of the fast product's step 2 share (linear_fast.cu on
 * mma.sync, linear_fast_wg.cu, linear_fast_ws.cu and linear_fast_wr.cu on wgmma): the launch's
 * arguments and a lane's decode of its 8 trellis states of a 16x16 tile into fp16 pairs, laid out
 * as the mma B fragment. */
#ifndef MUSE_K_LINEAR_FAST_PROD_CUH
#define MUSE_K_LINEAR_FAST_PROD_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "launch.h"
#include "linear_fast.cuh"
#include "linear_fast.h"
#include "pdl.cuh"

typedef struct {
    const uint16_t *trellis;
    int64_t tiles_ld, k, n;
    const uint16_t *a;       /* [R][k] fp16 */
    float *part;             /* [splits][R][n] */
    const muse_k_lin *descs; /* grouped: the experts' device descriptors [E]; else NULL */
    long blk0;               /* first block of this linear in the launch */
    int splits, nblk, aligned;
    muse_fast_div sp_div; /* / splits (muse_fast_magic) */
} fast_lin;

/* Grouped (the MoE): m-group g is the rows [x.y, x.y + x.z) of groups[g] (rows in group
 * order, each group one expert x.x), groups from n_groups on are empty blocks. */
typedef struct {
    fast_lin l[MUSE_K_FAST_MAX_LIN];
    int n_lin, mgroups;
    muse_fast_div mg_div; /* / mgroups (muse_fast_magic) */
    long R;
    const int4 *groups;
    const int32_t *n_groups;
    int skip_store; /* timing only (muse_k_linear_fast_skip's 8): linear_fast_wr.cu's partials */
} fast_prod;

/* Block b of a launch's grid (an item of the persistent form's): its linear li, its m-group mg,
 * its k split sp and its 128-column block nb; the grid runs m-groups fastest, then splits
 * (a grid's blocks < 2^31: the divisions as multiplies) */
__device__ __forceinline__ void f_place(const fast_prod &p, long b, int &li, int &mg, int &sp,
                                        int &nb)
{
    li = 0;
    while (li + 1 < p.n_lin && b >= p.l[li + 1].blk0) li++;
    uint32_t local = (uint32_t)(b - p.l[li].blk0);
    uint32_t rest = muse_fast_divq(local, p.mg_div);
    mg = (int)(local - rest * (uint32_t)p.mgroups);
    uint32_t q = muse_fast_divq(rest, p.l[li].sp_div);
    sp = (int)(rest - q * (uint32_t)p.l[li].splits), nb = (int)q;
}

/* muse_fast_split_begin of the linear's split s (k / 16 * splits < 2^31: f_run checks k) */
__device__ __forceinline__ int64_t f_split_at(const fast_lin &L, int s)
{
    return muse_fast_divq((uint32_t)(L.k / 16) * (uint32_t)s, L.sp_div);
}

/* A grouped launch's m-group mg (the MoE), after the wait for the selection that made the
 * groups: false past the round's n_groups (nothing to do), else its rows [m0, rend) and its
 * expert's trellis, tile row stride (ntiles where it has none) and alignment in place of the
 * linear's */
__device__ __forceinline__ bool f_group_take(const fast_prod &p, const fast_lin &L, int mg,
                                             int64_t ntiles, const uint16_t *&trellis,
                                             int64_t &tiles_ld, bool &aligned, long &m0, long &rend)
{
    K_PDL_WAIT();
    if (mg >= *p.n_groups) return false;
    int4 g = p.groups[mg];
    const muse_k_lin *d = L.descs + g.x;
    trellis = d->trellis;
    tiles_ld = d->tiles_ld ? d->tiles_ld : ntiles;
    aligned = (uintptr_t)trellis % 16 == 0;
    m0 = g.y;
    rend = (long)g.y + g.z;
    return true;
}

/* Two states to one .f16x2 B register (the first in the low half): the integer stage of
 * linear_fast.h, then one fp16 op for both (the fp16 stage it emulates on the host). */
/* (3inst/mcg: each state's two halves added on the FMA pipe, then one PRMT packs the pair;
 * measured 6% faster than two PRMTs and one HADD2, the same bits) */
template <int CB> __device__ __forceinline__ uint32_t f_decode2(uint32_t sa, uint32_t sb)
{
    uint32_t va = muse_fast_int_stage(CB, sa), vb = muse_fast_int_stage(CB, sb);
    __half2 r;
    if (CB == MUSE_FAST_CB_MUL1) {
        uint32_t s = __byte_perm(va, vb, 0x5410);
        __half2 sh = *reinterpret_cast<__half2 *>(&s);
        const __half2 kinv = __halves2half2(__ushort_as_half(0x1EEE), __ushort_as_half(0x1EEE));
        const __half2 kbias = __halves2half2(__ushort_as_half(0xC931), __ushort_as_half(0xC931));
        r = __hfma2(sh, kinv, kbias);
    } else {
        __half2 ha = *reinterpret_cast<__half2 *>(&va), hb = *reinterpret_cast<__half2 *>(&vb);
        r = __halves2half2(__hadd(__low2half(ha), __high2half(ha)),
                           __hadd(__low2half(hb), __high2half(hb)));
    }
    return *reinterpret_cast<uint32_t *>(&r);
}

/* lane's B fragments of one tile (words: its 8 * BITS words): b[0], b[1] the first n8
 * (columns 0..7), b[2], b[3] the second */
template <int CB, int BITS>
__device__ __forceinline__ void f_tile_frag(const uint32_t *words, int lane, uint32_t b[4])
{
    uint32_t st[8];
    muse_fast_lane_states(words, BITS, muse_fast_nwords(BITS), muse_fast_nwin(BITS), lane, st);
#pragma unroll
    for (int q = 0; q < 4; q++) b[q] = f_decode2<CB>(st[2 * q], st[2 * q + 1]);
}

/* the same with the lane's word places and shift set once (muse_fast_lane_words) */
template <int CB, int BITS>
__device__ __forceinline__ void f_tile_frag_at(const uint32_t *words, const int widx[3], int sh,
                                               uint32_t b[4])
{
    uint32_t st[8];
    muse_fast_lane_states_at(words, widx, sh, BITS, muse_fast_nwords(BITS), muse_fast_nwin(BITS),
                             st);
#pragma unroll
    for (int q = 0; q < 4; q++) b[q] = f_decode2<CB>(st[2 * q], st[2 * q + 1]);
}

/* The table of a wgmma form's kernel K<CB, BITS, MH> at one MH: [codebook][bits - 1] */
#define F_WG_BITS(K, CB, MH)                                                                       \
    {                                                                                              \
        K<CB, 1, MH>, K<CB, 2, MH>, K<CB, 3, MH>, K<CB, 4, MH>, K<CB, 5, MH>, K<CB, 6, MH>,        \
            K<CB, 7, MH>, K<CB, 8, MH>                                                             \
    }
#define F_WG_TABLE(K, MH)                                                                          \
    {                                                                                              \
        F_WG_BITS(K, 0, MH), F_WG_BITS(K, 1, MH), F_WG_BITS(K, 2, MH)                              \
    }

/* What both wgmma kernels' launches check first: the arguments (else cudaErrorInvalidValue)
 * and wgmma in the loaded GPU code (else cudaErrorNotSupported); 0 where both hold */
int muse_k_fast_wg_check(int mh, int cb, int bits);
/* The wgmma form's launch (linear_fast_wg.cu): blocks of 64 * mh rows (mh 1 or 2) and 128
 * columns, the bits of k_fast_product's. Returns the CUDA error; cudaErrorNotSupported where
 * the GPU code has no wgmma (not sm_90a). */
int muse_k_fast_product_wg(const fast_prod *p, int mh, int cb, int bits, long blocks,
                           cudaStream_t st);
/* The same blocks and bits with the warps specialized (linear_fast_ws.cu): one persistent block
 * of 384 threads an SM taking the blocks in turn, decode warps handing stages to a multiplying
 * warpgroup by mbarriers. */
int muse_k_fast_product_ws(const fast_prod *p, int mh, int cb, int bits, long blocks,
                           cudaStream_t st);
/* The same bits with the weights as wgmma's register operand (linear_fast_wr.cu): blocks of 64 *
 * nh rows (nh 1, 2 or 4) and 128 columns, two warpgroups, no shared memory for the decoded
 * weights. fused (nh 1 or 2): the grid has no split (each linear's blocks nblk * mgroups from
 * its blk0) and a block runs every split, leaving a linear of 2 splits or more summed as the
 * finish's muse_fast_fin.dsum. */
int muse_k_fast_product_wr(const fast_prod *p, int nh, int fused, int cb, int bits, long blocks,
                           cudaStream_t st);
/* The device's SMs, asked once a process (first outside a graph capture: muse_k_linear_fast_wg) */
int muse_k_fast_ws_sms(void);

#endif
