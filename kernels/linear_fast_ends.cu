/* The fast EXL3 product's steps 1 and 3 (the tensor-core step 2 is kernels/linear_fast.cu):
 * the exact path's prepare and finish math (kernels/linear.cu k_exl3_prepare, k_exl3_finish),
 * written out again here with the same expressions, so `a` is bit for bit the exact path's and
 * the finish differs from it only by its input t (the fp32 split partials summed in split order
 * in double). Compiled with the Makefile's -fmad=false, like the exact path; the fp16
 * conversions are the hardware's (common.cuh: base/f16.h's bits but for a NaN's payload).
 * Weights (scales, bias) are loaded before the wait for the kernel before, a round's
 * activations after. The finish spreads a 128-column block over warps, for latency (it is a chain
 * at few rows): a warp a group of a linear's splits (f_fin_groups), SWIGLU's up in warps of its own
 * beside the gate's; group sums and the up's floats meet in shared memory, where one warp adds the
 * groups in group order and goes on. Which warp does a part never changes an operation or its
 * order. */
#include <stdlib.h>

#include "common.cuh"
#include "fast_rows.cuh"
#include "linear_fast.h"
#include "linear_fast_ends.cuh"
#include "pdl.cuh"

#define HAD 128

/* The 128-point Hadamard of a chunk held by a warp, lane l holding elements 4 l .. 4 l + 3 in
 * v: stages h = 1, 2 in the lane, h = 4 .. 64 pairing lane l with l ^ (h / 4); each stage forms
 * every element as k_hadamard128 does (the lower index a + b, the upper a - b of the same
 * pair), in double, so the result is that kernel's bit for bit with no block barrier. */
__device__ __forceinline__ void f_hadamard_warp(double v[4], int lane)
{
#pragma unroll
    for (int h = 1; h <= 2; h <<= 1) { /* partners in the lane: q and q ^ h */
        double w[4];
#pragma unroll
        for (int q = 0; q < 4; q++) w[q] = q & h ? v[q ^ h] - v[q] : v[q] + v[q ^ h];
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] = w[q];
    }
#pragma unroll
    for (int h = 4; h < HAD; h <<= 1) { /* partners across lanes: l and l ^ (h / 4) */
        /* o - v or v + o as one fma by -1 or 1: the same rounding of the same exact sum (and
         * zero's sign), where the two sums and a select took 2 fp64 ops and 2 selects */
        double sgn = (lane * 4) & h ? -1.0 : 1.0;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            double o = __shfl_xor_sync(0xffffffffu, v[q], h / 4);
            v[q] = fma(sgn, v[q], o);
        }
    }
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] *= 0.08838834764831844055;
}

/* The scales of elements i .. i + 3 of a linear (i a multiple of 4; h, s: suh and su, or svh
 * and sv): k_in_scale / k_out_scale's values, h's four halves in one 8-byte load where aligned,
 * else the sign word's four bits. */
__device__ __forceinline__ void f_scales4(const uint16_t *h, const uint16_t *s, int64_t i,
                                          float o[4])
{
    if (!h) {
        unsigned w = (unsigned)s[i >> 4] >> (i & 15); /* i % 16 is 0, 4, 8 or 12 */
#pragma unroll
        for (int q = 0; q < 4; q++) o[q] = (w >> q) & 1 ? -1.0f : 1.0f;
        return;
    }
    const uint16_t *p = h + i;
    uint32_t lo, hi;
    if (((uintptr_t)p & 7) == 0) {
        uint2 u = *(const uint2 *)p;
        lo = u.x, hi = u.y;
    } else {
        lo = p[0] | (uint32_t)p[1] << 16, hi = p[2] | (uint32_t)p[3] << 16;
    }
    o[0] = k_f16_to_f32_hw((uint16_t)lo), o[1] = k_f16_to_f32_hw((uint16_t)(lo >> 16));
    o[2] = k_f16_to_f32_hw((uint16_t)hi), o[3] = k_f16_to_f32_hw((uint16_t)(hi >> 16));
}

