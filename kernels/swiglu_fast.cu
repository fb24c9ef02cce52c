/* swiglu (fast path): a thread four elements with 16-byte loads where everything is aligned,
 * each element exactly as kernels/swiglu.cu (silu in double, the product in fp32, fp16), so an
 * element's bits are the exact kernel's whatever the launch. */
#include "common.cuh"
#include "fast_rows.cuh"
#include "pdl.cuh"
#include "swiglu_fast.cuh"

__device__ __forceinline__ float k_sw_one(float g, float u)
{
    double gv = g;
    return k_round_f16_hw(__fmul_rn((float)(gv / (1.0 + exp(-gv))), u));
}

/* Shape: grid ceil(n / 4 / 256), block 256; thread i: elements 4i .. 4i + 3 (those < n). */
__global__ void k_swiglu_fast(const float *gate, const float *up, long n, float *out)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long v = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * v >= n) return;
    if (4 * v + 4 <= n && k_fr_aligned(gate) && k_fr_aligned(up) && k_fr_aligned(out)) {
        float4 g = ((const float4 *)gate)[v], u = ((const float4 *)up)[v];
        ((float4 *)out)[v] = make_float4(k_sw_one(g.x, u.x), k_sw_one(g.y, u.y), k_sw_one(g.z, u.z),
                                         k_sw_one(g.w, u.w));
        return;
    }
    for (long i = 4 * v; i < n && i < 4 * v + 4; i++) out[i] = k_sw_one(gate[i], up[i]);
}

MUSE_K_API int muse_k_swiglu_fast(const muse_k_ctx *ctx, const float *gate, const float *up,
                                  long width, float *out)
{
    long n = ctx->rows * width;
    if (n <= 0) return 0;
    long threads = (n + 3) / 4;
    return k_launch(k_swiglu_fast, (unsigned)((threads + 255) / 256), 256, 0, ctx->st, gate, up, n,
                    out);
}
