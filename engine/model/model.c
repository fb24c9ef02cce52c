#include "model/model.h"

#include "pack/synthetic.h"

#include <math.h>
#include <pthread.h>

#include "base/clock.h"

/* Finds "model.<name>" (or "model.language_model.<name>"). */
static const muse_tensor *find_prefixed(const muse_model *m, const char *name, char *key,
                                        size_t keylen)
{
    static const char *const prefixes[] = {"model.", "model.language_model."};
    for (int i = 0; i < 2; i++) {
        snprintf(key, keylen, "%s%s", prefixes[i], name);
        const muse_tensor *t = muse_st_find(m->st, key);
        if (t) return t;
    }
    snprintf(key, keylen, "model.%s", name);
    return NULL;
}

static int expect_shape(const muse_model *m, const muse_tensor *t, const char *key, int ndim,
                        const int64_t *shape, bool float_only, muse_err *e)
{
    if (!t)
        return muse_fail(
            e, "%s: tensor '%s' is missing from the pack; re-make or re-download the pack", m->dir,
            key);
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[96] = "", got[96] = "";
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "",
                     (long long)shape[i]);
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)t->shape[i]);
        return muse_fail(e,
                         "%s: tensor '%s' has shape [%s] but the config needs [%s]; the pack does "
                         "not match its config.json",
                         t->file, key, got, want);
    }
    if (float_only && t->dtype != MUSE_DT_F16 && t->dtype != MUSE_DT_BF16 &&
        t->dtype != MUSE_DT_F32)
        return muse_fail(e, "%s: tensor '%s' has dtype %s; expected F16, BF16 or F32", t->file, key,
                         muse_dtype_name(t->dtype));
    return 0;
}

/* A 1-d float vector copied to fp32, refusing NaN/inf by tensor name. */
static int load_vector(muse_model *m, const char *name, int64_t len, muse_vec *out, muse_err *e)
{
    char key[256];
    const muse_tensor *t = find_prefixed(m, name, key, sizeof key);
    if (expect_shape(m, t, key, 1, &len, true, e)) return -1;
    float *v = MUSE_MALLOC((size_t)len * sizeof *v);
    for (int64_t i = 0; i < len; i++) {
        v[i] = muse_tensor_f32(t, i);
        if (!isfinite(v[i])) {
            free(v);
            return muse_fail(e,
                             "%s: tensor '%s' holds a non-finite value (NaN or inf) at index %lld; "
                             "the pack is corrupt",
                             t->file, key, (long long)i);
        }
    }
    out->v = v;
    out->n = len;
    out->id = m->n_vecs++;
    return 0;
}

