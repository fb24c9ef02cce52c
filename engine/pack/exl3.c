#include "pack/exl3.h"

#include <math.h>
#include <pthread.h>

/* ---- codebooks ---- */

const char *muse_codebook_name(muse_codebook cb)
{
    switch (cb) {
    case MUSE_CB_3INST:
        return "3inst";
    case MUSE_CB_MCG:
        return "mcg";
    case MUSE_CB_MUL1:
        return "mul1";
    }
    return "?";
}

int muse_codebook_parse(const char *s, muse_codebook *cb)
{
    static const muse_codebook all[] = {MUSE_CB_3INST, MUSE_CB_MCG, MUSE_CB_MUL1};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, muse_codebook_name(all[i])) == 0) {
            *cb = all[i];
            return 0;
        }
    return -1;
}

uint16_t muse_exl3_state_value(uint32_t state, muse_codebook cb)
{
    return muse_exl3_decode(cb, state);
}

static float value_tables[3][65536];
static double codebook_rms[3];
static pthread_once_t table_once[3] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static void build_table(muse_codebook cb)
{
    double sq = 0;
    for (uint32_t s = 0; s < 65536; s++) {
        float v = muse_f16_to_f32(muse_exl3_state_value(s, cb));
        value_tables[cb][s] = v;
        sq += (double)v * v;
    }
    codebook_rms[cb] = sqrt(sq / 65536.0);
}
static void build_3inst(void)
{
    build_table(MUSE_CB_3INST);
}
static void build_mcg(void)
{
    build_table(MUSE_CB_MCG);
}
static void build_mul1(void)
{
    build_table(MUSE_CB_MUL1);
}

const float *muse_exl3_value_table(muse_codebook cb)
{
    static void (*const builders[3])(void) = {build_3inst, build_mcg, build_mul1};
    MUSE_CHECK((unsigned)cb < 3);
    pthread_once(&table_once[cb], builders[cb]);
    return value_tables[cb];
}

double muse_exl3_codebook_rms(muse_codebook cb)
{
    muse_exl3_value_table(cb);
    return codebook_rms[cb];
}

/* ---- tiles ---- */

void muse_exl3_tile_states(const uint16_t *tile, int bits, uint16_t states[256])
{
    MUSE_CHECK(bits >= 1 && bits <= MUSE_EXL3_MAX_BITS);
    for (int p = 0; p < 256; p++) states[p] = (uint16_t)muse_exl3_state(tile, bits, p);
}

void muse_exl3_position_element(int p, int *r, int *c)
{
    muse_exl3_elem(p, r, c);
}

/* position p -> offset r*16 + c, computed once */
static uint8_t position_offset[256];
static pthread_once_t position_once = PTHREAD_ONCE_INIT;
static void build_position_offset(void)
{
    for (int p = 0; p < 256; p++) {
        int r, c;
        muse_exl3_position_element(p, &r, &c);
        position_offset[p] = (uint8_t)(r * 16 + c);
    }
}

static void decode_tile_flat(const uint16_t *tile, int bits, const float *table, float *w256)
{
    uint16_t states[256];
    muse_exl3_tile_states(tile, bits, states);
    for (int p = 0; p < 256; p++) w256[position_offset[p]] = table[states[p]];
}

void muse_exl3_decode_tile(const uint16_t *tile, int bits, muse_codebook cb, float w[16][16])
{
    pthread_once(&position_once, build_position_offset);
    decode_tile_flat(tile, bits, muse_exl3_value_table(cb), &w[0][0]);
}

/* ---- validation ---- */

/* Local so this file does not need the safetensors reader linked in. */
static const char *dtype_name(muse_dtype dt)
{
    static const char *const names[] = {"F16", "BF16", "F32", "I16", "I32"};
    return (unsigned)dt < sizeof names / sizeof names[0] ? names[dt] : "unknown dtype";
}

static int check_vector(const char *key, const char *suffix, const muse_tensor *t, muse_dtype dtype,
                        int64_t len, muse_err *e)
{
    if (t->dtype != dtype || t->ndim != 1 || t->shape[0] != len || t->numel != len || !t->data ||
        t->nbytes != (size_t)len * 2)
        return muse_fail(e,
                         "EXL3 tensor %s.%s: want %s of shape (%lld), got %s with %d dims "
                         "(first %lld); re-quantize or fix the pack",
                         key, suffix, dtype_name(dtype), (long long)len, dtype_name(t->dtype),
                         t->ndim, (long long)(t->ndim > 0 ? t->shape[0] : 0));
    return 0;
}

