/* The fast EXL3 product's steps 1 and 3 (the tensor-core step 2 is kernels/linear_fast.cu):
 * the exact path's prepare and finish math (kernels/linear.cu k_exl3_prepare, k_exl3_finish),
 * written out again here with the same expressions, so `a` is bit for bit the exact path's and
 * the finish differs from it only by its input t (the fp32 split partials summed in split order
 * in double). Compiled with the Makefile's -fmad=false, like the exact path. */
#include "common.cuh"
#include "linear_fast_ends.cuh"

#define HAD 128

/* 128-point Sylvester Hadamard in double on v (shared), 64 threads: k_hadamard128's order */
__device__ __forceinline__ void f_hadamard128(double *v)
{
    int t = threadIdx.x;
    for (int h = 1; h < HAD; h <<= 1) {
        int j = (t / h) * 2 * h + t % h;
        double a = v[j], b = v[j + h];
        __syncthreads();
        v[j] = a + b;
        v[j + h] = a - b;
        __syncthreads();
    }
    v[t] *= 0.08838834764831844055;
    v[t + 64] *= 0.08838834764831844055;
    __syncthreads();
}

__device__ __forceinline__ float f_in_scale(const muse_k_lin *d, int64_t i)
{
    if (d->suh) return muse_f16_to_f32(d->suh[i]);
    return (d->su[i >> 4] >> (i & 15)) & 1 ? -1.0f : 1.0f;
}

__device__ __forceinline__ float f_out_scale(const muse_k_lin *d, int64_t j)
{
    if (d->svh) return muse_f16_to_f32(d->svh[j]);
    return (d->sv[j >> 4] >> (j & 15)) & 1 ? -1.0f : 1.0f;
}

/* grid (k / 128, R, n_lin), 64 threads: a_i[r] = fp16(fp32(blockHad(x_r * suh_i))) */
__global__ void k_fast_prepare(muse_fast_prep p, const float *x, long x_stride)
{
    __shared__ double v[HAD];
    long r = blockIdx.y;
    int li = blockIdx.z;
    const muse_k_lin *d = &p.d[li];
    int64_t i0 = (int64_t)blockIdx.x * HAD;
    const float *xr = x + r * x_stride;
    for (int i = threadIdx.x; i < HAD; i += 64)
        v[i] = (double)__fmul_rn(xr[i0 + i], f_in_scale(d, i0 + i));
    __syncthreads();
    f_hadamard128(v);
    uint16_t *ar = p.a[li] + r * p.k;
    for (int i = threadIdx.x; i < HAD; i += 64) ar[i0 + i] = muse_f32_to_f16((float)v[i]);
}

/* Column j of linear li at row r after step 3, from the partials of its 128-column block
 * starting at j0 (all 64 threads call it; v is the block's shared scratch). */
__device__ __forceinline__ void f_finish_cols(const muse_fast_fin &f, int li, long r, int64_t j0,
                                              double *v, float out[2])
{
    int64_t n = f.n[li];
    long R = gridDim.y;
    const float *pr = f.part[li] + r * n + j0;
    for (int i = threadIdx.x; i < HAD; i += 64) {
        double s = 0;
#pragma unroll 8 /* the loads go out together; the adds keep split order */
        for (int sp = 0; sp < f.splits[li]; sp++) s += (double)pr[(long)sp * R * n + i];
        v[i] = s;
    }
    __syncthreads();
    f_hadamard128(v);
    const muse_k_lin *d = &f.d[li];
    for (int q = 0; q < 2; q++) {
        int i = threadIdx.x + 64 * q;
        int64_t j = j0 + i;
        double s = v[i] * (double)f_out_scale(d, j);
        if (d->bias) s += (double)muse_f16_to_f32(d->bias[j]);
        out[q] = (float)s;
    }
    __syncthreads();
}

/* grid (128-column blocks of all linears, R), 64 threads. SWIGLU: the blocks of the gate only;
 * each also finishes the same columns of up, then swiglu.cu's expression. */
__global__ void k_fast_finish(muse_fast_fin f)
{
    __shared__ double v[HAD];
    long r = blockIdx.y, b = blockIdx.x;
    int li = 0;
    while (li + 1 < f.n_lin && b >= f.blk0[li + 1]) li++;
    int64_t j0 = (b - f.blk0[li]) * HAD;
    float o[2];
    f_finish_cols(f, li, r, j0, v, o);
    float *yr = f.y[li] + r * f.y_stride[li] + j0;
    if (f.epilogue == MUSE_K_EPI_SWIGLU) {
        float u[2];
        f_finish_cols(f, 1, r, j0, v, u);
        for (int q = 0; q < 2; q++) {
            double gv = muse_round_f16(o[q]);
            float up = muse_round_f16(u[q]);
            yr[threadIdx.x + 64 * q] = muse_round_f16(__fmul_rn((float)(gv / (1.0 + exp(-gv))), up));
        }
        return;
    }
    for (int q = 0; q < 2; q++) yr[threadIdx.x + 64 * q] = f.round16 ? muse_round_f16(o[q]) : o[q];
}

MUSE_K_API int muse_k_fast_prepare(const muse_fast_prep *p, const float *x, long x_stride,
                                   long rows, cudaStream_t st)
{
    k_fast_prepare<<<dim3((unsigned)(p->k / HAD), (unsigned)rows, (unsigned)p->n_lin), 64, 0, st>>>(
        *p, x, x_stride);
    return (int)cudaGetLastError();
}

MUSE_K_API int muse_k_fast_finish(const muse_fast_fin *f, long rows, cudaStream_t st)
{
    int blocks = (int)(f->epilogue == MUSE_K_EPI_SWIGLU ? f->blk0[1] : f->blk0[f->n_lin]);
    k_fast_finish<<<dim3((unsigned)blocks, (unsigned)rows), 64, 0, st>>>(*f);
    return (int)cudaGetLastError();
}
