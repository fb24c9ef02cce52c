/* linear_fast_wr: the fast EXL3 product's step 2 on wgmma (sm_90a) with the weights as the
 * register operand: t^T = Wq^T a^T, so the trellis tile a warp decodes is already the A fragment
 * of its 16 rows of a wgmma m64nNk16 (muse_fast_lane_element's states 0,1 / 4,5 / 2,3 / 6,7) and
 * never goes through shared memory, and the rows of `a` are its B operand (K-major rows in the
 * 128-byte swizzle of linear_fast.h). A block is two warpgroups, 128 columns (warp w decodes the
 * block's tile w, as the mma.sync form's warps do) x 64 * NH rows x one k split (the split, the
 * block's place and the partials are linear_fast.cu's), or every split in turn (FUSED, off by
 * default: slower on the H200). Stages of 4 k-tiles (rows and trellis)
 * come by cp.async two ahead in four buffers, with one barrier a stage; each k-tile a warp
 * decodes its tile while the wgmma of the two k-tiles before run. A column's chain: its split's
 * k-tiles in ascending order from zeroed accumulators, as the other forms' (the products a*w and
 * their k order are the same whichever operand holds the weights). */
#include <cuda_fp16.h>

#include "linear_fast_prod.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

#define WR_KC      4   /* k-tiles a stage: 64 k, one 128-byte row */
#define WR_BUF     4   /* stage buffers: stage s + 2 loads as stage s begins */
#define WR_THREADS 256 /* two warpgroups, 64 columns each */

/* a stage buffer: the rows (64 * nh x 64 k fp16), then the trellis of its 4 k-tiles (8 tiles of
 * 32 * bits bytes each): both multiples of 1024 bytes, the swizzle's atoms */
__host__ __device__ constexpr int wr_buf(int nh, int bits)
{
    return nh * 8192 + WR_KC * 8 * 32 * bits;
}
/* the launch's dynamic shared memory: the buffers, the fused splits' group sums (a double for
 * each of a thread's accumulators), the alignment's slack */
static int wr_smem(int nh, int bits, int fused)
{
    return WR_BUF * wr_buf(nh, bits) + (fused ? 32 * nh * WR_THREADS * 8 : 0) + 1024;
}

/* acc += A B over the block's 64 * NH rows: B's rows from shared address xs (128 bytes a row) */
template <int NH>
__device__ __forceinline__ void wr_mma(float *acc, const uint32_t a[4], uint32_t xs)
{
    if (NH == 1) wg_mma_rs64(acc, a, wg_desc(xs));
    if (NH >= 2) wg_mma_rs(acc, a, wg_desc(xs));
    if (NH == 4) wg_mma_rs(acc + 64, a, wg_desc(xs + 128 * 128));
}

/* a place in the block's k: split s (of [s, s_end)), its k-tiles [kt, end) left, stage by stage */
struct wr_cur {
    int s, kt, end;
};

/* step 2: grid as k_fast_product's (blocks of 64 * NH rows), WR_THREADS threads. FUSED: no
 * split in the grid; a block runs every split of its columns in turn (the loads going on across
 * them) and sums their partials as the finish would (muse_fast_fin_groups: a group's sum in
 * shared memory, the groups' in the partials' place as [R][n] double, which the finish reads) */
