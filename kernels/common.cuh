/* Device helpers every kernel shares: the CPU's fp16/bf16 conversions bit for bit, and the
 * CPU reference's fixed-order double sums (4 lanes, then a fixed tree, then the tail), so a
 * kernel's result equals engine/backend/cpu/cpu_backend.c's exactly. Included by .cu files only.
 * Everything here is compiled with -fmad=false: no contraction the CPU does not do. */
#ifndef MUSE_K_COMMON_CUH
#define MUSE_K_COMMON_CUH

#include <stdint.h>

#include "launch.h"

__device__ __forceinline__ float k_bits_f32(uint32_t u)
{
    return __uint_as_float(u);
}

__device__ __forceinline__ uint32_t k_f32_bits(float f)
{
    return __float_as_uint(f);
}

/* muse_f16_to_f32 */
__device__ __forceinline__ float k_f16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0x1F) return k_bits_f32(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        float v = __fmul_rn((float)mant, 5.9604644775390625e-08f);
        return sign ? -v : v;
    }
    return k_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* muse_f32_to_f16: round to nearest even, NaN keeps its sign and becomes quiet */
__device__ __forceinline__ uint16_t k_f32_f16(float f)
{
    uint32_t x = k_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);
    if (ax < 0x38800000u) {
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

__device__ __forceinline__ float k_round_f16(float f)
{
    return k_f16_f32(k_f32_f16(f));
}

__device__ __forceinline__ float k_bf16_f32(uint16_t b)
{
    return k_bits_f32((uint32_t)b << 16);
}

/* Element i of a float tensor of dtype (MUSE_K_F16, MUSE_K_BF16, MUSE_K_F32) as fp32. */
__device__ __forceinline__ float k_load(const void *p, int dtype, int64_t i)
{
    if (dtype == MUSE_K_F16) return k_f16_f32(((const uint16_t *)p)[i]);
    if (dtype == MUSE_K_BF16) return k_bf16_f32(((const uint16_t *)p)[i]);
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
