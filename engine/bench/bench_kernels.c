/* muse-bench exl3 and quant: the EXL3 tile decode, the CPU linear and the quantizer. */
#include <stdbool.h>

#include "base/clock.h"
#include "bench.h"
#include "bench_table.h"
#include "base/flags.h"
#include "pack/exl3.h"
#include "pack/exl3_quant.h"
#include "base/muse_common.h"
#include "pack/pack_random.h"
#include "pack/safetensors.h"
#include "base/threadpool.h"

static uint16_t random_scale_f16(void)
{
    double m = 0.5 + (double)(bench_rng_next() >> 11) * (1.0 / 9007199254740992.0);
    return muse_f32_to_f16((float)((bench_rng_next() & 1) ? -m : m));
}

/* ns per weight of muse_exl3_decode_tile over ntiles random tiles, repeated for >= min_s. */
static double bench_decode_tiles(int bits, muse_codebook cb, double min_s)
{
    enum { NTILES = 4096 };
    size_t words = (size_t)16 * (size_t)bits;
    uint16_t *tiles = MUSE_MALLOC(NTILES * words * sizeof *tiles);
    for (size_t i = 0; i < NTILES * words; i++) tiles[i] = (uint16_t)bench_rng_next();
    (void)muse_exl3_value_table(cb); /* built once, outside the timing */
    static float w[16][16];
    volatile float sink = 0;
    long passes = 0;
    double t0 = muse_now_s(), t;
    do {
        for (int i = 0; i < NTILES; i++) {
            muse_exl3_decode_tile(tiles + (size_t)i * words, bits, cb, w);
            sink += w[i & 15][(i >> 4) & 15];
        }
        passes++;
        t = muse_now_s() - t0;
    } while (t < min_s && passes < 100000);
    (void)sink;
    free(tiles);
    return t * 1e9 / ((double)passes * NTILES * 256.0);
}

/* ns per call of muse_exl3_linear on a random k x n weight (one thread), for `rows` rows. */
static double bench_linear(int bits, muse_codebook cb, int64_t k, int64_t n, long rows,
                           double min_s)
{
    size_t tw = (size_t)(k / 16) * (size_t)(n / 16) * 16 * (size_t)bits;
    uint16_t *trellis = MUSE_MALLOC(tw * 2), *suh = MUSE_MALLOC((size_t)k * 2),
             *svh = MUSE_MALLOC((size_t)n * 2);
    for (size_t i = 0; i < tw; i++) trellis[i] = (uint16_t)bench_rng_next();
    for (int64_t i = 0; i < k; i++) suh[i] = random_scale_f16();
    for (int64_t i = 0; i < n; i++) svh[i] = random_scale_f16();
    muse_exl3_weight w = {.key = "bench",
                          .k = k,
                          .n = n,
                          .bits = bits,
                          .cb = cb,
                          .trellis = trellis,
                          .suh = suh,
                          .svh = svh};
    float *x = MUSE_MALLOC((size_t)(rows * k) * sizeof *x),
          *y = MUSE_MALLOC((size_t)(rows * n) * 4);
    for (long i = 0; i < rows * k; i++) x[i] = (float)muse_normal(7, (uint64_t)i);
    void *ws = MUSE_MALLOC(muse_exl3_workspace_bytes(&w, rows));
    muse_exl3_linear(&w, x, rows, y, ws, NULL); /* warm the value table and caches */
    long calls = 0;
    double t0 = muse_now_s(), t;
    do {
        muse_exl3_linear(&w, x, rows, y, ws, NULL);
        calls++;
        t = muse_now_s() - t0;
    } while (t < min_s && calls < 100000);
    free(ws);
    free(x);
    free(y);
    free(trellis);
    free(suh);
    free(svh);
    return t * 1e9 / (double)calls;
}

