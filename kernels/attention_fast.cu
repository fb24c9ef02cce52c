/* attention_fast: flash decoding over the paged cache. A row's key range [first, p] is cut into
 * chunks aligned to absolute positions (attention_fast.h: the chunk size is a function of
 * first and p alone); each chunk's partial (max, sum, acc; fp32, log2 domain) comes from the
 * tensor-core split at head_dim 64 (below: a warp a row or row pair, or four warps a row) or
 * from the CUDA-core one: a block of 128 threads a (row, KV head, chunk) holds the GQA group's
 * query heads, stages K and V 64 positions at a time (16-byte loads, the next tile in flight
 * while this one is used) and keeps online-softmax partials; a combine block a (row, query
 * head) merges the chunks in ascending order, applies 1/sum and the sigmoid gate and rounds to
 * fp16. Rounds of 128 rows and more (a prompt's) take k_attn_flash instead: a warp walks two
 * rows' whole ranges and makes the combine's merges itself, the same bits in one launch. No
 * atomics, no order that depends on the batch: prompt rows are rows of the same arithmetic, each
 * its own causal range. Shapes: q, g, o [R, hq * hd]; workspace [rows][hq][splits]
 * (max, sum) then [rows][hq][splits][hd]. */
#include <cuda_fp16.h>
#include <limits.h>
#include <stdlib.h>

#include "attention_fast.cuh"
#include "attention_fast.h"
#include "common.cuh"
#include "model/kv_addr.h"
#include "mma.cuh"
#include "pdl.cuh"

#define AF_THREADS 128
#define AF_T       MUSE_ATTN_TILE
#define AF_G       MUSE_ATTN_MAX_GROUP

/* The partials of a launch: per (row, head, split) m and l, then the accumulators. */
typedef struct {
    float *m, *l, *acc;
    int splits; /* the grid's x: muse_attn_max_splits(max_len, cap) */
    int cap;    /* the process's split cap (muse_k_attention_fast_cap) */
    int least;  /* and its least chunk (muse_k_attention_fast_least) */
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

/* Row r's sequence and the keys [lo, hi] of its split x; false where the row is padding or has
 * no such split. */
__device__ __forceinline__ bool af_row_split(const int32_t *seqs, const int64_t *positions,
                                             long window, const af_ws &ws, long r, int64_t x,
                                             int *seq, int64_t *lo, int64_t *hi)
{
    *seq = seqs[r];
    if (*seq < 0) return false;
    int64_t p = positions[r], first = muse_attn_first(p, window);
    int64_t chunk = muse_attn_chunk(first, p, ws.cap, ws.least);
    if (x >= muse_attn_count(first, p, chunk)) return false;
    muse_attn_split_range(first, p, chunk, x, lo, hi);
    return true;
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
    int seq;
    int64_t lo, hi;
    if (!af_row_split(seqs, positions, window, ws, r, split, &seq, &lo, &hi)) return;
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

/* ---- the split on tensor cores (head_dim 64) ----
 * A warp takes one row, or two rows of one sequence (a prompt's), at one KV head and split: the
 * mma's 16 rows are (row slot, query head) pairs (muse_attn_gp). Per 64-key tile, staged by the
 * warp alone in its 16 KB of shared memory (swizzled, muse_attn_swz): S = q k^T with q as fp16
 * high and low parts (two mma a k-step, so q keeps fp32's precision), the tile's own max and
 * p = 2^(s - max) in fp32, then O = p v with p as fp16 high and low parts, from zero; the tile
 * partial (max, sum of p, O) merges into the split's running one (muse_attn_merge's weights, on
 * the SFU: am_rescale) in ascending tile order. A row's arithmetic is its own mma rows and its
 * own mask, so it does not matter which row shares its warp, nor whether a warp takes one row or
 * two; decode launches spread each tile over four warps with the same arithmetic
 * (k_attn_split_ring). */
#define AM_WARPS       4
#define AM_HD          64
#define AM_TILE_HALVES (AF_T * AM_HD) /* a staged K (or V) tile */

/* x and y as fp16 high parts (hi, x in the low half) and the fp16 of what they leave (lo) */
__device__ __forceinline__ void am_split2(float x, float y, uint32_t *hi, uint32_t *lo)
{
    __half2 h = __floats2half2_rn(x, y);
    float2 f = __half22float2(h);
    __half2 l = __floats2half2_rn(x - f.x, y - f.y);
    *hi = *reinterpret_cast<uint32_t *>(&h);
    *lo = *reinterpret_cast<uint32_t *>(&l);
}

/* 2^(m - mx) on the SFU: 0 for an empty m, exactly 1 at the max (so an empty tile merges as the
 * identity and the start state takes a tile as it is, as muse_attn_merge on the host) */
__device__ __forceinline__ float am_rescale(float m, float mx)
{
    if (m == -INFINITY) return 0.0f;
    if (m == mx) return 1.0f;
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(m - mx));
    return r;
}

/* A tile's sum of p for a lane's mma row half h (0: c0, c1; 1: c2, c3), in one order whoever
 * holds the values: the 4 values of each 16-key group (S n-tiles 2 w, 2 w + 1) in key order,
 * the 4 groups' sums in group order from 0, then the quad's lanes by butterfly (xor 1, 2). */
__device__ __forceinline__ float am_sum16(const float a[4], const float b[4], int h)
{
    return ((a[2 * h] + a[2 * h + 1]) + b[2 * h]) + b[2 * h + 1];
}
__device__ __forceinline__ float am_quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* q's A fragments (k-steps of 16 dims, fp16 high and low parts) for the lane's two mma rows: row
 * g from q0, row g + 8 from q1 (NULL: a dead row, zeros) */
__device__ __forceinline__ void am_q_frags(const float *q0, const float *q1, int quad,
                                           uint32_t qh[AM_HD / 16][4], uint32_t ql[AM_HD / 16][4])
{
#pragma unroll
    for (int kk = 0; kk < AM_HD / 16; kk++)
#pragma unroll
        for (int j = 0; j < 4; j++) { /* a0: row g, a1: row g + 8, a2/a3: the dims + 8 */
            const float *q = j & 1 ? q1 : q0;
            int d = 16 * kk + 2 * quad + 8 * (j >> 1);
            float2 v = q ? *(const float2 *)&q[d] : make_float2(0.0f, 0.0f);
            am_split2(v.x, v.y, &qh[kk][j], &ql[kk][j]);
        }
}

/* S n-tile j of a staged K tile (keys 8 j .. 8 j + 7) for the lane's two mma rows: from zero,
 * a chain over the k-steps, q's high part then its low part each; every form runs this chain, so
 * a row's scores are the same bits whichever form and warp computes them */
__device__ __forceinline__ void am_s_ntile(float s[4], const uint32_t qh[AM_HD / 16][4],
                                           const uint32_t ql[AM_HD / 16][4], const __half *tk,
                                           int j, int lane)
{
#pragma unroll
    for (int e = 0; e < 4; e++) s[e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < AM_HD / 16; kk += 2) {
        uint32_t b[4]; /* keys 8 j + lane % 8; pieces 2 kk + lane / 8 */
        int key = 8 * j + (lane & 7);
        k_ldsm4(b, tk + key * AM_HD + muse_attn_swz(key, 2 * kk + (lane >> 3)) * 8);
        k_mma16816(s, qh[kk], b[0], b[1]);
        k_mma16816(s, ql[kk], b[0], b[1]);
        k_mma16816(s, qh[kk + 1], b[2], b[3]);
        k_mma16816(s, ql[kk + 1], b[2], b[3]);
    }
}

/* muse_attn_merge's weights on the SFU (am_rescale), m made the new max: every merge of the
 * fast attention (tiles into a chunk's partial, chunks into a row's) takes these */
__device__ __forceinline__ void am_weights(float &m, float mt, float *w1, float *w2)
{
    float mx = fmaxf(m, mt);
    *w1 = am_rescale(m, mx);
    *w2 = am_rescale(mt, mx);
    m = mx;
}

/* A tile's partial (mt, lt, and NJ n-tiles of O) merged into the running one (m, l, acc) for the
 * lane's two mma row halves: muse_attn_merge's weights on the SFU, muse_attn_mix a value. */
template <int NJ>
__device__ __forceinline__ void am_merge_tile(float m[2], float l[2], float acc[NJ][4],
                                              const float mt[2], const float lt[2],
                                              const float o[NJ][4])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float w1, w2;
        am_weights(m[h], mt[h], &w1, &w2);
        l[h] = muse_attn_mix(l[h], w1, lt[h], w2);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            acc[j][2 * h] = muse_attn_mix(acc[j][2 * h], w1, o[j][2 * h], w2);
            acc[j][2 * h + 1] = muse_attn_mix(acc[j][2 * h + 1], w1, o[j][2 * h + 1], w2);
        }
    }
}

