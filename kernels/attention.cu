/* attention: kv_write (one thread an element) and attention (one block of 128 threads a
 * (row, query head)). The scores are recomputed in each of three passes instead of stored
 * (the same bits each time): the max, the sum of exp in position order by one thread, and
 * the weighted sum of V, each output dimension by one thread in position order, all in double
 * as cpu_backend.c attn_rows does. Shapes: q, g, o [R, hq * hd]; k, v [R, kv_width]. */
#include "attention.cuh"
#include "common.cuh"
#include "pdl.cuh"
#include "model/kv_addr.h"

#define AT_THREADS 128
#define AT_MAX_DIM 512

__device__ __forceinline__ int64_t k_kv_offset(const muse_k_kv *kv, int seq, int64_t s)
{
    return muse_kv_offset(kv->tables, kv->blocks_per_seq, kv->cap, seq, s, 0, kv->kv_width);
}

__global__ void k_kv_write(muse_k_kv kv, const float *k, const float *v, long ld,
                           const int32_t *seqs, const int64_t *positions)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long r = blockIdx.x;
    int seq = seqs[r];
    if (seq < 0) return;
    int64_t at = k_kv_offset(&kv, seq, positions[r]);
    if (at < 0) return;
    for (long d = threadIdx.x; d < kv.kv_width; d += blockDim.x) {
        kv.k[at + d] = muse_f32_to_f16(k[r * ld + d]);
        kv.v[at + d] = muse_f32_to_f16(v[r * ld + d]);
    }
}

__device__ __forceinline__ double k_score(const muse_k_kv *kv, const float *q, int seq, int64_t s,
                                          long kh, long hd, double scale)
{
    int64_t at = k_kv_offset(kv, seq, s);
    if (at < 0) return 0; /* unreserved block: the caller broke the contract */
    return k_dot_f64_w(q, kv->k, MUSE_K_F16, at + kh * hd, hd) * scale;
}

__global__ void k_attention(muse_k_kv kv, const float *qa, const float *ga, float *oa, long hq,
                            long hd, long group, long window, double scale, const int32_t *seqs,
                            const int64_t *positions)
{
    __shared__ double e[AT_THREADS];
    __shared__ double red[AT_THREADS];
    long r = blockIdx.x, h = blockIdx.y;
    int t = threadIdx.x;
    float *o = oa + (r * hq + h) * hd;
    int seq = seqs[r];
    if (seq < 0) {
        for (long d = t; d < hd; d += AT_THREADS) o[d] = 0;
        return;
    }
    int64_t p = positions[r];
    int64_t first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const float *q = qa + (r * hq + h) * hd;
    long kh = h / group;
    double mx = -INFINITY;
    for (int64_t base = first; base <= p; base += AT_THREADS) {
        int64_t s = base + t;
        if (s <= p) {
            double sc = k_score(&kv, q, seq, s, kh, hd, scale);
            if (sc > mx) mx = sc;
        }
    }
    red[t] = mx;
    __syncthreads();
    for (int w = AT_THREADS / 2; w > 0; w >>= 1) {
        if (t < w && red[t + w] > red[t]) red[t] = red[t + w];
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    double sum = 0;
    for (int64_t base = first; base <= p; base += AT_THREADS) {
        int64_t s = base + t;
        e[t] = s <= p ? exp(k_score(&kv, q, seq, s, kh, hd, scale) - mx) : 0;
        __syncthreads();
        if (t == 0) {
            int64_t n = p - base + 1 < AT_THREADS ? p - base + 1 : AT_THREADS;
            for (int64_t i = 0; i < n; i++) sum += e[i];
        }
        __syncthreads();
    }
    if (t == 0) red[0] = sum;
    __syncthreads();
    sum = red[0];
    double acc[AT_MAX_DIM / AT_THREADS] = {0, 0, 0, 0};
    for (int64_t base = first; base <= p; base += AT_THREADS) {
        int64_t s = base + t;
        e[t] = s <= p ? exp(k_score(&kv, q, seq, s, kh, hd, scale) - mx) : 0;
        __syncthreads();
        int64_t n = p - base + 1 < AT_THREADS ? p - base + 1 : AT_THREADS;
        for (int64_t i = 0; i < n; i++) {
            int64_t at = k_kv_offset(&kv, seq, base + i);
            if (at < 0) continue;
            const uint16_t *vr = kv.v + at + kh * hd;
            double w = e[i] / sum;
#pragma unroll
            for (int m = 0; m < AT_MAX_DIM / AT_THREADS; m++) {
                long d = t + m * AT_THREADS;
                if (d < hd) acc[m] += w * (double)muse_f16_to_f32(vr[d]);
            }
        }
        __syncthreads();
    }
    const float *g = ga + (r * hq + h) * hd;
#pragma unroll
    for (int m = 0; m < AT_MAX_DIM / AT_THREADS; m++) {
        long d = t + m * AT_THREADS;
        if (d < hd) o[d] = muse_round_f16(__fmul_rn((float)acc[m], k_sigmoid(g[d])));
    }
}

MUSE_K_API int muse_k_kv_write(const muse_k_ctx *ctx, muse_k_kv kv, const float *k, const float *v,
                               long ld)
{
    long rows = ctx->rows;
    const int32_t *seqs = ctx->seqs;
    const int64_t *positions = ctx->positions;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    if (ld < kv.kv_width) return (int)cudaErrorInvalidValue;
    return k_launch(k_kv_write, (unsigned)rows, 128, 0, st, kv, k, v, ld, seqs, positions);
}

MUSE_K_API int muse_k_attention(const muse_k_ctx *ctx, muse_k_kv kv, const float *q, const float *g,
                                float *o, long hq, long hd, long group, long window, double scale)
{
    long rows = ctx->rows;
    const int32_t *seqs = ctx->seqs;
    const int64_t *positions = ctx->positions;
    cudaStream_t st = ctx->st;
    if (rows <= 0 || hq <= 0) return 0;
    if (hd > AT_MAX_DIM) return (int)cudaErrorInvalidValue;
    k_attention<<<dim3((unsigned)rows, (unsigned)hq), AT_THREADS, 0, st>>>(
        kv, q, g, o, hq, hd, group, window, scale, seqs, positions);
    return (int)cudaGetLastError();
}
