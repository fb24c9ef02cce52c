/* The fast row kernels' shared pieces (norm_fast, embed_fast, qk_rope_fast): a row's layout
 * over a block whose size is a function of the width alone, and double sums in a fixed tree
 * (each thread in its own order, warp butterflies, the warps in index order), so a row's bits
 * never depend on how many rows the launch has or where the row sits. Included by .cu only. */
#ifndef MUSE_K_FAST_ROWS_CUH
#define MUSE_K_FAST_ROWS_CUH

#include <stdint.h>

#include "common.cuh"

/* Threads for a row of n floats: about two float4 a thread, a whole number of warps, <= 1024. */
static inline unsigned k_fr_threads(long n)
{
    long t = ((n / 4 + 1) / 2 + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : t > 1024 ? 1024 : t);
}

/* Whether p (and so every float4 of a row whose width is a multiple of 4) is 16-byte aligned. */
__host__ __device__ __forceinline__ bool k_fr_aligned(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* Floats 4v .. 4v+3 of p: one 16-byte load when vec, else four (the same values either way). */
__device__ __forceinline__ float4 k_fr_load4(const float *p, long v, bool vec)
{
    if (vec) return ((const float4 *)p)[v];
    return make_float4(p[4 * v], p[4 * v + 1], p[4 * v + 2], p[4 * v + 3]);
}

__device__ __forceinline__ void k_fr_store4(float *p, long v, float4 x, bool vec)
{
    if (vec) {
        ((float4 *)p)[v] = x;
        return;
    }
    p[4 * v] = x.x;
    p[4 * v + 1] = x.y;
    p[4 * v + 2] = x.z;
    p[4 * v + 3] = x.w;
}

__device__ __forceinline__ double k_fr_sq4(float4 x)
{
    return (((double)x.x * x.x + (double)x.y * x.y) + (double)x.z * x.z) + (double)x.w * x.w;
}

/* The sum over a warp (every lane gets the same bits: each step adds a commuted pair). */
__device__ __forceinline__ double k_fr_warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The sum over the block of v, the warps' sums added in warp order; every thread gets it. */
__device__ __forceinline__ double k_fr_block_sum(double v)
{
    __shared__ double warp_sums[32];
    v = k_fr_warp_sum(v);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    for (unsigned w = 0; w < blockDim.x >> 5; w++) s += warp_sums[w];
    __syncthreads();
    return s;
}

/* Thread t's share of sum(x^2) over a row of n: float4 v = t, t + T, ... then tail element
 * 4 * (n / 4) + t. The same for the vector and scalar loads. */
__device__ __forceinline__ double k_fr_sum_sq(const float *x, long n, bool vec)
{
    double acc = 0;
    long nv = n / 4;
    for (long v = threadIdx.x; v < nv; v += blockDim.x) acc += k_fr_sq4(k_fr_load4(x, v, vec));
    long j = 4 * nv + threadIdx.x;
    if (j < n) acc += (double)x[j] * (double)x[j];
    return acc;
}

/* The CPU's rms scale from the row's sum of squares. */
__device__ __forceinline__ double k_fr_scale(double sum, long n, double eps)
{
    return 1.0 / sqrt(sum / (double)n + eps);
}

#endif