/* The rows a warp takes at once: up to 2 slots, each its row, split and keys [lo, hi] (the
 * prompt form: the row's whole range [first, p] and its chunk size). */
typedef struct {
    long r[2];
    int64_t split[2], lo[2], hi[2], chunk[2];
    int64_t ulo, uhi; /* the prompt form's block-shared tiles: the block's rows' union */
    int n;            /* slots */
} am_set;

/* Piece pc of key row key of a staged K and V tile (swizzled) from the cache's place at of the
 * key (cp.async; at < 0: zeros) */
__device__ __forceinline__ void am_cp_key(const muse_k_kv &kv, long kh, int64_t at, int key, int pc,
                                          __half *kbuf, __half *vbuf)
{
    bool ok = at >= 0;
    const uint16_t *ks = ok ? kv.k + at + kh * AM_HD + pc * 8 : kv.k;
    const uint16_t *vs = ok ? kv.v + at + kh * AM_HD + pc * 8 : kv.v;
    int dst = key * AM_HD + muse_attn_swz(key, pc) * 8;
    k_cp16(kbuf + dst, ks, ok);
    k_cp16(vbuf + dst, vs, ok);
}

/* Stage the 64 keys from base of KV head kh into kbuf / vbuf (cp.async, not waited for): lane
 * finds where keys lane and lane + 32 sit, then takes piece lane % 8 of keys lane / 8 + 4 i
 * (the key's place from its finder by a shuffle); zeros outside [lo, hi] and where the block is
 * not reserved. */
__device__ __forceinline__ void am_stage(const muse_k_kv &kv, int seq, long kh, int64_t base,
                                         int64_t lo, int64_t hi, __half *kbuf, __half *vbuf)
{
    const int lane = threadIdx.x % 32, pc = lane % 8;
    int64_t at2[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int64_t s = base + lane + 32 * i;
        at2[i] = s >= lo && s <= hi
                     ? muse_kv_offset32(kv.tables, kv.blocks_per_seq, kv.cap, seq, s, kv.kv_width)
                     : -1;
    }
#pragma unroll
    for (int i = 0; i < AF_T / 4; i++) {
        int key = lane / 8 + 4 * i; /* i < 8: found by lane key (at2[0]), else key - 32 */
        int64_t at = __shfl_sync(0xffffffffu, i < 8 ? at2[0] : at2[1], key % 32);
        am_cp_key(kv, kh, at, key, pc, kbuf, vbuf);
    }
    k_cp_commit();
}

/* The keys a warp of the block stages, 16 w .. 16 w + 15 of a tile (which starts at a multiple
 * of AF_T): one KV group (kv_addr.h), so one table load places them all. Looked up apart from
 * the staging (am_stage_block), so the decode's ring has the load run under the tile before. A
 * ring shorter than a group (a test's) is placed key by key. */
static_assert(AF_T == AM_WARPS * MUSE_KV_BLOCK, "a warp's keys of a tile are one KV group");
typedef struct {
    int64_t p;     /* muse_attn_group_first */
    int32_t entry; /* muse_kv_group_entry there */
    int live;      /* 0: no key of the warp's in [lo, hi], or a ring shorter than a group */
} am_look;
#define AM_LOOK_NONE (am_look{-1, -1, 0})

__device__ __forceinline__ bool am_short_ring(const muse_k_kv &kv)
{
    return kv.cap > 0 && kv.cap < MUSE_KV_BLOCK; /* a test's: placed key by key */
}

__device__ __forceinline__ am_look am_look_up(const muse_k_kv &kv, int seq, int64_t base,
                                              int64_t lo, int64_t hi)
{
    am_look r = AM_LOOK_NONE;
    r.p = muse_attn_group_first(base + MUSE_KV_BLOCK * (int64_t)(threadIdx.x / 32), lo, hi);
    if (r.p >= 0 && !am_short_ring(kv)) {
        r.entry = muse_kv_group_entry(kv.tables, kv.blocks_per_seq, kv.cap, seq, r.p);
        r.live = 1;
    }
    return r;
}

/* am_stage by the block's 4 warps together: warp w the keys 16 w .. 16 w + 15 of the tile
 * (lane: piece lane % 8 of keys 16 w + lane / 8 + 4 i), placed from the warp's look: each key's
 * muse_attn_group_key as one pointer for the group, d rows on, less a ring's length past its
 * wrap (the group's sums once, not 64-bit sums a key) */
__device__ __forceinline__ void am_stage_block(const muse_k_kv &kv, int seq, long kh, int64_t base,
                                               int64_t lo, int64_t hi, am_look look, __half *kbuf,
                                               __half *vbuf)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, pc = lane % 8;
    const int64_t s0 = base + MUSE_KV_BLOCK * warp, w = kv.kv_width;
    if (am_short_ring(kv)) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int d = lane / 8 + 4 * i;
            int64_t s = s0 + d,
                    at = s >= lo && s <= hi
                             ? muse_kv_offset32(kv.tables, kv.blocks_per_seq, kv.cap, seq, s, w)
                             : -1;
            am_cp_key(kv, kh, at, MUSE_KV_BLOCK * warp + d, pc, kbuf, vbuf);
        }
        k_cp_commit();
        return;
    }
    const muse_kv_group g =
        look.live ? muse_kv_group_of(look.entry, kv.cap, seq, look.p, (int)(look.p - s0))
                  : muse_kv_group{-1, MUSE_KV_BLOCK, 1};
    int klo, khi;
    muse_attn_group_span(s0, lo, hi, &klo, &khi);
    if (g.none) klo = MUSE_KV_BLOCK; /* nothing placed: zeros */
    const int64_t at0 = (g.none ? 0 : g.r0 * w) + kh * AM_HD + pc * 8, wrap = kv.cap * w;
    const uint16_t *k0 = kv.k + at0, *v0 = kv.v + at0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int d = lane / 8 + 4 * i, key = MUSE_KV_BLOCK * warp + d;
        bool in = d >= klo && d <= khi;
        int64_t off = (int64_t)d * w - (d >= g.wd ? wrap : 0);
        int dst = key * AM_HD + muse_attn_swz(key, pc) * 8;
        k_cp16(kbuf + dst, in ? k0 + off : kv.k, in);
        k_cp16(vbuf + dst, in ? v0 + off : kv.v, in);
    }
    k_cp_commit();
}

