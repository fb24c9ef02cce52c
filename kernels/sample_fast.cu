/* sample (fast path): the host sampler's token (engine/text/sampler.c) by integer selection,
 * in four launches. 1: a block a chunk of logits (SF_CHUNK; MUSE_SF_CHUNK) finds its maximum and
 * the lowest id holding it, and zeroes the row's histograms. 2: the same blocks weigh their
 * logits (muse_ss_weight: the host's float sequence), count them by bin and add up their low
 * bits in 32 bits, then add each bin's count and weight (muse_ss_bin_weight, exact) into the
 * row's histograms. 3: they weigh again and scatter each candidate's key into its bin's
 * segment (bins highest first, a bin's keys in any order). 4: a block a row runs the plan of
 * kernels/sample.cu (top_k, top_p, min_p, the draw), each crossing a suffix scan over the bins
 * (read and scanned once) and at most five 10-bit digit passes over one bin's keys
 * (base/sampler_select.h, prototyped and held to the host on the CPU in
 * t/unit/test_sampler_select.c). Every sum is an integer and every choice a key comparison, so
 * neither the atomics' order, the chunk nor the row's place in the batch can change a bit: the
 * token is the host's. A masked row (muse_sample_masked) reads a token whose bit is clear as
 * -inf in launches 1-3, and launch 4 draws the lowest allowed id when nothing allowed is above
 * -inf; a free row reads its logits as before. */
#include <float.h>
#include <stdlib.h>

#include "common.cuh"
#include "sample_fast.cuh"
#include "pdl.cuh"
#include "base/sampler_select.h"

#define SF_CHUNK       4096 /* logits a block in launches 1-3 (MUSE_SF_CHUNK) */
#define SF_CHUNK_LEAST 256  /* the workspace holds the chunk maxima of chunks this small */
#define SF_CHUNK_MOST  4096 /* a chunk's 32-bit sums of low bits cannot overflow (2^12 * 2^18) */
#define SF_THREADS     256
#define SF_SEL_THREADS 1024       /* = MUSE_SS_DIGITS, = MUSE_SS_BINS / 2 */
#define SF_SEG_CAP     4096       /* a bin's keys copied to shared memory up to this many */
#define SF_HALVES_MOST (1u << 23) /* keys whose 9-bit halves' 32-bit sums cannot overflow */

typedef unsigned long long sf_u64; /* atomicAdd's type */

/* A row's workspace: keys [V], bin weights and counts, the launch-3 cursors, the chunk maxima. */
typedef struct {
    uint64_t *keys, *bin_weight;
    uint32_t *bin_count, *cursor;
    float *part_max;
    int32_t *part_first;
} sf_row;

__host__ __device__ static inline long sf_chunks(long V, int chunk)
{
    return (V + chunk - 1) / chunk;
}

__host__ __device__ static inline size_t sf_row_bytes(long V)
{
    return (size_t)V * 8 + (size_t)MUSE_SS_BINS * 16 + (size_t)sf_chunks(V, SF_CHUNK_LEAST) * 8;
}

__device__ static sf_row k_sf_row(void *ws, long V, long row)
{
    char *p = (char *)ws + (size_t)row * sf_row_bytes(V);
    sf_row w;
    w.keys = (uint64_t *)p;
    w.bin_weight = w.keys + V;
    w.bin_count = (uint32_t *)(w.bin_weight + MUSE_SS_BINS);
    w.cursor = w.bin_count + MUSE_SS_BINS;
    w.part_max = (float *)(w.cursor + MUSE_SS_BINS);
    w.part_first = (int32_t *)(w.part_max + sf_chunks(V, SF_CHUNK_LEAST));
    return w;
}

/* The sum of tot[j] over the warps j above warp w (of nw), every lane of the warp by a scan of
 * the totals across its lanes: five shuffles where a loop over the warps read up to 31. */
