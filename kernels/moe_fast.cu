/* moe_fast: the fast path's router (a block an expert and 8 rows, 4 experts past 8 rows; not a
 * thread a logit), the selection (a warp a row; up to 4 rows, a thread a (row, expert)) and the
 * plan that groups a MoE's (row, slot) pairs by expert for the grouped product, one launch for
 * both up to 4 rows. The grouping is a counting sort done by one block in a fixed order: pair
 * p's place depends on sel alone, and its bits on its own row and expert alone (the product's
 * chain), never on its group. */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "moe_fast.cuh"
#include "moe_select.h"
#include "pdl.cuh"

#define MG_THREADS 256

#define RT_THREADS 256
#define RT_ROWS    8

/* The router kernels' block (x, y): expert x, rows y RT_ROWS .. + the count returned. */
__device__ __forceinline__ int d_router_block(long R, long *x, long *r0)
{
    *x = blockIdx.x;
    *r0 = (long)blockIdx.y * RT_ROWS;
    return R - *r0 < RT_ROWS ? (int)(R - *r0) : RT_ROWS;
}

/* The block's sums of acc[r] (each thread's share of row r) into out[r * E], r < nr: the
 * lanes' in a shuffle tree, the warps' in warp order (a fixed tree for every R). */
__device__ __forceinline__ void d_router_sum(double acc[RT_ROWS], int nr, float *out, long E)
{
    __shared__ double part[RT_THREADS / 32][RT_ROWS];
    int t = threadIdx.x, lane = t % 32, warp = t / 32;
#pragma unroll
    for (int r = 0; r < RT_ROWS; r++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        if (lane == 0) part[warp][r] = acc[r];
    }
    __syncthreads();
    if (t < nr) {
        double sum = part[0][t];
        for (int w = 1; w < RT_THREADS / 32; w++) sum += part[w][t];
        out[t * E] = (float)sum;
    }
}

/* grid (E, ceil(R / RT_ROWS)), RT_THREADS threads: block (x, y) is expert x for rows y RT_ROWS..
 * Thread t reads router elements t, t + RT_THREADS, ... once (the loop unrolled 4: several
 * loads in flight; 8 issued before their use measured slower) and adds each one's product with
 * every row of the block in double; then d_router_sum's tree. */
__global__ void __launch_bounds__(RT_THREADS)
    k_router_fast(const float *b, long H, long R, const void *router, int dtype, long E,
                  float *logits)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long x, r0;
    int t = threadIdx.x, nr = d_router_block(R, &x, &r0);
    double acc[RT_ROWS] = {0};
    int64_t base = (int64_t)x * H;
    const float *br = b + r0 * H;
#pragma unroll 4
    for (long i = t; i < H; i += RT_THREADS) {
        double w = (double)k_load(router, dtype, base + i);
#pragma unroll
        for (int r = 0; r < RT_ROWS; r++)
            if (r < nr) acc[r] += (double)br[r * H + i] * w;
    }
    d_router_sum(acc, nr, logits + r0 * E + x, E);
}

/* The router's 8-element chunks a thread holds at most (H <= 8 RT_THREADS RT_CHUNKS). */
#define RT_CHUNKS 4

