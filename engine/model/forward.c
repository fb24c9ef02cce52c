/* The forward plan: the operations of one round in order; the round hook runs first (rank 0
 * of a world of processes publishes the round there so the other ranks run the same plan). */
#include "model/forward.h"

struct muse_forward {
    muse_backend *be;
    const muse_model *m;
    muse_act h;                         /* [R, H] residual stream, fp32 */
    muse_act a;                         /* [R, H] normed input of a block part, fp16 values */
    muse_act q, g, o;                   /* [R, Q] */
    muse_act k, v;                      /* [R, KV] */
    muse_act y;                         /* [R, H] output of attention or feed-forward, fp32 */
    muse_act mlp_gate, mlp_up, mlp_act; /* [R, I] dense layers */
    muse_act logits;                    /* [N, V (padded)] */
    int64_t *last_pos;                  /* [max_seqs] scratch of check_batch */
    muse_round_hook hook;               /* all NULL: none */
};

void muse_forward_act_floats(const muse_model *m, long floats[2])
{
    const muse_config *c = &m->cfg;
    long H = (long)c->hidden_size, Q = (long)(c->n_heads * c->head_dim);
    long KV = (long)(c->n_kv_heads * c->head_dim), I = (long)c->intermediate_size;
    floats[0] = 3 * H + 3 * Q + 2 * KV + 3 * I; /* as muse_forward_create asks, a row */
    floats[1] = (long)m->head.n;                /* the logits, a wanted row */
}

muse_forward *muse_forward_create(muse_backend *be)
{
    const muse_config *c = &be->model->cfg;
    long H = (long)c->hidden_size, Q = (long)(c->n_heads * c->head_dim);
    long KV = (long)(c->n_kv_heads * c->head_dim), I = (long)c->intermediate_size;
    long R = be->opts.max_rows;
    muse_forward *f = MUSE_CALLOC(1, sizeof *f);
    f->be = be;
    f->m = be->model;
    f->h = be->ops->alloc(be, R, H);
    f->a = be->ops->alloc(be, R, H);
    f->y = be->ops->alloc(be, R, H);
    f->q = be->ops->alloc(be, R, Q);
    f->g = be->ops->alloc(be, R, Q);
    f->o = be->ops->alloc(be, R, Q);
    f->k = be->ops->alloc(be, R, KV);
    f->v = be->ops->alloc(be, R, KV);
    f->mlp_gate = f->mlp_up = f->mlp_act = -1;
    if (I) {
        f->mlp_gate = be->ops->alloc(be, R, I);
        f->mlp_up = be->ops->alloc(be, R, I);
        f->mlp_act = be->ops->alloc(be, R, I);
    }
    /* the head runs on the wanted rows alone */
    f->logits = be->ops->alloc(be, be->opts.max_wanted, (long)be->model->head.n);
    f->last_pos = MUSE_MALLOC((size_t)be->opts.max_seqs * sizeof *f->last_pos);
    return f;
}

/* The tensors belong to the backend; the plan's own bookkeeping goes here. */
void muse_forward_destroy(muse_forward *f)
{
    if (!f) return;
    free(f->last_pos);
    free(f);
}

muse_backend *muse_forward_backend(const muse_forward *f)
{
    return f->be;
}

void muse_forward_set_hook(muse_forward *f, const muse_round_hook *hook)
{
    f->hook = hook ? *hook : (muse_round_hook){0};
}

static int check_batch(muse_forward *f, const muse_round *b, muse_err *e)
{
    const muse_config *c = &f->m->cfg;
    const muse_backend_opts *o = &f->be->opts;
    for (long r = 0; r < b->rows; r++)
        if (b->seqs[r] >= 0 && b->seqs[r] < o->max_seqs) f->last_pos[b->seqs[r]] = -1;
    if (b->rows <= 0 || b->rows > o->max_rows)
        return muse_fail(e, "batch of %ld rows: must be 1 .. %ld (max rows a round)", b->rows,
                         o->max_rows);
    long wanted = 0;
    for (long r = 0; r < b->rows; r++) wanted += !b->want_logits || b->want_logits[r];
    if (wanted > o->max_wanted)
        return muse_fail(e, "batch wants the logits of %ld rows: at most %ld a round", wanted,
                         o->max_wanted);
    for (long r = 0; r < b->rows; r++) {
        if (b->tokens[r] < 0 || b->tokens[r] >= c->vocab_size)
            return muse_fail(e, "token id %d at row %ld is outside the vocabulary 0 .. %lld",
                             b->tokens[r], r, (long long)c->vocab_size - 1);
        if (b->positions[r] < 0 || b->positions[r] >= o->context)
            return muse_fail(e, "position %lld at row %ld is outside the context 0 .. %lld",
                             (long long)b->positions[r], r, (long long)o->context - 1);
        if (b->seqs[r] < 0 || b->seqs[r] >= o->max_seqs)
            return muse_fail(e, "sequence slot %d at row %ld is outside 0 .. %d", b->seqs[r], r,
                             o->max_seqs - 1);
        /* a later row of the same sequence must be the next position (the KV rings rely on it) */
        int64_t *last = &f->last_pos[b->seqs[r]];
        if (*last >= 0 && b->positions[r] != *last + 1)
            return muse_fail(e, "row %ld of sequence %d is position %lld, not the next one (%lld)",
                             r, b->seqs[r], (long long)b->positions[r], (long long)*last + 1);
        *last = b->positions[r];
    }
    return 0;
}

