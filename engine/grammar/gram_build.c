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
            if (a->n) memcpy(g->el + e, a->sym, a->n * sizeof *a->sym); /* sym NULL when empty */
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

/* ---- what an expansion costs ---- */

#define CHECK_DEPTH 8192 /* rules chained before a byte (optional properties in a row) */

typedef struct {
    const gram_builder *b;
    uint8_t *st; /* 0 not seen, 1 on the walk, 2 done */
    uint64_t *tops, *empties;
    uint32_t bad;
    int why;
} check_ctx;

static uint64_t sat(uint64_t x)
{
    return x > GB_BRANCH_MAX ? GB_BRANCH_MAX + 1 : x;
}

/* For rule r: tops (byte-set elements its alternatives reach before a byte) and empties
 * (ways it ends having read none). Both at most GB_BRANCH_MAX + 1, so products fit. */
static int check_rule(check_ctx *c, uint32_t r, size_t depth)
{
    if (c->st[r] == 2) return 0;
    if (c->st[r] == 1 || depth > CHECK_DEPTH) {
        c->bad = r;
        c->why = c->st[r] == 1 ? GB_LEFT_RECURSIVE : GB_TOO_DEEP;
        return -1;
    }
    c->st[r] = 1;
    const gb_rule *ru = &c->b->rules[r];
    uint64_t tops = 0, empties = 0;
    for (size_t i = 0; i < ru->n; i++) {
        const gb_alt *a = &ru->alt[i];
        uint64_t ways = 1; /* paths that reach symbol k having read nothing */
        for (size_t k = 0; k < a->n && ways; k++) {
            uint32_t e = a->sym[k];
            if (G_KIND(e) == G_TERM) {
                tops = sat(tops + ways);
                ways = 0;
                break;
            }
            uint32_t s = G_ARG(e);
            if (check_rule(c, s, depth + 1)) return -1;
            tops = sat(tops + sat(ways * c->tops[s]));
            ways = sat(ways * c->empties[s]);
        }
        empties = sat(empties + ways);
    }
    c->tops[r] = tops;
    c->empties[r] = empties;
    c->st[r] = 2;
    if (tops > GB_BRANCH_MAX || empties > GB_BRANCH_MAX) {
        c->bad = r;
        c->why = GB_TOO_BRANCHY;
        return -1;
    }
    return 0;
}

int gb_check(const gram_builder *b, uint32_t *bad, int *why)
{
    check_ctx c = {b,
                   MUSE_CALLOC(b->nrules + 1, 1),
                   MUSE_CALLOC(b->nrules + 1, sizeof(uint64_t)),
                   MUSE_CALLOC(b->nrules + 1, sizeof(uint64_t)),
                   0,
                   0};
    int rc = 0;
    /* every rule: a step can start an expansion anywhere after a byte */
    for (uint32_t r = 0; r < b->nrules && rc == 0; r++) rc = check_rule(&c, r, 0);
    *bad = c.bad;
    *why = c.why;
    free(c.st);
    free(c.tops);
    free(c.empties);
    return rc;
}