/* A row's output element from its merged partial: 1/sum, the sigmoid gate g and fp16, as the
 * exact kernel rounds (k_attn_combine and k_attn_flash alike) */
__device__ __forceinline__ float am_out(float acc, float l, float g)
{
    float a = l > 0.0f ? acc / l : 0.0f;
    return k_round_f16_hw(__fmul_rn(a, k_sigmoid(g)));
}

/* A staged tile's partial for the lane's two mma rows (h 0: g, 1: g + 8), the keys at offsets
 * [klo[h], khi[h]] of the tile (empty: klo > khi): its max mt, sum lt and O = p v from zero.
 * Every form that runs a tile on its own warp (am_run, k_attn_flash) takes this. */
__device__ __forceinline__ void am_tile(const uint32_t qh[AM_HD / 16][4],
                                        const uint32_t ql[AM_HD / 16][4], const __half *kbuf,
                                        const __half *vbuf, int lane, const int klo[2],
                                        const int khi[2], float scale_l2, float mt[2], float lt[2],
                                        float o[AM_HD / 8][4])
{
    const int quad = lane % 4;
    /* S: 8 n-tiles of 8 keys, each a chain over the k-steps, high part then low */
    float s[AF_T / 8][4];
#pragma unroll
    for (int j = 0; j < AF_T / 8; j++) am_s_ntile(s[j], qh, ql, kbuf, j, lane);
    mt[0] = mt[1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < AF_T / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int h = e >> 1, key = 8 * j + 2 * quad + (e & 1);
            /* __fmul_rn: never contracted into the exp2's subtraction */
            s[j][e] = key >= klo[h] && key <= khi[h] ? __fmul_rn(s[j][e], scale_l2) : -INFINITY;
            mt[h] = fmaxf(mt[h], s[j][e]);
        }
    lt[0] = lt[1] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
        mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
    }
#pragma unroll
    for (int j = 0; j < AF_T / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s[j][e] = am_rescale(s[j][e], mt[e >> 1]); /* 0 where masked or mt = -inf */
#pragma unroll
    for (int h = 0; h < 2; h++) { /* the sum in am_sum_p's order */
#pragma unroll
        for (int w = 0; w < 4; w++) lt[h] += am_sum16(s[2 * w], s[2 * w + 1], h);
        lt[h] = am_quad_sum(lt[h]);
    }
    /* O = p v: p's A fragments from S's C fragments (n-tiles 2 kk, 2 kk + 1 = keys 16 kk..) */
#pragma unroll
    for (int j = 0; j < AM_HD / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < AF_T / 16; kk++) {
        uint32_t ph[4], pl[4];
        am_split2(s[2 * kk][0], s[2 * kk][1], &ph[0], &pl[0]);
        am_split2(s[2 * kk][2], s[2 * kk][3], &ph[1], &pl[1]);
        am_split2(s[2 * kk + 1][0], s[2 * kk + 1][1], &ph[2], &pl[2]);
        am_split2(s[2 * kk + 1][2], s[2 * kk + 1][3], &ph[3], &pl[3]);
#pragma unroll
        for (int jn = 0; jn < AM_HD / 8; jn += 2) {
            uint32_t b[4]; /* keys 16 kk + lane % 8 (+ 8); pieces jn + lane / 16 */
            int key = 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1);
            k_ldsm4t(b, vbuf + key * AM_HD + muse_attn_swz(key, jn + (lane >> 4)) * 8);
            k_mma16816(o[jn], ph, b[0], b[1]);
            k_mma16816(o[jn], pl, b[0], b[1]);
            k_mma16816(o[jn + 1], ph, b[2], b[3]);
            k_mma16816(o[jn + 1], pl, b[2], b[3]);
        }
    }
}

/* One set over its split: the tiles staged by this warp into kbuf / vbuf, the partials of its
 * live (slot, head) rows written to the workspace. FLASH (the prompt form): over the rows' whole
 * ranges, a chunk's partial merged into the row's at the chunk's last tile as k_attn_combine
 * merges the chunks in order, then the combine's 1/sum, gate and fp16 into oa (gate ga). */
