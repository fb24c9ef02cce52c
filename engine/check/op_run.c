/* How each case of op_cases.c runs on a backend: a record a kernel (the list's last column,
 * run_<name>), shared by the kernel checker and `muse-bench kernels` (op_cases.h). A simple
 * new operation is its record here and nothing in either runner. */
#include "check/op_cases.h"

#include "base/muse_common.h"
#include "model/shard.h"

void muse_op_poison(muse_op_acts *s, muse_act a, long width, long rows)
{
    float *p = MUSE_MALLOC((size_t)(rows * width) * sizeof *p);
    for (long i = 0; i < rows * width; i++) p[i] = muse_bits_to_f32(0x7fc0beefu); /* a NaN */
    s->be->ops->write(s->be, a, p, rows);
    free(p);
}

void muse_op_write_sliced(muse_op_acts *s, muse_act a, uint64_t seed, const int64_t *ids, long M,
                          long W, long lo, long w)
{
    float *x = MUSE_MALLOC((size_t)(M * W) * sizeof *x),
          *row = MUSE_MALLOC((size_t)W * sizeof *row);
    for (long r = 0; r < M * W; r++) x[r] = 0.5f;
    for (long r = 0; r < M; r++) {
        muse_op_fill_row(seed, ids[r], W, 1, row);
        memcpy(x + r * w, row + lo, (size_t)w * sizeof *x);
    }
    s->be->ops->write(s->be, a, x, M);
    free(row);
    free(x);
}

void muse_op_read(muse_op_acts *s, muse_act a, long M, long W, float *out)
{
    long aw = W; /* the head's output is [M, V] inside an [M, N] buffer */
    float *tmp = MUSE_MALLOC((size_t)(s->be->opts.max_rows * (aw + 128)) * sizeof *tmp);
    s->be->ops->read(s->be, a, tmp, M);
    memcpy(out, tmp, (size_t)(M * W) * sizeof *out);
    free(tmp);
}

/* ---- the records: inputs (outside a round), call (inside one), output ---- */

static void embed_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    (void)ids;
    muse_op_poison(s, muse_op_act(s, k->out_width, 0), k->out_width, M);
}
static void embed_call(muse_op_acts *s, const muse_op_case *k)
{
    s->be->ops->embed(s->be, muse_op_act(s, k->out_width, 0));
}
static void embed_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    muse_op_read(s, muse_op_act(s, k->out_width, 0), M, k->out_width, out);
}

/* ops of one input in slot 0 and the output in slot `o` of the input width */
static void out1_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    muse_op_read(s, muse_op_act(s, k->in_width, 1), M, k->in_width, out);
}
static void out0_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    muse_op_read(s, muse_op_act(s, k->in_width, 0), M, k->in_width, out);
}

static void norm_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    long W = k->in_width;
    muse_act x = muse_op_act(s, W, 0), o = muse_op_act(s, W, 1);
    muse_op_write_inputs(s, x, 11, ids, M, W, 0);
    muse_op_poison(s, o, W, M);
}
static void norm_call(muse_op_acts *s, const muse_op_case *k)
{
    long W = k->in_width;
    s->be->ops->norm(s->be, muse_op_act(s, W, 0), W, k->arg, (muse_norm_weight)(k->param % 3),
                     1e-5f, (int)(k->param / 3), muse_op_act(s, W, 1));
}
static int norm_round16(const muse_op_case *k)
{
    return k->param >= 3;
}

static void add_norm_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    long W = k->in_width;
    muse_act h = muse_op_act(s, W, 0), y = muse_op_act(s, W, 1);
    muse_op_write_inputs(s, h, 12, ids, M, W, 0);
    muse_op_write_inputs(s, y, 13, ids, M, W, 0);
}
static void add_norm_call(muse_op_acts *s, const muse_op_case *k)
{
    long W = k->in_width;
    s->be->ops->add_norm(s->be, muse_op_act(s, W, 0), muse_op_act(s, W, 1), W, k->arg, 1e-6f);
}

