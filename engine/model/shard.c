/* Tensor parallelism's rules (shard.h): admission, each rank's heads and weight views. */
#include "model/shard.h"

#include <string.h>

#define SPLIT_ALIGN 128 /* EXL3 tiles are 16 wide and Hadamard blocks 128: splits fall here */

static int width_ok(int64_t width, int ranks)
{
    return width % ranks == 0 && (width / ranks) % SPLIT_ALIGN == 0;
}

int muse_shard_check(const muse_config *c, int ranks, muse_err *e)
{
    if (ranks < 1 || ranks > 64) return muse_fail(e, "--ranks %d: must be 1 .. 64", ranks);
    if (ranks == 1) return 0;
    if (c->n_heads % ranks)
        return muse_fail(e,
                         "--ranks %d does not divide num_attention_heads %lld: use a rank count "
                         "that divides it",
                         ranks, (long long)c->n_heads);
    if (c->n_kv_heads % ranks && ranks % c->n_kv_heads)
        return muse_fail(e,
                         "--ranks %d: num_key_value_heads %lld is neither a multiple nor a divisor "
                         "of it; use a rank count that divides %lld or that %lld divides",
                         ranks, (long long)c->n_kv_heads, (long long)c->n_kv_heads,
                         (long long)c->n_kv_heads);
    int64_t q = c->n_heads * c->head_dim;
    struct {
        const char *field;
        int64_t width;
        int present;
    } w[] = {{"num_attention_heads x head_dim", q, 1},
             {"intermediate_size", c->intermediate_size, c->intermediate_size > 0},
             {"moe_intermediate_size", c->moe_intermediate_size, c->moe_intermediate_size > 0},
             {"num_shared_experts x moe_intermediate_size",
              c->num_shared_experts * c->moe_intermediate_size, c->num_shared_experts > 0}};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        if (w[i].present && !width_ok(w[i].width, ranks))
            return muse_fail(e,
                             "--ranks %d splits %s (%lld) into parts of %lld, not a multiple of "
                             "%d; use a rank count that leaves a multiple of %d a rank",
                             ranks, w[i].field, (long long)w[i].width,
                             (long long)(w[i].width / ranks), SPLIT_ALIGN, SPLIT_ALIGN);
    if ((c->vocab_size + SPLIT_ALIGN - 1) / SPLIT_ALIGN < ranks)
        return muse_fail(e, "--ranks %d: vocab_size %lld has fewer than one 128-row block a rank",
                         ranks, (long long)c->vocab_size);
    return 0;
}

void muse_shard_split(int64_t n, int64_t align, int rank, int ranks, int64_t *lo, int64_t *hi)
{
    int64_t blocks = (n + align - 1) / align, base = blocks / ranks, extra = blocks % ranks;
    int64_t b0 = rank * base + (rank < extra ? rank : extra);
    int64_t b1 = b0 + base + (rank < extra ? 1 : 0);
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}

void muse_shard_heads(const muse_config *c, int rank, int ranks, muse_rank_heads *h)
{
    int64_t per_q = c->n_heads / ranks, group = c->n_heads / c->n_kv_heads;
    h->q0 = rank * per_q;
    h->q1 = h->q0 + per_q;
    h->kv0 = h->q0 / group; /* the KV heads its query heads read */
    h->kv1 = (h->q1 - 1) / group + 1;
}

void muse_shard_range(const muse_model *m, const muse_linear *l, int rank, int ranks, int64_t *lo,
                      int64_t *hi)
{
    muse_shard_range_cfg(&m->cfg, l->role, l->kind, l->shard == MUSE_SHARD_INPUT ? l->k : l->n,
                         rank, ranks, lo, hi);
}

void muse_shard_range_cfg(const muse_config *c, muse_lin_role role, muse_linear_kind kind,
                          int64_t width, int rank, int ranks, int64_t *lo, int64_t *hi)
{
    *lo = 0;
    *hi = width;
    if (ranks <= 1) return;
    muse_rank_heads h;
    muse_shard_heads(c, rank, ranks, &h);
    switch (role) {
    case MUSE_ROLE_Q:
    case MUSE_ROLE_GATE:
    case MUSE_ROLE_O:
        *lo = h.q0 * c->head_dim;
        *hi = h.q1 * c->head_dim;
        break;
    case MUSE_ROLE_K:
    case MUSE_ROLE_V:
        /* a rank's KV heads, unless that cuts an EXL3 Hadamard block: then it computes all */
        if (kind == MUSE_LIN_DENSE || ((h.kv1 - h.kv0) * c->head_dim) % SPLIT_ALIGN == 0) {
            *lo = h.kv0 * c->head_dim;
            *hi = h.kv1 * c->head_dim;
        }
        break;
    case MUSE_ROLE_MLP_IN:
    case MUSE_ROLE_MLP_OUT:
        *lo = width / ranks * rank;
        *hi = *lo + width / ranks;
        break;
    case MUSE_ROLE_HEAD:
        muse_shard_split(width, SPLIT_ALIGN, rank, ranks, lo, hi);
        break;
    }
}

