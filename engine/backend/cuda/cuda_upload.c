/* The CUDA backend's upload and placement: where each tensor of the pack sits in a GPU's copy,
 * the upload of the whole pack (synthetic trellises and scales filled on the GPU itself) or of a
 * lone rank's shard (packed views), the fp32 vectors, the codebooks, and every linear's device
 * descriptor. */

#include "backend/cuda/cuda_internal.h"

#include "base/clock.h"
#include "kernels/linear.cuh"
#include "kernels/synth_fill.cuh"

/* The index of the pack's tensor holding host bytes h (c->tensors is sorted by host). */
size_t tensor_at(const cuda_backend *c, const uint8_t *h)
{
    size_t lo = 0, hi = c->n_tensors;
    while (lo < hi) { /* the last tensor starting at or below h */
        size_t mid = (lo + hi) / 2;
        if (c->tensors[mid].host <= h)
            lo = mid + 1;
        else
            hi = mid;
    }
    MUSE_CHECK(lo > 0);
    const dev_tensor *t = &c->tensors[lo - 1];
    MUSE_CHECK(h < t->host + (t->bytes ? t->bytes : 1));
    return lo - 1;
}

/* The device address of host bytes inside an uploaded tensor, in rank's GPU copy. */
const void *dev_ptr(const cuda_backend *c, const cuda_rank *rk, const void *host)
{
    if (!host) return NULL;
    const uint8_t *h = host;
    size_t i = tensor_at(c, h), off = rk->toff ? rk->toff[i] : c->tensors[i].off;
    MUSE_CHECK(off != NOT_UP); /* a GPU alone uploads every tensor it reads through here */
    return rk->wdev + off + (size_t)(h - c->tensors[i].host);
}

static int by_host(const void *a, const void *b)
{
    const dev_tensor *x = a, *y = b;
    return x->host < y->host ? -1 : x->host > y->host;
}

/* Where each tensor goes in a GPU's copy of the pack (the same for every GPU). */
void lay_out_tensors(cuda_backend *c)
{
    const muse_model *m = c->base.model;
    size_t n = muse_st_count(m->st);
    c->tensors = MUSE_CALLOC(n ? n : 1, sizeof *c->tensors);
    for (size_t i = 0; i < n; i++) {
        const muse_tensor *t = muse_st_at(m->st, i);
        c->tensors[c->n_tensors++] = (dev_tensor){t->data, t->nbytes, 0};
    }
    qsort(c->tensors, c->n_tensors, sizeof *c->tensors, by_host);
    for (size_t i = 0; i < c->n_tensors; i++) {
        c->tensors[i].off = c->pack_bytes;
        c->pack_bytes += (c->tensors[i].bytes + 255) / 256 * 256;
    }
}

static void meter_start(upload_meter *u, int device, size_t all)
{
    u->t0 = u->shown = muse_now_s();
    u->sent = 0;
    u->all = all;
    u->device = device;
}

/* bytes more sent; last: the final line (shown when any line was) */
static void meter_add(upload_meter *u, size_t bytes, int last)
{
    u->sent += bytes;
    double now = muse_now_s();
    if (now - u->shown >= 1.0 || (u->shown > u->t0 && last)) {
        /* a large pack takes minutes: say how far, how fast and how long is left */
        double rate = (double)u->sent / (now - u->t0);
        fprintf(stderr,
                "muse-engine: uploading weights to GPU %d: %.2f of %.2f GB, %.2f GB/s, %.0f s "
                "left\n",
                u->device, (double)u->sent / 1e9, (double)u->all / 1e9, rate / 1e9,
                rate > 0 ? (double)(u->all - u->sent) / rate : 0.0);
        u->shown = now;
    }
}

/* The whole pack at the shared offsets: one rank, or the first of the ranks sharing a GPU.
 * Synthetic tensors left for the GPU (model.h dev_fill) are filled there, not copied. */