template <int FLASH, int SHARE>
__device__ __forceinline__ void am_run(const am_set &S, const muse_k_kv &kv, int seq, long kh,
                                       const float *qa, long hq, int group, int gp, float scale_l2,
                                       __half *kbuf, __half *vbuf, const af_ws &ws, const float *ga,
                                       float *oa)
{
    const int lane = threadIdx.x % 32, quad = lane % 4, g = lane / 4;
    long h0 = kh * group;
    int64_t lo_u = S.lo[0], hi_u = S.hi[0];
    if (S.n > 1) {
        lo_u = S.lo[1] < lo_u ? S.lo[1] : lo_u;
        hi_u = S.hi[1] > hi_u ? S.hi[1] : hi_u;
    }
    if (SHARE) lo_u = S.ulo, hi_u = S.uhi;
    int64_t base = lo_u / AF_T * AF_T;
    /* SHARE: the block's 4 warps stage each tile together into one of two buffers (kbuf, vbuf
     * and the 16 KB after them), the next as soon as this one has landed */
    int cur = 0;
    auto stage = [&](int64_t b, int c, am_look look) {
        if (SHARE)
            am_stage_block(kv, seq, kh, b, lo_u, hi_u, look, kbuf + 2 * c * AM_TILE_HALVES,
                           vbuf + 2 * c * AM_TILE_HALVES);
        else
            am_stage(kv, seq, kh, b, lo_u, hi_u, kbuf, vbuf);
    };
    /* in flight while q loads */
    stage(base, 0, SHARE ? am_look_up(kv, seq, base, lo_u, hi_u) : AM_LOOK_NONE);
    /* the lane's two mma rows: g (c0, c1, a0, a2) and g + 8 (c2, c3, a1, a3) */
    int head[2];
    bool live[2];
    long row[2];
    int64_t split[2], rlo[2], rhi[2], chunk[2];
#pragma unroll
    for (int h = 0; h < 2; h++) { /* selects, not an index into S: no local memory */
        int i = g + 8 * h, slot = i / gp;
        head[h] = i % gp;
        live[h] = slot < S.n && head[h] < group && h0 + head[h] < hq;
        row[h] = slot ? S.r[1] : S.r[0];
        split[h] = slot ? S.split[1] : S.split[0];
        chunk[h] = slot ? S.chunk[1] : S.chunk[0];
        rlo[h] = !live[h] ? 1 : slot ? S.lo[1] : S.lo[0];
        rhi[h] = !live[h] ? 0 : slot ? S.hi[1] : S.hi[0]; /* a dead row: every key masked */
    }
    uint32_t qh[AM_HD / 16][4], ql[AM_HD / 16][4];
    am_q_frags(live[0] ? qa + (row[0] * hq + h0 + head[0]) * AM_HD : NULL,
               live[1] ? qa + (row[1] * hq + h0 + head[1]) * AM_HD : NULL, quad, qh, ql);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[AM_HD / 8][4];
#pragma unroll
    for (int j = 0; j < AM_HD / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    /* FLASH: the row's running partial, the chunks' merged so far (the combine's m, l, acc) */
    float rm[2] = {-INFINITY, -INFINITY}, rl[2] = {0.0f, 0.0f}, racc[FLASH ? AM_HD / 8 : 1][4];
#pragma unroll
    for (int j = 0; j < (FLASH ? AM_HD / 8 : 1); j++)
#pragma unroll
        for (int e = 0; e < 4; e++) racc[j][e] = 0.0f;
    for (;;) {
        bool more = base + AF_T <= hi_u;
        /* the next tile's look, its table load running under this tile's wait */
        am_look next = SHARE && more ? am_look_up(kv, seq, base + AF_T, lo_u, hi_u) : AM_LOOK_NONE;
        k_cp_wait<0>();
        if (SHARE)
            __syncthreads(); /* every warp's part landed; every warp done with the other buffer */
        else
            __syncwarp();
        if (SHARE && more) stage(base + AF_T, cur ^ 1, next);
        /* the tile's max, p and sum, per mma row (a quad's lanes hold a row's 64 keys); the mask
         * as key offsets in the tile [klo, khi] */
        int klo[2], khi[2];
        for (int h = 0; h < 2; h++) {
            int64_t a = rlo[h] - base, b = rhi[h] - base;
            klo[h] = a < 0 ? 0 : a > AF_T ? AF_T : (int)a;
            khi[h] = b < -1 ? -1 : b >= AF_T ? AF_T - 1 : (int)b;
        }
        float mt[2], lt[2], o[AM_HD / 8][4];
        am_tile(qh, ql, kbuf + 2 * cur * AM_TILE_HALVES, vbuf + 2 * cur * AM_TILE_HALVES, lane, klo,
                khi, scale_l2, mt, lt, o);
        if (!SHARE) {
            __syncwarp(); /* every lane is done with the tile before the next one lands */
            if (more) stage(base + AF_T, 0, next);
        }
        am_merge_tile<AM_HD / 8>(m, l, acc, mt, lt, o);
        if (FLASH)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (!live[h] || !muse_attn_tile_in(rlo[h], rhi[h], base) ||
                    !muse_attn_tile_closes(rhi[h], chunk[h], base))
                    continue;
                /* the chunk's partial into the row's (k_attn_combine's step), then empty */
                float w1, w2;
                am_weights(rm[h], m[h], &w1, &w2);
                rl[h] = muse_attn_mix(rl[h], w1, l[h], w2);
                m[h] = -INFINITY;
                l[h] = 0.0f;
#pragma unroll
                for (int j = 0; j < AM_HD / 8; j++)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; e++) {
                        racc[j][e] = muse_attn_mix(racc[j][e], w1, acc[j][e], w2);
                        acc[j][e] = 0.0f;
                    }
            }
        if (!more) break;
        base += AF_T;
        cur ^= SHARE;
    }
    if (FLASH) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (!live[h]) continue;
            size_t at = ((size_t)row[h] * hq + h0 + head[h]) * AM_HD;
#pragma unroll
            for (int j = 0; j < AM_HD / 8; j++) {
                int d = 8 * j + 2 * quad;
                float2 gg = *(const float2 *)&ga[at + d];
                *(float2 *)&oa[at + d] = make_float2(am_out(racc[j][2 * h], rl[h], gg.x),
                                                     am_out(racc[j][2 * h + 1], rl[h], gg.y));
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (FLASH || !live[h]) continue;
        size_t at = ((size_t)row[h] * hq + h0 + head[h]) * ws.splits + split[h];
#pragma unroll
        for (int j = 0; j < AM_HD / 8; j++)
            *(float2 *)&ws.acc[at * AM_HD + 8 * j + 2 * quad] =
                make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
        if (quad == 0) {
            ws.m[at] = m[h];
            ws.l[at] = l[h];
        }
    }
}

/* The whole round's rows (a launch in row groups sees its group's alone). */
typedef struct {
    const int32_t *seqs;
    const int64_t *positions;
    long rows;
} af_round;

/* The first position the round writes for sequence seq: the least of its rows' positions, by
 * the block (one barrier); every thread gets it. */
__device__ __forceinline__ int64_t am_first_written(const af_round &rd, int seq)
{
    __shared__ long long fw_warp[AM_WARPS];
    long long mn = LLONG_MAX;
    for (long i = threadIdx.x; i < rd.rows; i += blockDim.x)
        if (rd.seqs[i] == seq) mn = min(mn, (long long)rd.positions[i]);
    for (int o = 16; o > 0; o >>= 1) mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    if (threadIdx.x % 32 == 0) fw_warp[threadIdx.x / 32] = mn;
    __syncthreads();
    mn = fw_warp[0];
    for (int w = 1; w < AM_WARPS; w++) mn = min(mn, fw_warp[w]);
    return (int64_t)mn;
}

/* The decode form: a block of 4 warps on one (row, KV head, split), grid (splits, KV heads,
 * rows), each 64-key tile's work spread over them with am_run's arithmetic per value: warp w
 * stages keys 16 w .. 16 w + 15, computes S n-tiles 2 w, 2 w + 1 (their chains as am_run's), its
 * 16 keys' p and their sums (am_sum16), which the block adds in am_run's order; it hands its
 * k-step of p (keys 16 w ..) to the others through shared memory and takes O's dims 16 w .. 16 w
 * + 15 over all four. So a decode row's bits are those of the same row in a prompt's pair.
 * The tiles go through a ring of NS buffers (3; MUSE_ATTN_RING=2 from the environment: 2), NS - 1
 * in flight, with two barriers a tile: a warp's S needs only the K rows it staged itself, so one
 * barrier shares the warps' maxima (and every warp's V rows) and is where the tile NS - 1 ahead
 * is issued into the buffer the tile before read (muse_attn_ring_issue); a second shares p and
 * the sums. early (MUSE_ATTN_EARLY, on unless 0): the tiles of keys below the round's first
 * write for the row's sequence are staged before the wait for the kernel before (the cache the
 * earlier rounds wrote; muse_attn_tile_early), so at a decode row every tile but the last is in
 * flight while the attention's inputs are made. */
template <int NS> struct am_ring_sm {
    __half k[NS][AM_TILE_HALVES], v[NS][AM_TILE_HALVES];
    float2 mx[AM_WARPS][32], sum[AM_WARPS][32]; /* a lane's two mma rows: one 8-byte access */
    uint4 p[AM_WARPS][2][32]; /* high, low parts: a lane's 16 bytes side by side, no conflict */
};