int muse_shard_view(const muse_linear *l, int64_t lo, int64_t hi, int keep_bias, muse_linear *v,
                    muse_err *e)
{
    *v = *l;
    if (l->shard == MUSE_SHARD_REPLICATED) return 0;
    int out = l->shard == MUSE_SHARD_OUTPUT;
    int64_t width = out ? l->n : l->k;
    if (lo < 0 || hi > width || lo >= hi)
        return muse_fail(e, "%s: shard [%lld, %lld) is outside its width %lld", l->key,
                         (long long)lo, (long long)hi, (long long)width);
    if (lo == 0 && hi == width) return 0;
    if (l->kind == MUSE_LIN_DENSE) {
        if (out) {
            v->row0 = l->row0 + lo;
            v->n = hi - lo;
        } else {
            v->col0 = l->col0 + lo;
            v->k = hi - lo;
        }
        return 0;
    }
    if (lo % SPLIT_ALIGN || (hi % SPLIT_ALIGN && hi != width))
        return muse_fail(
            e, "%s: an EXL3 shard must start and end on a multiple of %d, not [%lld, %lld)", l->key,
            SPLIT_ALIGN, (long long)lo, (long long)hi);
    muse_exl3_weight *w = &v->exl3;
    int64_t tile_len = 16 * w->bits, ld = w->tiles_ld ? w->tiles_ld : w->n / 16;
    w->tiles_ld = ld;
    if (out) { /* columns: tiles lo/16 .. of every tile row, svh and bias from lo */
        w->trellis += lo / 16 * tile_len;
        if (w->svh) w->svh += lo;
        if (w->sv) w->sv += lo / 16;
        if (w->bias) w->bias += lo;
        w->n = v->n = hi - lo;
    } else { /* rows: whole tile rows, suh from lo; the bias is added once, on rank 0 */
        w->trellis += lo / 16 * ld * tile_len;
        if (w->suh) w->suh += lo;
        if (w->su) w->su += lo / 16;
        if (!keep_bias) w->bias = NULL;
        w->k = v->k = hi - lo;
    }
    return 0;
}

#define PACK_ALIGN 256 /* where each part of a packed view starts: as the device upload aligns */

