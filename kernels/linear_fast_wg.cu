/* linear_fast_wg: the fast EXL3 product's step 2 on wgmma (sm_90a) for blocks of 64 or 128 rows,
 * the prompt's: t = a Wq with the bits of linear_fast.cu's mma.sync form, so a prompt row still
 * equals the same row decoded alone (mma-probe on the H200: the two instructions give equal fp32
 * bits over any k chain from the same accumulators). A block is one warpgroup, 64 * MH rows x 128
 * columns x one k split (the split, the block's column range and the partials are
 * linear_fast.cu's). Stages of 4 k-tiles (A rows and the trellis) come by cp.async, two ahead in
 * three buffers; each k-tile the 4 warps decode the block's 8 trellis tiles (2 a warp, the same
 * decode) into fp16 in shared memory, and MH wgmma m64n128k16 read A and B from there while the
 * warps go on to decode the next k-tile. A and B sit in 128-byte swizzled rows (linear_fast.h).
 * A column's chain: its split's k-tiles in ascending order from zeroed accumulators, as the
 * mma.sync form's. */
#include <cuda_fp16.h>

#include "linear_fast_prod.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

#define WG_KC   4     /* k-tiles a stage: 64 k, one 128-byte row */
#define WG_BUF  3     /* stage buffers: stage s + 2 loads from s's third k-tile on */
#define WG_BDEC 2     /* decoded-B stage buffers */
#define WG_B_ST 16384 /* bytes of a stage's decoded B: 128 columns x 64 k */
#define WG_HALF 8192  /* bytes of 64 rows of a stage's A */

__device__ const int k_wg_built =
#ifdef WG_ON
    1;
#else
    0;
#endif

