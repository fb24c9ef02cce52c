/* embed: one block a row reads the token's embedding row as fp32, then scales it by the row's
 * rms (the CPU's fixed-order double sum). out[R, H]. */
#include "common.cuh"
#include "embed.cuh"

__global__ void k_embed(const void *table, int dtype, const int32_t *tokens, long H, double eps,
                        float *out)
{
    long r = blockIdx.x;
    float *row = out + r * H;
    int64_t base = (int64_t)tokens[r] * H;
    for (long j = threadIdx.x; j < H; j += blockDim.x) row[j] = k_load(table, dtype, base + j);
    __syncthreads();
    double s = k_block_rms_scale(row, H, eps);
    for (long j = threadIdx.x; j < H; j += blockDim.x) row[j] = (float)((double)row[j] * s);
}

MUSE_K_API int muse_k_embed(const muse_k_ctx *ctx, const void *table, int dtype, long H, double eps,
                            float *out)
{
    const int32_t *tokens = ctx->tokens;
    long rows = ctx->rows;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    k_embed<<<(unsigned)rows, 256, 0, st>>>(table, dtype, tokens, H, eps, out);
    return (int)cudaGetLastError();
}
