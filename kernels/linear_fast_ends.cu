/* The fast EXL3 product's steps 1 and 3 (the tensor-core step 2 is kernels/linear_fast.cu):
 * the exact path's prepare and finish math (kernels/linear.cu k_exl3_prepare, k_exl3_finish),
 * written out again here with the same expressions, so `a` is bit for bit the exact path's and
 * the finish differs from it only by its input t (the fp32 split partials summed in split order
 * in double). Compiled with the Makefile's -fmad=false, like the exact path. */
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

/* Columns j0 + 4 lane .. + 3 of linear li at partial row r after step 3, by one warp for the
 * 128-column block at j0: the partials summed (float4 loads, every split's in flight), the
 * Hadamard across the warp, the output scale and bias. */
__device__ __forceinline__ void f_finish_cols(const muse_fast_fin &f, int li, const muse_k_lin *d,
                                              long r, long R, int64_t j0, int lane, float out[4])
{
    int64_t n = f.n[li];
    int S = f.splits[li], G = f_fin_groups(S);
    const float *pr = f.part[li] + r * n + j0 + 4 * lane;
    double v[4] = {0, 0, 0, 0};
    for (int g = 0; g < G; g++) {
        double gs[4] = {0, 0, 0, 0};
#pragma unroll 4
        for (int sp = S * g / G; sp < S * (g + 1) / G; sp++) {
            float4 p = *(const float4 *)(pr + (long)sp * R * n);
            gs[0] += (double)p.x;
            gs[1] += (double)p.y;
            gs[2] += (double)p.z;
            gs[3] += (double)p.w;
        }
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] = g ? v[q] + gs[q] : gs[q];
    }
    f_hadamard_warp(v, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        int64_t j = j0 + 4 * lane + q;
        double s = v[q] * (double)k_out_scale(d, j);
        if (d->bias) s += (double)muse_f16_to_f32(d->bias[j]);
        out[q] = (float)s;
    }
}

/* grid (ceil(128-column blocks of all linears / 4), R), 128 threads: warp w finishes block
 * 4 x + w. SWIGLU: the blocks of the gate only; each also finishes the same columns of up,
 * then swiglu.cu's expression. f.na: the next linear's prepare of the same chunk too, from the
 * values written (k_fast_prepare's a bit for bit, one launch fewer). */
__global__ void __launch_bounds__(128) k_fast_finish(muse_fast_fin f, long blocks)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long r = blockIdx.y, b = (long)blockIdx.x * 4 + threadIdx.x / 32;
    int li = 0, lane = threadIdx.x % 32;
    if (b >= blocks) return;
    while (li + 1 < f.n_lin && b >= f.blk0[li + 1]) li++;
    int64_t j0 = (b - f.blk0[li]) * HAD;
    const muse_k_lin *d = &f.d[li], *du = &f.d[1];
    long out_row = r;
    if (f.grouped) { /* partial row r is pair perm[r]'s: its expert's scales, its output row */
        int32_t pair = f.g.perm[r], e = f.g.sel[pair];
        d = f.g.descs[li] + e;
        du = f.epilogue == MUSE_K_EPI_SWIGLU ? f.g.descs[1] + e : d;
        out_row = pair;
    }
    float o[4];
    f_finish_cols(f, li, d, r, gridDim.y, j0, lane, o);
    float *yr = f.y[li] + out_row * f.y_stride[li] + j0 + 4 * lane;
    if (f.epilogue == MUSE_K_EPI_SWIGLU) {
        float u[4];
        f_finish_cols(f, 1, du, r, gridDim.y, j0, lane, u);
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
    long blocks = f->epilogue == MUSE_K_EPI_SWIGLU ? f->blk0[1] : f->blk0[f->n_lin];
    return k_launch(k_fast_finish, dim3((unsigned)((blocks + 3) / 4), (unsigned)rows), 128, 0, st,
                    *f, blocks);
}
