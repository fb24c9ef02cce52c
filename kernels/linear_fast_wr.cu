/* linear_fast_wr: the fast EXL3 product's step 2 on wgmma (sm_90a) with the weights as the
 * register operand: t^T = Wq^T a^T, so the trellis tile a warp decodes is already the A fragment
 * of its 16 rows of a wgmma m64nNk16 (muse_fast_lane_element's states 0,1 / 4,5 / 2,3 / 6,7) and
 * never goes through shared memory, and the rows of `a` are its B operand (K-major rows in the
 * 128-byte swizzle of linear_fast.h). A block is two warpgroups, 128 columns (warp w decodes the
 * block's tile w, as the mma.sync form's warps do) x 64 * NH rows x one k split (the split, the
 * block's place and the partials are linear_fast.cu's), or every split in turn (MODE 1, fused,
 * off by default: slower on the H200), or (MODE 2) one split of a cluster that holds every split
 * of its columns (and SWIGLU's up beside the gate), which sums the partials through distributed
 * shared memory and finishes them as the finish kernel does (linear_fast_fin.cuh: the same
 * expressions in the same order, so the same bits), no partials out and back and no finish
 * launch. Stages of 4 k-tiles (rows and trellis)
 * come by cp.async two ahead in four buffers, with one barrier a stage; each k-tile a warp
 * decodes its tile while the wgmma of the two k-tiles before run. A column's chain: its split's
 * k-tiles in ascending order from zeroed accumulators, as the other forms' (the products a*w and
 * their k order are the same whichever operand holds the weights). */
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <string.h>

#include "linear_fast_fin.cuh"
#include "linear_fast_prod.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

#define WR_KC      4   /* k-tiles a stage: 64 k, one 128-byte row */
#define WR_BUF     4   /* stage buffers: stage s + 2 loads as stage s begins */
#define WR_THREADS 256 /* two warpgroups, 64 columns each */

/* a stage buffer: the rows (64 * nh x 64 k fp16), then the trellis of its 4 k-tiles (8 tiles of
 * 32 * bits bytes each): linear_fast.h's muse_fast_wr_buf, constant here */
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
/* MODE 2's partial tile [64 nh][MUSE_FAST_WR_PS] fp32 takes the stage buffers' place once they
 * are done (t/unit/test_linear_fast.c checks every nh and bits; the largest tile here) */
static_assert(4 * 64 * MUSE_FAST_WR_PS * 4 <= WR_BUF * wr_buf(4, 1), "the tile fits the buffers");

/* acc += A B over the block's 64 * NH rows: B's rows from shared address xs (128 bytes a row) */
template <int NH>
__device__ __forceinline__ void wr_mma(float *acc, const uint32_t a[4], uint32_t xs)
{
    if (NH == 1) wg_mma_rs64(acc, a, wg_desc(xs));
    if (NH >= 2) wg_mma_rs(acc, a, wg_desc(xs));
    if (NH == 3) wg_mma_rs64(acc + 64, a, wg_desc(xs + 128 * 128)); /* rows 128 .. 191 */
    if (NH == 4) wg_mma_rs(acc + 64, a, wg_desc(xs + 128 * 128));
}

/* a place in the block's k: split s (of [s, s_end)), its k-tiles [kt, end) left, stage by stage */
struct wr_cur {
    int s, kt, end;
};

/* step 2: grid as k_fast_product's (blocks of 64 * NH rows), WR_THREADS threads. MODE 1
 * (fused): no split in the grid; a block runs every split of its columns in turn (the loads
 * going on across them) and sums their partials as the finish would (muse_fast_fin_groups: a
 * group's sum in shared memory, the groups' in the partials' place as [R][n] double, which the
 * finish reads). MODE 2: clusters of p.clu blocks, a cluster the splits of one 128-column block
 * of rows (p.clu_per linears: 2 for SWIGLU, the gate's splits then the up's), rank the split
 * fastest; f is the finish's, which then is not launched. */
