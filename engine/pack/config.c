#include "pack/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

/* Fields that never change the math: accepted silently. */
static const char *const ignored_fields[] = {"architectures",
                                             "torch_dtype",
                                             "dtype",
                                             "transformers_version",
                                             "initializer_range",
                                             "use_cache",
                                             "attention_dropout",
                                             "pad_token_id",
                                             "text_config",
                                             "model_type",
                                             "auto_map",
                                             "_name_or_path",
                                             "hidden_dropout",
                                             "output_attentions",
                                             "output_hidden_states",
                                             "return_dict",
                                             "name_or_path",
                                             "tokenizer_class",
                                             NULL};

/* Fields this engine reads; anything else (not ignored) is listed in one warning. */
static const char *const known_fields[] = {"vocab_size",
                                           "hidden_size",
                                           "num_hidden_layers",
                                           "num_attention_heads",
                                           "num_key_value_heads",
                                           "head_dim",
                                           "layer_types",
                                           "sliding_window",
                                           "rope_theta",
                                           "layer_rope_theta",
                                           "rms_norm_eps",
                                           "post_norm_eps",
                                           "qk_scale_factor",
                                           "mlp_layer_types",
                                           "intermediate_size",
                                           "num_experts",
                                           "num_experts_per_tok",
                                           "moe_intermediate_size",
                                           "num_shared_experts",
                                           "routed_scaling_factor",
                                           "norm_topk_prob",
                                           "expert_output_norm",
                                           "final_logit_softcapping",
                                           "output_multiplier",
                                           "tie_word_embeddings",
                                           "bos_token_id",
                                           "eos_token_id",
                                           "max_position_embeddings",
                                           "quantization_config",
                                           "rope_scaling",
                                           "n_group",
                                           "topk_group",
                                           "hidden_act",
                                           "attention_bias",
                                           "mlp_bias",
                                           "use_sinks",
                                           "attention_sinks",
                                           NULL};

static bool in_list(const char *name, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(name, *list) == 0) return true;
    return false;
}

typedef struct {
    const cJSON *top, *text; /* text_config (may be NULL) wins over top */
} cfg_src;

static const cJSON *field(const cfg_src *s, const char *name)
{
    const cJSON *v = s->text ? cJSON_GetObjectItemCaseSensitive(s->text, name) : NULL;
    return v ? v : cJSON_GetObjectItemCaseSensitive(s->top, name);
}

/* Integer field: absent -> def (or an error when required). */
static int get_int(const cfg_src *s, const char *name, bool required, int64_t def, int64_t min,
                   int64_t *out, muse_err *e)
{
    const cJSON *v = field(s, name);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return muse_fail(
                e, "config.json: required field '%s' is missing; add it to the pack's config.json",
                name);
        *out = def;
        return 0;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || d < (double)min || d > 9.0e15)
        return muse_fail(e, "config.json: field '%s' must be an integer >= %lld; fix config.json",
                         name, (long long)min);
    *out = (int64_t)d;
    return 0;
}

static int get_num(const cfg_src *s, const char *name, double def, double min, double *out,
                   muse_err *e)
{
    const cJSON *v = field(s, name);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < min)
        return muse_fail(e, "config.json: field '%s' must be a number >= %g; fix config.json", name,
                         min);
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cfg_src *s, const char *name, bool def, bool *out, muse_err *e)
{
    const cJSON *v = field(s, name);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return muse_fail(e, "config.json: field '%s' must be true or false; fix config.json", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A per-layer string list: exactly L entries, each one of two names. */
static int get_layer_list(const cfg_src *s, const char *name, int64_t L, const char *a,
                          const char *b, int *out, bool *present, muse_err *e)
{
    const cJSON *v = field(s, name);
    *present = v && !cJSON_IsNull(v);
    if (!*present) return 0;
    if (!cJSON_IsArray(v))
        return muse_fail(e, "config.json: '%s' must be an array of %lld strings; fix config.json",
                         name, (long long)L);
    int n = cJSON_GetArraySize(v);
    if (n != L)
        return muse_fail(e,
                         "config.json: '%s' has %d entries but num_hidden_layers is %lld; give one "
                         "entry per layer",
                         name, n, (long long)L);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        const char *str = cJSON_GetStringValue(it);
        if (str && strcmp(str, a) == 0)
            out[i] = 0;
        else if (str && strcmp(str, b) == 0)
            out[i] = 1;
        else
            return muse_fail(e, "config.json: '%s'[%d] is not \"%s\" or \"%s\"; fix that entry",
                             name, i, a, b);
        i++;
    }
    return 0;
}

static int refuse_unsupported(const cfg_src *s, muse_err *e)
{
    const cJSON *v = field(s, "rope_scaling");
    if (v && !cJSON_IsNull(v))
        return muse_fail(e,
                         "config.json: 'rope_scaling' is not supported by muse_spark "
                         "(MUSE_SPARK.md defines plain RoPE); remove it or use a supported pack");
    v = field(s, "n_group");
    if (v && cJSON_IsNumber(v) && v->valuedouble > 1)
        return muse_fail(e, "config.json: grouped routing 'n_group' > 1 is not supported; set "
                            "n_group to 1 or remove it");
    v = field(s, "hidden_act");
    if (v && !cJSON_IsNull(v) && !(cJSON_GetStringValue(v) && strcmp(v->valuestring, "silu") == 0))
        return muse_fail(
            e, "config.json: 'hidden_act' must be \"silu\"; other activations are not supported");
    static const char *const flags[] = {"attention_bias", "mlp_bias", "use_sinks",
                                        "attention_sinks", NULL};
    for (int i = 0; flags[i]; i++) {
        v = field(s, flags[i]);
        if (v && cJSON_IsTrue(v))
            return muse_fail(e,
                             "config.json: '%s' is true but muse_spark has no such feature; set it "
                             "to false or remove it",
                             flags[i]);
    }
    return 0;
}

static void warn_unknown(const cJSON *obj, const char *where)
{
    char list[512] = "";
    size_t used = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        if (!it->string || in_list(it->string, ignored_fields) || in_list(it->string, known_fields))
            continue;
        int w = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", it->string);
        if (w < 0 || (size_t)w >= sizeof list - used) break;
        used += (size_t)w;
    }
    if (used) fprintf(stderr, "muse: warning: %s: unknown fields ignored: %s\n", where, list);
}

