/* muse-quant: makes an EXL3 pack from an fp16/bf16 pack (design/EXL3.md, "Making EXL3 tensors",
 * no calibration). Every Linear becomes trellis/suh/svh/marker tensors; everything else
 * (embeddings, norms, router, router bias) is copied as is. A tied head stays tied: the
 * embedding is never quantized, so the tied head keeps the embedding's fp16/bf16 weights. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/clock.h"
#include "base/flags.h"
#include "pack/config.h"
#include "pack/exl3.h"
#include "pack/exl3_quant.h"
#include "pack/pack_random.h"
#include "pack/safetensors.h"
#include "base/threadpool.h"

#define QUANT_VERSION 1

typedef struct {
    const char *in, *out;
    int bits, head_bits, threads, shards; /* shards 0: like the input */
    muse_codebook cb;
    uint64_t seed;
} quant_opts;

typedef enum { ITEM_COPY, ITEM_LINEAR, ITEM_BIAS } item_kind;

/* One input tensor and what it becomes in the output. */
typedef struct {
    const muse_tensor *t;
    item_kind kind;
    char key[256];      /* Linear key: the name without ".weight" / ".bias" */
    int bits;           /* ITEM_LINEAR */
    int64_t k, n, np;   /* in, out features; n padded to 128 (only the head may need it) */
    int shard;          /* output shard index */
    uint64_t out_bytes; /* bytes it writes */
} item;

typedef struct {
    item *v;
    size_t n;
    int shards;
} plan;

/* The output tensors of one item, owned until its shard is written. */
typedef struct {
    char names[4][300];
    void *buf[4];
    size_t count;
} item_out;

typedef struct {
    double t0;
    uint64_t weights;   /* weights quantized so far */
    double err2, ref2;  /* sum of squared errors and of squared weights over all Linears */
    size_t done, total; /* Linears */
    size_t copied;      /* tensors copied as is */
} progress;

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* "lm_head" or "<prefix>.lm_head" */
static bool is_head_key(const char *key)
{
    return strcmp(key, "lm_head") == 0 || ends_with(key, ".lm_head");
}

/* A Linear's key: "...q_proj" (attention, MLPs, experts, shared experts) or the head. */
static bool is_linear_key(const char *key)
{
    return ends_with(key, "_proj") || is_head_key(key);
}

static bool is_float(muse_dtype dt)
{
    return dt == MUSE_DT_F16 || dt == MUSE_DT_BF16 || dt == MUSE_DT_F32;
}

static uint64_t linear_out_bytes(const item *it, muse_codebook cb)
{
    return (uint64_t)it->k * (uint64_t)it->np / 8 * (uint64_t)it->bits + 2 * (uint64_t)it->k +
           2 * (uint64_t)it->np + (cb == MUSE_CB_3INST ? 0 : 4);
}