static int load_linear(muse_model *m, const char *name, int64_t k, int64_t n, bool pad_n,
                       bool top_level, muse_lin_role role, muse_linear *l, muse_err *e)
{
    static const muse_shard shard_of[] = {
        [MUSE_ROLE_Q] = MUSE_SHARD_OUTPUT,      [MUSE_ROLE_K] = MUSE_SHARD_OUTPUT,
        [MUSE_ROLE_V] = MUSE_SHARD_OUTPUT,      [MUSE_ROLE_GATE] = MUSE_SHARD_OUTPUT,
        [MUSE_ROLE_O] = MUSE_SHARD_INPUT,       [MUSE_ROLE_MLP_IN] = MUSE_SHARD_OUTPUT,
        [MUSE_ROLE_MLP_OUT] = MUSE_SHARD_INPUT, [MUSE_ROLE_HEAD] = MUSE_SHARD_OUTPUT};
    muse_shard shard = shard_of[role];
    char key[256], tkey[300];
    memset(l, 0, sizeof *l);
    l->k = k;
    l->n = n;
    l->shard = shard;
    l->role = role;
    l->id = m->n_linears++;
    l->ld = k;
    /* the head sits at top level as HF writes it; also accepted under the prefix */
    const muse_tensor *w = NULL, *trellis = NULL;
    snprintf(key, sizeof key, "%s", name);
    for (int attempt = 0; attempt < 3; attempt++) {
        if (attempt == 0 && !top_level) continue;
        if (attempt > 0) {
            const char *pre = attempt == 1 ? "model." : "model.language_model.";
            snprintf(key, sizeof key, "%s%s", pre, name);
        }
        snprintf(tkey, sizeof tkey, "%s.trellis", key);
        trellis = muse_st_find(m->st, tkey);
        snprintf(tkey, sizeof tkey, "%s.weight", key);
        w = muse_st_find(m->st, tkey);
        if (trellis || w) break;
    }
    if (!trellis && !w) snprintf(key, sizeof key, "%s%s", top_level ? "" : "model.", name);
    snprintf(l->key, sizeof l->key, "%s", key);
    if (trellis) {
        const char *sfx[] = {"suh", "svh", "su", "sv", "mcg", "mul1", "bias"};
        const muse_tensor *p[7];
        for (int i = 0; i < 7; i++) {
            snprintf(tkey, sizeof tkey, "%s.%s", key, sfx[i]);
            p[i] = muse_st_find(m->st, tkey);
        }
        if (muse_exl3_from_tensors(key, trellis, p[0], p[1], p[2], p[3], p[4], p[5], p[6], &l->exl3,
                                   e))
            return -1;
        int64_t want_n = pad_n ? (n + 127) / 128 * 128 : n;
        if (l->exl3.k != k || l->exl3.n != want_n)
            return muse_fail(e,
                             "%s: EXL3 tensor '%s.trellis' encodes a %lld x %lld weight but the "
                             "config needs %lld x %lld; the pack does not match its config.json",
                             trellis->file, key, (long long)l->exl3.k, (long long)l->exl3.n,
                             (long long)k, (long long)want_n);
        l->kind = MUSE_LIN_EXL3;
        l->n = want_n;
        return 0;
    }
    snprintf(tkey, sizeof tkey, "%s.weight", key);
    int64_t shape[2] = {n, k};
    if (expect_shape(m, w, tkey, 2, shape, true, e)) return -1;
    l->kind = MUSE_LIN_DENSE;
    l->w = w;
    return 0;
}

static int load_mlp(muse_model *m, const char *base, int64_t H, int64_t I, muse_mlp *mlp,
                    muse_err *e)
{
    char name[200];
    /* the intermediate dimension is split: gate and up by output, down by input */
    snprintf(name, sizeof name, "%s.gate_proj", base);
    if (load_linear(m, name, H, I, false, false, MUSE_ROLE_MLP_IN, &mlp->gate, e)) return -1;
    snprintf(name, sizeof name, "%s.up_proj", base);
    if (load_linear(m, name, H, I, false, false, MUSE_ROLE_MLP_IN, &mlp->up, e)) return -1;
    snprintf(name, sizeof name, "%s.down_proj", base);
    return load_linear(m, name, I, H, false, false, MUSE_ROLE_MLP_OUT, &mlp->down, e);
}

