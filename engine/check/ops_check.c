/* The kernel checker (in the spirit of ggml's test-backend-ops), run by `muse-engine
 * kernel-check`: every entry of the kernel registry (check/registry.h) expanded to the pack's
 * widths, on random non-zero inputs of several row counts (1, 16, 17, the max), outputs
 * poisoned before the call, compared with the CPU reference backend by relative error; batch
 * invariance bitwise (row r of an M-row call equals the 1-row call), prompt rows equal decode
 * rows (attention), repeatability bitwise, the whole plan padded to a bucket equal to unpadded
 * and graph replay equal to eager launches (backends with graphs). Planted controls (broken
 * variants that exist only in this file, never on a shipped path) must show red. Prints TAP
 * and one SUMMARY line. */
#include "check/ops_check.h"
#include "check/op_cases.h"

#include <float.h>
#include <math.h>

#include "backend/backend.h"
#include "model/forward.h"
#include "model/shard.h"
#include "base/muse_common.h"
#include "text/sampler.h"
#include "check/registry.h"

#define MAX_SEQS 4

static FILE *out_f;                       /* the TAP lines */
static const muse_ops_check_opts *opts_g; /* the ranks and devices of every backend made */

/* one side of a comparison: a backend and its activations by width (op_cases.h) */
typedef muse_op_acts side;

/* ---- a case: one op on rows with global ids, out[M, out_width] ---- */
typedef struct op_case op_case;
typedef void (*case_fn)(side *s, const op_case *k, const int64_t *ids, long M, float *out);
struct op_case {
    char name[96];
    muse_kernel_id kid;
    long in_width, out_width;
    case_fn fn;
    const muse_op_case *oc; /* the shared case (op_cases.h), its record's argument */
    const void *arg;        /* the weight or layer */
    long param;             /* mode, heads, layer */
    double tol;             /* relative L2 against the reference */
    int rows_related;       /* attention: rows of one sequence (checked prompt == decode instead) */
};

static void round_begin(side *s, const int64_t *ids, long M, int seq, const int64_t *pos)
{
    int32_t tok[4096], seqs[4096];
    int64_t p[4096];
    MUSE_CHECK(M <= 4096);
    for (long r = 0; r < M; r++) {
        tok[r] = (int32_t)(muse_op_mix((uint64_t)ids[r]) % (uint64_t)s->be->model->cfg.vocab_size);
        seqs[r] = seq;
        p[r] = pos ? pos[r] : ids[r] % 100;
    }
    muse_round rd = {.rows = M, .tokens = tok, .positions = p, .seqs = seqs};
    muse_err e;
    MUSE_CHECK(s->be->ops->begin_round(s->be, &rd, &e) == 0);
}

static void round_end(side *s)
{
    muse_round_out out;
    muse_err e;
    MUSE_CHECK(s->be->ops->end_round(s->be, &out, &e) == 0);
}

/* A case through its record (op_run.c): inputs, one round around the call, the output. */
static void case_run(side *s, const op_case *k, const int64_t *ids, long M, float *out)
{
    const muse_op_run *r = muse_op_run_of(k->kid);
    r->inputs(s, k->oc, ids, M);
    round_begin(s, ids, M, 0, NULL);
    r->call(s, k->oc);
    round_end(s);
    r->output(s, k->oc, M, out);
}

/* Attention over one sequence: M rows at positions 0 .. M-1 of a fresh slot, or (param2) the
 * same rows as M one-row rounds, the decode path. */
static void attention_rows(side *s, const op_case *k, long M, int seq, int one_by_one, float *out)
{
    const muse_config *c = &s->be->model->cfg;
    long Q = (long)(c->n_heads * c->head_dim), KV = (long)(c->n_kv_heads * c->head_dim);
    int layer = (int)k->param;
    muse_kv_release(&s->be->kv, seq);
    MUSE_CHECK(muse_kv_ensure(&s->be->kv, seq, M) == 0);
    muse_act q = muse_op_act(s, Q, 0), g = muse_op_act(s, Q, 1), o = muse_op_act(s, Q, 2);
    muse_act kk = muse_op_act(s, KV, MUSE_OP_ATT_K), v = muse_op_act(s, KV, MUSE_OP_ATT_V);
    long step = one_by_one ? 1 : M;
    for (long at = 0; at < M; at += step) {
        int64_t ids[4096], pos[4096];
        for (long r = 0; r < step; r++) ids[r] = pos[r] = at + r;
        long hq = Q / s->be->n_ranks; /* rank 0's query heads [0, hq / head_dim) */
        muse_op_write_sliced(s, q, 21, ids, step, Q, 0, hq);
        muse_op_write_sliced(s, g, 22, ids, step, Q, 0, hq);
        muse_op_write_inputs(s, kk, 23, ids, step, KV, 1);
        muse_op_write_inputs(s, v, 24, ids, step, KV, 1);
        muse_op_poison(s, o, Q, step);
        round_begin(s, ids, step, seq, pos);
        s->be->ops->attention(s->be, layer, q, kk, v, g, o);
        round_end(s);
        muse_op_read(s, o, step, Q, out + at * Q);
    }
}

static void case_attention(side *s, const op_case *k, const int64_t *ids, long M, float *out)
{
    (void)ids;
    attention_rows(s, k, M, 1, 0, out);
}

/* ---- sampler rows: logits, parameters, seed and position all from the row id ---- */
static uint64_t hash2(int64_t id, uint64_t salt)
{
    return muse_op_mix((uint64_t)id * 0x100000001b3ull + salt * 0x9e3779b97f4a7c15ull);
}

static long pick(int64_t id, uint64_t salt, long n)
{
    return (long)(hash2(id, salt) % (uint64_t)n);
}

static double unit01(int64_t id, uint64_t salt)
{
    return (double)(hash2(id, salt) >> 11) / 9007199254740992.0;
}

