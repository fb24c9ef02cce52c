/* linear: the dense product and the EXL3 trellis product, each output element's sum in the
 * CPU reference's exact order (double sums of exact float products).
 * Dense: dot_f64 over the weight row (cpu_backend.c dense_cols). EXL3 (engine/pack/exl3.c,
 * design/EXL3.md): 1) a = fp16(fp32(blockHad(x * suh))) per 128-chunk, 2) t = a Wq with each
 * weight decoded from its tile's tail-biting bit stream and the codebook table, sums in
 * ascending k, 3) y = fp32(blockHad(t) * svh + bias). Shapes: x [R, k], y [R, n]. Step 2 has
 * two paths with the same per-element order, so the same bits: small-M (a block a row, for
 * decode) and tiles (a block decodes each tile band once for up to 16 rows, for prompts). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "linear.cuh"
#include "pack/exl3_tile.h"

#define HAD 128
#define MUSE_K_MAX_BITS 8

__device__ __forceinline__ const muse_k_lin *k_desc(const muse_k_lin *descs,
                                                      const int32_t *row_desc, long r)
{
    return descs + (row_desc ? row_desc[r] : 0);
}

/* Dense: a block of 128 threads is 32 output columns x the 4 lanes of dot_f64; each 128-wide
 * chunk of the input row and of the 32 weight rows is staged in shared memory (coalesced
 * reads, converted to fp32 once), then lane l adds its elements i = l (mod 4) in ascending i,
 * exactly the CPU's lane sums; lane 0 combines them with the tail as dot_f64 does. */
#define DN_COLS  32
#define DN_CHUNK 128

__global__ void __launch_bounds__(128)
    k_dense(const muse_k_lin *descs, const int32_t *row_desc, const int32_t *row_src,
            const float *x, long x_stride, int round16, float *y, long y_stride)
{
    __shared__ float xs[DN_CHUNK];
    __shared__ float ws[DN_COLS][DN_CHUNK + 1];
    __shared__ double lanes[128];
    long r = blockIdx.y;
    const muse_k_lin *d = k_desc(descs, row_desc, r);
    int t = threadIdx.x, cl = t / 4, lane = t % 4;
    long col0 = (long)blockIdx.x * DN_COLS, k = (long)d->k, n = (long)d->n;
    long whole = k - k % 4;
    const float *xr = x + (row_src ? (long)row_src[r] : r) * x_stride;
    int64_t ld = d->ld ? d->ld : d->k;
    double acc = 0;
    for (long c0 = 0; c0 < whole; c0 += DN_CHUNK) {
        if (c0 + t < k) xs[t] = xr[c0 + t];
#pragma unroll 8
        for (int e = t; e < DN_COLS * DN_CHUNK; e += 128) {
            int c = e / DN_CHUNK, i = e % DN_CHUNK;
            long col = col0 + c;
            if (col < n && c0 + i < k)
                ws[c][i] = k_load(d->w, d->dtype, (d->row0 + col) * ld + d->col0 + c0 + i);
        }
        __syncthreads();
        long end = whole - c0 < DN_CHUNK ? whole - c0 : DN_CHUNK;
#pragma unroll 8
        for (long j = lane; j < end; j += 4) acc += (double)xs[j] * (double)ws[cl][j];
        __syncthreads();
    }
    lanes[t] = acc;
    __syncthreads();
    long col = col0 + cl;
    if (lane != 0 || col >= n) return;
    double tail = 0;
    for (long i = whole; i < k; i++)
        tail += (double)xr[i] * (double)k_load(d->w, d->dtype, (d->row0 + col) * ld + d->col0 + i);
    double sum = ((lanes[t] + lanes[t + 1]) + (lanes[t + 2] + lanes[t + 3])) + tail;
    float v = (float)sum;
    y[r * y_stride + col] = round16 ? muse_round_f16(v) : v;
}

/* The 128-point Sylvester Hadamard in double on v (shared), 64 threads: the butterflies of
 * one stage are independent, so the result is the CPU's sequential one bit for bit. */
__device__ __forceinline__ void k_hadamard128(double *v)
{
    int t = threadIdx.x;
    for (int h = 1; h < HAD; h <<= 1) {
        int j = (t / h) * 2 * h + t % h;
        double a = v[j], b = v[j + h];
        __syncthreads();
        v[j] = a + b;
        v[j + h] = a - b;
        __syncthreads();
    }
    v[t] *= 0.08838834764831844055;
    v[t + 64] *= 0.08838834764831844055;
    __syncthreads();
}

