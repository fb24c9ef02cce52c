/* Sampler: exact integer weights, filters as key cut-offs, and draws found by bin walks and
 * radix refinement (no full sort). See sampler.h for the rules, docs/sampling.md for reasons. */
#include "text/sampler.h"
#include "base/sampler_exact.h"

#include "base/muse_common.h"

#include <float.h>
#include <math.h>

/* The weights must round the same everywhere: no fused multiply-adds (gcc -std=c11: off). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* A token's weight q is an integer held exactly in a float (so 24 significant bits); positive
 * float bits order like the values. A candidate's key is (float bits << 32) | (~id), so "key
 * descending" is exactly "weight descending, ties lower id", and keys are unique. */

#define LANES 4
typedef float lane_f32 __attribute__((vector_size(LANES * 4)));
typedef int32_t lane_i32 __attribute__((vector_size(LANES * 4)));

#define BIN_SHIFT       18 /* bins: float exponent and 5 mantissa bits, 32 per power of two */
#define BIN_BASE        (127 << (23 - BIN_SHIFT)) /* the bin of weight 1.0 (every q >= 1) */
#define BIN_COUNT       (64 << (23 - BIN_SHIFT))
#define BINS_PER_OCTAVE (1 << (23 - BIN_SHIFT))
#define TOP_OCTAVES     12 /* weights within 2^-12 of the top are also listed with their keys */
#define TOP_LIMIT       4096
#define DIGIT_BITS      8 /* refining a bin: 8 key bits per pass */
#define SMALL_SLICE     32
#define MAX_VOCAB       ((int64_t)1 << 31)

struct muse_sampler {
    int64_t vocab_size;
    int weight_bits;    /* S: the top token weighs 2^S; vocab * 2^S <= 2^62 */
    float *weights;     /* q per token as an integer-valued float; 0: never drawn */
    uint64_t *slice;    /* scratch: one bin's keys while refining; the kept set for listing */
    uint64_t *top_keys; /* keys of every token in the bins >= TOP_BIN, unless too many */
    int64_t top_count;  /* > TOP_LIMIT: the list overflowed, gather by scanning all weights */
    int top_bin;        /* the lowest listed bin */
    float *masked;      /* muse_sample_masked's copy of the logits, made on first use */
    uint64_t bin_count[BIN_COUNT + 1]; /* the extra bin collects zero weights */
    uint64_t bin_weight[BIN_COUNT + 1];
};

/* What a draw needs once the logits are read: either a forced token or the kept key range. */
typedef struct {
    int64_t forced;       /* >= 0: the answer without a draw */
    uint64_t cut_key;     /* keys >= cut_key are kept */
    uint64_t kept_weight; /* sum of q over kept keys */
} draw_plan;

/* Where a running total, taken in key-descending order, first passes a target. */
typedef struct {
    uint64_t key;
    uint64_t count_before;
    uint64_t weight_before;
} crossing;

/* ---- counter-based generator (sampler_exact.h) ---- */

uint64_t muse_rand_bits(uint64_t seed, uint64_t position, uint64_t stream)
{
    return muse_sx_rand_bits(seed, position, stream);
}

double muse_rand_uniform(uint64_t seed, uint64_t position, uint64_t stream)
{
    return (double)(muse_rand_bits(seed, position, stream) >> 11) * 0x1p-53;
}

/* ---- keys ---- */

static uint64_t key_weight(uint64_t key)
{
    return (uint64_t)(int64_t)muse_sx_bits_float((uint32_t)(key >> 32));
}

static int key_bin(uint64_t key)
{
    return (int)((key >> (32 + BIN_SHIFT)) - BIN_BASE);
}

/* ---- weights: exp on a fixed sequence of IEEE float operations (same bits everywhere) ---- */

static inline lane_f32 lane_select(lane_i32 mask, lane_f32 yes, lane_f32 no)
{
    return (lane_f32)(((lane_i32)yes & mask) | ((lane_i32)no & ~mask));
}

/* q = round(2^S * exp((x - max) * inv_t)) for 4 logits, 0 where that is below 1/2 or x is NaN.
 * exp(z) = 2^k * p(r), k = round(z / ln 2), r = z - k ln 2 (Cody-Waite), p: Taylor degree 7;
 * relative error about 2e-7, the float logits' own resolution. */