__device__ static uint64_t k_sf_warps_above(const uint64_t *tot, int nw, int w, int lane)
{
    uint64_t v = lane < nw ? tot[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t y = __shfl_down_sync(0xffffffffu, v, o);
        if (lane + o < 32) v += y;
    }
    uint64_t a = __shfl_sync(0xffffffffu, v, (w + 1) & 31); /* v at lane L: warps L and above */
    return w + 1 < 32 ? a : 0;
}

/* The sum over the threads above this one (higher index) of v; integers, so any order. */
__device__ static uint64_t k_sf_above(uint64_t v)
{
    __shared__ uint64_t warp_tot[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint64_t inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t y = __shfl_down_sync(0xffffffffu, inc, o);
        if (lane + o < 32) inc += y;
    }
    if (lane == 0) warp_tot[w] = inc;
    __syncthreads();
    uint64_t above = inc - v + k_sf_warps_above(warp_tot, nw, w, lane);
    __syncthreads();
    return above;
}

/* k_sf_above of two values at once (a count and a weight): one exchange, two barriers. */
__device__ static void k_sf_above2(uint64_t a, uint64_t b, uint64_t *above_a, uint64_t *above_b)
{
    __shared__ uint64_t tot_a[32], tot_b[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint64_t ia = a, ib = b;
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t ya = __shfl_down_sync(0xffffffffu, ia, o);
        uint64_t yb = __shfl_down_sync(0xffffffffu, ib, o);
        if (lane + o < 32) ia += ya, ib += yb;
    }
    if (lane == 0) tot_a[w] = ia, tot_b[w] = ib;
    __syncthreads();
    uint64_t ra = ia - a + k_sf_warps_above(tot_a, nw, w, lane);
    uint64_t rb = ib - b + k_sf_warps_above(tot_b, nw, w, lane);
    __syncthreads();
    *above_a = ra;
    *above_b = rb;
}

__device__ static uint64_t k_sf_sum(uint64_t v)
{
    __shared__ uint64_t total;
    uint64_t a = k_sf_above(v);
    if (threadIdx.x == 0) total = a + v;
    __syncthreads();
    uint64_t s = total;
    __syncthreads();
    return s;
}

/* The row's maximum (NaN never; -inf when nothing is above) and the lowest id holding it, from
 * the chunks'; called by warp 0 alone, whose lanes read the chunks in parallel (a maximum and a
 * minimum: the same whatever the order, as the host's). */
__device__ static void k_sf_combine(const sf_row *w, long V, int chunk, float *mx, long *best)
{
    int lane = threadIdx.x & 31;
    long nb = sf_chunks(V, chunk), f = V;
    float m = -INFINITY;
    for (long b = lane; b < nb; b += 32) m = w->part_max[b] > m ? w->part_max[b] : m;
    for (int o = 16; o > 0; o >>= 1) {
        float y = __shfl_xor_sync(0xffffffffu, m, o);
        m = y > m ? y : m;
    }
    for (long b = lane; b < nb; b += 32)
        if (w->part_max[b] == m && w->part_first[b] < f) f = w->part_first[b];
    for (int o = 16; o > 0; o >>= 1) {
        long y = __shfl_xor_sync(0xffffffffu, f, o);
        f = y < f ? y : f;
    }
    if (lane == 0) {
        *mx = m;
        *best = f;
    }
}

/* The row's mask (launch.h), NULL for a free row. */
__device__ static const uint8_t *k_sf_mask(const uint8_t *masks, const muse_k_sampling *params,
                                           long V, long row)
{
    return masks && params[row].masked ? masks + row * ((V + 7) / 8) : NULL;
}

/* The logit the row's draw sees: -inf where the mask (NULL: none) clears the token. */
__device__ __forceinline__ float k_sf_logit(const float *lg, const uint8_t *mk, long i)
{
    return !mk || (mk[i >> 3] >> (i & 7)) & 1 ? lg[i] : -INFINITY;
}

__device__ static bool k_sf_forced(float mx, float temperature)
{
    return mx == -INFINITY || !(temperature > 0) || mx == INFINITY;
}

