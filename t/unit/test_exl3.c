/* EXL3 on the CPU: codebooks, bit stream, tiles, validation, dequant, linear, quantizer.
 * `test_exl3 --dump-table CB FILE` writes the 65536 fp16 values of codebook CB (t/exl3_tables.t).
 * `test_exl3 --dump-tensors CB BITS K N SEED DIR` writes a random EXL3 Linear plus its C dequant
 * and C linear of a random input as raw little-endian files for the NumPy reference. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pack/exl3.h"
#include "pack/exl3_quant.h"
#include "tap.h"
#include "base/threadpool.h"

/* ---- deterministic random numbers (splitmix64) ---- */

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_uniform(void)
{
    return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0);
}
static double rng_gauss(void)
{
    double u1 = rng_uniform(), u2 = rng_uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- an independent bit-stream packer and state reader (bit by bit) ---- */

static void pack_symbols(const uint32_t *sym, int bits, uint16_t *tile)
{
    int total = 256 * bits;
    uint8_t stream[256 * 8] = {0};
    for (int p = 0; p < 256; p++)
        for (int b = 0; b < bits; b++) stream[p * bits + b] = (sym[p] >> (bits - 1 - b)) & 1;
    for (int j = 0; j < total / 32; j++) {
        uint32_t word = 0;
        for (int b = 0; b < 32; b++) word = word << 1 | stream[32 * j + b];
        tile[2 * j] = (uint16_t)(word & 0xFFFF);
        tile[2 * j + 1] = (uint16_t)(word >> 16);
    }
}

static uint16_t slow_state(const uint16_t *tile, int bits, int p)
{
    int total = 256 * bits;
    uint32_t s = 0;
    for (int i = 0; i < 16; i++) {
        int bit = ((p + 1) * bits - 16 + i + total) % total;
        int j = bit / 32, off = bit % 32;
        uint32_t word = (uint32_t)tile[2 * j] | (uint32_t)tile[2 * j + 1] << 16;
        s = s << 1 | ((word >> (31 - off)) & 1);
    }
    return (uint16_t)s;
}

/* ---- building tensors ---- */

static muse_tensor tensor(muse_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2,
                          const void *data)
{
    muse_tensor t;
    memset(&t, 0, sizeof t);
    t.name = "test";
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    t.numel = 1;
    for (int i = 0; i < ndim; i++) t.numel *= t.shape[i];
    t.data = data;
    t.nbytes = (size_t)t.numel * (dt == MUSE_DT_I32 || dt == MUSE_DT_F32 ? 4 : 2);
    return t;
}

/* A random Linear: trellis, suh, svh (fp16 near +-1 scales), bias. Owns its buffers. */
typedef struct {
    int64_t k, n;
    int bits;
    uint16_t *trellis, *suh, *svh, *bias;
    int32_t marker;
    muse_tensor t_trellis, t_suh, t_svh, t_bias, t_marker;
    muse_exl3_weight w;
} random_linear;

static void make_random_linear(random_linear *L, int64_t k, int64_t n, int bits, muse_codebook cb,
                               int with_bias)
{
    memset(L, 0, sizeof *L);
    L->k = k;
    L->n = n;
    L->bits = bits;
    size_t tlen = (size_t)(k / 16) * (size_t)(n / 16) * 16 * (size_t)bits;
    L->trellis = malloc(tlen * 2);
    L->suh = malloc((size_t)k * 2);
    L->svh = malloc((size_t)n * 2);
    L->bias = malloc((size_t)n * 2);
    for (size_t i = 0; i < tlen; i++) L->trellis[i] = (uint16_t)rng_next();
    for (int64_t i = 0; i < k; i++)
        L->suh[i] = muse_f32_to_f16((float)((rng_next() & 1 ? -1 : 1) * (0.5 + rng_uniform())));
    for (int64_t i = 0; i < n; i++)
        L->svh[i] =
            muse_f32_to_f16((float)((rng_next() & 1 ? -1 : 1) * (0.01 + 0.02 * rng_uniform())));
    for (int64_t i = 0; i < n; i++) L->bias[i] = muse_f32_to_f16((float)(0.1 * rng_gauss()));
    L->t_trellis = tensor(MUSE_DT_I16, 3, k / 16, n / 16, 16 * bits, L->trellis);
    L->t_suh = tensor(MUSE_DT_F16, 1, k, 0, 0, L->suh);
    L->t_svh = tensor(MUSE_DT_F16, 1, n, 0, 0, L->svh);
    L->t_bias = tensor(MUSE_DT_F16, 1, n, 0, 0, L->bias);
    L->t_marker = tensor(MUSE_DT_I32, 0, 0, 0, 0, &L->marker);
    muse_err e;
    int rc = muse_exl3_from_tensors("test.lin", &L->t_trellis, &L->t_suh, &L->t_svh, NULL, NULL,
                                    cb == MUSE_CB_MCG ? &L->t_marker : NULL,
                                    cb == MUSE_CB_MUL1 ? &L->t_marker : NULL,
                                    with_bias ? &L->t_bias : NULL, &L->w, &e);
    if (rc) {
        printf("Bail out! %s\n", e.msg);
        exit(1);
    }
}

static void free_random_linear(random_linear *L)
{
    free(L->trellis);
    free(L->suh);
    free(L->svh);
    free(L->bias);
}

/* ---- codebook tests ---- */

static void test_codebooks(void)
{
    muse_codebook cb;
    ok(muse_codebook_parse("mul1", &cb) == 0 && cb == MUSE_CB_MUL1, "parse mul1");
    ok(muse_codebook_parse("mcg", &cb) == 0 && cb == MUSE_CB_MCG, "parse mcg");
    ok(muse_codebook_parse("3inst", &cb) == 0 && cb == MUSE_CB_3INST, "parse 3inst");
    ok(muse_codebook_parse("MUL2", &cb) == -1, "parse refuses an unknown codebook");
    is_str(muse_codebook_name(MUSE_CB_3INST), "3inst", "name 3inst");

    struct {
        muse_codebook cb;
        uint32_t state;
        double want;
    } checks[] = {
        {MUSE_CB_3INST, 0, 0.76806640625},     {MUSE_CB_3INST, 1, -0.91943359375},
        {MUSE_CB_3INST, 0xFFFF, -0.158203125}, {MUSE_CB_MCG, 0, 1.84375},
        {MUSE_CB_MCG, 1, 0.134521484375},      {MUSE_CB_MCG, 0xFFFF, 0.85009765625},
        {MUSE_CB_MUL1, 0, -3.453125},          {MUSE_CB_MUL1, 1, 0.64111328125},
        {MUSE_CB_MUL1, 0xFFFF, -0.6513671875},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        double got = muse_f16_to_f32(muse_exl3_state_value(checks[i].state, checks[i].cb));
        ok(got == checks[i].want, "%s(0x%X) = %.12g (want %.12g)", muse_codebook_name(checks[i].cb),
           checks[i].state, got, checks[i].want);
    }
    const double want_rms[3] = {1.24371, 1.24411, 1.00031};
    for (int c = 0; c < 3; c++) {
        double rms = muse_exl3_codebook_rms((muse_codebook)c);
        ok(fabs(rms - want_rms[c]) <= 5e-6, "RMS of %s over all states = %.7f (spec %.5f)",
           muse_codebook_name((muse_codebook)c), rms, want_rms[c]);
        const float *table = muse_exl3_value_table((muse_codebook)c);
        int same = 1;
        for (uint32_t s = 0; s < 65536; s++)
            same &= table[s] == muse_f16_to_f32(muse_exl3_state_value(s, (muse_codebook)c));
        ok(same, "%s value table equals muse_exl3_state_value",
           muse_codebook_name((muse_codebook)c));
    }
    /* MUL1 with one rounding differs from two fp16 operations for most byte sums */
    int differ = 0;
    for (uint32_t s = 1024; s <= 2044; s++) {
        float prod = muse_round_f16((float)s * muse_f16_to_f32(0x1EEE));
        float two = muse_round_f16(prod + muse_f16_to_f32(0xC931));
        float one =
            muse_round_f16((float)((double)s * muse_f16_to_f32(0x1EEE) + muse_f16_to_f32(0xC931)));
        differ += two != one;
    }
    diag("MUL1: one rounding differs from two for %d of 1021 byte sums", differ);
}

/* ---- bit stream ---- */

static void test_stream_vectors(void)
{
    struct {
        int bits;
        uint16_t stored[4], states[4];
    } vec[] = {
        {4, {0x4567, 0x0123, 0xCDEF, 0x89AB}, {0xDEF0, 0xEF01, 0xF012, 0x0123}},
        {3, {0x7705, 0x0539, 0x0539, 0x3977}, {0xCBB8, 0x5DC1, 0xEE0A, 0x7053}},
        {2, {0x1B1B, 0x1B1B, 0x1B1B, 0x1B1B}, {0x6C6C, 0xB1B1, 0xC6C6, 0x1B1B}},
    };
    for (int v = 0; v < 3; v++) {
        int bits = vec[v].bits;
        uint32_t sym[256];
        uint16_t tile[16 * 8], states[256];
        for (int p = 0; p < 256; p++) sym[p] = (uint32_t)p % (1u << bits);
        pack_symbols(sym, bits, tile);
        ok(memcmp(tile, vec[v].stored, sizeof vec[v].stored) == 0,
           "bits %d: packed symbols p mod %d begin %04X %04X %04X %04X", bits, 1 << bits, tile[0],
           tile[1], tile[2], tile[3]);
        muse_exl3_tile_states(tile, bits, states);
        ok(memcmp(states, vec[v].states, sizeof vec[v].states) == 0,
           "bits %d: states of p=0..3 are %04X %04X %04X %04X", bits, states[0], states[1],
           states[2], states[3]);
    }
    /* every bits width, random symbols: fast reader == bit-by-bit reader, and the state's low
     * bits are the symbol */
    for (int bits = 1; bits <= 8; bits++) {
        uint32_t sym[256];
        uint16_t tile[16 * 8], states[256];
        for (int p = 0; p < 256; p++) sym[p] = (uint32_t)rng_next() & ((1u << bits) - 1);
        pack_symbols(sym, bits, tile);
        muse_exl3_tile_states(tile, bits, states);
        int good = 1;
        for (int p = 0; p < 256; p++) {
            good &= states[p] == slow_state(tile, bits, p);
            good &= (states[p] & ((1u << bits) - 1)) == sym[p];
            good &= states[p] == (uint16_t)((states[(p + 255) % 256] << bits) | sym[p]);
        }
        ok(good, "bits %d: states match a bit-by-bit reader and the tail-biting recurrence", bits);
    }
}

static void test_positions(void)
{
    int seen[256] = {0}, r, c, good = 1;
    for (int p = 0; p < 256; p++) {
        muse_exl3_position_element(p, &r, &c);
        good &= r >= 0 && r < 16 && c >= 0 && c < 16;
        if (good) seen[r * 16 + c]++;
    }
    for (int i = 0; i < 256; i++) good &= seen[i] == 1;
    ok(good, "position -> element is a bijection onto the 16x16 tile");
    struct {
        int p, r, c;
    } spots[] = {{0, 0, 0}, {1, 1, 0},  {2, 8, 0},  {3, 9, 0},     {4, 0, 8},    {7, 9, 8},
                 {8, 2, 0}, {24, 6, 0}, {32, 0, 1}, {255, 15, 15}, {250, 14, 7}, {100, 0, 11}};
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        muse_exl3_position_element(spots[i].p, &r, &c);
        ok(r == spots[i].r && c == spots[i].c, "p=%d -> row %d col %d", spots[i].p, r, c);
    }
    /* decode_tile puts state p's value at its element */
    for (int cb = 0; cb < 3; cb++) {
        uint16_t tile[16 * 5], states[256];
        float w[16][16];
        for (int i = 0; i < 16 * 5; i++) tile[i] = (uint16_t)rng_next();
        muse_exl3_tile_states(tile, 5, states);
        muse_exl3_decode_tile(tile, 5, (muse_codebook)cb, w);
        int same = 1;
        for (int p = 0; p < 256; p++) {
            muse_exl3_position_element(p, &r, &c);
            same &= w[r][c] == muse_f16_to_f32(muse_exl3_state_value(states[p], (muse_codebook)cb));
        }
        ok(same, "%s: decode_tile places the value of state p at element (r, c) of p",
           muse_codebook_name((muse_codebook)cb));
    }
}