static size_t pack_up(size_t b)
{
    return (b + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN;
}

/* The parts of a packed EXL3 view in order: trellis, suh, svh, su, sv, bias (0 when absent). */
static void exl3_parts(const muse_exl3_weight *w, size_t bytes[6])
{
    size_t k = (size_t)w->k, n = (size_t)w->n, h = sizeof(uint16_t);
    bytes[0] = k / 16 * (n / 16) * 16 * (size_t)w->bits * h;
    bytes[1] = w->suh ? k * h : 0;
    bytes[2] = w->svh ? n * h : 0;
    bytes[3] = w->su ? k / 16 * h : 0;
    bytes[4] = w->sv ? n / 16 * h : 0;
    bytes[5] = w->bias ? n * h : 0;
}

size_t muse_shard_packed_bytes(const muse_linear *v)
{
    if (v->kind == MUSE_LIN_DENSE)
        return pack_up((size_t)v->k * (size_t)v->n * muse_dtype_size(v->w->dtype));
    size_t bytes[6], all = 0;
    exl3_parts(&v->exl3, bytes);
    for (int i = 0; i < 6; i++) all += pack_up(bytes[i]);
    return all;
}

/* Row after row of the view's k columns: the strided column band becomes rows k long. */
static void pack_dense(const muse_linear *v, uint8_t *dst, muse_tensor *t, muse_linear *p)
{
    size_t es = muse_dtype_size(v->w->dtype), row = (size_t)v->k * es;
    int64_t ld = v->ld ? v->ld : v->k;
    const uint8_t *src = v->w->data;
    for (int64_t r = 0; r < v->n; r++)
        memcpy(dst + (size_t)r * row, src + (size_t)((v->row0 + r) * ld + v->col0) * es, row);
    *t = *v->w;
    t->data = dst;
    t->ndim = 2;
    t->shape[0] = v->n;
    t->shape[1] = v->k;
    t->numel = v->n * v->k;
    t->nbytes = (size_t)t->numel * es;
    p->w = t;
    p->row0 = p->col0 = 0;
    p->ld = v->k;
}

/* Each tile row's n/16 tiles from the view's trellis (its tiles_ld apart), then the scales. */
static void pack_exl3(const muse_exl3_weight *w, uint8_t *dst, muse_exl3_weight *q)
{
    size_t bytes[6], at = 0;
    exl3_parts(w, bytes);
    int64_t tile_len = 16 * w->bits, tiles = w->n / 16, ld = w->tiles_ld ? w->tiles_ld : tiles;
    size_t row = (size_t)(tiles * tile_len) * sizeof(uint16_t);
    for (int64_t tk = 0; tk < w->k / 16; tk++)
        memcpy(dst + (size_t)tk * row, w->trellis + tk * ld * tile_len, row);
    q->trellis = (const uint16_t *)dst;
    q->tiles_ld = tiles;
    const uint16_t *src[6] = {w->trellis, w->suh, w->svh, w->su, w->sv, w->bias};
    const uint16_t **out[6] = {NULL, &q->suh, &q->svh, &q->su, &q->sv, &q->bias};
    at = pack_up(bytes[0]);
    for (int i = 1; i < 6; i++) {
        if (!src[i]) continue;
        memcpy(dst + at, src[i], bytes[i]);
        *out[i] = (const uint16_t *)(dst + at);
        at += pack_up(bytes[i]);
    }
}

void muse_shard_pack(const muse_linear *v, void *dst, muse_tensor *t, muse_linear *p)
{
    *p = *v;
    if (v->kind == MUSE_LIN_DENSE)
        pack_dense(v, dst, t, p);
    else
        pack_exl3(&v->exl3, dst, &p->exl3);
}

uint64_t muse_linear_bytes(const muse_linear *l)
{
    if (l->kind == MUSE_LIN_DENSE)
        return (uint64_t)l->k * (uint64_t)l->n * muse_dtype_size(l->w->dtype);
    const muse_exl3_weight *w = &l->exl3;
    return (uint64_t)(w->k / 16) * (uint64_t)(w->n / 16) * 16 * (uint64_t)w->bits * 2 +
           (uint64_t)(w->k + w->n) * 2;
}

static void each_mlp(const muse_mlp *p, void (*fn)(void *, const muse_linear *), void *ctx)
{
    fn(ctx, &p->gate);
    fn(ctx, &p->up);
    fn(ctx, &p->down);
}

void muse_model_each_linear(const muse_model *m, void (*fn)(void *ctx, const muse_linear *l),
                            void *ctx)
{
    const muse_config *c = &m->cfg;
    for (int64_t i = 0; i < c->num_layers; i++) {
        const muse_layer *ly = &m->layers[i];
        fn(ctx, &ly->q);
        fn(ctx, &ly->k);
        fn(ctx, &ly->v);
        fn(ctx, &ly->gate);
        fn(ctx, &ly->o);
        if (c->mlp_kind[i] == MUSE_MLP_DENSE) {
            each_mlp(&ly->dense, fn, ctx);
            continue;
        }
        for (int64_t x = 0; x < c->num_experts; x++) each_mlp(&ly->experts[x], fn, ctx);
        if (c->num_shared_experts > 0) each_mlp(&ly->shared, fn, ctx);
    }
    fn(ctx, &m->head);
}

typedef struct {
    const muse_model *m;
    size_t rows, pairs, wanted, floats, doubles;
} ws_job;

/* Whether l is one of a layer's routed experts' linears (the experts' array holds it). */
static int routed_expert(const muse_model *m, const muse_linear *l)
{
    uintptr_t at = (uintptr_t)l;
    for (int64_t i = 0; i < m->cfg.num_layers; i++) {
        const muse_layer *ly = &m->layers[i];
        if (m->cfg.mlp_kind[i] == MUSE_MLP_DENSE || !ly->experts) continue;
        uintptr_t lo = (uintptr_t)ly->experts;
        if (at >= lo && at < lo + (uintptr_t)m->cfg.num_experts * sizeof *ly->experts) return 1;
    }
    return 0;
}

static void ws_need(void *ctx, const muse_linear *l)
{
    ws_job *j = ctx;
    if (l->kind != MUSE_LIN_EXL3) return;
    size_t rows = l == &j->m->head ? j->wanted : routed_expert(j->m, l) ? j->pairs : j->rows;
    size_t a = rows * (size_t)l->exl3.k, t = rows * (size_t)l->exl3.n;
    if (a > j->floats) j->floats = a;
    if (t > j->doubles) j->doubles = t;
}

void muse_model_exl3_ws(const muse_model *m, long rows, long pairs, long wanted, size_t *floats,
                        size_t *doubles)
{
    ws_job j = {m, (size_t)rows, (size_t)pairs, (size_t)wanted, 0, 0};
    muse_model_each_linear(m, ws_need, &j);
    *floats = j.floats;
    *doubles = j.doubles;
}
