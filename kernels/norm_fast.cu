/* norm, add_norm, add_norm_norm (fast path): one block a row of k_fr_threads(width) threads,
 * float4 loads; the sum of squares in double in fast_rows.cuh's fixed tree (so it differs from
 * the exact kernel's CPU order only in the last bits of a double), then each element exactly
 * as kernels/norm.cu does it. A thread reads back only what it wrote itself. Rows up to 8192
 * wide are held in registers, every load of the row issued at once (k_nf_regs). */
#include "common.cuh"
#include "fast_rows.cuh"
#include "norm_fast.cuh"
#include "pdl.cuh"

/* v * the weight wj of mode (the exact kernel's fp32 steps), fp16-rounded when round16 */
__device__ __forceinline__ float k_nf_weigh_v(float v, float wj, int mode, int round16)
{
    if (mode == MUSE_K_NORM_PLUS1) v = __fmul_rn(v, __fadd_rn(1.0f, wj));
    if (mode == MUSE_K_NORM_PLAIN) v = __fmul_rn(v, wj);
    return round16 ? k_round_f16_hw(v) : v;
}

__device__ __forceinline__ float k_nf_weigh(float v, const float *w, long j, int mode, int round16)
{
    return k_nf_weigh_v(v, mode == MUSE_K_NORM_NONE ? 0.0f : w[j], mode, round16);
}

/* Rows of up to 2 float4 a thread (k_fr_threads: widths to 8192) in registers: every load of
 * the row issued at once, then each element's arithmetic and each thread's sum in the order of
 * the loops below, so the bits are theirs. NF_V float4 v = t + T i, then the tail element. */
#define NF_V 2
typedef struct {
    float4 v[NF_V];
    float tail;
} k_nf_regs;

__device__ __forceinline__ bool k_nf_fits(long n)
{
    return n / 4 <= NF_V * (long)blockDim.x;
}

/* p's share of the thread (p NULL: zeros) */
__device__ __forceinline__ k_nf_regs k_nf_load(const float *p, long n, bool vec)
{
    k_nf_regs r;
    long nv = n / 4, j = 4 * nv + threadIdx.x;
#pragma unroll
    for (int i = 0; i < NF_V; i++) {
        long v = threadIdx.x + (long)i * blockDim.x;
        r.v[i] = p && v < nv ? k_fr_load4(p, v, vec) : make_float4(0, 0, 0, 0);
    }
    r.tail = p && j < n ? p[j] : 0.0f;
    return r;
}

__device__ __forceinline__ double k_nf_sum_sq(const k_nf_regs &x, long n)
{
    double acc = 0;
    long nv = n / 4, j = 4 * nv + threadIdx.x;
#pragma unroll
    for (int i = 0; i < NF_V; i++)
        if (threadIdx.x + (long)i * blockDim.x < nv) acc += k_fr_sq4(x.v[i]);
    if (j < n) acc += (double)x.tail * (double)x.tail;
    return acc;
}

/* k_nf_out from registers: o = weighed (x * s) */
__device__ __forceinline__ void k_nf_out_regs(const k_nf_regs &x, const k_nf_regs &w, long n,
                                              double s, int mode, int round16, float *o, bool vec)
{
    long nv = n / 4, j = 4 * nv + threadIdx.x;
#pragma unroll
    for (int i = 0; i < NF_V; i++) {
        long v = threadIdx.x + (long)i * blockDim.x;
        if (v >= nv) continue;
        float4 a = x.v[i], b = w.v[i];
        a.x = k_nf_weigh_v((float)((double)a.x * s), b.x, mode, round16);
        a.y = k_nf_weigh_v((float)((double)a.y * s), b.y, mode, round16);
        a.z = k_nf_weigh_v((float)((double)a.z * s), b.z, mode, round16);
        a.w = k_nf_weigh_v((float)((double)a.w * s), b.w, mode, round16);
        k_fr_store4(o, v, a, vec);
    }
    if (j < n) o[j] = k_nf_weigh_v((float)((double)x.tail * s), w.tail, mode, round16);
}

