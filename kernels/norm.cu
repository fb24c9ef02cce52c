/* norm, add_norm: one block a row; the rms scale in double in the CPU's order, then each
 * element in fp32 exactly as cpu_backend.c's norm_rows / cpu_add_norm (no contraction). */
#include "common.cuh"
#include "norm.cuh"

__global__ void k_norm(const float *x, long width, const float *w, long w_stride,
                       const int32_t *w_row, int mode, double eps, int round16, float *out)
{
    long r = blockIdx.x;
    const float *xr = x + r * width;
    float *o = out + r * width;
    const float *wr = w ? w + (w_row ? (long)w_row[r] : 0) * w_stride : NULL;
    double s = k_block_rms_scale(xr, width, eps);
    for (long j = threadIdx.x; j < width; j += blockDim.x) {
        float v = (float)((double)xr[j] * s);
        if (mode == MUSE_K_NORM_PLUS1) v = __fmul_rn(v, __fadd_rn(1.0f, wr[j]));
        if (mode == MUSE_K_NORM_PLAIN) v = __fmul_rn(v, wr[j]);
        o[j] = round16 ? muse_round_f16(v) : v;
    }
}

__global__ void k_add_norm(float *h, const float *y, long width, const float *w, double eps)
{
    long r = blockIdx.x;
    const float *yr = y + r * width;
    float *hr = h + r * width;
    double s = k_block_rms_scale(yr, width, eps);
    for (long j = threadIdx.x; j < width; j += blockDim.x) {
        float t = __fmul_rn((float)((double)yr[j] * s), __fadd_rn(1.0f, w[j]));
        hr[j] = __fadd_rn(hr[j], t);
    }
}

MUSE_K_API int muse_k_norm(const muse_k_ctx *ctx, const float *x, long width, const float *w,
                           long w_stride, const int32_t *w_row, int mode, double eps, int round16,
                           float *out)
{
    long rows = ctx->rows;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    k_norm<<<(unsigned)rows, 256, 0, st>>>(x, width, w, w_stride, w_row, mode, eps, round16, out);
    return (int)cudaGetLastError();
}

MUSE_K_API int muse_k_add_norm(const muse_k_ctx *ctx, float *h, const float *y, long width,
                               const float *w, double eps)
{
    long rows = ctx->rows;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    k_add_norm<<<(unsigned)rows, 256, 0, st>>>(h, y, width, w, eps);
    return (int)cudaGetLastError();
}
