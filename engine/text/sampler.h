/* Sampling one token from fp32 logits: greedy, temperature, top_k, top_p, min_p.
 * Draws come from a counter-based generator keyed by (seed, absolute position), so a
 * stream's tokens never depend on what else runs. Ties order by lower token id.
 *
 * Order of work (docs/sampling.md has the reasoning):
 *  1. temperature <= 0 or NaN: greedy, the highest logit, lowest id on ties.
 *  2. Non-finite logits: NaN counts as below -inf (never drawn); any +inf wins outright (lowest
 *     id among them); when nothing is finite the answer is the lowest id holding -inf (0 when
 *     every logit is NaN). No draw happens in these cases.
 *  3. Weights q_i = round(2^S * exp((x_i - x_max) * (1/temperature))), S = 62 -
 *     ceil(log2(vocab_size)) (44 for 202048), computed in float (relative error ~3e-7, the
 *     resolution of float logits) on a fixed IEEE operation sequence and kept as exact
 *     integers, so every sum is exact. Candidates are ordered by q descending, ties lower id;
 *     tokens with q_i == 0 (weight below about 2^-(S+1) of the top) are never drawn.
 *  4. top_k (> 0): keep the k first candidates (k >= vocab keeps all; <= 0 is off).
 *  5. top_p (< 1): keep the shortest prefix whose weight is >= ceil(top_p * weight kept by
 *     top_k), i.e. probabilities renormalized after top_k; always at least one. >= 1 or NaN is
 *     off.
 *  6. min_p (> 0): drop candidates with q_i < min_p * q_max (q_max = 2^S, the top token, which
 *     always stays; equal is kept). <= 0 or NaN is off.
 *  7. Draw: u = muse_rand_uniform(seed, position, 0) = k / 2^53; target = floor(k * W / 2^53)
 *     over the kept weight W; walking the kept candidates in order, the first whose running
 *     sum exceeds target is the token. Exact integer arithmetic, so the same inputs give the
 *     same token on any thread or machine. */
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

/* Scratch sized once for a vocabulary (no allocation per token); one thread uses it at a time.
 * NULL when vocab_size is not in [1, 2^31]. */
typedef struct muse_sampler muse_sampler;
muse_sampler *muse_sampler_create(int64_t vocab_size);
void muse_sampler_destroy(muse_sampler *s);

/* Returns the chosen token id in [0, vocab_size). logits are not modified. */
int64_t muse_sample(muse_sampler *s, const float *logits, const muse_sampling *p, int64_t position);

/* muse_sample with the tokens whose bit in mask (vocab/8 bytes, bit t of byte t/8) is clear
 * set to -inf first, so the filters and the draw see only allowed tokens; mask NULL is
 * muse_sample. When no allowed logit is finite the lowest allowed id. */
int64_t muse_sample_masked(muse_sampler *s, const float *logits, const uint8_t *mask,
                           const muse_sampling *p, int64_t position);

/* The kept candidates after the filters, in draw order (probability descending, ties lower
 * id), with the renormalized probabilities the draw uses. Writes the first min(kept, max_out)
 * into ids/probs (either may be NULL when max_out is 0) and returns how many are kept. Greedy
 * and the non-finite cases return the one forced token with probability 1. Slower than
 * muse_sample (sorts the kept set): for logprobs, tests and debugging. */
int64_t muse_sample_candidates(muse_sampler *s, const float *logits, const muse_sampling *p,
                               int64_t *ids, double *probs, int64_t max_out);

/* Uniform double in [0, 1) from (seed, position, stream): a counter-based hash (no state).
 * A SplitMix64 finalizer chained over seed, position and stream; the top 53 bits / 2^53.
 * For fixed seed and stream, distinct positions give distinct 64-bit hashes (a bijection). */
double muse_rand_uniform(uint64_t seed, uint64_t position, uint64_t stream);

/* The 64-bit hash behind muse_rand_uniform (uniform = (hash >> 11) * 2^-53). */
uint64_t muse_rand_bits(uint64_t seed, uint64_t position, uint64_t stream);

#endif
