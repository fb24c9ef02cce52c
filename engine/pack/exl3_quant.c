#include "pack/exl3_quant.h"

#include <math.h>
#include <pthread.h>

/* ---- the Viterbi step, vectorized with GCC/Clang vector extensions ----
 * Costs are non-negative floats, so their bit patterns order like the floats. Each candidate
 * cost carries its top-bits choice t in its low `bits` mantissa bits, so one integer min picks
 * the best cost and its back-pointer together (costs lose 2^-15 relative precision at most). */

typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
typedef uint8_t vb16 __attribute__((vector_size(16)));
/* AVX2 gets 8-lane types: GCC lowers 16-lane ones there through the stack (14x slower). */
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef uint8_t vb8 __attribute__((vector_size(8)));

#if defined(__clang__)
#define SHUFFLE(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define SHUFFLE_16(v, ...) __builtin_shuffle(v, (vi16){__VA_ARGS__})
#define SHUFFLE_8(v, ...)  __builtin_shuffle(v, (vi8){__VA_ARGS__})
#endif
#if defined(__clang__)
#define EXPAND16_1(v) SHUFFLE(v, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
#define EXPAND16_2(v) SHUFFLE(v, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
#define EXPAND16_3(v) SHUFFLE(v, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
#define EXPAND8_1(v)  SHUFFLE(v, 0, 0, 1, 1, 2, 2, 3, 3)
#define EXPAND8_2(v)  SHUFFLE(v, 0, 0, 0, 0, 1, 1, 1, 1)
#else
#define EXPAND16_1(v) SHUFFLE_16(v, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
#define EXPAND16_2(v) SHUFFLE_16(v, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
#define EXPAND16_3(v) SHUFFLE_16(v, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
#define EXPAND8_1(v)  SHUFFLE_8(v, 0, 0, 1, 1, 2, 2, 3, 3)
#define EXPAND8_2(v)  SHUFFLE_8(v, 0, 0, 0, 0, 1, 1, 1, 1)
#endif
/* lane i of the previous costs: prev[(s0 + i) >> bits], from L consecutive raw entries */
#define EXPAND16(raw, bits)                                                                        \
    (bits == 1 ? EXPAND16_1(raw) : bits == 2 ? EXPAND16_2(raw) : EXPAND16_3(raw))
#define EXPAND8(raw, bits) (bits == 1 ? EXPAND8_1(raw) : EXPAND8_2(raw))

#define COST_PAD 16 /* prev is read 16 floats at a time past its last used index */

/* The candidate costs of L states s0..s0+L-1 (top bits t), their t in the low bits. */
#define CANDIDATES(VF, VI, L, EXPAND, ci, s0)                                                      \
    do {                                                                                           \
        VF v_, pv_;                                                                                \
        memcpy(&v_, val + (s0), sizeof v_);                                                        \
        if ((1 << bits) >= (L)) {                                                                  \
            pv_ = (VF){0} + muse_bits_to_f32(prev[(s0) >> bits]);                                  \
        } else {                                                                                   \
            VF raw_;                                                                               \
            memcpy(&raw_, prev + ((s0) >> bits), sizeof raw_);                                     \
            pv_ = EXPAND(raw_, bits);                                                              \
        }                                                                                          \
        VF d_ = v_ - x;                                                                            \
        (ci) = ((VI)(pv_ + d_ * d_) & keep) | t;                                                   \
    } while (0)

#define KEEP_MIN(VI, best, ci)                                                                     \
    do {                                                                                           \
        VI less_ = (ci) < (best);                                                                  \
        (best) = ((ci)&less_) | ((best) & ~less_);                                                 \
    } while (0)

/* cur[e] = min over t of prev[s >> bits] + (val[s] - x)^2, s = t*E + e, t packed in the low
 * bits. Four independent L-lane chains hide the compare latency. Every lane does the same IEEE
 * operations in the same order whatever L is, so both widths give the same bits. */