/* Elements 8 c .. 8 c + 7 of a router row of dtype, as floats (c: a 16-byte aligned chunk). */
__device__ __forceinline__ void d_router_chunk(const void *row, int dtype, long c, float v[8])
{
    if (dtype == MUSE_K_F32) {
        float4 a = ((const float4 *)row)[2 * c], b = ((const float4 *)row)[2 * c + 1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
        return;
    }
    uint4 q = ((const uint4 *)row)[c];
    uint32_t h[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint16_t e = (uint16_t)(h[i / 2] >> (16 * (i % 2)));
        v[i] = dtype == MUSE_K_BF16 ? muse_bf16_to_f32(e) : k_f16_to_f32_hw(e);
    }
}

/* k_router_fast by 16-byte chunks (H a multiple of 8, at most 8 RT_THREADS RT_CHUNKS, the
 * rows 16-byte aligned): thread t's chunks t, t + RT_THREADS, .. of the router row all loaded
 * before the first product, then each row's products in chunk order, element order; the same
 * tree after. A row's bits are the same at any R (not k_router_fast's: its order differs). */
__global__ void __launch_bounds__(RT_THREADS)
    k_router_vec(const float *b, long H, long R, const void *router, int dtype, long E,
                 float *logits)
{
    K_PDL_NEXT();
    long x, r0;
    int t = threadIdx.x, nr = d_router_block(R, &x, &r0);
    long chunks = H / 8;
    int es = dtype == MUSE_K_F32 ? 4 : 2;
    const void *row = (const unsigned char *)router + (size_t)x * (size_t)H * (size_t)es;
    float w[RT_CHUNKS][8];
#pragma unroll
    for (int j = 0; j < RT_CHUNKS; j++)
        if (t + (long)j * RT_THREADS < chunks)
            d_router_chunk(row, dtype, t + (long)j * RT_THREADS, w[j]);
    K_PDL_WAIT(); /* the router's weights in flight; b comes from the kernel before */
    double acc[RT_ROWS] = {0};
#pragma unroll
    for (int r = 0; r < RT_ROWS; r++) {
        if (r >= nr) continue;
        const float4 *br = (const float4 *)(b + (r0 + r) * H);
#pragma unroll
        for (int j = 0; j < RT_CHUNKS; j++) {
            long c = t + (long)j * RT_THREADS;
            if (c >= chunks) break;
            float4 p = br[2 * c], q = br[2 * c + 1];
            float bv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r] += (double)bv[e] * (double)w[j][e];
        }
    }
    d_router_sum(acc, nr, logits + r0 * E + x, E);
}

/* One level (xor M) of a warp's reduce-scatter of 2 M values a lane: a lane with bit M keeps
 * values [M, 2 M) (moved down to [0, M)), else [0, M), each plus its partner's copy */
template <int M> __device__ __forceinline__ void d_rs_level(double *v, int lane)
{
    bool up = lane & M;
#pragma unroll
    for (int i = 0; i < M; i++) {
        double send = up ? v[i] : v[i + M], keep = up ? v[i + M] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, M);
    }
}

/* k_router_vec for many rows, RT_EXPERTS experts a block: the block's 8 rows of b read once for
 * its experts, not once an expert. Thread t takes the chunks k_router_vec's thread t takes, each
 * (row, expert) sum in that kernel's order, chunk then element, from zero; an fma where that
 * kernel multiplies then adds is the same double (a product of two floats is exact in double);
 * then d_router_sum's tree an expert. So a row's bits are k_router_vec's.
 * grid (ceil(E / RT_EXPERTS), ceil(R / RT_ROWS)), RT_THREADS threads. */