/* A chunk's a (ar: its first element) = fp16(fp32(blockHad(x * scale))), lane l given the x
 * elements 4 l .. 4 l + 3 and their input scales sc; one 8-byte store a lane (ar is a row of
 * the workspace's a, k a multiple of 128: 8-byte aligned). */
__device__ __forceinline__ void f_prepare_vals(const float x[4], const float sc[4], uint16_t *ar,
                                               int lane)
{
    double v[4];
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] = (double)__fmul_rn(x[q], sc[q]);
    f_hadamard_warp(v, lane);
    uint32_t h[4];
#pragma unroll
    for (int q = 0; q < 4; q++) h[q] = k_f32_to_f16_hw((float)v[q]);
    *(uint2 *)(ar + 4 * lane) = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
}

/* grid (ceil(k / 512), ceil(R / PR), n_lin), 128 threads: warp w of block (b, y) prepares
 * 128-chunk 4 b + w of rows y PR .. y PR + PR - 1, lane l elements 4 l .. 4 l + 3 of it; every
 * row's loads are issued before the first row's Hadamard (PR rows in flight), and a plain
 * linear's scales (weights: no kernel of the round writes them) before the wait. */
template <int PR>
__global__ void __launch_bounds__(128)
    k_fast_prepare(muse_fast_prep p, const float *x, long x_stride, long R)
{
    K_PDL_NEXT();
    int li = blockIdx.z, lane = threadIdx.x % 32;
    int64_t i0 = ((int64_t)blockIdx.x * 4 + threadIdx.x / 32) * HAD, e = i0 + 4 * lane;
    bool live = i0 < p.k;
    float sc[PR][4], xv[PR][4];
    if (live && !p.grouped) f_scales4(p.d[li].suh, p.d[li].su, e, sc[0]);
    K_PDL_WAIT();
    if (!live) return;
    long r0 = (long)blockIdx.y * PR, src[PR];
#pragma unroll
    for (int i = 0; i < PR; i++) src[i] = r0 + i < R ? r0 + i : r0; /* past R: row r0 again */
    if (!p.grouped)
#pragma unroll
        for (int i = 1; i < PR; i++)
#pragma unroll
            for (int q = 0; q < 4; q++) sc[i][q] = sc[0][q];
    /* a row's x (its loads issued with the grouped rows' descriptor loads) */
    auto load_x = [&] {
#pragma unroll
        for (int i = 0; i < PR; i++) {
            const float *xr = x + src[i] * x_stride + e;
            float4 f =
                k_fr_aligned(xr) ? *(const float4 *)xr : make_float4(xr[0], xr[1], xr[2], xr[3]);
            xv[i][0] = f.x, xv[i][1] = f.y, xv[i][2] = f.z, xv[i][3] = f.w;
        }
    };
    if (p.grouped) { /* row r of a is pair perm[r]: its input row and its expert */
        /* level by level over the rows, each level's loads in flight together: a chain of 4
         * loads (pair; expert and source row; descriptor and x; scales), not 2 a row */
        int32_t pair[PR], ex[PR];
        const uint16_t *suh[PR], *su[PR];
#pragma unroll
        for (int i = 0; i < PR; i++) pair[i] = p.g.perm[src[i]];
#pragma unroll
        for (int i = 0; i < PR; i++) {
            ex[i] = p.g.sel[pair[i]];
            src[i] = p.g.src ? p.g.src[pair[i]] : pair[i];
        }
#pragma unroll
        for (int i = 0; i < PR; i++) {
            const muse_k_lin *d = p.g.descs[li] + ex[i];
            suh[i] = d->suh, su[i] = d->su;
        }
        load_x();
#pragma unroll
        for (int i = 0; i < PR; i++) f_scales4(suh[i], su[i], e, sc[i]);
    } else {
        load_x();
    }
#pragma unroll
    for (int i = 0; i < PR; i++)
        if (r0 + i < R) f_prepare_vals(xv[i], sc[i], p.a[li] + (r0 + i) * p.k + i0, lane);
}

