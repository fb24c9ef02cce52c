/* scale: one thread an element, one fp32 product, exactly as cpu_backend.c cpu_scale. */
#include "common.cuh"
#include "scale.cuh"

__global__ void k_scale(float *x, long n, float s)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fmul_rn(x[i], s);
}

MUSE_K_API int muse_k_scale(const muse_k_ctx *ctx, float *x, long width, float s)
{
    long n = ctx->rows * width;
    if (n <= 0) return 0;
    k_scale<<<(unsigned)((n + 255) / 256), 256, 0, ctx->st>>>(x, n, s);
    return (int)cudaGetLastError();
}