/* ---- validation ---- */

static void expect_refusal(const char *what, const char *needle, const muse_tensor *tr,
                           const muse_tensor *suh, const muse_tensor *svh, const muse_tensor *su,
                           const muse_tensor *sv, const muse_tensor *mcg, const muse_tensor *mul1,
                           const muse_tensor *bias)
{
    muse_exl3_weight w;
    muse_err e = {{0}};
    int rc = muse_exl3_from_tensors("m.l0.q", tr, suh, svh, su, sv, mcg, mul1, bias, &w, &e);
    ok(rc == -1 && strstr(e.msg, needle) != NULL, "refuses %s: %s", what, e.msg);
}

static void test_validation(void)
{
    static uint16_t tr[8 * 8 * 16 * 9], suh[256], svh[256], su[16], sv[16], bias[256];
    static int32_t marker;
    for (size_t i = 0; i < sizeof suh / 2; i++) suh[i] = svh[i] = bias[i] = 0x3C00;
    muse_tensor t = tensor(MUSE_DT_I16, 3, 8, 16, 48, tr); /* k=128 n=256 bits 3 */
    muse_tensor th = tensor(MUSE_DT_F16, 1, 128, 0, 0, suh),
                tv = tensor(MUSE_DT_F16, 1, 256, 0, 0, svh);
    muse_tensor tu = tensor(MUSE_DT_I16, 1, 8, 0, 0, su), tw = tensor(MUSE_DT_I16, 1, 16, 0, 0, sv);
    muse_tensor tm = tensor(MUSE_DT_I32, 0, 0, 0, 0, &marker);
    muse_tensor tb = tensor(MUSE_DT_F16, 1, 256, 0, 0, bias);
    muse_exl3_weight w;
    muse_err e;
    ok(muse_exl3_from_tensors("m.l0.q", &t, &th, &tv, NULL, NULL, NULL, &tm, &tb, &w, &e) == 0 &&
           w.k == 128 && w.n == 256 && w.bits == 3 && w.cb == MUSE_CB_MUL1 && w.bias == bias &&
           w.suh == suh && w.su == NULL,
       "accepts a MUL1 Linear with bias: k=128 n=256 bits 3");
    ok(muse_exl3_from_tensors("m.l0.q", &t, NULL, NULL, &tu, &tw, &tm, NULL, NULL, &w, &e) == 0 &&
           w.cb == MUSE_CB_MCG && w.suh == NULL && w.su == su && w.bias == NULL,
       "accepts an MCG Linear with legacy su/sv");
    ok(muse_exl3_from_tensors("m.l0.q", &t, &th, &tv, NULL, NULL, NULL, NULL, NULL, &w, &e) == 0 &&
           w.cb == MUSE_CB_3INST,
       "no marker: 3INST");

    muse_tensor bad = t;
    bad.dtype = MUSE_DT_F16;
    expect_refusal("trellis fp16", "m.l0.q.trellis", &bad, &th, &tv, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_I16, 2, 8, 16 * 48, 0, tr);
    expect_refusal("trellis 2-dim", "m.l0.q.trellis", &bad, &th, &tv, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_I16, 3, 8, 8, 144, tr);
    expect_refusal("bits 9 (last dim 144)", "last dim 144", &bad, &th, &tv, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_I16, 3, 8, 16, 0, tr);
    expect_refusal("bits 0 (last dim 0)", "m.l0.q.trellis", &bad, &th, &tv, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_I16, 3, 8, 16, 40, tr);
    expect_refusal("last dim 40 not 16*bits", "last dim 40", &bad, &th, &tv, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_I16, 3, 4, 16, 48, tr);
    expect_refusal("k = 64 not a multiple of 128", "k=64", &bad, &th, &tv, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_I16, 3, 8, 12, 48, tr);
    expect_refusal("n = 192 not a multiple of 128", "n=192", &bad, &th, &tv, 0, 0, 0, 0, 0);
    expect_refusal("missing trellis", "m.l0.q.trellis", NULL, &th, &tv, 0, 0, 0, 0, 0);

    bad = th;
    bad.dtype = MUSE_DT_BF16;
    expect_refusal("suh bf16", "m.l0.q.suh", &t, &bad, &tv, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_F16, 1, 256, 0, 0, suh);
    expect_refusal("suh length 256 for k=128", "m.l0.q.suh", &t, &bad, &tv, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_F16, 1, 128, 0, 0, svh);
    expect_refusal("svh length 128 for n=256", "m.l0.q.svh", &t, &th, &bad, 0, 0, 0, 0, 0);
    expect_refusal("suh without svh", "m.l0.q.svh", &t, &th, NULL, 0, 0, 0, 0, 0);
    expect_refusal("neither suh nor su", "m.l0.q.suh", &t, NULL, NULL, 0, 0, 0, 0, 0);
    bad = tensor(MUSE_DT_I16, 1, 128, 0, 0, su);
    expect_refusal("su length 128 (want k/16=8)", "m.l0.q.su", &t, 0, 0, &bad, &tw, 0, 0, 0);
    bad = tensor(MUSE_DT_F16, 1, 16, 0, 0, sv);
    expect_refusal("sv fp16", "m.l0.q.sv", &t, 0, 0, &tu, &bad, 0, 0, 0);
    expect_refusal("su without sv", "m.l0.q.sv", &t, 0, 0, &tu, NULL, 0, 0, 0);
    bad = tensor(MUSE_DT_I32, 1, 1, 0, 0, &marker);
    expect_refusal("mcg 1-dim", "m.l0.q.mcg", &t, &th, &tv, 0, 0, &bad, 0, 0);
    bad = tensor(MUSE_DT_I16, 0, 0, 0, 0, &marker);
    expect_refusal("mul1 int16", "m.l0.q.mul1", &t, &th, &tv, 0, 0, 0, &bad, 0);
    expect_refusal("both markers", "m.l0.q.mul1", &t, &th, &tv, 0, 0, &tm, &tm, 0);
    bad = tensor(MUSE_DT_F32, 1, 256, 0, 0, bias);
    expect_refusal("bias fp32", "m.l0.q.bias", &t, &th, &tv, 0, 0, 0, 0, &bad);
    bad = tensor(MUSE_DT_F16, 1, 128, 0, 0, bias);
    expect_refusal("bias length 128 for n=256", "m.l0.q.bias", &t, &th, &tv, 0, 0, 0, 0, &bad);
}