template <int CB, int BITS, int NH, int FUSED>
__global__ void __launch_bounds__(WR_THREADS, NH == 4 || FUSED ? 1 : 2)
    k_fast_product_wr(fast_prod p)
{
#ifdef WG_ON
    constexpr int ROWS = 64 * NH;
    constexpr int X_ST = ROWS * 128;    /* a stage's rows */
    constexpr int T_KT = 8 * 32 * BITS; /* a k-tile's trellis */
    constexpr int ST_BYTES = wr_buf(NH, BITS);
    extern __shared__ __align__(128) unsigned char w_raw[];
    unsigned char *const w_sm = w_raw + ((1024 - k_smem(w_raw) % 1024) % 1024);
    K_PDL_NEXT();
    int li, mg, sp, nb;
    if (FUSED) { /* the grid runs m-groups fastest, then 128-column blocks */
        li = 0;
        while (li + 1 < p.n_lin && (long)blockIdx.x >= p.l[li + 1].blk0) li++;
        uint32_t local = (uint32_t)((long)blockIdx.x - p.l[li].blk0);
        nb = (int)muse_fast_divq(local, p.mg_div), mg = (int)(local - nb * (uint32_t)p.mgroups);
        sp = 0;
    } else {
        f_place(p, blockIdx.x, li, mg, sp, nb);
    }
    const fast_lin &L = p.l[li];
    const uint16_t *const a_base = L.a;
    float *const part = L.part;
    const int64_t k = L.k, n = L.n, kt_all = k / 16, ntiles = n / 16;
    const int S = L.splits, s_end = FUSED ? S : sp + 1;
    long R = p.R, m0 = (long)mg * ROWS, rend = R;
    const uint16_t *trellis = L.trellis;
    int64_t tiles_ld = L.tiles_ld;
    bool aligned = L.aligned;
    if (L.descs && !f_group_take(p, L, mg, ntiles, trellis, tiles_ld, aligned, m0, rend)) return;
    rend = rend < m0 + ROWS ? rend : m0 + ROWS;
    const int64_t tn0 = (int64_t)nb * 8;
    const int th = threadIdx.x, warp = th / 32, lane = th % 32;
    const int kt_all32 = (int)kt_all; /* k / 16 * splits fits in 32 bits (k < 2^20) */
    auto split_at = [&](int s) {      /* muse_fast_split_begin in 32 bits */
                                 wr_cur c;
                                 c.s = s;
                                 c.kt = kt_all32 * s / S;
                                 c.end = kt_all32 * (s + 1) / S;
                                 return c;
    };
    auto step = [&](wr_cur &c) { /* the next stage: on in the split, else the next split */
                                 c.kt += WR_KC;
                                 if (c.kt >= c.end && c.s < s_end) c = split_at(c.s + 1);
    };

    /* rows: thread th stages chunk th % 8 (k 8 (th % 8) ..) of rows th / 8 + 32 i (row % 8 the
     * same for every i); its places and row validity set once */
    constexpr int X_PER = ROWS / 32;
    const int x_ch = th % 8, x_row = th / 8;
    const uint16_t *const x_src = a_base + (m0 + x_row) * k + x_ch * 8;
    const int x_dst = muse_fast_wg_off(x_row, x_ch);
    unsigned x_ok = 0;
#pragma unroll
    for (int i = 0; i < X_PER; i++) x_ok |= (unsigned)(m0 + x_row + 32 * i < rend) << i;
    /* trellis: a stage's WR_KC k-tiles x 8 tiles, 16-byte chunks th + WR_THREADS i */
    constexpr int CH_KT = 16 * BITS; /* chunks of a k-tile's 8 tiles */
    constexpr int B_CH = WR_KC * CH_KT;
    constexpr int B_PER = (B_CH + WR_THREADS - 1) / WR_THREADS;
    const uint16_t *b_src[B_PER];
    unsigned b_ok = 0; /* bit i: chunk i's tile is a column of the linear */
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
        int c = th + WR_THREADS * i, kk = c / CH_KT, ch = c % CH_KT;
        b_ok |= (unsigned)((B_CH % WR_THREADS == 0 || c < B_CH) && tn0 + ch / (2 * BITS) < ntiles)
                << i;
        b_src[i] = trellis + (kk * tiles_ld + tn0) * 16 * BITS + (int64_t)ch * 8;
    }
    const int64_t b_kt = tiles_ld * 16 * BITS; /* a k-tile's step in the trellis */

    /* stage c's rows and trellis into buffer buf: a chunk loads iff its k-tile is in the split */
    auto load_x = [&](const wr_cur &c, int buf) {
        unsigned char *xs = w_sm + buf * ST_BYTES;
        bool k_ok = c.kt + x_ch / 2 < c.end;
#pragma unroll
        for (int i = 0; i < X_PER; i++) {
            bool ok = (x_ok >> i & 1) && k_ok;
            const uint16_t *src = x_src + (int64_t)c.kt * 16 + (int64_t)32 * i * k;
            k_cp16(xs + x_dst + 32 * 128 * i, ok ? src : a_base, ok);
        }
    };
    auto load_b = [&](const wr_cur &c, int buf) {
        unsigned char *ts = w_sm + buf * ST_BYTES + X_ST;
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            int ci = th + WR_THREADS * i;
            if (B_CH % WR_THREADS != 0 && ci >= B_CH) break;
            bool ok = (b_ok >> i & 1) && c.kt + ci / CH_KT < c.end;
            const uint16_t *src = b_src[i] + (int64_t)c.kt * b_kt;
            if (aligned) {
                k_cp16(ts + ci * 16, ok ? src : trellis, ok);
            } else { /* a 2-byte aligned trellis: plain loads, seen after the stage's barrier */
                uint32_t *dst = (uint32_t *)(ts + ci * 16);
                for (int q = 0; q < 4; q++)
                    dst[q] = ok ? (uint32_t)src[2 * q] | (uint32_t)src[2 * q + 1] << 16 : 0;
            }
        }
    };

    float acc[32 * NH];
