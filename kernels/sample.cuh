/* sample: draws each wanted row's token from its logits on the GPU with the host sampler's
 * rules (engine/text/sampler.h), giving the same token as muse_sample. */
#ifndef MUSE_K_SAMPLE_CUH
#define MUSE_K_SAMPLE_CUH
#include "launch.h"
typedef struct {
    float temperature;
    int top_k;
    float top_p, min_p;
    uint64_t seed;
} muse_k_sampling;
/* logits [n, V]; params, draw_pos [n] (device); weights [n, V] scratch; tokens [n] out.
 * weight_bits: S = 62 - ceil(log2(V)). */
MUSE_K_API int muse_k_sample(const float *logits, long n, long V, const muse_k_sampling *params,
                             const int64_t *draw_pos, int weight_bits, float *weights,
                             int32_t *tokens, cudaStream_t st);
#endif
