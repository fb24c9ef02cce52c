/* sample: draws each wanted row's token from its logits on the GPU with the host sampler's
 * rules (engine/text/sampler.h), giving the same token as muse_sample. */
#ifndef MUSE_K_SAMPLE_CUH
#define MUSE_K_SAMPLE_CUH
#include "launch.h"
/* logits [n, V]; weights [n, V] scratch; tokens [n] out. weight_bits: S = 62 - ceil(log2(V)).
 * ctx: st, rows (n), sampling (the params), draw_pos [n] and masks (muse_k_ctx: launch.h): a
 * masked row draws as muse_sample_masked */
MUSE_K_API int muse_k_sample(const muse_k_ctx *ctx, const float *logits, long V, int weight_bits,
                             float *weights, int32_t *tokens);
#endif
