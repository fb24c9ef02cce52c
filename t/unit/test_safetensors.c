/* safetensors: round trips of every dtype, sharded packs with an index, and every refusal
 * naming the file and tensor. Raw files are built byte by byte here, independent of the writer. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pack/safetensors.h"
#include "tap.h"

static char root[256];

static void make_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", root, name);
    mkdir(out, 0700);
}

static char *join(const char *dir, const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

/* Writes an 8-byte length, the header text as given and data_len bytes of pattern data. */
static void write_raw_len(const char *path, uint64_t header_len, const char *header,
                          size_t data_len)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    for (int i = 0; i < 8; i++) fputc((int)((header_len >> (8 * i)) & 0xff), f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i * 7 + 3) & 0xff, f);
    fclose(f);
}

static void write_raw(const char *path, const char *header, size_t data_len)
{
    write_raw_len(path, strlen(header), header, data_len);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) exit(2);
    fputs(text, f);
    fclose(f);
}

/* Opening dir must fail with a message holding every one of the given words. */
static void refuses(const char *what, const char *dir, const char *w1, const char *w2,
                    const char *w3)
{
    muse_st *st = NULL;
    muse_err e = {{0}};
    int rc = muse_st_open(dir, &st, &e);
    ok(rc == -1 && st == NULL, "%s: refused", what);
    int named =
        (!w1 || strstr(e.msg, w1)) && (!w2 || strstr(e.msg, w2)) && (!w3 || strstr(e.msg, w3));
    ok(named, "%s: message names '%s' '%s' '%s'", what, w1 ? w1 : "", w2 ? w2 : "", w3 ? w3 : "");
    diag("message: %s", e.msg);
    muse_st_close(st);
}

/* Tensor data is packed, so it may sit at any alignment: read elements with memcpy. */
static int32_t load_i32(const void *p, size_t i)
{
    int32_t v;
    memcpy(&v, (const char *)p + 4 * i, 4);
    return v;
}
static float load_f32(const void *p, size_t i)
{
    float v;
    memcpy(&v, (const char *)p + 4 * i, 4);
    return v;
}
static uint16_t load_u16(const void *p, size_t i)
{
    uint16_t v;
    memcpy(&v, (const char *)p + 2 * i, 2);
    return v;
}

static int header_refused(const char *json, uint64_t data_len, const char *want)
{
    muse_tensor *t = NULL;
    size_t n = 99;
    muse_err e = {{0}};
    int rc = muse_st_parse_header(json, strlen(json), NULL, data_len, "h.safetensors", &t, &n, &e);
    int good =
        rc == -1 && t == NULL && n == 0 && strstr(e.msg, "h.safetensors") && strstr(e.msg, want);
    if (!good) diag("json %s -> rc %d msg '%s'", json, rc, e.msg);
    muse_st_free_tensors(t, n);
    return good;
}

/* ---- round trip ---- */

enum { RT_COUNT = 7 };

typedef struct {
    uint16_t f16[6], bf16[4], i16[5];
    float f32[2 * 3 * 2];
    int32_t i32[3], scalar;
} rt_data;

static void fill_round_trip(rt_data *d, muse_st_entry *en)
{
    for (int i = 0; i < 6; i++) d->f16[i] = muse_f32_to_f16(0.37f * (float)i - 1.1f);
    for (int i = 0; i < 4; i++) d->bf16[i] = muse_f32_to_bf16(3.5f - 2.25f * (float)i);
    for (int i = 0; i < 5; i++) d->i16[i] = (uint16_t)(int16_t)(i * 1000 - 2500);
    for (int i = 0; i < 12; i++) d->f32[i] = 1.0f / (float)(i + 1) - 0.3f;
    for (int i = 0; i < 3; i++) d->i32[i] = -70000 + 123457 * i;
    d->scalar = -42;
    muse_st_entry all[RT_COUNT] = {
        {"model.embed.weight", MUSE_DT_F16, 2, {2, 3}, d->f16},
        {"b.bf16", MUSE_DT_BF16, 1, {4}, d->bf16},
        {"c.i16", MUSE_DT_I16, 1, {5}, d->i16},
        {"d.f32 \"quoted\"\\", MUSE_DT_F32, 3, {2, 3, 2}, d->f32},
        {"e.i32", MUSE_DT_I32, 1, {3}, d->i32},
        {"f.scalar", MUSE_DT_I32, 0, {0}, &d->scalar},
        {"g.empty", MUSE_DT_F16, 2, {0, 7}, NULL},
    };
    memcpy(en, all, sizeof all);
}