/* add_norm then the next norm (1+w, fp16 out): the normed output, then h, side by side */
static void add_norm_norm_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    long W = k->in_width;
    muse_act h = muse_op_act(s, W, 0), y = muse_op_act(s, W, 1), o = muse_op_act(s, W, 2);
    muse_op_write_inputs(s, h, 12, ids, M, W, 0);
    muse_op_write_inputs(s, y, 13, ids, M, W, 0);
    muse_op_poison(s, o, W, M);
}
static void add_norm_norm_call(muse_op_acts *s, const muse_op_case *k)
{
    long W = k->in_width;
    const muse_layer *l0 = &s->be->model->layers[0];
    s->be->ops->add_norm_norm(s->be, muse_op_act(s, W, 0), muse_op_act(s, W, 1), W, k->arg, 1e-6f,
                              &l0->pre_ff_norm, MUSE_NORM_PLUS1, 1e-5f, muse_op_act(s, W, 2));
}
static void add_norm_norm_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    long W = k->in_width;
    float *t = MUSE_MALLOC((size_t)(M * W) * sizeof *t),
          *hh = MUSE_MALLOC((size_t)(M * W) * sizeof *hh);
    muse_op_read(s, muse_op_act(s, W, 2), M, W, t);
    muse_op_read(s, muse_op_act(s, W, 0), M, W, hh);
    for (long r = 0; r < M; r++) { /* row r: [normed | h], so each row of out depends on r alone */
        memcpy(out + r * 2 * W, t + r * W, (size_t)W * sizeof *t);
        memcpy(out + r * 2 * W + W, hh + r * W, (size_t)W * sizeof *t);
    }
    free(t);
    free(hh);
}

static void linear_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    const muse_linear *l = k->arg;
    muse_act x = muse_op_act(s, (long)l->k, 0), y = muse_op_act(s, (long)l->n, 1);
    int ranks = s->be->n_ranks;
    if (ranks > 1 && l->shard == MUSE_SHARD_INPUT) {
        int64_t lo, hi;
        muse_shard_range(s->be->model, l, 0, ranks, &lo, &hi);
        muse_op_write_sliced(s, x, 14, ids, M, (long)l->k, (long)lo, (long)(hi - lo));
    } else {
        muse_op_write_inputs(s, x, 14, ids, M, (long)l->k, 1); /* fp16 activations in */
    }
    muse_op_poison(s, y, (long)l->n, M);
}
static void linear_call(muse_op_acts *s, const muse_op_case *k)
{
    const muse_linear *l = k->arg;
    s->be->ops->linear(s->be, l, muse_op_act(s, (long)l->k, 0), (int)k->param,
                       muse_op_act(s, (long)l->n, 1));
}
static void linear_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    const muse_linear *l = k->arg;
    muse_op_read(s, muse_op_act(s, (long)l->n, 1), M, (long)l->n, out);
}
static int linear_round16(const muse_op_case *k)
{
    return (int)k->param;
}

/* The linears of one input (q, k, v, gate of layer 0): each row's outputs side by side. */
static void linears_acts(muse_op_acts *s, const muse_op_case *k, const muse_linear *ls[4],
                         muse_act *x, muse_act ys[4])
{
    const muse_layer *l0 = k->arg;
    ls[0] = &l0->q, ls[1] = &l0->k, ls[2] = &l0->v, ls[3] = &l0->gate;
    *x = muse_op_act(s, (long)l0->q.k, 0);
    for (int i = 0; i < 4; i++) {
        ys[i] = muse_op_act(s, (long)ls[i]->n, i + 1 < MUSE_OP_SLOTS ? i + 1 : 0);
        for (int j = 0; j < i; j++) MUSE_CHECK(ys[i] != ys[j] && ys[i] != *x);
    }
}
static void linears_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    const muse_linear *ls[4];
    muse_act x, ys[4];
    linears_acts(s, k, ls, &x, ys);
    muse_op_write_inputs(s, x, 14, ids, M, (long)ls[0]->k, 1);
    for (int i = 0; i < 4; i++) muse_op_poison(s, ys[i], (long)ls[i]->n, M);
}
static void linears_call(muse_op_acts *s, const muse_op_case *k)
{
    const muse_linear *ls[4];
    muse_act x, ys[4];
    linears_acts(s, k, ls, &x, ys);
    s->be->ops->linears(s->be, 4, ls, x, 1, ys);
}
static void linears_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    const muse_linear *ls[4];
    muse_act x, ys[4];
    linears_acts(s, k, ls, &x, ys);
    long at = 0;
    for (int i = 0; i < 4; i++) {
        long n = (long)ls[i]->n;
        float *t = MUSE_MALLOC((size_t)(M * n) * sizeof *t);
        muse_op_read(s, ys[i], M, n, t);
        for (long r = 0; r < M; r++)
            memcpy(out + r * k->out_width + at, t + r * n, (size_t)n * sizeof *t);
        at += n;
        free(t);
    }
}