#define STEP_BODY(VF, VI, VB, L, EXPAND)                                                           \
    const int E = 1 << (16 - bits), T = 1 << bits;                                                 \
    const int32_t keep = ~(T - 1);                                                                 \
    for (int e0 = 0; e0 < E; e0 += 4 * (L)) {                                                      \
        VI b0, b1, b2, b3, c0, c1, c2, c3;                                                         \
        int t = 0;                                                                                 \
        CANDIDATES(VF, VI, L, EXPAND, b0, e0);                                                     \
        CANDIDATES(VF, VI, L, EXPAND, b1, e0 + (L));                                               \
        CANDIDATES(VF, VI, L, EXPAND, b2, e0 + 2 * (L));                                           \
        CANDIDATES(VF, VI, L, EXPAND, b3, e0 + 3 * (L));                                           \
        for (t = 1; t < T; t++) {                                                                  \
            CANDIDATES(VF, VI, L, EXPAND, c0, t *E + e0);                                          \
            CANDIDATES(VF, VI, L, EXPAND, c1, t *E + e0 + (L));                                    \
            CANDIDATES(VF, VI, L, EXPAND, c2, t *E + e0 + 2 * (L));                                \
            CANDIDATES(VF, VI, L, EXPAND, c3, t *E + e0 + 3 * (L));                                \
            KEEP_MIN(VI, b0, c0);                                                                  \
            KEEP_MIN(VI, b1, c1);                                                                  \
            KEEP_MIN(VI, b2, c2);                                                                  \
            KEEP_MIN(VI, b3, c3);                                                                  \
        }                                                                                          \
        memcpy(cur + e0, &b0, sizeof b0);                                                          \
        memcpy(cur + e0 + (L), &b1, sizeof b1);                                                    \
        memcpy(cur + e0 + 2 * (L), &b2, sizeof b2);                                                \
        memcpy(cur + e0 + 3 * (L), &b3, sizeof b3);                                                \
        if (back) {                                                                                \
            VB t0 = __builtin_convertvector(b0 & (T - 1), VB);                                     \
            VB t1 = __builtin_convertvector(b1 & (T - 1), VB);                                     \
            VB t2 = __builtin_convertvector(b2 & (T - 1), VB);                                     \
            VB t3 = __builtin_convertvector(b3 & (T - 1), VB);                                     \
            memcpy(back + e0, &t0, (L));                                                           \
            memcpy(back + e0 + (L), &t1, (L));                                                     \
            memcpy(back + e0 + 2 * (L), &t2, (L));                                                 \
            memcpy(back + e0 + 3 * (L), &t3, (L));                                                 \
        }                                                                                          \
    }

static inline __attribute__((always_inline)) void
step_body(const float *restrict val, const uint32_t *restrict prev, uint32_t *restrict cur,
          uint8_t *restrict back, const int bits, float x)
{
    STEP_BODY(vf16, vi16, vb16, 16, EXPAND16)
}

static inline __attribute__((always_inline)) void
step_body8(const float *restrict val, const uint32_t *restrict prev, uint32_t *restrict cur,
           uint8_t *restrict back, const int bits, float x)
{
    STEP_BODY(vf8, vi8, vb8, 8, EXPAND8)
}

/* One specialization per bits so the shapes are compile-time constants. */
#define STEP_SWITCH(body)                                                                          \
    switch (bits) {                                                                                \
    case 1:                                                                                        \
        body(val, prev, cur, back, 1, x);                                                          \
        break;                                                                                     \
    case 2:                                                                                        \
        body(val, prev, cur, back, 2, x);                                                          \
        break;                                                                                     \
    case 3:                                                                                        \
        body(val, prev, cur, back, 3, x);                                                          \
        break;                                                                                     \
    case 4:                                                                                        \
        body(val, prev, cur, back, 4, x);                                                          \
        break;                                                                                     \
    case 5:                                                                                        \
        body(val, prev, cur, back, 5, x);                                                          \
        break;                                                                                     \
    case 6:                                                                                        \
        body(val, prev, cur, back, 6, x);                                                          \
        break;                                                                                     \
    case 7:                                                                                        \
        body(val, prev, cur, back, 7, x);                                                          \
        break;                                                                                     \
    default:                                                                                       \
        body(val, prev, cur, back, 8, x);                                                          \
        break;                                                                                     \
    }

