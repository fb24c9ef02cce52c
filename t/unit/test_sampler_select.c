/* The fast GPU sampler's selection (base/sampler_select.h) run on the CPU in the kernel's
 * steps (chunked max, bin histograms, keys scattered by bin in a scrambled order, bin then
 * digit crossings) against the host's muse_sample: the same token on 12000 random rows with
 * ties, -inf, +inf, NaN, T = 0, top_k 1/40/vocab, top_p 0.9/1 and min_p. */
#include "base/sampler_select.h"
#include "text/sampler.h"
#include "tap.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define ROWS     12000
#define CHUNK    4096 /* the kernel's elements a block (SF_CHUNK) */
#define MAX_V    202048
#define BIG_ROWS 24 /* rows at the largest vocabulary */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}
static double uniform(void)
{
    return (double)(next_u64() >> 11) * 0x1p-53;
}
static double normal(void)
{
    return sqrt(-2.0 * log(uniform() + 1e-300)) * cos(6.283185307179586 * uniform());
}

typedef struct {
    uint32_t bin_count[MUSE_SS_BINS], cursor[MUSE_SS_BINS], digit_count[MUSE_SS_DIGITS];
    uint64_t bin_weight[MUSE_SS_BINS], digit_weight[MUSE_SS_DIGITS];
    uint64_t *keys;
} proto;

/* The kernel's steps, one after another; scramble picks the order keys land in their bins. */
static int64_t proto_sample(proto *s, const float *lg, int64_t V, const muse_sampling *p,
                            int64_t pos, int wb, uint64_t scramble)
{
    /* chunk maxima and lowest ids, combined in chunk order (k_sf_max, k_sf_combine) */
    float mx = -INFINITY;
    int64_t best = V;
    for (int64_t c0 = 0; c0 < V; c0 += CHUNK) {
        float cm = -INFINITY;
        for (int64_t i = c0; i < V && i < c0 + CHUNK; i++) cm = lg[i] > cm ? lg[i] : cm;
        if (cm > mx) mx = cm;
    }
    for (int64_t c0 = 0; c0 < V; c0 += CHUNK) { /* each chunk's lowest id holding the maximum */
        float cm = -INFINITY;
        for (int64_t i = c0; i < V && i < c0 + CHUNK; i++) cm = lg[i] > cm ? lg[i] : cm;
        for (int64_t i = c0; i < V && i < c0 + CHUNK && cm == mx; i++)
            if (i < best && lg[i] == cm) best = i;
    }
    if (mx == -INFINITY || !(p->temperature > 0) || mx == INFINITY) return best < V ? best : 0;
    float inv_t = 1.0f / p->temperature;
    if (inv_t > FLT_MAX) inv_t = FLT_MAX;
    /* histograms (k_sf_hist): a chunk's counts and 32-bit sums of low bits, its weights from
     * them (muse_ss_bin_weight), added to the row's */
    memset(s->bin_count, 0, sizeof s->bin_count);
    memset(s->bin_weight, 0, sizeof s->bin_weight);
    for (int64_t c0 = 0; c0 < V; c0 += CHUNK) {
        static uint32_t cnt[MUSE_SS_BINS], low[MUSE_SS_BINS];
        memset(cnt, 0, sizeof cnt);
        memset(low, 0, sizeof low);
        for (int64_t i = c0; i < V && i < c0 + CHUNK; i++) {
            float q = muse_ss_weight(lg[i], mx, inv_t, wb);
            if (q <= 0) continue;
            uint32_t bits = muse_sx_float_bits(q);
            cnt[muse_ss_bin(bits)]++;
            low[muse_ss_bin(bits)] += muse_ss_low(bits);
        }
        for (int b = 0; b < MUSE_SS_BINS; b++) {
            s->bin_count[b] += cnt[b];
            s->bin_weight[b] += muse_ss_bin_weight(b, cnt[b], low[b]);
        }
    }
    /* keys by bin, highest first, each bin filled in a scrambled visiting order (k_sf_scatter) */
    uint64_t start[MUSE_SS_BINS], above = 0;
    for (int b = MUSE_SS_BINS - 1; b >= 0; b--) start[b] = above, above += s->bin_count[b];
    memset(s->cursor, 0, sizeof s->cursor);
    for (int64_t k = 0; k < V; k++) { /* a rotated visiting order, then each bin shuffled */
        int64_t i = (int64_t)((scramble + (uint64_t)k) % (uint64_t)V);
        float q = muse_ss_weight(lg[i], mx, inv_t, wb);
        if (q <= 0) continue;
        uint32_t bits = muse_sx_float_bits(q);
        int b = muse_ss_bin(bits);
        s->keys[start[b] + s->cursor[b]++] = muse_sx_key(bits, i);
    }
    for (int b = 0; b < MUSE_SS_BINS; b++)
        for (uint64_t j = s->bin_count[b]; j > 1; j--) {
            uint64_t *seg = s->keys + start[b], t = seg[j - 1], o = next_u64() % j;
            seg[j - 1] = seg[o];
            seg[o] = t;
        }
    uint64_t total = 0, candidates = above;
    for (int b = 0; b < MUSE_SS_BINS; b++) total += s->bin_weight[b];
    /* the plan and the draw (k_sf_select), as kernels/sample.cu */
    muse_ss_crossing c;
    uint64_t cut = 0, kept = total;
    if (p->top_k > 0 && (uint64_t)p->top_k < candidates) {
        if (!muse_ss_crossing_seq(s->bin_count, s->bin_weight, s->keys, (uint64_t)p->top_k - 1, 1,
                                  s->digit_count, s->digit_weight, &c))
            return -1;
        cut = c.key;
        kept = c.weight_before + muse_ss_key_weight(c.key);
    }
    if (p->top_p < 1) {
        uint64_t need = p->top_p > 0 ? muse_sx_ceil_float_times(p->top_p, kept) : 1;
        if (need == 0) need = 1;
        if (need < kept) {
            if (!muse_ss_crossing_seq(s->bin_count, s->bin_weight, s->keys, need - 1, 0,
                                      s->digit_count, s->digit_weight, &c))
                return -1;
            if (c.key > cut) {
                cut = c.key;
                kept = c.weight_before + muse_ss_key_weight(c.key);
            }
        }
    }
    if (p->min_p > 0) {
        uint64_t min_cut = muse_sx_min_p_cut(p->min_p, wb);
        if (min_cut > cut) {
            cut = min_cut;
            kept = muse_ss_weight_from_seq(s->bin_count, s->bin_weight, s->keys, cut);
        }
    }
    uint64_t u53 = muse_sx_rand_bits(p->seed, (uint64_t)pos, 0) >> 11;
    uint64_t target = muse_sx_mul_shift(u53, kept, 53, 0);
    if (!muse_ss_crossing_seq(s->bin_count, s->bin_weight, s->keys, target, 0, s->digit_count,
                              s->digit_weight, &c))
        return -1;
    return muse_sx_key_id(c.key);
}

