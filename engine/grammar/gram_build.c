/* Building a grammar: rules of alternatives of byte sets and rule references, flattened into
 * the element array the automaton walks. */
#include "grammar/gram_internal.h"

#include "base/muse_common.h"

uint32_t gb_rule_new(gram_builder *b)
{
    if (b->nrules == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 64;
        b->rules = realloc(b->rules, b->cap * sizeof *b->rules);
        MUSE_CHECK(b->rules);
    }
    memset(&b->rules[b->nrules], 0, sizeof *b->rules);
    return (uint32_t)b->nrules++;
}

gb_alt *gb_alt_new(gram_builder *b, uint32_t r)
{
    gb_rule *ru = &b->rules[r];
    if (ru->n == ru->cap) {
        ru->cap = ru->cap ? ru->cap * 2 : 2;
        ru->alt = realloc(ru->alt, ru->cap * sizeof *ru->alt);
        MUSE_CHECK(ru->alt);
    }
    memset(&ru->alt[ru->n], 0, sizeof *ru->alt);
    b->nsym++; /* its G_END */
    return &ru->alt[ru->n++];
}

static void push(gram_builder *b, gb_alt *a, uint32_t e)
{
    if (++b->nsym >= GRAM_MAX_ELEMS) {
        b->full = true;
        return;
    }
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 4;
        a->sym = realloc(a->sym, a->cap * sizeof *a->sym);
        MUSE_CHECK(a->sym);
    }
    a->sym[a->n++] = e;
}

void gb_term(gram_builder *b, gb_alt *a, const gram_set *s)
{
    size_t i;
    for (i = 0; i < b->nsets; i++)
        if (memcmp(&b->sets[i], s, sizeof *s) == 0) break;
    if (i == b->nsets) {
        if (b->nsets == b->setcap) {
            b->setcap = b->setcap ? b->setcap * 2 : 64;
            b->sets = realloc(b->sets, b->setcap * sizeof *b->sets);
            MUSE_CHECK(b->sets);
        }
        b->sets[b->nsets++] = *s;
    }
    push(b, a, G_MK(G_TERM, i));
}

void gb_range(gram_builder *b, gb_alt *a, unsigned lo, unsigned hi)
{
    gram_set s = {{0}};
    for (unsigned c = lo; c <= hi && c < 256; c++) s.w[c >> 5] |= 1u << (c & 31);
    gb_term(b, a, &s);
}

void gb_byte(gram_builder *b, gb_alt *a, unsigned c)
{
    gb_range(b, a, c, c);
}

void gb_lit(gram_builder *b, gb_alt *a, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) gb_byte(b, a, (unsigned char)s[i]);
}

void gb_ref(gram_builder *b, gb_alt *a, uint32_t r)
{
    push(b, a, G_MK(G_REF, r));
}

void gb_free(gram_builder *b)
{
    for (size_t r = 0; r < b->nrules; r++) {
        for (size_t i = 0; i < b->rules[r].n; i++) free(b->rules[r].alt[i].sym);
        free(b->rules[r].alt);
    }
    free(b->rules);
    free(b->sets);
    memset(b, 0, sizeof *b);
}

void gb_finish(gram_builder *b, muse_grammar *g)
{
    size_t nel = 1, nalt = 0; /* element 0: the G_SENT */
    for (size_t r = 0; r < b->nrules; r++) {
        nalt += b->rules[r].n;
        for (size_t i = 0; i < b->rules[r].n; i++) nel += b->rules[r].alt[i].n + 1;
    }
    g->el = MUSE_MALLOC(nel * sizeof *g->el);
    g->alts = MUSE_MALLOC((nalt ? nalt : 1) * sizeof *g->alts);
    g->rule_alt = MUSE_MALLOC((b->nrules ? b->nrules : 1) * sizeof *g->rule_alt);
    g->rule_nalt = MUSE_MALLOC((b->nrules ? b->nrules : 1) * sizeof *g->rule_nalt);
    size_t e = 0, k = 0;
    g->sent = (uint32_t)e;
    g->el[e++] = G_MK(G_SENT, 0);
    for (size_t r = 0; r < b->nrules; r++) {
        g->rule_alt[r] = (uint32_t)k;
        g->rule_nalt[r] = (uint32_t)b->rules[r].n;
        for (size_t i = 0; i < b->rules[r].n; i++) {
            const gb_alt *a = &b->rules[r].alt[i];
            g->alts[k++] = (uint32_t)e;
            if (a->n) memcpy(g->el + e, a->sym, a->n * sizeof *a->sym); /* NULL when empty */
            e += a->n;
            g->el[e++] = G_MK(G_END, 0);
        }
    }
    g->nel = nel;
    g->nrules = b->nrules;
    g->sets = b->sets;
    g->nsets = b->nsets;
    b->sets = NULL;
    gb_free(b);
}
