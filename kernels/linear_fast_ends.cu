/* The fast EXL3 product's steps 1 and 3 (the tensor-core step 2 is kernels/linear_fast.cu):
 * the exact path's prepare and finish math (kernels/linear.cu k_exl3_prepare, k_exl3_finish),
 * written out again here with the same expressions, so `a` is bit for bit the exact path's and
 * the finish differs from it only by its input t (the fp32 split partials summed in split order
 * in double). Compiled with the Makefile's -fmad=false, like the exact path. */
#include "common.cuh"
#include "linear_fast_ends.cuh"

#define HAD 128

/* 128-point Sylvester Hadamard in double on v (shared) by threads 0..63 (k_hadamard128's
 * order); every thread of the block reaches its barriers. */
__device__ __forceinline__ void f_hadamard128(double *v)
{
    int t = threadIdx.x;
    bool on = t < 64;
    for (int h = 1; h < HAD; h <<= 1) {
        int j = (t / h) * 2 * h + t % h;
        double a = on ? v[j] : 0, b = on ? v[j + h] : 0;
        __syncthreads();
        if (on) {
            v[j] = a + b;
            v[j + h] = a - b;
        }
        __syncthreads();
    }
    if (on) {
        v[t] *= 0.08838834764831844055;
        v[t + 64] *= 0.08838834764831844055;
    }
    __syncthreads();
}

/* grid (ceil(k / 512), R, n_lin), 128 threads: warp w of block b prepares 128-chunk 4 b + w:
 * a_i[r] = fp16(fp32(blockHad(x_r * suh_i))). Lane l holds chunk elements 4 l .. 4 l + 3; the
 * Hadamard's stages h = 1, 2 stay in the lane, h = 4 .. 64 pair lane l with l ^ (h / 4). Each
 * stage forms every element as k_hadamard128 does (the lower index a + b, the upper a - b of the
 * same pair), in double, so a is the exact path's bit for bit, with no block barrier. */
__device__ __forceinline__ void f_prepare_chunk(const muse_k_lin *d, const float *xr, uint16_t *ar,
                                                int64_t i0, int lane)
{
    double v[4];
#pragma unroll
    for (int q = 0; q < 4; q++)
        v[q] = (double)__fmul_rn(xr[4 * lane + q], k_in_scale(d, i0 + 4 * lane + q));
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
    for (int q = 0; q < 4; q++)
        ar[4 * lane + q] = muse_f32_to_f16((float)(v[q] * 0.08838834764831844055));
}

__global__ void __launch_bounds__(128)
    k_fast_prepare(muse_fast_prep p, const float *x, long x_stride)
{
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

/* The finish's threads: G groups of 64 for a linear of S splits, group g adding the partials
 * of splits [g S / G, (g + 1) S / G) in split order (loads of a group in flight together),
 * then the groups' sums added in group order: a fixed order that depends on the shape alone.
 * Few splits, few groups: at many rows the idle threads of the Hadamard cost more. */
#define FIN_GROUPS  4
#define FIN_THREADS (64 * FIN_GROUPS)
__host__ __device__ __forceinline__ int f_fin_groups(int splits)
{
    return splits >= 16 ? 4 : splits >= 8 ? 2 : 1;
}

/* Column j0 + t and j0 + t + 64 (threads t < 64) of linear li at row r after step 3, from the
 * partials of its 128-column block (all threads call it; v, gs: the block's shared scratch). */
__device__ __forceinline__ void f_finish_cols(const muse_fast_fin &f, int li, const muse_k_lin *d,
                                              long r, int64_t j0, double *v, double (*gs)[HAD],
                                              float out[2])
{
    int64_t n = f.n[li];
    long R = gridDim.y;
    int t = threadIdx.x, g = t / 64, S = f.splits[li], G = f_fin_groups(S);
    int s0 = S * g / G, s1 = S * (g + 1) / G;
    const float *pr = f.part[li] + r * n + j0;
    if (g < G)
        for (int i = t % 64; i < HAD; i += 64) {
            double s = 0;
#pragma unroll 4
            for (int sp = s0; sp < s1; sp++) s += (double)pr[(long)sp * R * n + i];
            gs[g][i] = s;
        }
    __syncthreads();
    for (int i = t; i < HAD; i += blockDim.x) { /* 64 threads or more */
        double s = gs[0][i];
        for (int q = 1; q < G; q++) s += gs[q][i];
        v[i] = s;
    }
    __syncthreads();
    f_hadamard128(v);
    if (t < 64)
        for (int q = 0; q < 2; q++) {
            int i = t + 64 * q;
            int64_t j = j0 + i;
            double s = v[i] * (double)k_out_scale(d, j);
            if (d->bias) s += (double)muse_f16_to_f32(d->bias[j]);
            out[q] = (float)s;
        }
    __syncthreads();
}

/* grid (128-column blocks of all linears, R), 64 threads a group of the launch's most groups
 * (at most FIN_THREADS). SWIGLU: the blocks of the
 * gate only; each also finishes the same columns of up, then swiglu.cu's expression. */
__global__ void __launch_bounds__(FIN_THREADS) k_fast_finish(muse_fast_fin f)
{
    __shared__ double v[HAD];
    __shared__ double gs[FIN_GROUPS][HAD];
    long r = blockIdx.y, b = blockIdx.x;
    int li = 0, t = threadIdx.x;
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
    float o[2] = {0, 0};
    f_finish_cols(f, li, d, r, j0, v, gs, o);
    float *yr = f.y[li] + out_row * f.y_stride[li] + j0;
    if (f.epilogue == MUSE_K_EPI_SWIGLU) {
        float u[2] = {0, 0};
        f_finish_cols(f, 1, du, r, j0, v, gs, u);
        if (t < 64)
            for (int q = 0; q < 2; q++) {
                double gv = muse_round_f16(o[q]);
                float up = muse_round_f16(u[q]);
                yr[t + 64 * q] = muse_round_f16(__fmul_rn((float)(gv / (1.0 + exp(-gv))), up));
            }
        return;
    }
    if (t < 64)
        for (int q = 0; q < 2; q++) yr[t + 64 * q] = f.round16 ? muse_round_f16(o[q]) : o[q];
}

MUSE_K_API int muse_k_fast_prepare(const muse_fast_prep *p, const float *x, long x_stride,
                                   long rows, cudaStream_t st)
{
    unsigned chunks = (unsigned)(p->k / HAD);
    k_fast_prepare<<<dim3((chunks + 3) / 4, (unsigned)rows, (unsigned)p->n_lin), 128, 0, st>>>(
        *p, x, x_stride);
    return (int)cudaGetLastError();
}

MUSE_K_API int muse_k_fast_finish(const muse_fast_fin *f, long rows, cudaStream_t st)
{
    int blocks = (int)(f->epilogue == MUSE_K_EPI_SWIGLU ? f->blk0[1] : f->blk0[f->n_lin]);
    int groups = 1; /* the most any linear of the launch takes */
    for (int i = 0; i < f->n_lin; i++)
        if (f_fin_groups(f->splits[i]) > groups) groups = f_fin_groups(f->splits[i]);
    k_fast_finish<<<dim3((unsigned)blocks, (unsigned)rows), 64 * groups, 0, st>>>(*f);
    return (int)cudaGetLastError();
}
