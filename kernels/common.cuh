/* Device helpers every kernel shares: the CPU's fp16/bf16 conversions (base/f16.h), and the
 * CPU reference's fixed-order double sums (4 lanes, then a fixed tree, then the tail), so a
 * kernel's result equals engine/backend/cpu/cpu_backend.c's exactly. Included by .cu files only.
 * Everything here is compiled with -fmad=false: no contraction the CPU does not do. */
#ifndef MUSE_K_COMMON_CUH
#define MUSE_K_COMMON_CUH

#include <stdint.h>

#include <cuda_fp16.h>

#include "base/f16.h" /* the CPU's own conversions, compiled for the device too */
#include "launch.h"

/* The hardware's fp16 conversions, one instruction each: muse_f16_to_f32, muse_f32_to_f16 and
 * muse_round_f16's bits for every value but a NaN (still a NaN, its payload the hardware's;
 * exl3-fast-check holds them to base/f16.h over every fp16 and fp32). The fast path's kernels. */
__device__ __forceinline__ float k_f16_to_f32_hw(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ uint16_t k_f32_to_f16_hw(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ float k_round_f16_hw(float f)
{
    return __half2float(__float2half_rn(f));
}

/* An EXL3 linear's input-side scale of row i and output-side scale of column j: suh / svh, or
 * the legacy sign words su / sv (bit set: -1). Both EXL3 paths read them here. */
__device__ __forceinline__ float k_in_scale(const muse_k_lin *d, int64_t i)
{
    if (d->suh) return muse_f16_to_f32(d->suh[i]);
    return (d->su[i >> 4] >> (i & 15)) & 1 ? -1.0f : 1.0f;
}

__device__ __forceinline__ float k_out_scale(const muse_k_lin *d, int64_t j)
{
    if (d->svh) return muse_f16_to_f32(d->svh[j]);
    return (d->sv[j >> 4] >> (j & 15)) & 1 ? -1.0f : 1.0f;
}

/* Element i of a float tensor of dtype (MUSE_K_F16, MUSE_K_BF16, MUSE_K_F32) as fp32. */
__device__ __forceinline__ float k_load(const void *p, int dtype, int64_t i)
{
    if (dtype == MUSE_K_F16) return muse_f16_to_f32(((const uint16_t *)p)[i]);
    if (dtype == MUSE_K_BF16) return muse_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* dot_f64 of the CPU backend: 4 lanes, ((l0 + l1) + (l2 + l3)) + tail. One thread. Products
 * of two floats are exact in double, so the order of the sums is all that matters. */
__device__ __forceinline__ double k_dot_f64(const float *a, const float *b, long n)
{
    double acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
    long i = 0;
    for (; i + 4 <= n; i += 4) {
        acc0 += (double)a[i] * (double)b[i];
        acc1 += (double)a[i + 1] * (double)b[i + 1];
        acc2 += (double)a[i + 2] * (double)b[i + 2];
        acc3 += (double)a[i + 3] * (double)b[i + 3];
    }
    double tail = 0;
    for (; i < n; i++) tail += (double)a[i] * (double)b[i];
    return ((acc0 + acc1) + (acc2 + acc3)) + tail;
}

/* The same with b a weight row of some dtype, converted on the fly (exactly as muse_dense_row). */
__device__ __forceinline__ double k_dot_f64_w(const float *a, const void *w, int dtype,
                                              int64_t base, long n)
{
    double acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
    long i = 0;
    for (; i + 4 <= n; i += 4) {
        acc0 += (double)a[i] * (double)k_load(w, dtype, base + i);
        acc1 += (double)a[i + 1] * (double)k_load(w, dtype, base + i + 1);
        acc2 += (double)a[i + 2] * (double)k_load(w, dtype, base + i + 2);
        acc3 += (double)a[i + 3] * (double)k_load(w, dtype, base + i + 3);
    }
    double tail = 0;
    for (; i < n; i++) tail += (double)a[i] * (double)k_load(w, dtype, base + i);
    return ((acc0 + acc1) + (acc2 + acc3)) + tail;
}

/* rms_scale of the CPU backend: 1 / sqrt(sum(x^2) / n + eps), the sum in dot_f64's order.
 * Computed by the block's four first threads (one lane each), combined by thread 0; every
 * thread of the block gets the result. Call from every thread of the block. */
__device__ __forceinline__ double k_block_rms_scale(const float *x, long n, double eps)
{
    __shared__ double lanes[5];
    int t = threadIdx.x;
    long whole = n - n % 4;
    if (t < 4) {
        double acc = 0;
        for (long i = t; i < whole; i += 4) acc += (double)x[i] * (double)x[i];
        lanes[t] = acc;
    }
    __syncthreads();
    if (t == 0) {
        double tail = 0;
        for (long i = whole; i < n; i++) tail += (double)x[i] * (double)x[i];
        double sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + tail;
        lanes[4] = 1.0 / sqrt(sum / (double)n + eps);
    }
    __syncthreads();
    double s = lanes[4];
    __syncthreads();
    return s;
}

/* (float)(1 / (1 + exp(-x))) in double, as sigmoid_f */
__device__ __forceinline__ float k_sigmoid(float x)
{
    return (float)(1.0 / (1.0 + exp(-(double)x)));
}

#endif