typedef void (*step_fn)(const float *, const uint32_t *, uint32_t *, uint8_t *, int, float);

static void step_generic(const float *val, const uint32_t *prev, uint32_t *cur, uint8_t *back,
                         int bits, float x)
{
    STEP_SWITCH(step_body)
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static void
step_avx2(const float *val, const uint32_t *prev, uint32_t *cur, uint8_t *back, int bits, float x)
{
    STEP_SWITCH(step_body8)
}
__attribute__((target("avx512f"))) static void
step_avx512(const float *val, const uint32_t *prev, uint32_t *cur, uint8_t *back, int bits, float x)
{
    STEP_SWITCH(step_body)
}
#endif

/* All variants compute the same IEEE operations (no FMA), so results never depend on the CPU. */
static step_fn pick_step(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return step_avx512;
    if (__builtin_cpu_supports("avx2")) return step_avx2;
#endif
    return step_generic;
}

/* ---- one tile ---- */

typedef struct {
    uint32_t *cost_a, *cost_b; /* E + COST_PAD each */
    uint8_t *back;             /* 256 x E back-pointers (t of the best state per edge) */
} tile_scratch;

size_t muse_exl3_tile_scratch_bytes(int bits)
{
    size_t edges = (size_t)1 << (16 - bits);
    return 2 * (edges + COST_PAD) * sizeof(uint32_t) + 256 * edges + 64;
}

static tile_scratch split_scratch(void *scratch, int bits)
{
    size_t edges = (size_t)1 << (16 - bits);
    tile_scratch s;
    s.cost_a = scratch;
    s.cost_b = s.cost_a + edges + COST_PAD;
    s.back = (uint8_t *)(s.cost_b + edges + COST_PAD);
    return s;
}

static uint32_t argmin_edge(const uint32_t *cost, int edges)
{
    uint32_t best = 0;
    for (int e = 1; e < edges; e++)
        if (cost[e] < cost[best]) best = (uint32_t)e;
    return best;
}

/* Runs positions p = (start + q) % 256, q = 0..255, from *prev; back-pointers of steps q >=
 * keep_from go to back[q - keep_from]. Returns the final cost array (one of the two buffers). */
static uint32_t *run_pass(step_fn step, const float *val, const float *target, int bits, int start,
                          int keep_from, tile_scratch *s)
{
    int edges = 1 << (16 - bits);
    uint32_t *prev = s->cost_a, *cur = s->cost_b;
    for (int q = 0; q < 256; q++) {
        uint8_t *back = q >= keep_from ? s->back + (size_t)(q - keep_from) * edges : NULL;
        step(val, prev, cur, back, bits, target[(start + q) % 256]);
        uint32_t *tmp = prev;
        prev = cur;
        cur = tmp;
    }
    return prev;
}

static step_fn chosen_step;
static pthread_once_t step_once = PTHREAD_ONCE_INIT;
static void init_step(void)
{
    chosen_step = pick_step();
}

static void pack_states(const uint16_t states[256], int bits, uint16_t *tile)
{
    uint32_t words[8 * MUSE_EXL3_MAX_BITS] = {0};
    uint32_t mask = (1u << bits) - 1;
    for (int p = 0; p < 256; p++)
        for (int b = 0; b < bits; b++) {
            int bit = p * bits + b; /* MSB first within the symbol and the word */
            uint32_t v = (states[p] & mask) >> (bits - 1 - b) & 1u;
            words[bit >> 5] |= v << (31 - (bit & 31));
        }
    for (int j = 0; j < 8 * bits; j++) {
        tile[2 * j] = (uint16_t)(words[j] & 0xFFFFu);
        tile[2 * j + 1] = (uint16_t)(words[j] >> 16);
    }
}

double muse_exl3_quantize_tile(const float target[256], int bits, muse_codebook cb, uint16_t *tile,
                               void *scratch)
{
    MUSE_CHECK(bits >= 1 && bits <= MUSE_EXL3_MAX_BITS);
    pthread_once(&step_once, init_step);
    const float *val = muse_exl3_value_table(cb);
    int edges = 1 << (16 - bits);
    uint32_t edge_mask = (uint32_t)edges - 1;
    tile_scratch s = split_scratch(scratch, bits);

    /* pass 1: from p = 128 around the circle, free start; trace back to the edge at p = 255 */
    memset(s.cost_a, 0, (size_t)(edges + COST_PAD) * sizeof(uint32_t));
    memset(s.cost_b, 0, (size_t)(edges + COST_PAD) * sizeof(uint32_t));
    uint32_t *last = run_pass(chosen_step, val, target, bits, 128, 128, &s);
    uint32_t edge = argmin_edge(last, edges);
    for (int q = 255; q >= 128; q--) {
        uint32_t state = (uint32_t)s.back[(size_t)(q - 128) * edges + edge] << (16 - bits) | edge;
        edge = (state >> bits) & edge_mask;
    }
    uint32_t wrap = edge;

    /* pass 2: p = 0..255 forced to start from the wrap edge and to end on it */
    const uint32_t unreachable = muse_f32_to_bits(1e30f);
    for (int e = 0; e < edges; e++) s.cost_a[e] = (uint32_t)e == wrap ? 0 : unreachable;
    run_pass(chosen_step, val, target, bits, 0, 0, &s);
    uint16_t states[256];
    edge = wrap;
    double err = 0;
    for (int p = 255; p >= 0; p--) {
        uint32_t state = (uint32_t)s.back[(size_t)p * edges + edge] << (16 - bits) | edge;
        states[p] = (uint16_t)state;
        double d = (double)val[state] - target[p];
        err += d * d;
        edge = (state >> bits) & edge_mask;
    }
    MUSE_CHECK(edge == wrap);
    pack_states(states, bits, tile);
    return err;
}

/* ---- the whole matrix ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A scale as fp16, kept normal and finite so dividing by it is safe. */
static uint16_t safe_scale_f16(double v)
{
    double mag = fabs(v);
    if (!(mag >= 6.103515625e-05)) mag = 6.103515625e-05; /* smallest normal fp16 */
    if (mag > 65504.0) mag = 65504.0;
    return muse_f32_to_f16((float)(v < 0 ? -mag : mag));
}

typedef struct {
    float *m; /* k x n working copy */
    int64_t k, n;
    int bits;
    muse_codebook cb;
    const uint16_t *su, *sv;
    const long *tile_list; /* tiles to quantize (index tk * n/16 + tn) */
    float gain;            /* targets are gain * m */
    uint16_t *trellis;     /* NULL: only measure */
    double *errors;        /* per listed tile: squared error in m units */
} quant_job;

static void rows_divide_sv_hadamard(void *ctx, long begin, long end)
{
    quant_job *q = ctx;
    for (long i = begin; i < end; i++) {
        float *row = q->m + (int64_t)i * q->n;
        for (int64_t j = 0; j < q->n; j++) row[j] /= muse_f16_to_f32(q->sv[j]);
        muse_exl3_block_hadamard(row, q->n);
    }
}

static void blocks_divide_su_hadamard(void *ctx, long begin, long end)
{
    quant_job *q = ctx;
    for (long blk = begin; blk < end; blk++) {
        float *m = q->m + (int64_t)blk * MUSE_EXL3_HAD * q->n;
        for (int r = 0; r < MUSE_EXL3_HAD; r++) {
            float inv = muse_f16_to_f32(q->su[blk * MUSE_EXL3_HAD + r]);
            for (int64_t j = 0; j < q->n; j++) m[(int64_t)r * q->n + j] /= inv;
        }
        muse_exl3_hadamard_columns(m, q->n);
    }
}

static void tiles_viterbi(void *ctx, long begin, long end)
{
    quant_job *q = ctx;
    void *scratch = MUSE_MALLOC(muse_exl3_tile_scratch_bytes(q->bits));
    int64_t ntn = q->n / 16;
    float target[256];
    uint16_t tile[16 * MUSE_EXL3_MAX_BITS];
    for (long i = begin; i < end; i++) {
        long t = q->tile_list[i];
        int64_t tk = t / ntn, tn = t % ntn;
        for (int p = 0; p < 256; p++) {
            int r, c;
            muse_exl3_position_element(p, &r, &c);
            target[p] = q->gain * q->m[(tk * 16 + r) * q->n + tn * 16 + c];
        }
        double err = muse_exl3_quantize_tile(target, q->bits, q->cb, tile, scratch);
        if (q->errors) q->errors[i] = err / ((double)q->gain * q->gain);
        if (q->trellis) memcpy(q->trellis + t * 16 * q->bits, tile, 32 * (size_t)q->bits);
    }
    free(scratch);
}

/* Step 4: the gain with the least error on a few sample tiles (targets are gain * W). */
static float search_gain(quant_job *q, muse_pool *pool)
{
    static const float gains[] = {0.80f, 0.88f, 0.94f, 1.0f, 1.06f};
    long total = (long)(q->k / 16 * (q->n / 16)), nsample = total < 8 ? total : 8;
    long sample[8];
    double errors[8];
    for (long i = 0; i < nsample; i++) sample[i] = i * total / nsample;
    q->tile_list = sample;
    q->errors = errors;
    q->trellis = NULL;
    float best_gain = 1.0f;
    double best = INFINITY;
    for (size_t g = 0; g < sizeof gains / sizeof gains[0]; g++) {
        q->gain = gains[g];
        muse_pool_run(pool, tiles_viterbi, q, nsample);
        double sum = 0;
        for (long i = 0; i < nsample; i++) sum += errors[i];
        if (sum < best) {
            best = sum;
            best_gain = gains[g];
        }
    }
    q->errors = NULL;
    return best_gain;
}

static int check_quant_args(const float *W, int64_t k, int64_t n, int bits, muse_err *e)
{
    if (k <= 0 || n <= 0 || k % MUSE_EXL3_HAD || n % MUSE_EXL3_HAD)
        return muse_fail(e,
                         "EXL3 quantize: shape %lld x %lld: both must be positive multiples "
                         "of 128 (zero-pad the weight first)",
                         (long long)k, (long long)n);
    if (bits < 1 || bits > MUSE_EXL3_MAX_BITS)
        return muse_fail(e, "EXL3 quantize: bits %d is outside 1..8", bits);
    for (int64_t i = 0; i < k * n; i++)
        if (!isfinite(W[i]))
            return muse_fail(e, "EXL3 quantize: weight [%lld][%lld] is not finite",
                             (long long)(i / n), (long long)(i % n));
    return 0;
}

/* Step 2: sv = sign_v * column RMS / mean column RMS (fp16, kept normal). */
static void output_scales(const float *W, int64_t k, int64_t n, uint64_t *rng, uint16_t *svh)
{
    double *col = MUSE_CALLOC((size_t)n, sizeof(double));
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < n; j++) col[j] += (double)W[i * n + j] * W[i * n + j];
    double mean = 0;
    for (int64_t j = 0; j < n; j++) mean += (col[j] = sqrt(col[j] / (double)k));
    mean /= (double)n;
    for (int64_t j = 0; j < n; j++) {
        double sign = splitmix64(rng) & 1 ? -1.0 : 1.0;
        double ratio = mean > 0 && col[j] > 1e-3 * mean ? col[j] / mean : 1.0;
        svh[j] = safe_scale_f16(sign * ratio);
    }
    free(col);
}