/* ---- dequant and linear ---- */

static double hadamard_entry(int i, int j)
{
    return (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) / sqrt(128.0);
}

/* diag(suh) Hk Wq Hn diag(svh) in double, straight from the definition. */
static double *reference_dequant(const muse_exl3_weight *w)
{
    int64_t k = w->k, n = w->n;
    double *wq = calloc((size_t)(k * n), sizeof(double)),
           *m = calloc((size_t)(k * n), sizeof(double)),
           *out = calloc((size_t)(k * n), sizeof(double));
    for (int64_t tk = 0; tk < k / 16; tk++)
        for (int64_t tn = 0; tn < n / 16; tn++) {
            uint16_t states[256];
            muse_exl3_tile_states(w->trellis + (tk * (n / 16) + tn) * 16 * w->bits, w->bits,
                                  states);
            for (int p = 0; p < 256; p++) {
                int r, c;
                muse_exl3_position_element(p, &r, &c);
                wq[(tk * 16 + r) * n + tn * 16 + c] =
                    muse_f16_to_f32(muse_exl3_state_value(states[p], w->cb));
            }
        }
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t b = j / 128 * 128; b < j / 128 * 128 + 128; b++)
                s += wq[i * n + b] * hadamard_entry((int)(b % 128), (int)(j % 128));
            m[i * n + j] = s;
        }
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t a = i / 128 * 128; a < i / 128 * 128 + 128; a++)
                s += hadamard_entry((int)(i % 128), (int)(a % 128)) * m[a * n + j];
            out[i * n + j] = s * muse_exl3_in_scale(w, i) * muse_exl3_out_scale(w, j);
        }
    free(wq);
    free(m);
    return out;
}