template <int NS>
__global__ void __launch_bounds__(AM_WARPS * 32)
    k_attn_split_ring(muse_k_kv kv, const float *qa, long hq, int group, int gp, long window,
                      float scale_l2, const int32_t *seqs, const int64_t *positions, af_ws ws,
                      af_round rd, int early)
{
    extern __shared__ __align__(16) unsigned char am_sm[];
    am_ring_sm<NS> &sm = *(am_ring_sm<NS> *)am_sm;
    K_PDL_NEXT(); /* the rows, tables and earlier rounds' cache are read before the wait */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4, g = lane / 4;
    long kh = blockIdx.y, r = blockIdx.z, h0 = kh * group;
    int64_t x = blockIdx.x;
    int seq;
    int64_t lo, hi;
    if (!af_row_split(seqs, positions, window, ws, r, x, &seq, &lo, &hi)) return;
    const int64_t base0 = lo / AF_T * AF_T;
    const int n = (int)((hi - base0) / AF_T + 1); /* positions under 2^31 */
    /* tile t's look (its warp's group, am_look_up) and its staging into its buffer, or an
     * empty commit group past the split's end */
    auto look = [&](int t) {
        return t < 0 ? AM_LOOK_NONE : am_look_up(kv, seq, base0 + (int64_t)t * AF_T, lo, hi);
    };
    auto issue = [&](int t, am_look lk) {
        if (t < 0) {
            k_cp_commit();
            return;
        }
        int b = muse_attn_ring_buf(t, NS);
        am_stage_block(kv, seq, kh, base0 + (int64_t)t * AF_T, lo, hi, lk, sm.k[b], sm.v[b]);
    };
    /* early: the prologue's tiles below the round's first write for the sequence staged before
     * the wait, while the kernels before run; the rest after it, in tile order */
    int i0 = -(NS - 1);
    if (early) {
        int64_t fw = am_first_written(rd, seq);
        for (; i0 < 0; i0++) {
            int t = muse_attn_ring_issue(i0, NS, n);
            if (t < 0 || !muse_attn_tile_early(base0, t, hi, fw)) break;
            issue(t, look(t));
        }
    }
    K_PDL_WAIT(); /* q, and this round's keys */
    for (; i0 < 0; i0++) {
        int t = muse_attn_ring_issue(i0, NS, n);
        issue(t, look(t));
    }
    int head[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; h++) { /* one slot: mma rows gp .. 15 are dead */
        int i = g + 8 * h;
        head[h] = i % gp;
        live[h] = i / gp == 0 && head[h] < group && h0 + head[h] < hq;
    }
    uint32_t qh[AM_HD / 16][4], ql[AM_HD / 16][4];
    am_q_frags(live[0] ? qa + (r * hq + h0 + head[0]) * AM_HD : NULL,
               live[1] ? qa + (r * hq + h0 + head[1]) * AM_HD : NULL, quad, qh, ql);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[2][4];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    for (int i = 0; i < n; i++) {
        const int64_t base = base0 + (int64_t)i * AF_T;
        const int c = muse_attn_ring_buf(i, NS), tn = muse_attn_ring_issue(i, NS, n);
        const am_look lk = look(tn); /* its load runs under this tile's S */
        k_cp_wait<NS - 2>();         /* this thread's loads of tile i */
        __syncwarp();                /* the warp's: its 16 keys of K */
        const __half *tk = sm.k[c], *tv = sm.v[c];
        float s[2][4];
#pragma unroll
        for (int jj = 0; jj < 2; jj++) am_s_ntile(s[jj], qh, ql, tk, 2 * warp + jj, lane);
        /* the keys [lo, hi] as offsets in the tile, [klo, khi] */
        const int64_t dlo = lo - base, dhi = hi - base;
        const int klo = dlo < 0 ? 0 : (int)dlo, khi = dhi >= AF_T ? AF_T - 1 : (int)dhi;
        float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int jj = 0; jj < 2; jj++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int h = e >> 1, key = 16 * warp + 8 * jj + 2 * quad + (e & 1);
                bool in = live[h] && key >= klo && key <= khi;
                s[jj][e] = in ? __fmul_rn(s[jj][e], scale_l2) : -INFINITY;
                mt[h] = fmaxf(mt[h], s[jj][e]);
            }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
        }
        sm.mx[warp][lane] = make_float2(mt[0], mt[1]);
        __syncthreads(); /* the maxima, every warp's V rows; every warp past tile i - 1 */
        issue(tn, lk);
        {
            float2 m0 = sm.mx[0][lane], m1 = sm.mx[1][lane], m2 = sm.mx[2][lane],
                   m3 = sm.mx[3][lane]; /* a max: the same in any order */
            mt[0] = fmaxf(fmaxf(m0.x, m1.x), fmaxf(m2.x, m3.x));
            mt[1] = fmaxf(fmaxf(m0.y, m1.y), fmaxf(m2.y, m3.y));
        }
#pragma unroll
        for (int jj = 0; jj < 2; jj++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[jj][e] = am_rescale(s[jj][e], mt[e >> 1]);
        sm.sum[warp][lane] = make_float2(am_sum16(s[0], s[1], 0), am_sum16(s[0], s[1], 1));
        uint4 ph, pl; /* k-step w of p: am_run's ph, pl of kk = w */
        am_split2(s[0][0], s[0][1], &ph.x, &pl.x);
        am_split2(s[0][2], s[0][3], &ph.y, &pl.y);
        am_split2(s[1][0], s[1][1], &ph.z, &pl.z);
        am_split2(s[1][2], s[1][3], &ph.w, &pl.w);
        sm.p[warp][0][lane] = ph;
        sm.p[warp][1][lane] = pl;
        __syncthreads(); /* p and the sums */
        float lt[2] = {0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < 4; w++) {
            float2 sw = sm.sum[w][lane];
            lt[0] += sw.x;
            lt[1] += sw.y;
        }
#pragma unroll
        for (int h = 0; h < 2; h++) lt[h] = am_quad_sum(lt[h]);
        float o[2][4]; /* dims n-tiles 2 w, 2 w + 1, chained over the k-steps as am_run */
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < AF_T / 16; kk++) {
            uint4 h4 = sm.p[kk][0][lane], l4 = sm.p[kk][1][lane];
            const uint32_t ph[4] = {h4.x, h4.y, h4.z, h4.w}, pl[4] = {l4.x, l4.y, l4.z, l4.w};
            uint32_t b[4];
            int key = 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1);
            k_ldsm4t(b, tv + key * AM_HD + muse_attn_swz(key, 2 * warp + (lane >> 4)) * 8);
            k_mma16816(o[0], ph, b[0], b[1]);
            k_mma16816(o[0], pl, b[0], b[1]);
            k_mma16816(o[1], ph, b[2], b[3]);
            k_mma16816(o[1], pl, b[2], b[3]);
        }
        am_merge_tile<2>(m, l, acc, mt, lt, o);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!live[h]) continue;
        size_t at = ((size_t)r * hq + h0 + head[h]) * ws.splits + x;
