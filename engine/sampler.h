/* Sampling one token from fp32 logits: greedy, temperature, top_k, top_p, min_p.
 * Draws come from a counter-based generator keyed by (seed, absolute position), so a
 * stream's tokens never depend on what else runs. Ties order by lower token id. */
#ifndef MUSE_SAMPLER_H
#define MUSE_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature; /* 0: greedy (argmax, lowest id on ties) */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off; (0, 1] */
    float min_p;       /* 0: off; [0, 1] */
    uint64_t seed;
} muse_sampling;

/* Scratch sized once for a vocabulary (no allocation per token). */
typedef struct muse_sampler muse_sampler;
muse_sampler *muse_sampler_create(int64_t vocab_size);
void muse_sampler_destroy(muse_sampler *s);

/* Returns the chosen token id in [0, vocab_size). logits are not modified. */
int64_t muse_sample(muse_sampler *s, const float *logits, const muse_sampling *p, int64_t position);

/* Uniform double in [0, 1) from (seed, position, stream): a counter-based hash (no state). */
double muse_rand_uniform(uint64_t seed, uint64_t position, uint64_t stream);

#endif