static double rel_rms_error(const float *got, const double *want, size_t len)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < len; i++) {
        d += (got[i] - want[i]) * (got[i] - want[i]);
        s += want[i] * want[i];
    }
    return sqrt(d / s);
}

static void test_dequant_and_linear(muse_pool *pool)
{
    for (int cb = 0; cb < 3; cb++) {
        random_linear L;
        int bits = 2 + cb;
        make_random_linear(&L, 256, 384, bits, (muse_codebook)cb, 1);
        size_t kn = (size_t)(L.k * L.n);
        float *deq = malloc(kn * sizeof(float));
        muse_exl3_dequant(&L.w, deq, pool);
        double *ref = reference_dequant(&L.w);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < kn; i++) {
            worst = fmax(worst, fabs(deq[i] - ref[i]));
            scale += ref[i] * ref[i];
        }
        scale = sqrt(scale / (double)kn);
        ok(worst <= 1e-5 * scale && scale > 0,
           "%s bits %d: dequant vs double reference: max err %.3g of RMS %.3g",
           muse_codebook_name((muse_codebook)cb), bits, worst / scale, scale);

        /* linear vs x W_deq in double: only the fp16 rounding of the A operand differs, a
         * relative error <= 2^-11 per element that averages to about 2^-11/sqrt(3) = 2.8e-4 */
        long rows = 7;
        float *x = malloc((size_t)rows * (size_t)L.k * sizeof(float));
        float *y = malloc((size_t)rows * (size_t)L.n * sizeof(float));
        double *yref = calloc((size_t)rows * (size_t)L.n, sizeof(double));
        for (long i = 0; i < rows * L.k; i++) x[i] = (float)rng_gauss();
        for (long r = 0; r < rows; r++)
            for (int64_t j = 0; j < L.n; j++) {
                double s = 0;
                for (int64_t i = 0; i < L.k; i++) s += (double)x[r * L.k + i] * ref[i * L.n + j];
                yref[r * L.n + j] = s + muse_f16_to_f32(L.bias[j]);
            }
        void *ws = malloc(muse_exl3_workspace_bytes(&L.w, rows));
        muse_exl3_linear(&L.w, x, rows, y, ws, pool);
        double err = rel_rms_error(y, yref, (size_t)(rows * L.n));
        ok(err < 6e-4 && err > 0, "%s: linear vs x W_deq: relative RMS error %.3g (fp16 A operand)",
           muse_codebook_name((muse_codebook)cb), err);

        float *one = malloc((size_t)L.n * sizeof(float));
        int same = 1;
        for (long r = 0; r < rows; r++) {
            muse_exl3_linear(&L.w, x + r * L.k, 1, one, NULL, r % 2 ? NULL : pool);
            same &= memcmp(one, y + r * L.n, (size_t)L.n * sizeof(float)) == 0;
        }
        ok(same, "%s: each row alone (1 or 2 threads) is bit-identical to it inside a batch of 7",
           muse_codebook_name((muse_codebook)cb));
        free(one);
        free(ws);
        free(x);
        free(y);
        free(yref);
        free(deq);
        free(ref);
        free_random_linear(&L);
    }
}