static inline __attribute__((always_inline)) lane_f32 lane_weights(lane_f32 x, float max,
                                                                   float inv_t, int weight_bits)
{
    const lane_f32 zero = {0}, z_min = zero - (float)(weight_bits + 2) * 0.693147182f;
    const lane_f32 round_magic = zero + 0x1.8p23f, two23 = zero + 0x1p23f;
    lane_f32 z = (x - max) * inv_t;
    lane_i32 finite = z >= z_min; /* false for NaN */
    z = lane_select(finite, z, zero);
    lane_f32 kf = (z * 1.44269502f + round_magic) - round_magic;
    lane_f32 r = (z - kf * 0.693359375f) - kf * -2.12194440e-4f;
    lane_f32 p = 1.0f / 5040 * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    lane_i32 k = __builtin_convertvector(kf, lane_i32);
    lane_f32 scale = (lane_f32)((k + (127 + weight_bits)) << 23);
    lane_f32 q = p * scale;
    q = lane_select(q < two23, (q + two23) - two23, q); /* round to an integer */
    lane_f32 top = zero + (float)((uint64_t)1 << weight_bits);
    q = lane_select(q > top, top, q);
    return lane_select(finite, q, zero);
}

static inline lane_f32 load_lanes(const float *from)
{
    lane_f32 v;
    memcpy(&v, from, sizeof v);
    return v;
}

/* Fills s->weights and the bin histograms; returns the total weight. */
static uint64_t compute_weights(muse_sampler *s, const float *logits, float max, float inv_t)
{
    const int64_t n = s->vocab_size, whole = n - n % LANES;
    float *weights = s->weights;
    for (int64_t i = 0; i < whole; i += LANES) {
        lane_f32 q = lane_weights(load_lanes(logits + i), max, inv_t, s->weight_bits);
        memcpy(weights + i, &q, sizeof q);
    }
    if (whole < n) {
        float tail[LANES];
        for (int j = 0; j < LANES; j++) tail[j] = whole + j < n ? logits[whole + j] : NAN;
        lane_f32 q = lane_weights(load_lanes(tail), max, inv_t, s->weight_bits);
        memcpy(tail, &q, sizeof q);
        memcpy(weights + whole, tail, sizeof *tail * (size_t)(n - whole));
    }
    uint64_t *count = s->bin_count, *weight = s->bin_weight, *top_keys = s->top_keys;
    memset(count, 0, sizeof s->bin_count);
    memset(weight, 0, sizeof s->bin_weight);
    const uint32_t top_bin = (uint32_t)s->top_bin;
    int64_t top_count = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = muse_sx_float_bits(weights[i]);
        uint32_t bin = bits ? (bits >> BIN_SHIFT) - BIN_BASE : BIN_COUNT;
        count[bin]++;
        weight[bin] += (uint64_t)(int64_t)weights[i];
        if (bin >= top_bin && bin < BIN_COUNT) {
            if (top_count < TOP_LIMIT) top_keys[top_count] = muse_sx_key(bits, i);
            top_count++;
        }
    }
    s->top_count = top_count;
    uint64_t total = 0;
    for (int b = 0; b < BIN_COUNT; b++) total += weight[b];
    return total;
}

/* ---- life cycle ---- */

muse_sampler *muse_sampler_create(int64_t vocab_size)
{
    if (vocab_size < 1 || vocab_size > MAX_VOCAB) return NULL;
    muse_sampler *s = MUSE_CALLOC(1, sizeof *s);
    s->vocab_size = vocab_size;
    int id_bits = 0;
    while (((int64_t)1 << id_bits) < vocab_size) id_bits++;
    s->weight_bits = 62 - id_bits;
    s->top_bin = (s->weight_bits - TOP_OCTAVES) * BINS_PER_OCTAVE;
    s->top_keys = MUSE_MALLOC(TOP_LIMIT * sizeof *s->top_keys);
    s->weights = MUSE_MALLOC((size_t)vocab_size * sizeof *s->weights);
    s->slice = MUSE_MALLOC((size_t)vocab_size * sizeof *s->slice);
    return s;
}

void muse_sampler_destroy(muse_sampler *s)
{
    if (!s) return;
    free(s->weights);
    free(s->slice);
    free(s->top_keys);
    free(s->masked);
    free(s);
}

/* ---- reading the logits ---- */

/* Highest logit, NaN below -inf, lowest id on ties; -1 when no logit is above -inf. */
static int64_t highest_logit(const float *logits, int64_t n)
{
    const int64_t whole = n - n % (2 * LANES);
    const lane_f32 minus_inf = (lane_f32){0} - INFINITY;
    lane_f32 best0 = minus_inf, best1 = minus_inf; /* two chains: select latencies overlap */
    for (int64_t i = 0; i < whole; i += 2 * LANES) {
        lane_f32 x0 = load_lanes(logits + i), x1 = load_lanes(logits + i + LANES);
        best0 = lane_select(x0 > best0, x0, best0); /* NaN compares false */
        best1 = lane_select(x1 > best1, x1, best1);
    }
    float max = -INFINITY;
    for (int j = 0; j < LANES; j++) {
        max = best0[j] > max ? best0[j] : max;
        max = best1[j] > max ? best1[j] : max;
    }
    for (int64_t i = whole; i < n; i++) max = logits[i] > max ? logits[i] : max;
    if (max == -INFINITY) return -1;
    for (int64_t i = 0; i < n; i++)
        if (logits[i] == max) return i;
    return -1;
}