#define RT_EXPERTS 4
__global__ void __launch_bounds__(RT_THREADS)
    k_router_rows(const float *b, long H, long R, const void *router, int dtype, long E,
                  float *logits)
{
    K_PDL_NEXT();
    __shared__ double part[RT_THREADS / 32][RT_ROWS][RT_EXPERTS];
    long x0 = (long)blockIdx.x * RT_EXPERTS, r0 = (long)blockIdx.y * RT_ROWS, chunks = H / 8;
    int t = threadIdx.x, lane = t % 32, warp = t / 32;
    int nr = R - r0 < RT_ROWS ? (int)(R - r0) : RT_ROWS;
    int nx = E - x0 < RT_EXPERTS ? (int)(E - x0) : RT_EXPERTS;
    size_t es = dtype == MUSE_K_F32 ? 4 : 2;
    const unsigned char *rows = (const unsigned char *)router + (size_t)x0 * (size_t)H * es;
    K_PDL_WAIT(); /* b comes from the kernel before */
    double acc[RT_ROWS][RT_EXPERTS];
#pragma unroll
    for (int r = 0; r < RT_ROWS; r++)
#pragma unroll
        for (int x = 0; x < RT_EXPERTS; x++) acc[r][x] = 0;
#pragma unroll
    for (int j = 0; j < RT_CHUNKS; j++) {
        long c = t + (long)j * RT_THREADS;
        if (c >= chunks) break;
        float w[RT_EXPERTS][8];
#pragma unroll
        for (int x = 0; x < RT_EXPERTS; x++)
            if (x < nx) d_router_chunk(rows + (size_t)x * (size_t)H * es, dtype, c, w[x]);
#pragma unroll
        for (int r = 0; r < RT_ROWS; r++) {
            if (r >= nr) continue;
            const float4 *br = (const float4 *)(b + (r0 + r) * H);
            float4 p = br[2 * c], q = br[2 * c + 1];
            float bv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
            for (int x = 0; x < RT_EXPERTS; x++)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[r][x] = __fma_rn((double)bv[e], (double)w[x][e], acc[r][x]);
        }
    }
    /* d_router_sum's tree for each (row, expert): the lanes' by xor 16, 8, 4, 2, 1, as a
     * reduce-scatter: at each level a lane keeps half its values and adds its partner's copy of
     * them (the butterfly's sum of the same two operands), ending with value `lane`'s; 31
     * values cross lanes where the butterfly moved 160. Then the warps in warp order. */
    static_assert(RT_ROWS * RT_EXPERTS == 32, "a lane a (row, expert) value");
    double v[32];
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = acc[i / RT_EXPERTS][i % RT_EXPERTS];
    d_rs_level<16>(v, lane);
    d_rs_level<8>(v, lane);
    d_rs_level<4>(v, lane);
    d_rs_level<2>(v, lane);
    d_rs_level<1>(v, lane);
    part[warp][lane / RT_EXPERTS][lane % RT_EXPERTS] = v[0];
    __syncthreads();
    if (t < RT_ROWS * RT_EXPERTS) {
        int r = t / RT_EXPERTS, x = t % RT_EXPERTS;
        if (r >= nr || x >= nx) return;
        double sum = part[0][r][x];
        for (int w = 1; w < RT_THREADS / 32; w++) sum += part[w][r][x];
        logits[(r0 + r) * E + x0 + x] = (float)sum;
    }
}

/* Row r's selection by one warp, kernels/moe.cu k_select's result bit for bit (key, taken:
 * the warp's E floats and E bytes of shared memory). The picks are the order (key descending,
 * expert ascending): without a NaN key each expert's place is the count of the keys before it
 * in that order, every lane counting its experts' at once; a row with a NaN key takes the
 * sequential picks (each the largest key not taken, ties to the lower expert: a lane's scan
 * keeps its first, the warp's tree the lower index). The weights: the same fp32 steps in pick
 * order. */
__device__ void d_select_row(const float *logits, long r, long E, long K, const float *bias,
                             int norm_topk, float scaling, int32_t *sel, float *w, float *key,
                             unsigned char *taken, int lane)
{
    const float *lg = logits + r * E;
    bool nan = false;
    for (long x = lane; x < E; x += 32) {
        float sg = k_sigmoid(lg[x]);
        key[x] = bias ? __fadd_rn(sg, bias[x]) : sg;
        taken[x] = 0;
        nan |= key[x] != key[x];
    }
    __syncwarp();
    int32_t *sr = sel + r * K;
    float *wr = w + r * K;
    if (!__any_sync(0xffffffffu, nan)) {
        for (long x = lane; x < E; x += 32) {
            float kx = key[x];
            long place = 0;
#pragma unroll 8
            for (long y = 0; y < E; y++) place += key[y] > kx || (key[y] == kx && y < x);
            if (place < K) {
                sr[place] = (int32_t)x;
                wr[place] = k_sigmoid(lg[x]);
            }
        }
    } else {
        for (long i = 0; i < K; i++) {
            long best = -1;
            for (long x = lane; x < E; x += 32)
                if (!taken[x] && (best < 0 || key[x] > key[best])) best = x;
            for (int o = 16; o > 0; o >>= 1) {
                long other = __shfl_xor_sync(0xffffffffu, best, o);
                if (other >= 0 && (best < 0 || key[other] > key[best] ||
                                   (key[other] == key[best] && other < best)))
                    best = other;
            }
            __syncwarp();
            if (lane == 0) taken[best] = 1;
            __syncwarp();
            if (lane == 0) {
                sr[i] = (int32_t)best;
                wr[i] = k_sigmoid(lg[best]);
            }
        }
    }
    __syncwarp(); /* the weights in pick order, written by the lanes, summed by lane 0 */
    if (lane == 0) {
        float sum = 0;
        for (long i = 0; i < K; i++) sum = __fadd_rn(sum, wr[i]);
        for (long i = 0; i < K; i++) {
            float v = wr[i];
            if (norm_topk) v = __fdiv_rn(v, sum);
            wr[i] = __fmul_rn(v, scaling);
        }
    }
}