enum {
    SK_PLAIN,
    SK_TIES,
    SK_NAN,
    SK_PLUS_INF,
    SK_MINUS_INF,
    SK_NONE_FINITE,
    SK_ALL_EQUAL,
    SK_HUGE,
    SK_TINY,
    SK_LEVELS,
    SK_ULP,
    SK_KINDS
};

static int sample_kind(int64_t id)
{
    return (int)pick(id, 2, SK_KINDS + 2) % SK_KINDS; /* plain rows twice as often */
}

/* A row of logits of the id's kind: random at a random scale, then exact ties at the top, NaN,
 * +inf (several: the lowest id wins), mostly -inf, nothing finite (all -inf, all NaN, mixed),
 * every logit equal, huge (+-FLT_MAX, so x - max overflows), tiny (subnormal, zeros), a few
 * levels (many equal weights) or 1-ulp steps at the top. */
static void sample_logits(const op_case *k, int64_t id, float *row)
{
    long V = k->in_width;
    float scale = (float)pow(10.0, unit01(id, 1) * 4.0 - 2.0), top = -INFINITY;
    muse_op_fill_row(25, id, V, 0, row);
    for (long j = 0; j < V; j++) {
        row[j] *= scale;
        top = row[j] > top ? row[j] : top;
    }
    long few = 1 + pick(id, 3, 5);
    switch (sample_kind(id)) {
    case SK_TIES: /* several equal maxima, the lowest id must win the tie */
        for (long i = 0; i <= few; i++) row[pick(id, 10 + (uint64_t)i, V)] = top + scale;
        break;
    case SK_NAN:
        for (long i = 0; i < few * 3; i++) row[pick(id, 10 + (uint64_t)i, V)] = NAN;
        break;
    case SK_PLUS_INF:
        for (long i = 0; i < few; i++) row[pick(id, 10 + (uint64_t)i, V)] = INFINITY;
        row[pick(id, 20, V)] = NAN;
        row[pick(id, 21, V)] = -INFINITY;
        break;
    case SK_MINUS_INF: /* all but a few are -inf */
        for (long j = 0; j < V; j++)
            if (pick(id, 100 + (uint64_t)j, 16)) row[j] = -INFINITY;
        break;
    case SK_NONE_FINITE:
        for (long j = 0; j < V; j++) {
            long how = few % 3 ? few % 3 : 1 + pick(id, 100 + (uint64_t)j, 2);
            row[j] = how == 1 ? -INFINITY : NAN;
        }
        break;
    case SK_ALL_EQUAL:
        for (long j = 0; j < V; j++) row[j] = few == 1 ? 0.0f : scale;
        break;
    case SK_HUGE:
        for (long j = 0; j < V; j++) row[j] *= 1e36f;
        row[pick(id, 10, V)] = FLT_MAX;
        row[pick(id, 11, V)] = -FLT_MAX;
        if (few > 2) row[pick(id, 12, V)] = FLT_MAX;
        break;
    case SK_TINY:
        for (long j = 0; j < V; j++) row[j] *= 1e-40f;
        for (long i = 0; i < few; i++) row[pick(id, 10 + (uint64_t)i, V)] = i % 2 ? -0.0f : 0.0f;
        break;
    case SK_LEVELS:
        for (long j = 0; j < V; j++) row[j] = roundf(row[j] / scale) * scale;
        break;
    case SK_ULP: {
        float v = top;
        for (long i = 0; i < few; i++) {
            v = nextafterf(v, INFINITY);
            row[pick(id, 10 + (uint64_t)i, V)] = i % 2 ? v : top;
        }
        break;
    }
    default:
        break;
    }
}

/* Random parameters for the id: temperature 0 (greedy), negative, NaN, tiny (1/T overflows),
 * ordinary and huge; top_k off, negative, 1, random, the vocabulary and above; top_p off,
 * random, 0, above 1, NaN, tiny; min_p off, random, 1, above 1, NaN, tiny; a 64-bit seed. */
static muse_sampling sample_params(int64_t id, long V)
{
    static const float temps[] = {0.0f, 0.0f, -1.0f, NAN, 1e-30f, 1e30f};
    static const float tops[] = {1.0f, 1.0f, 0.0f, 1.5f, NAN, 1e-9f};
    static const float mins[] = {0.0f, 0.0f, 1.0f, 1.5f, NAN, 1e-12f};
    muse_sampling p = {.seed = hash2(id, 4)};
    long t = pick(id, 5, 12), k = pick(id, 6, 10), q = pick(id, 7, 10), m = pick(id, 8, 10);
    p.temperature = t < 6 ? temps[t] : (float)(0.05 + unit01(id, 9) * 2.0);
    long ks[] = {0, 0, 0, -3, 1, 2, 1 + pick(id, 10, V), 1 + pick(id, 11, 64), V, V + 5};
    p.top_k = (int)ks[k];
    p.top_p = q < 6 ? tops[q] : (float)unit01(id, 12);
    p.min_p = m < 6 ? mins[m] : (float)(unit01(id, 13) * 0.3);
    return p;
}

/* The draw position: small, or anywhere in the int64 range. */
static int64_t sample_pos(int64_t id)
{
    return pick(id, 14, 2) ? pick(id, 15, 100000) : (int64_t)(hash2(id, 16) >> 1);
}

enum { MK_FREE, MK_HALF, MK_FEW, MK_NONE, MK_ALL, MK_RANGE, MK_KINDS };

static int mask_kind(int64_t id)
{
    long k = pick(id, 30, 2 * (MK_KINDS - 1)); /* free rows as often as masked ones */
    return k < MK_KINDS - 1 ? MK_FREE : (int)(k - (MK_KINDS - 1)) + 1;
}

/* The id's token mask into mask ((V + 7) / 8 bytes); 0 for a free row (no mask). Masked rows:
 * each token allowed at random, a few tokens, none (token 0 then, as for an all -inf row),
 * every token, or one run of ids; the unused bits past V set at random (never read). */
