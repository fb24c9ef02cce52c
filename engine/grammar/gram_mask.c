/* Token masks: each stack's top has a table (gram_table.c) of the tokens accepted whatever
 * lies below, ORed in; the tokens that leave the top's rule are walked by their remaining
 * bytes against the stack below, from where the rule returns. A top without a table (past the
 * cap) walks the whole trie against its stack. */
#include "grammar/gram_internal.h"

#include "base/muse_common.h"

static void mark_tokens(const muse_gvocab *v, uint32_t node, uint8_t *bits)
{
    for (int32_t t = v->node_tok[node]; t >= 0;) {
        bits[t >> 3] |= (uint8_t)(1u << (t & 7));
        uint32_t nx = v->dup_next[t];
        t = nx == UINT32_MAX ? -1 : (int32_t)nx;
    }
}

/* Marks the tokens below node that the stacks in sc[d] accept (the fallback). */
static void full_walk(const muse_grammar *g, gram_sset *sc, uint32_t node, size_t d, uint8_t *m)
{
    const muse_gvocab *v = g->vocab;
    gram_sset *out = &sc[d + 1];
    for (uint32_t k = v->node_first[node], e = k + v->node_nchild[node]; k < e; k++) {
        gram_step(g, &sc[d], v->node_byte[k], out);
        if (out->nstacks || out->accept) mark_tokens(v, k, m);
        if (out->nstacks && v->node_nchild[k]) full_walk(g, sc, k, d + 1, m);
    }
}

/* Marks the exit tokens below exit node u whose remaining bytes the stacks in sc[d] accept. */
static void exit_walk(const muse_grammar *g, const gram_pre *p, uint32_t u, gram_sset *sc, size_t d,
                      uint8_t *m)
{
    gram_sset *out = &sc[d + 1];
    gram_set takes = {{0}}; /* a child whose byte no top takes is passed over without a step */
    for (size_t i = 0; i < sc[d].len; i += 2 + sc[d].buf[i]) {
        const gram_set *t = &g->sets[G_ARG(g->el[sc[d].buf[i + 1 + sc[d].buf[i]]])];
        for (int w = 0; w < 8; w++) takes.w[w] |= t->w[w];
    }
    for (uint32_t k = p->exit[u].first, e = k + p->exit[u].nchild; k < e; k++) {
        const gram_exit *x = &p->exit[k];
        if (!gram_set_has(&takes, x->byte)) continue;
        gram_step(g, &sc[d], x->byte, out);
        if (out->nstacks || out->accept)
            for (uint32_t i = x->tok_lo; i < x->tok_hi; i++)
                m[p->exit_tok[i] >> 3] |= (uint8_t)(1u << (p->exit_tok[i] & 7));
        if (out->nstacks && x->nchild) exit_walk(g, p, k, sc, d + 1, m);
    }
}

static void or_table(const gram_pre *p, uint8_t *mask, size_t nb)
{
    if (!p->bits) {
        for (uint32_t i = 0; i < p->nids; i++)
            mask[p->ids[i] >> 3] |= (uint8_t)(1u << (p->ids[i] & 7));
        return;
    }
    size_t words = nb / 8;
    for (size_t j = 0; j < words; j++) { /* word-wide: memcpy keeps it free of aliasing */
        uint64_t a, b;
        memcpy(&a, mask + j * 8, 8);
        memcpy(&b, p->bits + j * 8, 8);
        a |= b;
        memcpy(mask + j * 8, &a, 8);
    }
    for (size_t j = words * 8; j < nb; j++) mask[j] |= p->bits[j];
}

static void one_stack(gram_sset *dst, const uint32_t *entry)
{
    gram_sset_clear(dst);
    size_t n = entry[0] + 2;
    if (dst->cap < n) {
        dst->cap = n * 2;
        dst->buf = realloc(dst->buf, dst->cap * sizeof *dst->buf);
        MUSE_CHECK(dst->buf);
    }
    memcpy(dst->buf, entry, n * sizeof *entry);
    dst->len = n;
    dst->nstacks = 1;
}

void gram_wait_ready(const muse_grammar *g)
{
    muse_grammar *mg = (muse_grammar *)g;
    pthread_mutex_lock(&mg->mu);
    while (!atomic_load_explicit(&mg->ready, memory_order_acquire))
        pthread_cond_wait(&mg->cv, &mg->mu);
    pthread_mutex_unlock(&mg->mu);
}

bool muse_grammar_ready(const muse_grammar *g)
{
    return !g || atomic_load_explicit(&((muse_grammar *)g)->ready, memory_order_acquire);
}

void muse_gstate_mask(muse_gstate *s, uint8_t *mask)
{
    const muse_grammar *g = s->g;
    const muse_gvocab *v = g->vocab;
    if (!muse_grammar_ready(g)) gram_wait_ready(g);
    size_t nb = (v->n + 7) / 8;
    memset(mask, 0, nb);
    size_t want = v->max_depth + 3;
    if (s->nscratch < want) {
        s->scratch = realloc(s->scratch, want * sizeof *s->scratch);
        MUSE_CHECK(s->scratch);
        memset(s->scratch + s->nscratch, 0, (want - s->nscratch) * sizeof *s->scratch);
        s->nscratch = want;
    }
    if (s->nstamp < g->npres) {
        free(s->stamp);
        s->stamp = MUSE_CALLOC(g->npres, sizeof *s->stamp);
        s->nstamp = g->npres;
        s->gen = 0;
    }
    if (++s->gen == 0) { /* wrapped: no stale stamp may look current */
        memset(s->stamp, 0, s->nstamp * sizeof *s->stamp);
        s->gen = 1;
    }
    gram_sset *sc = s->scratch;
    for (size_t i = 0; i < s->cur.len; i += 2 + s->cur.buf[i]) {
        const uint32_t *entry = s->cur.buf + i;
        uint32_t n = entry[0] - 1, top = entry[2 + n]; /* n frames below the top */
        uint32_t pi = g->el_pre[top];
        if (pi == UINT32_MAX) {
            one_stack(&sc[0], entry);
            full_walk(g, sc, 0, 0, mask);
            continue;
        }
        const gram_pre *p = &g->pres[pi];
        if (s->stamp[pi] != s->gen) { /* stacks with one table OR it once */
            s->stamp[pi] = s->gen;
            or_table(p, mask, nb);
        }
        if (!p->nexit || n == 0) continue; /* at the root nothing follows the rule */
        const uint32_t *frames = entry + 2;
        gram_sset_clear(&sc[0]);
        gram_expand(g, frames, n - 1, frames[n - 1], &sc[0]);
        if (sc[0].nstacks) exit_walk(g, p, 0, sc, 0, mask);
    }
}