/* Reads the written file back by hand: length prefix, JSON offsets, data bytes in order. */
static void check_raw_layout(const char *path, const muse_st_entry *en, size_t n)
{
    FILE *f = fopen(path, "rb");
    uint8_t buf[4096];
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
    ok(got > 8 && hl % 8 == 0 && 8 + hl <= got, "raw: header length %llu is a multiple of 8",
       (unsigned long long)hl);
    cJSON *j = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hl);
    ok(j != NULL, "raw: header is JSON for cJSON on its own");
    uint64_t expect_off = 0;
    int offsets_ok = 1, data_ok = 1;
    for (size_t i = 0; i < n && j; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, en[i].name);
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
        size_t nb = muse_dtype_size(en[i].dtype);
        for (int d = 0; d < en[i].ndim; d++) nb *= (size_t)en[i].shape[d];
        if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
            cJSON_GetArrayItem(offs, 0)->valuedouble != (double)expect_off ||
            cJSON_GetArrayItem(offs, 1)->valuedouble != (double)(expect_off + nb) ||
            !cJSON_IsString(dt) || strcmp(dt->valuestring, muse_dtype_name(en[i].dtype)) != 0)
            offsets_ok = 0;
        if (nb && memcmp(buf + 8 + hl + expect_off, en[i].data, nb) != 0) data_ok = 0;
        expect_off += nb;
    }
    ok(offsets_ok, "raw: dtypes and data_offsets are consecutive in entry order");
    ok(data_ok, "raw: data bytes sit at their offsets");
    is_int(got, 8 + hl + expect_off, "raw: file size is prefix + header + data");
    cJSON_Delete(j);
}

static void test_round_trip(void)
{
    char dir[300];
    make_dir(dir, sizeof dir, "rt");
    rt_data d;
    muse_st_entry en[RT_COUNT];
    fill_round_trip(&d, en);
    muse_err e = {{0}};
    const char *path = join(dir, "model.safetensors");
    is_int(muse_st_write(path, en, RT_COUNT, &e), 0, "write all dtypes");
    if (e.msg[0]) diag("%s", e.msg);
    check_raw_layout(path, en, RT_COUNT);

    muse_st *st = NULL;
    ok(muse_st_open(dir, &st, &e) == 0 && st, "open the written file");
    if (!st) {
        diag("%s", e.msg);
        return;
    }
    is_int(muse_st_count(st), RT_COUNT, "every tensor is there");
    uint64_t total = 0;
    for (int i = 0; i < RT_COUNT; i++) {
        const muse_tensor *t = muse_st_find(st, en[i].name);
        int64_t numel = 1;
        for (int k = 0; k < en[i].ndim; k++) numel *= en[i].shape[k];
        size_t nb = (size_t)numel * muse_dtype_size(en[i].dtype);
        total += nb;
        ok(t && t->dtype == en[i].dtype && t->ndim == en[i].ndim && t->numel == numel &&
               t->nbytes == nb,
           "%s: dtype %s, ndim %d, numel %lld", en[i].name, muse_dtype_name(en[i].dtype),
           en[i].ndim, (long long)numel);
        ok(t && memcmp(t->shape, en[i].shape, sizeof(int64_t) * (size_t)en[i].ndim) == 0 &&
               (nb == 0 || memcmp(t->data, en[i].data, nb) == 0),
           "%s: shape and data round trip", en[i].name);
        ok(t && strcmp(t->file, path) == 0, "%s: file is the full path", en[i].name);
        ok(t == muse_st_at(st, (size_t)i), "%s: muse_st_at keeps file order", en[i].name);
    }
    const muse_tensor *s = muse_st_find(st, "f.scalar");
    is_int(s ? load_i32(s->data, 0) : 0, -42, "0-dim I32 scalar reads back -42");
    const muse_tensor *h = muse_st_find(st, "model.embed.weight");
    ok(h && fabsf(muse_f16_to_f32(load_u16(h->data, 4)) - (0.37f * 4 - 1.1f)) < 1e-3f * 0.38f,
       "F16 element [1][1] decodes to 0.38 within fp16 rounding");
    is_int(muse_st_total_bytes(st), total, "total_bytes sums tensor bytes");
    ok(muse_st_find(st, "model.embed") == NULL && muse_st_find(st, "") == NULL,
       "find of absent names is NULL");
    ok(muse_st_at(st, RT_COUNT) == NULL, "muse_st_at past the end is NULL");
    muse_st_close(st);
}