int upload_weights(cuda_backend *c, int r)
{
    cuda_rank *rk = &c->rank[r];
    const muse_synth_devs *devs = c->base.model->dev_fill;
    rk->wdev = dalloc(c, c->pack_bytes, &c->base.ranks[r].weights);
    size_t all = 0, filled = 0, n_filled = 0;
    for (size_t i = 0; i < c->n_tensors; i++) all += c->tensors[i].bytes;
    meter_start(&rk->up, rk->device, all);
    double t0 = muse_now_s();
    for (size_t i = 0; i < c->n_tensors && !c->failed; i++) {
        const dev_tensor *t = &c->tensors[i];
        const muse_synth_dev *d = t->bytes ? muse_synth_devs_find(devs, t->host) : NULL;
        if (d && d->bytes == t->bytes) {
            CHECK(c, muse_k_synth_fill(rk->st, d->el, (uint16_t *)(rk->wdev + t->off)));
            filled += t->bytes;
            n_filled++;
        } else {
            CHECK(c, cudaMemcpy(rk->wdev + t->off, t->host, t->bytes, cudaMemcpyHostToDevice));
        }
        meter_add(&rk->up, t->bytes, i + 1 == c->n_tensors);
    }
    if (n_filled && !c->failed && !CHECK(c, cudaStreamSynchronize(rk->st)))
        fprintf(stderr,
                "muse-engine: GPU %d: %zu synthetic tensors (%.2f GB) filled on the GPU, %.2f GB "
                "copied, in %.2f s\n",
                rk->device, n_filled, (double)filled / 1e9, (double)(all - filled) / 1e9,
                muse_now_s() - t0);
    return c->failed ? -1 : 0;
}

/* ---- a GPU holding one rank of several: only what the rank reads ---- */

/* Rank r is the only rank on its GPU, and there are others: it uploads its shard alone.
 * Ranks sharing a GPU keep one whole upload (their shards together are the whole pack). */
int alone(const cuda_backend *c, int r)
{
    if (c->n_ranks < 2) return 0;
    for (int q = 0; q < c->n_ranks; q++)
        if (q != r && c->rank[q].device == c->rank[r].device) return 0;
    return 1;
}

typedef struct {
    cuda_backend *c;
    int r;
    uint8_t *whole; /* [n_tensors] read whole through dev_ptr: uploaded as they are */
    size_t packed;  /* bytes of the packed linears so far */
    int failed;
    muse_err *e;
} shard_job;

static void mark(shard_job *j, const void *host)
{
    if (host) j->whole[tensor_at(j->c, host)] = 1;
}

/* Every tensor linear l reads (its descriptor points into them through dev_ptr). */
static void mark_linear(shard_job *j, const muse_linear *l)
{
    if (l->kind == MUSE_LIN_DENSE) {
        mark(j, l->w->data);
        return;
    }
    const muse_exl3_weight *w = &l->exl3;
    const void *parts[] = {w->trellis, w->suh, w->svh, w->su, w->sv, w->bias};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) mark(j, parts[i]);
}

/* The rank's view of l is all of it (replicated, or a split the rules leave whole). */
static int view_whole(const shard_job *j, const muse_linear *l)
{
    int64_t lo, hi;
    muse_shard_range(j->c->base.model, l, j->r, j->c->n_ranks, &lo, &hi);
    return l->shard == MUSE_SHARD_REPLICATED ||
           (lo == 0 && hi == (l->shard == MUSE_SHARD_INPUT ? l->k : l->n));
}

static void mark_whole_view(void *ctx, const muse_linear *l)
{
    shard_job *j = ctx;
    if (view_whole(j, l)) mark_linear(j, l);
}

/* A split view is packed, unless its weight is uploaded whole anyway (a tied head reads the
 * embeddings): then it reads that upload as the shared path does. */
static void place_packed(void *ctx, const muse_linear *l)
{
    shard_job *j = ctx;
    cuda_rank *rk = &j->c->rank[j->r];
    if (j->failed || view_whole(j, l)) return;
    const void *w = l->kind == MUSE_LIN_DENSE ? l->w->data : (const void *)l->exl3.trellis;
    if (j->whole[tensor_at(j->c, w)]) {
        mark_linear(j, l);
        return;
    }
    int64_t lo, hi;
    muse_linear v;
    muse_shard_range(j->c->base.model, l, j->r, j->c->n_ranks, &lo, &hi);
    if (muse_shard_view(l, lo, hi, j->r == 0, &v, j->e)) {
        j->failed = 1;
        return;
    }
    rk->pack_off[l->id] = j->packed;
    j->packed += muse_shard_packed_bytes(&v); /* a multiple of 256: the next stays aligned */
}

