/* all_reduce: one thread an element reads element i of every rank's partial and adds them in
 * rank order in fp32 (__fadd_rn: no contraction, round to nearest), the order and rounding of
 * cpu_backend.c cpu_all_reduce (sum = x_0; sum += x_k for k = 1 ..). The same kernel serves
 * partials on one GPU, on peers over NVLink, and the slices an NCCL all-gather left. */
#include "all_reduce.cuh"
#include "common.cuh"

__global__ void k_all_reduce(muse_k_parts parts, int n_parts, long n, float *out)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = parts.p[0][i];
    for (int k = 1; k < n_parts; k++) s = __fadd_rn(s, parts.p[k][i]);
    out[i] = s;
}

MUSE_K_API int muse_k_all_reduce(const muse_k_ctx *ctx, muse_k_parts parts, int n_parts, long n,
                                 float *out)
{
    cudaStream_t st = ctx->st;
    if (n <= 0) return 0;
    if (n_parts < 1 || n_parts > MUSE_K_MAX_PARTS) return (int)cudaErrorInvalidValue;
    k_all_reduce<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(parts, n_parts, n, out);
    return (int)cudaGetLastError();
}
