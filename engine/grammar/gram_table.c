/* The stack tops' tables (gram_pre), filled once per compiled grammar: each reachable
 * element's run from the sentinel is walked over the vocabulary trie through the local DFA;
 * the tokens it accepts are kept as a bitmap or as ids, and the tokens that leave its rule with
 * bytes to spare are kept by those bytes (only when the next byte can follow the rule) for the
 * step to check against the stack below. Identical tables are stored once; past the byte cap
 * an element keeps none, and gram_mask.c walks the whole trie against such a stack. */
#include <stdlib.h>

#include "base/clock.h"
#include "base/muse_common.h"
#include "grammar/gram_table.h"

static _Atomic size_t table_cap = (size_t)256 << 20;

void muse_grammar_set_table_cap(size_t bytes)
{
    table_cap = bytes;
}

size_t muse_grammar_table_cap(void)
{
    return table_cap;
}

#define DFA_KEEP ((size_t)256 << 20) /* the DFA is dropped between elements past this */

typedef struct {
    uint32_t tok, off; /* token, and where its remaining bytes start */
} exit_pair;

typedef struct {
    const muse_grammar *g;
    const muse_gvocab *v;
    gram_dfa *d;
    uint32_t *ids; /* the element's accepted tokens in trie order (room for the vocabulary) */
    size_t nids;
    uint32_t *pops; /* trie nodes where the rule can be complete, with children */
    size_t npops, popcap;
    exit_pair *pairs;
    size_t npairs, paircap;
    gram_exit *exit;
    size_t nexit, exitcap;
} fill_ctx;

static void add_pop(fill_ctx *c, uint32_t k)
{
    if (c->npops == c->popcap) {
        c->popcap = c->popcap ? c->popcap * 2 : 64;
        c->pops = realloc(c->pops, c->popcap * sizeof *c->pops);
        MUSE_CHECK(c->pops);
    }
    c->pops[c->npops++] = k;
}

/* The hot loop of the fill: the trie below node from DFA state q; n tokens so far, returned
 * grown. The arrays are read into locals so the stores to ids cannot make them reload. */
static size_t walk(fill_ctx *c, uint32_t node, uint32_t q, size_t n)
{
    const muse_gvocab *v = c->v;
    const uint32_t *first = v->node_first, *off = v->node_tok_off, *tbn = v->tok_by_node;
    const uint16_t *nchild = v->node_nchild;
    const uint8_t *byte = v->node_byte;
    gram_dfa *d = c->d;
    uint32_t *ids = c->ids;
    for (uint32_t k = first[node], e = k + nchild[node]; k < e; k++) {
        uint32_t r = gram_dfa_next(d, q, byte[k]);
        if (r == GRAM_DFA_DEAD) continue;
        /* live or popped: the tokens ending here are accepted whatever lies below */
        for (uint32_t i = off[k], hi = off[k + 1]; i < hi; i++) ids[n++] = tbn[i];
        if (!nchild[k]) continue;
        uint8_t f = d->flags[r];
        if (f & GRAM_DFA_POPPED) add_pop(c, k);
        if (f & GRAM_DFA_LIVE) n = walk(c, k, r, n);
    }
    return n;
}

static void add_pairs(fill_ctx *c, uint32_t node, uint32_t off)
{
    const muse_gvocab *v = c->v;
    for (uint32_t i = v->node_tok_off[node]; i < v->node_tok_off[node + 1]; i++) {
        if (c->npairs == c->paircap) {
            c->paircap = c->paircap ? c->paircap * 2 : 256;
            c->pairs = realloc(c->pairs, c->paircap * sizeof *c->pairs);
            MUSE_CHECK(c->pairs);
        }
        c->pairs[c->npairs++] = (exit_pair){v->tok_by_node[i], off};
    }
    for (uint32_t k = v->node_first[node], e = k + v->node_nchild[node]; k < e; k++)
        add_pairs(c, k, off);
}

static int cmp_pair(const void *a, const void *b, void *ctx)
{
    const muse_gvocab *v = ctx;
    const exit_pair *x = a, *y = b;
    size_t lx = v->tok_len[x->tok] - x->off, ly = v->tok_len[y->tok] - y->off;
    size_t m = lx < ly ? lx : ly;
    int r = m ? memcmp(v->tok_bytes[x->tok] + x->off, v->tok_bytes[y->tok] + y->off, m) : 0;
    if (r) return r;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x->tok < y->tok ? -1 : x->tok > y->tok;
}

static uint8_t pair_byte(const fill_ctx *c, size_t i, size_t depth)
{
    const exit_pair *p = &c->pairs[i];
    return c->v->tok_bytes[p->tok][p->off + depth];
}

