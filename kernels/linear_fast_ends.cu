/* The fast EXL3 product's steps 1 and 3 (the tensor-core step 2 is kernels/linear_fast.cu):
 * the exact path's prepare and finish math (kernels/linear.cu k_exl3_prepare, k_exl3_finish),
 * written out again here with the same expressions, so `a` is bit for bit the exact path's and
 * the finish differs from it only by its input t (the fp32 split partials summed in split order
 * in double). Compiled with the Makefile's -fmad=false, like the exact path.
 * The finish spreads a 128-column block over warps, for latency (it is a chain at few rows):
 * a warp a group of a linear's splits (f_fin_groups), SWIGLU's up in warps of its own beside the
 * gate's; group sums and the up's floats meet in shared memory, where one warp adds the groups
 * in group order and goes on. Which warp does a part never changes an operation or its order. */
#include "common.cuh"
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
        bool upper = (lane * 4) & h;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            double o = __shfl_xor_sync(0xffffffffu, v[q], h / 4);
            v[q] = upper ? o - v[q] : v[q] + o;
        }
    }
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] *= 0.08838834764831844055;
}

/* a_i[r]'s chunk at i0 = fp16(fp32(blockHad(x_r * suh_i))), lane l given x elements 4 l ..
 * 4 l + 3 of the chunk in x */
__device__ __forceinline__ void f_prepare_vals(const muse_k_lin *d, const float x[4], uint16_t *ar,
                                               int64_t i0, int lane)
{
    double v[4];
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] = (double)__fmul_rn(x[q], k_in_scale(d, i0 + 4 * lane + q));
    f_hadamard_warp(v, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) ar[4 * lane + q] = muse_f32_to_f16((float)v[q]);
}

/* grid (ceil(k / 512), R, n_lin), 128 threads: warp w of block b prepares 128-chunk 4 b + w,
 * lane l the chunk elements 4 l .. 4 l + 3 (xr: the chunk's row) */
__device__ __forceinline__ void f_prepare_chunk(const muse_k_lin *d, const float *xr, uint16_t *ar,
                                                int64_t i0, int lane)
{
    float x[4];
#pragma unroll
    for (int q = 0; q < 4; q++) x[q] = xr[4 * lane + q];
    f_prepare_vals(d, x, ar, i0, lane);
}

__global__ void __launch_bounds__(128)
    k_fast_prepare(muse_fast_prep p, const float *x, long x_stride)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long r = blockIdx.y;
    int li = blockIdx.z, lane = threadIdx.x % 32;
    int64_t i0 = ((int64_t)blockIdx.x * 4 + threadIdx.x / 32) * HAD;
    if (i0 >= p.k) return;
    const muse_k_lin *d = &p.d[li];
    long src = r;
    if (p.grouped) { /* row r of a is pair perm[r]: its input row and its expert */
        int32_t pair = p.g.perm[r];
        d = p.g.descs[li] + p.g.sel[pair];
        src = p.g.src ? p.g.src[pair] : pair;
    }
    f_prepare_chunk(d, x + src * x_stride + i0, p.a[li] + r * p.k + i0, i0, lane);
}

/* The finish's sum of a column's S split partials: G groups (f_fin_groups), group g adding
 * the partials of splits [g S / G, (g + 1) S / G) in split order from 0, then the groups' sums
 * in group order, in double: a fixed order that depends on the shape alone. */
__host__ __device__ __forceinline__ int f_fin_groups(int splits)
{
    return splits >= 16 ? 4 : splits >= 8 ? 2 : 1;
}

/* The warps (units) a 128-column block of linear li takes in the finish: one a group of its
 * partials, and for SWIGLU (li the gate) one a group of the up's too: 1, 2, 4 or 8. */
__host__ __device__ __forceinline__ int f_fin_units(const muse_fast_fin &f, int li)
{
    int g = f_fin_groups(f.splits[li]);
    return f.epilogue == MUSE_K_EPI_SWIGLU ? g + f_fin_groups(f.splits[1]) : g;
}

/* Group g of G's sum of linear li's partials at columns j0 + 4 lane .. + 3 of partial row r, by
 * one warp: splits [g S / G, (g + 1) S / G) in split order, in double (float4 loads, every
 * split's in flight). */