static int parse_eos(const cJSON *v, muse_config *c, const char *where, muse_err *e)
{
    c->n_eos = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *it;
    if (cJSON_IsNumber(v)) {
        it = v;
        if (it->valuedouble != floor(it->valuedouble))
            return muse_fail(e, "%s: 'eos_token_id' must be an integer id", where);
        c->eos_ids[c->n_eos++] = (int64_t)it->valuedouble;
    } else if (cJSON_IsArray(v)) {
        cJSON_ArrayForEach(it, v)
        {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 || c->n_eos >= MUSE_MAX_EOS ||
                it->valuedouble != floor(it->valuedouble))
                return muse_fail(e, "%s: 'eos_token_id' must be an id or a list of at most %d ids",
                                 where, MUSE_MAX_EOS);
            c->eos_ids[c->n_eos++] = (int64_t)it->valuedouble;
        }
    } else {
        return muse_fail(e, "%s: 'eos_token_id' must be an id or a list of ids", where);
    }
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab_size)
            return muse_fail(e, "%s: eos_token_id %lld is outside the vocabulary (vocab_size %lld)",
                             where, (long long)c->eos_ids[i], (long long)c->vocab_size);
    return 0;
}

static int parse_quant(const cfg_src *s, muse_config *c, muse_err *e)
{
    const cJSON *q = field(s, "quantization_config");
    c->quantized = false;
    if (!q || cJSON_IsNull(q)) return 0;
    const char *method = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q, "quant_method"));
    if (!method || strcmp(method, "exl3") != 0)
        return muse_fail(
            e,
            "config.json: quantization_config.quant_method is '%s' but only \"exl3\" is supported; "
            "use an EXL3 pack or an fp16/bf16 pack without quantization_config",
            method ? method : "(missing)");
    c->quantized = true;
    /* lenient: the tensors are the truth, these are only reported */
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, "bits");
    c->quant_bits = cJSON_IsNumber(v) ? v->valuedouble : 0;
    v = cJSON_GetObjectItemCaseSensitive(q, "head_bits");
    c->quant_head_bits = cJSON_IsNumber(v) ? v->valuedouble : 0;
    const char *cb = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q, "codebook"));
    snprintf(c->quant_codebook, sizeof c->quant_codebook, "%s", cb ? cb : "");
    return 0;
}

