/* qk_norm_rope (fast path): one warp a (row, head), QK_HEADS heads a block. The sum of squares
 * in double, lane d, d + 32, ... then a warp butterfly (fast_rows.cuh: every lane the same
 * bits), so a head's bits depend on nothing but the head; then each element and each NEOX pair
 * exactly as kernels/qk_rope.cu (scaled in double to fp32, rotated in double, fp16). Lane d
 * owns the pair (d, d + half) of every d < half it visits, and reads nothing another lane writes.
 * The attention's inputs in one launch (k_attn_in_fast): q's heads and k's heads so, and each
 * of the rank's k heads written to the layer's cache with v's as muse_k_kv_write writes them.
 */
#include <stdlib.h>

#include "common.cuh"
#include "fast_rows.cuh"
#include "pdl.cuh"
#include "qk_rope_fast.cuh"
#include "model/kv_addr.h"

#define QK_HEADS 4

/* cos and sin of pair d's angle at position p: p theta^(-2d/hd), in double */
__device__ __forceinline__ void qk_angle(long hd, double p, double theta, long d, double *cs,
                                         double *sn)
{
    double angle = p * pow(theta, -2.0 * (double)d / (double)hd);
    *cs = cos(angle), *sn = sin(angle);
}

/* The rotation of lane's pairs d = lane + 32 i < hd / 2 at position p (i < QK_ROT: head_dim
 * up to 128): cos and sin of p theta^(-2d/hd), in double, as qk_head turns them. They depend on
 * the position alone, so a launch can make them before it waits for the kernel before. */
#define QK_ROT 2
__device__ __forceinline__ void qk_rot(long hd, double p, double theta, int lane, double cs[QK_ROT],
                                       double sn[QK_ROT])
{
#pragma unroll
    for (int i = 0; i < QK_ROT; i++) {
        long d = lane + 32 * i;
        cs[i] = 1.0, sn[i] = 0.0;
        if (theta != 0 && d < hd / 2) qk_angle(hd, p, theta, d, &cs[i], &sn[i]);
    }
}

/* One head v[hd] of a row at position p, by one warp, in place; kc: the head's cache row (fp16
 * bits of what is written) or NULL; rcs, rsn: qk_rot's of the row (hd <= 64 * QK_ROT), or NULL:
 * made here. */
__device__ __forceinline__ void qk_head(float *v, long hd, double p, double theta, double eps,
                                        int lane, uint16_t *kc, const double *rcs = NULL,
                                        const double *rsn = NULL)
{
    double acc = 0;
    for (long d = lane; d < hd; d += 32) acc += (double)v[d] * (double)v[d];
    double s = k_fr_scale(k_fr_warp_sum(acc), hd, eps);
    long half = hd / 2;
    for (long d = lane; d < hd; d += 32) {
        if (theta != 0 && d < half) {
            double cs, sn;
            if (rcs) { /* d < hd / 2 <= 32 QK_ROT: pair 0 or 1, selected (no local array) */
                bool second = d >= lane + 32;
                cs = second ? rcs[1] : rcs[0], sn = second ? rsn[1] : rsn[0];
            } else {
                qk_angle(hd, p, theta, d, &cs, &sn);
            }
            double x1 = (float)((double)v[d] * s), x2 = (float)((double)v[d + half] * s);
            float y1 = k_round_f16_hw((float)(x1 * cs - x2 * sn));
            float y2 = k_round_f16_hw((float)(x2 * cs + x1 * sn));
            v[d] = y1;
            v[d + half] = y2;
            if (kc) kc[d] = k_f32_to_f16_hw(y1), kc[d + half] = k_f32_to_f16_hw(y2);
        } else if (theta == 0 || d >= 2 * half) {
            float y = k_round_f16_hw((float)((double)v[d] * s));
            v[d] = y;
            if (kc) kc[d] = k_f32_to_f16_hw(y);
        }
    }
}

/* Shape: grid (ceil(heads / QK_HEADS), rows), block 32 * QK_HEADS. */
__global__ void k_qk_norm_rope_fast(float *x, long heads, long hd, const int64_t *positions,
                                    double theta, double eps)
{
    K_PDL_NEXT();
    K_PDL_WAIT();
    long r = blockIdx.y, hh = (long)blockIdx.x * QK_HEADS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (hh >= heads) return; /* a whole warp: the shuffles below see only full warps */
    qk_head(x + (r * heads + hh) * hd, hd, (double)positions[r], theta, eps, lane, NULL);
}

/* Shape: grid (qb + ceil(hk / QK_HEADS), rows), qb = ceil(hq / QK_HEADS), block 32 * QK_HEADS:
 * blocks below qb take q's heads, the rest k's; a k head inside the cache's [off, off + kv_width)
 * goes to the row's cache slot with the same columns of v (a padding row or an unreserved block:
 * no write, as muse_k_kv_write). EARLY (head_dim <= 128, unless MUSE_ROPE_EARLY=0 from the
 * environment): the row's rotations (qk_rot: a double pow, cos and sin a pair) made before the
 * wait for the kernel before, from the round's positions, off the chain the wait ends; the same
 * bits. */