static void test_legacy_signs(muse_pool *pool)
{
    random_linear L;
    make_random_linear(&L, 256, 128, 3, MUSE_CB_MUL1, 0);
    uint16_t su[16], sv[8];
    for (int i = 0; i < 16; i++) su[i] = (uint16_t)rng_next();
    for (int i = 0; i < 8; i++) sv[i] = (uint16_t)rng_next();
    for (int i = 0; i < 256; i++) L.suh[i] = (su[i / 16] >> (i % 16)) & 1 ? 0xBC00 : 0x3C00;
    for (int i = 0; i < 128; i++) L.svh[i] = (sv[i / 16] >> (i % 16)) & 1 ? 0xBC00 : 0x3C00;
    muse_tensor tu = tensor(MUSE_DT_I16, 1, 16, 0, 0, su), tv = tensor(MUSE_DT_I16, 1, 8, 0, 0, sv);
    muse_exl3_weight legacy;
    muse_err e;
    ok(muse_exl3_from_tensors("t", &L.t_trellis, NULL, NULL, &tu, &tv, NULL, &L.t_marker, NULL,
                              &legacy, &e) == 0,
       "legacy su/sv accepted");
    float *a = malloc(256 * 128 * sizeof(float)), *b = malloc(256 * 128 * sizeof(float));
    muse_exl3_dequant(&L.w, a, pool);
    muse_exl3_dequant(&legacy, b, pool);
    ok(memcmp(a, b, 256 * 128 * sizeof(float)) == 0,
       "legacy su/sv dequant == suh/svh of +-1 (bit-identical)");
    float x[2 * 256], ya[2 * 128], yb[2 * 128];
    for (int i = 0; i < 512; i++) x[i] = (float)rng_gauss();
    muse_exl3_linear(&L.w, x, 2, ya, NULL, pool);
    muse_exl3_linear(&legacy, x, 2, yb, NULL, pool);
    ok(memcmp(ya, yb, sizeof ya) == 0, "legacy su/sv linear == suh/svh of +-1 (bit-identical)");
    free(a);
    free(b);
    free_random_linear(&L);
}