static int check_marker(const char *key, const char *suffix, const muse_tensor *t, muse_err *e)
{
    if (t->dtype != MUSE_DT_I32 || t->ndim != 0 || t->numel != 1)
        return muse_fail(e,
                         "EXL3 tensor %s.%s: codebook marker must be an int32 scalar (0 dims), "
                         "got %s with %d dims",
                         key, suffix, dtype_name(t->dtype), t->ndim);
    return 0;
}

static int check_trellis(const char *key, const muse_tensor *t, muse_exl3_weight *w, muse_err *e)
{
    if (!t) return muse_fail(e, "EXL3 tensor %s.trellis is missing", key);
    if (t->dtype != MUSE_DT_I16 || t->ndim != 3)
        return muse_fail(e, "EXL3 tensor %s.trellis: want int16 with 3 dims, got %s with %d dims",
                         key, dtype_name(t->dtype), t->ndim);
    int64_t d0 = t->shape[0], d1 = t->shape[1], last = t->shape[2];
    if (last <= 0 || last % 16 != 0 || last / 16 > MUSE_EXL3_MAX_BITS)
        return muse_fail(e, "EXL3 tensor %s.trellis: last dim %lld is not 16*bits with bits 1..8",
                         key, (long long)last);
    const int64_t max_tiles = (int64_t)1 << 24; /* 2^28 rows: far beyond any model */
    if (d0 <= 0 || d1 <= 0 || d0 > max_tiles || d1 > max_tiles || (16 * d0) % MUSE_EXL3_HAD ||
        (16 * d1) % MUSE_EXL3_HAD)
        return muse_fail(e,
                         "EXL3 tensor %s.trellis: shape (%lld, %lld, %lld) gives k=%lld n=%lld; "
                         "both must be positive multiples of 128 (pad at quantization)",
                         key, (long long)d0, (long long)d1, (long long)last, (long long)(16 * d0),
                         (long long)(16 * d1));
    if (t->numel != d0 * d1 * last || t->nbytes != (size_t)t->numel * 2 || !t->data)
        return muse_fail(e, "EXL3 tensor %s.trellis: %zu bytes do not match its shape", key,
                         t->nbytes);
    w->k = 16 * d0;
    w->n = 16 * d1;
    w->bits = (int)(last / 16);
    w->trellis = t->data;
    w->tiles_ld = t->shape[1];
    return 0;
}

static int check_scales(const char *key, const muse_tensor *suh, const muse_tensor *svh,
                        const muse_tensor *su, const muse_tensor *sv, muse_exl3_weight *w,
                        muse_err *e)
{
    if (suh || svh) {
        if (!suh || !svh)
            return muse_fail(e, "EXL3 tensor %s.%s is missing (its pair %s.%s is present)", key,
                             suh ? "svh" : "suh", key, suh ? "suh" : "svh");
        if (check_vector(key, "suh", suh, MUSE_DT_F16, w->k, e) ||
            check_vector(key, "svh", svh, MUSE_DT_F16, w->n, e))
            return -1;
        w->suh = suh->data;
        w->svh = svh->data;
        return 0;
    }
    if (!su && !sv)
        return muse_fail(e, "EXL3 tensors %s.suh and %s.su are both missing: no input scales", key,
                         key);
    if (!su || !sv)
        return muse_fail(e, "EXL3 tensor %s.%s is missing (its pair %s.%s is present)", key,
                         su ? "sv" : "su", key, su ? "su" : "sv");
    if (check_vector(key, "su", su, MUSE_DT_I16, w->k / 16, e) ||
        check_vector(key, "sv", sv, MUSE_DT_I16, w->n / 16, e))
        return -1;
    w->su = su->data;
    w->sv = sv->data;
    return 0;
}

int muse_exl3_from_tensors(const char *key, const muse_tensor *trellis, const muse_tensor *suh,
                           const muse_tensor *svh, const muse_tensor *su, const muse_tensor *sv,
                           const muse_tensor *mcg, const muse_tensor *mul1, const muse_tensor *bias,
                           muse_exl3_weight *w, muse_err *e)
{
    memset(w, 0, sizeof *w);
    w->key = key;
    if (check_trellis(key, trellis, w, e) || check_scales(key, suh, svh, su, sv, w, e)) return -1;
    if (mcg && mul1)
        return muse_fail(e, "EXL3 tensors %s.mcg and %s.mul1 are both present: pick one codebook",
                         key, key);
    if ((mcg && check_marker(key, "mcg", mcg, e)) || (mul1 && check_marker(key, "mul1", mul1, e)))
        return -1;
    w->cb = mcg ? MUSE_CB_MCG : mul1 ? MUSE_CB_MUL1 : MUSE_CB_3INST;
    if (bias) {
        if (check_vector(key, "bias", bias, MUSE_DT_F16, w->n, e)) return -1;
        w->bias = bias->data;
    }
    return 0;
}