/* k_nf_add from registers: h += (1 + w) * (y * s), h kept; returns the new h's sum share */
__device__ __forceinline__ double k_nf_add_regs(k_nf_regs &h, const k_nf_regs &y,
                                                const k_nf_regs &w, long n, double s, float *ho,
                                                bool vec)
{
    double acc = 0;
    long nv = n / 4, j = 4 * nv + threadIdx.x;
#pragma unroll
    for (int i = 0; i < NF_V; i++) {
        long v = threadIdx.x + (long)i * blockDim.x;
        if (v >= nv) continue;
        float4 a = y.v[i], b = h.v[i], c = w.v[i];
        b.x = __fadd_rn(b.x, __fmul_rn((float)((double)a.x * s), __fadd_rn(1.0f, c.x)));
        b.y = __fadd_rn(b.y, __fmul_rn((float)((double)a.y * s), __fadd_rn(1.0f, c.y)));
        b.z = __fadd_rn(b.z, __fmul_rn((float)((double)a.z * s), __fadd_rn(1.0f, c.z)));
        b.w = __fadd_rn(b.w, __fmul_rn((float)((double)a.w * s), __fadd_rn(1.0f, c.w)));
        k_fr_store4(ho, v, b, vec);
        h.v[i] = b;
        acc += k_fr_sq4(b);
    }
    if (j < n) {
        h.tail = __fadd_rn(h.tail, __fmul_rn((float)((double)y.tail * s), __fadd_rn(1.0f, w.tail)));
        ho[j] = h.tail;
        acc += (double)h.tail * (double)h.tail;
    }
    return acc;
}

/* out row = weighed (x * s): the thread's float4s, then its tail element. */
__device__ __forceinline__ void k_nf_out(const float *x, long n, double s, const float *w, int mode,
                                         int round16, float *o, bool vec)
{
    long nv = n / 4;
    for (long v = threadIdx.x; v < nv; v += blockDim.x) {
        float4 a = k_fr_load4(x, v, vec);
        a.x = k_nf_weigh((float)((double)a.x * s), w, 4 * v, mode, round16);
        a.y = k_nf_weigh((float)((double)a.y * s), w, 4 * v + 1, mode, round16);
        a.z = k_nf_weigh((float)((double)a.z * s), w, 4 * v + 2, mode, round16);
        a.w = k_nf_weigh((float)((double)a.w * s), w, 4 * v + 3, mode, round16);
        k_fr_store4(o, v, a, vec);
    }
    long j = 4 * nv + threadIdx.x;
    if (j < n) o[j] = k_nf_weigh((float)((double)x[j] * s), w, j, mode, round16);
}

/* h row += (1 + w) * (y * s) element by element, as k_add_norm; returns the thread's share of
 * the new h's sum of squares (fast_rows.cuh's layout) for a norm that follows. */
__device__ __forceinline__ double k_nf_add(float *h, const float *y, long n, double s,
                                           const float *w, bool vec)
{
    double acc = 0;
    long nv = n / 4;
    for (long v = threadIdx.x; v < nv; v += blockDim.x) {
        float4 a = k_fr_load4(y, v, vec), b = k_fr_load4(h, v, vec);
        b.x = __fadd_rn(b.x, __fmul_rn((float)((double)a.x * s), __fadd_rn(1.0f, w[4 * v])));
        b.y = __fadd_rn(b.y, __fmul_rn((float)((double)a.y * s), __fadd_rn(1.0f, w[4 * v + 1])));
        b.z = __fadd_rn(b.z, __fmul_rn((float)((double)a.z * s), __fadd_rn(1.0f, w[4 * v + 2])));
        b.w = __fadd_rn(b.w, __fmul_rn((float)((double)a.w * s), __fadd_rn(1.0f, w[4 * v + 3])));
        k_fr_store4(h, v, b, vec);
        acc += k_fr_sq4(b);
    }
    long j = 4 * nv + threadIdx.x;
    if (j < n) {
        h[j] = __fadd_rn(h[j], __fmul_rn((float)((double)y[j] * s), __fadd_rn(1.0f, w[j])));
        acc += (double)h[j] * (double)h[j];
    }
    return acc;
}

/* Shape: grid rows, block k_fr_threads(width); row r's weight w + w_row[r] * w_stride (the
 * MoE's per-expert norms) where w_row is given. */