/* ---- quantizer ---- */

/* An independent, plain double-precision Viterbi over all 65536 states with the same two-pass
 * tail-biting scheme. Returns the cost of its path; *free_min gets the pass-1 minimum over
 * unconstrained paths (a lower bound for every tail-biting path). */
static double reference_viterbi(const float *target, int bits, const float *val, double *free_min)
{
    int E = 1 << (16 - bits);
    double *prev = malloc((size_t)E * sizeof(double)), *cur = malloc((size_t)E * sizeof(double));
    uint8_t *back = malloc((size_t)256 * (size_t)E);
    uint32_t wrap = 0, edge;
    for (int pass = 0; pass < 2; pass++) {
        for (int e = 0; e < E; e++) prev[e] = pass == 0 || (uint32_t)e == wrap ? 0 : INFINITY;
        for (int q = 0; q < 256; q++) {
            int p = pass == 0 ? (128 + q) % 256 : q;
            for (int e = 0; e < E; e++) cur[e] = INFINITY;
            for (uint32_t s = 0; s < 65536; s++) {
                double d = val[s] - target[p];
                double c = prev[s >> bits] + d * d;
                uint32_t e = s & (uint32_t)(E - 1);
                if (c < cur[e]) {
                    cur[e] = c;
                    back[(size_t)q * E + e] = (uint8_t)(s >> (16 - bits));
                }
            }
            memcpy(prev, cur, (size_t)E * sizeof(double));
        }
        if (pass == 0) {
            edge = 0;
            for (int e = 1; e < E; e++)
                if (prev[e] < prev[edge]) edge = (uint32_t)e;
            *free_min = prev[edge];
            for (int q = 255; q >= 128; q--)
                edge = (((uint32_t)back[(size_t)q * E + edge] << (16 - bits)) | edge) >> bits;
            wrap = edge;
        }
    }
    double cost = prev[wrap];
    free(prev);
    free(cur);
    free(back);
    return cost;
}

static double tile_cost(const uint16_t *tile, int bits, const float *val, const float *target)
{
    uint16_t states[256];
    muse_exl3_tile_states(tile, bits, states);
    double c = 0;
    for (int p = 0; p < 256; p++)
        c += ((double)val[states[p]] - target[p]) * ((double)val[states[p]] - target[p]);
    return c;
}