/* gate and up with the swiglu epilogue, of the MLP in arg */
static void swiglu_linear_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    const muse_mlp *p = k->arg;
    long K = (long)p->gate.k, I = (long)p->gate.n;
    muse_act x = muse_op_act(s, K, 0), o = muse_op_act(s, I, 3); /* g, u: slots 1, 2 */
    muse_op_write_inputs(s, x, 25, ids, M, K, 1);
    muse_op_poison(s, o, I, M);
}
static void swiglu_linear_call(muse_op_acts *s, const muse_op_case *k)
{
    const muse_mlp *p = k->arg;
    long K = (long)p->gate.k, I = (long)p->gate.n;
    s->be->ops->swiglu_linear(s->be, &p->gate, &p->up, muse_op_act(s, K, 0), muse_op_act(s, I, 1),
                              muse_op_act(s, I, 2), muse_op_act(s, I, 3));
}
static void swiglu_linear_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    const muse_mlp *p = k->arg;
    muse_op_read(s, muse_op_act(s, (long)p->gate.n, 3), M, (long)p->gate.n, out);
}

static void qk_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    muse_op_write_inputs(s, muse_op_act(s, k->in_width, 0), 15, ids, M, k->in_width, 1);
}
static void qk_call(muse_op_acts *s, const muse_op_case *k)
{
    const muse_config *c = &s->be->model->cfg;
    long W = k->in_width, heads = W / (long)c->head_dim;
    s->be->ops->qk_norm_rope(s->be, muse_op_act(s, W, 0), heads, (long)c->head_dim,
                             c->rope_theta_layer[k->param], 1e-5f);
}

/* attention (the bench's: rows of sequence 0 at the round's positions; the checker runs its own
 * prompt and decode rounds over the same slots) */
static void attention_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    const muse_config *c = &s->be->model->cfg;
    long Q = k->in_width, KV = (long)(c->n_kv_heads * c->head_dim);
    muse_act q = muse_op_act(s, Q, 0), g = muse_op_act(s, Q, 1), o = muse_op_act(s, Q, 2);
    muse_act kk = muse_op_act(s, KV, MUSE_OP_ATT_K), v = muse_op_act(s, KV, MUSE_OP_ATT_V);
    muse_op_write_inputs(s, q, 21, ids, M, Q, 1);
    muse_op_write_inputs(s, g, 22, ids, M, Q, 1);
    muse_op_write_inputs(s, kk, 23, ids, M, KV, 1);
    muse_op_write_inputs(s, v, 24, ids, M, KV, 1);
    muse_op_poison(s, o, Q, M);
}
static void attention_call(muse_op_acts *s, const muse_op_case *k)
{
    const muse_config *c = &s->be->model->cfg;
    long Q = k->in_width, KV = (long)(c->n_kv_heads * c->head_dim);
    s->be->ops->attention(s->be, (int)k->param, muse_op_act(s, Q, 0),
                          muse_op_act(s, KV, MUSE_OP_ATT_K), muse_op_act(s, KV, MUSE_OP_ATT_V),
                          muse_op_act(s, Q, 1), muse_op_act(s, Q, 2));
}
static void attention_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    muse_op_read(s, muse_op_act(s, k->in_width, 2), M, k->in_width, out);
}

static void swiglu_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    long W = k->in_width;
    muse_act g = muse_op_act(s, W, 0), u = muse_op_act(s, W, 1), o = muse_op_act(s, W, 2);
    muse_op_write_inputs(s, g, 16, ids, M, W, 1);
    muse_op_write_inputs(s, u, 17, ids, M, W, 1);
    muse_op_poison(s, o, W, M);
}
static void swiglu_call(muse_op_acts *s, const muse_op_case *k)
{
    long W = k->in_width;
    s->be->ops->swiglu(s->be, muse_op_act(s, W, 0), muse_op_act(s, W, 1), W, muse_op_act(s, W, 2));
}
static void swiglu_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    muse_op_read(s, muse_op_act(s, k->in_width, 2), M, k->in_width, out);
}

static void moe_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    long H = k->in_width;
    muse_act b = muse_op_act(s, H, 0), y = muse_op_act(s, H, 1);
    muse_op_write_inputs(s, b, 18, ids, M, H, 1);
    muse_op_poison(s, y, H, M);
}
static void moe_call(muse_op_acts *s, const muse_op_case *k)
{
    long H = k->in_width;
    s->be->ops->moe(s->be, k->arg, muse_op_act(s, H, 0), muse_op_act(s, H, 1));
}

static void all_reduce_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    muse_op_write_inputs(s, muse_op_act(s, k->in_width, 0), 19, ids, M, k->in_width, 0);
}
static void all_reduce_call(muse_op_acts *s, const muse_op_case *k)
{
    s->be->ops->all_reduce(s->be, muse_op_act(s, k->in_width, 0), k->in_width);
}