__device__ static float k_sf_inv_t(float temperature)
{
    float inv_t = __fdiv_rn(1.0f, temperature);
    return inv_t > FLT_MAX ? FLT_MAX : inv_t;
}

/* Launch 1. Shape: grid (chunks, rows), block SF_THREADS. */
__global__ void k_sf_max(const float *logits, long V, int chunk, const muse_k_sampling *params,
                         const uint8_t *masks, void *ws)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    __shared__ float wm[SF_THREADS / 32];
    __shared__ long wf[SF_THREADS / 32];
    long row = blockIdx.y, c0 = (long)blockIdx.x * chunk, c1 = min(V, c0 + chunk);
    int t = threadIdx.x, lane = t & 31;
    const float *lg = logits + row * V;
    const uint8_t *mk = k_sf_mask(masks, params, V, row);
    sf_row w = k_sf_row(ws, V, row);
    float m = -INFINITY;
    for (long i = c0 + t; i < c1; i += SF_THREADS) {
        float x = k_sf_logit(lg, mk, i);
        m = x > m ? x : m;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float y = __shfl_xor_sync(0xffffffffu, m, o);
        m = y > m ? y : m;
    }
    if (lane == 0) wm[t >> 5] = m;
    __syncthreads();
    for (int j = 0; j < SF_THREADS / 32; j++) m = wm[j] > m ? wm[j] : m;
    long f = V;
    for (long i = c0 + t; i < c1; i += SF_THREADS)
        if (k_sf_logit(lg, mk, i) == m && i < f) f = i;
    for (int o = 16; o > 0; o >>= 1) {
        long y = __shfl_xor_sync(0xffffffffu, f, o);
        f = y < f ? y : f;
    }
    if (lane == 0) wf[t >> 5] = f;
    __syncthreads();
    if (t == 0) {
        for (int j = 0; j < SF_THREADS / 32; j++) f = wf[j] < f ? wf[j] : f;
        w.part_max[blockIdx.x] = m;
        w.part_first[blockIdx.x] = (int32_t)f;
    }
    if (blockIdx.x == 0)
        for (int j = t; j < MUSE_SS_BINS; j += SF_THREADS) {
            w.bin_weight[j] = 0;
            w.bin_count[j] = 0;
            w.cursor[j] = 0;
        }
}

/* Launch 2. Shape: grid (chunks, rows), block SF_THREADS. */
__global__ void k_sf_hist(const float *logits, long V, int chunk, const muse_k_sampling *params,
                          const uint8_t *masks, int wb, void *ws)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    __shared__ uint32_t cnt[MUSE_SS_BINS], low[MUSE_SS_BINS]; /* low: muse_ss_bin_weight's */
    __shared__ float s_mx;
    long row = blockIdx.y, c0 = (long)blockIdx.x * chunk, c1 = min(V, c0 + chunk);
    int t = threadIdx.x;
    const float *lg = logits + row * V;
    const uint8_t *mk = k_sf_mask(masks, params, V, row);
    sf_row w = k_sf_row(ws, V, row);
    float temperature = params[row].temperature;
    for (int j = t; j < MUSE_SS_BINS; j += SF_THREADS) cnt[j] = 0, low[j] = 0;
    if (t < 32) {
        long best;
        k_sf_combine(&w, V, chunk, &s_mx, &best);
    }
    __syncthreads();
    float mx = s_mx;
    if (k_sf_forced(mx, temperature)) return;
    float inv_t = k_sf_inv_t(temperature);
    for (long i = c0 + t; i < c1; i += SF_THREADS) {
        float q = muse_ss_weight(k_sf_logit(lg, mk, i), mx, inv_t, wb);
        if (q <= 0) continue;
        uint32_t bits = muse_sx_float_bits(q);
        atomicAdd(&cnt[muse_ss_bin(bits)], 1u);
        atomicAdd(&low[muse_ss_bin(bits)], muse_ss_low(bits));
    }
    __syncthreads();
    for (int j = t; j < MUSE_SS_BINS; j += SF_THREADS)
        if (cnt[j]) {
            atomicAdd(&w.bin_count[j], cnt[j]);
            atomicAdd((sf_u64 *)&w.bin_weight[j], (sf_u64)muse_ss_bin_weight(j, cnt[j], low[j]));
        }
}