static int sample_mask(int64_t id, long V, uint8_t *mask)
{
    int kind = mask_kind(id);
    long nb = (V + 7) / 8, lo = pick(id, 31, V), hi = lo + 1 + pick(id, 32, V - lo);
    if (kind == MK_FREE) return 0;
    memset(mask, 0, (size_t)nb);
    for (long j = 0; j < V; j++) {
        unsigned on = kind == MK_HALF
                          ? (unsigned)(hash2(id, 200 + (uint64_t)j / 64) >> (j % 64)) & 1
                      : kind == MK_RANGE ? j >= lo && j < hi
                                         : kind == MK_ALL;
        mask[j >> 3] |= (uint8_t)(on << (j & 7));
    }
    if (kind == MK_FEW)
        for (long i = 0; i < 1 + pick(id, 33, 8); i++) {
            long t = pick(id, 40 + (uint64_t)i, V);
            mask[t >> 3] |= (uint8_t)(1u << (t & 7));
        }
    for (long j = V; j < nb * 8; j++)
        mask[j >> 3] |= (uint8_t)(pick(id, 50 + (uint64_t)j, 2) << (j & 7));
    return 1;
}

static void case_sample(side *s, const op_case *k, const int64_t *ids, long M, float *out)
{
    const muse_model *m = s->be->model;
    long V = k->out_width, N = (long)m->head.n;
    muse_act lg = muse_op_act(s, N, 1);
    V = k->in_width;
    float *x = MUSE_MALLOC((size_t)(M * N) * sizeof *x);
    for (long r = 0; r < M; r++) sample_logits(k, ids[r], x + r * V); /* [M, V] contiguous */
    s->be->ops->write(s->be, lg, x, M);
    int32_t tok[4096], seqs[4096];
    int64_t pos[4096], draw[4096];
    muse_sampling sp[4096];
    size_t nb = (size_t)(V + 7) / 8;
    uint8_t *bits = MUSE_MALLOC((size_t)M * nb);
    const uint8_t **masks = MUSE_MALLOC((size_t)M * sizeof *masks);
    for (long r = 0; r < M; r++) {
        tok[r] = 1;
        seqs[r] = 0;
        pos[r] = 0;
        draw[r] = sample_pos(ids[r]);
        sp[r] = sample_params(ids[r], V);
        masks[r] = sample_mask(ids[r], V, bits + (size_t)r * nb) ? bits + (size_t)r * nb : NULL;
    }
    muse_round rd = {.rows = M,
                     .tokens = tok,
                     .positions = pos,
                     .seqs = seqs,
                     .sampling = sp,
                     .draw_pos = draw,
                     .masks = masks};
    muse_err e;
    MUSE_CHECK(s->be->ops->begin_round(s->be, &rd, &e) == 0);
    s->be->ops->sample(s->be, lg);
    muse_round_out o;
    MUSE_CHECK(s->be->ops->end_round(s->be, &o, &e) == 0 && o.wanted == M && o.tokens);
    for (long r = 0; r < M; r++) out[r] = (float)o.tokens[r];
    free(x);
    free(bits);
    free(masks);
}

/* ---- checks ---- */
typedef struct {
    int quiet; /* controls: count reds, print nothing */
    int checks, passed, failed;
    int tap;
    muse_kernel_id kid;         /* the registry entry being checked */
    int kfail[MUSE_K_COUNT];    /* an entry with a red check */
    int kpresent[MUSE_K_COUNT]; /* an entry this pack has */
} tally;

static void check(tally *t, int good, const char *fmt, const char *name, long M, const char *what)
{
    t->checks++;
    t->kpresent[t->kid] = 1;
    if (good) {
        t->passed++;
    } else {
        t->failed++;
        t->kfail[t->kid] = 1;
    }
    if (t->quiet) return;
    fprintf(out_f, "%sok %d - %s M=%ld: %s\n", good ? "" : "not ", ++t->tap, name, M, what);
    (void)fmt;
}

