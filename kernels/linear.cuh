/* linear: y[R, n] = x[R, k] W for a dense (fp16/bf16/fp32) or an EXL3 weight. */
#ifndef MUSE_K_LINEAR_CUH
#define MUSE_K_LINEAR_CUH
#include "launch.h"
/* The EXL3 product's two paths, bitwise equal: small-M (one thread an output element, each
 * weight decoded per row) and tiles (a block decodes a tile band once for a chunk of rows).
 * AUTO picks tiles from MUSE_K_EXL3_TILES_MIN_ROWS rows on where every row has the same
 * descriptor (row_desc NULL); the others force one (checks, the MoE's grouping included). */
enum { MUSE_K_EXL3_AUTO = 0, MUSE_K_EXL3_SMALL = 1, MUSE_K_EXL3_TILES = 2 };
#define MUSE_K_EXL3_TILES_MIN_ROWS 32
/* MUSE_EXL3_PATH (small | tiles | auto, unset: auto) as one of those; anything else is auto
 * with a warning on stderr. The backend stores it in each descriptor's path at start. */
MUSE_K_API int muse_k_exl3_path_env(void);
/* descs: device descriptors; row r uses descs[row_desc ? row_desc[r] : 0] (the MoE's experts)
 * and input row x + (row_src ? row_src[r] : r) * x_stride. shape: a host copy of any of them
 * (kind, k, n, path: the same for every descriptor used). y row r at y + r * y_stride,
 * fp16-rounded when round16. EXL3 needs ws_a [rows, k] floats and ws_t [rows, n] doubles.
 * ctx: st, rows. */
MUSE_K_API int muse_k_linear(const muse_k_ctx *ctx, const muse_k_lin *descs,
                             const muse_k_lin *shape, const int32_t *row_desc,
                             const int32_t *row_src, const float *x, long x_stride, int round16,
                             float *y, long y_stride, float *ws_a, double *ws_t);
#endif