/* muse_ss_bin_weight against the weights added one by one: random bins from q = 1 to the top
 * of 2^44 (below 2^23 each weight an integer: its lowest bits clear), n up to 2^18 weights,
 * their low bits summed as two 9-bit halves (the select kernel's digit sums). */
static void test_bin_weight(void)
{
    int good = 1;
    for (int r = 0; r < 2000; r++) {
        /* the bin of a random integer weight up to 2^44 (no other bin holds a weight) */
        uint64_t q0 = next_u64() >> (19 + next_u64() % 45);
        int b = muse_ss_bin(muse_sx_float_bits((float)(q0 ? q0 : 1)));
        uint32_t hi = ((uint32_t)b + MUSE_SS_BIN_BASE) << MUSE_SS_BIN_SHIFT;
        int e = (int)(hi >> 23) - 127, clear = e < 23 ? 23 - e : 0;
        uint64_t n = r % 10 ? 1 + next_u64() % 300 : 1 + next_u64() % (1u << 18), want = 0;
        uint64_t lo9 = 0, hi9 = 0, cnt = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t low = (uint32_t)next_u64() & ((1u << MUSE_SS_BIN_SHIFT) - 1);
            low = r % 7 == 0 ? (1u << MUSE_SS_BIN_SHIFT) - 1 : low; /* every low bit set */
            low &= ~((1u << clear) - 1);
            uint32_t bits = hi | low;
            want += (uint64_t)muse_sx_bits_float(bits);
            good &= muse_ss_bin(bits) == b && muse_ss_low(bits) == low;
            lo9 += low & 511;
            hi9 += low >> 9;
            cnt++;
        }
        good &= muse_ss_bin_weight(b, cnt, (hi9 << 9) + lo9) == want;
        if (!good) {
            diag("bin %d (2^%d), %llu weights", b, e, (unsigned long long)n);
            break;
        }
    }
    ok(good, "a bin's weight from its count and low bits equals the weights added (2000 bins)");
}