static void test_viterbi_tile(void)
{
    const int widths[] = {2, 4};
    for (int wi = 0; wi < 2; wi++) {
        int bits = widths[wi];
        muse_codebook cb = wi ? MUSE_CB_3INST : MUSE_CB_MUL1;
        const float *val = muse_exl3_value_table(cb);
        float target[256];
        for (int p = 0; p < 256; p++) target[p] = (float)(rng_gauss() * muse_exl3_codebook_rms(cb));
        void *scratch = malloc(muse_exl3_tile_scratch_bytes(bits));
        uint16_t tile[16 * 8];
        double got = muse_exl3_quantize_tile(target, bits, cb, tile, scratch);
        double decoded = tile_cost(tile, bits, val, target);
        ok(fabs(got - decoded) <= 1e-9 * decoded,
           "bits %d: returned cost %.6f == cost of the packed tile %.6f", bits, got, decoded);
        int worse = 0;
        double best_random = INFINITY;
        for (int trial = 0; trial < 1000; trial++) {
            uint32_t sym[256];
            uint16_t rt[16 * 8];
            for (int p = 0; p < 256; p++) sym[p] = (uint32_t)rng_next() & ((1u << bits) - 1);
            pack_symbols(sym, bits, rt);
            double c = tile_cost(rt, bits, val, target);
            worse += c >= decoded;
            best_random = fmin(best_random, c);
        }
        is_int(worse, 1000,
               "bits %d: chosen path (%.3f) beats 1000 random tail-biting paths (best %.3f)", bits,
               decoded, best_random);
        double lower, ref = reference_viterbi(target, bits, val, &lower);
        ok(decoded <= ref * (1 + 1e-4) && decoded >= lower * (1 - 1e-4),
           "bits %d: cost %.5f vs independent double Viterbi %.5f (free-start lower bound %.5f)",
           bits, decoded, ref, lower);
        free(scratch);
    }
}

static void test_quantize(muse_pool *pool)
{
    /* measured relative RMS errors (k=n=256, Gaussian, MUL1 and 3INST): 0.262, 0.132, 0.067 */
    const double bound[5] = {0, 0, 0.29, 0.15, 0.076};
    int64_t k = 256, n = 256;
    float *W = malloc((size_t)(k * n) * sizeof(float)),
          *deq = malloc((size_t)(k * n) * sizeof(float));
    for (int64_t i = 0; i < k * n; i++) W[i] = (float)(0.02 * rng_gauss());
    for (int bits = 2; bits <= 4; bits++) {
        for (int c = 0; c < 2; c++) {
            muse_codebook cb = c ? MUSE_CB_3INST : MUSE_CB_MUL1;
            random_linear L;
            make_random_linear(&L, k, n, bits, cb, 0);
            muse_err e;
            int rc = muse_exl3_quantize(W, k, n, bits, cb, 42, L.trellis, L.suh, L.svh, pool, NULL,
                                        NULL, &e);
            muse_exl3_dequant(&L.w, deq, pool);
            double d = 0, s = 0;
            for (int64_t i = 0; i < k * n; i++) {
                d += (double)(deq[i] - W[i]) * (deq[i] - W[i]);
                s += (double)W[i] * W[i];
            }
            double rel = sqrt(d / s);
            ok(rc == 0 && rel < bound[bits] && rel > 0.5 * bound[bits],
               "%s bits %d: quantize + dequant of a Gaussian matrix: relative RMS error %.4f "
               "(bound %.3f)",
               muse_codebook_name(cb), bits, rel, bound[bits]);
            free_random_linear(&L);
        }
    }
    /* same output for 1 and 2 threads */
    size_t tlen = (size_t)(k / 16 * (n / 16) * 16 * 3);
    uint16_t *t1 = malloc(tlen * 2), *t2 = malloc(tlen * 2), s1[512], s2[512];
    muse_err e;
    muse_exl3_quantize(W, k, n, 3, MUSE_CB_MCG, 7, t1, s1, s1 + 256, NULL, NULL, NULL, &e);
    muse_exl3_quantize(W, k, n, 3, MUSE_CB_MCG, 7, t2, s2, s2 + 256, pool, NULL, NULL, &e);
    ok(memcmp(t1, t2, tlen * 2) == 0 && memcmp(s1, s2, sizeof s1) == 0,
       "quantize: 1 and 2 threads give identical tensors");
    ok(muse_exl3_quantize(W, 192, n, 3, MUSE_CB_MCG, 7, t1, s1, s1 + 256, NULL, NULL, NULL, &e) ==
               -1 &&
           strstr(e.msg, "128") != NULL,
       "quantize refuses k=192: %s", e.msg);
    W[5] = NAN;
    ok(muse_exl3_quantize(W, k, n, 3, MUSE_CB_MCG, 7, t1, s1, s1 + 256, NULL, NULL, NULL, &e) == -1,
       "quantize refuses a NaN weight: %s", e.msg);
    free(t1);
    free(t2);
    free(W);
    free(deq);
}