int bench_cmd_exl3(int argc, char **argv)
{
    const char *bits_s = "2,3,4,6", *cb_s = "mul1,mcg,3inst";
    bool as_json = false;
    double min_s = 0.3;
    long long kn = 2048;
    const muse_flag table[] = {
        MUSE_FLAG_S("bits", &bits_s, "2,3,4,6", "the bits to measure"),
        MUSE_FLAG_S("codebook", &cb_s, "mul1,mcg,3inst", "the codebooks to measure"),
        MUSE_FLAG_L("size", &kn, 128, 16384, "N", "the weight is N x N (a multiple of 128)"),
        MUSE_FLAG_D("min-s", &min_s, 0.01, 60, "S", "seconds each measure runs at least"),
        MUSE_FLAG_B("json", &as_json, "print JSON instead of a table"),
    };
    int rc = bench_parse_flags(
        "exl3",
        "EXL3 tile decode and muse_exl3_linear (1 and 8 rows), ns per weight, one thread.\n", table,
        sizeof table / sizeof *table, argc, argv);
    if (rc != MUSE_FLAGS_RUN) return rc;
    if (kn % 128)
        return bench_usage_error("exl3", "--size must be a multiple of 128 in [128, 16384]");
    char bl[8][16], cl[3][16];
    int nb = bench_split_list(bits_s, bl, 8), nc = bench_split_list(cb_s, cl, 3);
    if (nb <= 0) return bench_usage_error("exl3", "--bits must be a list like 2,3,4,6");
    if (nc <= 0) return bench_usage_error("exl3", "--codebook must be a list like mul1,mcg,3inst");
    int bits[8];
    muse_codebook cbs[3];
    for (int i = 0; i < nb; i++) {
        long long v;
        muse_err e = {{0}};
        if (muse_parse_int("--bits", bl[i], 1, 8, &v, &e)) return bench_usage_error("exl3", e.msg);
        bits[i] = (int)v;
    }
    for (int i = 0; i < nc; i++)
        if (muse_codebook_parse(cl[i], &cbs[i]))
            return bench_usage_error("exl3", "--codebook entries are mul1, mcg or 3inst");
    static const char *const cols[] = {"codebook",          "bits",
                                       "tile ns/weight",    "linear1 ns/weight",
                                       "linear8 ns/weight", "linear8 ns/(w*row)"};
    char title[160];
    snprintf(title, sizeof title,
             "EXL3 on the CPU, one thread: decode of random 16x16 tiles; muse_exl3_linear of a "
             "random %lldx%lld weight at 1 and 8 rows",
             kn, kn);
    bench_table t;
    bench_table_begin(&t, "exl3", title, cols, 6, as_json);
    for (int c = 0; c < nc; c++)
        for (int b = 0; b < nb; b++) {
            double tile = bench_decode_tiles(bits[b], cbs[c], min_s);
            double l1 = bench_linear(bits[b], cbs[c], kn, kn, 1, min_s) / (double)(kn * kn);
            double l8 = bench_linear(bits[b], cbs[c], kn, kn, 8, min_s) / (double)(kn * kn);
            const char *cells[] = {muse_codebook_name(cbs[c]), bench_fmt("%.0f", bits[b]),
                                   bench_fmt("%.3f", tile),    bench_fmt("%.3f", l1),
                                   bench_fmt("%.3f", l8),      bench_fmt("%.3f", l8 / 8)};
            bench_table_row(&t, cells);
        }
    bench_table_end(&t);
    return 0;
}

