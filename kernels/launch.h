/* What the C side and the kernels share: dtype codes, the device descriptor of a linear, the
 * sampler's record and the launch context every launcher takes. Plain C, included by
 * engine/backend/cuda/ and by every kernel. */
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

/* One wanted row's sampling parameters as the sampler kernel reads them (muse_sampling's). */
typedef struct {
    float temperature;
    int top_k;
    float top_p, min_p;
    uint64_t seed;
    int32_t masked; /* 1: the row's token bitmap (muse_k_ctx.masks) applies; 0: a free row */
} muse_k_sampling;

/* What a launcher shares with the others of its rank's round: the stream, the rows the launch
 * covers and the round's staged per-row arrays (device pointers). rows is the round's bucket R
 * unless the caller set the launch's own count: the MoE's R * K (row, slot) pairs, the N
 * wanted rows of the head and the sampler. A launcher reads only what its comment names. */
typedef struct {
    cudaStream_t st;
    long rows;
    const int32_t *tokens;           /* [R] token ids */
    const int32_t *seqs;             /* [R] KV slot of each row; -1: a padding row */
    const int64_t *positions;        /* [R] absolute positions */
    const int32_t *want;             /* [N] the wanted rows, in row order */
    const muse_k_sampling *sampling; /* [N] */
    const int64_t *draw_pos;         /* [N] absolute position of each token drawn */
    /* [N][(V + 7) / 8] token bitmaps (bit t of byte t/8: token t allowed), row i read only where
     * sampling[i].masked; NULL where no row of the launch is masked (the sampler) */
    const uint8_t *masks;
} muse_k_ctx;

#endif
