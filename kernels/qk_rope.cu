/* qk_norm_rope: one block a (row, head). The rms scale in the CPU's double order, each element
 * scaled in double and rounded to fp32, then each NEOX pair (j, j + half) rotated in double by
 * p * theta^(-2j/d), then everything rounded to fp16 (cpu_backend.c qk_rows). */
#include "common.cuh"
#include "qk_rope.cuh"

__global__ void k_qk_norm_rope(float *x, long heads, long hd, const int64_t *positions,
                               double theta, double eps)
{
    long r = blockIdx.x, hh = blockIdx.y;
    float *v = x + (r * heads + hh) * hd;
    double s = k_block_rms_scale(v, hd, eps);
    for (long d = threadIdx.x; d < hd; d += blockDim.x) v[d] = (float)((double)v[d] * s);
    __syncthreads();
    if (theta != 0) {
        double p = (double)positions[r];
        long half = hd / 2;
        for (long j = threadIdx.x; j < half; j += blockDim.x) {
            double angle = p * pow(theta, -2.0 * (double)j / (double)hd);
            double cs = cos(angle), sn = sin(angle), x1 = v[j], x2 = v[j + half];
            v[j] = (float)(x1 * cs - x2 * sn);
            v[j + half] = (float)(x2 * cs + x1 * sn);
        }
        __syncthreads();
    }
    for (long d = threadIdx.x; d < hd; d += blockDim.x) v[d] = muse_round_f16(v[d]);
}

MUSE_K_API int muse_k_qk_norm_rope(const muse_k_ctx *ctx, float *x, long heads, long head_dim,
                                   double theta, double eps)
{
    long rows = ctx->rows;
    const int64_t *positions = ctx->positions;
    cudaStream_t st = ctx->st;
    if (rows <= 0 || heads <= 0) return 0;
    k_qk_norm_rope<<<dim3((unsigned)rows, (unsigned)heads), 64, 0, st>>>(x, heads, head_dim,
                                                                        positions, theta, eps);
    return (int)cudaGetLastError();
}
