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

typedef enum {
    FILL_LINEAR,
    FILL_EMBED,
    FILL_NORM_OFFSET,
    FILL_NORM_PLAIN,
    FILL_ROUTER,
    FILL_BIAS,
    FILL_TRELLIS,
    FILL_SUH,
    FILL_SVH,
    FILL_MARKER
} fill_kind;

typedef struct {
    char name[256];
    muse_dtype dtype;
    int ndim;
    int64_t shape[3];
    fill_kind fill;
    double scale; /* std of a linear; 1/sqrt(k) */
    size_t bytes;
} spec;

typedef struct {
    spec *v;
    size_t n, cap;
    muse_dtype dtype;         /* fp16 or bf16 weights */
    int exl3_bits, head_bits; /* 0: not EXL3 */
    int router_bias;
    muse_codebook cb;
} spec_list;

static spec *add(spec_list *l, const char *name, muse_dtype dt, int ndim, int64_t a, int64_t b,
                 int64_t c, fill_kind fill)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        MUSE_CHECK(l->v);
    }
    spec *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->dtype = dt;
    s->ndim = ndim;
    int64_t dims[3] = {a, b, c}, numel = 1;
    for (int i = 0; i < ndim; i++) numel *= (s->shape[i] = dims[i]);
    s->fill = fill;
    s->bytes = (size_t)numel * muse_dtype_size(dt);
    return s;
}

/* A Linear k -> n: fp16/bf16 [n, k], or the EXL3 tensors at `bits`. */
static void add_linear(spec_list *l, const char *key, int64_t k, int64_t n, int bits)
{
    char name[300];
    if (!bits) {
        snprintf(name, sizeof name, "%s.weight", key);
        add(l, name, l->dtype, 2, n, k, 0, FILL_LINEAR)->scale = 1.0 / sqrt((double)k);
        return;
    }
    int64_t np = (n + 127) / 128 * 128;
    snprintf(name, sizeof name, "%s.trellis", key);
    add(l, name, MUSE_DT_I16, 3, k / 16, np / 16, 16 * bits, FILL_TRELLIS);
    snprintf(name, sizeof name, "%s.suh", key);
    add(l, name, MUSE_DT_F16, 1, k, 0, 0, FILL_SUH)->scale = 1.0 / sqrt((double)k);
    snprintf(name, sizeof name, "%s.svh", key);
    add(l, name, MUSE_DT_F16, 1, np, 0, 0, FILL_SVH);
    if (l->cb != MUSE_CB_3INST) {
        snprintf(name, sizeof name, "%s.%s", key, l->cb == MUSE_CB_MCG ? "mcg" : "mul1");
        add(l, name, MUSE_DT_I32, 0, 0, 0, 0, FILL_MARKER);
    }
}

static void add_mlp(spec_list *l, const char *base, int64_t H, int64_t I)
{
    char key[256];
    snprintf(key, sizeof key, "%s.gate_proj", base);
    add_linear(l, key, H, I, l->exl3_bits);
    snprintf(key, sizeof key, "%s.up_proj", base);
    add_linear(l, key, H, I, l->exl3_bits);
    snprintf(key, sizeof key, "%s.down_proj", base);
    add_linear(l, key, I, H, l->exl3_bits);
}