__global__ void k_norm_fast(const float *x, long width, const float *w, long w_stride,
                            const int32_t *w_row, int mode, double eps, int round16, float *out)
{
    K_PDL_NEXT();
    K_PDL_WAIT(); /* x and w_row come from the kernels before */
    long r = blockIdx.x;
    if (w && w_row) w += (long)w_row[r] * w_stride;
    const float *xr = x + r * width;
    float *o = out + r * width;
    bool vec = width % 4 == 0 && k_fr_aligned(x) && k_fr_aligned(out);
    if (k_nf_fits(width)) {
        bool wvec = width % 4 == 0 && (!w || k_fr_aligned(w));
        k_nf_regs xv = k_nf_load(xr, width, vec);
        k_nf_regs wv = k_nf_load(mode == MUSE_K_NORM_NONE ? NULL : w, width, wvec);
        double s = k_fr_scale(k_fr_block_sum(k_nf_sum_sq(xv, width)), width, eps);
        k_nf_out_regs(xv, wv, width, s, mode, round16, o, vec);
        return;
    }
    double s = k_fr_scale(k_fr_block_sum(k_fr_sum_sq(xr, width, vec)), width, eps);
    k_nf_out(xr, width, s, w, mode, round16, o, vec);
}

/* Shape: grid rows, block k_fr_threads(width); out NULL: add_norm alone. */
__device__ __forceinline__ void k_add_norm_body(float *h, const float *y, long width,
                                                const float *w, double eps, const float *next_w,
                                                int next_mode, double next_eps, float *out)
{
    K_PDL_NEXT();
    long r = blockIdx.x;
    const float *yr = y + r * width;
    float *hr = h + r * width;
    bool vec = width % 4 == 0 && k_fr_aligned(h) && k_fr_aligned(y) && (!out || k_fr_aligned(out));
    if (k_nf_fits(width)) { /* y, h and both weights loaded at once */
        bool wvec = width % 4 == 0 && k_fr_aligned(w);
        bool nvec = width % 4 == 0 && (!next_w || k_fr_aligned(next_w));
        /* the weights (no kernel writes them) in flight before the wait, then y and h */
        k_nf_regs wv = k_nf_load(w, width, wvec);
        k_nf_regs nw = k_nf_load(out && next_mode != MUSE_K_NORM_NONE ? next_w : NULL, width, nvec);
        K_PDL_WAIT();
        k_nf_regs yv = k_nf_load(yr, width, vec), hv = k_nf_load(hr, width, vec);
        double s = k_fr_scale(k_fr_block_sum(k_nf_sum_sq(yv, width)), width, eps);
        double acc = k_nf_add_regs(hv, yv, wv, width, s, hr, vec);
        if (!out) return;
        double s2 = k_fr_scale(k_fr_block_sum(acc), width, next_eps);
        k_nf_out_regs(hv, nw, width, s2, next_mode, 1, out + r * width, vec);
        return;
    }
    K_PDL_WAIT();
    double s = k_fr_scale(k_fr_block_sum(k_fr_sum_sq(yr, width, vec)), width, eps);
    double acc = k_nf_add(hr, yr, width, s, w, vec);
    if (!out) return;
    double s2 = k_fr_scale(k_fr_block_sum(acc), width, next_eps);
    k_nf_out(hr, width, s2, next_w, next_mode, 1, out + r * width, vec);
}

__global__ void k_add_norm_fast(float *h, const float *y, long width, const float *w, double eps,
                                const float *next_w, int next_mode, double next_eps, float *out)
{
    k_add_norm_body(h, y, width, w, eps, next_w, next_mode, next_eps, out);
}

/* The same past NF_PLAIN_MAX threads a block (widths past 6144): uncapped, ptxas gives the body
 * 78 registers, and a block of more than 800 threads of those cannot launch; capped at 64 (a
 * few bytes spilled) every k_fr_threads block can. */
#define NF_PLAIN_MAX 768 /* hidden 6144's block: the uncapped kernel launched there on the H200 */
__global__ void __launch_bounds__(1024)
    k_add_norm_fast_wide(float *h, const float *y, long width, const float *w, double eps,
                         const float *next_w, int next_mode, double next_eps, float *out)
{
    k_add_norm_body(h, y, width, w, eps, next_w, next_mode, next_eps, out);
}