/* Launch 3. Shape: grid (chunks, rows), block SF_THREADS (MUSE_SS_BINS / SF_THREADS bins a
 * thread for the segment starts). */
__global__ void k_sf_scatter(const float *logits, long V, int chunk, const muse_k_sampling *params,
                             const uint8_t *masks, int wb, void *ws)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    __shared__ uint32_t loc[MUSE_SS_BINS], base[MUSE_SS_BINS];
    __shared__ float s_mx;
    const int per = MUSE_SS_BINS / SF_THREADS;
    long row = blockIdx.y, c0 = (long)blockIdx.x * chunk, c1 = min(V, c0 + chunk);
    int t = threadIdx.x;
    const float *lg = logits + row * V;
    const uint8_t *mk = k_sf_mask(masks, params, V, row);
    sf_row w = k_sf_row(ws, V, row);
    float temperature = params[row].temperature;
    for (int j = t; j < MUSE_SS_BINS; j += SF_THREADS) loc[j] = 0;
    if (t < 32) {
        long best;
        k_sf_combine(&w, V, chunk, &s_mx, &best);
    }
    __syncthreads();
    float mx = s_mx;
    if (k_sf_forced(mx, temperature)) return;
    float inv_t = k_sf_inv_t(temperature);
    for (long i = c0 + t; i < c1; i += SF_THREADS) {
        float q = muse_ss_weight(k_sf_logit(lg, mk, i), mx, inv_t, wb);
        if (q > 0) atomicAdd(&loc[muse_ss_bin(muse_sx_float_bits(q))], 1u);
    }
    uint32_t cnt[per], got[per];
    uint64_t mine = 0; /* the thread's bins per * t .. per * t + per - 1 */
    for (int j = 0; j < per; j++) mine += cnt[j] = w.bin_count[per * t + j];
    uint64_t start = k_sf_above(mine); /* keys of the bins above the thread's (syncs) */
#pragma unroll
    for (int j = 0; j < per; j++) /* every claim issued before any is used: one round trip */
        got[j] = loc[per * t + j] ? atomicAdd(&w.cursor[per * t + j], loc[per * t + j]) : 0;
#pragma unroll
    for (int j = per - 1; j >= 0; j--) {
        int b = per * t + j;
        if (loc[b]) base[b] = (uint32_t)start + got[j];
        start += cnt[j];
        loc[b] = 0;
    }
    __syncthreads();
    for (long i = c0 + t; i < c1; i += SF_THREADS) {
        float q = muse_ss_weight(k_sf_logit(lg, mk, i), mx, inv_t, wb);
        if (q <= 0) continue;
        uint32_t bits = muse_sx_float_bits(q);
        int b = muse_ss_bin(bits);
        w.keys[base[b] + atomicAdd(&loc[b], 1u)] = muse_sx_key(bits, i);
    }
}

/* The select kernel's shared state. */
typedef struct {
    uint64_t seg[SF_SEG_CAP];
    /* a digit's keys, and their weight: below SF_HALVES_MOST keys the sums of their low weight
     * bits' two 9-bit halves, its weight by muse_ss_bin_weight (the keys all of one bin; 32-bit
     * adds where a 64-bit add in shared memory is a compare-and-swap loop), else the weights */
    uint32_t dcnt[MUSE_SS_DIGITS];
    union {
        struct {
            uint32_t lo[MUSE_SS_DIGITS], hi[MUSE_SS_DIGITS];
        } h;
        sf_u64 w[MUSE_SS_DIGITS];
    } dw;
    int slot;
    uint32_t slot_count;
    uint64_t cb, wb, key, total, candidates;
} sf_sel;