static int parse_layers(const cfg_src *s, muse_config *c, muse_err *e)
{
    int64_t L = c->num_layers;
    int kinds[MUSE_MAX_LAYERS];
    bool present;
    if (get_layer_list(s, "layer_types", L, "sliding_attention", "full_attention", kinds, &present,
                       e))
        return -1;
    if (!present)
        return muse_fail(e, "config.json: required field 'layer_types' is missing; give one of "
                            "\"sliding_attention\"/\"full_attention\" per layer");
    bool any_sliding = false;
    for (int64_t i = 0; i < L; i++) {
        c->attn_kind[i] = kinds[i] ? MUSE_ATTN_FULL : MUSE_ATTN_SLIDING;
        any_sliding |= !kinds[i];
    }
    if (get_layer_list(s, "mlp_layer_types", L, "dense", "moe", kinds, &present, e)) return -1;
    bool any_dense = false;
    for (int64_t i = 0; i < L; i++) {
        c->mlp_kind[i] = (!present || kinds[i]) ? MUSE_MLP_MOE : MUSE_MLP_DENSE;
        any_dense |= c->mlp_kind[i] == MUSE_MLP_DENSE;
    }
    const cJSON *lt = field(s, "layer_rope_theta");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != L)
            return muse_fail(e,
                             "config.json: 'layer_rope_theta' must be an array of "
                             "num_hidden_layers (%lld) numbers; fix its length",
                             (long long)L);
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, lt)
        {
            if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < 0)
                return muse_fail(e,
                                 "config.json: 'layer_rope_theta'[%d] must be a number >= 0 (0 = "
                                 "NoPE); fix that entry",
                                 i);
            c->rope_theta_layer[i++] = it->valuedouble;
        }
    } else {
        for (int64_t i = 0; i < L; i++) c->rope_theta_layer[i] = c->rope_theta;
    }
    if (get_int(s, "sliding_window", any_sliding, 0, 1, &c->sliding_window, e)) {
        if (any_sliding)
            return muse_fail(e,
                             "config.json: a layer is \"sliding_attention\" but 'sliding_window' "
                             "is missing or invalid; set sliding_window to the window W (>= 1)");
        return -1;
    }
    if (get_int(s, "intermediate_size", any_dense, 0, 1, &c->intermediate_size, e)) return -1;
    return 0;
}