/* Classifies one tensor; refuses shapes the engine could not run once quantized. */
static int classify(const muse_st *st, const muse_tensor *t, const quant_opts *o, item *it,
                    muse_err *e)
{
    memset(it, 0, sizeof *it);
    it->t = t;
    it->kind = ITEM_COPY;
    it->out_bytes = t->nbytes;
    if (ends_with(t->name, ".trellis"))
        return muse_fail(e, "%s: tensor '%s' is already EXL3; give muse-quant an fp16/bf16 pack",
                         t->file, t->name);
    const char *dot = strrchr(t->name, '.');
    if (!dot || (size_t)(dot - t->name) >= sizeof it->key) return 0;
    snprintf(it->key, sizeof it->key, "%.*s", (int)(dot - t->name), t->name);
    if (!is_linear_key(it->key)) return 0;
    bool head = is_head_key(it->key);
    if (strcmp(dot, ".bias") == 0) {
        char wname[300];
        snprintf(wname, sizeof wname, "%s.weight", it->key);
        const muse_tensor *w = muse_st_find(st, wname);
        if (!w || !is_float(t->dtype) || t->ndim != 1 || w->ndim != 2 || t->shape[0] != w->shape[0])
            return muse_fail(e, "%s: bias '%s' does not match a Linear '%s' of %lld outputs",
                             t->file, t->name, wname, (long long)(w ? w->shape[0] : 0));
        it->kind = ITEM_BIAS;
        it->n = t->shape[0];
        it->np = (it->n + 127) / 128 * 128;
        it->out_bytes = 2 * (uint64_t)it->np;
        return 0;
    }
    if (strcmp(dot, ".weight") != 0) return 0;
    if (t->ndim != 2 || !is_float(t->dtype))
        return muse_fail(e,
                         "%s: Linear '%s' must be a 2-d F16/BF16/F32 matrix, got %s with %d dims",
                         t->file, t->name, muse_dtype_name(t->dtype), t->ndim);
    it->kind = ITEM_LINEAR;
    it->n = t->shape[0];
    it->k = t->shape[1];
    it->np = (it->n + 127) / 128 * 128;
    it->bits = head ? o->head_bits : o->bits;
    if (it->k % 128 || (!head && it->n % 128))
        return muse_fail(e,
                         "%s: Linear '%s' is %lld x %lld (out x in); EXL3 needs both to be "
                         "multiples of 128 (only the head's vocabulary may be padded)",
                         t->file, t->name, (long long)it->n, (long long)it->k);
    it->out_bytes = linear_out_bytes(it, o->cb);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Output shard of every item: the index of its input shard, or a byte split over --shards. */
static void assign_shards(plan *p, const quant_opts *o)
{
    if (o->shards > 0) {
        uint64_t total = 0, done = 0;
        for (size_t i = 0; i < p->n; i++) total += p->v[i].out_bytes;
        int sh = 0;
        for (size_t i = 0; i < p->n; i++) {
            while (sh < o->shards - 1 && done >= total * (uint64_t)(sh + 1) / (uint64_t)o->shards)
                sh++;
            p->v[i].shard = sh;
            done += p->v[i].out_bytes;
        }
        p->shards = o->shards;
        return;
    }
    const char **files = MUSE_CALLOC(p->n, sizeof *files);
    size_t nf = 0;
    for (size_t i = 0; i < p->n; i++) {
        bool seen = false;
        for (size_t j = 0; j < nf && !seen; j++) seen = strcmp(files[j], p->v[i].t->file) == 0;
        if (!seen) files[nf++] = p->v[i].t->file;
    }
    qsort(files, nf, sizeof *files, cmp_str);
    for (size_t i = 0; i < p->n; i++)
        for (size_t j = 0; j < nf; j++)
            if (strcmp(files[j], p->v[i].t->file) == 0) p->v[i].shard = (int)j;
    p->shards = nf ? (int)nf : 1;
    free(files);
}

static int build_plan(const muse_st *st, const quant_opts *o, plan *p, muse_err *e)
{
    p->n = muse_st_count(st);
    p->v = MUSE_CALLOC(p->n, sizeof *p->v);
    for (size_t i = 0; i < p->n; i++)
        if (classify(st, muse_st_at(st, i), o, &p->v[i], e)) return -1;
    assign_shards(p, o);
    return 0;
}

/* ---- one Linear ---- */

static void report_tiles(void *ctx, long done, long total)
{
    const char *key = ctx;
    if (total >= 4096 && (done == total || done % 4096 < 64))
        fprintf(stderr, "\rmuse-quant: %s: %ld / %ld tiles", key, done, total);
    if (total >= 4096 && done == total) fprintf(stderr, "\n");
}

/* W = weight^T as fp32, zero-padded to np columns. */
static float *transposed_weight(const item *it)
{
    float *W = MUSE_CALLOC((size_t)(it->k * it->np), sizeof *W);
    for (int64_t j = 0; j < it->n; j++)
        for (int64_t i = 0; i < it->k; i++)
            W[i * it->np + j] = muse_tensor_f32(it->t, j * it->k + i);
    return W;
}

/* Squared error of the dequantized tensor against W, and the squared norm of W. */
static void measure(const item *it, const quant_opts *o, const uint16_t *trellis,
                    const uint16_t *suh, const uint16_t *svh, const float *W, muse_pool *pool,
                    double *err2, double *ref2)
{
    muse_exl3_weight w = {.key = it->key,
                          .k = it->k,
                          .n = it->np,
                          .bits = it->bits,
                          .cb = o->cb,
                          .trellis = trellis,
                          .suh = suh,
                          .svh = svh};
    float *dq = MUSE_MALLOC((size_t)(it->k * it->np) * sizeof *dq);
    muse_exl3_dequant(&w, dq, pool);
    *err2 = *ref2 = 0;
    for (int64_t i = 0; i < it->k; i++)
        for (int64_t j = 0; j < it->n; j++) {
            double d = (double)dq[i * it->np + j] - W[i * it->np + j];
            *err2 += d * d;
            *ref2 += (double)W[i * it->np + j] * W[i * it->np + j];
        }
    free(dq);
}

static int quantize_linear(const item *it, const quant_opts *o, muse_pool *pool, item_out *out,
                           progress *pr, muse_err *e)
{
    double t0 = muse_now_s();
    int64_t kt = it->k / 16, nt = it->np / 16;
    size_t trellis_n = (size_t)(kt * nt * 16 * it->bits);
    uint16_t *trellis = MUSE_MALLOC(trellis_n * 2), *suh = MUSE_MALLOC((size_t)it->k * 2),
             *svh = MUSE_MALLOC((size_t)it->np * 2);
    float *W = transposed_weight(it);
    char key[256];
    snprintf(key, sizeof key, "%s", it->key);
    muse_err qe = {{0}};
    if (muse_exl3_quantize(W, it->k, it->np, it->bits, o->cb, muse_hash_name(it->key, o->seed),
                           trellis, suh, svh, pool, report_tiles, key, &qe)) {
        free(W);
        free(trellis);
        free(suh);
        free(svh);
        return muse_fail(e, "%s: Linear '%s.weight': %s", it->t->file, it->key, qe.msg);
    }
    double err2, ref2;
    measure(it, o, trellis, suh, svh, W, pool, &err2, &ref2);
    free(W);
    snprintf(out->names[0], sizeof out->names[0], "%s.trellis", it->key);
    snprintf(out->names[1], sizeof out->names[1], "%s.suh", it->key);
    snprintf(out->names[2], sizeof out->names[2], "%s.svh", it->key);
    out->buf[0] = trellis;
    out->buf[1] = suh;
    out->buf[2] = svh;
    out->count = 3;
    if (o->cb != MUSE_CB_3INST) {
        snprintf(out->names[3], sizeof out->names[3], "%s.%s", it->key, muse_codebook_name(o->cb));
        out->buf[3] = MUSE_CALLOC(1, sizeof(int32_t));
        out->count = 4;
    }
    pr->done++;
    pr->weights += (uint64_t)(it->k * it->np);
    pr->err2 += err2;
    pr->ref2 += ref2;
    double dt = muse_now_s() - t0, all = muse_now_s() - pr->t0;
    fprintf(stderr,
            "muse-quant: [%zu/%zu] %s %lldx%lld %d bits: rel RMS err %.4f, %.2f s; "
            "%.0f weights/s overall\n",
            pr->done, pr->total, it->key, (long long)it->k, (long long)it->np, it->bits,
            ref2 > 0 ? sqrt(err2 / ref2) : 0.0, dt, all > 0 ? (double)pr->weights / all : 0.0);
    return 0;
}

/* The output entries of one item (quantizing a Linear now). */
static int make_entries(const item *it, const quant_opts *o, muse_pool *pool, item_out *out,
                        muse_st_entry *ent, size_t *n_ent, progress *pr, muse_err *e)
{
    memset(out, 0, sizeof *out);
    if (it->kind == ITEM_COPY) {
        pr->copied++;
        ent[0] = (muse_st_entry){
            .name = it->t->name, .dtype = it->t->dtype, .ndim = it->t->ndim, .data = it->t->data};
        for (int d = 0; d < it->t->ndim; d++) ent[0].shape[d] = it->t->shape[d];
        *n_ent = 1;
        return 0;
    }
    if (it->kind == ITEM_BIAS) {
        uint16_t *b = MUSE_CALLOC((size_t)it->np, 2);
        for (int64_t j = 0; j < it->n; j++) b[j] = muse_f32_to_f16(muse_tensor_f32(it->t, j));
        snprintf(out->names[0], sizeof out->names[0], "%s", it->t->name);
        out->buf[0] = b;
        out->count = 1;
        ent[0] = (muse_st_entry){
            .name = out->names[0], .dtype = MUSE_DT_F16, .ndim = 1, .shape = {it->np}, .data = b};
        *n_ent = 1;
        return 0;
    }
    if (quantize_linear(it, o, pool, out, pr, e)) return -1;
    ent[0] = (muse_st_entry){.name = out->names[0],
                             .dtype = MUSE_DT_I16,
                             .ndim = 3,
                             .shape = {it->k / 16, it->np / 16, 16 * it->bits},
                             .data = out->buf[0]};
    ent[1] = (muse_st_entry){.name = out->names[1],
                             .dtype = MUSE_DT_F16,
                             .ndim = 1,
                             .shape = {it->k},
                             .data = out->buf[1]};
    ent[2] = (muse_st_entry){.name = out->names[2],
                             .dtype = MUSE_DT_F16,
                             .ndim = 1,
                             .shape = {it->np},
                             .data = out->buf[2]};
    if (out->count == 4)
        ent[3] = (muse_st_entry){
            .name = out->names[3], .dtype = MUSE_DT_I32, .ndim = 0, .data = out->buf[3]};
    *n_ent = out->count;
    return 0;
}

static void shard_name(const plan *p, int sh, char *buf, size_t len)
{
    if (p->shards == 1)
        snprintf(buf, len, "model.safetensors");
    else
        snprintf(buf, len, "model-%05d-of-%05d.safetensors", sh + 1, p->shards);
}

/* Names and shard file names of every output tensor, for the index. */
typedef struct {
    char **names, **files;
    size_t n, cap;
    uint64_t bytes;
} index_list;

static void index_add(index_list *x, const char *name, const char *file)
{
    if (x->n == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 256;
        x->names = realloc(x->names, x->cap * sizeof *x->names);
        x->files = realloc(x->files, x->cap * sizeof *x->files);
        MUSE_CHECK(x->names && x->files);
    }
    x->names[x->n] = strdup(name);
    x->files[x->n] = strdup(file);
    MUSE_CHECK(x->names[x->n] && x->files[x->n]);
    x->n++;
}

static void index_free(index_list *x)
{
    for (size_t i = 0; i < x->n; i++) {
        free(x->names[i]);
        free(x->files[i]);
    }
    free(x->names);
    free(x->files);
}

static int write_shard(const plan *p, int sh, const quant_opts *o, muse_pool *pool, progress *pr,
                       index_list *idx, muse_err *e)
{
    size_t count = 0;
    for (size_t i = 0; i < p->n; i++) count += p->v[i].shard == sh;
    muse_st_entry *ent = MUSE_CALLOC(4 * count, sizeof *ent);
    item_out *outs = MUSE_CALLOC(count, sizeof *outs);
    size_t n_ent = 0, at = 0;
    int rc = 0;
    for (size_t i = 0; i < p->n && rc == 0; i++) {
        if (p->v[i].shard != sh) continue;
        size_t got = 0;
        rc = make_entries(&p->v[i], o, pool, &outs[at++], ent + n_ent, &got, pr, e);
        n_ent += got;
    }
    char fname[64], path[4096];
    shard_name(p, sh, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", o->out, fname);
    if (rc == 0) rc = muse_st_write(path, ent, n_ent, e);
    for (size_t i = 0; rc == 0 && i < n_ent; i++) {
        index_add(idx, ent[i].name, fname);
        uint64_t numel = 1;
        for (int d = 0; d < ent[i].ndim; d++) numel *= (uint64_t)ent[i].shape[d];
        idx->bytes += numel * muse_dtype_size(ent[i].dtype);
    }
    for (size_t i = 0; i < at; i++)
        for (size_t j = 0; j < outs[i].count; j++) free(outs[i].buf[j]);
    free(outs);
    free(ent);
    return rc;
}

static int write_tensors(const plan *p, const quant_opts *o, muse_pool *pool, progress *pr,
                         muse_err *e)
{
    index_list idx = {0};
    int rc = 0;
    for (int sh = 0; sh < p->shards && rc == 0; sh++) rc = write_shard(p, sh, o, pool, pr, &idx, e);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", o->out);
    if (rc == 0 && p->shards > 1)
        rc = muse_st_write_index(path, (const char *const *)idx.names,
                                 (const char *const *)idx.files, idx.n, idx.bytes, e);
    else if (rc == 0 && unlink(path) != 0 && errno != ENOENT) /* a stale index would win */
        rc = muse_fail(e, "%s: cannot remove the stale index: %s", path, strerror(errno));
    index_free(&idx);
    return rc;
}

/* ---- config and side files ---- */

static int write_text(const char *path, const char *text, size_t len, muse_err *e)
{
    FILE *f = fopen(path, "wb");
    if (!f) return muse_fail(e, "%s: cannot create: %s", path, strerror(errno));
    size_t wrote = fwrite(text, 1, len, f);
    if (fclose(f) != 0 || wrote != len) return muse_fail(e, "%s: write failed", path);
    return 0;
}

static int write_config(const quant_opts *o, muse_err *e)
{
    char path[4096], *json;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", o->in);
    if (muse_read_file(path, 16 << 20, &json, &len, e)) return -1;
    cJSON *root = cJSON_ParseWithLength(json, len);
    free(json);
    if (!root) return muse_fail(e, "%s: not valid JSON", path);
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "quant_method", "exl3");
    cJSON_AddNumberToObject(q, "bits", o->bits);
    cJSON_AddNumberToObject(q, "head_bits", o->head_bits);
    cJSON_AddStringToObject(q, "codebook", muse_codebook_name(o->cb));
    cJSON_AddStringToObject(q, "calibration", "none");
    cJSON_AddNumberToObject(q, "version", QUANT_VERSION);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
    cJSON_AddItemToObject(root, "quantization_config", q);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "%s/config.json", o->out);
    size_t tl = strlen(text);
    text[tl] = '\n'; /* cJSON's NUL becomes the final newline */
    int rc = write_text(path, text, tl + 1, e);
    free(text);
    return rc;
}

