/* embed (fast path): one block a row of k_fr_threads(H) threads gathers the token's row as fp32
 * into out (the exact kernel's conversion), sums its squares in fast_rows.cuh's fixed tree and
 * scales each element as kernels/embed.cu does. A thread rescales only what it wrote. */
#include "common.cuh"
#include "embed_fast.cuh"
#include "fast_rows.cuh"
#include "pdl.cuh"

/* Shape: grid rows, block k_fr_threads(H). */
__global__ void k_embed_fast(const void *table, int dtype, const int32_t *tokens, long H,
                             double eps, float *out)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long r = blockIdx.x, nv = H / 4;
    float *row = out + r * H;
    int64_t base = (int64_t)tokens[r] * H;
    bool vec = H % 4 == 0 && k_fr_aligned(out);
    double acc = 0;
    for (long v = threadIdx.x; v < nv; v += blockDim.x) {
        int64_t i = base + 4 * v;
        float4 a = make_float4(k_load(table, dtype, i), k_load(table, dtype, i + 1),
                               k_load(table, dtype, i + 2), k_load(table, dtype, i + 3));
        k_fr_store4(row, v, a, vec);
        acc += k_fr_sq4(a);
    }
    long j = 4 * nv + threadIdx.x;
    if (j < H) {
        row[j] = k_load(table, dtype, base + j);
        acc += (double)row[j] * (double)row[j];
    }
    double s = k_fr_scale(k_fr_block_sum(acc), H, eps);
    for (long v = threadIdx.x; v < nv; v += blockDim.x) {
        float4 a = k_fr_load4(row, v, vec);
        a = make_float4((float)((double)a.x * s), (float)((double)a.y * s),
                        (float)((double)a.z * s), (float)((double)a.w * s));
        k_fr_store4(row, v, a, vec);
    }
    if (j < H) row[j] = (float)((double)row[j] * s);
}

MUSE_K_API int muse_k_embed_fast(const muse_k_ctx *ctx, const void *table, int dtype, long H,
                                 double eps, float *out)
{
    if (ctx->rows <= 0 || H <= 0) return 0;
    return k_launch(k_embed_fast, (unsigned)ctx->rows, k_fr_threads(H), 0, ctx->st, table, dtype,
                    ctx->tokens, H, eps, out);
}
