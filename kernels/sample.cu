/* sample: one block of 1024 threads a wanted row. The rules are the host sampler's
 * (engine/text/sampler.c): greedy and the non-finite cases first; else integer weights
 * q = round(2^S exp((x - max) / T)) on the same IEEE float operation sequence (explicit _rn
 * intrinsics, no contraction), keys (q bits << 32 | ~id) ordered descending, the filters top_k,
 * top_p, min_p as key cut-offs and the draw as the key where the running total in key order
 * passes the target. The generator, the exact products, the min_p cut and the keys are the
 * host's own code (engine/base/sampler_exact.h). Where the host walks histogram bins, this
 * finds the same key by a bitwise search over the 64-bit key space, each step an exact integer
 * sum over the row (so no order of summation can matter). A masked row (muse_sample_masked)
 * reads a token whose bit is clear as -inf, and when nothing allowed is above -inf draws the
 * lowest allowed id; a free row reads its logits as before. */
#include <float.h>

#include "common.cuh"
#include "sample.cuh"
#include "base/sampler_exact.h" /* the integer steps, one copy with the host sampler */

#define SM_THREADS 1024

/* lane_weights of the host sampler for one logit */
__device__ __forceinline__ float k_weight(float x, float max, float inv_t, int wb)
{
    const float z_min = __fsub_rn(0.0f, __fmul_rn((float)(wb + 2), 0.693147182f));
    const float round_magic = 0x1.8p23f, two23 = 0x1p23f;
    float z = __fmul_rn(__fsub_rn(x, max), inv_t);
    bool finite = z >= z_min;
    if (!finite) z = 0;
    float kf = __fsub_rn(__fadd_rn(__fmul_rn(z, 1.44269502f), round_magic), round_magic);
    float r = __fsub_rn(__fsub_rn(z, __fmul_rn(kf, 0.693359375f)), __fmul_rn(kf, -2.12194440e-4f));
    float p = __fadd_rn(__fmul_rn(__fdiv_rn(1.0f, 5040.0f), r), __fdiv_rn(1.0f, 720.0f));
    p = __fadd_rn(__fmul_rn(p, r), __fdiv_rn(1.0f, 120.0f));
    p = __fadd_rn(__fmul_rn(p, r), __fdiv_rn(1.0f, 24.0f));
    p = __fadd_rn(__fmul_rn(p, r), __fdiv_rn(1.0f, 6.0f));
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    int k = (int)kf;
    float scale = muse_bits_to_f32((uint32_t)(k + (127 + wb)) << 23);
    float q = __fmul_rn(p, scale);
    if (q < two23) q = __fsub_rn(__fadd_rn(q, two23), two23);
    float top = (float)((uint64_t)1 << wb);
    if (q > top) q = top;
    return finite ? q : 0.0f;
}

/* The logit the row's draw sees: -inf where the row's mask (NULL: none) clears the token. */
__device__ __forceinline__ float k_logit(const float *lg, const uint8_t *mk, long i)
{
    return !mk || (mk[i >> 3] >> (i & 7)) & 1 ? lg[i] : -INFINITY;
}

/* The lowest id of [0, V) the mask allows, V when none (every thread gets it). */
__device__ long k_first_allowed(const uint8_t *mk, long V, long *imin_sh)
{
    int t = threadIdx.x;
    long first = V;
    for (long i = t; i < V; i += SM_THREADS)
        if ((mk[i >> 3] >> (i & 7)) & 1 && i < first) first = i;
    __syncthreads(); /* every thread has read the last use of imin_sh */
    imin_sh[t] = first;
    __syncthreads();
    for (int w = SM_THREADS / 2; w > 0; w >>= 1) {
        if (t < w && imin_sh[t + w] < imin_sh[t]) imin_sh[t] = imin_sh[t + w];
        __syncthreads();
    }
    return imin_sh[0];
}

__device__ __forceinline__ uint64_t k_key(const float *wts, long i)
{
    return muse_sx_key(muse_f32_to_bits(wts[i]), i);
}

/* Sum over the block of v (every thread gets it). */
__device__ __forceinline__ uint64_t k_block_sum_u64(uint64_t v, uint64_t *red)
{
    int t = threadIdx.x;
    red[t] = v;
    __syncthreads();
    for (int w = SM_THREADS / 2; w > 0; w >>= 1) {
        if (t < w) red[t] += red[t + w];
        __syncthreads();
    }
    uint64_t s = red[0];
    __syncthreads();
    return s;
}

/* Total share (1 or q) of the candidates (q > 0) whose key is >= cut. */
__device__ uint64_t k_share_from(const float *wts, long V, uint64_t cut, int by_count,
                                 uint64_t *red)
{
    uint64_t s = 0;
    for (long i = threadIdx.x; i < V; i += SM_THREADS) {
        float q = wts[i];
        if (q > 0 && k_key(wts, i) >= cut) s += by_count ? 1 : (uint64_t)q;
    }
    return k_block_sum_u64(s, red);
}

/* The key where the running total in key-descending order first exceeds target: the largest
 * key T with share_from(T) > target (the caller guarantees share_from(0) > target). */