/* grid ceil(R / 4), 128 threads: warp w row 4 x + w. shared: key [4][E], taken [4][E] */
__global__ void __launch_bounds__(128)
    k_select_fast(const float *logits, long R, long E, long K, const float *bias, int norm_topk,
                  float scaling, int32_t *sel, float *w)
{
    extern __shared__ float sf_sh[];
    K_PDL_NEXT();
    K_PDL_WAIT();
    int wi = threadIdx.x / 32;
    long r = (long)blockIdx.x * 4 + wi;
    if (r >= R) return;
    d_select_row(logits, r, E, K, bias, norm_topk, scaling, sel, w, sf_sh + (size_t)wi * E,
                 (unsigned char *)(sf_sh + 4 * E) + (size_t)wi * E, threadIdx.x % 32);
}

/* The groups of P pairs by the block's warps (shared: cnt [E], first [E], then base [W][E] for
 * the W warps). Warp w takes the pairs [w P / W, (w + 1) P / W) 32 at a time: a pass counts
 * each expert's pairs in its range (__match_any_sync: the lowest lane of each expert adds),
 * thread 0 lays out the experts' places and groups in expert order, each warp's places for an
 * expert start after the earlier warps', and a second pass writes perm: pair p's place is its
 * expert's first + the pairs of that expert before p (the earlier warps', the earlier chunks',
 * the lower lanes'). The same perm, groups and count as one thread walking the pairs. */
__device__ void d_group(const int32_t *sel, long P, long E, int group_rows, int max_groups,
                        int32_t *perm, int4 *groups, int32_t *n_groups, int32_t *cnt,
                        int32_t *first)
{
    int t = threadIdx.x, lane = t % 32, wi = t / 32, W = blockDim.x / 32;
    int32_t *base = first + E; /* [W][E] */
    long p0 = P * wi / W, p1 = P * (wi + 1) / W;
    for (long i = t; i < (long)W * E; i += blockDim.x) base[i] = 0;
    __syncthreads();
    unsigned below = (1u << lane) - 1u;
    for (long c = p0; c < p1; c += 32) {
        long p = c + lane;
        int32_t e = p < p1 ? sel[p] : -1;
        bool valid = e >= 0 && e < E; /* the others belong to no group */
        unsigned same = __match_any_sync(0xFFFFFFFFu, valid ? e : -1);
        if (valid && (same & below) == 0) base[(long)wi * E + e] += __popc(same);
        __syncwarp(); /* the next chunk's leader of e reads this one's count */
    }
    __syncthreads();
    for (long e = t; e < E; e += blockDim.x) { /* counts, then each warp's start within e */
        int32_t c = 0;
        for (int w = 0; w < W; w++) {
            int32_t n = base[(long)w * E + e];
            base[(long)w * E + e] = c;
            c += n;
        }
        cnt[e] = c;
    }
    __syncthreads();
    if (t == 0) { /* places and groups in expert order */
        int32_t at = 0, g = 0;
        for (long e = 0; e < E; e++) {
            first[e] = at;
            for (int32_t c0 = 0; c0 < cnt[e] && g < max_groups; c0 += group_rows, g++) {
                int32_t c = cnt[e] - c0 < group_rows ? cnt[e] - c0 : group_rows;
                groups[g] = make_int4((int)e, at + c0, c, 0);
            }
            at += cnt[e];
        }
        *n_groups = g;
    }
    __syncthreads();
    for (long c = p0; c < p1; c += 32) {
        long p = c + lane;
        int32_t e = p < p1 ? sel[p] : -1;
        bool valid = e >= 0 && e < E;
        unsigned same = __match_any_sync(0xFFFFFFFFu, valid ? e : -1);
        int32_t *b = valid ? base + (long)wi * E + e : NULL;
        int32_t at = valid ? first[e] + *b + __popc(same & below) : 0;
        __syncwarp();
        if (valid) {
            perm[at] = (int32_t)p;
            if ((same & below) == 0) *b += __popc(same);
        }
        __syncwarp();
    }
}

