/* head: gather (one thread an element) and finish (one thread a logit: the product with the
 * multiplier and the tanh softcap in double, then fp32, as cpu_backend.c cpu_head). */
#include "common.cuh"
#include "pdl.cuh"
#include "head.cuh"

__global__ void k_gather_rows(const float *src, const int32_t *rows, long W, float *dst)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long i = blockIdx.y, j = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < W) dst[i * W + j] = src[(long)rows[i] * W + j];
}

__global__ void k_head_finish(const float *raw, long N, long V, double mult, double cap,
                              float *logits)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long i = blockIdx.y, j = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= V) return;
    double z = (double)raw[i * N + j] * mult;
    logits[i * V + j] = (float)(cap > 0 ? cap * tanh(z / cap) : z);
}

MUSE_K_API int muse_k_gather_rows(const muse_k_ctx *ctx, const float *src, long W, float *dst)
{
    const int32_t *rows = ctx->want;
    long n = ctx->rows;
    cudaStream_t st = ctx->st;
    if (n <= 0) return 0;
    return k_launch(k_gather_rows, dim3((unsigned)((W + 255) / 256), (unsigned)n), 256, 0, st, src,
                    rows, W, dst);
}

MUSE_K_API int muse_k_head_finish(const muse_k_ctx *ctx, const float *raw, long N, long V,
                                  double mult, double cap, float *logits)
{
    long n = ctx->rows;
    cudaStream_t st = ctx->st;
    if (n <= 0) return 0;
    return k_launch(k_head_finish, dim3((unsigned)((V + 255) / 256), (unsigned)n), 256, 0, st, raw,
                    N, V, mult, cap, logits);
}
