/* Synthetic weights (synthetic.h): the tensor list of a config and its deterministic fill. */
#include "pack/synthetic.h"

#include <math.h>
#include <pthread.h>
#include <sys/mman.h>

#include "base/threadpool.h"

#include "pack/pack_random.h"

static muse_synth_spec *add(muse_synth_list *l, const char *name, muse_dtype dt, int ndim,
                            int64_t a, int64_t b, int64_t c, muse_fill_kind fill)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        MUSE_CHECK(l->v);
    }
    muse_synth_spec *s = &l->v[l->n++];
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
static void add_linear(muse_synth_list *l, const char *key, int64_t k, int64_t n, int bits)
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

static void add_mlp(muse_synth_list *l, const char *base, int64_t H, int64_t I)
{
    char key[256];
    snprintf(key, sizeof key, "%s.gate_proj", base);
    add_linear(l, key, H, I, l->exl3_bits);
    snprintf(key, sizeof key, "%s.up_proj", base);
    add_linear(l, key, H, I, l->exl3_bits);
    snprintf(key, sizeof key, "%s.down_proj", base);
    add_linear(l, key, I, H, l->exl3_bits);
}

void muse_synth_specs(const muse_config *c, muse_synth_list *l)
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

int muse_synth_on_device(const muse_synth_spec *s)
{
    return s->fill == FILL_TRELLIS ||
           ((s->fill == FILL_SUH || s->fill == FILL_SVH) && s->dtype == MUSE_DT_F16);
}

muse_synth_elem muse_synth_elem_of(const muse_synth_spec *s, uint64_t seed)
{
    muse_synth_elem el = {muse_hash_name(s->name, seed), s->bytes / muse_dtype_size(s->dtype), 1.0,
                          s->fill == FILL_TRELLIS ? MUSE_SYNTH_TRELLIS : MUSE_SYNTH_SCALE};
    if (s->fill == FILL_SUH) el.scale = s->scale; /* svh: sign * 1.0 * ... is sign * ... */
    return el;
}

