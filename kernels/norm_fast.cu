/* norm, add_norm, add_norm_norm (fast path): one block a row of k_fr_threads(width) threads,
 * float4 loads; the sum of squares in double in fast_rows.cuh's fixed tree (so it differs from
 * the exact kernel's CPU order only in the last bits of a double), then each element exactly
 * as kernels/norm.cu does it. A thread reads back only what it wrote itself. */
#include "common.cuh"
#include "fast_rows.cuh"
#include "norm_fast.cuh"

/* v * the weight of mode (the exact kernel's fp32 steps), fp16-rounded when round16 */
__device__ __forceinline__ float k_nf_weigh(float v, const float *w, long j, int mode, int round16)
{
    if (mode == MUSE_K_NORM_PLUS1) v = __fmul_rn(v, __fadd_rn(1.0f, w[j]));
    if (mode == MUSE_K_NORM_PLAIN) v = __fmul_rn(v, w[j]);
    return round16 ? muse_round_f16(v) : v;
}

/* out row = weighed (x * s): the thread's float4s, then its tail element. */
__device__ __forceinline__ void k_nf_out(const float *x, long n, double s, const float *w, int mode,
                                         int round16, float *o, bool vec)
{
    long nv = n / 4;
    for (long v = threadIdx.x; v < nv; v += blockDim.x) {
        float4 a = k_fr_load4(x, v, vec);
        a.x = k_nf_weigh((float)((double)a.x * s), w, 4 * v, mode, round16);
        a.y = k_nf_weigh((float)((double)a.y * s), w, 4 * v + 1, mode, round16);
        a.z = k_nf_weigh((float)((double)a.z * s), w, 4 * v + 2, mode, round16);
        a.w = k_nf_weigh((float)((double)a.w * s), w, 4 * v + 3, mode, round16);
        k_fr_store4(o, v, a, vec);
    }
    long j = 4 * nv + threadIdx.x;
    if (j < n) o[j] = k_nf_weigh((float)((double)x[j] * s), w, j, mode, round16);
}

/* h row += (1 + w) * (y * s) element by element, as k_add_norm; returns the thread's share of
 * the new h's sum of squares (fast_rows.cuh's layout) for a norm that follows. */
__device__ __forceinline__ double k_nf_add(float *h, const float *y, long n, double s,
                                           const float *w, bool vec)
{
    double acc = 0;
    long nv = n / 4;
    for (long v = threadIdx.x; v < nv; v += blockDim.x) {
        float4 a = k_fr_load4(y, v, vec), b = k_fr_load4(h, v, vec);
        b.x = __fadd_rn(b.x, __fmul_rn((float)((double)a.x * s), __fadd_rn(1.0f, w[4 * v])));
        b.y = __fadd_rn(b.y, __fmul_rn((float)((double)a.y * s), __fadd_rn(1.0f, w[4 * v + 1])));
        b.z = __fadd_rn(b.z, __fmul_rn((float)((double)a.z * s), __fadd_rn(1.0f, w[4 * v + 2])));
        b.w = __fadd_rn(b.w, __fmul_rn((float)((double)a.w * s), __fadd_rn(1.0f, w[4 * v + 3])));
        k_fr_store4(h, v, b, vec);
        acc += k_fr_sq4(b);
    }
    long j = 4 * nv + threadIdx.x;
    if (j < n) {
        h[j] = __fadd_rn(h[j], __fmul_rn((float)((double)y[j] * s), __fadd_rn(1.0f, w[j])));
        acc += (double)h[j] * (double)h[j];
    }
    return acc;
}

/* Shape: grid rows, block k_fr_threads(width); row r's weight w + w_row[r] * w_stride (the
 * MoE's per-expert norms) where w_row is given. */
__global__ void k_norm_fast(const float *x, long width, const float *w, long w_stride,
                            const int32_t *w_row, int mode, double eps, int round16, float *out)
{
    long r = blockIdx.x;
    if (w && w_row) w += (long)w_row[r] * w_stride;
    const float *xr = x + r * width;
    float *o = out + r * width;
    bool vec = width % 4 == 0 && k_fr_aligned(x) && k_fr_aligned(out);
    double s = k_fr_scale(k_fr_block_sum(k_fr_sum_sq(xr, width, vec)), width, eps);
    k_nf_out(xr, width, s, w, mode, round16, o, vec);
}

/* Shape: grid rows, block k_fr_threads(width); out NULL: add_norm alone. */
__global__ void k_add_norm_fast(float *h, const float *y, long width, const float *w, double eps,
                                const float *next_w, int next_mode, double next_eps, float *out)
{
    long r = blockIdx.x;
    const float *yr = y + r * width;
    float *hr = h + r * width;
    bool vec = width % 4 == 0 && k_fr_aligned(h) && k_fr_aligned(y) && (!out || k_fr_aligned(out));
    double s = k_fr_scale(k_fr_block_sum(k_fr_sum_sq(yr, width, vec)), width, eps);
    double acc = k_nf_add(hr, yr, width, s, w, vec);
    if (!out) return;
    double s2 = k_fr_scale(k_fr_block_sum(acc), width, next_eps);
    k_nf_out(hr, width, s2, next_w, next_mode, 1, out + r * width, vec);
}

MUSE_K_API int muse_k_norm_fast(const muse_k_ctx *ctx, const float *x, long width, const float *w,
                                int mode, double eps, int round16, float *out)
{
    return muse_k_norm_fast_rows(ctx, x, width, w, 0, NULL, mode, eps, round16, out);
}

MUSE_K_API int muse_k_norm_fast_rows(const muse_k_ctx *ctx, const float *x, long width,
                                     const float *w, long w_stride, const int32_t *w_row, int mode,
                                     double eps, int round16, float *out)
{
    if (ctx->rows <= 0 || width <= 0) return 0;
    k_norm_fast<<<(unsigned)ctx->rows, k_fr_threads(width), 0, ctx->st>>>(
        x, width, w, w_stride, w_row, mode, eps, round16, out);
    return (int)cudaGetLastError();
}

MUSE_K_API int muse_k_add_norm_fast(const muse_k_ctx *ctx, float *h, const float *y, long width,
                                    const float *w, double eps)
{
    if (ctx->rows <= 0 || width <= 0) return 0;
    k_add_norm_fast<<<(unsigned)ctx->rows, k_fr_threads(width), 0, ctx->st>>>(
        h, y, width, w, eps, NULL, MUSE_K_NORM_NONE, 0, NULL);
    return (int)cudaGetLastError();
}

MUSE_K_API int muse_k_add_norm_norm_fast(const muse_k_ctx *ctx, float *h, const float *y,
                                         long width, const float *w, double eps,
                                         const float *next_w, int next_mode, double next_eps,
                                         float *out)
{
    if (ctx->rows <= 0 || width <= 0) return 0;
    k_add_norm_fast<<<(unsigned)ctx->rows, k_fr_threads(width), 0, ctx->st>>>(
        h, y, width, w, eps, next_w, next_mode, next_eps, out);
    return (int)cudaGetLastError();
}