/* The finish's sum of a column's S split partials: muse_fast_fin_groups's groups, in double */
__host__ __device__ __forceinline__ int f_fin_groups(int splits)
{
    return muse_fast_fin_groups(splits);
}

/* The warps (units) a 128-column block of linear li takes in the finish: one a group of its
 * partials, and for SWIGLU (li the gate) one a group of the up's too: 1, 2, 4 or 8. */
__host__ __device__ __forceinline__ int f_fin_units(const muse_fast_fin &f, int li)
{
    int g = f_fin_groups(f.splits[li]);
    return f.epilogue == MUSE_K_EPI_SWIGLU ? g + f_fin_groups(f.splits[1]) : g;
}

/* A group holds at most this many splits for its partials to be loaded ahead (F_PRE float4 a
 * lane), before a grouped finish's chain of descriptor loads: the experts' 2 or 3 */
#define F_PRE 4

/* Group g of G of linear li's splits at partial row r: [s0, s1) */
__device__ __forceinline__ void f_group_range(const muse_fast_fin &f, int li, int g, int G, int &s0,
                                              int &s1)
{
    int S = f.splits[li];
    s0 = S * g / G, s1 = S * (g + 1) / G;
}

/* Loads group g's partials at columns j0 + 4 lane .. + 3 of partial row r into pre where they
 * are at most F_PRE and not summed by the product; returns how many (0: none loaded). */
__device__ __forceinline__ int f_group_pre(const muse_fast_fin &f, int li, long r, long R,
                                           int64_t j0, int lane, int g, int G, float4 pre[F_PRE])
{
    int s0, s1;
    f_group_range(f, li, g, G, s0, s1);
    if (f.dsum[li] || s1 - s0 > F_PRE) return 0;
    int64_t n = f.n[li];
    const float *pr = f.part[li] + r * n + j0 + 4 * lane;
#pragma unroll
    for (int i = 0; i < F_PRE; i++)
        if (i < s1 - s0) pre[i] = *(const float4 *)(pr + (long)(s0 + i) * R * n);
    return s1 - s0;
}

/* Group g of G's sum of linear li's partials at columns j0 + 4 lane .. + 3 of partial row r, by
 * one warp: splits [g S / G, (g + 1) S / G) in split order, in double (float4 loads, every
 * split's in flight; the npre of them in pre already loaded by f_group_pre). */
__device__ __forceinline__ void f_group_sum(const muse_fast_fin &f, int li, long r, long R,
                                            int64_t j0, int lane, int g, int G,
                                            const float4 pre[F_PRE], int npre, double gs[4])
{
    int64_t n = f.n[li];
    if (f.dsum[li]) { /* summed by the product (G is 1) */
        const double *ds = f.dsum[li] + r * n + j0 + 4 * lane;
        double2 a = *(const double2 *)ds, b = *(const double2 *)(ds + 2);
        gs[0] = a.x, gs[1] = a.y, gs[2] = b.x, gs[3] = b.y;
        return;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) gs[q] = 0;
    if (npre) {
#pragma unroll
        for (int i = 0; i < F_PRE; i++)
            if (i < npre) {
                gs[0] += (double)pre[i].x;
                gs[1] += (double)pre[i].y;
                gs[2] += (double)pre[i].z;
                gs[3] += (double)pre[i].w;
            }
        return;
    }
    int s0, s1;
    f_group_range(f, li, g, G, s0, s1);
    const float *pr = f.part[li] + r * n + j0 + 4 * lane;
#pragma unroll 4
    for (int sp = s0; sp < s1; sp++) {
        float4 p = *(const float4 *)(pr + (long)sp * R * n);
        gs[0] += (double)p.x;
        gs[1] += (double)p.y;
        gs[2] += (double)p.z;
        gs[3] += (double)p.w;
    }
}