__device__ uint64_t k_crossing(const float *wts, long V, uint64_t target, int by_count,
                               uint64_t *red)
{
    uint64_t key = 0;
    for (int bit = 63; bit >= 0; bit--) {
        uint64_t cand = key | (1ull << bit);
        if (k_share_from(wts, V, cand, by_count, red) > target) key = cand;
    }
    return key;
}

__global__ void __launch_bounds__(SM_THREADS)
    k_sample(const float *logits_all, long V, const muse_k_sampling *params,
             const int64_t *draw_pos, const uint8_t *masks, int wb, float *weights_all,
             int32_t *tokens)
{
    __shared__ uint64_t red[SM_THREADS];
    __shared__ float fmax_sh[SM_THREADS];
    __shared__ long imin_sh[SM_THREADS];
    long row = blockIdx.x;
    int t = threadIdx.x;
    const float *lg = logits_all + row * V;
    float *wts = weights_all + row * V;
    muse_k_sampling p = params[row];
    const uint8_t *mk = masks && p.masked ? masks + row * ((V + 7) / 8) : NULL;
    /* the highest logit (NaN below -inf) */
    float mx = -INFINITY;
    for (long i = t; i < V; i += SM_THREADS) {
        float x = k_logit(lg, mk, i);
        mx = x > mx ? x : mx;
    }
    fmax_sh[t] = mx;
    __syncthreads();
    for (int w = SM_THREADS / 2; w > 0; w >>= 1) {
        if (t < w && fmax_sh[t + w] > fmax_sh[t]) fmax_sh[t] = fmax_sh[t + w];
        __syncthreads();
    }
    mx = fmax_sh[0];
    /* the lowest id holding it (or, when nothing is above -inf, the lowest holding -inf) */
    long first = V;
    for (long i = t; i < V; i += SM_THREADS)
        if (k_logit(lg, mk, i) == mx && i < first) first = i;
    imin_sh[t] = first;
    __syncthreads();
    for (int w = SM_THREADS / 2; w > 0; w >>= 1) {
        if (t < w && imin_sh[t + w] < imin_sh[t]) imin_sh[t] = imin_sh[t + w];
        __syncthreads();
    }
    long best = imin_sh[0];
    if (mx == -INFINITY || !(p.temperature > 0) || mx == INFINITY) {
        long tok = best < V ? best : 0;
        /* nothing allowed above -inf: the -inf found may be a masked token (mx is the row's) */
        if (mk && mx == -INFINITY) {
            long allowed = k_first_allowed(mk, V, imin_sh);
            if (allowed < V && !((mk[tok >> 3] >> (tok & 7)) & 1)) tok = allowed;
        }
        if (t == 0) tokens[row] = (int32_t)tok;
        return;
    }
    float inv_t = __fdiv_rn(1.0f, p.temperature);
    if (inv_t > FLT_MAX) inv_t = FLT_MAX;
    uint64_t total = 0, candidates = 0;
    for (long i = t; i < V; i += SM_THREADS) {
        float q = k_weight(k_logit(lg, mk, i), mx, inv_t, wb);
        wts[i] = q;
        total += (uint64_t)q;
        candidates += q > 0;
    }
    __syncthreads();
    total = k_block_sum_u64(total, red);
    candidates = k_block_sum_u64(candidates, red);
    uint64_t cut = 0, kept = total;
    if (p.top_k > 0 && (uint64_t)p.top_k < candidates) {
        cut = k_crossing(wts, V, (uint64_t)p.top_k - 1, 1, red);
        kept = k_share_from(wts, V, cut, 0, red);
    }
    if (p.top_p < 1) {
        uint64_t need = p.top_p > 0 ? muse_sx_ceil_float_times(p.top_p, kept) : 1;
        if (need == 0) need = 1;
        if (need < kept) {
            uint64_t c = k_crossing(wts, V, need - 1, 0, red);
            if (c > cut) {
                cut = c;
                kept = k_share_from(wts, V, cut, 0, red);
            }
        }
    }
    if (p.min_p > 0) {
        uint64_t min_cut = muse_sx_min_p_cut(p.min_p, wb);
        if (min_cut > cut) {
            cut = min_cut;
            kept = k_share_from(wts, V, cut, 0, red);
        }
    }
    uint64_t u53 = muse_sx_rand_bits(p.seed, (uint64_t)draw_pos[row], 0) >> 11;
    uint64_t target = muse_sx_mul_shift(u53, kept, 53, 0);
    uint64_t c = k_crossing(wts, V, target, 0, red);
    if (t == 0) tokens[row] = (int32_t)muse_sx_key_id(c);
}

MUSE_K_API int muse_k_sample(const muse_k_ctx *ctx, const float *logits, long V, int weight_bits,
                             float *weights, int32_t *tokens)
{
    long n = ctx->rows;
    const muse_k_sampling *params = ctx->sampling;
    const int64_t *draw_pos = ctx->draw_pos;
    cudaStream_t st = ctx->st;
    if (n <= 0) return 0;
    k_sample<<<(unsigned)n, SM_THREADS, 0, st>>>(logits, V, params, draw_pos, ctx->masks,
                                                 weight_bits, weights, tokens);
    return (int)cudaGetLastError();
}