/* Step 3 (before the gain): su = sign_u * rowRMS / (-codebook RMS), in double. */
static void input_scales(const float *m, int64_t k, int64_t n, uint64_t *rng, muse_codebook cb,
                         double *su)
{
    double cb_rms = muse_exl3_codebook_rms(cb), mean = 0;
    for (int64_t i = 0; i < k; i++) {
        double sq = 0;
        for (int64_t j = 0; j < n; j++) sq += (double)m[i * n + j] * m[i * n + j];
        su[i] = sqrt(sq / (double)n);
        mean += su[i] / (double)k;
    }
    for (int64_t i = 0; i < k; i++) {
        double sign = splitmix64(rng) & 1 ? -1.0 : 1.0;
        double rms = su[i] > 1e-3 * mean ? su[i] : (mean > 0 ? mean : 1.0);
        su[i] = sign * rms / -cb_rms;
    }
}

int muse_exl3_quantize(const float *W, int64_t k, int64_t n, int bits, muse_codebook cb,
                       uint64_t seed, uint16_t *trellis, uint16_t *suh, uint16_t *svh,
                       muse_pool *pool, muse_progress_fn progress, void *progress_ctx, muse_err *e)
{
    if (check_quant_args(W, k, n, bits, e)) return -1;
    uint64_t rng = seed;
    quant_job q = {.k = k, .n = n, .bits = bits, .cb = cb, .su = suh, .sv = svh, .gain = 1.0f};
    q.m = MUSE_MALLOC((size_t)(k * n) * sizeof(float));
    memcpy(q.m, W, (size_t)(k * n) * sizeof(float));
    output_scales(W, k, n, &rng, svh);
    muse_pool_run(pool, rows_divide_sv_hadamard, &q, (long)k);

    double *su0 = MUSE_MALLOC((size_t)k * sizeof(double));
    input_scales(q.m, k, n, &rng, cb, su0);
    /* a trial rotation with unit gain picks the gain, then the final su includes it */
    float *rotated_copy = MUSE_MALLOC((size_t)(k * n) * sizeof(float));
    memcpy(rotated_copy, q.m, (size_t)(k * n) * sizeof(float));
    for (int64_t i = 0; i < k; i++) suh[i] = safe_scale_f16(su0[i]);
    muse_pool_run(pool, blocks_divide_su_hadamard, &q, (long)(k / MUSE_EXL3_HAD));
    float gain = search_gain(&q, pool);
    for (int64_t i = 0; i < k; i++) suh[i] = safe_scale_f16(su0[i] / gain);
    memcpy(q.m, rotated_copy, (size_t)(k * n) * sizeof(float));
    free(rotated_copy);
    free(su0);
    muse_pool_run(pool, blocks_divide_su_hadamard, &q, (long)(k / MUSE_EXL3_HAD));

    /* step 5 in batches so progress is reported from this thread */
    long total = (long)(k / 16 * (n / 16));
    long batch = 32L * muse_pool_threads(pool);
    long *list = MUSE_MALLOC((size_t)batch * sizeof(long));
    q.trellis = trellis;
    q.gain = 1.0f;
    q.tile_list = list;
    for (long done = 0; done < total; done += batch) {
        long count = total - done < batch ? total - done : batch;
        for (long i = 0; i < count; i++) list[i] = done + i;
        muse_pool_run(pool, tiles_viterbi, &q, count);
        if (progress) progress(progress_ctx, done + count, total);
    }
    free(list);
    free(q.m);
    return 0;
}
