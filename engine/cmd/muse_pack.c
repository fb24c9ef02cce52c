/* muse-pack: writes a deterministic random-weight pack of any muse_spark config, in fp16,
 * bf16 or EXL3 (random trellis symbols + random-sign scales), scaled so activations stay O(1). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

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

static void usage(FILE *f)
{
    fprintf(f, "usage: muse-pack --config FILE --out DIR [--seed S] [--shards N] [--dtype "
               "float16|bfloat16]\n"
               "                 [--no-router-bias] [--exl3-random BITS [--codebook "
               "mul1|mcg|3inst] [--head-bits H]]\n"
               "Writes a deterministic random-weight muse_spark pack: config.json, "
               "generation_config.json,\n"
               "safetensors (sharded with an index when N > 1). Weights are scaled so activations "
               "stay O(1).\n"
               "--dtype defaults to the config's torch_dtype (else float16). --exl3-random writes "
               "every Linear\n"
               "as EXL3 tensors from random trellis symbols and random-sign scales (head at "
               "--head-bits, default 6).\n");
}

static int fail_usage(const char *msg)
{
    fprintf(stderr, "muse-pack: %s\n", msg);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    const char *config = NULL, *out = NULL, *dtype = NULL, *codebook = "mul1";
    long long seed = 1, shards = 1, bits = 0, head_bits = 6;
    static const struct option opts[] = {{"config", 1, 0, 'c'},
                                         {"out", 1, 0, 'o'},
                                         {"seed", 1, 0, 's'},
                                         {"shards", 1, 0, 'n'},
                                         {"dtype", 1, 0, 'd'},
                                         {"exl3-random", 1, 0, 'x'},
                                         {"codebook", 1, 0, 'b'},
                                         {"head-bits", 1, 0, 'h'},
                                         {"no-router-bias", 0, 0, 'r'},
                                         {"help", 0, 0, '?'},
                                         {0, 0, 0, 0}};
    muse_synth_list l = {.router_bias = 1};
    int ch;
    char *end;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            config = optarg;
            break;
        case 'r':
            l.router_bias = 0;
            break;
        case 'o':
            out = optarg;
            break;
        case 'd':
            dtype = optarg;
            break;
        case 'b':
            codebook = optarg;
            break;
        case 's':
            seed = strtoll(optarg, &end, 10);
            if (*end || !*optarg) return fail_usage("--seed must be an integer");
            break;
        case 'n':
            shards = strtoll(optarg, &end, 10);
            if (*end || shards < 1 || shards > 9999)
                return fail_usage("--shards must be 1 .. 9999");
            break;
        case 'x':
            bits = strtoll(optarg, &end, 10);
            if (*end || bits < 1 || bits > 8)
                return fail_usage("--exl3-random BITS must be 1 .. 8");
            break;
        case 'h':
            head_bits = strtoll(optarg, &end, 10);
            if (*end || head_bits < 1 || head_bits > 8)
                return fail_usage("--head-bits must be 1 .. 8");
            break;
        case '?':
            if (optind > 0 && strcmp(argv[optind - 1], "--help") == 0) {
                usage(stdout);
                return 0;
            }
            return fail_usage("unknown option");
        }
    }
    if (!config || !out) return fail_usage("--config and --out are required");
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
    if (!dtype) dtype = td ? td : "float16";
    if (strcmp(dtype, "float16") == 0)
        l.dtype = MUSE_DT_F16;
    else if (strcmp(dtype, "bfloat16") == 0)
        l.dtype = MUSE_DT_BF16;
    else {
        cJSON_Delete(root);
        free(json);
        return fail_usage("--dtype (or torch_dtype) must be float16 or bfloat16");
    }
    cJSON_Delete(root);
    l.exl3_bits = (int)bits;
    l.head_bits = (int)head_bits;
    if (muse_codebook_parse(codebook, &l.cb)) {
        free(json);
        return fail_usage("--codebook must be mul1, mcg or 3inst");
    }
    if (bits) {
        const char *why = NULL;
        if (c.hidden_size % 128 || (c.n_heads * c.head_dim) % 128 ||
            (c.n_kv_heads * c.head_dim) % 128 || c.moe_intermediate_size % 128 ||
            c.intermediate_size % 128)
            why = "EXL3 needs every Linear width (hidden, heads x head_dim, intermediate sizes) to "
                  "be a multiple of 128";
        if (why) {
            free(json);
            return fail_usage(why);
        }
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "muse-pack: %s: cannot create: %s\n", out, strerror(errno));
        free(json);
        return 2;
    }
    muse_synth_specs(&c, &l);
    int rc = write_shards(out, &l, (int)shards, (uint64_t)seed, &e) ||
             write_configs(out, json, len, &l, &c, &e);
    if (rc)
        fprintf(stderr, "muse-pack: %s\n", e.msg);
    else
        fprintf(stderr, "muse-pack: wrote %s: %zu tensors in %lld shard(s)\n", out, l.n, shards);
    free(l.v);
    free(json);
    return rc ? 2 : 0;
}
