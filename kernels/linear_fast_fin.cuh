/* linear_fast_fin.cuh: the fast product's per-warp finish math, shared by the finish kernel
 * (linear_fast_ends.cu) and the register form's cluster epilogue (linear_fast_wr.cu), so both
 * compute one expression: a warp holds a row's 128-column block, lane l its elements 4 l ..
 * 4 l + 3. Both files build with -fmad=false (no contraction: every operation as written). */
#ifndef MUSE_K_LINEAR_FAST_FIN_CUH
#define MUSE_K_LINEAR_FAST_FIN_CUH

#include "common.cuh"
#include "fast_rows.cuh"
#include "linear_fast.h"
#include "linear_fast_ends.cuh"

#define HAD 128

/* The 128-point Hadamard of a chunk held by a warp, lane l holding elements 4 l .. 4 l + 3 in
 * v: stages h = 1, 2 in the lane, h = 4 .. 64 pairing lane l with l ^ (h / 4); each stage forms
 * every element as k_hadamard128 does (the lower index a + b, the upper a - b of the same
 * pair), in double, so the result is that kernel's bit for bit with no block barrier. */
__device__ __forceinline__ void f_hadamard_warp(double v[4], int lane)
{
#pragma unroll
    for (int h = 1; h <= 2; h <<= 1) { /* partners in the lane: q and q ^ h */
        double w[4];
#pragma unroll
        for (int q = 0; q < 4; q++) w[q] = q & h ? v[q ^ h] - v[q] : v[q] + v[q ^ h];
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] = w[q];
    }
#pragma unroll
    for (int h = 4; h < HAD; h <<= 1) { /* partners across lanes: l and l ^ (h / 4) */
        /* o - v or v + o as one fma by -1 or 1: the same rounding of the same exact sum (and
         * zero's sign), where the two sums and a select took 2 fp64 ops and 2 selects */
        double sgn = (lane * 4) & h ? -1.0 : 1.0;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            double o = __shfl_xor_sync(0xffffffffu, v[q], h / 4);
            v[q] = fma(sgn, v[q], o);
        }
    }
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] *= 0.08838834764831844055;
}

/* The scales of elements i .. i + 3 of a linear (i a multiple of 4; h, s: suh and su, or svh
 * and sv): k_in_scale / k_out_scale's values, h's four halves in one 8-byte load where aligned,
 * else the sign word's four bits. */
__device__ __forceinline__ void f_scales4(const uint16_t *h, const uint16_t *s, int64_t i,
                                          float o[4])
{
    if (!h) {
        unsigned w = (unsigned)s[i >> 4] >> (i & 15); /* i % 16 is 0, 4, 8 or 12 */
#pragma unroll
        for (int q = 0; q < 4; q++) o[q] = (w >> q) & 1 ? -1.0f : 1.0f;
        return;
    }
    const uint16_t *p = h + i;
    uint32_t lo, hi;
    if (((uintptr_t)p & 7) == 0) {
        uint2 u = *(const uint2 *)p;
        lo = u.x, hi = u.y;
    } else {
        lo = p[0] | (uint32_t)p[1] << 16, hi = p[2] | (uint32_t)p[3] << 16;
    }
    o[0] = k_f16_to_f32_hw((uint16_t)lo), o[1] = k_f16_to_f32_hw((uint16_t)(lo >> 16));
    o[2] = k_f16_to_f32_hw((uint16_t)hi), o[3] = k_f16_to_f32_hw((uint16_t)(hi >> 16));
}

/* A chunk's a (ar: its first element) = fp16(fp32(blockHad(x * scale))), lane l given the x
 * elements 4 l .. 4 l + 3 and their input scales sc; one 8-byte store a lane (ar is a row of
 * the workspace's a, k a multiple of 128: 8-byte aligned). */
__device__ __forceinline__ void f_prepare_vals(const float x[4], const float sc[4], uint16_t *ar,
                                               int lane)
{
    double v[4];
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] = (double)__fmul_rn(x[q], sc[q]);
    f_hadamard_warp(v, lane);
    uint32_t h[4];