/* ---- quant: every Linear of a pack through muse_exl3_quantize ---- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static float tensor_f32(const muse_tensor *t, int64_t i)
{
    const uint16_t *h = t->data;
    if (t->dtype == MUSE_DT_F16) return muse_f16_to_f32(h[i]);
    if (t->dtype == MUSE_DT_BF16) return muse_bf16_to_f32(h[i]);
    float f;
    memcpy(&f, (const char *)t->data + 4 * i, 4);
    return f;
}

int bench_cmd_quant(int argc, char **argv)
{
    const char *pack = NULL;
    long long bits = 0, head_bits = 6, threads = 0;
    muse_codebook cb;
    bool as_json = false;
    muse_err e = {{0}};
    int cb_i = MUSE_CB_MUL1;
    const muse_flag table[] = {
        MUSE_FLAG_S("pack", &pack, "DIR", "an fp16/bf16 pack", .required = true),
        MUSE_FLAG_L("bits", &bits, 1, 8, "B", "bits of every Linear but the head",
                    .required = true),
        MUSE_FLAG_L("head-bits", &head_bits, 1, 8, "H", "bits of lm_head"),
        MUSE_FLAG_E("codebook", &cb_i, bench_codebooks, "the EXL3 codebook"),
        MUSE_FLAG_L("threads", &threads, 0, 1024, "N", "threads", .def = "0: one per core"),
        MUSE_FLAG_B("json", &as_json, "print JSON instead of a table"),
    };
    int prc = bench_parse_flags(
        "quant", "muse_exl3_quantize over every Linear of a pack, weights/s on all cores.\n", table,
        sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    cb = (muse_codebook)cb_i;
    if (!pack || !bits) return bench_usage_error("quant", "--pack DIR and --bits B are required");
    muse_st *st;
    if (muse_st_open(pack, &st, &e)) {
        fprintf(stderr, "muse-bench quant: %s\n", e.msg);
        return 1;
    }
    muse_pool *pool = muse_pool_create((int)threads);
    double q_time = 0, t_all = muse_now_s();
    uint64_t weights = 0;
    int linears = 0, rc = 0;
    for (size_t i = 0; i < muse_st_count(st) && rc == 0; i++) {
        const muse_tensor *tn = muse_st_at(st, i);
        bool head = ends_with(tn->name, "lm_head.weight");
        if (!(ends_with(tn->name, "_proj.weight") || head) || tn->ndim != 2) continue;
        int64_t n = tn->shape[0], k = tn->shape[1], np = (n + 127) / 128 * 128;
        if (k % 128) {
            fprintf(stderr, "muse-bench quant: %s: in_features %lld is not a multiple of 128\n",
                    tn->name, (long long)k);
            rc = 1;
            break;
        }
        float *W = MUSE_CALLOC((size_t)(k * np), sizeof *W);
        for (int64_t j = 0; j < n; j++)
            for (int64_t r = 0; r < k; r++) W[r * np + j] = tensor_f32(tn, j * k + r);
        int b = head ? (int)head_bits : (int)bits;
        uint16_t *trellis = MUSE_MALLOC((size_t)(k / 16 * np / 16 * 16 * b) * 2),
                 *suh = MUSE_MALLOC((size_t)k * 2), *svh = MUSE_MALLOC((size_t)np * 2);
        double t0 = muse_now_s();
        if (muse_exl3_quantize(W, k, np, b, cb, muse_hash_name(tn->name, 1), trellis, suh, svh,
                               pool, NULL, NULL, &e)) {
            fprintf(stderr, "muse-bench quant: %s: %s\n", tn->name, e.msg);
            rc = 1;
        }
        q_time += muse_now_s() - t0;
        weights += (uint64_t)(k * np);
        linears++;
        free(W);
        free(trellis);
        free(suh);
        free(svh);
    }
    t_all = muse_now_s() - t_all;
    if (rc == 0) {
        static const char *const cols[] = {"linears",    "weights", "bits (head)", "threads",
                                           "quantize s", "total s", "weights/s"};
        bench_table t;
        bench_table_begin(&t, "quant",
                          "muse_exl3_quantize over every Linear of a pack (total adds fp16 -> fp32 "
                          "transposes)",
                          cols, 7, as_json);
        char bb[32];
        snprintf(bb, sizeof bb, "%lld (%lld) %s", bits, head_bits, muse_codebook_name(cb));
        const char *cells[] = {bench_fmt("%.0f", linears),
                               bench_fmt("%.0f", (double)weights),
                               bb,
                               bench_fmt("%.0f", muse_pool_threads(pool)),
                               bench_fmt("%.2f", q_time),
                               bench_fmt("%.2f", t_all),
                               bench_fmt("%.0f", (double)weights / q_time)};
        bench_table_row(&t, cells);
        bench_table_note(&t, "pack", pack);
        bench_table_note(&t, "target", "tiny pack < 60 s on 2 cores");
        bench_table_end(&t);
    }
    muse_pool_destroy(pool);
    muse_st_close(st);
    return rc;
}