/* A thread's bins 2t and 2t + 1 (counts c, weights w) and the count and weight of every bin
 * above them (ac, aw): read and scanned once a row, for every crossing. */
typedef struct {
    uint64_t c0, c1, w0, w1, ac, aw;
} sf_bins;

__device__ static sf_bins k_sf_bins(const sf_row *w)
{
    int t = threadIdx.x;
    sf_bins b;
    b.c0 = w->bin_count[2 * t];
    b.c1 = w->bin_count[2 * t + 1];
    b.w0 = w->bin_weight[2 * t];
    b.w1 = w->bin_weight[2 * t + 1];
    k_sf_above2(b.c0 + b.c1, b.w0 + b.w1, &b.ac, &b.aw); /* syncs */
    return b;
}

/* Whether slot (its share, the shares above it) is where before + share first passes target;
 * the one thread whose slot is records it. */
__device__ static void k_sf_mark(sf_sel *s, int slot, uint64_t count, uint64_t weight, uint64_t cb,
                                 uint64_t wb, uint64_t target, int by_count)
{
    uint64_t before = by_count ? cb : wb, share = by_count ? count : weight;
    if (before <= target && target - before < share) {
        s->slot = slot;
        s->slot_count = (uint32_t)count;
        s->cb = cb;
        s->wb = wb;
    }
}

/* muse_ss_crossing_seq in parallel: thread t the bins 2t, 2t + 1 (bn), then digit t of each
 * pass. */
__device__ static muse_ss_crossing k_sf_crossing(sf_sel *s, const sf_row *w, const sf_bins *bn,
                                                 uint64_t target, int by_count)
{
    int t = threadIdx.x;
    if (t == 0) s->slot = -1;
    __syncthreads();
    k_sf_mark(s, 2 * t + 1, bn->c1, bn->w1, bn->ac, bn->aw, target, by_count);
    k_sf_mark(s, 2 * t, bn->c0, bn->w0, bn->ac + bn->c1, bn->aw + bn->w1, target, by_count);
    __syncthreads();
    muse_ss_crossing c = {0, s->cb, s->wb};
    int b = s->slot;
    if (b < 0) return c; /* not reached: the caller's target is below the total */
    uint64_t n = s->slot_count;
    const uint64_t *seg = w->keys + c.count_before;
    if (n == 1) {
        c.key = seg[0];
        __syncthreads();
        return c;
    }
    if (n <= SF_SEG_CAP) {
        for (uint64_t i = t; i < n; i += SF_SEL_THREADS) s->seg[i] = seg[i];
        seg = s->seg;
    }
    uint64_t prefix = (uint64_t)(b + MUSE_SS_BIN_BASE) << MUSE_SS_FREE_BITS;
    bool halves = n < SF_HALVES_MOST;
    for (int pass = 0; pass < MUSE_SS_PASSES; pass++) {
        s->dcnt[t] = 0;
        if (halves)
            s->dw.h.lo[t] = 0, s->dw.h.hi[t] = 0;
        else
            s->dw.w[t] = 0;
        __syncthreads();
        if (t == 0) s->slot = -1;
        for (uint64_t i = t; i < n; i += SF_SEL_THREADS) {
            uint64_t k = seg[i];
            if (!muse_ss_in_prefix(k, prefix, pass)) continue;
            int d = muse_ss_digit(k, pass);
            uint32_t lo = muse_ss_low((uint32_t)(k >> 32));
            atomicAdd(&s->dcnt[d], 1u);
            if (halves) {
                atomicAdd(&s->dw.h.lo[d], lo & 511u);
                atomicAdd(&s->dw.h.hi[d], lo >> 9);
            } else {
                atomicAdd(&s->dw.w[d], (sf_u64)muse_ss_key_weight(k));
            }
        }
        __syncthreads();
        uint64_t mc = s->dcnt[t], dc, dw;
        uint64_t mw =
            halves ? muse_ss_bin_weight(b, mc, ((uint64_t)s->dw.h.hi[t] << 9) + s->dw.h.lo[t])
                   : s->dw.w[t];
        k_sf_above2(mc, mw, &dc, &dw); /* syncs */
        k_sf_mark(s, t, mc, mw, c.count_before + dc, c.weight_before + dw, target, by_count);
        __syncthreads();
        int d = s->slot;
        if (d < 0) return c; /* not reached */
        c.count_before = s->cb;
        c.weight_before = s->wb;
        if (s->slot_count == 1) {
            for (uint64_t i = t; i < n; i += SF_SEL_THREADS)
                if (muse_ss_in_prefix(seg[i], prefix, pass) && muse_ss_digit(seg[i], pass) == d)
                    s->key = seg[i];
            __syncthreads();
            c.key = s->key;
            __syncthreads();
            return c;
        }
        prefix |= (uint64_t)d << muse_ss_shift(pass);
    }
    c.key = prefix;
    __syncthreads();
    return c;
}