/* step 1: grid (k / 128, R), 64 threads */
__global__ void k_exl3_prepare(const muse_k_lin *descs, const int32_t *row_desc,
                               const int32_t *row_src, const float *x, long x_stride, float *a)
{
    __shared__ double v[HAD];
    long r = blockIdx.y;
    const muse_k_lin *d = k_desc(descs, row_desc, r);
    int64_t i0 = (int64_t)blockIdx.x * HAD;
    const float *xr = x + (row_src ? (long)row_src[r] : r) * x_stride;
    for (int i = threadIdx.x; i < HAD; i += 64)
        v[i] = (double)__fmul_rn(xr[i0 + i], k_in_scale(d, i0 + i));
    __syncthreads();
    k_hadamard128(v);
    float *ar = a + r * d->k;
    for (int i = threadIdx.x; i < HAD; i += 64) ar[i0 + i] = muse_round_f16((float)v[i]);
}

/* The state of tile element (row i, column c): the header's tail-biting window for its
 * position (pack/exl3_tile.h, the CPU's own code). */
__device__ __forceinline__ uint32_t k_tile_state(const uint16_t *tile, int bits, int i, int c)
{
    return muse_exl3_state(tile, bits, muse_exl3_pos(i, c));
}

/* Column c (of 16) of a staged tile: its 16 weights, row i of the tile in w[i]. Both step-2
 * paths decode through this, so their weights are the same floats. */
__device__ __forceinline__ void k_tile_column(const uint16_t *tile, int bits, int c,
                                              const float *table, float w[16])
{
#pragma unroll
    for (int i = 0; i < 16; i++) w[i] = table[k_tile_state(tile, bits, i, c)];
}

/* step 2, small-M path: grid (n / 128, R), 128 threads, one column each: t[r, col] = the sum
 * over k ascending of a * w. For each 16-row tile band the 8 tiles of the block's columns are
 * staged in shared memory; each thread decodes its column's 16 weights (independent of the
 * running sum, so their table reads overlap) and adds them in order. */
__global__ void __launch_bounds__(128)
    k_exl3_product(const muse_k_lin *descs, const int32_t *row_desc, const float *a, double *t)
{
    __shared__ uint16_t tiles[8 * 16 * MUSE_K_MAX_BITS];
    __shared__ float as[16];
    long r = blockIdx.y;
    const muse_k_lin *d = k_desc(descs, row_desc, r);
    int th = threadIdx.x;
    long col = (long)blockIdx.x * 128 + th;
    int64_t k = d->k, tn0 = (int64_t)blockIdx.x * 8, tile_len = 16 * d->bits;
    int c = th % 16, bits = d->bits;
    const uint16_t *mine = tiles + (th / 16) * tile_len;
    const float *ar = a + r * k;
    double acc = 0;
    for (int64_t tk = 0; tk < k / 16; tk++) {
        const uint16_t *band = d->trellis + (tk * d->tiles_ld + tn0) * tile_len;
        for (int e = th; e < 8 * tile_len; e += 128) tiles[e] = band[e];
        if (th < 16) as[th] = ar[tk * 16 + th];
        __syncthreads();
        float w[16];
        k_tile_column(mine, bits, c, d->table, w);
#pragma unroll
        for (int i = 0; i < 16; i++) acc += (double)as[i] * (double)w[i];
        __syncthreads();
    }
    if (col < d->n) t[r * d->n + col] = acc;
}

/* step 2, tiles path: grid (n / 128, ceil(R / 16)), 128 threads, one column each for a chunk
 * of up to TL_ROWS rows. The rows of the chunk that share a descriptor (all of them, except in
 * the MoE where each row names its expert) form a group; for each band of the group's weight
 * the thread decodes its column's 16 weights once into registers and adds them to every row of
 * the group, each row's sum in the small-M path's order (ascending k, one double accumulator,
 * exact products), so every element has the small-M path's bits. */
#define TL_ROWS 16

__global__ void __launch_bounds__(128)
    k_exl3_product_tiles(const muse_k_lin *descs, const int32_t *row_desc, const float *a,
                         long R, double *t)
{
    __shared__ uint16_t tiles[8 * 16 * MUSE_K_MAX_BITS];
    __shared__ float as[TL_ROWS][16];
    __shared__ int32_t row_d[TL_ROWS];
    long r0 = (long)blockIdx.y * TL_ROWS;
    int nr = R - r0 < TL_ROWS ? (int)(R - r0) : TL_ROWS;
    int th = threadIdx.x;
    if (th < nr) row_d[th] = row_desc ? row_desc[r0 + th] : 0;
    __syncthreads();
    long col = (long)blockIdx.x * 128 + th;
    int c = th % 16;
    double acc[TL_ROWS];
#pragma unroll
    for (int j = 0; j < TL_ROWS; j++) acc[j] = 0;
    unsigned left = (1u << nr) - 1; /* rows of the chunk not yet done; the same in every thread */
    while (left) {
        int lead = __ffs((int)left) - 1;
        unsigned group = 0;
        for (int j = lead; j < nr; j++)
            if (((left >> j) & 1u) && row_d[j] == row_d[lead]) group |= 1u << j;
        left &= ~group;
        const muse_k_lin *d = descs + row_d[lead];
        int64_t k = d->k, tn0 = (int64_t)blockIdx.x * 8, tile_len = 16 * d->bits;
        int bits = d->bits;
        const uint16_t *mine = tiles + (th / 16) * tile_len;
        for (int64_t tk = 0; tk < k / 16; tk++) {
            const uint16_t *band = d->trellis + (tk * d->tiles_ld + tn0) * tile_len;
            for (int e = th; e < 8 * tile_len; e += 128) tiles[e] = band[e];
            for (int e = th; e < TL_ROWS * 16; e += 128) {
                int j = e / 16, i = e % 16;
                if ((group >> j) & 1u) as[j][i] = a[(r0 + j) * k + tk * 16 + i];
            }
            __syncthreads();
            float w[16];
            k_tile_column(mine, bits, c, d->table, w);
#pragma unroll
            for (int j = 0; j < TL_ROWS; j++)
                if ((group >> j) & 1u) {
#pragma unroll
                    for (int i = 0; i < 16; i++) acc[j] += (double)as[j][i] * (double)w[i];
                }
            __syncthreads();
        }
        if (col < d->n) {
#pragma unroll
            for (int j = 0; j < TL_ROWS; j++)
                if ((group >> j) & 1u) t[(r0 + j) * d->n + col] = acc[j];
        }
    }
}

