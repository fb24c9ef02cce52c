/* Token masks: per stack top, the tokens accepted whatever lies below are precomputed once
 * (a walk of the vocabulary trie inside the top's rule); only tokens that leave the rule are
 * walked against the whole stack at each step. */
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

typedef struct {
    const muse_grammar *g;
    gram_pre *p;
    gram_sset *sc;
    size_t depcap;
} pre_ctx;

static void pre_walk(pre_ctx *c, uint32_t node, size_t d)
{
    const muse_gvocab *v = c->g->vocab;
    const gram_sset *in = &c->sc[d];
    gram_sset *out = &c->sc[d + 1];
    for (uint32_t k = v->node_first[node], e = k + v->node_nchild[node]; k < e; k++) {
        gram_step(c->g, in, v->node_byte[k], out);
        if (out->nstacks || out->popped) mark_tokens(v, k, c->p->acc);
        if (out->popped && v->node_nchild[k]) {
            if (c->p->ndep == c->depcap) {
                c->depcap = c->depcap ? c->depcap * 2 : 16;
                c->p->dep = realloc(c->p->dep, c->depcap * sizeof *c->p->dep);
                MUSE_CHECK(c->p->dep);
            }
            c->p->dep[c->p->ndep++] = k;
        }
        if (out->nstacks && v->node_nchild[k]) pre_walk(c, k, d + 1);
    }
}

const gram_pre *gram_pre_get(const muse_grammar *g, uint32_t x, gram_sset *sc, size_t nsc)
{
    muse_grammar *mg = (muse_grammar *)g;
    pthread_mutex_lock(&mg->mu);
    gram_pre *p = g->pre[x];
    if (!p) {
        const muse_gvocab *v = g->vocab;
        MUSE_CHECK(nsc >= v->max_depth + 2);
        p = MUSE_CALLOC(1, sizeof *p);
        p->acc = MUSE_CALLOC((v->n + 7) / 8, 1);
        pre_ctx c = {g, p, sc, 0};
        gram_sset_clear(&sc[0]);
        gram_expand(g, &g->sent, 1, x, &sc[0]);
        pre_walk(&c, 0, 0);
        mg->pre[x] = p;
    }
    pthread_mutex_unlock(&mg->mu);
    return p;
}

/* Marks the tokens below node that the stacks in sc[d] accept. */
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

void muse_gstate_mask(muse_gstate *s, uint8_t *mask)
{
    const muse_grammar *g = s->g;
    const muse_gvocab *v = g->vocab;
    size_t nb = (v->n + 7) / 8;
    memset(mask, 0, nb);
    size_t want = v->max_depth + 3;
    if (s->nscratch < want) {
        s->scratch = realloc(s->scratch, want * sizeof *s->scratch);
        MUSE_CHECK(s->scratch);
        memset(s->scratch + s->nscratch, 0, (want - s->nscratch) * sizeof *s->scratch);
        s->nscratch = want;
    }
    gram_sset *sc = s->scratch;
    uint8_t prefix[65536];
    for (size_t i = 0; i < s->cur.len; i += 2 + s->cur.buf[i]) {
        const uint32_t *entry = s->cur.buf + i;
        uint32_t top = entry[1 + entry[0]];
        const gram_pre *p = gram_pre_get(g, top, sc, s->nscratch);
        for (size_t j = 0; j < nb; j++) mask[j] |= p->acc[j];
        for (size_t j = 0; j < p->ndep; j++) {
            uint32_t k = p->dep[j];
            size_t d = v->node_depth[k];
            for (uint32_t n = k, q = (uint32_t)d; n != 0; n = v->node_parent[n])
                prefix[--q] = v->node_byte[n];
            one_stack(&sc[0], entry);
            size_t q = 0;
            for (; q < d; q++) {
                gram_step(g, &sc[q], prefix[q], &sc[q + 1]);
                if (!sc[q + 1].nstacks) break;
            }
            if (q == d) full_walk(g, sc, k, d, mask);
        }
    }
}