int muse_config_parse(const char *json, size_t len, muse_config *c, muse_err *e)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return muse_fail(e, "config.json: not a JSON object; the pack's config.json is corrupt");
    }
    cfg_src s = {root, cJSON_GetObjectItemCaseSensitive(root, "text_config")};
    if (s.text && !cJSON_IsObject(s.text)) s.text = NULL;
    int rc = -1;
    const cJSON *mt = field(&s, "model_type");
    const char *mts = cJSON_GetStringValue(mt);
    if (!mts || strcmp(mts, "muse_spark") != 0) {
        muse_fail(e,
                  "config.json: model_type is '%s' but this engine serves \"muse_spark\"; use a "
                  "muse_spark pack",
                  mts ? mts : "(missing)");
        goto out;
    }
    if (refuse_unsupported(&s, e)) goto out;
    if (get_int(&s, "vocab_size", true, 0, 1, &c->vocab_size, e) ||
        get_int(&s, "hidden_size", true, 0, 1, &c->hidden_size, e) ||
        get_int(&s, "num_hidden_layers", true, 0, 1, &c->num_layers, e) ||
        get_int(&s, "num_attention_heads", true, 0, 1, &c->n_heads, e) ||
        get_int(&s, "num_key_value_heads", true, 0, 1, &c->n_kv_heads, e) ||
        get_int(&s, "max_position_embeddings", true, 0, 1, &c->max_position_embeddings, e))
        goto out;
    if (c->num_layers > MUSE_MAX_LAYERS) {
        muse_fail(e, "config.json: num_hidden_layers %lld exceeds this build's limit of %d",
                  (long long)c->num_layers, MUSE_MAX_LAYERS);
        goto out;
    }
    if (c->hidden_size % c->n_heads != 0 && !field(&s, "head_dim")) {
        muse_fail(e,
                  "config.json: hidden_size %lld is not divisible by num_attention_heads %lld; set "
                  "head_dim",
                  (long long)c->hidden_size, (long long)c->n_heads);
        goto out;
    }
    if (get_int(&s, "head_dim", false, c->hidden_size / c->n_heads, 1, &c->head_dim, e)) goto out;
    if (c->n_heads % c->n_kv_heads != 0) {
        muse_fail(e,
                  "config.json: num_attention_heads %lld is not a multiple of num_key_value_heads "
                  "%lld; heads must divide",
                  (long long)c->n_heads, (long long)c->n_kv_heads);
        goto out;
    }
    if (c->head_dim % 2 != 0) {
        muse_fail(e, "config.json: head_dim %lld must be even for rotary embeddings",
                  (long long)c->head_dim);
        goto out;
    }
    if (get_num(&s, "rope_theta", 500000.0, 0, &c->rope_theta, e) ||
        get_num(&s, "rms_norm_eps", 1e-5, 0, &c->rms_norm_eps, e) ||
        get_num(&s, "post_norm_eps", c->rms_norm_eps, 0, &c->post_norm_eps, e) ||
        get_num(&s, "qk_scale_factor", 1.0, 0, &c->qk_scale_factor, e))
        goto out;
    if (parse_layers(&s, c, e)) goto out;
    if (get_int(&s, "num_experts", true, 0, 1, &c->num_experts, e) ||
        get_int(&s, "num_experts_per_tok", false, 8, 1, &c->num_experts_per_tok, e) ||
        get_int(&s, "moe_intermediate_size", true, 0, 1, &c->moe_intermediate_size, e) ||
        get_int(&s, "num_shared_experts", false, 0, 0, &c->num_shared_experts, e))
        goto out;
    if (c->num_experts_per_tok > c->num_experts) {
        muse_fail(e, "config.json: num_experts_per_tok %lld exceeds num_experts %lld",
                  (long long)c->num_experts_per_tok, (long long)c->num_experts);
        goto out;
    }
    if (get_num(&s, "routed_scaling_factor", 1.0, 0, &c->routed_scaling_factor, e) ||
        get_bool(&s, "norm_topk_prob", true, &c->norm_topk_prob, e) ||
        get_bool(&s, "expert_output_norm", false, &c->expert_output_norm, e) ||
        get_bool(&s, "tie_word_embeddings", false, &c->tie_word_embeddings, e) ||
        get_num(&s, "final_logit_softcapping", 0.0, 0, &c->final_logit_softcapping, e) ||
        get_num(&s, "output_multiplier", 1.0, -INFINITY, &c->output_multiplier, e) ||
        get_int(&s, "bos_token_id", false, -1, 0, &c->bos_token_id, e))
        goto out;
    if (c->bos_token_id >= c->vocab_size) {
        muse_fail(e, "config.json: bos_token_id %lld is outside the vocabulary (vocab_size %lld)",
                  (long long)c->bos_token_id, (long long)c->vocab_size);
        goto out;
    }
    if (parse_eos(field(&s, "eos_token_id"), c, "config.json", e)) goto out;
    if (parse_quant(&s, c, e)) goto out;
    c->gen_temperature = c->gen_top_p = -1;
    c->gen_top_k = -1;
    warn_unknown(root, "config.json");
    if (s.text) warn_unknown(s.text, "config.json text_config");
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int muse_read_file(const char *path, size_t max_bytes, char **out, size_t *len, muse_err *e)
{
    FILE *f = fopen(path, "rb");
    if (!f) return muse_fail(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return muse_fail(e, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        fclose(f);
        return muse_fail(e, "%s: %lld bytes is larger than the %zu allowed for this file", path,
                         (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = MUSE_MALLOC(n + 1);
    if (fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return muse_fail(e, "%s: short read", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

static int load_generation_config(const char *dir, muse_config *c, muse_err *e)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (access(path, F_OK) != 0) return 0;
    char *buf;
    size_t len;
    if (muse_read_file(path, 1 << 20, &buf, &len, e)) return -1;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return muse_fail(e, "%s: not a JSON object; fix or remove generation_config.json", path);
    }
    int rc = 0;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (eos && !cJSON_IsNull(eos)) rc = parse_eos(eos, c, "generation_config.json", e);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "temperature");
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 2)
        c->gen_temperature = v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(root, "top_p");
    if (cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble <= 1)
        c->gen_top_p = v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e9)
        c->gen_top_k = (int64_t)v->valuedouble;
    cJSON_Delete(root);
    return rc;
}

int muse_config_load_file(const char *flag, const char *path, muse_config *c, muse_err *e)
{
    char *buf;
    size_t len;
    muse_err why = {{0}};
    int rc = muse_read_file(path, 16 << 20, &buf, &len, &why);
    if (!rc) {
        rc = muse_config_parse(buf, len, c, &why);
        free(buf);
    }
    return rc ? muse_fail(e, "%s %s: %s", flag, path, why.msg) : 0;
}

int muse_config_context(const muse_config *c, long long *context, muse_err *e)
{
    long long most = (long long)c->max_position_embeddings;
    if (!*context) *context = most < 4096 ? most : 4096;
    if (*context > most)
        return muse_fail(e,
                         "--context %lld exceeds the config's max_position_embeddings %lld: "
                         "give at most that",
                         *context, most);
    return 0;
}

int muse_config_load(const char *dir, muse_config *c, muse_err *e)
{
    char path[4096];
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return muse_fail(e, "%s is not a model pack: not a directory", dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) != 0)
        return muse_fail(e,
                         "%s is not a model pack: no config.json; pass --model a pack directory "
                         "(make one with muse-pack)",
                         dir);
    char *buf;
    size_t len;
    if (muse_read_file(path, 16 << 20, &buf, &len, e)) return -1;
    int rc = muse_config_parse(buf, len, c, e);
    free(buf);
    if (rc) return rc;
    return load_generation_config(dir, c, e);
}