template <int EARLY>
__global__ void k_attn_in_fast(float *q, long hq, float *k, long hk, const float *v, long hd,
                               long off, muse_k_kv kv, const int32_t *seqs,
                               const int64_t *positions, double theta, double eps)
{
    K_PDL_NEXT();
    if (!EARLY) K_PDL_WAIT();
    long r = blockIdx.y, qb = (hq + QK_HEADS - 1) / QK_HEADS;
    long hh = ((long)blockIdx.x - (blockIdx.x < qb ? 0 : qb)) * QK_HEADS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    double p = (double)positions[r]; /* the round's, copied in before its first kernel */
    double cs[QK_ROT], sn[QK_ROT];
    if (EARLY) qk_rot(hd, p, theta, lane, cs, sn);
    const double *rcs = EARLY ? cs : NULL, *rsn = EARLY ? sn : NULL;
    /* a k head's cache slot: with EARLY, looked up before the wait too (the round's rows and
     * tables, which no kernel writes: the split reads them so), off the chain it ends */
    const bool of_k = blockIdx.x >= qb && hh < hk;
    const long c0 = hh * hd - off; /* the head's first column in the cache row */
    int64_t at = -1;
    auto slot = [&] {
        int seq = seqs[r];
        if (seq >= 0 && c0 >= 0 && c0 < kv.kv_width)
            at = muse_kv_offset(kv.tables, kv.blocks_per_seq, kv.cap, seq, positions[r], 0,
                                kv.kv_width);
    };
    if (EARLY && of_k) slot();
    if (EARLY) K_PDL_WAIT();
    if (blockIdx.x < qb) {
        if (hh < hq) qk_head(q + (r * hq + hh) * hd, hd, p, theta, eps, lane, NULL, rcs, rsn);
        return;
    }
    if (!of_k) return; /* a whole warp: the shuffles see only full warps */
    if (!EARLY) slot();
    const float *vr = v + r * hk * hd + hh * hd;
    if (EARLY) { /* v's columns loaded with the head's, not after its chain (hd <= 128) */
        float vv[2 * QK_ROT];
#pragma unroll
        for (int i = 0; i < 2 * QK_ROT; i++)
            vv[i] = at >= 0 && lane + 32 * i < hd ? vr[lane + 32 * i] : 0.0f;
        qk_head(k + (r * hk + hh) * hd, hd, p, theta, eps, lane, at >= 0 ? kv.k + at + c0 : NULL,
                rcs, rsn);
        if (at < 0) return;
#pragma unroll
        for (int i = 0; i < 2 * QK_ROT; i++)
            if (lane + 32 * i < hd) kv.v[at + c0 + lane + 32 * i] = k_f32_to_f16_hw(vv[i]);
        return;
    }
    qk_head(k + (r * hk + hh) * hd, hd, p, theta, eps, lane, at >= 0 ? kv.k + at + c0 : NULL, rcs,
            rsn);
    if (at < 0) return;
    for (long d = lane; d < hd; d += 32) kv.v[at + c0 + d] = k_f32_to_f16_hw(vr[d]);
}

MUSE_K_API int muse_k_qk_norm_rope_fast(const muse_k_ctx *ctx, float *x, long heads, long head_dim,
                                        double theta, double eps)
{
    if (ctx->rows <= 0 || heads <= 0 || head_dim <= 0) return 0;
    dim3 grid((unsigned)((heads + QK_HEADS - 1) / QK_HEADS), (unsigned)ctx->rows);
    return k_launch(k_qk_norm_rope_fast, grid, 32 * QK_HEADS, 0, ctx->st, x, heads, head_dim,
                    ctx->positions, theta, eps);
}

MUSE_K_API int muse_k_attn_in_fast(const muse_k_ctx *ctx, float *q, long hq, float *k, long hk,
                                   const float *v, long head_dim, long off, muse_k_kv kv,
                                   double theta, double eps)
{
    if (ctx->rows <= 0 || hq <= 0 || hk <= 0 || head_dim <= 0) return 0;
    if (off < 0 || off % head_dim || off + kv.kv_width > hk * head_dim || kv.kv_width % head_dim)
        return (int)cudaErrorInvalidValue;
    long blocks = (hq + QK_HEADS - 1) / QK_HEADS + (hk + QK_HEADS - 1) / QK_HEADS;
    dim3 grid((unsigned)blocks, (unsigned)ctx->rows);
    static const int early = [] {
        const char *e = getenv("MUSE_ROPE_EARLY");
        return !(e && e[0] == '0' && !e[1]);
    }();
    return k_launch(early && head_dim <= 64 * QK_ROT ? k_attn_in_fast<1> : k_attn_in_fast<0>, grid,
                    32 * QK_HEADS, 0, ctx->st, q, hq, k, hk, v, head_dim, off, kv, ctx->seqs,
                    ctx->positions, theta, eps);
}