static double rel_l2(const float *a, const float *b, long n, int *nan)
{
    double num = 0, den = 0;
    *nan = 0;
    for (long i = 0; i < n; i++) {
        if (!isfinite(a[i])) *nan = 1;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Every check of one case at one row count. */
static void run_case(tally *t, side *test, side *ref, const op_case *k, long M)
{
    long W = k->out_width;
    float *a = MUSE_MALLOC((size_t)(M * W) * sizeof *a),
          *b = MUSE_MALLOC((size_t)(M * W) * sizeof *b);
    float *again = MUSE_MALLOC((size_t)(M * W) * sizeof *again),
          *one = MUSE_MALLOC((size_t)W * sizeof *one);
    int64_t ids[4096];
    for (long r = 0; r < M; r++) ids[r] = 1000 * M + r * 7 + 3;
    k->fn(test, k, ids, M, a);
    k->fn(ref, k, ids, M, b);
    int nan;
    double err = rel_l2(a, b, M * W, &nan);
    char what[160];
    snprintf(what, sizeof what, "outputs written (no poison left)");
    check(t, !nan, "", k->name, M, what);
    snprintf(what, sizeof what, "relative L2 %.2e against the %s (bound %.0e)", err,
             opts_g->kernels == MUSE_KERNELS_FAST ? "exact path" : "reference", k->tol);
    check(t, !nan && err <= k->tol, "", k->name, M, what);
    k->fn(test, k, ids, M, again);
    check(t, memcmp(a, again, (size_t)(M * W) * sizeof *a) == 0, "", k->name, M,
          "repeatable bitwise");
    if (k->rows_related) {
        attention_rows(test, k, M, 2, 1, again);
        check(t, memcmp(a, again, (size_t)(M * W) * sizeof *a) == 0, "", k->name, M,
              "prompt rows equal decode rows bitwise");
    } else if (M > 1) {
        int same = 1;
        long rows[3] = {0, M / 2, M - 1};
        for (int i = 0; i < 3; i++) {
            k->fn(test, k, &ids[rows[i]], 1, one);
            same &= memcmp(one, a + rows[i] * W, (size_t)W * sizeof *one) == 0;
        }
        check(t, same, "", k->name, M, "rows 0, M/2, M-1 equal the 1-row call bitwise");
        if (opts_g->kernels == MUSE_KERNELS_FAST) { /* the fast path: every place in the batch */
            int64_t rev[4096];
            for (long r = 0; r < M; r++) rev[r] = ids[M - 1 - r];
            k->fn(test, k, rev, M, again);
            same = 1;
            for (long r = 0; r < M; r++)
                same &= memcmp(again + r * W, a + (M - 1 - r) * W, (size_t)W * sizeof *a) == 0;
            check(t, same, "", k->name, M, "the batch reversed gives every row its bits");
        }
    }
    free(a);
    free(b);
    free(again);
    free(one);
}

/* ---- the cases of a model (op_cases.c), each with the function that runs it here ---- */
static case_fn case_fn_of(muse_kernel_id kid)
{
    if (kid == MUSE_K_ATTN_SLIDING || kid == MUSE_K_ATTN_FULL)
        return case_attention; /* rows of one sequence: prompt and decode rounds of its own */
    if (kid == MUSE_K_SAMPLE) return case_sample; /* the host sampler's rows and parameters */
    const muse_op_run *r = muse_op_run_of(kid);
    MUSE_CHECK(r != NULL && r->output != NULL); /* a registry entry without a case */
    return case_run;
}

static int make_cases(const muse_model *m, op_case *cs)
{
    static muse_op_case oc[MUSE_OP_MAX_CASES];
    int n = muse_op_cases(m, oc);
    for (int i = 0; i < n; i++) {
        op_case *k = &cs[i];
        memset(k, 0, sizeof *k);
        memcpy(k->name, oc[i].name, sizeof k->name); /* both 96 bytes */
        k->kid = oc[i].kid;
        k->in_width = oc[i].in_width;
        k->out_width = oc[i].out_width;
        k->fn = case_fn_of(oc[i].kid);
        k->oc = &oc[i];
        k->arg = oc[i].arg;
        k->param = oc[i].param;
        const muse_kernel_entry *ke = muse_kernel_entry_of(oc[i].kid);
        k->tol = opts_g->kernels == MUSE_KERNELS_FAST
                     ? muse_kernel_tol_fast(ke, muse_op_round16(&oc[i]))
                     : ke->tol;
        k->rows_related = k->fn == case_attention;
    }
    return n;
}

/* ---- planted controls: the CPU backend with one op broken, compiled only here ---- */
static const muse_backend_ops *real_ops;
static muse_backend_ops broken_ops;
static long round_rows;
static int calls;

static int ctl_begin(muse_backend *be, const muse_round *r, muse_err *e)
{
    round_rows = r->rows;
    return real_ops->begin_round(be, r, e);
}

/* a row off by one: row r gets row r+1's result */
static void ctl_norm_off_by_one(muse_backend *be, muse_act x, long width, const muse_vec *w,
                                muse_norm_weight mode, float eps, int round16, muse_act out)
{
    real_ops->norm(be, x, width, w, mode, eps, round16, out);
    float *t = MUSE_MALLOC((size_t)(be->opts.max_rows * width) * sizeof *t);
    real_ops->read(be, out, t, round_rows);
    if (round_rows > 1) memmove(t, t + width, (size_t)((round_rows - 1) * width) * sizeof *t);
    real_ops->write(be, out, t, round_rows);
    free(t);
}

/* a sum order that depends on M: the last bit of row 0 moves when the call has more rows */
static void ctl_linear_order_by_m(muse_backend *be, const muse_linear *l, muse_act x, int round16,
                                  muse_act y)
{
    real_ops->linear(be, l, x, round16, y);
    if (round_rows < 2) return;
    float *t = MUSE_MALLOC((size_t)(be->opts.max_rows * l->n) * sizeof *t);
    real_ops->read(be, y, t, round_rows);
    for (long j = 0; j < l->n; j++) t[j] = muse_bits_to_f32(muse_f32_to_bits(t[j]) ^ 1u);
    real_ops->write(be, y, t, round_rows);
    free(t);
}

/* a fast kernel that switches variants at 17 rows: every result's last bit moves from there
 * on, well inside the fast path's bound, so only batch invariance can see it */
static void ctl_linear_variant_at_17(muse_backend *be, const muse_linear *l, muse_act x,
                                     int round16, muse_act y)
{
    real_ops->linear(be, l, x, round16, y);
    if (round_rows < 17) return;
    float *t = MUSE_MALLOC((size_t)(be->opts.max_rows * l->n) * sizeof *t);
    real_ops->read(be, y, t, round_rows);
    for (long j = 0; j < round_rows * l->n; j++)
        t[j] = muse_bits_to_f32(muse_f32_to_bits(t[j]) ^ 1u);
    real_ops->write(be, y, t, round_rows);
    free(t);
}

/* a racy reduction: every other call's result differs in a low bit */
static void ctl_swiglu_racy(muse_backend *be, muse_act g, muse_act u, long width, muse_act o)
{
    real_ops->swiglu(be, g, u, width, o);
    if (++calls % 2) return;
    float *t = MUSE_MALLOC((size_t)(be->opts.max_rows * width) * sizeof *t);
    real_ops->read(be, o, t, round_rows);
    t[round_rows * width - 1] = muse_bits_to_f32(muse_f32_to_bits(t[round_rows * width - 1]) ^ 1u);
    real_ops->write(be, o, t, round_rows);
    free(t);
}

/* a row left unwritten: the last row of embed keeps whatever was there */
static void ctl_embed_short(muse_backend *be, muse_act out)
{
    long H = (long)be->model->cfg.hidden_size;
    float *keep = MUSE_MALLOC((size_t)(be->opts.max_rows * H) * sizeof *keep);
    real_ops->read(be, out, keep, round_rows);
    real_ops->embed(be, out);
    float *t = MUSE_MALLOC((size_t)(be->opts.max_rows * H) * sizeof *t);
    real_ops->read(be, out, t, round_rows);
    memcpy(t + (round_rows - 1) * H, keep + (round_rows - 1) * H, (size_t)H * sizeof *t);
    real_ops->write(be, out, t, round_rows);
    free(t);
    free(keep);
}

/* a wrong tie order in top-k: where the top of a row is tied, the higher id wins (its logit
 * nudged up one ulp before the real draw) */
static void ctl_sample_tie_high(muse_backend *be, muse_act logits)
{
    long N = (long)be->model->head.n, V = (long)be->model->cfg.vocab_size;
    float *t = MUSE_MALLOC((size_t)(be->opts.max_rows * N) * sizeof *t);
    real_ops->read(be, logits, t, round_rows);
    for (long r = 0; r < round_rows; r++) {
        float *row = t + r * V, top = -INFINITY;
        long last = -1, count = 0;
        for (long j = 0; j < V; j++)
            if (row[j] > top)
                top = row[j], last = j, count = 1;
            else if (row[j] == top)
                last = j, count++;
        if (count > 1 && isfinite(top)) row[last] = nextafterf(top, INFINITY);
    }
    real_ops->write(be, logits, t, round_rows);
    free(t);
    real_ops->sample(be, logits);
}

/* the masks dropped: every row drawn as if free */
static int ctl_begin_unmasked(muse_backend *be, const muse_round *r, muse_err *e)
{
    muse_round free_rows = *r;
    free_rows.masks = NULL;
    return ctl_begin(be, &free_rows, e);
}

typedef struct {
    const char *name, *op;
    void (*plant)(muse_backend_ops *o);
} control;

static void plant_norm(muse_backend_ops *o)
{
    o->norm = ctl_norm_off_by_one;
}
static void plant_linear(muse_backend_ops *o)
{
    o->linear = ctl_linear_order_by_m;
}
static void plant_linear_variant(muse_backend_ops *o)
{
    o->linear = ctl_linear_variant_at_17;
}
static void plant_swiglu(muse_backend_ops *o)
{
    o->swiglu = ctl_swiglu_racy;
}
static void plant_embed(muse_backend_ops *o)
{
    o->embed = ctl_embed_short;
}
static void plant_sample(muse_backend_ops *o)
{
    o->sample = ctl_sample_tie_high;
}
static void plant_sample_unmasked(muse_backend_ops *o)
{
    o->begin_round = ctl_begin_unmasked;
}

static const control controls[] = {
    {"norm: a row off by one", "norm", plant_norm},
    {"linear: a sum order that depends on M", "linear", plant_linear},
    {"linear: a variant switched at 17 rows (inside the fast bound)", "linear",
     plant_linear_variant},
    {"swiglu: a racy, order-dependent reduction", "swiglu", plant_swiglu},
    {"embed: a row left unwritten", "embed", plant_embed},
    {"sample: a wrong tie order in top-k (higher id first)", "sample", plant_sample},
    {"sample: the token masks ignored", "sample", plant_sample_unmasked},
};

/* A backend of the check: kernels the path (the tested side: the checked one; references:
 * exact). */
static muse_backend *make_path(const char *name, const muse_model *m, long max_rows,
                               muse_kernels kernels, muse_err *e)
{
    muse_backend_opts o = {.max_rows = max_rows,
                           .max_seqs = MAX_SEQS,
                           .context = max_rows + 8,
                           .threads = 2,
                           .snapshot_slots = 1,
                           .ranks = opts_g->ranks,
                           .kernels = kernels};
    memcpy(o.devices, opts_g->devices, sizeof o.devices);
    return muse_backend_create(name, m, &o, e);
}

/* The tested path of the backend under check. */
static muse_backend *make(const char *name, const muse_model *m, long max_rows, muse_err *e)
{
    return make_path(name, m, max_rows, opts_g->kernels, e);
}

/* A forward over a 17-row prompt (in rounds of chunk rows; 0: one round) then 3 one-row
 * decode rounds; logits of every row into lg. */
static int forward_logits(muse_backend *be, long chunk, float *lg, muse_err *e)
{
    long V = (long)be->model->cfg.vocab_size;
    muse_forward *f = muse_forward_create(be);
    int32_t tok[17], seq[17] = {0};
    int64_t pos[17];
    if (chunk <= 0) chunk = 17;
    for (long at = 0; at < 20;) {
        long rows = at < 17 ? (17 - at < chunk ? 17 - at : chunk) : 1;
        for (long i = 0; i < rows; i++)
            tok[i] = (int32_t)(((at + i) * 37 + 5) % V), pos[i] = at + i, seq[i] = 0;
        MUSE_CHECK(muse_kv_ensure(&be->kv, 0, at + rows) == 0);
        muse_round rd = {
            .rows = rows, .tokens = tok, .positions = pos, .seqs = seq, .return_logits = 1};
        muse_round_out out;
        if (muse_forward_run(f, &rd, &out, e) || out.wanted != rows) {
            muse_forward_destroy(f);
            return -1;
        }
        memcpy(lg + at * V, out.logits, (size_t)(rows * V) * sizeof *lg);
        at += rows;
    }
    muse_forward_destroy(f);
    return 0;
}

/* The whole plan: 17 rows padded up to a bucket give the real rows the bits of an unpadded
 * round (exact path: of the CPU's; fast path: of the same path unpadded); the prompt read in
 * chunks of 5 gives the bits of one round; and where the backend replays rounds as graphs
 * (cuda), replay equals eager launches (MUSE_CUDA_GRAPHS=0). */
static void check_forward(tally *t, const muse_model *m, const char *name, long max_rows)
{
    muse_err e = {{0}};
    if (max_rows < 32) max_rows = 32; /* a bucket above 17 rows to pad to */
    muse_backend_opts o = {.max_rows = max_rows,
                           .max_seqs = 1,
                           .context = max_rows + 8,
                           .threads = 2,
                           .ranks = opts_g->ranks,
                           .kernels = opts_g->kernels};
    memcpy(o.devices, opts_g->devices, sizeof o.devices);
    int fast = opts_g->kernels == MUSE_KERNELS_FAST;
    long V = (long)m->cfg.vocab_size, n = 20 * V;
    float *lg[4];
    for (int i = 0; i < 4; i++) lg[i] = MUSE_CALLOC((size_t)n, sizeof(float));
    muse_backend *padded = muse_backend_create(name, m, &o, &e);
    o.exact_rows = 1;
    muse_backend *exact = muse_backend_create(fast ? name : "cpu", m, &o, &e);
    MUSE_CHECK(padded && exact);
    int ok = forward_logits(padded, 0, lg[0], &e) == 0 && forward_logits(exact, 0, lg[1], &e) == 0;
    check(t, ok && muse_backend_bucket(padded, 17) > 17 && !memcmp(lg[0], lg[1], 17 * V * 4), "",
          "forward, 17 rows padded to a bucket", 17,
          fast ? "the real rows' logits equal an unpadded round of the same path bitwise"
               : "the real rows' logits equal an unpadded round bitwise");
    ok = forward_logits(padded, 5, lg[3], &e) == 0;
    check(t, ok && !memcmp(lg[0], lg[3], (size_t)n * 4), "", "forward, prompt in chunks of 5", 17,
          "every row's logits equal the prompt read in one round, bitwise");
    muse_backend_destroy(padded);
    muse_backend_destroy(exact);
    if (strcmp(name, "cuda")) {
        fprintf(out_f, "ok %d - forward graph replay: # skip backend %s has no graphs\n", ++t->tap,
                name);
    } else {
        const char *was = getenv("MUSE_CUDA_GRAPHS");
        char *keep = was ? strdup(was) : NULL;
        setenv("MUSE_CUDA_GRAPHS", "0", 1);
        o.exact_rows = 0;
        muse_backend *eager = muse_backend_create(name, m, &o, &e);
        if (keep)
            setenv("MUSE_CUDA_GRAPHS", keep, 1);
        else
            unsetenv("MUSE_CUDA_GRAPHS");
        free(keep);
        MUSE_CHECK(eager);
        ok = forward_logits(eager, 0, lg[2], &e) == 0;
        check(t, ok && !memcmp(lg[0], lg[2], (size_t)n * 4), "",
              "forward, prompt then 3 decode rounds", 17,
              "graph replay equals eager launches (MUSE_CUDA_GRAPHS=0) bitwise");
        muse_backend_destroy(eager);
    }
    for (int i = 0; i < 4; i++) free(lg[i]);
}

/* The sampler against the host's muse_sample: rows random rows (sample_logits, sample_params,
 * sample_pos), drawn by the backend's sample op in rounds of up to batch rows. */
static void check_sampler_host(tally *t, side *test, const op_case *k, long rows, long batch)
{
    long V = k->in_width;
    float *drawn = MUSE_MALLOC((size_t)batch * sizeof *drawn),
          *row = MUSE_MALLOC((size_t)V * sizeof *row);
    uint8_t *mask = MUSE_MALLOC((size_t)(V + 7) / 8);
    long masked = 0;
    int64_t *ids = MUSE_MALLOC((size_t)batch * sizeof *ids);
    muse_sampler *smp = muse_sampler_create(V);
    long bad = 0;
    int64_t bad_id = 0, bad_got = 0, bad_want = 0;
    for (long at = 0; at < rows; at += batch) {
        long B = rows - at < batch ? rows - at : batch;
        for (long r = 0; r < B; r++) ids[r] = 5000 + at + r;
        k->fn(test, k, ids, B, drawn);
        for (long r = 0; r < B; r++) {
            sample_logits(k, ids[r], row);
            muse_sampling p = sample_params(ids[r], V);
            int on = sample_mask(ids[r], V, mask);
            masked += on;
            int64_t want = muse_sample_masked(smp, row, on ? mask : NULL, &p, sample_pos(ids[r]));
            if ((int64_t)drawn[r] == want) continue;
            if (!bad++) bad_id = ids[r], bad_got = (int64_t)drawn[r], bad_want = want;
        }
    }
    char what[240];
    snprintf(what, sizeof what,
             "every draw (rounds of %ld rows) equals the host sampler's: random parameters, "
             "seeds, positions; ties, NaN, +-inf, equal, huge, tiny rows; %ld rows masked "
             "(muse_sample_masked)",
             batch, masked);
    check(t, bad == 0, "", "sample", rows, what);
    if (bad && !t->quiet) {
        muse_sampling p = sample_params(bad_id, V);
        fprintf(
            out_f,
            "# %ld of %ld draws differ; the first: row id %lld (kind %d, mask %d), temperature %g, "
            "top_k %d, top_p %g, min_p %g, seed %llu, position %lld: backend %lld, host "
            "%lld\n",
            bad, rows, (long long)bad_id, sample_kind(bad_id), mask_kind(bad_id),
            (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p,
            (unsigned long long)p.seed, (long long)sample_pos(bad_id), (long long)bad_got,
            (long long)bad_want);
    }
    muse_sampler_destroy(smp);
    free(mask);
    free(ids);
    free(row);
    free(drawn);
}

/* The EXL3 product's two CUDA paths (kernels/linear.cu, MUSE_EXL3_PATH read at backend start):
 * for every EXL3 linear and the moe (experts: a descriptor a row) at each row count, the tiles
 * path equals the small-M path bitwise and each is within the bound of the CPU. A backend with
 * one path (cpu) ignores the variable: the same checks then hold trivially (the wiring runs). */
static void check_exl3_paths(tally *t, const muse_model *m, const char *name, side *ref,
                             const op_case *cs, int n, long max_rows, const long *shapes,
                             int n_shapes)
{
    static const char *const paths[2] = {"small", "tiles"};
    int any = 0;
    for (int i = 0; i < n; i++) any |= cs[i].kid == MUSE_K_LINEAR_EXL3;
    if (!any) return; /* not an EXL3 pack: the entry says skip */
    muse_err e = {{0}};
    side by[2] = {{0}, {0}};
    const char *was = getenv("MUSE_EXL3_PATH");
    char *keep = was ? strdup(was) : NULL;
    for (int p = 0; p < 2; p++) {
        setenv("MUSE_EXL3_PATH", paths[p], 1);
        by[p].be = make(name, m, max_rows, &e);
        MUSE_CHECK(by[p].be);
    }
    if (keep)
        setenv("MUSE_EXL3_PATH", keep, 1);
    else
        unsetenv("MUSE_EXL3_PATH");
    free(keep);
    for (int i = 0; i < n; i++) {
        const op_case *k = &cs[i];
        if (k->kid != MUSE_K_LINEAR_EXL3 && k->kid != MUSE_K_MOE) continue;
        for (int sh = 0; sh < n_shapes; sh++) {
            long M = shapes[sh], W = k->out_width;
            int64_t ids[4096];
            float *o[3];
            for (int j = 0; j < 3; j++) o[j] = MUSE_MALLOC((size_t)(M * W) * sizeof(float));
            for (long r = 0; r < M; r++) ids[r] = 3000 * M + r * 5 + 1;
            k->fn(&by[0], k, ids, M, o[0]);
            k->fn(&by[1], k, ids, M, o[1]);
            k->fn(ref, k, ids, M, o[2]);
            char nm[128], what[160];
            snprintf(nm, sizeof nm, "%.96s, paths", k->name);
            check(t, !memcmp(o[0], o[1], (size_t)(M * W) * sizeof(float)), "", nm, M,
                  "the tiles path equals the small-M path bitwise");
            for (int p = 0; p < 2; p++) {
                int nan;
                double err = rel_l2(o[p], o[2], M * W, &nan);
                snprintf(what, sizeof what,
                         "%s path: relative L2 %.2e against the cpu (bound %.0e)", paths[p], err,
                         k->tol);
                check(t, !nan && err <= k->tol, "", nm, M, what);
            }
            for (int j = 0; j < 3; j++) free(o[j]);
        }
    }
    for (int p = 0; p < 2; p++) muse_backend_destroy(by[p].be);
}

/* A snapshot slot brings a sliding layer back: decode after a load equals decode after the
 * prompt itself. */
static void check_snapshot(tally *t, side *test, const muse_model *m)
{
    for (int i = 0; i < (int)m->cfg.num_layers; i++) {
        if (m->cfg.attn_kind[i] != MUSE_ATTN_SLIDING) continue;
        op_case k = {.param = i, .out_width = (long)(m->cfg.n_heads * m->cfg.head_dim)};
        long M = 17, Q = k.out_width;
        float *p = MUSE_MALLOC((size_t)(M * Q) * sizeof *p);
        attention_rows(test, &k, M, 1, 0, p); /* the prompt on seq 1 */
        test->be->ops->snapshot_save(test->be, 1, M, 0);
        test->be->ops->snapshot_load(test->be, 3, M, 0);
        float *d1 = MUSE_MALLOC((size_t)Q * sizeof *d1), *d3 = MUSE_MALLOC((size_t)Q * sizeof *d3);
        for (int seq = 1; seq <= 3; seq += 2) {
            const muse_config *c = &m->cfg;
            long KV = (long)(c->n_kv_heads * c->head_dim);
            MUSE_CHECK(muse_kv_ensure(&test->be->kv, seq, M + 1) == 0);
            muse_act q = muse_op_act(test, Q, 0), g = muse_op_act(test, Q, 1),
                     o = muse_op_act(test, Q, 2);
            muse_act kk = muse_op_act(test, KV, MUSE_OP_ATT_K),
                     v = muse_op_act(test, KV, MUSE_OP_ATT_V);
            int64_t id = M, pos = M;
            muse_op_write_inputs(test, q, 21, &id, 1, Q, 1);
            muse_op_write_inputs(test, g, 22, &id, 1, Q, 1);
            muse_op_write_inputs(test, kk, 23, &id, 1, KV, 1);
            muse_op_write_inputs(test, v, 24, &id, 1, KV, 1);
            round_begin(test, &id, 1, seq, &pos);
            test->be->ops->attention(test->be, i, q, kk, v, g, o);
            round_end(test);
            muse_op_read(test, o, 1, Q, seq == 1 ? d1 : d3);
        }
        char nm[64];
        snprintf(nm, sizeof nm, "snapshot slot, attention layer %d", i);
        check(t, memcmp(d1, d3, (size_t)Q * sizeof *d1) == 0, "", nm, 1,
              "decode after snapshot_load equals decode after the prompt, bitwise");
        free(p);
        free(d1);
        free(d3);
        break;
    }
}

/* Each control must turn at least one check of its op red; returns the reds. */
static int check_controls(tally *t, const muse_model *m, side *ref, const op_case *cs, int n,
                          long max_rows, const long *shapes, int n_shapes)
{
    int red = 0;
    muse_err e = {{0}};
    for (size_t c = 0; c < sizeof controls / sizeof *controls; c++) {
        side bad = {0};
        bad.be = make("cpu", m, max_rows, &e);
        MUSE_CHECK(bad.be);
        real_ops = bad.be->ops;
        broken_ops = *real_ops;
        broken_ops.begin_round = ctl_begin;
        controls[c].plant(&broken_ops);
        bad.be->ops = &broken_ops;
        tally ct = {.quiet = 1};
        for (int i = 0; i < n; i++)
            if (!strcmp(muse_kernel_entry_of(cs[i].kid)->op, controls[c].op))
                for (int s = 0; s < n_shapes; s++) run_case(&ct, &bad, ref, &cs[i], shapes[s]);
        if (!strcmp(controls[c].op, "sample"))
            check_sampler_host(&ct, &bad, &cs[n - 1], max_rows, max_rows);
        int caught = ct.failed > 0;
        red += caught;
        fprintf(out_f, "%sok %d - control '%s' shows red (%d of %d checks)\n", caught ? "" : "not ",
                ++t->tap, controls[c].name, ct.failed, ct.checks);
        bad.be->ops = real_ops;
        muse_backend_destroy(bad.be);
    }
    return red;
}

int muse_ops_check(const char *prog, const muse_ops_check_opts *o)
{
    out_f = o->out ? o->out : stdout;
    opts_g = o;
    muse_model m;
    muse_err e = {{0}};
    if (muse_model_load(o->model, &m, &e)) {
        fprintf(stderr, "%s: %s\n", prog, e.msg);
        return 2;
    }
    static op_case cs[MUSE_OP_MAX_CASES];
    int n = make_cases(&m, cs);
    side test = {0}, ref = {0};
    int fast = o->kernels == MUSE_KERNELS_FAST;
    /* the exact path is held to the CPU, the fast path to the exact path on the same device */
    const char *ref_name = fast ? o->backend : "cpu";
    if (!(test.be = make(o->backend, &m, o->max_rows, &e)) ||
        !(ref.be = make_path(ref_name, &m, o->max_rows, MUSE_KERNELS_EXACT, &e))) {
        fprintf(stderr, "%s: %s\n", prog, e.msg);
        if (test.be) muse_backend_destroy(test.be);
        muse_model_free(&m);
        return 2;
    }
    long shapes[MUSE_KERNEL_MAX_ROW_COUNTS];
    int n_shapes = muse_kernel_rows(o->max_rows, fast, shapes);
    fprintf(out_f, "# backend %s, kernels %s (against %s %s)\n", o->backend,
            muse_kernels_name(test.be->kernels), ref_name, fast ? "exact" : "reference");
    if (test.be->n_ranks > 1) /* both sides hold the same ranks; cases read rank 0's share */
        fprintf(out_f, "# ranks %d on both sides (the reference: cpu at %d ranks)\n",
                test.be->n_ranks, test.be->n_ranks);
    tally t = {0};
    size_t n_reg;
    const muse_kernel_entry *reg = muse_kernel_registry(&n_reg);
    for (size_t r = 0; r < n_reg; r++) {
        t.kid = reg[r].id;
        char tol[64], rows[96];
        int at = 0;
        for (int i = 0; i < n_shapes; i++)
            at += snprintf(rows + at, sizeof rows - (size_t)at, "%s%ld", i ? ", " : "", shapes[i]);
        if (fast && reg[r].tol_fast == MUSE_TOL_BY_OUTPUT)
            snprintf(tol, sizeof tol, "rel L2 <= 5e-4 (fp16 out) or 2e-5 (fp32 out) of exact");
        else if (fast)
            snprintf(tol, sizeof tol, reg[r].tol_fast > 0 ? "rel L2 <= %.0e of exact" : "bitwise",
                     reg[r].tol_fast);
        else
            snprintf(tol, sizeof tol, reg[r].tol > 0 ? "rel L2 <= %.0e" : "bitwise", reg[r].tol);
        fprintf(out_f, "# kernel %s (%s, %s): equals %s; %s; rows %s; widths: %s\n", reg[r].name,
                reg[r].op, fast && reg[r].fast ? reg[r].fast : reg[r].cuda,
                fast ? "the exact path" : reg[r].reference, tol, rows, reg[r].widths);
        for (int i = 0; i < n; i++)
            if (cs[i].kid == reg[r].id)
                for (int s = 0; s < n_shapes; s++) run_case(&t, &test, &ref, &cs[i], shapes[s]);
        if (reg[r].id == MUSE_K_SAMPLE)
            check_sampler_host(&t, &test, &cs[n - 1], o->sample_rows > 0 ? o->sample_rows : 10000,
                               o->max_rows);
        if (reg[r].id == MUSE_K_LINEAR_EXL3_TILES)
            check_exl3_paths(&t, &m, o->backend, &ref, cs, n, o->max_rows, shapes, n_shapes);
        if (reg[r].id == MUSE_K_ATTN_SLIDING && t.kpresent[MUSE_K_ATTN_SLIDING])
            check_snapshot(&t, &test, &m);
        if (reg[r].id == MUSE_K_FORWARD) check_forward(&t, &m, o->backend, o->max_rows);
        if (!t.kpresent[reg[r].id])
            fprintf(out_f, "ok %d - %s: # skip not in this pack\n", ++t.tap, reg[r].name);
    }
    int checked = 0, failed = 0;
    for (size_t r = 0; r < n_reg; r++) {
        checked += t.kpresent[reg[r].id];
        failed += t.kfail[reg[r].id];
    }
    int n_ctl = (int)(sizeof controls / sizeof *controls);
    int red = check_controls(&t, &m, &ref, cs, n, o->max_rows, shapes, n_shapes);
    fprintf(out_f, "1..%d\n", t.tap);
    fprintf(out_f,
            "# SUMMARY backend %s, %d checks: kernels checked %d, passed %d, failed %d; controls "
            "red as planted %d of %d, missed %d\n",
            o->backend, t.checks, checked, checked - failed, failed, red, n_ctl, n_ctl - red);
    muse_backend_destroy(test.be);
    muse_backend_destroy(ref.be);
    muse_model_free(&m);
    return failed || red < n_ctl ? 1 : 0;
}