/* add_norm (+ the next norm) where a row is exactly two float4 a thread (width 8 T, T threads
 * from k_fr_threads: widths a multiple of 256 up to 8192) and every pointer 16-byte aligned:
 * k_add_norm_fast's registers path with its loads unpredicated, 32-bit indices and the next
 * norm's mode fixed (NM: -1 no next norm, else MUSE_K_NORM_*), so a warp's chain is the
 * arithmetic and the sums. The same steps in the same order: the same bits. */
template <int NM, int MAXT> /* MAXT: NF_PLAIN_MAX (70 registers, no spill) or 1024 (64, spilled) */
__global__ void __launch_bounds__(MAXT)
    k_add_norm_lean(float *h, const float *y, int width, const float *w, double eps,
                    const float *next_w, double next_eps, float *out)
{
    K_PDL_NEXT();
    const int t = threadIdx.x, T = (int)blockDim.x;
    const long r = blockIdx.x;
    const float4 *w4 = (const float4 *)w;
    /* the weights (no kernel writes them) in flight before the wait, then y and h */
    const float4 wa = w4[t], wb = w4[t + T];
    float4 na = make_float4(0, 0, 0, 0), nb = na;
    if (NM == MUSE_K_NORM_PLUS1 || NM == MUSE_K_NORM_PLAIN) {
        na = ((const float4 *)next_w)[t];
        nb = ((const float4 *)next_w)[t + T];
    }
    float4 *h4 = (float4 *)(h + r * width);
    const float4 *y4 = (const float4 *)(y + r * width);
    K_PDL_WAIT();
    const float4 ya = y4[t], yb = y4[t + T];
    float4 ha = h4[t], hb = h4[t + T];
    double acc = 0; /* k_nf_sum_sq's order */
    acc += k_fr_sq4(ya);
    acc += k_fr_sq4(yb);
    const double s = k_fr_scale(k_fr_block_sum(acc), width, eps);
    /* k_nf_add_regs: h += (1 + w) * (y * s) */
    ha.x = __fadd_rn(ha.x, __fmul_rn((float)((double)ya.x * s), __fadd_rn(1.0f, wa.x)));
    ha.y = __fadd_rn(ha.y, __fmul_rn((float)((double)ya.y * s), __fadd_rn(1.0f, wa.y)));
    ha.z = __fadd_rn(ha.z, __fmul_rn((float)((double)ya.z * s), __fadd_rn(1.0f, wa.z)));
    ha.w = __fadd_rn(ha.w, __fmul_rn((float)((double)ya.w * s), __fadd_rn(1.0f, wa.w)));
    hb.x = __fadd_rn(hb.x, __fmul_rn((float)((double)yb.x * s), __fadd_rn(1.0f, wb.x)));
    hb.y = __fadd_rn(hb.y, __fmul_rn((float)((double)yb.y * s), __fadd_rn(1.0f, wb.y)));
    hb.z = __fadd_rn(hb.z, __fmul_rn((float)((double)yb.z * s), __fadd_rn(1.0f, wb.z)));
    hb.w = __fadd_rn(hb.w, __fmul_rn((float)((double)yb.w * s), __fadd_rn(1.0f, wb.w)));
    h4[t] = ha;
    h4[t + T] = hb;
    if (NM < 0) return;
    double acc2 = 0;
    acc2 += k_fr_sq4(ha);
    acc2 += k_fr_sq4(hb);
    const double s2 = k_fr_scale(k_fr_block_sum(acc2), width, next_eps);
    /* k_nf_out_regs, fp16-rounded */
    float4 *o4 = (float4 *)(out + r * width);
    float4 oa, ob;
    oa.x = k_nf_weigh_v((float)((double)ha.x * s2), na.x, NM, 1);
    oa.y = k_nf_weigh_v((float)((double)ha.y * s2), na.y, NM, 1);
    oa.z = k_nf_weigh_v((float)((double)ha.z * s2), na.z, NM, 1);
    oa.w = k_nf_weigh_v((float)((double)ha.w * s2), na.w, NM, 1);
    ob.x = k_nf_weigh_v((float)((double)hb.x * s2), nb.x, NM, 1);
    ob.y = k_nf_weigh_v((float)((double)hb.y * s2), nb.y, NM, 1);
    ob.z = k_nf_weigh_v((float)((double)hb.z * s2), nb.z, NM, 1);
    ob.w = k_nf_weigh_v((float)((double)hb.w * s2), nb.w, NM, 1);
    o4[t] = oa;
    o4[t + T] = ob;
}

