/* muse-engine dequant: writes the effective weight W = diag(suh) Hk Wq Hn diag(svh) of one EXL3
 * Linear as fp32, so tools and tests can compare a pack's weights with their originals. */
#include "cmd/cmd_exl3.h"

#include <errno.h>

#include "base/flags.h"
#include "pack/exl3.h"
#include "pack/safetensors.h"
#include "base/threadpool.h"

typedef struct {
    const char *model, *tensor, *out;
    int threads;
} dequant_flags;

/* Returns -1 when the flags are complete, else the exit code. */
static int parse_flags(int argc, char **argv, dequant_flags *f)
{
    *f = (dequant_flags){0};
    const muse_flag table[] = {
        MUSE_FLAG_S("model", &f->model, "DIR", "the pack", .required = true),
        MUSE_FLAG_S("tensor", &f->tensor, "KEY",
                    "the Linear, e.g. model.layers.0.self_attn.q_proj (a trailing .trellis is\n"
                    "accepted)",
                    .required = true),
        MUSE_FLAG_S("out", &f->out, "FILE", "where the fp32 weight goes", .required = true),
        MUSE_FLAG_I("threads", &f->threads, 0, 1024, "N", "threads", .def = "0: one per core"),
    };
    const muse_flags set = {
        .prog = "muse-engine dequant",
        .about = "Writes the effective weight W = diag(suh) Hk Wq Hn diag(svh) of the EXL3 Linear "
                 "KEY as fp32\nlittle-endian: k rows (in_features) of n (out_features, padded to "
                 "128 for the head),\ny = x W. The bias, if any, is not included. Prints k, n, "
                 "bits and codebook on stderr.\n",
        .flags = table,
        .n = sizeof table / sizeof *table};
    return muse_flags_parse(&set, argc, argv);
}

/* The Linear's key: KEY with a trailing ".trellis" removed. */
static void linear_key(const char *tensor, char *key, size_t len)
{
    size_t n = strlen(tensor), sfx = strlen(".trellis");
    if (n > sfx && strcmp(tensor + n - sfx, ".trellis") == 0) n -= sfx;
    snprintf(key, len, "%.*s", (int)n, tensor);
}

static const muse_tensor *find_part(const muse_st *st, const char *key, const char *suffix)
{
    char name[600];
    snprintf(name, sizeof name, "%s.%s", key, suffix);
    return muse_st_find(st, name);
}

/* Finds and validates the EXL3 tensors of key; errors say what the key is instead. */
static int load_weight(const muse_st *st, const char *dir, const char *key, muse_exl3_weight *w,
                       muse_err *e)
{
    const muse_tensor *trellis = find_part(st, key, "trellis");
    if (!trellis) {
        if (find_part(st, key, "weight"))
            return muse_fail(e,
                             "%s: tensor '%s' is a %s Linear ('%s.weight'), not EXL3; dequant "
                             "reads EXL3 Linears only",
                             dir, key, muse_dtype_name(find_part(st, key, "weight")->dtype), key);
        if (muse_st_find(st, key))
            return muse_fail(e,
                             "%s: tensor '%s' is not an EXL3 Linear; give the key of one, "
                             "e.g. model.layers.0.self_attn.q_proj",
                             dir, key);
        return muse_fail(e, "%s: no tensor '%s.trellis' in the pack; check the key", dir, key);
    }
    const char *sfx[] = {"suh", "svh", "su", "sv", "mcg", "mul1", "bias"};
    const muse_tensor *p[7];
    for (int i = 0; i < 7; i++) p[i] = find_part(st, key, sfx[i]);
    return muse_exl3_from_tensors(key, trellis, p[0], p[1], p[2], p[3], p[4], p[5], p[6], w, e);
}

static int write_floats(const char *path, const float *v, size_t n, muse_err *e)
{
    FILE *f = fopen(path, "wb");
    if (!f) return muse_fail(e, "--out %s: cannot create: %s", path, strerror(errno));
    size_t wrote = fwrite(v, sizeof *v, n, f);
    if (fclose(f) != 0 || wrote != n) return muse_fail(e, "--out %s: write failed", path);
    return 0;
}

int muse_cmd_dequant(int argc, char **argv)
{
    dequant_flags f;
    int rc = parse_flags(argc, argv, &f);
    if (rc >= 0) return rc;
    char key[512];
    linear_key(f.tensor, key, sizeof key);
    muse_err e = {{0}};
    muse_st *st;
    if (muse_st_open(f.model, &st, &e)) {
        fprintf(stderr, "muse-engine dequant: %s\n", e.msg);
        return 2;
    }
    muse_exl3_weight w;
    if (load_weight(st, f.model, key, &w, &e)) {
        fprintf(stderr, "muse-engine dequant: %s\n", e.msg);
        muse_st_close(st);
        return 2;
    }
    size_t count = (size_t)w.k * (size_t)w.n;
    float *out = MUSE_MALLOC(count * sizeof *out);
    muse_pool *pool = muse_pool_create(f.threads);
    muse_exl3_dequant(&w, out, pool);
    muse_pool_destroy(pool);
    rc = write_floats(f.out, out, count, &e);
    if (rc)
        fprintf(stderr, "muse-engine dequant: %s\n", e.msg);
    else
        fprintf(stderr, "muse-engine dequant: %s: %lld x %lld, %d bits, codebook %s\n", key,
                (long long)w.k, (long long)w.n, w.bits, muse_codebook_name(w.cb));
    free(out);
    muse_st_close(st);
    return rc ? 2 : 0;
}