static int load_layer(muse_model *m, int64_t i, muse_err *e)
{
    const muse_config *c = &m->cfg;
    muse_layer *ly = &m->layers[i];
    int64_t H = c->hidden_size, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    char name[200], key[256];
    const char *norms[4] = {"input_layernorm", "post_attention_layernorm",
                            "pre_feedforward_layernorm", "post_feedforward_layernorm"};
    muse_vec *dst[4] = {&ly->input_norm, &ly->post_attn_norm, &ly->pre_ff_norm, &ly->post_ff_norm};
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "layers.%lld.%s.weight", (long long)i, norms[j]);
        if (load_vector(m, name, H, dst[j], e)) return -1;
    }
    /* q, k, v and gate split by heads; o by its input (MUSE_SPARK.md, tensor parallelism) */
    struct {
        const char *p;
        int64_t k, n;
        muse_lin_role role;
        muse_linear *l;
    } att[5] = {{"q_proj", H, qd, MUSE_ROLE_Q, &ly->q},
                {"k_proj", H, kvd, MUSE_ROLE_K, &ly->k},
                {"v_proj", H, kvd, MUSE_ROLE_V, &ly->v},
                {"gate_proj", H, qd, MUSE_ROLE_GATE, &ly->gate},
                {"o_proj", qd, H, MUSE_ROLE_O, &ly->o}};
    for (int j = 0; j < 5; j++) {
        snprintf(name, sizeof name, "layers.%lld.self_attn.%s", (long long)i, att[j].p);
        if (load_linear(m, name, att[j].k, att[j].n, false, false, att[j].role, att[j].l, e))
            return -1;
    }
    snprintf(name, sizeof name, "layers.%lld.mlp", (long long)i);
    if (c->mlp_kind[i] == MUSE_MLP_DENSE)
        return load_mlp(m, name, H, c->intermediate_size, &ly->dense, e);

    int64_t E = c->num_experts;
    snprintf(name, sizeof name, "layers.%lld.mlp.router.weight", (long long)i);
    ly->router = find_prefixed(m, name, key, sizeof key);
    int64_t rshape[2] = {E, H};
    if (expect_shape(m, ly->router, key, 2, rshape, true, e)) return -1;
    snprintf(name, sizeof name, "layers.%lld.mlp.router.e_score_correction_bias", (long long)i);
    if (find_prefixed(m, name, key, sizeof key) && load_vector(m, name, E, &ly->router_bias, e))
        return -1;
    ly->experts = MUSE_CALLOC((size_t)E, sizeof *ly->experts);
    if (c->expert_output_norm) ly->expert_norm = MUSE_CALLOC((size_t)E, sizeof *ly->expert_norm);
    ly->router_bias.id = -1;
    for (int64_t x = 0; x < E; x++) {
        snprintf(name, sizeof name, "layers.%lld.mlp.experts.%lld", (long long)i, (long long)x);
        if (load_mlp(m, name, H, c->moe_intermediate_size, &ly->experts[x], e)) return -1;
        if (c->expert_output_norm) {
            snprintf(name, sizeof name, "layers.%lld.mlp.experts.%lld.output_norm.weight",
                     (long long)i, (long long)x);
            if (load_vector(m, name, H, &ly->expert_norm[x], e)) return -1;
        }
    }
    if (c->num_shared_experts > 0) {
        snprintf(name, sizeof name, "layers.%lld.mlp.shared_experts", (long long)i);
        if (load_mlp(m, name, H, c->num_shared_experts * c->moe_intermediate_size, &ly->shared, e))
            return -1;
    }
    return 0;
}

static uint64_t linear_params(const muse_linear *l)
{
    return (uint64_t)l->k * (uint64_t)l->n;
}
static uint64_t mlp_params(const muse_mlp *p)
{
    return linear_params(&p->gate) + linear_params(&p->up) + linear_params(&p->down);
}

/* Parameters: every weight; active = all but the routed experts a token does not use. */
static void count_params(muse_model *m)
{
    const muse_config *c = &m->cfg;
    uint64_t H = (uint64_t)c->hidden_size, total = (uint64_t)c->vocab_size * H + H, inactive = 0;
    if (m->head.w != m->embed) total += (uint64_t)c->vocab_size * H; /* an untied head */
    for (int64_t i = 0; i < c->num_layers; i++) {
        const muse_layer *ly = &m->layers[i];
        total += 4 * H + linear_params(&ly->q) + linear_params(&ly->k) + linear_params(&ly->v) +
                 linear_params(&ly->gate) + linear_params(&ly->o);
        if (c->mlp_kind[i] == MUSE_MLP_DENSE) {
            total += mlp_params(&ly->dense);
            continue;
        }
        uint64_t per_expert = mlp_params(&ly->experts[0]) + (c->expert_output_norm ? H : 0);
        total += (uint64_t)c->num_experts * (H + 1 + per_expert);
        inactive += (uint64_t)(c->num_experts - c->num_experts_per_tok) * per_expert;
        if (c->num_shared_experts > 0) total += mlp_params(&ly->shared);
    }
    m->params_total = total;
    m->params_active = total - inactive;
}