/* one block of MG_THREADS; shared: cnt[E], first[E], base [MG_THREADS / 32][E] */
__global__ void __launch_bounds__(MG_THREADS)
    k_moe_group(const int32_t *sel, long P, long E, int group_rows, int max_groups, int32_t *perm,
                int4 *groups, int32_t *n_groups)
{
    extern __shared__ int32_t mg_sh[];
    K_PDL_NEXT();
    K_PDL_WAIT();
    d_group(sel, P, E, group_rows, max_groups, perm, groups, n_groups, mg_sh, mg_sh + E);
}

/* d_group's plan for P <= blockDim.x pairs, a thread a pair: its place is the count of the
 * pairs before it in (expert, pair) order, and the pair that starts a group (its place among
 * its expert's a multiple of group_rows) writes that group at the count of the starts before
 * it. The same perm, groups and count as d_group. shared: s_sel [P], s_start [P]. */
__device__ void d_group_small(const int32_t *sel, int P, long E, int group_rows, int max_groups,
                              int32_t *perm, int4 *groups, int32_t *n_groups, int32_t *s_sel,
                              int32_t *s_start)
{
    int t = threadIdx.x;
    if (sel && t < P) s_sel[t] = sel[t]; /* sel NULL: s_sel holds them already */
    __syncthreads();
    int32_t e = t < P ? s_sel[t] : -1, place = 0, within = 0, count = 0;
    bool valid = e >= 0 && e < E; /* d_group skips the others */
    if (valid) {
        for (int q = 0; q < P; q++) {
            int32_t f = s_sel[q];
            bool fv = f >= 0 && f < E;
            place += fv && (f < e || (f == e && q < t));
            within += f == e && q < t;
            count += f == e;
        }
        perm[place] = t;
    }
    if (t < P) s_start[t] = valid && within % group_rows == 0 ? place : -1;
    __syncthreads();
    if (t < P && s_start[t] >= 0) {
        int g = 0;
        for (int q = 0; q < P; q++) g += s_start[q] >= 0 && s_start[q] < place;
        int32_t c = count - within < group_rows ? count - within : group_rows;
        if (g < max_groups) groups[g] = make_int4((int)e, place, c, 0);
    }
    if (t == 0) {
        int g = 0;
        for (int q = 0; q < P; q++) g += s_start[q] >= 0;
        *n_groups = g < max_groups ? g : max_groups;
    }
}

/* Up to 4 rows and 128 pairs: one block of 128 to 1024 threads (a multiple of 32) selects the
 * rows, then groups their pairs: k_select_fast and k_moe_group in one launch, the same bits.
 * Without a NaN key the block counts every (row, expert)'s place at once, S threads a key
 * (muse_select_split: S lanes of a warp) each counting the keys before it in its S-th of the
 * row, their counts added by shuffles (integers: the same place in any order), and the picks
 * stay in shared memory for the weights and the grouping; a row with a NaN key sends every row
 * to d_select_row. (H200, 2026-12-04, the whole one-GPU shape at 4 streams: 6.0 us of a
 * round's critical path a layer, 12.6 with a thread a key; rounds 1.2% shorter.)
 * shared: s_sel [128], s_start [128], s_w [128], then key [4][E], taken [4][E] */