/* Node (pairs [lo, hi), sharing depth bytes) and its subtree, children contiguous. */
static void build_exit(fill_ctx *c, size_t lo, size_t hi, size_t depth, uint32_t node)
{
    size_t t = lo;
    while (t < hi && c->v->tok_len[c->pairs[t].tok] - c->pairs[t].off == depth) t++;
    c->exit[node].pad = 0;
    c->exit[node].tok_lo = (uint32_t)lo;
    c->exit[node].tok_hi = (uint32_t)t;
    size_t groups = 0;
    for (size_t i = t; i < hi; groups++) {
        uint8_t b = pair_byte(c, i, depth);
        while (i < hi && pair_byte(c, i, depth) == b) i++;
    }
    if (c->nexit + groups > c->exitcap) {
        c->exitcap = (c->nexit + groups) * 2;
        c->exit = realloc(c->exit, c->exitcap * sizeof *c->exit);
        MUSE_CHECK(c->exit);
    }
    uint32_t first = (uint32_t)c->nexit;
    c->nexit += groups;
    c->exit[node].first = first;
    c->exit[node].nchild = (uint16_t)groups;
    uint32_t k = first;
    for (size_t i = t; i < hi; k++) {
        size_t j = i;
        uint8_t b = pair_byte(c, i, depth);
        while (j < hi && pair_byte(c, j, depth) == b) j++;
        c->exit[k].byte = b;
        build_exit(c, i, j, depth + 1, k);
        i = j;
    }
}

/* The exits of the element just walked: every token below a child of a pop node whose byte
 * can follow the rule, by its bytes after the pop. */
static void collect_exits(fill_ctx *c, const gram_set *follow)
{
    const muse_gvocab *v = c->v;
    c->npairs = 0;
    c->nexit = 0;
    for (size_t i = 0; i < c->npops; i++) {
        uint32_t k = c->pops[i];
        for (uint32_t ch = v->node_first[k], e = ch + v->node_nchild[k]; ch < e; ch++)
            if (gram_set_has(follow, v->node_byte[ch])) add_pairs(c, ch, v->node_depth[k]);
    }
    if (!c->npairs) return;
    qsort_r(c->pairs, c->npairs, sizeof *c->pairs, cmp_pair, (void *)v);
    if (!c->exitcap) {
        c->exitcap = 256;
        c->exit = MUSE_MALLOC(c->exitcap * sizeof *c->exit);
    }
    c->nexit = 1;
    memset(&c->exit[0], 0, sizeof c->exit[0]);
    build_exit(c, 0, c->npairs, 0, 0);
}

/* A word-wide mix (tables of 25 KB are hashed once each). */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The walked element's table, packed: its ids when they take fewer bytes than a bitmap. */
static gram_pre pack(const fill_ctx *c, size_t nb)
{
    gram_pre p = {0};
    uint64_t h = 0xcbf29ce484222325ull;
    if (c->nids * sizeof(uint32_t) < nb) {
        p.nids = (uint32_t)c->nids;
        p.ids = MUSE_MALLOC((c->nids ? c->nids : 1) * sizeof *p.ids);
        if (c->nids) memcpy(p.ids, c->ids, c->nids * sizeof *p.ids);
        h = hash_bytes(h, p.ids, p.nids * sizeof *p.ids);
        p.bytes += p.nids * sizeof *p.ids;
    } else {
        p.bits = MUSE_CALLOC(nb, 1);
        for (size_t i = 0; i < c->nids; i++)
            p.bits[c->ids[i] >> 3] |= (uint8_t)(1u << (c->ids[i] & 7));
        h = hash_bytes(h ^ 1, p.bits, nb);
        p.bytes += nb;
    }
    if (c->nexit) {
        p.nexit = (uint32_t)c->nexit;
        p.exit = MUSE_MALLOC(c->nexit * sizeof *p.exit);
        memcpy(p.exit, c->exit, c->nexit * sizeof *p.exit);
        p.exit_tok = MUSE_MALLOC(c->npairs * sizeof *p.exit_tok);
        p.nexit_tok = (uint32_t)c->npairs;
        for (size_t i = 0; i < c->npairs; i++) p.exit_tok[i] = c->pairs[i].tok;
        h = hash_bytes(h, p.exit, c->nexit * sizeof *p.exit);
        h = hash_bytes(h, p.exit_tok, c->npairs * sizeof *p.exit_tok);
        p.bytes += c->nexit * sizeof *p.exit + c->npairs * sizeof *p.exit_tok;
    }
    p.bytes += sizeof p;
    p.hash = h;
    return p;
}