/* Which tensors go whole and where each packed linear goes; then the whole tensors' upload.
 * The packed linears follow in upload_linears, where their descriptors are made. */
int upload_shard(cuda_backend *c, int r, muse_err *e)
{
    cuda_rank *rk = &c->rank[r];
    const muse_model *m = c->base.model;
    muse_model_host_weights(m); /* packed views are cut on the host from the host's bytes */
    size_t nl = (size_t)(m->n_linears > 0 ? m->n_linears : 1), nt = c->n_tensors ? c->n_tensors : 1;
    shard_job j = {c, r, MUSE_CALLOC(nt, 1), 0, 0, e};
    rk->pack_off = MUSE_CALLOC(nl, sizeof *rk->pack_off);
    rk->toff = MUSE_CALLOC(nt, sizeof *rk->toff);
    for (size_t i = 0; i < nl; i++) rk->pack_off[i] = NOT_UP;
    mark(&j, m->embed->data); /* the embeddings and routers every rank reads whole */
    for (int64_t i = 0; i < m->cfg.num_layers; i++)
        if (m->cfg.mlp_kind[i] == MUSE_MLP_MOE) mark(&j, m->layers[i].router->data);
    muse_model_each_linear(m, mark_whole_view, &j);
    muse_model_each_linear(m, place_packed, &j);
    size_t at = 0, all = j.packed;
    for (size_t i = 0; i < c->n_tensors; i++) {
        rk->toff[i] = j.whole[i] ? at : NOT_UP;
        if (j.whole[i]) at += (c->tensors[i].bytes + 255) / 256 * 256; /* as the shared layout */
        if (j.whole[i]) all += c->tensors[i].bytes;
    }
    rk->pack_at = at;
    if (!j.failed) rk->wdev = dalloc(c, at + j.packed, &c->base.ranks[r].weights);
    meter_start(&rk->up, rk->device, all);
    for (size_t i = 0; i < c->n_tensors && !j.failed && !c->failed; i++) {
        if (!j.whole[i]) continue;
        CHECK(c, cudaMemcpy(rk->wdev + rk->toff[i], c->tensors[i].host, c->tensors[i].bytes,
                            cudaMemcpyHostToDevice));
        meter_add(&rk->up, c->tensors[i].bytes, rk->up.sent + c->tensors[i].bytes >= all);
    }
    free(j.whole);
    return j.failed || c->failed ? -1 : 0;
}

static void upload_vec(cuda_backend *c, cuda_rank *rk, const muse_vec *v, size_t *at)
{
    if (!v->v || v->id < 0 || c->failed) return;
    float *d = rk->vec_block + *at;
    *at += (size_t)v->n;
    CHECK(c, cudaMemcpy(d, v->v, (size_t)v->n * sizeof(float), cudaMemcpyHostToDevice));
    rk->vec[v->id] = d;
}

int upload_vectors(cuda_backend *c, int r)
{
    cuda_rank *rk = &c->rank[r];
    const muse_model *m = c->base.model;
    const muse_config *cfg = &m->cfg;
    long H = (long)cfg->hidden_size, E = (long)cfg->num_experts, L = (long)cfg->num_layers;
    size_t floats = (size_t)H * (size_t)(4 * L + 1), at = 0;
    for (long i = 0; i < L; i++)
        if (cfg->mlp_kind[i] == MUSE_MLP_MOE) floats += (size_t)E * (size_t)(H + 1);
    rk->vec = MUSE_CALLOC((size_t)(m->n_vecs > 0 ? m->n_vecs : 1), sizeof *rk->vec);
    rk->router_bias = MUSE_CALLOC((size_t)L, sizeof *rk->router_bias);
    rk->expert_norm = MUSE_CALLOC((size_t)L, sizeof *rk->expert_norm);
    rk->vec_block = dalloc(c, floats * sizeof(float), &c->base.ranks[r].weights);
    if (c->sizing) return 0; /* counted; nothing to copy */
    for (long i = 0; i < L && !c->failed; i++) {
        const muse_layer *ly = &m->layers[i];
        upload_vec(c, rk, &ly->input_norm, &at);
        upload_vec(c, rk, &ly->post_attn_norm, &at);
        upload_vec(c, rk, &ly->pre_ff_norm, &at);
        upload_vec(c, rk, &ly->post_ff_norm, &at);
        if (cfg->mlp_kind[i] != MUSE_MLP_MOE) continue;
        if (ly->router_bias.v) {
            rk->router_bias[i] = rk->vec_block + at;
            at += (size_t)E;
            CHECK(c, cudaMemcpy(rk->router_bias[i], ly->router_bias.v, (size_t)E * sizeof(float),
                                cudaMemcpyHostToDevice));
        }
        if (ly->expert_norm) {
            rk->expert_norm[i] = rk->vec_block + at;
            for (long x = 0; x < E && !c->failed; x++) {
                CHECK(c, cudaMemcpy(rk->vec_block + at, ly->expert_norm[x].v,
                                    (size_t)H * sizeof(float), cudaMemcpyHostToDevice));
                if (ly->expert_norm[x].id >= 0) rk->vec[ly->expert_norm[x].id] = rk->vec_block + at;
                at += (size_t)H;
            }
        }
    }
    upload_vec(c, rk, &m->final_norm, &at);
    MUSE_CHECK(at <= floats);
    return c->failed ? -1 : 0;
}