__device__ __forceinline__ void f_group_sum(const muse_fast_fin &f, int li, long r, long R,
                                            int64_t j0, int lane, int g, int G, double gs[4])
{
    int64_t n = f.n[li];
    int S = f.splits[li];
    const float *pr = f.part[li] + r * n + j0 + 4 * lane;
#pragma unroll
    for (int q = 0; q < 4; q++) gs[q] = 0;
#pragma unroll 4
    for (int sp = S * g / G; sp < S * (g + 1) / G; sp++) {
        float4 p = *(const float4 *)(pr + (long)sp * R * n);
        gs[0] += (double)p.x;
        gs[1] += (double)p.y;
        gs[2] += (double)p.z;
        gs[3] += (double)p.w;
    }
}

/* Columns j0 + 4 lane .. + 3 after step 3 from their summed partials v, by one warp: the
 * Hadamard across the warp, the output scale and bias (d). */
__device__ __forceinline__ void f_finish_vals(const muse_k_lin *d, double v[4], int64_t j0,
                                              int lane, float out[4])
{
    f_hadamard_warp(v, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        int64_t j = j0 + 4 * lane + q;
        double s = v[q] * (double)k_out_scale(d, j);
        if (d->bias) s += (double)muse_f16_to_f32(d->bias[j]);
        out[q] = (float)s;
    }
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
    K_PDL_WAIT();
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
    double v[4];
    if (live) {
        f_group_sum(f, lp, r, gridDim.y, j0, lane, gi, G, v);
        if (gi)
#pragma unroll
            for (int q = 0; q < 4; q++) s_gs[w][q][lane] = v[q];
    }
    if (U > 1) __syncthreads(); /* U is the CTA's: its blocks are of one linear */
    bool lead = live && gi == 0;
    long out_row = r;
    float o[4];
    if (lead) {
        /* the groups in order: v = gs0, then v + gs1, ... (the lead's own sum is group 0) */
        for (int k = 1; k < G; k++)
#pragma unroll
            for (int q = 0; q < 4; q++) v[q] = v[q] + s_gs[w + k][q][lane];
        const muse_k_lin *d = &f.d[lp];
        if (f.grouped) { /* partial row r is pair perm[r]'s: its expert's scales, its output row */
            int32_t pair = f.g.perm[r];
            d = f.g.descs[lp] + f.g.sel[pair];
            out_row = pair;
        }
        f_finish_vals(d, v, j0, lane, o);
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
            double gv = muse_round_f16(o[q]);
            float up = muse_round_f16(u[q]);
            o[q] = muse_round_f16(__fmul_rn((float)(gv / (1.0 + exp(-gv))), up));
        }
    } else if (f.round16) {
#pragma unroll
        for (int q = 0; q < 4; q++) o[q] = muse_round_f16(o[q]);
    }
#pragma unroll
    for (int q = 0; q < 4; q++) yr[q] = o[q];
    if (f.sq) { /* the values written, squared in double: a fixed tree a row (fast_rows.cuh's) */
        double sq = (((double)o[0] * o[0] + (double)o[1] * o[1]) + (double)o[2] * o[2]) +
                    (double)o[3] * o[3];
        for (int m = 16; m > 0; m >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, m);
        if (lane == 0) f.sq[out_row * f.blk0[1] + b] = sq;
    }
    if (f.na) /* the next linear's row r: for a pair, its expert's (row r of a is perm[r]'s) */
        f_prepare_vals(f.grouped ? f.nd_descs + f.g.sel[out_row] : &f.nd, o,
                       f.na + r * f.nk + j0, j0, lane);
}

MUSE_K_API int muse_k_fast_prepare(const muse_fast_prep *p, const float *x, long x_stride,
                                   long rows, cudaStream_t st)
{
    unsigned chunks = (unsigned)(p->k / HAD);
    return k_launch(k_fast_prepare, dim3((chunks + 3) / 4, (unsigned)rows, (unsigned)p->n_lin), 128,
                    0, st, *p, x, x_stride);
}

MUSE_K_API int muse_k_fast_finish(const muse_fast_fin *f, long rows, cudaStream_t st)
{
    muse_fast_fin h = *f;
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
    return k_launch(k_fast_finish, dim3((unsigned)h.cta0[nl], (unsigned)rows), 32 * warps, smem,
                    st, h);
}