/* The norm after layer i's attention (its feed-forward's input norm) or after its feed-forward
 * (the next layer's input norm, or the final norm after the last layer), fused with add_norm. */
static void add_norm_then(muse_forward *f, const muse_vec *post, float post_eps,
                          const muse_vec *next, muse_norm_weight mode)
{
    const muse_config *c = &f->m->cfg;
    f->be->ops->add_norm_norm(f->be, f->h, f->y, (long)c->hidden_size, post, post_eps, next, mode,
                              (float)c->rms_norm_eps, f->a);
}

/* f->a holds the layer's normed input on entry and the feed-forward's normed input on exit. */
static void attention_block(muse_forward *f, int i)
{
    muse_backend *be = f->be;
    const muse_backend_ops *ops = be->ops;
    const muse_config *c = &f->m->cfg;
    const muse_layer *ly = &f->m->layers[i];
    long H = (long)c->hidden_size;
    const muse_linear *qkvg[4] = {&ly->q, &ly->k, &ly->v, &ly->gate};
    const muse_act outs[4] = {f->q, f->k, f->v, f->g};
    ops->linears(be, 4, qkvg, f->a, 1, outs);
    ops->attention(be, i, f->q, f->k, f->v, f->g, f->o); /* q and k normed and roped in it */
    ops->linear(be, &ly->o, f->o, 0, f->y);
    ops->all_reduce(be, f->y, H); /* o is split by its input: ranks hold partial sums */
    add_norm_then(f, &ly->post_attn_norm, (float)c->post_norm_eps, &ly->pre_ff_norm,
                  MUSE_NORM_PLUS1);
}

/* f->a holds the feed-forward's normed input on entry and the next one's (layer i+1's input
 * norm, or the final norm) on exit. */
static void feed_forward_block(muse_forward *f, int i)
{
    muse_backend *be = f->be;
    const muse_backend_ops *ops = be->ops;
    const muse_config *c = &f->m->cfg;
    const muse_layer *ly = &f->m->layers[i];
    long H = (long)c->hidden_size;
    if (c->mlp_kind[i] == MUSE_MLP_DENSE) {
        ops->swiglu_linear(be, &ly->dense.gate, &ly->dense.up, f->a, f->mlp_gate, f->mlp_up,
                           f->mlp_act);
        ops->linear(be, &ly->dense.down, f->mlp_act, 0, f->y);
        ops->all_reduce(be, f->y, H); /* down is split by its input */
    } else {
        ops->moe(be, ly, f->a, f->y); /* sums its ranks' partials itself (expert output norm) */
    }
    int last = i + 1 == (int)c->num_layers;
    add_norm_then(f, &ly->post_ff_norm, (float)c->post_norm_eps,
                  last ? &f->m->final_norm : &f->m->layers[i + 1].input_norm,
                  last ? MUSE_NORM_PLAIN : MUSE_NORM_PLUS1);
}

int muse_forward_run(muse_forward *f, const muse_round *r, muse_round_out *out, muse_err *e)
{
    if (check_batch(f, r, e)) return -1;
    muse_backend *be = f->be;
    const muse_config *c = &f->m->cfg;
    if (f->hook.before_round && f->hook.before_round(f->hook.ctx, be, r, e)) return -1;
    be->replay_ok = 1;
    be->replayed = 0;
    int rc = be->ops->begin_round(be, r, e);
    be->replay_ok = 0;
    if (rc) return -1;
    if (be->replayed) return be->ops->end_round(be, out, e); /* a stored graph ran it whole */
    be->ops->embed(be, f->h);
    be->ops->norm(be, f->h, (long)c->hidden_size, &f->m->layers[0].input_norm, MUSE_NORM_PLUS1,
                  (float)c->rms_norm_eps, 1, f->a);
    for (int i = 0; i < (int)c->num_layers; i++) {
        attention_block(f, i);
        feed_forward_block(f, i);
    }
    be->ops->head(be, f->a, f->logits); /* f->a: the final norm of the last add_norm_norm */
    if (r->sampling) be->ops->sample(be, f->logits);
    return be->ops->end_round(be, out, e);
}

void muse_forward_snapshot(muse_forward *f, int save, int seq, int64_t end_pos, int slot)
{
    muse_backend *be = f->be;
    /* a rank that stopped fails the next round, which names it */
    if (f->hook.before_snapshot) f->hook.before_snapshot(f->hook.ctx, save, seq, end_pos, slot);
    (save ? be->ops->snapshot_save : be->ops->snapshot_load)(be, seq, end_pos, slot);
}