/* The codebook tables every EXL3 linear of the pack uses, on rank r's GPU. */
static void codebook_need(void *ctx, const muse_linear *l)
{
    int *need = ctx;
    if (l->kind == MUSE_LIN_EXL3) need[l->exl3.cb] = 1;
}

int upload_codebooks(cuda_backend *c, int r)
{
    cuda_rank *rk = &c->rank[r];
    int need[3] = {0, 0, 0};
    muse_model_each_linear(c->base.model, codebook_need, need);
    for (int cb = 0; cb < 3 && !c->failed; cb++) {
        if (!need[cb]) continue;
        rk->cb_tables[cb] = dalloc(c, 65536 * sizeof(float), &c->base.ranks[r].weights);
        if (rk->cb_tables[cb])
            CHECK(c, cudaMemcpy(rk->cb_tables[cb], muse_exl3_value_table(cb), 65536 * sizeof(float),
                                cudaMemcpyHostToDevice));
    }
    return c->failed ? -1 : 0;
}

typedef struct {
    cuda_backend *c;
    int r;
    int failed;
    muse_err *e;
    uint8_t *stage; /* a packed view on the host before its upload (GPU alone), cap bytes */
    size_t cap;
} rank_job;

/* Where descriptor pointers point: into the rank's upload of the pack (stage NULL), or into
 * one packed view at dev, staged at stage on the host. */
typedef struct {
    const cuda_backend *c;
    const cuda_rank *rk;
    const uint8_t *stage;
    uint8_t *dev;
} addr_map;

static const void *addr(const addr_map *a, const void *host)
{
    if (a->c->sizing) return NULL; /* shapes alone: nothing is on a GPU */
    if (!a->stage) return dev_ptr(a->c, a->rk, host);
    return host ? a->dev + ((const uint8_t *)host - a->stage) : NULL;
}

/* The device descriptor of view l, its pointers through a. */
static void fill_desc(const addr_map *a, const muse_linear *l, muse_k_lin *d)
{
    memset(d, 0, sizeof *d);
    if (l->kind == MUSE_LIN_DENSE) {
        d->kind = MUSE_K_DENSE;
        d->dtype = kdtype(l->w->dtype);
        d->k = l->k;
        d->n = l->n;
        d->w = addr(a, l->w->data);
        d->row0 = l->row0;
        d->col0 = l->col0;
        d->ld = l->ld;
        return;
    }
    const muse_exl3_weight *w = &l->exl3;
    d->kind = MUSE_K_EXL3;
    d->path = muse_k_exl3_path_env(); /* MUSE_EXL3_PATH, read at start: checks force a path */
    d->bits = w->bits;
    d->k = w->k;
    d->n = w->n;
    d->trellis = addr(a, w->trellis);
    d->tiles_ld = w->tiles_ld ? w->tiles_ld : w->n / 16;
    d->suh = addr(a, w->suh);
    d->svh = addr(a, w->svh);
    d->su = addr(a, w->su);
    d->sv = addr(a, w->sv);
    d->bias = addr(a, w->bias);
    d->table = a->rk->cb_tables[w->cb];
    d->codebook = (int)w->cb;
}

