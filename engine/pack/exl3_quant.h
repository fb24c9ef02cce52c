/* The project's EXL3 quantizer (design/EXL3.md, "Making EXL3 tensors", steps 1-6): random signs
 * and scales, Hadamard rotations, a global scale search, and a tail-biting Viterbi per tile. */
#ifndef MUSE_EXL3_QUANT_H
#define MUSE_EXL3_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "pack/exl3.h"
#include "base/muse_common.h"
#include "base/threadpool.h"

typedef void (*muse_progress_fn)(void *ctx, long done, long total);

/* W: k x n fp32 (y = x W layout), k and n multiples of 128, bits 1..8. Writes trellis
 * (k/16 * n/16 * 16*bits uint16), suh (k fp16), svh (n fp16). The same inputs and seed give the
 * same output for any thread count. progress (may be NULL) is called from the caller's thread
 * with tiles done / total. */
int muse_exl3_quantize(const float *W, int64_t k, int64_t n, int bits, muse_codebook cb,
                       uint64_t seed, uint16_t *trellis, uint16_t *suh, uint16_t *svh,
                       muse_pool *pool, muse_progress_fn progress, void *progress_ctx, muse_err *e);

/* One tile: the tail-biting Viterbi path for 256 targets in position order p. Writes the packed
 * tile (16*bits uint16) and returns its squared error sum(value(state_p) - target_p)^2.
 * scratch: muse_exl3_tile_scratch_bytes(bits) bytes. */
size_t muse_exl3_tile_scratch_bytes(int bits);
double muse_exl3_quantize_tile(const float target[256], int bits, muse_codebook cb, uint16_t *tile,
                               void *scratch);

#endif