__global__ void __launch_bounds__(1024)
    k_select_group_fast(const float *logits, long R, long E, long K, const float *bias,
                        int norm_topk, float scaling, int32_t *sel, float *w, int group_rows,
                        int max_groups, int32_t *perm, int4 *groups, int32_t *n_groups, int S)
{
    extern __shared__ int32_t sg_sh[];
    K_PDL_NEXT();
    K_PDL_WAIT();
    int t = threadIdx.x, wi = t / 32, nt = (int)blockDim.x, re = (int)(R * E), e = (int)E;
    float *s_w = (float *)(sg_sh + 2 * 128), *key = s_w + 128;
    unsigned nan = 0; /* the rows with a NaN key among this thread's */
    for (int i = t; i < re; i += nt) {
        int r = i / e, x = i % e;
        float sg = k_sigmoid(logits[i]);
        float kx = bias ? __fadd_rn(sg, bias[x]) : sg;
        key[r * E + x] = kx;
        nan |= (unsigned)(kx != kx) << r;
    }
    if (__syncthreads_or((int)nan)) { /* rare: every row the warp's way, sel through memory */
        if (wi < R)
            d_select_row(logits, wi, E, K, bias, norm_topk, scaling, sel, w, key + (size_t)wi * E,
                         (unsigned char *)(key + 4 * E) + (size_t)wi * E, t % 32);
        __syncthreads(); /* every row's sel, written by its warp, seen by the block */
        d_group_small(sel, (int)(R * K), E, group_rows, max_groups, perm, groups, n_groups, sg_sh,
                      sg_sh + 128);
        return;
    }
    /* place: the keys before it, key desc, expert asc; a pass takes nt / S keys, every thread
     * of the block in every pass (the shuffles) */
    for (int base = 0; base < re; base += nt / S) {
        int i = base + t / S, part = t % S, place = 0, r = 0, x = 0;
        bool live = i < re;
        if (live) {
            r = i / e, x = i % e;
            place = muse_select_place_part(key + r * e, e, x, part, S);
        }
        for (int m = S / 2; m > 0; m >>= 1) place += __shfl_xor_sync(0xffffffffu, place, m);
        if (live && part == 0 && place < K) {
            sg_sh[r * K + place] = (int32_t)x;
            s_w[r * K + place] = k_sigmoid(logits[i]);
        }
    }
    __syncthreads();
    if (t < R) { /* the weights: d_select_row's fp32 steps in pick order */
        float *wr = s_w + t * K, sum = 0;
        for (long i = 0; i < K; i++) sum = __fadd_rn(sum, wr[i]);
        for (long i = 0; i < K; i++) {
            float v = wr[i];
            if (norm_topk) v = __fdiv_rn(v, sum);
            wr[i] = __fmul_rn(v, scaling);
        }
    }
    __syncthreads();
    if (t < R * K) {
        sel[t] = sg_sh[t];
        w[t] = s_w[t];
    }
    d_group_small(NULL, (int)(R * K), E, group_rows, max_groups, perm, groups, n_groups, sg_sh,
                  sg_sh + 128);
}

/* MUSE_FAST_ROUTER=0 from the environment: the element-wise router everywhere (tuning only,
 * read once a process: its bits differ from the chunked one's, so a process keeps one). */
static int f_router_vec(void)
{
    static const int on = [] {
        const char *v = getenv("MUSE_FAST_ROUTER");
        return !(v && !strcmp(v, "0"));
    }();
    return on;
}