/* Copies in/name to out/name when it exists. */
static int copy_side_file(const quant_opts *o, const char *name, muse_err *e)
{
    char src[4096], dst[4096], *text;
    size_t len;
    snprintf(src, sizeof src, "%s/%s", o->in, name);
    if (access(src, F_OK) != 0) return 0;
    if (muse_read_file(src, (size_t)1 << 30, &text, &len, e)) return -1;
    snprintf(dst, sizeof dst, "%s/%s", o->out, name);
    int rc = write_text(dst, text, len, e);
    free(text);
    return rc;
}

/* ---- command line ---- */

static const char *const codebooks[] = {"3inst", "mcg", "mul1", NULL}; /* muse_codebook order */

/* Returns -1 when the options are complete, else the exit code. */
static int parse_args(int argc, char **argv, quant_opts *o)
{
    *o = (quant_opts){.head_bits = 6};
    long long seed = 1;
    int cb = MUSE_CB_MUL1;
    const muse_flag table[] = {
        MUSE_FLAG_S("in", &o->in, "PACK", "an fp16/bf16 muse_spark pack", .required = true),
        MUSE_FLAG_S("out", &o->out, "DIR", "where the EXL3 pack goes", .required = true),
        MUSE_FLAG_I("bits", &o->bits, 1, 8, "B",
                    "bits of attention, dense MLP, experts and shared experts", .required = true),
        MUSE_FLAG_I("head-bits", &o->head_bits, 1, 8, "H",
                    "bits of lm_head (vocabulary padded to 128 rows)"),
        MUSE_FLAG_E("codebook", &cb, codebooks, "the EXL3 codebook"),
        MUSE_FLAG_I("threads", &o->threads, 0, 1024, "N", "threads", .def = "0: one per core"),
        MUSE_FLAG_L("seed", &seed, 0, INT64_MAX, "S", "the quantizer's seed"),
        MUSE_FLAG_I("shards", &o->shards, 1, 9999, "N", "safetensors files",
                    .def = "like the input"),
    };
    const muse_flags set = {
        .prog = "muse-quant",
        .about = "Quantizes every Linear of an fp16/bf16 muse_spark pack to EXL3 (no calibration). "
                 "Embeddings,\nnorms, the router and its bias are copied as is; a tied head stays "
                 "tied (the embedding is\nnever quantized). Writes config.json with "
                 "quantization_config, copies generation_config.json,\ntokenizer.json and "
                 "tokenizer_config.json. The same inputs and seed give the same pack for\nany "
                 "thread count.\n",
        .flags = table,
        .n = sizeof table / sizeof *table};
    int rc = muse_flags_parse(&set, argc, argv);
    o->seed = (uint64_t)seed;
    o->cb = (muse_codebook)cb;
    return rc;
}