/* Columns j0 + 4 lane .. + 3 after step 3 from their summed partials v, by one warp: the
 * Hadamard across the warp, the output scales sc and (has_bias) the bias bs. */
__device__ __forceinline__ void f_finish_vals(double v[4], const float sc[4], const float bs[4],
                                              bool has_bias, int lane, float out[4])
{
    f_hadamard_warp(v, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        double s = v[q] * (double)sc[q];
        if (has_bias) s += (double)bs[q];
        out[q] = (float)s;
    }
}

/* A finishing lane's per-column constants (weights, loaded before the partials): the output
 * scales sc and bias bs (has_bias) of columns j .. j + 3 of a linear, and (next) the next
 * linear's input scales nsc there. */
__device__ __forceinline__ void f_load_consts(const uint16_t *svh, const uint16_t *sv,
                                              const uint16_t *bias, const uint16_t *nsuh,
                                              const uint16_t *nsu, bool next, int64_t j,
                                              float sc[4], float bs[4], float nsc[4])
{
    f_scales4(svh, sv, j, sc);
    if (bias) f_scales4(bias, NULL, j, bs); /* its halves, as the scales' */
    if (next) f_scales4(nsuh, nsu, j, nsc);
}

/* SWIGLU's silu of the gate, which the finish rounds to fp16 first: in double as swiglu.cu */
__device__ __forceinline__ float f_silu(double gv)
{
    return (float)(gv / (1.0 + exp(-gv)));
}

/* f_silu of every fp16 value, by its bits: filled on each device by muse_k_linear_fast_init with
 * f_silu itself, so a lookup is the computation's bits. Rounds of F_SILU_ROWS rows and more
 * take it (the exp and divide in double were most of a SWIGLU finish's fp64 work); a decode
 * round computes (a lookup's latency more than the chain it saves). */
__device__ float f_silu_tab[1 << 16];
#define F_SILU_ROWS 64
#define F_SILU_DEVS 64
static const float *f_silu_at[F_SILU_DEVS]; /* a device's table once filled, else NULL */

__global__ void k_silu_table(float *tab)
{
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    tab[h] = f_silu((double)k_f16_to_f32_hw((uint16_t)h));
}

/* grid (f.cta0[linears], R), 128 threads (256 where a block takes 8 units: SWIGLU at 16+
 * splits). A CTA holds blocks of one linear li, U = f_fin_units warps each, 4 blocks at U = 1:
 * unit u < G (the gate's groups) sums group u of li's partials, units G .. U - 1 the up's
 * groups (SWIGLU); each part's group 0 warp (its lead) adds the other groups' sums from shared
 * memory in group order and finishes the part. SWIGLU: the up's lead hands its floats to the
 * gate's, which does swiglu.cu's expression. The gate's lead stores and, with f.na, does the
 * next linear's prepare of the same chunk from the values written (k_fast_prepare's a bit for
 * bit, one launch fewer). */