/* Reads every page once so the first forward does not stall, reporting progress when slow. */
static void prefault(const muse_model *m)
{
    double t0 = muse_now_s(), last = t0;
    uint64_t total = muse_st_total_bytes(m->st), done = 0;
    volatile uint8_t sink = 0;
    bool shown = false;
    for (size_t i = 0; i < muse_st_count(m->st); i++) {
        const muse_tensor *t = muse_st_at(m->st, i);
        const uint8_t *p = t->data;
        for (size_t off = 0; off < t->nbytes; off += 4096) sink ^= p[off];
        done += t->nbytes;
        double now = muse_now_s();
        if (now - t0 > 1.0 && (now - last > 0.5 || done == total)) {
            fprintf(stderr, "\rmuse: loading %s: %.2f / %.2f GiB (%.0f MiB/s)", m->dir,
                    done / 1073741824.0, total / 1073741824.0, done / 1048576.0 / (now - t0));
            last = now;
            shown = true;
        }
    }
    if (shown) fprintf(stderr, "\n");
    (void)sink;
}

static int load_tensors(muse_model *m, muse_err *e);

void muse_model_host_weights(const muse_model *m)
{
    muse_synth_devs_to_host(m->dev_fill);
}

int muse_model_load(const char *dir, muse_model *m, muse_err *e)
{
    memset(m, 0, sizeof *m);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    if (muse_config_load(dir, &m->cfg, e)) return -1;
    if (muse_st_open(dir, &m->st, e)) return -1;
    return load_tensors(m, e);
}

int muse_model_flags_check(const char *dir, long long synthetic, const char *config, long long bits,
                           const char *codebook, muse_err *e)
{
    if (synthetic >= 0 && dir)
        return muse_fail(e, "--model and --synthetic-weights name the weights twice: give one");
    if (synthetic >= 0 && !config)
        return muse_fail(e, "--synthetic-weights SEED needs --config FILE (the shape to fill)");
    if (synthetic < 0 && (config || bits || codebook))
        return muse_fail(e, "--config, --bits and --codebook go with --synthetic-weights SEED");
    if (!dir && synthetic < 0)
        return muse_fail(e, "--model DIR (or --synthetic-weights SEED --config FILE) is required");
    return 0;
}

int muse_model_synthetic(const muse_synthetic *o, muse_model *m, muse_err *e)
{
    memset(m, 0, sizeof *m);
    snprintf(m->dir, sizeof m->dir, "synthetic weights (seed %llu)", (unsigned long long)o->seed);
    if (muse_config_load_file("--config", o->config, &m->cfg, e)) return -1;
    muse_synth_list l = {.dtype = MUSE_DT_F16, .router_bias = 1, .cb = MUSE_CB_MUL1};
    if (o->codebook && muse_codebook_parse(o->codebook, &l.cb))
        return muse_fail(e, "--codebook %s: unknown; use mul1, mcg or 3inst", o->codebook);
    if (o->bits < 0 || o->bits > MUSE_EXL3_MAX_BITS)
        return muse_fail(e, "--bits %d: must be 0 (fp16) or 1 .. %d", o->bits, MUSE_EXL3_MAX_BITS);
    l.exl3_bits = o->bits;
    l.head_bits = o->bits ? 6 : 0;
    if (o->bits) {
        m->cfg.quantized = true;
        m->cfg.quant_bits = o->bits;
        m->cfg.quant_head_bits = 6;
        snprintf(m->cfg.quant_codebook, sizeof m->cfg.quant_codebook, "%s",
                 muse_codebook_name(l.cb));
    }
    muse_synth_specs(&m->cfg, &l);
    m->shapes_only = o->shapes_only;
    int rc = o->shapes_only ? muse_synth_st_shapes(&m->cfg, &l, &m->st, e)
                            : muse_synth_st(&m->cfg, &l, o->seed, &m->st,
                                            o->on_device ? &m->dev_fill : NULL, e);
    muse_synth_free(&l);
    return rc ? -1 : load_tensors(m, e);
}