/* ---- speed (reported, not asserted) ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void report_speed(muse_pool *pool)
{
    random_linear L;
    make_random_linear(&L, 1024, 1024, 4, MUSE_CB_MUL1, 0);
    float w[16][16];
    double t0 = now_s(), sink = 0;
    long tiles = (long)(L.k / 16 * (L.n / 16));
    for (long i = 0; i < tiles; i++) {
        muse_exl3_decode_tile(L.trellis + i * 64, 4, MUSE_CB_MUL1, w);
        sink += w[3][5];
    }
    double t1 = now_s();
    diag("tile decode: %.2f ns/weight (1 thread, bits 4, MUL1)%s",
         (t1 - t0) * 1e9 / (double)(tiles * 256), sink == 12345.678 ? "!" : "");
    float *x = malloc(1024 * sizeof(float)), *y = malloc(1024 * sizeof(float));
    for (int i = 0; i < 1024; i++) x[i] = (float)rng_gauss();
    t0 = now_s();
    for (int r = 0; r < 10; r++) muse_exl3_linear(&L.w, x, 1, y, NULL, pool);
    t1 = now_s();
    diag("linear 1 row: %.2f ns/weight (%d threads)", (t1 - t0) * 1e9 / (10.0 * 1024 * 1024),
         muse_pool_threads(pool));
    free(x);
    free(y);
    free_random_linear(&L);

    int64_t k = 128, n = 256;
    float *W = malloc((size_t)(k * n) * sizeof(float));
    uint16_t *tr = malloc((size_t)(k * n) * 2), sc[384];
    for (int64_t i = 0; i < k * n; i++) W[i] = (float)rng_gauss();
    muse_err e;
    for (int bits = 2; bits <= 6; bits += 4) {
        t0 = now_s();
        muse_exl3_quantize(W, k, n, bits, MUSE_CB_MUL1, 1, tr, sc, sc + 128, pool, NULL, NULL, &e);
        t1 = now_s();
        diag("quantize bits %d: %.0f ns/weight (%d threads, incl. gain search)", bits,
             (t1 - t0) * 1e9 / (double)(k * n), muse_pool_threads(pool));
    }
    free(W);
    free(tr);
}

/* ---- dump modes for t/exl3_tables.t ---- */

static int dump_table(const char *name, const char *path)
{
    muse_codebook cb;
    if (muse_codebook_parse(name, &cb)) {
        fprintf(stderr, "unknown codebook %s\n", name);
        return 2;
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 2;
    for (uint32_t s = 0; s < 65536; s++) {
        uint16_t v = muse_exl3_state_value(s, cb);
        uint8_t le[2] = {(uint8_t)(v & 0xFF), (uint8_t)(v >> 8)};
        fwrite(le, 1, 2, f);
    }
    return fclose(f) == 0 ? 0 : 2;
}

static int write_file(const char *dir, const char *name, const void *data, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t wrote = fwrite(data, 1, bytes, f);
    return fclose(f) == 0 && wrote == bytes ? 0 : -1;
}

/* Raw little-endian files (this test runs on little-endian hosts): trellis u16, suh/svh/bias
 * f16 bits, x f32 (5 x k), deq f32 (k x n), y f32 (5 x n). */
static int dump_tensors(char **argv)
{
    muse_codebook cb;
    if (muse_codebook_parse(argv[0], &cb)) return 2;
    int bits = atoi(argv[1]);
    int64_t k = atoll(argv[2]), n = atoll(argv[3]);
    rng_state = strtoull(argv[4], NULL, 10);
    const char *dir = argv[5];
    random_linear L;
    make_random_linear(&L, k, n, bits, cb, 1);
    long rows = 5;
    float *x = malloc((size_t)(rows * k) * sizeof(float)),
          *y = malloc((size_t)(rows * n) * sizeof(float));
    float *deq = malloc((size_t)(k * n) * sizeof(float));
    for (long i = 0; i < rows * k; i++) x[i] = (float)rng_gauss();
    muse_exl3_dequant(&L.w, deq, NULL);
    muse_exl3_linear(&L.w, x, rows, y, NULL, NULL);
    size_t tlen = (size_t)(k / 16 * (n / 16) * 16 * bits);
    int rc = write_file(dir, "trellis.bin", L.trellis, tlen * 2) ||
             write_file(dir, "suh.bin", L.suh, (size_t)k * 2) ||
             write_file(dir, "svh.bin", L.svh, (size_t)n * 2) ||
             write_file(dir, "bias.bin", L.bias, (size_t)n * 2) ||
             write_file(dir, "x.bin", x, (size_t)(rows * k) * 4) ||
             write_file(dir, "deq.bin", deq, (size_t)(k * n) * 4) ||
             write_file(dir, "y.bin", y, (size_t)(rows * n) * 4);
    free(x);
    free(y);
    free(deq);
    free_random_linear(&L);
    return rc ? 2 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--dump-table") == 0) return dump_table(argv[2], argv[3]);
    if (argc == 8 && strcmp(argv[1], "--dump-tensors") == 0) return dump_tensors(argv + 2);
    rng_state = 20260101;
    muse_pool *pool = muse_pool_create(2);
    test_codebooks();
    test_stream_vectors();
    test_positions();
    test_validation();
    test_legacy_signs(pool);
    test_dequant_and_linear(pool);
    test_viterbi_tile();
    test_quantize(pool);
    report_speed(pool);
    muse_pool_destroy(pool);
    return done_testing();
}