static int same_dir(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && strcmp(ra, rb) == 0;
}

static int run(const quant_opts *o, muse_err *e)
{
    muse_config c;
    if (muse_config_load(o->in, &c, e)) return -1;
    if (c.quantized)
        return muse_fail(e,
                         "%s: config.json already has a quantization_config; give muse-quant "
                         "an fp16/bf16 pack",
                         o->in);
    if (mkdir(o->out, 0755) != 0 && errno != EEXIST)
        return muse_fail(e, "%s: cannot create: %s", o->out, strerror(errno));
    if (same_dir(o->in, o->out))
        return muse_fail(e, "--out %s is the input pack; write to another directory", o->out);
    muse_st *st;
    if (muse_st_open(o->in, &st, e)) return -1;
    plan p = {0};
    progress pr = {.t0 = muse_now_s()};
    int rc = build_plan(st, o, &p, e);
    for (size_t i = 0; rc == 0 && i < p.n; i++) pr.total += p.v[i].kind == ITEM_LINEAR;
    muse_pool *pool = rc == 0 ? muse_pool_create(o->threads) : NULL;
    if (rc == 0)
        fprintf(stderr,
                "muse-quant: %s: %zu Linears to %d bits (head %d), codebook %s, %d threads\n",
                o->in, pr.total, o->bits, o->head_bits, muse_codebook_name(o->cb),
                muse_pool_threads(pool));
    if (rc == 0) rc = write_tensors(&p, o, pool, &pr, e);
    if (rc == 0) rc = write_config(o, e);
    const char *side[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; rc == 0 && i < sizeof side / sizeof *side; i++)
        rc = copy_side_file(o, side[i], e);
    if (rc == 0) {
        double dt = muse_now_s() - pr.t0;
        fprintf(stderr,
                "muse-quant: wrote %s: %zu Linears (%llu weights) in %.1f s, %.0f weights/s; "
                "copied %zu tensors; %d shard(s); rel RMS err of all Linears %.4f\n",
                o->out, pr.done, (unsigned long long)pr.weights, dt,
                dt > 0 ? (double)pr.weights / dt : 0.0, pr.copied, p.shards,
                pr.ref2 > 0 ? sqrt(pr.err2 / pr.ref2) : 0.0);
    }
    muse_pool_destroy(pool);
    free(p.v);
    muse_st_close(st);
    return rc;
}

int main(int argc, char **argv)
{
    quant_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    muse_err e = {{0}};
    if (run(&o, &e)) {
        fprintf(stderr, "muse-quant: %s\n", e.msg);
        return 2;
    }
    return 0;
}