/* step 2 in wgmma form: grid as k_fast_product's (blocks of 64 * MH rows), 128 threads */
template <int CB, int BITS, int MH>
__global__ void __launch_bounds__(128) k_fast_product_wg(fast_prod p)
{
#ifdef WG_ON
    constexpr int ROWS = 64 * MH;
    constexpr int A_ST = MH * WG_HALF;  /* a stage's A: ROWS x 64 fp16 */
    constexpr int T_KT = 8 * 32 * BITS; /* a k-tile's trellis: 8 tiles of 32 * BITS bytes */
    constexpr int ST_BYTES = A_ST + WG_KC * T_KT; /* a multiple of 1024 */
    extern __shared__ __align__(128) unsigned char w_raw[];
    /* the swizzle's atoms are 1024-aligned: the buffers from the first such address */
    unsigned char *const w_sm = w_raw + ((1024 - k_smem(w_raw) % 1024) % 1024);
    unsigned char *const bdec = w_sm + WG_BUF * ST_BYTES;
    K_PDL_NEXT();
    int li, mg, sp, nb;
    f_place(p, blockIdx.x, li, mg, sp, nb);
    const fast_lin &L = p.l[li];
    int64_t ntiles = L.n / 16;
    int64_t kt0 = f_split_at(L, sp), kt1 = f_split_at(L, sp + 1);
    long R = p.R, m0 = (long)mg * ROWS, rend = R;
    const uint16_t *trellis = L.trellis;
    int64_t tiles_ld = L.tiles_ld;
    bool aligned = L.aligned;
    if (L.descs && !f_group_take(p, L, mg, ntiles, trellis, tiles_ld, aligned, m0, rend)) return;
    rend = rend < m0 + ROWS ? rend : m0 + ROWS;
    const int64_t tn0 = (int64_t)nb * 8;
    const int th = threadIdx.x, warp = th / 32, lane = th % 32;
    const int kt_n = (int)(kt1 - kt0), nstages = (kt_n + WG_KC - 1) / WG_KC;

    /* A: thread th stages chunk th % 8 (k 8 (th % 8) ..) of rows th / 8 + 16 i (row % 8 the
     * same for every i); its shared places and row validity set once */
    constexpr int A_PER = ROWS / 16;
    const int a_ch = th % 8, a_row = th / 8;
    const uint16_t *a_src = L.a + (m0 + a_row) * L.k + kt0 * 16 + a_ch * 8;
    const int a_dst = muse_fast_wg_off(a_row, a_ch);
    unsigned a_ok = 0;
#pragma unroll
    for (int i = 0; i < A_PER; i++) a_ok |= (unsigned)(m0 + a_row + 16 * i < rend) << i;
    /* trellis: a stage's WG_KC k-tiles x 8 tiles, 16-byte chunks th + 128 i */
    constexpr int CH_KT = 16 * BITS; /* chunks of a k-tile's 8 tiles */
    constexpr int B_CH = WG_KC * CH_KT;
    constexpr int B_PER = (B_CH + 127) / 128;
    const uint16_t *b_src[B_PER];
    int b_kk[B_PER];
    bool b_ok[B_PER];
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
        int c = th + 128 * i, kk = c / CH_KT, ch = c % CH_KT;
        b_ok[i] = (B_CH % 128 == 0 || c < B_CH) && tn0 + ch / (2 * BITS) < ntiles;
        b_kk[i] = kk;
        b_src[i] = trellis + ((kt0 + kk) * tiles_ld + tn0) * 16 * BITS + (int64_t)ch * 8;
    }
    const int64_t b_step = (int64_t)WG_KC * tiles_ld * 16 * BITS;

    auto load_a = [&](int st) {
        unsigned char *as = w_sm + (st % WG_BUF) * ST_BYTES;
        bool k_ok = st * WG_KC + a_ch / 2 < kt_n;
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            bool ok = (a_ok >> i & 1) && k_ok;
            const uint16_t *src = a_src + (int64_t)st * WG_KC * 16 + (int64_t)16 * i * L.k;
            k_cp16(as + a_dst + 16 * 128 * i, ok ? src : L.a, ok);
        }
    };
    auto load_b = [&](int st) {
        unsigned char *ts = w_sm + (st % WG_BUF) * ST_BYTES + A_ST;
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            int c = th + 128 * i;
            if (B_CH % 128 != 0 && c >= B_CH) break;
            bool ok = b_ok[i] && st * WG_KC + b_kk[i] < kt_n;
            const uint16_t *src = b_src[i] + (int64_t)st * b_step;
            if (aligned) {
                k_cp16(ts + c * 16, ok ? src : trellis, ok);
            } else { /* a 2-byte aligned trellis: plain loads, seen after the stage's barrier */
                uint32_t *dst = (uint32_t *)(ts + c * 16);
                for (int q = 0; q < 4; q++)
                    dst[q] = ok ? (uint32_t)src[2 * q] | (uint32_t)src[2 * q + 1] << 16 : 0;
            }
        }
    };

    float acc[MH][64];
#pragma unroll
    for (int h = 0; h < MH; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) acc[h][i] = 0.0f;

    /* the lane's word places in a tile (every tile) with its warp's first tile folded in */
    int l_widx[3], l_sh, l_wo[3];
    muse_fast_lane_words(BITS, muse_fast_nwords(BITS), lane, l_widx, &l_sh);
#pragma unroll
    for (int i = 0; i < 3; i++) l_wo[i] = warp * 2 * 8 * BITS + l_widx[i];
    int s_off[4]; /* the lane's decoded words at k-tile 0 of its warp's first tile: the second
                   * tile 16 rows (2048 bytes) on, k-tile kk at chunk ^ 2 kk (row % 8 the same) */
