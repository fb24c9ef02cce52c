/* What the C side and the kernels share: dtype codes, the device descriptor of a linear, and
 * the stream type. Plain C, included by engine/backend/cuda/ and by every kernel. */
#ifndef MUSE_K_LAUNCH_H
#define MUSE_K_LAUNCH_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
#define MUSE_K_API extern "C"
#else
#define MUSE_K_API
#endif

enum { MUSE_K_F16 = 0, MUSE_K_BF16 = 1, MUSE_K_F32 = 2 };
enum { MUSE_K_DENSE = 0, MUSE_K_EXL3 = 1 };
enum { MUSE_K_NORM_NONE = 0, MUSE_K_NORM_PLUS1 = 1, MUSE_K_NORM_PLAIN = 2 };

/* One linear on the device: y = x W. Dense: weight row r (an output column) is element
 * (row0 + r) * ld + col0 of w, k long. EXL3: the trellis of k/16 x n/16 tiles (tiles_ld a
 * trellis row), the input and output scales (suh/svh fp16, or the legacy sign words su/sv),
 * an optional fp16 bias and the codebook's 65536 values. All pointers are device pointers. */
typedef struct {
    int kind, dtype, bits;
    int path; /* EXL3: MUSE_K_EXL3_AUTO, _SMALL or _TILES (linear.cuh), read from the host copy */
    int64_t k, n;
    const void *w;
    int64_t row0, col0, ld;
    const uint16_t *trellis;
    int64_t tiles_ld;
    const uint16_t *suh, *svh, *su, *sv, *bias;
    const float *table;
    int codebook; /* EXL3: muse_codebook (3INST 0, MCG 1, MUL1 2), for the fast path's decode */
} muse_k_lin;

#endif