/* A GPU alone: view l packed on the host, uploaded to its place, described there (the same
 * weights at the same indices: dense rows k long, a trellis row of the view's tiles alone). */
static void describe_packed(rank_job *j, const muse_linear *l, muse_k_lin *d)
{
    cuda_backend *c = j->c;
    cuda_rank *rk = &c->rank[j->r];
    size_t bytes = muse_shard_packed_bytes(l);
    if (bytes > j->cap) {
        free(j->stage);
        j->stage = MUSE_MALLOC(bytes);
        j->cap = bytes;
    }
    muse_tensor t;
    muse_linear p;
    muse_shard_pack(l, j->stage, &t, &p);
    addr_map a = {c, rk, j->stage, rk->wdev + rk->pack_at + rk->pack_off[l->id]};
    if (CHECK(c, cudaMemcpy(a.dev, j->stage, bytes, cudaMemcpyHostToDevice))) {
        j->failed = 1;
        return;
    }
    meter_add(&rk->up, bytes, rk->up.sent + bytes >= rk->up.all);
    fill_desc(&a, &p, d);
}

/* Rank r's view of one linear (the CPU backend's rules) and its device descriptor. */
static void describe(void *ctx, const muse_linear *whole)
{
    rank_job *j = ctx;
    cuda_backend *c = j->c;
    cuda_rank *rk = &c->rank[j->r];
    int64_t lo, hi;
    muse_shard_range(c->base.model, whole, j->r, c->n_ranks, &lo, &hi);
    muse_linear *l = &rk->views[whole->id];
    if (j->failed || muse_shard_view(whole, lo, hi, j->r == 0, l, j->e)) {
        j->failed = 1;
        return;
    }
    muse_k_lin *d = &rk->lin[l->id];
    if (rk->pack_off && rk->pack_off[l->id] != NOT_UP) {
        describe_packed(j, l, d);
        return;
    }
    addr_map a = {c, rk, NULL, NULL};
    fill_desc(&a, l, d);
}

int upload_linears(cuda_backend *c, int r, muse_err *e)
{
    cuda_rank *rk = &c->rank[r];
    const muse_model *m = c->base.model;
    const muse_config *cfg = &m->cfg;
    uint64_t *acct = &c->base.ranks[r].weights;
    long E = (long)cfg->num_experts, L = (long)cfg->num_layers;
    size_t nl = (size_t)(m->n_linears > 0 ? m->n_linears : 1);
    rk->views = MUSE_CALLOC(nl, sizeof *rk->views);
    rk->lin = MUSE_CALLOC(nl, sizeof *rk->lin);
    rank_job j = {c, r, 0, e, NULL, 0};
    muse_model_each_linear(m, describe, &j);
    free(j.stage);
    if (j.failed) return -1;
    if (c->failed) return -1;
    rk->lin_dev = dalloc(c, (size_t)m->n_linears * sizeof *rk->lin, acct);
    if (rk->lin_dev)
        CHECK(c, cudaMemcpy(rk->lin_dev, rk->lin, (size_t)m->n_linears * sizeof *rk->lin,
                            cudaMemcpyHostToDevice));
    if (E > 0) {
        size_t per = (size_t)(3 * E);
        muse_k_lin *h = MUSE_CALLOC(per * (size_t)L, sizeof *h);
        for (long i = 0; i < L; i++) {
            const muse_layer *ly = &m->layers[i];
            if (cfg->mlp_kind[i] != MUSE_MLP_MOE) continue;
            for (long x = 0; x < E; x++) {
                h[(size_t)i * per + (size_t)x] = rk->lin[ly->experts[x].gate.id];
                h[(size_t)i * per + (size_t)(E + x)] = rk->lin[ly->experts[x].up.id];
                h[(size_t)i * per + (size_t)(2 * E + x)] = rk->lin[ly->experts[x].down.id];
            }
        }
        rk->experts = dalloc(c, per * (size_t)L * sizeof *h, acct);
        if (rk->experts)
            CHECK(c,
                  cudaMemcpy(rk->experts, h, per * (size_t)L * sizeof *h, cudaMemcpyHostToDevice));
        free(h);
    }
    return c->failed ? -1 : 0;
}