#pragma unroll
    for (int i = 0; i < 32 * NH; i++) acc[i] = 0.0f;

    /* the lane's word places in its warp's tile (tile `warp` of each k-tile's 8) */
    int l_widx[3], l_sh, l_wo[3];
    muse_fast_lane_words(BITS, muse_fast_nwords(BITS), lane, l_widx, &l_sh);
#pragma unroll
    for (int i = 0; i < 3; i++) l_wo[i] = warp * 8 * BITS + l_widx[i];

    /* acc[64 h + 4 i + j]: column 16 (tile) + lane / 4 + 8 (j >> 1) of the warp's tile, row
     * 128 h + 8 i + 2 (lane % 4) + (j & 1) of the block */
    const bool col_ok = tn0 + warp < ntiles && !p.skip_store;
    const int64_t col = (tn0 + warp) * 16 + lane / 4;
    auto row_of = [&](int i, int j) { return m0 + 8 * i + 2 * (lane % 4) + (j & 1); };

    /* prologue: stages 0 and 1 (a plain product's trellis before the wait); groups {B0, B1,
     * X0}, {X1}: stage g lands with group g */
    wr_cur ld = split_at(sp), c1 = ld;
    step(c1);
    if (!L.descs) {
        if (ld.s < s_end) load_b(ld, 0);
        if (c1.s < s_end) load_b(c1, 1);
    }
    K_PDL_WAIT();
    for (int i = 0; i < 2; i++) {
        if (ld.s < s_end) {
            if (L.descs) load_b(ld, i);
            load_x(ld, i);
            step(ld);
        }
        k_cp_commit();
    }
    const uint32_t sm0 = k_smem(w_sm);
    double *const gsum = (double *)(w_sm + WR_BUF * ST_BYTES); /* FUSED: [32 NH][WR_THREADS] */
    double *const tsum = (double *)part;                       /* FUSED: [R][n] */
    uint32_t af[2][4]; /* the A fragments of k-tiles kt (kt % 2): kt's wgmma reads them */
    int g = 0;         /* the block's stages so far: stage g in buffer g % WR_BUF */
/* unfused, the loop ends after split sp: its tail is unreached there by design (nvcc #128) */
#pragma nv_diag_suppress 128
    for (int s = sp;;) { /* unfused: split sp alone */
        const wr_cur cs = split_at(s);
        for (int kt = cs.kt; kt < cs.end; kt += WR_KC, g++) {
            k_cp_wait<1>();  /* this thread's part of stage g landed */
            wg_fence_smem(); /* ... and seen by the wgmma's async proxy */
            __syncthreads(); /* every thread's part; every warpgroup's wgmma of stage g - 2 done
                              * (each waits to one in flight before the next, the last of g - 1) */
            if (ld.s < s_end) {
                load_b(ld, (g + 2) % WR_BUF);
                load_x(ld, (g + 2) % WR_BUF);
                step(ld);
            }
            k_cp_commit();
            const uint32_t *ts = (const uint32_t *)(w_sm + (g % WR_BUF) * ST_BYTES + X_ST);
            const uint32_t xs = sm0 + (g % WR_BUF) * ST_BYTES;
            const int nkt = cs.end - kt; /* the stage's k-tiles: 4, or fewer in a split's last */
            /* every stage four wgmma (one under a branch made ptxas serialize them all, C7513):
             * past the split the weights are zero and the rows zero-filled, so the accumulators
             * (never -0: they start at +0 and products are multiples of 2^-48) are unchanged */
#pragma unroll
            for (int kk = 0; kk < WR_KC; kk++) {
                uint32_t b[4];
                f_tile_frag_at<CB, BITS>(ts + kk * (T_KT / 4), l_wo, l_sh, b);
                const uint32_t live = kk < nkt ? ~0u : 0u;
                wg_wait<1>(); /* the wgmma two k-tiles back, which read af[kk % 2], done */
#pragma unroll
                for (int a = 0; a < 4; a++) af[kk & 1][a] = b[muse_fast_wr_breg(a)] & live;
                wg_fence();
                wr_mma<NH>(acc, af[kk & 1], xs + 32 * kk);
                wg_commit();
            }
        }
        wg_wait<0>();
        if (!FUSED || S == 1) { /* split s's partial (fused, one split: the only one) */
            float *const ps = part + (long)(FUSED ? 0 : s) * R * n;
            if (col_ok)
#pragma unroll
                for (int e = 0; e < 32 * NH; e++) {
                    long row = row_of(e / 4, e % 4);
                    if (row < rend) ps[row * n + col + 8 * ((e % 4) >> 1)] = acc[e];
                }
        } else { /* the finish's order: a group's splits from 0, then the groups in order */
            const bool first = muse_fast_fin_first(S, s), last = muse_fast_fin_last(S, s);
            const bool lead = muse_fast_fin_group_of(S, s) == 0;
#pragma unroll
            for (int e = 0; e < 32 * NH; e++) {
                /* one element at a time (a compiler barrier each): hoisted, the loads of all
                 * 32 NH took the registers the loop needs (ptxas spilled) */
                asm volatile("" ::: "memory");
                double *gp = gsum + e * WR_THREADS + th;
                double v = (first ? 0.0 : *gp) + (double)acc[e];
                if (!last) {
                    *gp = v;
                    continue;
                }
                long row = row_of(e / 4, e % 4);
                if (!col_ok || row >= rend) continue;
                double *tp = tsum + row * n + col + 8 * ((e % 4) >> 1);
                *tp = lead ? v : *tp + v;
            }
        }
        if (!FUSED || ++s >= s_end) break;
#pragma unroll
        for (int i = 0; i < 32 * NH; i++) acc[i] = 0.0f;
    }