#pragma unroll
        for (int j = 0; j < 2; j++)
            *(float2 *)&ws.acc[at * AM_HD + 16 * warp + 8 * j + 2 * quad] =
                make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
        if (warp == 0 && quad == 0) {
            ws.m[at] = m[h];
            ws.l[at] = l[h];
        }
    }
}

/* Row r's split x as a one-slot set; false where the row has no such split. */
__device__ __forceinline__ bool am_one(am_set *S, long r, int64_t first, int64_t p, int64_t chunk,
                                       int64_t x)
{
    if (x < 0 || x >= muse_attn_count(first, p, chunk)) return false;
    S->n = 1;
    S->r[0] = r;
    S->split[0] = x;
    muse_attn_split_range(first, p, chunk, x, &S->lo[0], &S->hi[0]);
    return true;
}

/* PAIR 0: grid (ceil(splits / 4), KV heads, rows), warp w takes split 4 x + w of row z.
 * PAIR 1: grid (splits + 1, KV heads, ceil(rows / 8)), warp w takes rows 2 u, 2 u + 1 (u = 4 z
 * + w) at column x (muse_attn_pair). 128 threads, 4 x 16 KB of dynamic shared memory. */
template <int PAIR>
__global__ void __launch_bounds__(AM_WARPS * 32)
    k_attn_split_mma(muse_k_kv kv, const float *qa, long hq, int group, int gp, long window,
                     float scale_l2, const int32_t *seqs, const int64_t *positions, long rows,
                     af_ws ws)
{
    extern __shared__ __align__(16) unsigned char am_sm[];
    K_PDL_NEXT();
    K_PDL_WAIT();
    int warp = threadIdx.x / 32;
    __half *kbuf = (__half *)am_sm + (size_t)warp * 2 * AM_TILE_HALVES,
           *vbuf = kbuf + AM_TILE_HALVES;
    long kh = blockIdx.y;
    long ra = PAIR ? 2 * ((long)blockIdx.z * AM_WARPS + warp) : (long)blockIdx.z;
    int64_t x = PAIR ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * AM_WARPS + warp;
    if (ra >= rows) return;
    int sa = seqs[ra];
    int64_t pa = positions[ra], fa = muse_attn_first(pa, window);
    int64_t ca = muse_attn_chunk(fa, pa, ws.cap, ws.least);
    am_set S;
    long rb = PAIR && ra + 1 < rows ? ra + 1 : -1;
    if (rb >= 0) { /* a pair needs two slots of gp mma rows */
        int sb = seqs[rb];
        int64_t pb = positions[rb], fb = muse_attn_first(pb, window);
        int64_t cb = muse_attn_chunk(fb, pb, ws.cap, ws.least), xa, xb;
        if (2 * gp <= 16 && muse_attn_pair(sa, fa, pa, sb, fb, pb, ws.cap, ws.least, x, &xa, &xb)) {
            am_set B;
            bool has_a = am_one(&S, ra, fa, pa, ca, xa), has_b = am_one(&B, rb, fb, pb, cb, xb);
            if (has_a && has_b) {
                S.n = 2;
                S.r[1] = rb;
                S.split[1] = B.split[0];
                S.lo[1] = B.lo[0];
                S.hi[1] = B.hi[0];
            } else if (has_b) {
                S = B;
            } else if (!has_a) {
                return;
            }
            am_run<0, 0>(S, kv, sa, kh, qa, hq, group, gp, scale_l2, kbuf, vbuf, ws, NULL, NULL);
            return;
        }
        if (sb >= 0 && am_one(&S, rb, fb, pb, cb, x))
            am_run<0, 0>(S, kv, sb, kh, qa, hq, group, gp, scale_l2, kbuf, vbuf, ws, NULL, NULL);
    }
    if (sa >= 0 && am_one(&S, ra, fa, pa, ca, x))
        am_run<0, 0>(S, kv, sa, kh, qa, hq, group, gp, scale_l2, kbuf, vbuf, ws, NULL, NULL);
}

/* Row r as the prompt form's slot i of S: its whole key range and chunk size; false (S
 * unchanged) where it is padding */
__device__ __forceinline__ bool am_whole(am_set *S, int i, long r, const int32_t *seqs,
                                         const int64_t *positions, long window, int cap, int least)
{
    if (seqs[r] < 0) return false;
    int64_t p = positions[r], first = muse_attn_first(p, window);
    S->r[i] = r;
    S->split[i] = 0;
    S->lo[i] = first;
    S->hi[i] = p;
    S->chunk[i] = muse_attn_chunk(first, p, cap, least);
    return true;
}

/* The prompt form (rounds of MUSE_ATTN_PAIR_ROWS rows and more; MUSE_ATTN_FLASH=0: the split
 * and the combine): grid (ceil(rows / 8), KV heads), warp w takes rows 2 u, 2 u + 1 (u = 4 x +
 * w, the blocks from the last rows on: the longest ranges first) over their whole key ranges
 * with am_run's arithmetic, merging each chunk's partial into the row's at the chunk's last tile
 * as the combine merges them, and writes o: the split's and the combine's bits in one launch,
 * with no workspace. share: where a block's 8 rows are of one sequence its warps stage each tile
 * of the rows' union once, together; else each warp its own. Rows of two sequences (or a group
 * past 8) take the warp one at a time. 128 threads, 4 x 16 KB of dynamic shared memory. */
__global__ void __launch_bounds__(AM_WARPS * 32)
    k_attn_flash(muse_k_kv kv, const float *qa, const float *ga, float *oa, long hq, int group,
                 int gp, long window, float scale_l2, const int32_t *seqs, const int64_t *positions,
                 long rows, int cap, int least, int share)
{
    extern __shared__ __align__(16) unsigned char am_sm[];
    K_PDL_NEXT();
    K_PDL_WAIT();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    long kh = blockIdx.y, h0 = kh * group;
    long r0 = 2L * AM_WARPS * (gridDim.x - 1 - blockIdx.x);
    long ra = r0 + 2 * warp;
    am_set S;
    if (share && 2 * gp <= 16 && r0 + 2 * AM_WARPS <= rows) { /* block-uniform */
        int sq = seqs[r0];
        bool one = sq >= 0;
        for (int i = 1; i < 2 * AM_WARPS; i++) one = one && seqs[r0 + i] == sq;
        if (one) {
            S.ulo = INT64_MAX;
            S.uhi = -1;
            for (int i = 0; i < 2 * AM_WARPS; i++) {
                int64_t p = positions[r0 + i], f = muse_attn_first(p, window);
                S.ulo = f < S.ulo ? f : S.ulo;
                S.uhi = p > S.uhi ? p : S.uhi;
            }
            am_whole(&S, 0, ra, seqs, positions, window, cap, least);
            am_whole(&S, 1, ra + 1, seqs, positions, window, cap, least);
            S.n = 2;
            __half *kb = (__half *)am_sm;
            am_run<1, 1>(S, kv, sq, kh, qa, hq, group, gp, scale_l2, kb, kb + AM_TILE_HALVES,
                         af_ws(), ga, oa);
            return;
        }
    }
    __half *kbuf = (__half *)am_sm + (size_t)warp * 2 * AM_TILE_HALVES,
           *vbuf = kbuf + AM_TILE_HALVES;
    if (ra >= rows) return;
    long rb = ra + 1 < rows ? ra + 1 : -1;
    /* padding rows: zeros, as the combine writes them */
    for (long r = ra; r <= ra + 1 && r < rows; r++)
        if (seqs[r] < 0)
            for (long i = lane; i < (long)group * AM_HD; i += 32)
                if (h0 + i / AM_HD < hq) oa[(r * hq + h0) * AM_HD + i] = 0.0f;
    S.n = 0;
    bool a = am_whole(&S, 0, ra, seqs, positions, window, cap, least);
    if (rb >= 0 && 2 * gp <= 16 && a && seqs[rb] == seqs[ra]) {
        am_whole(&S, 1, rb, seqs, positions, window, cap, least);
        S.n = 2;
        am_run<1, 0>(S, kv, seqs[ra], kh, qa, hq, group, gp, scale_l2, kbuf, vbuf, af_ws(), ga, oa);
        return;
    }
    if (a) {
        S.n = 1;
        am_run<1, 0>(S, kv, seqs[ra], kh, qa, hq, group, gp, scale_l2, kbuf, vbuf, af_ws(), ga, oa);
    }
    if (rb >= 0 && am_whole(&S, 0, rb, seqs, positions, window, cap, least)) {
        S.n = 1;
        am_run<1, 0>(S, kv, seqs[rb], kh, qa, hq, group, gp, scale_l2, kbuf, vbuf, af_ws(), ga, oa);
    }
}

