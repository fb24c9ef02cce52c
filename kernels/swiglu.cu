/* swiglu: one thread an element; silu in double, the product in fp32, then fp16, exactly as
 * cpu_backend.c swiglu_n. */
#include "common.cuh"
#include "swiglu.cuh"

__global__ void k_swiglu(const float *gate, const float *up, long n, float *out)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double gv = gate[i];
    out[i] = muse_round_f16(__fmul_rn((float)(gv / (1.0 + exp(-gv))), up[i]));
}

MUSE_K_API int muse_k_swiglu(const muse_k_ctx *ctx, const float *gate, const float *up, long width,
                             float *out)
{
    long n = ctx->rows * width;
    cudaStream_t st = ctx->st;
    if (n <= 0) return 0;
    k_swiglu<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(gate, up, n, out);
    return (int)cudaGetLastError();
}