#pragma nv_diag_default 128
    k_cp_wait<0>();
#endif
}

typedef void (*wr_fn)(fast_prod);
#define WR_TABLE(NH, F)                                                                            \
    {                                                                                              \
        {k_fast_product_wr<0, 1, NH, F>, k_fast_product_wr<0, 2, NH, F>,                           \
         k_fast_product_wr<0, 3, NH, F>, k_fast_product_wr<0, 4, NH, F>,                           \
         k_fast_product_wr<0, 5, NH, F>, k_fast_product_wr<0, 6, NH, F>,                           \
         k_fast_product_wr<0, 7, NH, F>, k_fast_product_wr<0, 8, NH, F>},                          \
            {k_fast_product_wr<1, 1, NH, F>, k_fast_product_wr<1, 2, NH, F>,                       \
             k_fast_product_wr<1, 3, NH, F>, k_fast_product_wr<1, 4, NH, F>,                       \
             k_fast_product_wr<1, 5, NH, F>, k_fast_product_wr<1, 6, NH, F>,                       \
             k_fast_product_wr<1, 7, NH, F>, k_fast_product_wr<1, 8, NH, F>},                      \
            {k_fast_product_wr<2, 1, NH, F>, k_fast_product_wr<2, 2, NH, F>,                       \
             k_fast_product_wr<2, 3, NH, F>, k_fast_product_wr<2, 4, NH, F>,                       \
             k_fast_product_wr<2, 5, NH, F>, k_fast_product_wr<2, 6, NH, F>,                       \
             k_fast_product_wr<2, 7, NH, F>, k_fast_product_wr<2, 8, NH, F>},                      \
    }
/* [nh 1, 2, 4; then nh 1, 2 with the splits fused][codebook][bits - 1] */
static const wr_fn wr_prod[5][3][8] = {WR_TABLE(1, 0), WR_TABLE(2, 0), WR_TABLE(4, 0),
                                       WR_TABLE(1, 1), WR_TABLE(2, 1)};

int muse_k_fast_product_wr(const fast_prod *p, int nh, int fused, int cb, int bits, long blocks,
                           cudaStream_t st)
{
    if ((nh != 1 && nh != 2 && nh != 4) || (fused && nh == 4)) return (int)cudaErrorInvalidValue;
    int err = muse_k_fast_wg_check(1, cb, bits);
    if (err) return err;
    wr_fn fn = wr_prod[fused ? 2 + nh : nh == 4 ? 2 : nh - 1][cb][bits - 1];
    int smem = wr_smem(nh, bits, fused);
    err = (int)cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem);
    if (err) return err;
    return k_launch(fn, (unsigned)blocks, WR_THREADS, (size_t)smem, st, *p);
}