static void head_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    long H = k->in_width, N = (long)s->be->model->head.n;
    muse_act x = muse_op_act(s, H, 0), lg = muse_op_act(s, N, MUSE_OP_HEAD_LOGITS);
    muse_op_write_inputs(s, x, 20, ids, M, H, 1);
    muse_op_poison(s, lg, N, M);
}
static void head_call(muse_op_acts *s, const muse_op_case *k)
{
    long N = (long)s->be->model->head.n;
    s->be->ops->head(s->be, muse_op_act(s, k->in_width, 0), muse_op_act(s, N, MUSE_OP_HEAD_LOGITS));
}
static void head_output(muse_op_acts *s, const muse_op_case *k, long M, float *out)
{
    muse_op_read(s, muse_op_act(s, (long)s->be->model->head.n, MUSE_OP_HEAD_LOGITS), M,
                 k->out_width, out);
}

/* sample (the bench's: plain logits [M, V] at stride N; the checker writes its own rows) */
static void sample_inputs(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M)
{
    long N = (long)s->be->model->head.n;
    float *x = MUSE_CALLOC((size_t)(M * N), sizeof *x);
    for (long r = 0; r < M; r++) muse_op_fill_row(25, ids[r], k->in_width, 0, x + r * N);
    s->be->ops->write(s->be, muse_op_act(s, N, 1), x, M);
    free(x);
}
static void sample_call(muse_op_acts *s, const muse_op_case *k)
{
    (void)k;
    s->be->ops->sample(s->be, muse_op_act(s, (long)s->be->model->head.n, 1));
}

/* .round16: the output is rounded to fp16 (the fast path's bound; add_norm_norm's h is not:
 * the fp16 bound over both); .reads, .writes: rows for the bench's generic bytes */
static const muse_op_run run_none = {0};
static const muse_op_run run_embed = {
    .inputs = embed_inputs, .call = embed_call, .output = embed_output};
static const muse_op_run run_norm = {
    .inputs = norm_inputs, .call = norm_call, .output = out1_output, .round16_of = norm_round16};
static const muse_op_run run_add_norm = {
    .inputs = add_norm_inputs, .call = add_norm_call, .output = out0_output};
static const muse_op_run run_add_norm_norm = {.inputs = add_norm_norm_inputs,
                                              .call = add_norm_norm_call,
                                              .output = add_norm_norm_output,
                                              .round16 = 1};
static const muse_op_run run_linear = {.inputs = linear_inputs,
                                       .call = linear_call,
                                       .output = linear_output,
                                       .round16_of = linear_round16};
static const muse_op_run run_linears = {
    .inputs = linears_inputs, .call = linears_call, .output = linears_output, .round16 = 1};
static const muse_op_run run_swiglu_linear = {.inputs = swiglu_linear_inputs,
                                              .call = swiglu_linear_call,
                                              .output = swiglu_linear_output,
                                              .round16 = 1};
static const muse_op_run run_qk = {
    .inputs = qk_inputs, .call = qk_call, .output = out0_output, .round16 = 1};
static const muse_op_run run_attention = {
    .inputs = attention_inputs, .call = attention_call, .output = attention_output, .round16 = 1};
static const muse_op_run run_swiglu = {.inputs = swiglu_inputs,
                                       .call = swiglu_call,
                                       .output = swiglu_output,
                                       .round16 = 1,
                                       .reads = 2};
static const muse_op_run run_moe = {.inputs = moe_inputs, .call = moe_call, .output = out1_output};
static const muse_op_run run_all_reduce = {
    .inputs = all_reduce_inputs, .call = all_reduce_call, .output = out0_output};
static const muse_op_run run_head = {
    .inputs = head_inputs, .call = head_call, .output = head_output};
static const muse_op_run run_sample = {
    .inputs = sample_inputs, .call = sample_call, .output = NULL, .round16 = 1};

#define run_NULL run_none
static const muse_op_run *const runs[MUSE_K_COUNT] = {
#define MUSE_K_RUN(id, name, op, cuda, fast, ref, widths, tol, tol_fast, check)                    \
    [MUSE_K_##id] = &run_##check,
    MUSE_KERNELS(MUSE_K_RUN)
#undef MUSE_K_RUN
};
#undef run_NULL

const muse_op_run *muse_op_run_of(muse_kernel_id kid)
{
    return runs[kid]->inputs ? runs[kid] : NULL;
}

int muse_op_round16(const muse_op_case *k)
{
    const muse_op_run *r = muse_op_run_of(k->kid);
    MUSE_CHECK(r != NULL);
    return r->round16_of ? r->round16_of(k) : r->round16;
}

double muse_op_io_bytes(const muse_op_case *k, long R)
{
    const muse_op_run *r = muse_op_run_of(k->kid);
    double reads = r && r->reads ? r->reads : 1, writes = r && r->writes ? r->writes : 1;
    return 4.0 * (double)R * (reads * (double)k->in_width + writes * (double)k->out_width);
}