void muse_synth_fill_range(const muse_synth_spec *s, uint64_t seed, void *data, size_t begin,
                           size_t end)
{
    if (muse_synth_on_device(s)) { /* the one copy the kernels run too */
        muse_synth_elem el = muse_synth_elem_of(s, seed);
        for (size_t i = begin; i < end; i++) ((uint16_t *)data)[i] = muse_synth_at(&el, i);
        return;
    }
    uint64_t key = muse_hash_name(s->name, seed);
    size_t n = s->bytes / muse_dtype_size(s->dtype);
    /* each draw only where it is used (the values do not change: pure functions of key, i) */
    int scales = s->fill == FILL_SUH || s->fill == FILL_SVH;
    int normal = !scales && s->fill != FILL_TRELLIS && s->fill != FILL_MARKER;
    for (size_t i = begin; i < end; i++) {
        double z = normal ? muse_normal(key, i) : 0.0;
        double sign = scales && muse_unit(key, i) < 0.5 ? -1.0 : 1.0;
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
        case FILL_TRELLIS: /* muse_synth_on_device: above */
            break;
        /* |W| entries ~ 1/sqrt(k) once the codebook's unit RMS passes both Hadamards */
        case FILL_SUH: /* scales not in fp16 (never made): fp16 ones are above */
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

void muse_synth_fill(const muse_synth_spec *s, uint64_t seed, void *data)
{
    muse_synth_fill_range(s, seed, data, 0, s->bytes / muse_dtype_size(s->dtype));
}

void muse_synth_free(muse_synth_list *l)
{
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

struct muse_synth_devs {
    muse_synth_dev *v;
    size_t n;
    int on_host;
    pthread_mutex_t mu;
};

const muse_synth_dev *muse_synth_devs_find(const muse_synth_devs *d, const void *host)
{
    if (!d) return NULL;
    size_t lo = 0, hi = d->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((const uint8_t *)d->v[mid].host < (const uint8_t *)host)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < d->n && d->v[lo].host == host ? &d->v[lo] : NULL;
}

size_t muse_synth_devs_count(const muse_synth_devs *d)
{
    return d ? d->n : 0;
}

void muse_synth_devs_free(muse_synth_devs *d)
{
    if (!d) return;
    pthread_mutex_destroy(&d->mu);
    free(d->v);
    free(d);
}

/* ---- the fill on all cores: chunks of one tensor's elements ---- */

#define FILL_CHUNK ((size_t)1 << 20)

typedef struct {
    uint8_t *data;
    const muse_synth_spec *s; /* NULL: a device entry, el */
    muse_synth_elem el;
    size_t begin, end;
} fill_chunk;

typedef struct {
    fill_chunk *v;
    size_t n, cap;
    uint64_t seed;
    long parts; /* the pool's threads: part p fills chunks p, p + parts, ... */
} fill_job;

static void add_chunks(fill_job *j, uint8_t *data, const muse_synth_spec *s,
                       const muse_synth_elem *el, size_t n)
{
    for (size_t b = 0; b < n; b += FILL_CHUNK) {
        if (j->n == j->cap) {
            j->cap = j->cap ? 2 * j->cap : 1024;
            j->v = realloc(j->v, j->cap * sizeof *j->v);
            MUSE_CHECK(j->v);
        }
        j->v[j->n++] = (fill_chunk){data, s, el ? *el : (muse_synth_elem){0}, b,
                                    n - b > FILL_CHUNK ? b + FILL_CHUNK : n};
    }
}

static void fill_one(const fill_job *j, size_t c)
{
    const fill_chunk *f = &j->v[c];
    if (f->s) {
        muse_synth_fill_range(f->s, j->seed, f->data, f->begin, f->end);
        return;
    }
    for (size_t i = f->begin; i < f->end; i++) ((uint16_t *)f->data)[i] = muse_synth_at(&f->el, i);
}

/* Parts begin..end of the pool's: part p fills chunks p, p + parts, ..., so the big tensors'
 * chunks (the embeddings come first) spread over every thread, not the first few. */
static void fill_parts(void *ctx, long begin, long end)
{
    const fill_job *j = ctx;
    for (long p = begin; p < end; p++)
        for (size_t c = (size_t)p; c < j->n; c += (size_t)j->parts) fill_one(j, c);
}

static void run_chunks(fill_job *j)
{
    muse_pool *pool = j->n > 1 ? muse_pool_create(0) : NULL;
    j->parts = muse_pool_threads(pool);
    muse_pool_run(pool, fill_parts, j, j->parts); /* one part a thread */
    muse_pool_destroy(pool);
    free(j->v);
    j->v = NULL;
    j->n = j->cap = 0;
}

void muse_synth_devs_to_host(muse_synth_devs *d)
{
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    if (!d->on_host) {
        fill_job j = {0};
        for (size_t i = 0; i < d->n; i++)
            add_chunks(&j, d->v[i].host, NULL, &d->v[i].el, (size_t)d->v[i].el.n);
        run_chunks(&j);
        d->on_host = 1;
    }
    pthread_mutex_unlock(&d->mu);
}

/* muse_synth_st, or with fill 0 muse_synth_st_shapes. */
static int synth_st(const muse_config *c, const muse_synth_list *l, uint64_t seed, int fill,
                    muse_st **out, muse_synth_devs **devs, muse_err *e)
{
    size_t total = 0, n_dev = 0;
    if (devs) *devs = NULL;
    for (size_t i = 0; i < l->n; i++) {
        total += (l->v[i].bytes + 63) / 64 * 64;
        n_dev += devs && muse_synth_on_device(&l->v[i]);
    }
    if (!fill) n_dev = 1; /* no pages reserved: none is ever touched */
    /* anonymous pages: untouched ones cost nothing until filled; with a GPU filling most of
     * them, no reserve either (the host need not hold what only the GPU does) */
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (n_dev ? MAP_NORESERVE : 0);
    void *block = mmap(NULL, total ? total : 1, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (block == MAP_FAILED)
        return muse_fail(e,
                         "synthetic weights: cannot map %.2f GiB; this machine lacks the memory "
                         "for this shape (--config)",
                         (double)total / 1073741824.0);
    muse_tensor *t = MUSE_CALLOC(l->n, sizeof *t);
    muse_synth_devs *d = NULL;
    if (n_dev && devs) {
        d = MUSE_CALLOC(1, sizeof *d);
        d->v = MUSE_CALLOC(n_dev, sizeof *d->v);
        pthread_mutex_init(&d->mu, NULL);
    }
    fill_job j = {.seed = seed};
    size_t at = 0;
    for (size_t i = 0; i < l->n; i++) {
        const muse_synth_spec *s = &l->v[i];
        uint8_t *data = (uint8_t *)block + at;
        t[i].name = strdup(s->name);
        MUSE_CHECK(t[i].name);
        t[i].dtype = s->dtype;
        t[i].ndim = s->ndim;
        t[i].numel = 1;
        for (int k = 0; k < s->ndim; k++) t[i].numel *= (t[i].shape[k] = s->shape[k]);
        t[i].data = data;
        t[i].nbytes = s->bytes;
        if (d && muse_synth_on_device(s)) /* in block order: sorted by host */
            d->v[d->n++] = (muse_synth_dev){data, s->bytes, muse_synth_elem_of(s, seed)};
        else if (fill)
            add_chunks(&j, data, s, NULL, s->bytes / muse_dtype_size(s->dtype));
        at += (s->bytes + 63) / 64 * 64;
    }
    run_chunks(&j);
    (void)c;
    if (muse_st_from_memory(t, l->n, block, total ? total : 1, out, e)) {
        muse_synth_devs_free(d);
        return -1;
    }
    if (devs) *devs = d;
    return 0;
}

int muse_synth_st(const muse_config *c, const muse_synth_list *l, uint64_t seed, muse_st **out,
                  muse_synth_devs **devs, muse_err *e)
{
    return synth_st(c, l, seed, 1, out, devs, e);
}

int muse_synth_st_shapes(const muse_config *c, const muse_synth_list *l, muse_st **out, muse_err *e)
{
    return synth_st(c, l, 0, 0, out, NULL, e);
}