/* step 3: grid (n / 128, R), 64 threads */
__global__ void k_exl3_finish(const muse_k_lin *descs, const int32_t *row_desc, double *t,
                              int round16, float *y, long y_stride)
{
    __shared__ double v[HAD];
    long r = blockIdx.y;
    const muse_k_lin *d = k_desc(descs, row_desc, r);
    int64_t j0 = (int64_t)blockIdx.x * HAD;
    double *tr = t + r * d->n;
    for (int i = threadIdx.x; i < HAD; i += 64) v[i] = tr[j0 + i];
    __syncthreads();
    k_hadamard128(v);
    for (int i = threadIdx.x; i < HAD; i += 64) {
        int64_t j = j0 + i;
        double s = v[i] * (double)k_out_scale(d, j);
        if (d->bias) s += (double)muse_f16_to_f32(d->bias[j]);
        float f = (float)s;
        y[r * y_stride + j] = round16 ? muse_round_f16(f) : f;
    }
}

MUSE_K_API int muse_k_exl3_path_env(void)
{
    const char *v = getenv("MUSE_EXL3_PATH");
    if (!v || !*v || !strcmp(v, "auto")) return MUSE_K_EXL3_AUTO;
    if (!strcmp(v, "small")) return MUSE_K_EXL3_SMALL;
    if (!strcmp(v, "tiles")) return MUSE_K_EXL3_TILES;
    static const bool warned = /* once a process, not once a linear (C++ static: thread-safe) */
        fprintf(stderr, "muse: MUSE_EXL3_PATH=%s is not small, tiles or auto; using auto\n",
                v) >= 0;
    (void)warned;
    return MUSE_K_EXL3_AUTO;
}

MUSE_K_API int muse_k_linear(const muse_k_ctx *ctx, const muse_k_lin *descs,
                             const muse_k_lin *shape, const int32_t *row_desc,
                             const int32_t *row_src, const float *x, long x_stride, int round16,
                             float *y, long y_stride, float *ws_a, double *ws_t)
{
    long rows = ctx->rows;
    cudaStream_t st = ctx->st;
    if (rows <= 0) return 0;
    unsigned n = (unsigned)shape->n, k = (unsigned)shape->k, R = (unsigned)rows;
    if (shape->kind == MUSE_K_DENSE) {
        k_dense<<<dim3((n + DN_COLS - 1) / DN_COLS, R), 128, 0, st>>>(descs, row_desc, row_src, x, x_stride,
                                                         round16, y, y_stride);
        return (int)cudaGetLastError();
    }
    /* the path by the call's shape alone (a fixed threshold): both give the same bits, so a
     * row's result does not depend on which one its batch took. Per-row descriptors (the MoE's
     * (row, slot) pairs, consecutive pairs on different experts) would leave the tiles path
     * groups of one row, so auto keeps them on the small-M path until pairs come grouped. */
    int tiles = shape->path == MUSE_K_EXL3_TILES ||
                (shape->path == MUSE_K_EXL3_AUTO && !row_desc &&
                 rows >= MUSE_K_EXL3_TILES_MIN_ROWS);
    k_exl3_prepare<<<dim3(k / HAD, R), 64, 0, st>>>(descs, row_desc, row_src, x, x_stride, ws_a);
    if (tiles)
        k_exl3_product_tiles<<<dim3(n / 128, (R + TL_ROWS - 1) / TL_ROWS), 128, 0, st>>>(
            descs, row_desc, ws_a, rows, ws_t);
    else
        k_exl3_product<<<dim3(n / 128, R), 128, 0, st>>>(descs, row_desc, ws_a, ws_t);
    k_exl3_finish<<<dim3(n / HAD, R), 64, 0, st>>>(descs, row_desc, ws_t, round16, y, y_stride);
    return (int)cudaGetLastError();
}