/* The answer when nothing is above -inf: the lowest id holding -inf, else 0 (all NaN). */
static int64_t lowest_minus_inf(const float *logits, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (logits[i] == -INFINITY) return i;
    return 0;
}

/* ---- finding where a running total crosses a target ---- */

static void sort_descending(uint64_t *v, int64_t n)
{
    for (int64_t i = 1; i < n; i++) {
        uint64_t x = v[i];
        int64_t j = i;
        for (; j > 0 && v[j - 1] < x; j--) v[j] = v[j - 1];
        v[j] = x;
    }
}

static uint64_t share(uint64_t key, int by_count)
{
    return by_count ? 1 : key_weight(key);
}

/* Narrows keys v[0..n) (bits >= free_bits shared) to the crossing: MSD radix passes keep only
 * the digit where the total passes target, then a small sorted walk. by_count: each key
 * weighs 1, else its q. */
static crossing refine(uint64_t *v, int64_t n, int free_bits, uint64_t target, crossing c,
                       int by_count)
{
    while (n > SMALL_SLICE && free_bits > 0) {
        int shift = free_bits > DIGIT_BITS ? free_bits - DIGIT_BITS : 0;
        uint64_t mask = (1ull << (free_bits - shift)) - 1;
        uint64_t count[1 << DIGIT_BITS] = {0}, weight[1 << DIGIT_BITS] = {0};
        for (int64_t i = 0; i < n; i++) {
            uint64_t d = (v[i] >> shift) & mask;
            count[d]++;
            weight[d] += key_weight(v[i]);
        }
        uint64_t digit = mask;
        for (;; digit--) {
            uint64_t add = by_count ? count[digit] : weight[digit];
            uint64_t total = by_count ? c.count_before : c.weight_before;
            if (total + add > target) break;
            c.count_before += count[digit];
            c.weight_before += weight[digit];
            MUSE_CHECK(digit > 0);
        }
        int64_t kept = 0;
        for (int64_t i = 0; i < n; i++)
            if (((v[i] >> shift) & mask) == digit) v[kept++] = v[i];
        n = kept;
        free_bits = shift;
    }
    sort_descending(v, n);
    for (int64_t i = 0; i < n; i++) {
        uint64_t total = by_count ? c.count_before : c.weight_before;
        if (total + share(v[i], by_count) > target) {
            c.key = v[i];
            return c;
        }
        c.count_before++;
        c.weight_before += key_weight(v[i]);
    }
    MUSE_CHECK(!"target below the total of the candidates");
    return c;
}

/* Copies the keys of one bin into s->slice; returns how many. */
static int64_t gather_bin(muse_sampler *s, int bin)
{
    if (bin >= s->top_bin && s->top_count <= TOP_LIMIT) {
        int64_t n = 0;
        for (int64_t i = 0; i < s->top_count; i++)
            if (key_bin(s->top_keys[i]) == bin) s->slice[n++] = s->top_keys[i];
        return n;
    }
    const uint32_t *bits = (const uint32_t *)(const void *)s->weights;
    const uint32_t want = (uint32_t)(bin + BIN_BASE);
    int64_t n = 0;
    for (int64_t i = 0; i < s->vocab_size; i++)
        if (bits[i] >> BIN_SHIFT == want && bits[i] != 0) s->slice[n++] = muse_sx_key(bits[i], i);
    return n;
}

/* The candidate where the total of the keys above it is <= target < that total plus its own
 * share (weights, or counts when by_count). Caller guarantees target < the whole total. */
static crossing find_crossing(muse_sampler *s, uint64_t target, int by_count)
{
    crossing c = {0, 0, 0};
    int b = BIN_COUNT - 1;
    for (;; b--) {
        MUSE_CHECK(b >= 0);
        uint64_t add = by_count ? s->bin_count[b] : s->bin_weight[b];
        uint64_t total = by_count ? c.count_before : c.weight_before;
        if (total + add > target) break;
        c.count_before += s->bin_count[b];
        c.weight_before += s->bin_weight[b];
    }
    int64_t n = gather_bin(s, b);
    return refine(s->slice, n, 32 + BIN_SHIFT, target, c, by_count);
}

