/* Sampler: greedy and ties, non-finite logits, chi-square against a libm softmax, each filter's
 * exact kept set and boundaries, fast draw == naive walk, determinism, and a speed diag. */
#include "text/sampler.h"
#include "tap.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define CHI2_999_DF9 27.877 /* 99.9% point of chi-square with 9 degrees of freedom */
#define BIG_VOCAB    202048

static muse_sampling params(float temperature, int top_k, float top_p, float min_p, uint64_t seed)
{
    muse_sampling p = {temperature, top_k, top_p, min_p, seed};
    return p;
}

/* Deterministic test data: xorshift64* uniform and a Box-Muller normal. */
static uint64_t rng_state = 0x243f6a8885a308d3ull;
static double test_uniform(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-53;
}
static double test_normal(void)
{
    double u = test_uniform(), v = test_uniform();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* Reference softmax(x / t) in double with libm exp, independent of the sampler's exp. */
static void reference_softmax(const float *x, int n, double t, double *out)
{
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    for (int i = 0; i < n; i++) sum += out[i] = exp(((double)x[i] - max) / t);
    for (int i = 0; i < n; i++) out[i] /= sum;
}

static double chi_square(const long *counts, const double *expected_p, int n, long draws)
{
    double chi = 0;
    for (int i = 0; i < n; i++) {
        double e = expected_p[i] * (double)draws;
        chi += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
    }
    return chi;
}

/* Which ids appear over draws at positions [0, draws). */
static void count_draws(muse_sampler *s, const float *x, const muse_sampling *p, long draws,
                        long *counts, int n)
{
    memset(counts, 0, sizeof *counts * (size_t)n);
    for (long pos = 0; pos < draws; pos++) counts[muse_sample(s, x, p, pos)]++;
}

/* The kept set as a bitmask over ids < 64 (candidates API), and the same seen over draws. */
static uint64_t kept_mask(muse_sampler *s, const float *x, const muse_sampling *p)
{
    int64_t ids[64];
    double probs[64];
    int64_t kept = muse_sample_candidates(s, x, p, ids, probs, 64);
    uint64_t mask = 0;
    for (int64_t i = 0; i < kept && i < 64; i++) mask |= 1ull << ids[i];
    return kept > 64 ? ~0ull : mask;
}
static uint64_t drawn_mask(muse_sampler *s, const float *x, const muse_sampling *p, long draws)
{
    uint64_t mask = 0;
    for (long pos = 0; pos < draws; pos++) mask |= 1ull << muse_sample(s, x, p, pos);
    return mask;
}

static void test_bounds_and_generator(void)
{
    ok(muse_sampler_create(0) == NULL, "vocab 0 refused");
    ok(muse_sampler_create(-5) == NULL, "negative vocab refused");
    muse_sampler *one = muse_sampler_create(1);
    float x1[1] = {3.5f};
    muse_sampling p = params(1.0f, 0, 1.0f, 0.0f, 9);
    int only_zero = 1;
    for (int pos = 0; pos < 100; pos++) only_zero &= muse_sample(one, x1, &p, pos) == 0;
    ok(only_zero, "vocab 1 always gives token 0");
    muse_sampler_destroy(one);
    muse_sampler_destroy(NULL);

    double sum = 0, lo = 1, hi = 0;
    int in_range = 1, matches_bits = 1;
    for (uint64_t pos = 0; pos < 100000; pos++) {
        double u = muse_rand_uniform(42, pos, 0);
        in_range &= u >= 0 && u < 1;
        matches_bits &= u == (double)(muse_rand_bits(42, pos, 0) >> 11) * 0x1p-53;
        sum += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    ok(in_range, "uniform in [0, 1)");
    ok(matches_bits, "uniform is the top 53 bits of the hash");
    ok(fabs(sum / 100000 - 0.5) < 0.005, "mean of 100k uniforms %.5f near 0.5", sum / 100000);
    ok(lo < 1e-4 && hi > 1 - 1e-4, "uniforms reach both ends (%.2g, 1-%.2g)", lo, 1 - hi);
    ok(muse_rand_uniform(1, 2, 3) == muse_rand_uniform(1, 2, 3), "generator is a pure function");
    ok(muse_rand_bits(1, 2, 3) != muse_rand_bits(2, 2, 3) &&
           muse_rand_bits(1, 2, 3) != muse_rand_bits(1, 3, 3) &&
           muse_rand_bits(1, 2, 3) != muse_rand_bits(1, 2, 4),
       "seed, position and stream each change the hash");
}

static void test_greedy(void)
{
    muse_sampler *s = muse_sampler_create(16);
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = (float)(i % 5) - 2.0f;
    x[7] = 4.0f;
    muse_sampling p = params(0.0f, 0, 1.0f, 0.0f, 1);
    is_int(muse_sample(s, x, &p, 0), 7, "greedy picks the highest logit");
    x[3] = 4.0f;
    x[11] = 4.0f;
    is_int(muse_sample(s, x, &p, 0), 3, "greedy ties go to the lowest id");
    p.temperature = -1.0f;
    is_int(muse_sample(s, x, &p, 5), 3, "negative temperature is greedy");
    p.temperature = NAN;
    is_int(muse_sample(s, x, &p, 5), 3, "NaN temperature is greedy");
    p = params(0.0f, 5, 0.1f, 0.9f, 1);
    is_int(muse_sample(s, x, &p, 9), 3, "greedy ignores the filters");
    int64_t id = -1;
    double prob = 0;
    is_int(muse_sample_candidates(s, x, &p, &id, &prob, 1), 1, "greedy has one candidate");
    ok(id == 3 && prob == 1.0, "greedy candidate is id 3 with probability 1");
    muse_sampler_destroy(s);
}

static void test_non_finite(void)
{
    muse_sampler *s = muse_sampler_create(8);
    float x[8] = {NAN, 1.0f, 1.0f, 0.5f, NAN, 0.0f, -INFINITY, 1.0f};
    muse_sampling warm = params(1.0f, 0, 1.0f, 0.0f, 3), greedy = params(0.0f, 0, 1.0f, 0.0f, 3);
    is_int(muse_sample(s, x, &greedy, 0), 1, "greedy skips NaN (lowest id of the tied max)");
    ok((drawn_mask(s, x, &warm, 20000) & 0x51u) == 0, "NaN and -inf tokens are never drawn");
    is_int(drawn_mask(s, x, &warm, 20000), 0xAEu, "every finite token is drawn");
    x[5] = INFINITY;
    x[6] = INFINITY;
    is_int(muse_sample(s, x, &warm, 0), 5, "+inf wins (lowest id among +inf)");
    is_int(drawn_mask(s, x, &warm, 1000), 1u << 5, "+inf wins at every position");
    float minus[8];
    for (int i = 0; i < 8; i++) minus[i] = -INFINITY;
    is_int(muse_sample(s, minus, &warm, 7), 0, "all -inf: lowest id");
    is_int(muse_sample(s, minus, &greedy, 7), 0, "all -inf, greedy: lowest id");
    minus[0] = NAN;
    minus[1] = NAN;
    is_int(muse_sample(s, minus, &warm, 7), 2, "NaN and -inf only: lowest -inf id");
    for (int i = 0; i < 8; i++) minus[i] = NAN;
    is_int(muse_sample(s, minus, &warm, 7), 0, "all NaN: id 0, no crash");
    float huge[8] = {3e38f, -3e38f, 3e38f, 0, 0, 0, 0, 0};
    is_int(drawn_mask(s, huge, &warm, 2000), 0x5u, "extreme finite logits: only the two maxima");
    float spread[8] = {30, -30, 5, 0, 0, 1, 2, 3};
    muse_sampling hot = params(INFINITY, 0, 1.0f, 0.0f, 3);
    is_int(drawn_mask(s, spread, &hot, 2000), 0xFFu, "infinite temperature: uniform over all");
    muse_sampling cold = params(1e-30f, 0, 1.0f, 0.0f, 3);
    is_int(drawn_mask(s, spread, &cold, 200), 0x1u, "tiny temperature: only the max");
    muse_sampler_destroy(s);
}

/* The 10-token distribution of the chi-square tests. */
static const double ten_probs[10] = {0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.015, 0.005};

static void test_chi_square(void)
{
    muse_sampler *s = muse_sampler_create(10);
    float x[10];
    for (int i = 0; i < 10; i++) x[i] = (float)log(ten_probs[i]) + 1.25f;
    double want[10], wrong[10];
    long counts[10];
    const long draws = 100000;

    muse_sampling p = params(1.0f, 0, 1.0f, 0.0f, 20240607);
    count_draws(s, x, &p, draws, counts, 10);
    reference_softmax(x, 10, 1.0, want);
    double chi = chi_square(counts, want, 10, draws);
    ok(chi < CHI2_999_DF9, "T=1: chi-square %.2f < %.3f over 100k draws", chi, CHI2_999_DF9);
    memcpy(wrong, want, sizeof wrong);
    wrong[3] = want[4];
    wrong[4] = want[3];
    double chi_wrong = chi_square(counts, wrong, 10, draws);
    ok(chi_wrong > CHI2_999_DF9, "same counts reject a distribution with two ids swapped (%.1f)",
       chi_wrong);
    reference_softmax(x, 10, 1.05, wrong);
    chi_wrong = chi_square(counts, wrong, 10, draws);
    ok(chi_wrong > CHI2_999_DF9, "same counts reject softmax(x / 1.05) (%.1f)", chi_wrong);

    p = params(0.7f, 0, 1.0f, 0.0f, 77);
    count_draws(s, x, &p, draws, counts, 10);
    reference_softmax(x, 10, (double)0.7f, want);
    chi = chi_square(counts, want, 10, draws);
    ok(chi < CHI2_999_DF9, "T=0.7: chi-square %.2f < %.3f", chi, CHI2_999_DF9);
    reference_softmax(x, 10, 1.0, wrong);
    ok(chi_square(counts, wrong, 10, draws) > CHI2_999_DF9, "T=0.7 draws reject the T=1 law");

    /* top_k 4: the renormalized top four (3 degrees of freedom: 16.266 at 99.9%) */
    p = params(1.0f, 4, 1.0f, 0.0f, 5);
    count_draws(s, x, &p, draws, counts, 10);
    double top4 = ten_probs[0] + ten_probs[1] + ten_probs[2] + ten_probs[3];
    for (int i = 0; i < 4; i++) want[i] = ten_probs[i] / top4;
    chi = chi_square(counts, want, 4, draws);
    long outside = 0;
    for (int i = 4; i < 10; i++) outside += counts[i];
    ok(chi < 16.266 && outside == 0, "top_k 4: chi-square %.2f < 16.266, %ld draws outside", chi,
       outside);
    muse_sampler_destroy(s);
}

static void test_top_k(void)
{
    muse_sampler *s = muse_sampler_create(12);
    float x[12] = {0.1f, 2.0f, -1.0f, 1.5f, 0.7f, 2.5f, -3.0f, 1.0f, 0.3f, 1.9f, -0.5f, 0.0f};
    muse_sampling p = params(1.0f, 3, 1.0f, 0.0f, 11);
    uint64_t top3 = (1u << 5) | (1u << 1) | (1u << 9);
    is_int(kept_mask(s, x, &p), top3, "top_k 3 keeps ids 5, 1, 9");
    is_int(drawn_mask(s, x, &p, 20000), top3, "top_k 3 draws exactly ids 5, 1, 9");
    p.top_k = 500;
    is_int(kept_mask(s, x, &p), 0xFFF, "top_k above the vocabulary keeps all");
    is_int(drawn_mask(s, x, &p, 20000), 0xFFF, "top_k above the vocabulary draws all");
    p.top_k = -2;
    is_int(kept_mask(s, x, &p), 0xFFF, "negative top_k is off");
    p.top_k = 1;
    muse_sampling greedy = params(0.0f, 0, 1.0f, 0.0f, 11);
    int same = 1;
    for (int pos = 0; pos < 2000; pos++)
        same &= muse_sample(s, x, &p, pos) == muse_sample(s, x, &greedy, pos);
    ok(same, "top_k 1 == greedy");
    x[2] = 2.5f; /* tie with id 5 at the top */
    is_int(drawn_mask(s, x, &p, 2000), 1u << 2, "top_k 1 with a tied max keeps the lower id");
    p.top_k = 2;
    is_int(drawn_mask(s, x, &p, 20000), (1u << 2) | (1u << 5), "top_k 2 keeps both tied");
    x[9] = 2.0f; /* ids 1 and 9 tie for third place */
    p.top_k = 3;
    is_int(kept_mask(s, x, &p), (1u << 2) | (1u << 5) | (1u << 1), "top_k cut in a tie: lower id");
    muse_sampler_destroy(s);
}

static void test_top_p(void)
{
    muse_sampler *s = muse_sampler_create(16);
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = -INFINITY;
    x[3] = x[5] = x[8] = x[12] = 0.0f; /* four equal tokens: cumulative 1/4, 1/2, 3/4, 1 */
    muse_sampling p = params(1.0f, 0, 0.5f, 0.0f, 2);
    uint64_t a = 1u << 3, b = 1u << 5, c = 1u << 8, d = 1u << 12;
    is_int(kept_mask(s, x, &p), a | b, "top_p 0.5 on a boundary keeps exactly two (lower ids)");
    is_int(drawn_mask(s, x, &p, 5000), a | b, "top_p 0.5 draws exactly ids 3, 5");
    p.top_p = nextafterf(0.5f, 1.0f);
    is_int(kept_mask(s, x, &p), a | b | c, "top_p just above 0.5 keeps three");
    p.top_p = 0.75f;
    is_int(kept_mask(s, x, &p), a | b | c, "top_p 0.75 on a boundary keeps three");
    p.top_p = 0.25f;
    is_int(drawn_mask(s, x, &p, 2000), a, "top_p 0.25 keeps one");
    p.top_p = 1e-30f;
    is_int(drawn_mask(s, x, &p, 2000), a, "tiny top_p keeps at least one");
    p.top_p = 0.0f;
    is_int(drawn_mask(s, x, &p, 2000), a, "top_p 0 keeps one");
    p.top_p = NAN;
    is_int(kept_mask(s, x, &p), a | b | c | d, "NaN top_p is off");
    x[14] = -20.0f; /* a tiny fifth weight moves the half-way point past the second token */
    p.top_p = 0.5f;
    is_int(kept_mask(s, x, &p), a | b | c, "top_p counts the whole distribution's mass");

    /* top_k first, then top_p on the renormalized survivors */
    float y[16];
    for (int i = 0; i < 16; i++) y[i] = -30.0f;
    y[0] = (float)log(0.4);
    y[1] = (float)log(0.3);
    y[2] = (float)log(0.2);
    y[3] = (float)log(0.1);
    p = params(1.0f, 0, 0.5f, 0.0f, 2);
    is_int(kept_mask(s, y, &p), 0x3, "top_p 0.5 over 0.4/0.3/0.2/0.1 keeps two");
    p.top_k = 2;
    is_int(kept_mask(s, y, &p), 0x1, "top_k 2 then top_p 0.5 (0.57/0.43) keeps one");
    p = params(1.0f, 0, 0.85f, 0.0f, 2);
    is_int(drawn_mask(s, y, &p, 20000), 0x7, "top_p 0.85 draws exactly the first three");
    muse_sampler_destroy(s);
}

static void test_min_p(void)
{
    muse_sampler *s = muse_sampler_create(8);
    float x[8] = {-1.0f, 0.0f, -2.0f, 0.0f, -3.0f, -1.0f, -0.5f, -40.0f};
    muse_sampling p = params(1.0f, 0, 1.0f, 1.0f, 4);
    is_int(kept_mask(s, x, &p), 0xA, "min_p 1 keeps exactly the tied maxima (equal ratio kept)");
    is_int(drawn_mask(s, x, &p, 5000), 0xA, "min_p 1 draws only the tied maxima");
    /* ratio of logit -1 is e^-1 (float exp: within 1e-6); bracket it */
    p.min_p = (float)(exp(-1.0) * (1 - 1e-6));
    is_int(kept_mask(s, x, &p), 0x6B, "min_p just below e^-1 keeps the -1 logits");
    is_int(drawn_mask(s, x, &p, 20000), 0x6B, "and draws all of them");
    p.min_p = (float)(exp(-1.0) * (1 + 1e-6));
    is_int(kept_mask(s, x, &p), 0x4A, "min_p just above e^-1 drops them");
    is_int(drawn_mask(s, x, &p, 20000), 0x4A, "and never draws them");
    x[6] = -1e-6f; /* a weight just under the top, kept by min_p 1 - 2^-24 only if equal */
    p.min_p = nextafterf(1.0f, 0.0f);
    is_int(kept_mask(s, x, &p), 0xA, "min_p one float below 1 keeps the ties, not 1 - 1e-6");
    x[6] = -0.5f;
    p.min_p = 0.0f;
    is_int(kept_mask(s, x, &p), 0xFF, "min_p 0 is off");
    p.min_p = 5.0f;
    is_int(kept_mask(s, x, &p), 0xA, "min_p above 1 still keeps the top");
    /* order: top_p on the full set, then min_p on what is left */
    p = params(1.0f, 2, 1.0f, 0.5f, 4);
    is_int(kept_mask(s, x, &p), 0xA, "top_k 2 + min_p 0.5 keep the two maxima");
    muse_sampler_destroy(s);
}

/* The fast draw equals a plain walk over the sorted candidate list, for many shapes. */
static int walk_agrees(muse_sampler *s, const float *x, const muse_sampling *p, int positions,
                       int64_t n, int64_t *ids, double *probs)
{
    int64_t kept = muse_sample_candidates(s, x, p, ids, probs, n);
    int agree = 1;
    for (int pos = 0; pos < positions; pos++) {
        double u = muse_rand_uniform(p->seed, (uint64_t)pos, 0), cum = 0;
        int64_t walked = ids[kept - 1];
        for (int64_t i = 0; i < kept; i++) {
            cum += probs[i];
            if (cum > u) {
                walked = ids[i];
                break;
            }
        }
        int64_t got = muse_sample(s, x, p, pos);
        if (got != walked) {
            diag("position %d: sampled %lld, walk gives %lld", pos, (long long)got,
                 (long long)walked);
            agree = 0;
        }
    }
    return agree;
}

static void test_against_walk(void)
{
    int64_t n = BIG_VOCAB;
    muse_sampler *s = muse_sampler_create(n);
    float *x = malloc(sizeof *x * (size_t)n);
    int64_t *ids = malloc(sizeof *ids * (size_t)n);
    double *probs = malloc(sizeof *probs * (size_t)n);

    for (int64_t i = 0; i < n; i++) x[i] = (float)(3.0 * test_normal());
    muse_sampling p = params(1.0f, 0, 1.0f, 0.0f, 99);
    ok(walk_agrees(s, x, &p, 400, n, ids, probs), "normal logits, no filters: draw == walk");

    /* float weights on a 2^-44 grid: relative error ~3e-7 for weights well above the grid */
    double *ref = malloc(sizeof *ref * (size_t)n);
    reference_softmax(x, (int)n, 1.0, ref);
    int64_t kept = muse_sample_candidates(s, x, &p, ids, probs, n);
    double ref_max = 0, rel_err = 0, abs_err = 0, mass = 0;
    for (int64_t i = 0; i < n; i++) ref_max = fmax(ref_max, ref[i]);
    int sorted = 1;
    for (int64_t i = 0; i < kept; i++) {
        double r = ref[ids[i]];
        if (r > 1e-6 * ref_max) rel_err = fmax(rel_err, fabs(probs[i] - r) / r);
        abs_err = fmax(abs_err, fabs(probs[i] - r) / ref_max);
        mass += probs[i];
        if (i > 0)
            sorted &= probs[i] < probs[i - 1] || (probs[i] == probs[i - 1] && ids[i] > ids[i - 1]);
    }
    ok(kept > n - 100, "no-filter kept set is (almost) the whole vocabulary (%lld)",
       (long long)kept);
    ok(sorted, "candidates come in draw order (probability descending, ties lower id)");
    ok(rel_err < 2e-6, "probabilities match libm softmax: rel err %.2e (p > 1e-6 p_max)", rel_err);
    ok(abs_err < 2e-6, "every probability within %.2e of libm, relative to p_max", abs_err);
    ok(fabs(mass - 1) < 1e-12, "kept probabilities sum to 1 (%.15f)", mass);

    p = params(0.8f, 50, 0.9f, 0.02f, 7);
    ok(walk_agrees(s, x, &p, 400, n, ids, probs), "T 0.8, top_k 50, top_p 0.9, min_p 0.02");
    p = params(1.3f, 0, 0.97f, 0.0f, 8);
    ok(walk_agrees(s, x, &p, 400, n, ids, probs), "T 1.3, top_p 0.97 (thousands kept)");

    for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(test_uniform() * 40)) * 0.05f;
    p = params(1.0f, 0, 1.0f, 0.0f, 3);
    ok(walk_agrees(s, x, &p, 400, n, ids, probs), "40 tied levels over 202k ids: draw == walk");
    p = params(1.0f, 7000, 0.6f, 0.0f, 4);
    ok(walk_agrees(s, x, &p, 400, n, ids, probs), "tied levels with top_k 7000, top_p 0.6");

    for (int64_t i = 0; i < n; i++) x[i] = 0.25f;
    p = params(1.0f, 0, 1.0f, 0.0f, 5);
    ok(walk_agrees(s, x, &p, 400, n, ids, probs), "all equal logits: uniform draw == walk");
    long low_half = 0;
    for (int pos = 0; pos < 1000; pos++) low_half += muse_sample(s, x, &p, pos) < n / 2;
    ok(labs(low_half - 500) < 100, "all equal logits: half the draws in the lower half (%ld)",
       low_half);
    p.top_k = 1000;
    int64_t maxid = 0;
    for (int pos = 0; pos < 1000; pos++) {
        int64_t t = muse_sample(s, x, &p, pos);
        maxid = t > maxid ? t : maxid;
    }
    ok(maxid < 1000 && maxid > 950, "all equal with top_k 1000: ids 0..999 only (max %lld)",
       (long long)maxid);
    free(ref);
    free(x);
    free(ids);
    free(probs);
    muse_sampler_destroy(s);
}

typedef struct {
    muse_sampler *sampler;
    const float *logits;
    muse_sampling params;
    int64_t tokens[500];
} thread_job;

static void *draw_on_thread(void *arg)
{
    thread_job *job = arg;
    for (int pos = 0; pos < 500; pos++)
        job->tokens[pos] = muse_sample(job->sampler, job->logits, &job->params, 1000 + pos);
    return NULL;
}

static void test_determinism(void)
{
    muse_sampler *s = muse_sampler_create(10);
    float x[10];
    for (int i = 0; i < 10; i++) x[i] = (float)log(ten_probs[i]);
    muse_sampling p = params(1.0f, 0, 1.0f, 0.0f, 123);
    thread_job jobs[2];
    pthread_t threads[2];
    for (int t = 0; t < 2; t++) {
        jobs[t].sampler = muse_sampler_create(10);
        jobs[t].logits = x;
        jobs[t].params = p;
        pthread_create(&threads[t], NULL, draw_on_thread, &jobs[t]);
    }
    for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
    int same = 1;
    for (int pos = 0; pos < 500; pos++) {
        int64_t here = muse_sample(s, x, &p, 1000 + pos);
        same &= here == jobs[0].tokens[pos] && here == jobs[1].tokens[pos];
        same &= here == muse_sample(s, x, &p, 1000 + pos);
    }
    ok(same, "same seed and position: same token, again and on two threads");
    for (int t = 0; t < 2; t++) muse_sampler_destroy(jobs[t].sampler);

    long counts[10] = {0};
    int changes = 0;
    int64_t last = -1;
    for (int pos = 0; pos < 2000; pos++) {
        int64_t t = muse_sample(s, x, &p, pos);
        counts[t]++;
        changes += t != last;
        last = t;
    }
    int all_seen = 1;
    for (int i = 0; i < 10; i++) all_seen &= counts[i] > 0;
    ok(all_seen && changes > 1000, "different positions draw different tokens (%d changes)",
       changes);
    muse_sampling other = p;
    other.seed = 124;
    int differ = 0;
    for (int pos = 0; pos < 200; pos++)
        differ += muse_sample(s, x, &p, pos) != muse_sample(s, x, &other, pos);
    ok(differ > 100, "a different seed gives a different sequence (%d of 200 differ)", differ);
    muse_sampler_destroy(s);
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void speed_diag(void)
{
    int64_t n = BIG_VOCAB;
    muse_sampler *s = muse_sampler_create(n);
    float *x = malloc(sizeof *x * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(2.5 * test_normal());
    x[1234] = 14.0f;
    const muse_sampling cases[] = {
        params(0.0f, 0, 1.0f, 0.0f, 1),  params(1.0f, 0, 1.0f, 0.0f, 1),
        params(0.7f, 0, 0.95f, 0.0f, 1), params(0.7f, 40, 0.95f, 0.05f, 1),
        params(1.0f, 0, 1.0f, 0.1f, 1),
    };
    const char *names[] = {"greedy", "T 1 no filters", "T 0.7 top_p 0.95",
                           "T 0.7 top_k 40 top_p 0.95 min_p 0.05", "T 1 min_p 0.1"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t sink = 0;
        int reps = 100;
        double start = seconds_now();
        for (int pos = 0; pos < reps; pos++) sink += muse_sample(s, x, &cases[c], pos);
        double us = (seconds_now() - start) * 1e6 / reps;
        diag("speed: %.1f us/token on %lld logits, %s (sink %lld)", us, (long long)n, names[c],
             (long long)sink);
    }
    free(x);
    muse_sampler_destroy(s);
}

int main(void)
{
    test_bounds_and_generator();
    test_greedy();
    test_non_finite();
    test_chi_square();
    test_top_k();
    test_top_p();
    test_min_p();
    test_against_walk();
    test_determinism();
    speed_diag();
    return done_testing();
}
