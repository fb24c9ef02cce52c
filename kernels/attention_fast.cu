/* attention_fast: flash decoding over the paged cache. A row's key range [first, p] is cut into
 * chunks aligned to absolute positions (attention_fast.h: the chunk size is a function of
 * first and p alone); one block of 128 threads a (row, KV head, chunk) holds the GQA group's
 * query heads, stages K and V 64 positions at a time (16-byte loads, the next tile in flight
 * while this one is used) and keeps fp32 online-softmax partials (max, sum, acc) in the log2
 * domain; a combine block a (row, query head) merges the chunks in ascending order, applies
 * 1/sum and the sigmoid gate and rounds to fp16. No atomics, no order that depends on the
 * batch: prompt rows are rows of the same kernel, each its own causal range. Shapes: q, g, o
 * [R, hq * hd]; workspace [rows][hq][splits] (max, sum) then [rows][hq][splits][hd]. */
#include <cuda_fp16.h>
#include <stdlib.h>

#include "attention_fast.cuh"
#include "attention_fast.h"
#include "common.cuh"
#include "model/kv_addr.h"
#include "pdl.cuh"

#define AF_THREADS 128
#define AF_T       MUSE_ATTN_TILE
#define AF_G       MUSE_ATTN_MAX_GROUP

/* The partials of a launch: per (row, head, split) m and l, then the accumulators. */
typedef struct {
    float *m, *l, *acc;
    int splits; /* the grid's x: muse_attn_max_splits(max_len, cap) */
    int cap;    /* the process's split cap (muse_k_attention_fast_cap) */
} af_ws;

/* GM: the most query heads of a group the instance holds (8 or AF_G) */
template <int HD, int GM> struct __align__(16) af_smem
{
    __half k[AF_T][HD + 8]; /* + 16 bytes a row: a warp's 16-byte reads hit distinct banks */
    __half v[AF_T][HD + 8];
    float q[GM][HD];
    float p[GM][AF_T]; /* scores, then their exp2 */
    float m[GM], l[GM], alpha[GM];
};

/* Thread t's share of a tile's K and V (16 bytes each), zeros outside [lo, hi] or where the
 * block is not reserved, so a masked position adds exactly 0. */
template <int HD>
__device__ __forceinline__ void af_load(const muse_k_kv *kv, int seq, long kh, int64_t base,
                                        int64_t lo, int64_t hi, uint4 *rk, uint4 *rv)
{
    constexpr int PIECES = HD / 8, N = AF_T * PIECES / AF_THREADS;
#pragma unroll
    for (int i = 0; i < N; i++) {
        int idx = threadIdx.x + i * AF_THREADS, pos = idx / PIECES, piece = idx % PIECES;
        int64_t s = base + pos;
        uint4 z = make_uint4(0, 0, 0, 0);
        rk[i] = z;
        rv[i] = z;
        if (s < lo || s > hi) continue;
        int64_t at =
            muse_kv_offset(kv->tables, kv->blocks_per_seq, kv->cap, seq, s, 0, kv->kv_width);
        if (at < 0) continue;
        at += kh * HD + piece * 8;
        rk[i] = __ldg((const uint4 *)(kv->k + at));
        rv[i] = __ldg((const uint4 *)(kv->v + at));
    }
}

template <int HD, int GM>
__device__ __forceinline__ void af_store(af_smem<HD, GM> *sm, const uint4 *rk, const uint4 *rv)
{
    constexpr int PIECES = HD / 8, N = AF_T * PIECES / AF_THREADS;
#pragma unroll
    for (int i = 0; i < N; i++) {
        int idx = threadIdx.x + i * AF_THREADS, pos = idx / PIECES, piece = idx % PIECES;
        *(uint4 *)&sm->k[pos][piece * 8] = rk[i];
        *(uint4 *)&sm->v[pos][piece * 8] = rv[i];
    }
}