static void build_specs(const muse_config *c, spec_list *l)
{
    int64_t H = c->hidden_size, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    char key[256];
    add(l, "model.embed_tokens.weight", l->dtype, 2, c->vocab_size, H, 0, FILL_EMBED);
    for (int64_t i = 0; i < c->num_layers; i++) {
        const char *norms[4] = {"input_layernorm", "post_attention_layernorm",
                                "pre_feedforward_layernorm", "post_feedforward_layernorm"};
        for (int j = 0; j < 4; j++) {
            snprintf(key, sizeof key, "model.layers.%lld.%s.weight", (long long)i, norms[j]);
            add(l, key, l->dtype, 1, H, 0, 0, FILL_NORM_OFFSET);
        }
        const char *att[5] = {"q_proj", "k_proj", "v_proj", "gate_proj", "o_proj"};
        int64_t ks[5] = {H, H, H, H, Q}, ns[5] = {Q, KV, KV, Q, H};
        for (int j = 0; j < 5; j++) {
            snprintf(key, sizeof key, "model.layers.%lld.self_attn.%s", (long long)i, att[j]);
            add_linear(l, key, ks[j], ns[j], l->exl3_bits);
        }
        snprintf(key, sizeof key, "model.layers.%lld.mlp", (long long)i);
        if (c->mlp_kind[i] == MUSE_MLP_DENSE) {
            add_mlp(l, key, H, c->intermediate_size);
            continue;
        }
        snprintf(key, sizeof key, "model.layers.%lld.mlp.router.weight", (long long)i);
        add(l, key, l->dtype, 2, c->num_experts, H, 0, FILL_ROUTER)->scale = 1.0 / sqrt((double)H);
        snprintf(key, sizeof key, "model.layers.%lld.mlp.router.e_score_correction_bias",
                 (long long)i);
        if (l->router_bias) add(l, key, MUSE_DT_F32, 1, c->num_experts, 0, 0, FILL_BIAS);
        for (int64_t x = 0; x < c->num_experts; x++) {
            snprintf(key, sizeof key, "model.layers.%lld.mlp.experts.%lld", (long long)i,
                     (long long)x);
            add_mlp(l, key, H, c->moe_intermediate_size);
            if (c->expert_output_norm) {
                snprintf(key, sizeof key, "model.layers.%lld.mlp.experts.%lld.output_norm.weight",
                         (long long)i, (long long)x);
                add(l, key, l->dtype, 1, H, 0, 0, FILL_NORM_OFFSET);
            }
        }
        if (c->num_shared_experts > 0) {
            snprintf(key, sizeof key, "model.layers.%lld.mlp.shared_experts", (long long)i);
            add_mlp(l, key, H, c->num_shared_experts * c->moe_intermediate_size);
        }
    }
    add(l, "model.norm.weight", l->dtype, 1, H, 0, 0, FILL_NORM_PLAIN);
    if (!c->tie_word_embeddings)
        add_linear(l, "lm_head", H, c->vocab_size, l->exl3_bits ? l->head_bits : 0);
}

static void store(muse_dtype dt, void *data, size_t i, double v)
{
    if (dt == MUSE_DT_F16)
        ((uint16_t *)data)[i] = muse_f32_to_f16((float)v);
    else if (dt == MUSE_DT_BF16)
        ((uint16_t *)data)[i] = muse_f32_to_bf16((float)v);
    else
        ((float *)data)[i] = (float)v;
}

static void fill(const spec *s, uint64_t seed, void *data)
{
    uint64_t key = muse_hash_name(s->name, seed);
    size_t n = s->bytes / muse_dtype_size(s->dtype);
    for (size_t i = 0; i < n; i++) {
        double z = muse_normal(key, i), sign = muse_unit(key, i) < 0.5 ? -1.0 : 1.0;
        switch (s->fill) {
        case FILL_LINEAR:
        case FILL_ROUTER:
            store(s->dtype, data, i, z * s->scale);
            break;
        case FILL_EMBED:
            store(s->dtype, data, i, z);
            break;
        case FILL_NORM_OFFSET:
            store(s->dtype, data, i, 0.1 * z);
            break;
        case FILL_NORM_PLAIN:
            store(s->dtype, data, i, 1.0 + 0.1 * z);
            break;
        case FILL_BIAS:
            store(s->dtype, data, i, 0.05 * z);
            break;
        case FILL_TRELLIS:
            ((uint16_t *)data)[i] = (uint16_t)(muse_mix64(key + i) >> 48);
            break;
        /* |W| entries ~ 1/sqrt(k) once the codebook's unit RMS passes both Hadamards */
        case FILL_SUH:
            store(s->dtype, data, i, sign * s->scale * (0.8 + 0.4 * muse_unit(key, i + n)));
            break;
        case FILL_SVH:
            store(s->dtype, data, i, sign * (0.8 + 0.4 * muse_unit(key, i + n)));
            break;
        case FILL_MARKER:
            ((int32_t *)data)[0] = 0;
            break;
        }
    }
}

static int write_shards(const char *out, const spec_list *l, int shards, uint64_t seed, muse_err *e)
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
            const spec *s = &l->v[first + i];
            void *data = MUSE_MALLOC(s->bytes);
            fill(s, seed, data);
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
static int write_configs(const char *out, const char *json, size_t len, const spec_list *l,
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
    spec_list l = {.router_bias = !no_router_bias, .cb = (muse_codebook)cb};
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
    build_specs(&c, &l);
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