/* Floats of a combine block's staged partials: AC_STAGE / (hd + 2) splits at once (128 at
 * head_dim 64, so a row of up to MUSE_ATTN_MAX_SPLITS in one batch; 64 at 128), their acc rows
 * then m then l. Threads: one a batch's split for its weights (AC_THREADS / 32 warps: s_top). */
#define AC_STAGE   (128 * (64 + 2))
#define AC_THREADS 128

/* grid (hq, rows); AC_THREADS threads: dimension d < hd of (row, head) merged over the row's
 * splits in ascending order (the running merge k_attn_flash makes at a chunk's end), then 1/sum,
 * the gate and fp16 as the exact kernel rounds. The splits' partials come to shared memory a batch
 * at a time, every load of a batch in flight at once (16-byte cp.async where the workspace is
 * aligned). Each batch's merge weights are made first: thread s of the batch takes split s's
 * max, a scan of maxima by shuffles (then the warps' totals, then the running max:
 * muse_attn_prefix_max's order) gives each step's new max, and thread s makes step s's two
 * weights; the sums then fold in order with those weights, a chain of a multiply and an fma a
 * step (t/unit/test_attention_fast.c: the same bits as the fold making its weights in turn). */
__global__ void k_attn_combine(const float *ga, float *oa, long hq, long hd, long window,
                               const int32_t *seqs, const int64_t *positions, af_ws ws)
{
    __shared__ __align__(16) float ac_sm[AC_STAGE];
    __shared__ float s_w1[AC_THREADS], s_w2[AC_THREADS], s_top[AC_THREADS / 32];
    K_PDL_NEXT();
    long h = blockIdx.x, r = blockIdx.y;
    int d = threadIdx.x, nt = AC_THREADS, lane = d % 32, wi = d / 32;
    const bool dim = d < hd; /* a thread past hd makes weights and loads, no output */
    float *o = oa + (r * hq + h) * hd;
    /* the row's splits (the round's rows, which no kernel writes: 64-bit divisions) while the
     * kernel before runs; every write after the wait */
    const bool live = seqs[r] >= 0;
    int64_t n = 0;
    if (live) {
        int64_t p = positions[r], first = muse_attn_first(p, window);
        n = muse_attn_count(first, p, muse_attn_chunk(first, p, ws.cap, ws.least));
        if (n > ws.splits) n = ws.splits; /* past max_len: the caller broke the contract */
    }
    /* AC_STAGE / (hd + 2) at the two head sizes (muse_k_attention_fast_fits), no division after
     * the wait; at most AC_THREADS: a thread a split's weights */
    const int batch = hd == 64 ? AC_STAGE / 66 : AC_STAGE / 130;
    K_PDL_WAIT();
    if (!live) {
        if (dim) o[d] = 0;
        return;
    }
    size_t at = ((size_t)r * hq + h) * ws.splits;
    float *s_acc = ac_sm, *s_l = ac_sm + batch * hd;
    bool al = (uintptr_t)ws.acc % 16 == 0; /* (at + s) * hd floats: 16-byte steps */
    float run = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int64_t s0 = 0; s0 < n; s0 += batch) {
        int nb = n - s0 < batch ? (int)(n - s0) : batch;
        const float *src = ws.acc + (at + s0) * hd;
        if (al) {
            for (int c = d; c < nb * (int)hd / 4; c += nt) k_cp16(s_acc + 4 * c, src + 4 * c, true);
            k_cp_commit();
        } else if (dim) {
            for (int s = 0; s < nb; s++) s_acc[s * hd + d] = src[s * hd + d];
        }
        float ms = d < nb ? ws.m[at + s0 + d] : -INFINITY, M = ms;
        if (d < nb) s_l[d] = ws.l[at + s0 + d];
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
            float up = __shfl_up_sync(0xffffffffu, M, off);
            if (lane >= off) M = fmaxf(M, up);
        }
        if (lane == 31) s_top[wi] = M;
        __syncthreads();
        float before = -INFINITY, all = -INFINITY;
        for (int w = 0; w * 32 < batch && w < AC_THREADS / 32; w++) {
            if (w < wi) before = fmaxf(before, s_top[w]);
            all = fmaxf(all, s_top[w]);
        }
        M = fmaxf(run, fmaxf(before, M));
        float Mprev = __shfl_up_sync(0xffffffffu, M, 1);
        if (lane == 0) Mprev = fmaxf(run, before);
        if (d < nb) {
            s_w1[d] = am_rescale(Mprev, M);
            s_w2[d] = am_rescale(ms, M);
        }
        run = fmaxf(run, all);
        if (al) k_cp_wait<0>();
        __syncthreads();
        if (dim) {
#pragma unroll 8
            for (int s = 0; s < nb; s++) { /* the fold, its weights made above */
                float w1 = s_w1[s], w2 = s_w2[s];
                l = muse_attn_mix(l, w1, s_l[s], w2);
                acc = muse_attn_mix(acc, w1, s_acc[s * hd + d], w2);
            }
        }
        __syncthreads(); /* the batch read before the next one lands */
    }
    if (dim) o[d] = am_out(acc, l, ga[(r * hq + h) * hd + d]);
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