/* Total q of the keys >= cut. */
static uint64_t weight_from(muse_sampler *s, uint64_t cut)
{
    int cut_bin = key_bin(cut);
    uint64_t total = 0;
    for (int b = BIN_COUNT - 1; b > cut_bin; b--) total += s->bin_weight[b];
    int64_t n = gather_bin(s, cut_bin);
    for (int64_t i = 0; i < n; i++)
        if (s->slice[i] >= cut) total += key_weight(s->slice[i]);
    return total;
}

/* ---- the plan: forced answers, then the filters as one key cut-off ---- */

static draw_plan plan_draw(muse_sampler *s, const float *logits, const muse_sampling *p)
{
    draw_plan plan = {-1, 0, 0};
    int64_t n = s->vocab_size;
    int64_t best = highest_logit(logits, n);
    if (best < 0) {
        plan.forced = lowest_minus_inf(logits, n);
        return plan;
    }
    if (!(p->temperature > 0) || logits[best] == INFINITY) {
        plan.forced = best;
        return plan;
    }
    float inv_t = 1.0f / p->temperature;
    if (inv_t > FLT_MAX) inv_t = FLT_MAX; /* keeps 0 * inv_t a number */
    uint64_t total = compute_weights(s, logits, logits[best], inv_t);
    uint64_t candidates = 0;
    for (int b = 0; b < BIN_COUNT; b++) candidates += s->bin_count[b];
    uint64_t cut = 0, kept = total;
    if (p->top_k > 0 && (uint64_t)p->top_k < candidates) {
        crossing c = find_crossing(s, (uint64_t)p->top_k - 1, 1);
        cut = c.key;
        kept = c.weight_before + key_weight(c.key);
    }
    if (p->top_p < 1) { /* NaN compares false: off */
        uint64_t need = p->top_p > 0 ? muse_sx_ceil_float_times(p->top_p, kept) : 1;
        if (need == 0) need = 1;
        if (need < kept) {
            crossing c = find_crossing(s, need - 1, 0);
            if (c.key > cut) {
                cut = c.key;
                kept = c.weight_before + key_weight(c.key);
            }
        }
    }
    if (p->min_p > 0) {
        uint64_t min_cut = muse_sx_min_p_cut(p->min_p, s->weight_bits);
        if (min_cut > cut) {
            cut = min_cut;
            kept = weight_from(s, cut);
        }
    }
    plan.cut_key = cut;
    plan.kept_weight = kept;
    return plan;
}

int64_t muse_sample(muse_sampler *s, const float *logits, const muse_sampling *p, int64_t position)
{
    draw_plan plan = plan_draw(s, logits, p);
    if (plan.forced >= 0) return plan.forced;
    uint64_t u53 = muse_rand_bits(p->seed, (uint64_t)position, 0) >> 11;
    uint64_t target = muse_sx_mul_shift(u53, plan.kept_weight, 53, 0);
    crossing c = find_crossing(s, target, 0);
    MUSE_CHECK(c.key >= plan.cut_key);
    return muse_sx_key_id(c.key);
}

static int compare_keys_descending(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int64_t muse_sample_candidates(muse_sampler *s, const float *logits, const muse_sampling *p,
                               int64_t *ids, double *probs, int64_t max_out)
{
    draw_plan plan = plan_draw(s, logits, p);
    if (plan.forced >= 0) {
        if (max_out > 0) {
            ids[0] = plan.forced;
            probs[0] = 1.0;
        }
        return 1;
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < s->vocab_size; i++) {
        uint32_t bits = muse_sx_float_bits(s->weights[i]);
        uint64_t key = muse_sx_key(bits, i);
        if (bits != 0 && key >= plan.cut_key) s->slice[kept++] = key;
    }
    qsort(s->slice, (size_t)kept, sizeof *s->slice, compare_keys_descending);
    for (int64_t i = 0; i < kept && i < max_out; i++) {
        ids[i] = muse_sx_key_id(s->slice[i]);
        probs[i] = (double)key_weight(s->slice[i]) / (double)plan.kept_weight;
    }
    return kept;
}

int64_t muse_sample_masked(muse_sampler *s, const float *logits, const uint8_t *mask,
                           const muse_sampling *p, int64_t position)
{
    if (!mask) return muse_sample(s, logits, p, position);
    int64_t V = s->vocab_size, first = -1;
    if (!s->masked) s->masked = MUSE_MALLOC((size_t)V * sizeof *s->masked);
    for (int64_t i = 0; i < V; i++) {
        int on = (mask[i >> 3] >> (i & 7)) & 1;
        s->masked[i] = on ? logits[i] : -INFINITY;
        if (on && first < 0) first = i;
    }
    int64_t t = muse_sample(s, s->masked, p, position);
    /* every allowed logit NaN or -inf: the sampler's fallback id may be masked out */
    return first >= 0 && !((mask[t >> 3] >> (t & 7)) & 1) ? first : t;
}