/* muse_ss_weight_from_seq in parallel: the bins above cut's (bn: the weight above each of its
 * owner's bins; total, every bin's), then its keys >= cut. */
__device__ static uint64_t k_sf_weight_from(sf_sel *s, const sf_row *w, const sf_bins *bn,
                                            uint64_t total, uint64_t cut)
{
    int t = threadIdx.x, cb = muse_ss_key_bin(cut);
    if (cb < 0) return total; /* every bin above cut's, none of its keys */
    if (cb >= MUSE_SS_BINS) return 0;
    if (cb == 2 * t + 1) s->wb = bn->aw, s->cb = bn->ac, s->slot_count = (uint32_t)bn->c1;
    if (cb == 2 * t)
        s->wb = bn->aw + bn->w1, s->cb = bn->ac + bn->c1, s->slot_count = (uint32_t)bn->c0;
    __syncthreads();
    uint64_t above = s->wb, start = s->cb, n = s->slot_count, mine = 0;
    for (uint64_t i = t; i < n; i += SF_SEL_THREADS) {
        uint64_t k = w->keys[start + i];
        if (k >= cut) mine += muse_ss_key_weight(k);
    }
    return above + k_sf_sum(mine); /* (syncs) */
}

/* Launch 4. Shape: grid rows, block SF_SEL_THREADS. */
__global__ void __launch_bounds__(SF_SEL_THREADS)
    k_sf_select(long V, int chunk, const muse_k_sampling *params, const int64_t *draw_pos,
                const uint8_t *masks, int wb, void *ws, int32_t *tokens)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    __shared__ sf_sel s;
    __shared__ float s_mx;
    __shared__ long s_best;
    __shared__ int s_allowed;
    long row = blockIdx.x;
    int t = threadIdx.x;
    sf_row w = k_sf_row(ws, V, row);
    muse_k_sampling p = params[row];
    if (t < 32) k_sf_combine(&w, V, chunk, &s_mx, &s_best);
    __syncthreads();
    if (k_sf_forced(s_mx, p.temperature)) {
        long tok = s_best < V ? s_best : 0;
        const uint8_t *mk = k_sf_mask(masks, params, V, row);
        /* nothing allowed above -inf: the -inf found may be a masked token; the lowest allowed
         * id instead (a minimum: the atomics' order cannot matter) */
        if (mk && s_mx == -INFINITY) {
            if (t == 0) s_allowed = (int)V;
            __syncthreads();
            for (long i = t; i < V; i += SF_SEL_THREADS)
                if ((mk[i >> 3] >> (i & 7)) & 1) {
                    atomicMin(&s_allowed, (int)i);
                    break;
                }
            __syncthreads();
            if (s_allowed < V && !((mk[tok >> 3] >> (tok & 7)) & 1)) tok = s_allowed;
        }
        if (t == 0) tokens[row] = (int32_t)tok;
        return;
    }
    sf_bins bn = k_sf_bins(&w);
    if (t == 0) { /* thread 0 holds the lowest bins: above them is every other */
        s.total = bn.aw + bn.w0 + bn.w1;
        s.candidates = bn.ac + bn.c0 + bn.c1;
    }
    __syncthreads();
    uint64_t total = s.total, candidates = s.candidates, cut = 0, kept = total;
    if (p.top_k > 0 && (uint64_t)p.top_k < candidates) {
        muse_ss_crossing c = k_sf_crossing(&s, &w, &bn, (uint64_t)p.top_k - 1, 1);
        cut = c.key;
        kept = c.weight_before + muse_ss_key_weight(c.key);
    }
    if (p.top_p < 1) {
        uint64_t need = p.top_p > 0 ? muse_sx_ceil_float_times(p.top_p, kept) : 1;
        if (need == 0) need = 1;
        if (need < kept) {
            muse_ss_crossing c = k_sf_crossing(&s, &w, &bn, need - 1, 0);
            if (c.key > cut) {
                cut = c.key;
                kept = c.weight_before + muse_ss_key_weight(c.key);
            }
        }
    }
    if (p.min_p > 0) {
        uint64_t min_cut = muse_sx_min_p_cut(p.min_p, wb);
        if (min_cut > cut) {
            cut = min_cut;
            kept = k_sf_weight_from(&s, &w, &bn, total, cut);
        }
    }
    uint64_t u53 = muse_sx_rand_bits(p.seed, (uint64_t)draw_pos[row], 0) >> 11;
    uint64_t target = muse_sx_mul_shift(u53, kept, 53, 0);
    muse_ss_crossing c = k_sf_crossing(&s, &w, &bn, target, 0);
    if (t == 0) tokens[row] = (int32_t)muse_sx_key_id(c.key);
}

