/* muse-pack: writes a deterministic random-weight pack of any muse_spark config, in fp16,
 * bf16 or EXL3 (random trellis symbols + random-sign scales), scaled so activations stay O(1). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/flags.h"
#include "pack/config.h"
#include "pack/exl3.h"
#include "pack/pack_random.h"
#include "pack/safetensors.h"
#include "pack/synthetic.h"

static int write_shards(const char *out, const muse_synth_list *l, int shards, uint64_t seed,
                        muse_err *e)
{
    uint64_t total = 0;
    for (size_t i = 0; i < l->n; i++) total += l->v[i].bytes;
    const char **names = MUSE_CALLOC(l->n, sizeof *names),
               **files = MUSE_CALLOC(l->n, sizeof *files);
    char(*fname)[64] = MUSE_CALLOC((size_t)shards, sizeof *fname);
    size_t at = 0;
    uint64_t done = 0;
    int rc = 0;
    for (int sh = 0; sh < shards && !rc; sh++) {
        if (shards == 1)
            snprintf(fname[sh], 64, "model.safetensors");
        else
            snprintf(fname[sh], 64, "model-%05d-of-%05d.safetensors", sh + 1, shards);
        uint64_t limit = total * (uint64_t)(sh + 1) / (uint64_t)shards;
        size_t first = at;
        while (at < l->n && (done < limit || sh == shards - 1)) done += l->v[at++].bytes;
        size_t count = at - first;
        muse_st_entry *ent = MUSE_CALLOC(count, sizeof *ent);
        for (size_t i = 0; i < count; i++) {
            const muse_synth_spec *s = &l->v[first + i];
            void *data = MUSE_MALLOC(s->bytes);
            muse_synth_fill(s, seed, data);
            ent[i] =
                (muse_st_entry){.name = s->name, .dtype = s->dtype, .ndim = s->ndim, .data = data};
            for (int d = 0; d < s->ndim; d++) ent[i].shape[d] = s->shape[d];
            names[first + i] = s->name;
            files[first + i] = fname[sh];
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", out, fname[sh]);
        rc = muse_st_write(path, ent, count, e);
        for (size_t i = 0; i < count; i++) free((void *)ent[i].data);
        free(ent);
    }
    if (!rc && shards > 1) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
        rc = muse_st_write_index(path, names, files, l->n, total, e);
    }
    free(names);
    free(files);
    free(fname);
    return rc;
}

static int write_text(const char *path, const char *text, muse_err *e)
{
    FILE *f = fopen(path, "w");
    if (!f) return muse_fail(e, "%s: cannot create: %s", path, strerror(errno));
    fputs(text, f);
    fputc('\n', f);
    return fclose(f) == 0 ? 0 : muse_fail(e, "%s: write failed", path);
}

/* config.json as given, plus quantization_config for an EXL3 pack; generation_config.json. */
static int write_configs(const char *out, const char *json, size_t len, const muse_synth_list *l,
                         const muse_config *c, muse_err *e)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    MUSE_CHECK(root);
    if (l->exl3_bits) {
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "quant_method", "exl3");
        cJSON_AddNumberToObject(q, "bits", l->exl3_bits);
        cJSON_AddNumberToObject(q, "head_bits", l->head_bits);
        cJSON_AddStringToObject(q, "codebook", muse_codebook_name(l->cb));
        cJSON_AddStringToObject(q, "calibration", "none (muse-pack --exl3-random)");
        cJSON_AddNumberToObject(q, "version", 1);
        cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
        cJSON_AddItemToObject(root, "quantization_config", q);
    }
    char path[4096];
    char *text = cJSON_Print(root);
    snprintf(path, sizeof path, "%s/config.json", out);
    int rc = write_text(path, text, e);
    free(text);
    cJSON_Delete(root);
    if (rc) return rc;
    cJSON *gen = cJSON_CreateObject();
    if (c->bos_token_id >= 0) cJSON_AddNumberToObject(gen, "bos_token_id", (double)c->bos_token_id);
    if (c->n_eos) {
        cJSON *eos = cJSON_AddArrayToObject(gen, "eos_token_id");
        for (int i = 0; i < c->n_eos; i++)
            cJSON_AddItemToArray(eos, cJSON_CreateNumber((double)c->eos_ids[i]));
    }
    text = cJSON_Print(gen);
    snprintf(path, sizeof path, "%s/generation_config.json", out);
    rc = write_text(path, text, e);
    free(text);
    cJSON_Delete(gen);
    return rc;
}