#pragma unroll
    for (int q = 0; q < 4; q++) h[q] = k_f32_to_f16_hw((float)v[q]);
    *(uint2 *)(ar + 4 * lane) = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
}

/* Columns j0 + 4 lane .. + 3 after step 3 from their summed partials v, by one warp: the
 * Hadamard across the warp, the output scales sc and (has_bias) the bias bs. */
__device__ __forceinline__ void f_finish_vals(double v[4], const float sc[4], const float bs[4],
                                              bool has_bias, int lane, float out[4])
{
    f_hadamard_warp(v, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        double s = v[q] * (double)sc[q];
        if (has_bias) s += (double)bs[q];
        out[q] = (float)s;
    }
}

/* A finishing lane's per-column constants (weights, loaded before the partials): the output
 * scales sc and bias bs (has_bias) of columns j .. j + 3 of a linear, and (next) the next
 * linear's input scales nsc there. */
__device__ __forceinline__ void f_load_consts(const uint16_t *svh, const uint16_t *sv,
                                              const uint16_t *bias, const uint16_t *nsuh,
                                              const uint16_t *nsu, bool next, int64_t j,
                                              float sc[4], float bs[4], float nsc[4])
{
    f_scales4(svh, sv, j, sc);
    if (bias) f_scales4(bias, NULL, j, bs); /* its halves, as the scales' */
    if (next) f_scales4(nsuh, nsu, j, nsc);
}

/* SWIGLU's silu of the gate, which the finish rounds to fp16 first: in double as swiglu.cu */
__device__ __forceinline__ float f_silu(double gv)
{
    return (float)(gv / (1.0 + exp(-gv)));
}

/* The finish's sum of a column's S split partials: muse_fast_fin_groups's groups, in double */
__host__ __device__ __forceinline__ int f_fin_groups(int splits)
{
    return muse_fast_fin_groups(splits);
}

/* The end of a row's block b (columns j0 = 128 b ..) of linear li once finished into o (swiglu:
 * o the gate's, the up's at up[q * up_stride]): the swiglu or the fp16 rounding, the store at
 * out_row, the row's sum of squares (f.sq) and the next linear's step 1 at partial row r (f.na,
 * nsc its input scales there). */
__device__ __forceinline__ void f_fin_out(const muse_fast_fin &f, bool swiglu, int li, long r,
                                          long out_row, long b, int64_t j0, int lane, float o[4],
                                          const float *up, int up_stride, const float nsc[4])
{
    float *yr = f.y[li] + out_row * f.y_stride[li] + j0 + 4 * lane;
    if (swiglu) {
        float u[4];
#pragma unroll
        for (int q = 0; q < 4; q++) u[q] = up[q * up_stride];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float sg = f.silu ? f.silu[k_f32_to_f16_hw(o[q])] : f_silu(k_round_f16_hw(o[q]));
            o[q] = k_round_f16_hw(__fmul_rn(sg, k_round_f16_hw(u[q])));
        }
    } else if (f.round16) {
#pragma unroll
        for (int q = 0; q < 4; q++) o[q] = k_round_f16_hw(o[q]);
    }
    if (k_fr_aligned(yr))
        *(float4 *)yr = make_float4(o[0], o[1], o[2], o[3]);
    else
#pragma unroll
        for (int q = 0; q < 4; q++) yr[q] = o[q];
    if (f.sq) { /* the values written, squared in double: a fixed tree a row (fast_rows.cuh's) */
        double sq = (((double)o[0] * o[0] + (double)o[1] * o[1]) + (double)o[2] * o[2]) +
                    (double)o[3] * o[3];
        for (int m = 16; m > 0; m >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, m);
        if (lane == 0) f.sq[out_row * f.blk0[1] + b] = sq;
    }
    if (f.na) /* the next linear's row r: for a pair, its expert's (row r of a is perm[r]'s) */
        f_prepare_vals(o, nsc, f.na + r * f.nk + j0, lane);
}

#endif