/* ---- sharded pack ---- */

static void test_sharded(void)
{
    char dir[300];
    make_dir(dir, sizeof dir, "sharded");
    float a[8], b[3], c[5];
    for (int i = 0; i < 8; i++) a[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 3; i++) b[i] = 10.0f + (float)i;
    for (int i = 0; i < 5; i++) c[i] = -3.0f * (float)i + 0.25f;
    muse_st_entry s1[2] = {{"layers.0.w", MUSE_DT_F32, 2, {2, 4}, a},
                           {"layers.0.b", MUSE_DT_F32, 1, {3}, b}};
    muse_st_entry s2[2] = {{"layers.1.w", MUSE_DT_F32, 1, {5}, c},
                           {"extra.not_indexed", MUSE_DT_F32, 1, {2}, a}};
    const char *sh1 = "model-00001-of-00002.safetensors", *sh2 = "model-00002-of-00002.safetensors";
    const char *names[3] = {"layers.0.w", "layers.1.w", "layers.0.b"};
    const char *shards[3] = {sh1, sh2, sh1};
    muse_err e = {{0}};
    ok(muse_st_write(join(dir, sh1), s1, 2, &e) == 0 &&
           muse_st_write(join(dir, sh2), s2, 2, &e) == 0,
       "write two shards");
    ok(muse_st_write_index(join(dir, "model.safetensors.index.json"), names, shards, 3, 76, &e) ==
           0,
       "write the index");
    /* a stray file that the index does not name must not be opened */
    write_text(join(dir, "stray.safetensors"), "garbage");

    FILE *f = fopen(join(dir, "model.safetensors.index.json"), "rb");
    char text[2048] = "";
    size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    cJSON *j = cJSON_ParseWithLength(text, len);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(j, "metadata"), "total_size");
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    ok(cJSON_IsNumber(ts) && ts->valuedouble == 76 && cJSON_GetArraySize(wm) == 3 &&
           strcmp(cJSON_GetObjectItemCaseSensitive(wm, "layers.1.w")->valuestring, sh2) == 0,
       "index JSON has total_size and weight_map");
    cJSON_Delete(j);

    muse_st *st = NULL;
    ok(muse_st_open(dir, &st, &e) == 0, "open the sharded pack");
    if (!st) {
        diag("%s", e.msg);
        return;
    }
    is_int(muse_st_count(st), 4, "3 indexed tensors + 1 unindexed tensor of a shard");
    const muse_tensor *w1 = muse_st_find(st, "layers.1.w");
    ok(w1 && strcmp(w1->file, join(dir, sh2)) == 0 && w1->numel == 5 &&
           load_f32(w1->data, 4) == c[4],
       "layers.1.w comes from shard 2 with its data");
    const muse_tensor *b0 = muse_st_find(st, "layers.0.b");
    ok(b0 && strcmp(b0->file, join(dir, sh1)) == 0 && load_f32(b0->data, 2) == 12.0f,
       "layers.0.b comes from shard 1 with its data");
    ok(muse_st_find(st, "extra.not_indexed") != NULL,
       "a shard tensor missing from the index is kept");
    is_int(muse_st_total_bytes(st), 32 + 12 + 20 + 8, "total bytes over both shards");
    muse_st_close(st);
}

/* 100k tensors: parse and hash lookups stay fast. */
static void test_many_tensors(void)
{
    char dir[300];
    make_dir(dir, sizeof dir, "many");
    enum { N = 100000 };
    muse_st_entry *en = calloc(N, sizeof *en);
    char(*names)[32] = calloc(N, 32);
    uint16_t *vals = calloc(N, sizeof *vals);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], 32, "model.layers.%d.w", i);
        vals[i] = (uint16_t)(i * 31 + 1);
        en[i] = (muse_st_entry){names[i], MUSE_DT_I16, 1, {1}, &vals[i]};
    }
    muse_err e = {{0}};
    clock_t t0 = clock();
    int wrote = muse_st_write(join(dir, "model.safetensors"), en, N, &e);
    muse_st *st = NULL;
    int opened = wrote == 0 && muse_st_open(dir, &st, &e) == 0;
    int found = 0;
    for (int i = N - 1; opened && i >= 0; i--) {
        const muse_tensor *t = muse_st_find(st, names[i]);
        found += t && load_u16(t->data, 0) == vals[i];
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    ok(opened, "write and open 100k tensors");
    is_int(found, N, "every one of 100k tensors is found with its value");
    ok(secs < 5.0, "100k tensors: write, open and find all in %.2f s (< 5 s)", secs);
    muse_st_close(st);
    free(en);
    free(names);
    free(vals);
}