/* Tiles a trellis row holds: n / 16 for a whole tensor, more for a column slice. */
static int64_t tiles_ld(const muse_exl3_weight *w)
{
    return w->tiles_ld ? w->tiles_ld : w->n / 16;
}

float muse_exl3_in_scale(const muse_exl3_weight *w, int64_t i)
{
    if (w->suh) return muse_f16_to_f32(w->suh[i]);
    return (w->su[i >> 4] >> (i & 15)) & 1 ? -1.0f : 1.0f;
}

float muse_exl3_out_scale(const muse_exl3_weight *w, int64_t j)
{
    if (w->svh) return muse_f16_to_f32(w->svh[j]);
    return (w->sv[j >> 4] >> (j & 15)) & 1 ? -1.0f : 1.0f;
}

/* ---- Hadamard ---- */

#define HAD_SCALE 0.088388347648318440550f /* 1/sqrt(128) */

static void hadamard128(float *v)
{
    for (int h = 1; h < MUSE_EXL3_HAD; h <<= 1)
        for (int i = 0; i < MUSE_EXL3_HAD; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    for (int i = 0; i < MUSE_EXL3_HAD; i++) v[i] *= HAD_SCALE;
}

void muse_exl3_block_hadamard(float *v, int64_t len)
{
    MUSE_CHECK(len % MUSE_EXL3_HAD == 0);
    for (int64_t i = 0; i < len; i += MUSE_EXL3_HAD) hadamard128(v + i);
}

void muse_exl3_hadamard_columns(float *m, int64_t n)
{
    for (int h = 1; h < MUSE_EXL3_HAD; h <<= 1)
        for (int i = 0; i < MUSE_EXL3_HAD; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float *a = m + (int64_t)j * n, *b = m + (int64_t)(j + h) * n;
                for (int64_t c = 0; c < n; c++) {
                    float x = a[c], y = b[c];
                    a[c] = x + y;
                    b[c] = x - y;
                }
            }
    for (int64_t i = 0; i < MUSE_EXL3_HAD * n; i++) m[i] *= HAD_SCALE;
}

/* ---- dequantization ---- */

typedef struct {
    const muse_exl3_weight *w;
    float *out;
} dequant_job;

/* One 128-row block: decode its tiles, Hn on each row, Hk down each column, scales. */
static void dequant_blocks(void *ctx, long begin, long end)
{
    const dequant_job *job = ctx;
    const muse_exl3_weight *w = job->w;
    const float *table = muse_exl3_value_table(w->cb);
    int64_t n = w->n, ntiles = n / 16, tile_len = 16 * w->bits;
    float tw[256];
    for (long blk = begin; blk < end; blk++) {
        float *m = job->out + (int64_t)blk * MUSE_EXL3_HAD * n;
        for (int64_t tk = 0; tk < MUSE_EXL3_HAD / 16; tk++) {
            int64_t gtk = (int64_t)blk * (MUSE_EXL3_HAD / 16) + tk;
            for (int64_t tn = 0; tn < ntiles; tn++) {
                decode_tile_flat(w->trellis + (gtk * tiles_ld(w) + tn) * tile_len, w->bits, table,
                                 tw);
                for (int r = 0; r < 16; r++)
                    memcpy(m + (tk * 16 + r) * n + tn * 16, tw + r * 16, 16 * sizeof(float));
            }
        }
        for (int r = 0; r < MUSE_EXL3_HAD; r++) muse_exl3_block_hadamard(m + (int64_t)r * n, n);
        muse_exl3_hadamard_columns(m, n);
        for (int r = 0; r < MUSE_EXL3_HAD; r++) {
            float si = muse_exl3_in_scale(w, (int64_t)blk * MUSE_EXL3_HAD + r);
            float *row = m + (int64_t)r * n;
            for (int64_t c = 0; c < n; c++) row[c] = row[c] * si * muse_exl3_out_scale(w, c);
        }
    }
}

void muse_exl3_dequant(const muse_exl3_weight *w, float *out, muse_pool *pool)
{
    pthread_once(&position_once, build_position_offset);
    muse_exl3_value_table(w->cb);
    dequant_job job = {w, out};
    muse_pool_run(pool, dequant_blocks, &job, (long)(w->k / MUSE_EXL3_HAD));
}

/* ---- y = x W ---- */

/* The reference sums in double (more precise than the fp32 the format asks for) and rounds
 * to fp32 where a value is fp32, like the rest of the CPU backend: the fp16 rounding of the A
 * operand then flips only on exact boundaries. */
typedef struct {
    const muse_exl3_weight *w;
    const float *x;
    long rows;
    float *a;  /* rows x k: the fp16-rounded A operand */
    double *t; /* rows x n: a Wq */
    float *y;
} linear_job;

/* 128-point Hadamard in double: the same butterflies, then the scale. */
static void hadamard128_f64(double *v)
{
    for (int h = 1; h < MUSE_EXL3_HAD; h <<= 1)
        for (int i = 0; i < MUSE_EXL3_HAD; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                double a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    for (int i = 0; i < MUSE_EXL3_HAD; i++) v[i] *= 0.08838834764831844055; /* 1/sqrt(128) */
}

/* Steps 1-2: a = fp16(fp32(blockHad(x * suh))), one row at a time. */
static void linear_prepare_rows(void *ctx, long begin, long end)
{
    const linear_job *job = ctx;
    int64_t k = job->w->k;
    double chunk[MUSE_EXL3_HAD];
    for (long r = begin; r < end; r++) {
        const float *xr = job->x + (int64_t)r * k;
        float *ar = job->a + (int64_t)r * k;
        for (int64_t i0 = 0; i0 < k; i0 += MUSE_EXL3_HAD) {
            for (int i = 0; i < MUSE_EXL3_HAD; i++)
                chunk[i] = (double)(xr[i0 + i] * muse_exl3_in_scale(job->w, i0 + i));
            hadamard128_f64(chunk);
            for (int i = 0; i < MUSE_EXL3_HAD; i++) ar[i0 + i] = muse_round_f16((float)chunk[i]);
        }
    }
}

/* Step 3 for 16-column strips: t = a Wq, each sum in ascending k. */
static void linear_column_tiles(void *ctx, long begin, long end)
{
    const linear_job *job = ctx;
    const muse_exl3_weight *w = job->w;
    const float *table = muse_exl3_value_table(w->cb);
    int64_t k = w->k, n = w->n, tile_len = 16 * w->bits;
    float tw[256];
    for (long tn = begin; tn < end; tn++) {
        for (long r = 0; r < job->rows; r++)
            for (int c = 0; c < 16; c++) job->t[r * n + tn * 16 + c] = 0;
        for (int64_t tk = 0; tk < k / 16; tk++) {
            decode_tile_flat(w->trellis + (tk * tiles_ld(w) + tn) * tile_len, w->bits, table, tw);
            for (long r = 0; r < job->rows; r++) {
                const float *ar = job->a + r * k + tk * 16;
                double *tr = job->t + r * n + tn * 16;
                for (int i = 0; i < 16; i++) {
                    double ai = ar[i];
                    const float *wi = tw + i * 16;
                    for (int c = 0; c < 16; c++) tr[c] += ai * wi[c];
                }
            }
        }
    }
}

/* Steps 4-5: y = fp32(blockHad(t) * svh + bias). */
static void linear_finish_rows(void *ctx, long begin, long end)
{
    const linear_job *job = ctx;
    const muse_exl3_weight *w = job->w;
    int64_t n = w->n;
    for (long r = begin; r < end; r++) {
        double *tr = job->t + (int64_t)r * n;
        float *yr = job->y + (int64_t)r * n;
        for (int64_t j0 = 0; j0 < n; j0 += MUSE_EXL3_HAD) hadamard128_f64(tr + j0);
        for (int64_t j = 0; j < n; j++) {
            double v = tr[j] * (double)muse_exl3_out_scale(w, j);
            if (w->bias) v += (double)muse_f16_to_f32(w->bias[j]);
            yr[j] = (float)v;
        }
    }
}

size_t muse_exl3_workspace_bytes(const muse_exl3_weight *w, long max_rows)
{
    size_t rows = (size_t)(max_rows > 0 ? max_rows : 1);
    return rows * (size_t)w->k * sizeof(float) + rows * (size_t)w->n * sizeof(double);
}

void muse_exl3_linear(const muse_exl3_weight *w, const float *x, long rows, float *y,
                      void *workspace, muse_pool *pool)
{
    if (rows <= 0) return;
    pthread_once(&position_once, build_position_offset);
    muse_exl3_value_table(w->cb);
    void *own = workspace ? NULL : MUSE_MALLOC(muse_exl3_workspace_bytes(w, rows));
    float *a = workspace ? workspace : own;
    /* t follows a; k is a multiple of 128, so the doubles stay aligned */
    linear_job job = {w, x, rows, a, (double *)(void *)(a + (size_t)rows * (size_t)w->k), y};
    muse_pool_run(pool, linear_prepare_rows, &job, rows);
    muse_pool_run(pool, linear_column_tiles, &job, (long)(w->n / 16));
    muse_pool_run(pool, linear_finish_rows, &job, rows);
    free(own);
}