/* The tensors of m->st checked against m->cfg and grouped per layer. */
static int load_tensors(muse_model *m, muse_err *e)
{
    const muse_config *c = &m->cfg;
    char key[256];
    m->embed = find_prefixed(m, "embed_tokens.weight", key, sizeof key);
    int64_t eshape[2] = {c->vocab_size, c->hidden_size};
    if (expect_shape(m, m->embed, key, 2, eshape, true, e)) goto fail;
    if (load_vector(m, "norm.weight", c->hidden_size, &m->final_norm, e)) goto fail;
    m->layers = MUSE_CALLOC((size_t)c->num_layers, sizeof *m->layers);
    for (int64_t i = 0; i < c->num_layers; i++)
        if (load_layer(m, i, e)) goto fail;
    bool has_head = muse_st_find(m->st, "lm_head.weight") ||
                    muse_st_find(m->st, "lm_head.trellis") ||
                    find_prefixed(m, "lm_head.weight", key, sizeof key) ||
                    find_prefixed(m, "lm_head.trellis", key, sizeof key);
    if (!has_head && c->tie_word_embeddings) {
        m->head.kind = MUSE_LIN_DENSE;
        snprintf(m->head.key, sizeof m->head.key, "%s", m->embed->name);
        m->head.k = c->hidden_size;
        m->head.n = c->vocab_size;
        m->head.w = m->embed;
        m->head.ld = c->hidden_size;
        m->head.shard = MUSE_SHARD_OUTPUT;
        m->head.role = MUSE_ROLE_HEAD;
        m->head.id = m->n_linears++;
    } else if (load_linear(m, "lm_head", c->hidden_size, c->vocab_size, true, true, MUSE_ROLE_HEAD,
                           &m->head, e)) {
        goto fail;
    }
    count_params(m);
    if (!m->dev_fill && !m->shapes_only) prefault(m); /* pages a GPU fills stay untouched */
    return 0;
fail:
    muse_model_free(m);
    return -1;
}

void muse_model_free(muse_model *m)
{
    if (m->layers) {
        for (int64_t i = 0; i < m->cfg.num_layers; i++) {
            muse_layer *ly = &m->layers[i];
            free(ly->input_norm.v);
            free(ly->post_attn_norm.v);
            free(ly->pre_ff_norm.v);
            free(ly->post_ff_norm.v);
            free(ly->router_bias.v);
            if (ly->expert_norm)
                for (int64_t x = 0; x < m->cfg.num_experts; x++) free(ly->expert_norm[x].v);
            free(ly->expert_norm);
            free(ly->experts);
        }
        free(m->layers);
    }
    free(m->final_norm.v);
    muse_synth_devs_free(m->dev_fill);
    muse_st_close(m->st);
    memset(m, 0, sizeof *m);
}

void muse_model_embed_row(const muse_model *m, int64_t token, float *out)
{
    int64_t H = m->cfg.hidden_size;
    for (int64_t j = 0; j < H; j++) out[j] = muse_tensor_f32(m->embed, token * H + j);
}

/* fp16 -> fp32 by table: the dense rows of the CPU backend convert every weight each use. */
static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;
static void build_f16_table(void)
{
    for (uint32_t h = 0; h < 65536; h++) f16_table[h] = muse_f16_to_f32((uint16_t)h);
}

void muse_dense_row(const muse_linear *l, int64_t r, float *out)
{
    const muse_tensor *t = l->w;
    int64_t k = l->k, base = (l->row0 + r) * (l->ld ? l->ld : k) + l->col0;
    if (t->dtype == MUSE_DT_F16) {
        pthread_once(&f16_once, build_f16_table);
        const uint16_t *p = (const uint16_t *)t->data + base;
        for (int64_t j = 0; j < k; j++) out[j] = f16_table[p[j]];
    } else if (t->dtype == MUSE_DT_BF16) {
        const uint16_t *p = (const uint16_t *)t->data + base;
        for (int64_t j = 0; j < k; j++) out[j] = muse_bf16_to_f32(p[j]);
    } else {
        memcpy(out, (const float *)t->data + base, (size_t)k * sizeof(float));
    }
}