__global__ void __launch_bounds__(256) k_fast_finish(muse_fast_fin f)
{
    K_PDL_NEXT();
    /* dynamic, none where every linear's U is 1: a group's sums by the warp that made them
     * [warps][4][32], then (SWIGLU) the up's finished columns by block slot [4][4][32] */
    extern __shared__ double f_fin_sh[];
    double(*s_gs)[4][32] = reinterpret_cast<double(*)[4][32]>(f_fin_sh);
    float(*s_up)[4][32] = reinterpret_cast<float(*)[4][32]>(f_fin_sh + blockDim.x * 4);
    int swiglu = f.epilogue == MUSE_K_EPI_SWIGLU, nl = swiglu ? 1 : f.n_lin;
    long r = blockIdx.y, c = blockIdx.x;
    int li = 0, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    while (li + 1 < nl && c >= f.cta0[li + 1]) li++;
    int gg = f_fin_groups(f.splits[li]), U = f_fin_units(f, li);
    int slot = w / U, unit = w % U, per = (int)(blockDim.x / 32) / U;
    long b = (c - f.cta0[li]) * per + slot;
    bool live = slot < per && b < f.blk0[li + 1] - f.blk0[li];
    bool of_up = unit >= gg; /* this warp sums a group of the up's partials (SWIGLU) */
    int lp = of_up ? 1 : li, gi = of_up ? unit - gg : unit, G = of_up ? U - gg : gg;
    int64_t j0 = b * HAD;
    bool lead = live && gi == 0, next = f.na && !of_up;
    float sc[4], bs[4], nsc[4];
    bool has_bias = false;
    if (lead && !f.grouped) {
        has_bias = f.d[lp].bias != NULL;
        f_load_consts(f.d[lp].svh, f.d[lp].sv, f.d[lp].bias, f.nd.suh, f.nd.su, next, j0 + 4 * lane,
                      sc, bs, nsc);
    }
    K_PDL_WAIT();
    /* a grouped part's few partials first: they need r alone, the scales a chain of 4 loads */
    float4 pre[F_PRE];
    int npre = live && f.grouped ? f_group_pre(f, lp, r, gridDim.y, j0, lane, gi, G, pre) : 0;
    long out_row = r;
    if (lead && f.grouped) { /* partial row r is pair perm[r]'s: its expert's scales, its row */
        int32_t pair = f.g.perm[r], ex = f.g.sel[pair];
        const muse_k_lin *d = f.g.descs[lp] + ex, *nd = next ? f.nd_descs + ex : NULL;
        has_bias = d->bias != NULL;
        f_load_consts(d->svh, d->sv, d->bias, nd ? nd->suh : NULL, nd ? nd->su : NULL, next,
                      j0 + 4 * lane, sc, bs, nsc);
        out_row = pair;
    }
    double v[4];
    if (live) {
        f_group_sum(f, lp, r, gridDim.y, j0, lane, gi, G, pre, npre, v);
        if (gi)
#pragma unroll
            for (int q = 0; q < 4; q++) s_gs[w][q][lane] = v[q];
    }
    if (U > 1) __syncthreads(); /* U is the CTA's: its blocks are of one linear */
    float o[4];
    if (lead) {
        /* the groups in order: v = gs0, then v + gs1, ... (the lead's own sum is group 0) */
        for (int g = 1; g < G; g++)
#pragma unroll
            for (int q = 0; q < 4; q++) v[q] = v[q] + s_gs[w + g][q][lane];
        f_finish_vals(v, sc, bs, has_bias, lane, o);
        if (of_up)
#pragma unroll
            for (int q = 0; q < 4; q++) s_up[slot][q][lane] = o[q];
    }
    if (swiglu) __syncthreads(); /* the launch's: every CTA is the gate's */
    if (!lead || of_up) return;
    float *yr = f.y[li] + out_row * f.y_stride[li] + j0 + 4 * lane;
    if (swiglu) {
        float u[4];
#pragma unroll
        for (int q = 0; q < 4; q++) u[q] = s_up[slot][q][lane];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float sg = f.silu ? f.silu[k_f32_to_f16_hw(o[q])] : f_silu(k_round_f16_hw(o[q]));
            o[q] = k_round_f16_hw(__fmul_rn(sg, k_round_f16_hw(u[q])));
        }
    } else if (f.round16) {
#pragma unroll
        for (int q = 0; q < 4; q++) o[q] = k_round_f16_hw(o[q]);
    }
    if (k_fr_aligned(yr))
        *(float4 *)yr = make_float4(o[0], o[1], o[2], o[3]);
    else
#pragma unroll
        for (int q = 0; q < 4; q++) yr[q] = o[q];
    if (f.sq) { /* the values written, squared in double: a fixed tree a row (fast_rows.cuh's) */
        double sq = (((double)o[0] * o[0] + (double)o[1] * o[1]) + (double)o[2] * o[2]) +
                    (double)o[3] * o[3];
        for (int m = 16; m > 0; m >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, m);
        if (lane == 0) f.sq[out_row * f.blk0[1] + b] = sq;
    }
    if (f.na) /* the next linear's row r: for a pair, its expert's (row r of a is perm[r]'s) */
        f_prepare_vals(o, nsc, f.na + r * f.nk + j0, lane);
}