/* ---- refusals ---- */

static void test_bad_files(void)
{
    char dir[300];
    muse_err e = {{0}};
    int16_t data[16];
    for (int i = 0; i < 16; i++) data[i] = (int16_t)(i * 3 - 7);

    make_dir(dir, sizeof dir, "truncated");
    muse_st_entry one[2] = {{"x.first", MUSE_DT_I16, 1, {4}, data},
                            {"model.layers.0.mlp.up_proj.weight", MUSE_DT_I16, 2, {2, 6}, data}};
    const char *path = join(dir, "model.safetensors");
    muse_st_write(path, one, 2, &e);
    struct stat sb;
    stat(path, &sb);
    ok(truncate(path, sb.st_size - 3) == 0, "truncate a good file by 3 bytes");
    refuses("truncated file", dir, path, "model.layers.0.mlp.up_proj.weight", "past the end");

    make_dir(dir, sizeof dir, "badlen");
    write_raw_len(join(dir, "model.safetensors"), 1ull << 40, "{}", 8);
    refuses("header length 2^40", dir, join(dir, "model.safetensors"), "header length", NULL);
    make_dir(dir, sizeof dir, "badlen2");
    write_raw_len(join(dir, "model.safetensors"), 64, "{}", 8);
    refuses("header length past the file", dir, join(dir, "model.safetensors"), "exceeds", NULL);
    make_dir(dir, sizeof dir, "tiny");
    write_text(join(dir, "model.safetensors"), "abc");
    refuses("3-byte file", dir, join(dir, "model.safetensors"), "too short", NULL);

    make_dir(dir, sizeof dir, "pastend");
    write_raw(join(dir, "model.safetensors"),
              "{\"w.big\":{\"dtype\":\"F16\",\"shape\":[32],\"data_offsets\":[0,64]}}", 16);
    refuses("offset past end", dir, join(dir, "model.safetensors"), "'w.big'", "past the end");

    make_dir(dir, sizeof dir, "mismatch");
    write_raw(join(dir, "model-00002-of-00003.safetensors"),
              "{\"model.layers.0.mlp.up_proj.weight\":{\"dtype\":\"F16\",\"shape\":[16,8],"
              "\"data_offsets\":[0,100]}}",
              100);
    char want[512];
    snprintf(want, sizeof want,
             "%s: tensor 'model.layers.0.mlp.up_proj.weight': data_offsets [0, 100] do not "
             "match shape [16, 8] of F16 (256 bytes); the file is corrupt or truncated, "
             "re-download or re-make the pack",
             join(dir, "model-00002-of-00003.safetensors"));
    muse_st *st = NULL;
    muse_st_open(dir, &st, &e);
    is_str(e.msg, want, "shape/offset mismatch: the exact message");
    muse_st_close(st);

    make_dir(dir, sizeof dir, "dtype");
    write_raw(join(dir, "only.safetensors"),
              "{\"w.f64\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16);
    refuses("unknown dtype", dir, join(dir, "only.safetensors"), "'w.f64'", "'F64'");

    make_dir(dir, sizeof dir, "overlap");
    write_raw(join(dir, "model.safetensors"),
              "{\"a.w\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
              "\"b.w\":{\"dtype\":\"I16\",\"shape\":[4],\"data_offsets\":[4,12]}}",
              12);
    refuses("overlapping tensors", dir, "'a.w' [0, 8]", "'b.w' [4, 12]", "overlap");

    make_dir(dir, sizeof dir, "dup");
    write_raw(join(dir, "model.safetensors"),
              "{\"same.w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
              "\"same.w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}",
              8);
    refuses("duplicate name", dir, join(dir, "model.safetensors"), "'same.w'", "twice");

    make_dir(dir, sizeof dir, "two");
    write_raw(join(dir, "a.safetensors"), "{}", 0);
    write_raw(join(dir, "b.safetensors"), "{}", 0);
    refuses("two files without an index", dir, dir, "model.safetensors.index.json", NULL);

    make_dir(dir, sizeof dir, "empty");
    refuses("empty directory", dir, dir, "is not a model pack", "no model.safetensors.index.json");
    refuses("a file, not a directory", join(root, "rt/model.safetensors"),
            join(root, "rt/model.safetensors"), "is not a model pack", NULL);
    refuses("missing path", join(root, "nope"), join(root, "nope"), "is not a model pack", NULL);
}

static void test_bad_index(void)
{
    char dir[300];
    muse_err e = {{0}};
    float v[4] = {1.5f, -2.0f, 3.25f, 8.0f};
    muse_st_entry s1[1] = {{"w.one", MUSE_DT_F32, 1, {4}, v}};
    muse_st_entry s2[1] = {{"w.two", MUSE_DT_F32, 1, {2}, v}};

    make_dir(dir, sizeof dir, "idx_missing");
    muse_st_write(join(dir, "s1.safetensors"), s1, 1, &e);
    write_text(join(dir, "model.safetensors.index.json"),
               "{\"weight_map\":{\"w.one\":\"s1.safetensors\",\"w.ghost\":\"s1.safetensors\"}}");
    refuses("index names a missing tensor", dir, "'w.ghost'", join(dir, "s1.safetensors"),
            "no such tensor");

    make_dir(dir, sizeof dir, "idx_noshard");
    write_text(join(dir, "model.safetensors.index.json"),
               "{\"weight_map\":{\"w.one\":\"gone.safetensors\"}}");
    refuses("index names a missing shard", dir, join(dir, "gone.safetensors"), "no such file",
            NULL);

    make_dir(dir, sizeof dir, "idx_dotdot");
    write_text(join(dir, "model.safetensors.index.json"), "{\"weight_map\":{\"w.one\":\"../x\"}}");
    refuses("index shard '../x'", dir, "'w.one'", "'../x'", "plain file name");

    make_dir(dir, sizeof dir, "idx_wrong");
    muse_st_write(join(dir, "s1.safetensors"), s1, 1, &e);
    muse_st_write(join(dir, "s2.safetensors"), s2, 1, &e);
    write_text(join(dir, "model.safetensors.index.json"),
               "{\"weight_map\":{\"w.one\":\"s2.safetensors\",\"w.two\":\"s2.safetensors\","
               "\"x\":\"s1.safetensors\"}}");
    refuses("index puts a tensor in the wrong shard", dir, "'w.one'", "s2.safetensors",
            "but it is in");

    make_dir(dir, sizeof dir, "idx_both");
    muse_st_write(join(dir, "s1.safetensors"), s1, 1, &e);
    muse_st_write(join(dir, "s2.safetensors"), s1, 1, &e);
    write_text(join(dir, "model.safetensors.index.json"),
               "{\"weight_map\":{\"w.one\":\"s1.safetensors\",\"w.x\":\"s2.safetensors\"}}");
    refuses("one tensor in two shards", dir, "'w.one'", "is in both", NULL);

    make_dir(dir, sizeof dir, "idx_json");
    write_text(join(dir, "model.safetensors.index.json"), "{\"weight_map\":{\"a\":");
    refuses("index is not JSON", dir, join(dir, "model.safetensors.index.json"), "JSON", NULL);

    char **names = NULL, **shards = NULL;
    size_t n = 0;
    const char *good = "{\"metadata\":{\"total_size\":8},\"weight_map\":{\"a\":\"x.st\",\"b\":"
                       "\"y.st\"}}";
    ok(muse_st_parse_index(good, strlen(good), &names, &shards, &n, &e) == 0 && n == 2 &&
           strcmp(names[1], "b") == 0 && strcmp(shards[1], "y.st") == 0,
       "parse_index reads names and shards in order");
    muse_st_free_index(names, shards, n);
    const char *bad[] = {"{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}",
                         "{\"weight_map\":{}}",
                         "{\"weight_map\":{\"a\":3}}",
                         "{\"weight_map\":{\"a\":\"d/x\"}}",
                         "{\"weight_map\":{\"a\":\"..\"}}",
                         "[1]",
                         "{\"weight_map\":{\"a\":\"x\"}} x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        names = shards = NULL;
        n = 7;
        int rc = muse_st_parse_index(bad[i], strlen(bad[i]), &names, &shards, &n, &e);
        ok(rc == -1 && names == NULL && n == 0 &&
               strstr(e.msg, "model.safetensors.index.json") != NULL,
           "parse_index refuses %s", bad[i]);
    }
}

static void test_writer_refusals(void)
{
    char dir[300];
    make_dir(dir, sizeof dir, "wr");
    float v[2] = {0.5f, -1.5f};
    muse_st_entry dup[2] = {{"w.same", MUSE_DT_F32, 1, {2}, v}, {"w.same", MUSE_DT_F32, 1, {1}, v}};
    muse_err e = {{0}};
    const char *path = join(dir, "model.safetensors");
    ok(muse_st_write(path, dup, 2, &e) == -1 && strstr(e.msg, "'w.same'") &&
           access(path, F_OK) != 0,
       "write refuses a repeated name and leaves no file");
    muse_st_entry neg[1] = {{"w.neg", MUSE_DT_F32, 2, {2, -1}, v}};
    ok(muse_st_write(path, neg, 1, &e) == -1 && strstr(e.msg, "'w.neg'"),
       "write refuses a negative dimension");
    const char *names[1] = {"w"}, *shards[1] = {"../x"};
    ok(muse_st_write_index(join(dir, "i.json"), names, shards, 1, 0, &e) == -1 &&
           strstr(e.msg, "plain file name"),
       "write_index refuses shard '../x'");
    ok(muse_st_write(join(root, "no/such/dir/m.safetensors"), neg, 0, &e) == -1 &&
           strstr(e.msg, "no/such/dir"),
       "write into a missing directory names the path");
}

static void test_header_rules(void)
{
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,2]}}", 2,
                      "more than 4 dimensions"),
       "5 dimensions refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"shape\":[-1],\"data_offsets\":[0,2]}}", 2,
                      "shape entry 0"),
       "negative dimension refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"shape\":[1.5],\"data_offsets\":[0,3]}}", 4,
                      "shape entry 0"),
       "fractional dimension refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"shape\":[4294967296,4294967296,4294967296],"
                      "\"data_offsets\":[0,2]}}",
                      2, "64 bits"),
       "element count overflow refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                      "\"data_offsets\":[0,0]}}",
                      2, "shape entry 0"),
       "dimension >= 2^53 refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,0]}}", 8,
                      "end before"),
       "end before begin refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8,
                      "data_offsets"),
       "three offsets refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4],\"x\":1}}", 8,
                      "unknown field 'x'"),
       "extra field refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"shape\":[2]}}", 8, "'data_offsets' is missing"),
       "missing field refused");
    ok(header_refused("{\"w\":{\"dtype\":\"F16\",\"dtype\":\"F16\",\"shape\":[2],"
                      "\"data_offsets\":[0,4]}}",
                      8, "appears twice"),
       "repeated field refused");
    ok(header_refused("{\"w\":[1]}", 8, "'w'"), "entry that is not an object refused");
    ok(header_refused("{\"__metadata__\":{\"a\":1}}", 8, "__metadata__"),
       "non-string metadata refused");
    ok(header_refused("{} {}", 8, "stray byte"), "trailing JSON refused");
    ok(header_refused("[]", 8, "not one JSON object"), "array header refused");
    ok(header_refused("{\"w\":", 8, "not valid JSON"), "cut JSON refused");

    const char *good = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[3,7]},"
                       "\"z\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[4,4]}}   \n";
    uint8_t base[8] = {0};
    muse_tensor *t = NULL;
    size_t n = 0;
    muse_err e = {{0}};
    int rc = muse_st_parse_header(good, strlen(good), base, 7, "g", &t, &n, &e);
    ok(rc == 0 && n == 2 && t[0].ndim == 0 && t[0].numel == 1 && t[0].data == base + 3 &&
           t[1].numel == 0 && t[1].nbytes == 0,
       "unaligned scalar, empty tensor inside another and trailing spaces accepted");
    if (rc) diag("%s", e.msg);
    muse_st_free_tensors(t, n);
}

int main(void)
{
    snprintf(root, sizeof root, "%s/muse_st_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    test_round_trip();
    test_sharded();
    test_many_tensors();
    test_bad_files();
    test_bad_index();
    test_writer_refusals();
    test_header_rules();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) diag("could not remove %s", root);
    return done_testing();
}