template <int CB, int BITS, int NH, int MODE>
__global__ void __launch_bounds__(WR_THREADS, NH >= 3 || MODE == 1 ? 1 : 2)
    k_fast_product_wr(fast_prod p, muse_fast_fin f)
{
#ifdef WG_ON
    constexpr int FUSED = MODE == 1;
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
    } else if (MODE == 2) { /* the cluster's rank: its split (and SWIGLU's linear) */
        int lq;
        li = 0;
        if (p.clu_per == 1)
            while (li + 1 < p.n_lin && (long)blockIdx.x >= p.l[li + 1].blk0) li++;
        muse_fast_cl_place((long)blockIdx.x - p.l[li].blk0, p.clu_per, p.l[0].splits, p.mgroups,
                           &lq, &sp, &mg, &nb);
        li += lq; /* SWIGLU: li 0, lq the gate's 0 or the up's 1 */
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
        if (MODE == 2) {
            /* the cluster epilogue below */
        } else if (!FUSED || S == 1) { /* split s's partial (fused, one split: the only one) */
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
    if (MODE == 2) {
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        const int C = p.clu, rank = (int)cl.block_rank(), S = L.splits, G = f_fin_groups(S);
        const int lin0 = p.clu_per == 2 ? 0 : li;
        const int64_t j0 = (int64_t)nb * HAD;
        float *const pt = (float *)w_sm; /* [ROWS][MUSE_FAST_WR_PS]: this split's partial tile */
        __syncthreads();                 /* every warp's wgmma and loads of the buffers done */
#pragma unroll
        for (int e = 0; e < 32 * NH; e++) pt[muse_fast_wr_tile_at(e, lane, warp)] = acc[e];
        /* the finish's constants of the block's columns, loaded (the accumulators
         * stored) before the wait for the other splits: a linear's, or (grouped) the expert's whose rows the m-group holds */
        const int ex = f.grouped ? f.g.sel[f.g.perm[m0]] : 0;
        float sc[2][4], bs[2][4], nsc[4] = {0, 0, 0, 0};
        bool has_bias[2] = {false, false};
#pragma unroll
        for (int ql = 0; ql < 2; ql++) {
            if (ql >= p.clu_per) break;
            const int lq = lin0 + ql;
            const bool next = f.na && ql == 0;
            float tn[4];
            if (f.grouped) {
                const muse_k_lin *d = f.g.descs[lq] + ex, *nd = next ? f.nd_descs + ex : NULL;
                has_bias[ql] = d->bias != NULL;
                f_load_consts(d->svh, d->sv, d->bias, nd ? nd->suh : NULL, nd ? nd->su : NULL,
                              next, j0 + 4 * lane, sc[ql], bs[ql], tn);
            } else {
                has_bias[ql] = f.d[lq].bias != NULL;
                f_load_consts(f.d[lq].svh, f.d[lq].sv, f.d[lq].bias, f.nd.suh, f.nd.su, next,
                              j0 + 4 * lane, sc[ql], bs[ql], tn);
            }
            if (next)
#pragma unroll
                for (int q = 0; q < 4; q++) nsc[q] = tn[q];
        }
        cl.sync(); /* every split's tile written (and seen: release / acquire) */
        /* warp rank * 8 + warp of the cluster finishes rows lr of the block, as the finish's
         * lead warp of that row's block does: the groups in order, each from its first split */
        for (int lr = rank * 8 + warp; lr < (int)(rend - m0); lr += C * 8) {
            const long r = m0 + lr, out_row = f.grouped ? f.g.perm[r] : r;
            float o[4], u[4] = {0, 0, 0, 0};
#pragma unroll
            for (int ql = 0; ql < 2; ql++) { /* registers throughout: no array by a pointer */
                if (ql >= p.clu_per) break;
                double v[4];
                for (int g = 0; g < G; g++) {
                    double gs[4] = {0, 0, 0, 0};
                    for (int s = S * g / G; s < S * (g + 1) / G; s++) {
                        const float *src =
                            cl.map_shared_rank(pt, ql * S + s) + lr * MUSE_FAST_WR_PS + 4 * lane;
                        float4 q4 = *(const float4 *)src;
                        gs[0] += (double)q4.x;
                        gs[1] += (double)q4.y;
                        gs[2] += (double)q4.z;
                        gs[3] += (double)q4.w;
                    }
#pragma unroll
                    for (int q = 0; q < 4; q++) v[q] = g ? v[q] + gs[q] : gs[q];
                }
                float t[4];
                f_finish_vals(v, sc[ql], bs[ql], has_bias[ql], lane, t);
                if (ql)
#pragma unroll
                    for (int q = 0; q < 4; q++) u[q] = t[q];
                else
#pragma unroll
                    for (int q = 0; q < 4; q++) o[q] = t[q];
            }
            f_fin_out(f, p.clu_per == 2, lin0, r, out_row, nb, j0, lane, o, u, 1, nsc);
        }
        cl.sync(); /* no block leaves while another still reads its tile */
    }
#endif
}

typedef void (*wr_fn)(fast_prod, muse_fast_fin);
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
/* [nh 1, 2, 4; then nh 1, 2 with the splits fused; then nh 1, 2, 4 in clusters; then nh 3
 * (the MoE's groups of 192 rows), alone and in clusters][codebook][bits - 1] */
static const wr_fn wr_prod[10][3][8] = {WR_TABLE(1, 0), WR_TABLE(2, 0), WR_TABLE(4, 0),
                                        WR_TABLE(1, 1), WR_TABLE(2, 1), WR_TABLE(1, 2),
                                        WR_TABLE(2, 2), WR_TABLE(4, 2), WR_TABLE(3, 0),
                                        WR_TABLE(3, 2)};

int muse_k_fast_product_wr(const fast_prod *p, const muse_fast_fin *f, int nh, int fused, int cb,
                           int bits, long blocks, cudaStream_t st)
{
    if (nh < 1 || nh > 4 || (fused && nh > 2) || (fused && p->clu) ||
        (p->clu && (!f || p->clu > 8 || blocks % p->clu)))
        return (int)cudaErrorInvalidValue;
    int err = muse_k_fast_wg_check(1, cb, bits);
    if (err) return err;
    int row = nh == 3 ? (p->clu ? 9 : 8)
              : p->clu ? 5 + (nh == 4 ? 2 : nh - 1)
              : fused  ? 2 + nh
              : nh == 4 ? 2
                        : nh - 1;
    wr_fn fn = wr_prod[row][cb][bits - 1];
    int smem = wr_smem(nh, bits, fused);
    err = (int)cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem);
    if (err) return err;
    muse_fast_fin none;
    if (!f) memset(&none, 0, sizeof none);
    return k_launch_cluster(fn, (unsigned)blocks, WR_THREADS, (size_t)smem, st, (unsigned)p->clu,
                            *p, f ? *f : none);
}