/* Rows a warp of the prepare takes: MUSE_FAST_PREP_ROWS (tuning: 1, 4 or 8; read once a
 * process), else 4 from 64 rows on (more loads in flight a warp), else 1. The bits are the same. */
static int f_prep_rows(long rows)
{
    static int forced = -1;
    if (forced < 0) {
        const char *e = getenv("MUSE_FAST_PREP_ROWS");
        int v = e ? atoi(e) : 0;
        forced = v == 1 || v == 4 || v == 8 ? v : 0;
    }
    return forced ? forced : rows >= 64 ? 4 : 1;
}

MUSE_K_API int muse_k_fast_prepare(const muse_fast_prep *p, const float *x, long x_stride,
                                   long rows, cudaStream_t st)
{
    unsigned chunks = (unsigned)(p->k / HAD), gx = (chunks + 3) / 4, nz = (unsigned)p->n_lin;
    int pr = f_prep_rows(rows);
    dim3 grid(gx, (unsigned)((rows + pr - 1) / pr), nz);
    if (pr == 8) return k_launch(k_fast_prepare<8>, grid, 128, 0, st, *p, x, x_stride, rows);
    if (pr == 4) return k_launch(k_fast_prepare<4>, grid, 128, 0, st, *p, x, x_stride, rows);
    return k_launch(k_fast_prepare<1>, grid, 128, 0, st, *p, x, x_stride, rows);
}

MUSE_K_API int muse_k_linear_fast_init(void)
{
    int dev = 0, err = (int)cudaGetDevice(&dev);
    /* filled at every call (each backend's start), not once: a device's memory is the context's */
    if (err || dev < 0 || dev >= F_SILU_DEVS) return err;
    void *tab = NULL;
    err = (int)cudaGetSymbolAddress(&tab, f_silu_tab);
    if (!err) { /* plainly, on the legacy stream, and waited for: before any round */
        k_silu_table<<<(1 << 16) / 256, 256>>>((float *)tab);
        err = (int)cudaGetLastError();
    }
    if (!err) err = (int)cudaStreamSynchronize(0);
    if (!err) f_silu_at[dev] = (const float *)tab;
    return err;
}

MUSE_K_API int muse_k_fast_finish(const muse_fast_fin *f, long rows, cudaStream_t st)
{
    muse_fast_fin h = *f;
    h.silu = NULL;
    int dev = -1;
    if (h.epilogue == MUSE_K_EPI_SWIGLU && rows >= F_SILU_ROWS && !cudaGetDevice(&dev) &&
        dev >= 0 && dev < F_SILU_DEVS)
        h.silu = f_silu_at[dev];
    int nl = h.epilogue == MUSE_K_EPI_SWIGLU ? 1 : h.n_lin, warps = 4, most = 1;
    for (int i = 0; i < nl; i++)
        if (f_fin_units(h, i) > most) most = f_fin_units(h, i);
    if (most > 4) warps = 8; /* a unit a warp: 256 threads for 8 */
    size_t smem = most > 1 ? (size_t)warps * 4 * 32 * sizeof(double) +
                                 (h.epilogue == MUSE_K_EPI_SWIGLU ? 4 * 4 * 32 * sizeof(float) : 0)
                           : 0;
    h.cta0[0] = 0;
    for (int i = 0; i < nl; i++) { /* linear i's blocks, warps / U of them a CTA */
        long per = warps / f_fin_units(h, i), nb = h.blk0[i + 1] - h.blk0[i];
        h.cta0[i + 1] = h.cta0[i] + (nb + per - 1) / per;
    }
    return k_launch(k_fast_finish, dim3((unsigned)h.cta0[nl], (unsigned)rows), 32 * warps, smem, st,
                    h);
}