/* k_add_norm_lean's launch where the row and pointers fit it (next_mode -1: no next norm);
 * -1 where they do not */
static int nf_lean_launch(const muse_k_ctx *ctx, float *h, const float *y, long width,
                          const float *w, double eps, const float *next_w, int next_mode,
                          double next_eps, float *out)
{
    unsigned T = k_fr_threads(width);
    bool nw = next_mode == MUSE_K_NORM_PLUS1 || next_mode == MUSE_K_NORM_PLAIN;
    /* no NULL either: the general kernel reads a NULL vector as zeros and skips a NULL out */
    bool al = h && y && w && k_fr_aligned(h) && k_fr_aligned(y) &&
              k_fr_aligned(w) && (next_mode < 0 || (out && k_fr_aligned(out))) &&
              (!nw || (next_w && k_fr_aligned(next_w)));
    if (width != 8L * T || !al) return -1;
    int wd = (int)width;
    bool wide = T > NF_PLAIN_MAX;
#define NF_LEAN(NM)                                                                                \
    k_launch(wide ? k_add_norm_lean<NM, 1024> : k_add_norm_lean<NM, NF_PLAIN_MAX>,                 \
             (unsigned)ctx->rows, T, 0, ctx->st, h, y, wd, w, eps, next_w, next_eps, out)
    switch (next_mode) {
    case -1: return NF_LEAN(-1);
    case MUSE_K_NORM_NONE: return NF_LEAN(MUSE_K_NORM_NONE);
    case MUSE_K_NORM_PLUS1: return NF_LEAN(MUSE_K_NORM_PLUS1);
    case MUSE_K_NORM_PLAIN: return NF_LEAN(MUSE_K_NORM_PLAIN);
    }
#undef NF_LEAN
    return -1;
}

MUSE_K_API int muse_k_norm_fast(const muse_k_ctx *ctx, const float *x, long width, const float *w,
                                int mode, double eps, int round16, float *out)
{
    return muse_k_norm_fast_rows(ctx, x, width, w, 0, NULL, mode, eps, round16, out);
}

MUSE_K_API int muse_k_norm_fast_rows(const muse_k_ctx *ctx, const float *x, long width,
                                     const float *w, long w_stride, const int32_t *w_row, int mode,
                                     double eps, int round16, float *out)
{
    if (ctx->rows <= 0 || width <= 0) return 0;
    return k_launch(k_norm_fast, (unsigned)ctx->rows, k_fr_threads(width), 0, ctx->st, x, width, w,
                    w_stride, w_row, mode, eps, round16, out);
}

MUSE_K_API int muse_k_add_norm_fast(const muse_k_ctx *ctx, float *h, const float *y, long width,
                                    const float *w, double eps)
{
    if (ctx->rows <= 0 || width <= 0) return 0;
    int rc = nf_lean_launch(ctx, h, y, width, w, eps, NULL, -1, 0.0, NULL);
    if (rc >= 0) return rc;
    unsigned T = k_fr_threads(width);
    return k_launch(T > NF_PLAIN_MAX ? k_add_norm_fast_wide : k_add_norm_fast, (unsigned)ctx->rows,
                    T, 0, ctx->st, h, y, width, w, eps, (const float *)NULL,
                    (int)MUSE_K_NORM_NONE, 0.0, (float *)NULL);
}

MUSE_K_API int muse_k_add_norm_norm_fast(const muse_k_ctx *ctx, float *h, const float *y,
                                         long width, const float *w, double eps,
                                         const float *next_w, int next_mode, double next_eps,
                                         float *out)
{
    if (ctx->rows <= 0 || width <= 0) return 0;
    /* -1 is the lean form's "no next norm" (muse_k_add_norm_fast): the modes alone here */
    int rc = next_mode >= MUSE_K_NORM_NONE && next_mode <= MUSE_K_NORM_PLAIN
                 ? nf_lean_launch(ctx, h, y, width, w, eps, next_w, next_mode, next_eps, out)
                 : -1;
    if (rc >= 0) return rc;
    unsigned T = k_fr_threads(width);
    return k_launch(T > NF_PLAIN_MAX ? k_add_norm_fast_wide : k_add_norm_fast, (unsigned)ctx->rows,
                    T, 0, ctx->st, h, y, width, w, eps, next_w, next_mode, next_eps, out);
}
