/* moe: router (one thread a (row, expert): dot_f64 as the CPU), selection (one thread a row,
 * the CPU's scan with strict > so the lower index keeps a tie, fp32 weights), and the combine
 * (one thread a (row, element): fp32 sums in ascending expert index, then the shared experts;
 * the order found once a block), exactly as cpu_backend.c cpu_moe. */
#include "common.cuh"
#include "pdl.cuh"
#include "moe.cuh"
#include "moe_order.cuh"

__global__ void k_router(const float *b, long H, const void *router, int dtype, long E,
                         float *logits)
{
    long r = blockIdx.y, x = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= E) return;
    logits[r * E + x] = (float)k_dot_f64_w(b + r * H, router, dtype, (int64_t)x * H, H);
}

__global__ void k_select(const float *logits, long E, long K, const float *bias, int norm_topk,
                         float scaling, int32_t *sel, float *w)
{
    extern __shared__ float sh[]; /* s[E], key[E], taken[E] */
    float *s = sh, *key = sh + E;
    unsigned char *taken = (unsigned char *)(sh + 2 * E);
    long r = blockIdx.x;
    const float *lg = logits + r * E;
    for (long x = threadIdx.x; x < E; x += blockDim.x) {
        s[x] = k_sigmoid(lg[x]);
        key[x] = bias ? __fadd_rn(s[x], bias[x]) : s[x];
        taken[x] = 0;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    int32_t *sr = sel + r * K;
    float *wr = w + r * K;
    float sum = 0;
    for (long i = 0; i < K; i++) {
        long best = 0;
        while (taken[best]) best++;
        for (long x = best + 1; x < E; x++)
            if (!taken[x] && key[x] > key[best]) best = x;
        taken[best] = 1;
        sr[i] = (int32_t)best;
        wr[i] = s[best];
        sum = __fadd_rn(sum, s[best]);
    }
    for (long i = 0; i < K; i++) {
        if (norm_topk) wr[i] = __fdiv_rn(wr[i], sum);
        wr[i] = __fmul_rn(wr[i], scaling);
    }
}

__global__ void k_moe_combine(const int32_t *sel, const float *w, const float *z,
                              const float *shared, long K, long H, float *y)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    __shared__ int32_t s_sel[MC_MAX_K], s_lead[MC_MAX_K], s_at[MC_MAX_K];
    __shared__ int s_n;
    long r = blockIdx.y, d = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t *sr = sel + r * K;
    float acc = 0;
    if (K <= MC_MAX_K && K <= blockDim.x) { /* the order once a block; every z load at once */
        int n = d_combine_order(sr, K, s_sel, s_lead, s_at, &s_n);
        if (d >= H) return;
#pragma unroll 8
        for (int m = 0; m < n; m++) {
            long at = s_at[m];
            acc = __fadd_rn(acc, __fmul_rn(w[r * K + at], z[(r * K + at) * H + d]));
        }
    } else {
        if (d >= H) return;
        int32_t last = -1;
        for (long n = 0; n < K; n++) { /* the next expert index up: the CPU's ascending loop */
            long at = -1;
            for (long i = 0; i < K; i++)
                if (sr[i] > last && (at < 0 || sr[i] < sr[at])) at = i;
            if (at < 0) break;
            last = sr[at];
            acc = __fadd_rn(acc, __fmul_rn(w[r * K + at], z[(r * K + at) * H + d]));
        }
    }
    if (shared) acc = __fadd_rn(acc, shared[r * H + d]);
    y[r * H + d] = acc;
}

MUSE_K_API int muse_k_router(const muse_k_ctx *ctx, const float *b, long H, const void *router,
                             int dtype, long E, float *logits)
{
    long rows = ctx->rows;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    k_router<<<dim3((unsigned)((E + 127) / 128), (unsigned)rows), 128, 0, st>>>(b, H, router,
                                                                               dtype, E, logits);
    return (int)cudaGetLastError();
}

MUSE_K_API int muse_k_select(const muse_k_ctx *ctx, const float *logits, long E, long K,
                             const float *bias, int norm_topk, float scaling, int32_t *sel,
                             float *w)
{
    long rows = ctx->rows;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    size_t shared = (size_t)E * (2 * sizeof(float) + 1);
    if (shared > 48 * 1024 || K > E) return (int)cudaErrorInvalidValue;
    k_select<<<(unsigned)rows, 128, shared, st>>>(logits, E, K, bias, norm_topk, scaling, sel, w);
    return (int)cudaGetLastError();
}

MUSE_K_API int muse_k_moe_combine(const muse_k_ctx *ctx, const int32_t *sel, const float *w,
                                  const float *z, const float *shared, long K, long H, float *y)
{
    long rows = ctx->rows;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    return k_launch(k_moe_combine, dim3((unsigned)((H + 127) / 128), (unsigned)rows), 128, 0, st,
                    sel, w, z, shared, K, H, y);
}