/* A row of one of several kinds: spreads, heavy ties, specials. */
static void make_row(float *x, int64_t V, int kind)
{
    double scale = kind % 3 == 0 ? 1.0 : kind % 3 == 1 ? 8.0 : 40.0;
    for (int64_t i = 0; i < V; i++) {
        switch (kind % 8) {
        case 0:
            x[i] = (float)(normal() * scale);
            break;
        case 1:
            x[i] = (float)floor(normal() * 2);
            break; /* few values: ties everywhere */
        case 2:
            x[i] = 3.0f;
            break; /* all equal */
        case 3:
            x[i] = (float)(normal() * scale) + (uniform() < 0.3 ? -INFINITY : 0.0f);
            break;
        case 4:
            x[i] = uniform() < 0.5 ? NAN : (float)(normal() * scale);
            break;
        case 5:
            x[i] = uniform() < 0.999 ? -INFINITY : (float)normal();
            break;
        case 6:
            x[i] = (float)(uniform() * 1e-3);
            break; /* a flat top: ties in the top bins */
        default:
            x[i] = (float)(normal() * scale * 1e6);
            break;
        }
    }
    if (kind % 29 == 7) x[next_u64() % (uint64_t)V] = INFINITY;
    if (kind % 31 == 11)
        for (int64_t i = 0; i < V; i++) x[i] = -INFINITY;
    if (kind % 37 == 13)
        for (int64_t i = 0; i < V; i++) x[i] = NAN;
    if (kind % 41 == 17) x[next_u64() % (uint64_t)V] = -0.0f, x[next_u64() % (uint64_t)V] = 0.0f;
}

static muse_sampling make_params(int64_t V)
{
    static const float temps[] = {0.7f, 1.0f, 0.0f, 1e-3f, 5.0f, 1e-30f, 0.3f};
    static const float top_ps[] = {1.0f, 0.9f, 0.5f, 1e-9f, 0.999f, 0.0f};
    static const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.5f, 1.0f, 1e-6f};
    int ks[] = {0, 1, 40, (int)V, (int)V + 1, 2, (int)(next_u64() % (uint64_t)V) + 1};
    muse_sampling p;
    p.temperature = temps[next_u64() % 7];
    p.top_k = ks[next_u64() % 7];
    p.top_p = top_ps[next_u64() % 6];
    p.min_p = min_ps[next_u64() % 6];
    p.seed = next_u64();
    return p;
}

int main(void)
{
    static const int64_t vocabs[] = {1, 2, 3, 7, 100, 257, 1000, 4097, 5000, 8193};
    proto *s = calloc(1, sizeof *s);
    s->keys = malloc((size_t)MAX_V * sizeof *s->keys);
    float *x = malloc((size_t)MAX_V * sizeof *x);
    long same = 0, rows = 0, greedy = 0, filtered = 0;
    int64_t first_bad = -1;
    for (long r = 0; r < ROWS + BIG_ROWS; r++) {
        int64_t V = r < ROWS ? vocabs[next_u64() % 10] : MAX_V - (int64_t)(r % 3);
        int id_bits = 0;
        while (((int64_t)1 << id_bits) < V) id_bits++;
        int wb = 62 - id_bits;
        make_row(x, V, (int)(next_u64() % 1000));
        muse_sampling p = make_params(V);
        int64_t pos = (int64_t)(next_u64() % 100000);
        muse_sampler *h = muse_sampler_create(V);
        int64_t want = muse_sample(h, x, &p, pos);
        muse_sampler_destroy(h);
        int64_t got = proto_sample(s, x, V, &p, pos, wb, next_u64());
        rows++;
        if (got == want)
            same++;
        else if (first_bad < 0)
            first_bad = r;
        greedy += !(p.temperature > 0);
        filtered += p.top_k > 0 || p.top_p < 1 || p.min_p > 0;
    }
    is_int(same, rows, "the prototype draws the host's token on every row (%ld rows)", rows);
    if (first_bad >= 0) diag("first differing row %lld", (long long)first_bad);
    ok(greedy > 1000 && filtered > 5000, "the rows cover greedy (%ld) and filters (%ld)", greedy,
       filtered);
    /* the weight function is the host's: a row's draws at T=1 track the host's keys */
    float row[4] = {0.0f, -1.0f, -30.0f, NAN};
    ok(muse_ss_weight(row[0], 0.0f, 1.0f, 44) == (float)((uint64_t)1 << 44) &&
           muse_ss_weight(row[3], 0.0f, 1.0f, 44) == 0.0f &&
           muse_ss_weight(row[1], 0.0f, 1.0f, 44) > 0.36f * (float)((uint64_t)1 << 44) &&
           muse_ss_weight(row[1], 0.0f, 1.0f, 44) < 0.37f * (float)((uint64_t)1 << 44),
       "weights: the top weighs 2^S, NaN 0, exp(-1) within its float");
    test_bin_weight();
    free(x);
    free(s->keys);
    free(s);
    printf("1..%d\n", tap_n);
    return tap_failed != 0;
}