#pragma unroll
    for (int q = 0; q < 4; q++) s_off[q] = muse_fast_wg_b_off(2 * warp, q, lane, 0);

    /* prologue: stages 0 and 1 (a plain product's trellis before the wait); groups {B0, B1,
     * A0}, {A1}: stage s lands with group s */
    if (!L.descs)
        for (int st = 0; st < 2; st++)
            if (st < nstages) load_b(st);
    K_PDL_WAIT();
    for (int st = 0; st < 2; st++) {
        if (st < nstages) {
            if (L.descs) load_b(st);
            load_a(st);
        }
        k_cp_commit();
    }
    const uint32_t sm0 = k_smem(w_sm), bd0 = k_smem(bdec);
    int st = 0, kk = 0;
    for (int kt = 0; kt < kt_n; kt++) {
        if (kk == 0) {
            k_cp_wait<1>();
            __syncthreads();  /* stage st landed for every thread */
        } else if (kk == 2) { /* stage st - 1's buffer: its last wgmma (kt - 3) done in every
                                 warp (the wait and the barrier of k-tile kt - 1) */
            if (st + 2 < nstages) {
                load_b(st + 2);
                load_a(st + 2);
            }
            k_cp_commit();
        }
        const unsigned char *ts = w_sm + (st % WG_BUF) * ST_BYTES + A_ST + kk * T_KT;
        uint32_t bf[2][4];
#pragma unroll
        for (int t = 0; t < 2; t++)
            f_tile_frag_at<CB, BITS>((const uint32_t *)ts + t * 8 * BITS, l_wo, l_sh, bf[t]);
        wg_wait<1>(); /* this warp's wgmma of k-tile kt - 2 done */
        /* stage st's decoded B buffer last held stage st - 2's, long read */
        unsigned char *bd = bdec + (st % WG_BDEC) * WG_B_ST;
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                *(uint32_t *)(bd + (s_off[q] ^ (32 * kk)) + 2048 * t) = bf[t][q];
        wg_fence_smem();
        __syncthreads(); /* every warp's part of k-tile kt written; k-tile kt - 2's wgmma done */
        wg_fence();
        const uint32_t a_at = sm0 + (st % WG_BUF) * ST_BYTES + 32 * kk;
        const uint64_t db = wg_desc(bd0 + (st % WG_BDEC) * WG_B_ST + 32 * kk);
        wg_mma(acc[0], wg_desc(a_at), db);
        /* the second 64 rows even where they hold none: a wgmma under a branch made ptxas fence
         * every wgmma of the loop (C7519) */
        if (MH == 2) wg_mma(acc[MH - 1], wg_desc(a_at + WG_HALF), db);
        wg_commit();
        if (++kk == WG_KC) kk = 0, st++;
    }
    wg_wait<0>();
    k_cp_wait<0>();

    /* d[4 i + j]: column 8 i + 2 (lane % 4) + (j & 1) of row 16 warp + lane / 4 + 8 (j >> 1) */
#pragma unroll
    for (int h = 0; h < MH; h++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            long row = m0 + 64 * h + 16 * warp + lane / 4 + 8 * half;
            if (row >= rend) continue;
            float *prow = L.part + ((long)sp * R + row) * L.n + tn0 * 16 + 2 * (lane % 4);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                if (tn0 + i / 2 >= ntiles) continue;
                *(float2 *)(prow + 8 * i) =
                    make_float2(acc[h][4 * i + 2 * half], acc[h][4 * i + 2 * half + 1]);
            }
        }
#endif
}

typedef void (*wg_fn)(fast_prod);
static const wg_fn wg_prod[2][3][8] = {F_WG_TABLE(k_fast_product_wg, 1),
                                       F_WG_TABLE(k_fast_product_wg, 2)};

static int wg_smem(int mh, int bits)
{
    return WG_BUF * (mh * WG_HALF + WG_KC * 8 * 32 * bits) + WG_BDEC * WG_B_ST + 1024;
}

MUSE_K_API int muse_k_linear_fast_wg(void)
{
    static const int ok = [] {
        int v = 0;
        (void)muse_k_fast_ws_sms(); /* its launches' grid, asked here too: outside any capture */
        return cudaMemcpyFromSymbol(&v, k_wg_built, sizeof v) == cudaSuccess && v == 1;
    }();
    return ok;
}

int muse_k_fast_wg_check(int mh, int cb, int bits)
{
    if (mh < 1 || mh > 2 || cb < 0 || cb > 2 || bits < 1 || bits > 8)
        return (int)cudaErrorInvalidValue;
    return muse_k_linear_fast_wg() ? 0 : (int)cudaErrorNotSupported;
}

int muse_k_fast_product_wg(const fast_prod *p, int mh, int cb, int bits, long blocks,
                           cudaStream_t st)
{
    int err = muse_k_fast_wg_check(mh, cb, bits);
    if (err) return err;
    wg_fn fn = wg_prod[mh - 1][cb][bits - 1];
    int smem = wg_smem(mh, bits);
    err = (int)cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem);
    if (err) return err;
    return k_launch(fn, (unsigned)blocks, 128, (size_t)smem, st, *p);
}
