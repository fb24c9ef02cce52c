/* The rules' follow sets (the bytes that can come once a rule is complete), the rule of each
 * element and the rules the root reaches: the table fill keeps a token's exit from a rule
 * only when its next byte can follow the rule, and fills only reachable elements. */
#include "grammar/gram_table.h"

#include "base/muse_common.h"

static bool set_or(gram_set *dst, const gram_set *src)
{
    bool changed = false;
    for (int i = 0; i < 8; i++) {
        uint32_t w = dst->w[i] | src->w[i];
        changed |= w != dst->w[i];
        dst->w[i] = w;
    }
    return changed;
}

/* FIRST and nullable of every rule, to a fixpoint (callees are mostly made before callers, so
 * an ascending pass settles most of it). */
static void first_sets(const muse_grammar *g, gram_set *first, uint8_t *nullable)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < g->nrules; r++) {
            for (uint32_t a = 0; a < g->rule_nalt[r]; a++) {
                bool null = true;
                for (uint32_t x = g->alts[g->rule_alt[r] + a]; null; x++) {
                    uint32_t e = g->el[x];
                    if (G_KIND(e) == G_END) break;
                    if (G_KIND(e) == G_TERM) {
                        changed |= set_or(&first[r], &g->sets[G_ARG(e)]);
                        null = false;
                    } else {
                        changed |= set_or(&first[r], &first[G_ARG(e)]);
                        null = nullable[G_ARG(e)];
                    }
                }
                if (null && !nullable[r]) nullable[r] = 1, changed = true;
            }
        }
    }
}

/* Follow sets from each alternative read right to left: a reference is followed by the
 * FIRST of the rest, and by its rule's follow when the rest can be empty. */
static void follow_sets(const muse_grammar *g, const gram_set *first, const uint8_t *nullable,
                        gram_set *follow)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = g->nrules; r-- > 0;) {
            for (uint32_t a = 0; a < g->rule_nalt[r]; a++) {
                uint32_t x0 = g->alts[g->rule_alt[r] + a], x1 = x0;
                while (G_KIND(g->el[x1]) != G_END) x1++;
                gram_set rest = {{0}};
                bool rest_null = true;
                for (uint32_t x = x1; x-- > x0;) {
                    uint32_t e = g->el[x];
                    if (G_KIND(e) == G_TERM) {
                        rest = g->sets[G_ARG(e)];
                        rest_null = false;
                        continue;
                    }
                    uint32_t s = G_ARG(e);
                    changed |= set_or(&follow[s], &rest);
                    if (rest_null) changed |= set_or(&follow[s], &follow[r]);
                    if (nullable[s]) {
                        set_or(&rest, &first[s]);
                    } else {
                        rest = first[s];
                        rest_null = false;
                    }
                }
            }
        }
    }
}

void gram_follow_build(const muse_grammar *g, gram_follow *f)
{
    size_t nr = g->nrules ? g->nrules : 1;
    f->rule_of = MUSE_MALLOC(g->nel * sizeof *f->rule_of);
    f->reach = MUSE_CALLOC(nr, 1);
    f->follow = MUSE_CALLOC(nr, sizeof *f->follow);
    for (size_t i = 0; i < g->nel; i++) f->rule_of[i] = UINT32_MAX;
    for (size_t r = 0; r < g->nrules; r++)
        for (uint32_t a = 0; a < g->rule_nalt[r]; a++)
            for (uint32_t x = g->alts[g->rule_alt[r] + a];; x++) {
                f->rule_of[x] = (uint32_t)r;
                if (G_KIND(g->el[x]) == G_END) break;
            }
    if (!g->nrules) return;
    /* reach: a worklist from the root over references */
    uint32_t *work = MUSE_MALLOC(nr * sizeof *work);
    size_t nw = 0;
    f->reach[g->root] = 1;
    work[nw++] = g->root;
    while (nw) {
        uint32_t r = work[--nw];
        for (uint32_t a = 0; a < g->rule_nalt[r]; a++)
            for (uint32_t x = g->alts[g->rule_alt[r] + a]; G_KIND(g->el[x]) != G_END; x++) {
                uint32_t e = g->el[x];
                if (G_KIND(e) == G_REF && !f->reach[G_ARG(e)]) {
                    f->reach[G_ARG(e)] = 1;
                    work[nw++] = G_ARG(e);
                }
            }
    }
    free(work);
    gram_set *first = MUSE_CALLOC(nr, sizeof *first);
    uint8_t *nullable = MUSE_CALLOC(nr, 1);
    first_sets(g, first, nullable);
    follow_sets(g, first, nullable, f->follow);
    free(first);
    free(nullable);
}

void gram_follow_free(gram_follow *f)
{
    free(f->rule_of);
    free(f->reach);
    free(f->follow);
    memset(f, 0, sizeof *f);
}