MUSE_K_API size_t muse_k_sample_fast_bytes(long rows, long V)
{
    return rows > 0 && V > 0 ? (size_t)rows * sf_row_bytes(V) : 0;
}

/* Logits a block in launches 1-3: SF_CHUNK, or MUSE_SF_CHUNK from the environment (a power of
 * two from SF_CHUNK_LEAST to SF_CHUNK_MOST; read once a process) for tuning. Any chunk draws
 * the same token: maxima, minima and integer sums. The largest is the fastest (2026-12-05, an
 * H100, one row at vocab 202048: 42-44 us at 4096, 53 at 1024, 84 at 256): each block zeroes
 * and adds out all the bins, whatever its logits. */
static int sf_chunk(void)
{
    static const int chunk = [] {
        const char *v = getenv("MUSE_SF_CHUNK");
        int n = v && *v ? atoi(v) : 0;
        return n >= SF_CHUNK_LEAST && n <= SF_CHUNK_MOST && !(n & (n - 1)) ? n : SF_CHUNK;
    }();
    return chunk;
}

MUSE_K_API int muse_k_sample_fast(const muse_k_ctx *ctx, const float *logits, long V,
                                  int weight_bits, void *ws, int32_t *tokens)
{
    long n = ctx->rows;
    cudaStream_t st = ctx->st;
    int chunk = sf_chunk();
    if (n <= 0 || V <= 0) return 0;
    dim3 grid((unsigned)sf_chunks(V, chunk), (unsigned)n);
    int err = k_launch(k_sf_max, grid, SF_THREADS, 0, st, logits, V, chunk, ctx->sampling,
                       ctx->masks, ws);
    if (!err)
        err = k_launch(k_sf_hist, grid, SF_THREADS, 0, st, logits, V, chunk, ctx->sampling,
                       ctx->masks, weight_bits, ws);
    if (!err)
        err = k_launch(k_sf_scatter, grid, SF_THREADS, 0, st, logits, V, chunk, ctx->sampling,
                       ctx->masks, weight_bits, ws);
    if (!err)
        err = k_launch(k_sf_select, (unsigned)n, SF_SEL_THREADS, 0, st, V, chunk, ctx->sampling,
                       ctx->draw_pos, ctx->masks, weight_bits, ws, tokens);
    return err;
}