static bool same_pre(const gram_pre *a, const gram_pre *b, size_t nb)
{
    if (a->hash != b->hash || a->bytes != b->bytes || !a->bits != !b->bits || a->nids != b->nids ||
        a->nexit != b->nexit || a->nexit_tok != b->nexit_tok)
        return false;
    if (a->bits ? memcmp(a->bits, b->bits, nb) != 0
                : a->nids && memcmp(a->ids, b->ids, a->nids * sizeof *a->ids) != 0)
        return false;
    return !a->nexit || (memcmp(a->exit, b->exit, a->nexit * sizeof *a->exit) == 0 &&
                         memcmp(a->exit_tok, b->exit_tok, a->nexit_tok * sizeof *a->exit_tok) == 0);
}

static void pre_free(gram_pre *p)
{
    free(p->bits);
    free(p->ids);
    free(p->exit);
    free(p->exit_tok);
}

void gram_tables_free(muse_grammar *g)
{
    for (uint32_t i = 0; i < g->npres; i++) pre_free(&g->pres[i]);
    free(g->pres);
    free(g->el_pre);
    g->pres = NULL;
    g->el_pre = NULL;
    g->npres = 0;
}

static void set_ready(muse_grammar *g)
{
    pthread_mutex_lock(&g->mu);
    atomic_store_explicit(&g->ready, 1, memory_order_release);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void gram_tables_fill(muse_grammar *g)
{
    double t0 = muse_now_s();
    const muse_gvocab *v = g->vocab;
    g->el_pre = MUSE_MALLOC((g->nel ? g->nel : 1) * sizeof *g->el_pre);
    for (size_t i = 0; i < g->nel; i++) g->el_pre[i] = UINT32_MAX;
    if (!v || !g->nrules) {
        set_ready(g);
        return;
    }
    size_t nb = (v->n + 7) / 8, cap = table_cap, presCap = 0;
    gram_follow fo;
    gram_follow_build(g, &fo);
    gram_dfa d;
    gram_dfa_init(&d, g);
    fill_ctx c = {.g = g, .v = v, .d = &d, .ids = MUSE_MALLOC((v->n ? v->n : 1) * sizeof *c.ids)};
    /* dedup: open addressing over the tables' hashes */
    size_t htcap = 64;
    uint32_t *ht = MUSE_CALLOC(htcap, sizeof *ht);
    for (uint32_t x = 0; x < g->nel; x++) {
        if (G_KIND(g->el[x]) != G_TERM || !fo.reach[fo.rule_of[x]]) continue;
        if (gram_dfa_bytes(&d) > DFA_KEEP) gram_dfa_reset(&d);
        c.npops = 0;
        uint32_t q = gram_dfa_start(&d, x);
        c.nids = q != GRAM_DFA_DEAD ? walk(&c, 0, q, 0) : 0;
        collect_exits(&c, &fo.follow[fo.rule_of[x]]);
        gram_pre p = pack(&c, nb);
        size_t i = p.hash & (htcap - 1);
        for (; ht[i]; i = (i + 1) & (htcap - 1))
            if (same_pre(&g->pres[ht[i] - 1], &p, nb)) break;
        if (ht[i]) {
            g->el_pre[x] = ht[i] - 1;
            pre_free(&p);
            continue;
        }
        if (g->table_bytes + p.bytes > cap) {
            g->untabled++;
            pre_free(&p);
            continue;
        }
        if (g->npres == presCap) {
            presCap = presCap ? presCap * 2 : 16;
            g->pres = realloc(g->pres, presCap * sizeof *g->pres);
            MUSE_CHECK(g->pres);
        }
        g->pres[g->npres] = p;
        g->el_pre[x] = g->npres;
        ht[i] = ++g->npres;
        g->table_bytes += p.bytes;
        if (g->npres * 2 > htcap) { /* grow and rehash */
            free(ht);
            htcap *= 4;
            ht = MUSE_CALLOC(htcap, sizeof *ht);
            for (uint32_t k = 0; k < g->npres; k++) {
                size_t j = g->pres[k].hash & (htcap - 1);
                while (ht[j]) j = (j + 1) & (htcap - 1);
                ht[j] = k + 1;
            }
        }
    }
    g->table_bytes += g->nel * sizeof *g->el_pre;
    free(ht);
    free(c.ids);
    free(c.pops);
    free(c.pairs);
    free(c.exit);
    gram_dfa_free(&d);
    gram_follow_free(&fo);
    g->fill_s = muse_now_s() - t0;
    set_ready(g);
}