MUSE_K_API int muse_k_attention_fast_least(void)
{
    static const int least = [] {
        const char *v = getenv("MUSE_ATTN_CHUNK");
        int n = v && *v ? atoi(v) : 0;
        return n >= MUSE_ATTN_TILE && n <= MUSE_ATTN_MOST_CHUNK && !(n & (n - 1))
                   ? n
                   : MUSE_ATTN_LEAST_CHUNK;
    }();
    return least;
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

/* The split on tensor cores for head_dim 64 (MUSE_ATTN_TC=0 from the environment: the CUDA-core
 * split, read once a process; tuning and checks only, its bits are not these) */
static int am_on(void)
{
    static const int on = [] {
        const char *v = getenv("MUSE_ATTN_TC");
        return !(v && v[0] == '0' && !v[1]);
    }();
    return on;
}

/* The form of a launch: muse_attn_paired, pairs of a sequence's rows a warp in a prompt's rounds,
 * else k_attn_split_ring with NS tiles (MUSE_ATTN_RING=2 from the environment: 2, else 3;
 * MUSE_ATTN_COOP=0: k_attn_split_mma<0>, a warp a split, four splits a block; read once a
 * process). The bits are the same every way. */
static int am_ring_stages(void)
{
    static const int ns = [] {
        const char *c = getenv("MUSE_ATTN_COOP"), *v = getenv("MUSE_ATTN_RING");
        if (c && c[0] == '0' && !c[1]) return 0;
        return v && v[0] == '2' && !v[1] ? 2 : 3;
    }();
    return ns;
}

/* Whether the ring stages a row's tiles of earlier rounds' keys before the wait
 * (MUSE_ATTN_EARLY=0 from the environment: after it; read once a process). The same bits. */
static int am_early_on(void)
{
    static const int on = [] {
        const char *v = getenv("MUSE_ATTN_EARLY");
        return !(v && v[0] == '0' && !v[1]);
    }();
    return on;
}

/* k_attn_split_ring<NS>'s launch: its shared memory past 48 KB at NS 3 */
template <int NS>
static int am_ring_launch(cudaStream_t st, dim3 grid, const muse_k_kv &kv, const float *q, long hq,
                          int group, int gp, long window, float scale_l2, const int32_t *seqs,
                          const int64_t *positions, af_ws ws, af_round rd)
{
    size_t smem = sizeof(am_ring_sm<NS>);
    int err = (int)cudaFuncSetAttribute((const void *)k_attn_split_ring<NS>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err) return err;
    return k_launch(k_attn_split_ring<NS>, grid, AM_WARPS * 32, smem, st, kv, q, hq, group, gp,
                    window, scale_l2, seqs, positions, ws, rd, am_early_on());
}

/* The prompt rounds' form (MUSE_ATTN_FLASH from the environment, read once a process: 0 the
 * split and the combine in row groups, 1 k_attn_flash with a warp's own tiles, else k_attn_flash
 * with a block's tiles shared). The bits are the same every way. */
static int am_flash_form(void)
{
    static const int form = [] {
        const char *v = getenv("MUSE_ATTN_FLASH");
        return v && (v[0] == '0' || v[0] == '1') && !v[1] ? v[0] - '0' : 2;
    }();
    return form;
}

static int am_flash_launch(cudaStream_t st, const muse_k_kv &kv, const float *q, const float *g,
                           float *o, long hq, int group, long window, float scale_l2,
                           const int32_t *seqs, const int64_t *positions, long rows, int cap,
                           int least)
{
    size_t smem = (size_t)AM_WARPS * 2 * AM_TILE_HALVES * sizeof(__half);
    int err = (int)cudaFuncSetAttribute((const void *)k_attn_flash,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err) return err;
    dim3 grid((unsigned)((rows + 2 * AM_WARPS - 1) / (2 * AM_WARPS)),
              (unsigned)((hq + group - 1) / group));
    return k_launch(k_attn_flash, grid, AM_WARPS * 32, smem, st, kv, q, g, o, hq, group,
                    muse_attn_gp(group), window, scale_l2, seqs, positions, rows, cap, least,
                    am_flash_form() == 2);
}

static int am_launch(cudaStream_t st, const muse_k_kv &kv, const float *q, long hq, int group,
                     long window, float scale_l2, const int32_t *seqs, const int64_t *positions,
                     long rows, int pair, af_ws ws, af_round rd)
{
    unsigned kvb = (unsigned)((hq + group - 1) / group);
    int gp = muse_attn_gp(group);
    dim3 one((unsigned)ws.splits, kvb, (unsigned)rows);
    if (!pair && am_ring_stages() == 2)
        return am_ring_launch<2>(st, one, kv, q, hq, group, gp, window, scale_l2, seqs, positions,
                                 ws, rd);
    if (!pair && am_ring_stages() == 3)
        return am_ring_launch<3>(st, one, kv, q, hq, group, gp, window, scale_l2, seqs, positions,
                                 ws, rd);
    size_t smem = (size_t)AM_WARPS * 2 * AM_TILE_HALVES * sizeof(__half);
    void (*fn)(muse_k_kv, const float *, long, int, int, long, float, const int32_t *,
               const int64_t *, long, af_ws) = pair ? k_attn_split_mma<1> : k_attn_split_mma<0>;
    /* each launch, as linear_fast.cu does: the attribute is the current device's */
    int err = (int)cudaFuncSetAttribute((const void *)fn,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err) return err;
    dim3 grid = pair ? dim3((unsigned)ws.splits + 1, kvb,
                            (unsigned)((rows + 2 * AM_WARPS - 1) / (2 * AM_WARPS)))
                     : dim3((unsigned)((ws.splits + AM_WARPS - 1) / AM_WARPS), kvb, (unsigned)rows);
    return k_launch(fn, grid, AM_WARPS * 32, smem, st, kv, q, hq, group, gp, window, scale_l2, seqs,
                    positions, rows, ws);
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
    w.least = muse_k_attention_fast_least();
    size_t heads = (size_t)step * (size_t)hq * (size_t)w.splits;
    w.m = (float *)ws;
    w.l = w.m + heads;
    w.acc = w.l + heads;
    float scale_l2 = (float)(scale * 1.4426950408889634); /* scores in the log2 domain */
    if (am_on() && hd == AM_HD && muse_attn_paired(rows) && am_flash_form())
        return am_flash_launch(ctx->st, kv, q, g, o, hq, (int)group, window, scale_l2, ctx->seqs,
                               ctx->positions, rows, cap, w.least);
    const af_round rd = {ctx->seqs, ctx->positions, rows};
    /* row groups run one after another on the stream: a row's arithmetic is its own in any */
    for (long r0 = 0; r0 < rows; r0 += step) {
        long n = rows - r0 < step ? rows - r0 : step;
        const int32_t *seqs = ctx->seqs + r0;
        const int64_t *positions = ctx->positions + r0;
        const float *qr = q + r0 * hq * hd;
        int rc = am_on() && hd == AM_HD
                     ? am_launch(ctx->st, kv, qr, hq, (int)group, window, scale_l2, seqs, positions,
                                 n, muse_attn_paired(rows), w, rd)
                 : hd == 64 ? af_launch<64>(ctx->st, kv, qr, hq, (int)group, window, scale_l2, seqs,
                                            positions, n, w)
                            : af_launch<128>(ctx->st, kv, qr, hq, (int)group, window, scale_l2,
                                             seqs, positions, n, w);
        if (!rc)
            rc = k_launch(k_attn_combine, dim3((unsigned)hq, (unsigned)n), AC_THREADS, 0, ctx->st,
                          g + r0 * hq * hd, o + r0 * hq * hd, hq, hd, window, seqs, positions, w);
        if (rc) return rc;
    }
    return 0;
}
