/* sample on the fast path: the host sampler's token (engine/text/sampler.c) at vocabularies up
 * to 2^31 in four launches a round: chunk maxima, bin histograms, keys laid out by bin, then a
 * block a row for the cut-offs and the draw (base/sampler_select.h). */
#ifndef MUSE_K_SAMPLE_FAST_CUH
#define MUSE_K_SAMPLE_FAST_CUH
#include <stddef.h>

#include "launch.h"
/* The workspace muse_k_sample_fast needs for rows rows of vocabulary V. */
MUSE_K_API size_t muse_k_sample_fast_bytes(long rows, long V);
/* logits [n, V]; ws: muse_k_sample_fast_bytes(n, V) bytes, 8-byte aligned; tokens [n] out.
 * weight_bits: S = 62 - ceil(log2(V)). ctx: st, rows (n), sampling and draw_pos [n], masks (a
 * masked row draws as muse_sample_masked) */
MUSE_K_API int muse_k_sample_fast(const muse_k_ctx *ctx, const float *logits, long V,
                                  int weight_bits, void *ws, int32_t *tokens);
#endif