MUSE_K_API int muse_k_router_fast(const muse_k_ctx *ctx, const float *b, long H, const void *router,
                                  int dtype, long E, float *logits)
{
    long rows = ctx->rows;
    if (rows <= 0) return 0;
    dim3 grid((unsigned)E, (unsigned)((rows + RT_ROWS - 1) / RT_ROWS));
    if (f_router_vec() && H % 8 == 0 && H <= 8L * RT_THREADS * RT_CHUNKS &&
        (uintptr_t)b % 16 == 0 && (uintptr_t)router % 16 == 0) {
        if (rows > RT_ROWS) /* many rows: the rows of b read once for RT_EXPERTS experts */
            return k_launch(k_router_rows,
                            dim3((unsigned)((E + RT_EXPERTS - 1) / RT_EXPERTS), grid.y), RT_THREADS,
                            0, ctx->st, b, H, rows, router, dtype, E, logits);
        return k_launch(k_router_vec, grid, RT_THREADS, 0, ctx->st, b, H, rows, router, dtype, E,
                        logits);
    }
    return k_launch(k_router_fast, grid, RT_THREADS, 0, ctx->st, b, H, rows, router, dtype, E,
                    logits);
}

MUSE_K_API int muse_k_select_fast(const muse_k_ctx *ctx, const float *logits, long E, long K,
                                  const float *bias, int norm_topk, float scaling, int32_t *sel,
                                  float *w)
{
    long rows = ctx->rows;
    if (rows <= 0) return 0;
    size_t shared = (size_t)4 * E * (sizeof(float) + 1);
    if (shared > 48 * 1024 || K > E || K < 1) return (int)cudaErrorInvalidValue;
    return k_launch(k_select_fast, (unsigned)((rows + 3) / 4), 128, shared, ctx->st, logits, rows,
                    E, K, bias, norm_topk, scaling, sel, w);
}

MUSE_K_API int muse_k_select_group_fast(const muse_k_ctx *ctx, const float *logits, long E, long K,
                                        const float *bias, int norm_topk, float scaling,
                                        int32_t *sel, float *w, int group_rows, int max_groups,
                                        int32_t *perm, int32_t *groups, int32_t *n_groups)
{
    long rows = ctx->rows;
    if (rows <= 0) return 0;
    if (rows > 4 || rows * K > 128) {
        muse_k_ctx pairs = *ctx;
        pairs.rows = rows * K;
        int err = muse_k_select_fast(ctx, logits, E, K, bias, norm_topk, scaling, sel, w);
        return err ? err
                   : muse_k_moe_group(&pairs, sel, E, group_rows, max_groups, perm, groups,
                                      n_groups);
    }
    size_t shared = 3 * 128 * sizeof(int32_t) + (size_t)4 * E * (sizeof(float) + 1);
    if (shared > 48 * 1024 || K > E || K < 1 || group_rows < 1 || max_groups < 1)
        return (int)cudaErrorInvalidValue;
    int S = muse_select_split(rows * E);
    long threads = (rows * E * S + 31) / 32 * 32;
    threads = threads < 128 ? 128 : threads > 1024 ? 1024 : threads;
    return k_launch(k_select_group_fast, 1, (unsigned)threads, shared, ctx->st, logits, rows, E,
                    K, bias, norm_topk, scaling, sel, w, group_rows, max_groups, perm,
                    (int4 *)groups, n_groups, S);
}

MUSE_K_API int muse_k_moe_max_groups(long P, long E, int group_rows)
{
    long g = (P < E ? P : E) + P / (group_rows > 0 ? group_rows : 1);
    return g > 0 ? (int)g : 1;
}

MUSE_K_API int muse_k_moe_group(const muse_k_ctx *ctx, const int32_t *sel, long E, int group_rows,
                                int max_groups, int32_t *perm, int32_t *groups, int32_t *n_groups)
{
    long P = ctx->rows;
    if (P <= 0) return 0;
    size_t shared = (size_t)E * (2 + MG_THREADS / 32) * sizeof(int32_t);
    if (shared > 48 * 1024 || group_rows < 1 || max_groups < 1) return (int)cudaErrorInvalidValue;
    return k_launch(k_moe_group, 1, MG_THREADS, shared, ctx->st, sel, P, E, group_rows, max_groups,
                    perm, (int4 *)groups, n_groups);
}