static const char *const dtypes[] = {"float16", "bfloat16", NULL};
static const char *const codebooks[] = {"3inst", "mcg", "mul1", NULL}; /* muse_codebook order */

int main(int argc, char **argv)
{
    const char *config = "", *out = ""; /* both required: the parser refuses their absence */
    long long seed = 1;
    int shards = 1, bits = 0, head_bits = 6, dtype_i = -1, cb = MUSE_CB_MUL1;
    bool no_router_bias = false;
    const muse_flag table[] = {
        MUSE_FLAG_S("config", &config, "FILE", "a muse_spark config.json", .required = true),
        MUSE_FLAG_S("out", &out, "DIR", "where the pack goes", .required = true),
        MUSE_FLAG_L("seed", &seed, LLONG_MIN, LLONG_MAX, "S", "the weights' seed"),
        MUSE_FLAG_I("shards", &shards, 1, 9999, "N",
                    "safetensors files (with an index when N > 1)"),
        MUSE_FLAG_E("dtype", &dtype_i, dtypes, "the weights' dtype",
                    .def = "the config's torch_dtype, else float16"),
        MUSE_FLAG_B("no-router-bias", &no_router_bias, "write no e_score_correction_bias"),
        MUSE_FLAG_I("exl3-random", &bits, 1, 8, "BITS",
                    "write every Linear as EXL3 tensors from random trellis symbols and\n"
                    "random-sign scales",
                    .def = "off"),
        MUSE_FLAG_E("codebook", &cb, codebooks, "the EXL3 codebook"),
        MUSE_FLAG_I("head-bits", &head_bits, 1, 8, "H", "the EXL3 head's bits"),
    };
    const muse_flags set = {
        .prog = "muse-pack",
        .about = "Writes a deterministic random-weight muse_spark pack: config.json, "
                 "generation_config.json,\nsafetensors. Weights are scaled so activations stay "
                 "O(1).\n",
        .flags = table,
        .n = sizeof table / sizeof *table};
    int rc = muse_flags_parse(&set, argc, argv);
    if (rc != MUSE_FLAGS_RUN) return rc;
    muse_synth_list l = {.router_bias = !no_router_bias, .cb = (muse_codebook)cb};
    muse_err e = {{0}};
    char *json;
    size_t len;
    muse_config c;
    if (muse_read_file(config, 16 << 20, &json, &len, &e) || muse_config_parse(json, len, &c, &e)) {
        fprintf(stderr, "muse-pack: %s: %s\n", config, e.msg);
        return 2;
    }
    cJSON *root = cJSON_ParseWithLength(json, len);
    const char *td = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "torch_dtype"));
    const char *dtype = dtype_i >= 0 ? dtypes[dtype_i] : td ? td : "float16";
    if (strcmp(dtype, "float16") == 0)
        l.dtype = MUSE_DT_F16;
    else if (strcmp(dtype, "bfloat16") == 0)
        l.dtype = MUSE_DT_BF16;
    else {
        cJSON_Delete(root);
        free(json);
        return muse_flags_error(&set, "--dtype (or torch_dtype) must be float16 or bfloat16");
    }
    cJSON_Delete(root);
    l.exl3_bits = bits;
    l.head_bits = head_bits;
    if (bits) {
        const char *why = NULL;
        if (c.hidden_size % 128 || (c.n_heads * c.head_dim) % 128 ||
            (c.n_kv_heads * c.head_dim) % 128 || c.moe_intermediate_size % 128 ||
            c.intermediate_size % 128)
            why = "EXL3 needs every Linear width (hidden, heads x head_dim, intermediate sizes) to "
                  "be a multiple of 128";
        if (why) {
            free(json);
            return muse_flags_error(&set, "%s", why);
        }
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "muse-pack: %s: cannot create: %s\n", out, strerror(errno));
        free(json);
        return 2;
    }
    muse_synth_specs(&c, &l);
    rc = write_shards(out, &l, shards, (uint64_t)seed, &e) ||
         write_configs(out, json, len, &l, &c, &e);
    if (rc)
        fprintf(stderr, "muse-pack: %s\n", e.msg);
    else
        fprintf(stderr, "muse-pack: wrote %s: %zu tensors in %d shard(s)\n", out, l.n, shards);
    free(l.v);
    free(json);
    return rc ? 2 : 0;
}