/* grid (splits, KV heads of the rank, rows); 128 threads. Block (s, b, r): query heads
 * [b * group, b * group + group) of row r over split s of its key range. GM: group <= GM (8:
 * about half the registers and 4 KB less shared memory than 16 for the heads' arrays; a head's
 * arithmetic is the same at either). */
template <int HD, int GM>
__global__ void __launch_bounds__(AF_THREADS)
    k_attn_split(muse_k_kv kv, const float *qa, long hq, int group, long window, float scale_l2,
                 const int32_t *seqs, const int64_t *positions, af_ws ws)
{
    __shared__ af_smem<HD, GM> sm;
    K_PDL_NEXT();
    K_PDL_WAIT();
    int split = blockIdx.x, b = blockIdx.y, t = threadIdx.x;
    long r = blockIdx.z;
    int seq = seqs[r];
    if (seq < 0) return;
    int64_t p = positions[r], first = muse_attn_first(p, window);
    int64_t chunk = muse_attn_chunk(first, p, ws.cap);
    if (split >= muse_attn_count(first, p, chunk)) return;
    int64_t lo, hi;
    muse_attn_split_range(first, p, chunk, split, &lo, &hi);
    int G = group;
    long h0 = (long)b * G;
    for (int i = t; i < GM * HD; i += AF_THREADS) {
        int g = i / HD, d = i % HD;
        sm.q[g][d] = g < G && h0 + g < hq ? qa[(r * hq + h0 + g) * HD + d] : 0.0f;
    }
    if (t < GM) {
        sm.m[t] = -INFINITY;
        sm.l[t] = 0.0f;
    }
    constexpr int N = AF_T * (HD / 8) / AF_THREADS;
    uint4 rk[N], rv[N];
    int64_t base = lo / AF_T * AF_T;
    af_load<HD>(&kv, seq, b, base, lo, hi, rk, rv);
    /* scores: thread t a position, heads t / 64 + 2j; PV: dims (2 d2, 2 d2 + 1), heads gb + NG j */
    int pos = t % AF_T, gs = t / AF_T;
    constexpr int NG = AF_THREADS / (HD / 2), PVJ = GM / NG;
    int d2 = t % (HD / 2), gb = t / (HD / 2);
    float2 acc[PVJ];
#pragma unroll
    for (int j = 0; j < PVJ; j++) acc[j] = make_float2(0.0f, 0.0f);
    for (; base <= hi; base += AF_T) {
        __syncthreads(); /* the previous tile's readers are done */
        af_store<HD, GM>(&sm, rk, rv);
        __syncthreads();
        if (base + AF_T <= hi) af_load<HD>(&kv, seq, b, base + AF_T, lo, hi, rk, rv);
        float sc[GM / 2];
#pragma unroll
        for (int j = 0; j < GM / 2; j++) sc[j] = 0.0f;
#pragma unroll
        for (int d = 0; d < HD; d += 8) {
            uint4 raw = *(const uint4 *)&sm.k[pos][d];
            const __half2 *h2 = (const __half2 *)&raw;
            float kf[8];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 f = __half22float2(h2[e]);
                kf[2 * e] = f.x;
                kf[2 * e + 1] = f.y;
            }
#pragma unroll
            for (int j = 0; j < GM / 2; j++) {
                int g = gs + 2 * j;
                if (g < G) {
                    float4 qa0 = *(const float4 *)&sm.q[g][d],
                           qa1 = *(const float4 *)&sm.q[g][d + 4];
                    const float qf[8] = {qa0.x, qa0.y, qa0.z, qa0.w, qa1.x, qa1.y, qa1.z, qa1.w};
#pragma unroll
                    for (int e = 0; e < 8; e++) sc[j] = fmaf(qf[e], kf[e], sc[j]);
                }
            }
        }
        int64_t s = base + pos;
        int valid = s >= lo && s <= hi;
#pragma unroll
        for (int j = 0; j < GM / 2; j++) {
            int g = gs + 2 * j;
            if (g < G) sm.p[g][pos] = valid ? sc[j] * scale_l2 : -INFINITY;
        }
        __syncthreads();
        /* online softmax: warp w heads w, w + 4, ...; butterfly sums give every lane one value */
        int w = t / 32, lane = t % 32;
        for (int g = w; g < G; g += AF_THREADS / 32) {
            float a = sm.p[g][lane], c = sm.p[g][lane + 32];
            float mx = fmaxf(a, c);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float m_old = sm.m[g], m_new = fmaxf(m_old, mx);
            float ea = muse_attn_rescale(a, m_new), ec = muse_attn_rescale(c, m_new);
            float sum = ea + ec;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            float alpha = muse_attn_rescale(m_old, m_new);
            sm.p[g][lane] = ea;
            sm.p[g][lane + 32] = ec;
            __syncwarp();
            if (lane == 0) {
                sm.alpha[g] = alpha;
                sm.m[g] = m_new;
                sm.l[g] = fmaf(sm.l[g], alpha, sum);
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < PVJ; j++) {
            int g = gb + NG * j;
            if (g < G) {
                float al = sm.alpha[g];
                acc[j].x *= al;
                acc[j].y *= al;
            }
        }
        for (int i = 0; i < AF_T; i += 4) { /* 4 positions: one 16-byte read of each P row */
            float2 v[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                v[e] = __half22float2(*(const __half2 *)&sm.v[i + e][2 * d2]);
#pragma unroll
            for (int j = 0; j < PVJ; j++) {
                int g = gb + NG * j;
                if (g < G) {
                    float4 p4 = *(const float4 *)&sm.p[g][i];
                    const float pw[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) { /* position order, as one at a time */
                        acc[j].x = fmaf(pw[e], v[e].x, acc[j].x);
                        acc[j].y = fmaf(pw[e], v[e].y, acc[j].y);
                    }
                }
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PVJ; j++) {
        int g = gb + NG * j;
        long h = h0 + g;
        if (g < G && h < hq) {
            size_t at = ((size_t)r * hq + h) * ws.splits + split;
            *(float2 *)&ws.acc[at * HD + 2 * d2] = acc[j];
            if (d2 == 0) {
                ws.m[at] = sm.m[g];
                ws.l[at] = sm.l[g];
            }
        }
    }
}

/* grid (hq, rows); hd threads: dimension d of (row, head) merged over the row's splits in
 * ascending order, then 1/sum, the gate and fp16 as the exact kernel rounds. */
__global__ void k_attn_combine(const float *ga, float *oa, long hq, long hd, long window,
                               const int32_t *seqs, const int64_t *positions, af_ws ws)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long h = blockIdx.x, r = blockIdx.y;
    int d = threadIdx.x;
    float *o = oa + (r * hq + h) * hd;
    if (seqs[r] < 0) {
        o[d] = 0;
        return;
    }
    int64_t p = positions[r], first = muse_attn_first(p, window);
    int64_t n = muse_attn_count(first, p, muse_attn_chunk(first, p, ws.cap));
    if (n > ws.splits) n = ws.splits; /* past max_len: the caller broke the contract */
    size_t at = ((size_t)r * hq + h) * ws.splits;
    float mx = -INFINITY;
    for (int64_t s = 0; s < n; s++) mx = fmaxf(mx, ws.m[at + s]);
    float l = 0.0f, acc = 0.0f;
    for (int64_t s = 0; s < n; s++) {
        float w = muse_attn_rescale(ws.m[at + s], mx);
        l = fmaf(w, ws.l[at + s], l);
        acc = fmaf(w, ws.acc[(at + s) * hd + d], acc);
    }
    float a = l > 0.0f ? acc / l : 0.0f;
    o[d] = muse_round_f16(__fmul_rn(a, k_sigmoid(ga[(r * hq + h) * hd + d])));
}

MUSE_K_API int muse_k_attention_fast_fits(long hd, long group)
{
    return (hd == 64 || hd == 128) && group >= 1 && group <= AF_G;
}

MUSE_K_API int muse_k_attention_fast_cap(void)
{
    static const int cap = [] {
        const char *v = getenv("MUSE_ATTN_SPLITS");
        int n = v && *v ? atoi(v) : 0;
        return n >= 1 && n <= MUSE_ATTN_MOST_SPLITS ? n : MUSE_ATTN_MAX_SPLITS;
    }();
    return cap;
}

MUSE_K_API size_t muse_k_attention_fast_workspace(long hq, long hd, int64_t max_len, long rows)
{
    if (rows > MUSE_ATTN_WS_ROWS) rows = MUSE_ATTN_WS_ROWS;
    if (hq <= 0 || rows <= 0) return 0;
    return (size_t)muse_attn_ws_row_bytes(hq, hd, max_len, muse_k_attention_fast_cap()) *
           (size_t)rows;
}

/* 8-head arrays for groups of up to 8 (on the H200 at 131072 keys, 235 us a full layer
 * against 248 with 16-head arrays: 90 registers, 22.6 KB; capped at 80 registers for 6 blocks
 * an SM it took 278), else 16 */
template <int HD>
static int af_launch(cudaStream_t st, const muse_k_kv &kv, const float *q, long hq, int group,
                     long window, float scale_l2, const int32_t *seqs, const int64_t *positions,
                     long rows, af_ws ws)
{
    unsigned kvb = (unsigned)((hq + group - 1) / group);
    dim3 grid((unsigned)ws.splits, kvb, (unsigned)rows);
    if (group <= 8)
        return k_launch(k_attn_split<HD, 8>, grid, AF_THREADS, 0, st, kv, q, hq, group, window,
                        scale_l2, seqs, positions, ws);
    return k_launch(k_attn_split<HD, AF_G>, grid, AF_THREADS, 0, st, kv, q, hq, group, window,
                    scale_l2, seqs, positions, ws);
}

MUSE_K_API int muse_k_attention_fast(const muse_k_ctx *ctx, muse_k_kv kv, const float *q,
                                     const float *g, float *o, long hq, long hd, long group,
                                     long window, double scale, int64_t max_len, void *ws,
                                     size_t ws_bytes)
{
    long rows = ctx->rows;
    if (rows <= 0 || hq <= 0) return 0;
    if (!muse_k_attention_fast_fits(hd, group) || !ws || max_len <= 0) {
        return (int)cudaErrorInvalidValue;
    }
    int cap = muse_k_attention_fast_cap();
    size_t per_row = (size_t)muse_attn_ws_row_bytes(hq, hd, max_len, cap);
    long step = (long)(ws_bytes / per_row);
    if (step < 1) return (int)cudaErrorInvalidValue;
    if (step > MUSE_ATTN_WS_ROWS) step = MUSE_ATTN_WS_ROWS;
    af_ws w;
    w.splits = (int)muse_attn_max_splits(max_len, cap);
    w.cap = cap;
    size_t heads = (size_t)step * (size_t)hq * (size_t)w.splits;
    w.m = (float *)ws;
    w.l = w.m + heads;
    w.acc = w.l + heads;
    float scale_l2 = (float)(scale * 1.4426950408889634); /* scores in the log2 domain */
    /* row groups run one after another on the stream: a row's arithmetic is its own in any */
    for (long r0 = 0; r0 < rows; r0 += step) {
        long n = rows - r0 < step ? rows - r0 : step;
        const int32_t *seqs = ctx->seqs + r0;
        const int64_t *positions = ctx->positions + r0;
        const float *qr = q + r0 * hq * hd;
        int rc = hd == 64 ? af_launch<64>(ctx->st, kv, qr, hq, (int)group, window, scale_l2, seqs,
                                          positions, n, w)
                          : af_launch<128>(ctx->st, kv, qr, hq, (int)group, window, scale_l2, seqs,
                                           positions, n, w);
        if (!rc)
            rc = k_launch(k_attn_combine, dim3((unsigned)hq, (unsigned)n), (unsigned)hd, 0, ctx->st,
                          g + r0 * hq * hd, o + r0 * hq * hd, hq, hd, window, seqs, positions, w);
        if (rc) return rc;
    }
    return 0;
}
