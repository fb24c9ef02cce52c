/* The pushdown automaton: sets of stacks of element positions, expanded until every top is a
 * byte set, stepped one byte at a time; a stream's state. */
#include "grammar/gram_internal.h"

#include "base/muse_common.h"

#define GRAM_MAX_EXPAND 512 /* rule entries one expansion may chain (no byte between) */

void gram_sset_clear(gram_sset *s)
{
    s->len = 0;
    s->nstacks = 0;
    s->accept = s->popped = false;
}

void gram_sset_free(gram_sset *s)
{
    free(s->buf);
    memset(s, 0, sizeof *s);
}

void gram_sset_copy(gram_sset *dst, const gram_sset *src)
{
    if (dst->cap < src->len) {
        dst->cap = src->len;
        dst->buf = realloc(dst->buf, dst->cap * sizeof *dst->buf);
        MUSE_CHECK(dst->buf);
    }
    if (src->len) memcpy(dst->buf, src->buf, src->len * sizeof *dst->buf);
    dst->len = src->len;
    dst->nstacks = src->nstacks;
    dst->accept = src->accept;
    dst->popped = src->popped;
}

static uint32_t hash_frames(const uint32_t *f, uint32_t n, uint32_t top)
{
    uint32_t h = 2166136261u ^ n;
    for (uint32_t i = 0; i < n; i++) h = (h ^ f[i]) * 16777619u;
    return (h ^ top) * 16777619u;
}

/* Adds the stack frames + [top] unless the set holds it. Layout: [n, hash, frames...]. */
static void add_stack(gram_sset *s, const uint32_t *f, uint32_t n, uint32_t top)
{
    uint32_t h = hash_frames(f, n, top), len = n + 1;
    for (size_t i = 0; i < s->len; i += 2 + s->buf[i]) {
        if (s->buf[i] == len && s->buf[i + 1] == h && s->buf[i + 1 + len] == top &&
            (n == 0 || memcmp(s->buf + i + 2, f, n * sizeof *f) == 0))
            return;
    }
    if (s->nstacks >= GRAM_MAX_STACKS) return;
    if (s->len + len + 2 > s->cap) {
        s->cap = (s->len + len + 2) * 2;
        s->buf = realloc(s->buf, s->cap * sizeof *s->buf);
        MUSE_CHECK(s->buf);
    }
    uint32_t *d = s->buf + s->len;
    d[0] = len;
    d[1] = h;
    if (n) memcpy(d + 2, f, n * sizeof *f); /* f is NULL for the root's stacks */
    d[2 + n] = top;
    s->len += len + 2;
    s->nstacks++;
}

static void expand(const muse_grammar *g, const uint32_t *frames, uint32_t n, uint32_t x,
                   gram_sset *out, int depth)
{
    for (;;) {
        if (++depth > GRAM_MAX_EXPAND) return;
        uint32_t e = g->el[x];
        switch (G_KIND(e)) {
        case G_TERM:
            add_stack(out, frames, n, x);
            return;
        case G_SENT:
            out->popped = true;
            return;
        case G_END:
            if (n == 0) {
                out->accept = true;
                return;
            }
            x = frames[--n];
            continue;
        default: { /* G_REF: push the return point unless it is the end (a tail call) */
            uint32_t r = G_ARG(e), next = x + 1, buf[GRAM_MAX_FRAMES];
            const uint32_t *f = frames;
            uint32_t m = n;
            if (G_KIND(g->el[next]) != G_END) {
                if (n >= GRAM_MAX_FRAMES) return;
                if (n) memcpy(buf, frames, n * sizeof *buf);
                buf[n] = next;
                f = buf;
                m = n + 1;
            }
            for (uint32_t a = 0; a < g->rule_nalt[r]; a++)
                expand(g, f, m, g->alts[g->rule_alt[r] + a], out, depth);
            return;
        }
        }
    }
}

void gram_expand(const muse_grammar *g, const uint32_t *frames, uint32_t n, uint32_t x,
                 gram_sset *out)
{
    expand(g, frames, n, x, out, 0);
}

void gram_step(const muse_grammar *g, const gram_sset *in, unsigned b, gram_sset *out)
{
    gram_sset_clear(out);
    for (size_t i = 0; i < in->len; i += 2 + in->buf[i]) {
        uint32_t len = in->buf[i];
        const uint32_t *f = in->buf + i + 2;
        uint32_t top = f[len - 1];
        if (gram_set_has(&g->sets[G_ARG(g->el[top])], b)) expand(g, f, len - 1, top + 1, out, 0);
    }
}

muse_gstate *muse_gstate_new(const muse_grammar *g)
{
    muse_gstate *s = MUSE_CALLOC(1, sizeof *s);
    s->g = g;
    for (uint32_t a = 0; a < g->rule_nalt[g->root]; a++)
        gram_expand(g, NULL, 0, g->alts[g->rule_alt[g->root] + a], &s->cur);
    return s;
}

muse_gstate *muse_gstate_copy(const muse_gstate *src)
{
    muse_gstate *s = MUSE_CALLOC(1, sizeof *s);
    s->g = src->g;
    gram_sset_copy(&s->cur, &src->cur);
    return s;
}

void muse_gstate_free(muse_gstate *s)
{
    if (!s) return;
    gram_sset_free(&s->cur);
    for (size_t i = 0; i < s->nscratch; i++) gram_sset_free(&s->scratch[i]);
    free(s->scratch);
    free(s->stamp);
    free(s);
}

/* Scratch sets for masks and steps, sized to the vocabulary's longest token. */
static void need_scratch(muse_gstate *s)
{
    size_t want = (s->g->vocab ? s->g->vocab->max_depth : 0) + 3;
    if (s->nscratch >= want) return;
    s->scratch = realloc(s->scratch, want * sizeof *s->scratch);
    MUSE_CHECK(s->scratch);
    memset(s->scratch + s->nscratch, 0, (want - s->nscratch) * sizeof *s->scratch);
    s->nscratch = want;
}

int muse_gstate_advance_bytes(muse_gstate *s, const uint8_t *bytes, size_t n)
{
    if (n == 0) return -1;
    need_scratch(s);
    gram_sset *a = &s->scratch[0], *b = &s->scratch[1];
    gram_sset_copy(a, &s->cur);
    for (size_t i = 0; i < n; i++) {
        gram_step(s->g, a, bytes[i], b);
        if (!gram_sset_live(b) && !(b->accept && i + 1 == n)) return -1;
        gram_sset *t = a;
        a = b;
        b = t;
    }
    gram_sset_copy(&s->cur, a);
    return 0;
}

int muse_gstate_advance(muse_gstate *s, int32_t token)
{
    const muse_gvocab *v = s->g->vocab;
    if (!v || token < 0 || (size_t)token >= v->n || v->tok_len[token] == 0) return -1;
    return muse_gstate_advance_bytes(s, v->tok_bytes[token], v->tok_len[token]);
}

bool muse_gstate_done(const muse_gstate *s)
{
    return s->cur.accept;
}
bool muse_gstate_dead(const muse_gstate *s)
{
    return s->cur.nstacks == 0;
}

bool muse_gstate_ready(const muse_gstate *s)
{
    return muse_grammar_ready(s->g);
}
