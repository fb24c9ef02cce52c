/* The local automaton as a DFA for the table fill: stack sets interned by content, successors
 * over byte classes computed once, so the trie walk of every element costs a table read a node
 * instead of a gram_step (gram_table.h). */
#include "grammar/gram_table.h"

#include "base/muse_common.h"

/* Bytes that every set of the grammar holds or lacks together step alike: one class. */
static void byte_classes(gram_dfa *d)
{
    const muse_grammar *g = d->g;
    memset(d->cls, 0, sizeof d->cls);
    uint32_t n = 1;
    for (size_t s = 0; s < g->nsets && n < 256; s++) {
        uint16_t remap[256][2];
        memset(remap, 0xff, sizeof remap);
        uint32_t m = 0;
        for (unsigned b = 0; b < 256; b++) {
            unsigned in = gram_set_has(&g->sets[s], b);
            uint16_t *slot = &remap[d->cls[b]][in];
            if (*slot == 0xffff) *slot = (uint16_t)m++;
            d->cls[b] = (uint8_t)*slot;
        }
        n = m;
    }
    d->ncls = n;
    for (unsigned b = 256; b-- > 0;) d->rep[d->cls[b]] = (uint8_t)b;
}

void gram_dfa_init(gram_dfa *d, const muse_grammar *g)
{
    memset(d, 0, sizeof *d);
    d->g = g;
    byte_classes(d);
}

void gram_dfa_reset(gram_dfa *d)
{
    d->plen = 0;
    d->nst = 0;
    if (d->ht) memset(d->ht, 0, d->htcap * sizeof *d->ht);
}

void gram_dfa_free(gram_dfa *d)
{
    free(d->pool);
    free(d->off);
    free(d->len);
    free(d->hash);
    free(d->flags);
    free(d->trans);
    free(d->ht);
    gram_sset_free(&d->out);
    memset(d, 0, sizeof *d);
}

size_t gram_dfa_bytes(const gram_dfa *d)
{
    return d->pcap * sizeof *d->pool + d->stcap * (sizeof *d->off + 2 * sizeof *d->len + 1) +
           d->stcap * d->ncls * sizeof *d->trans + d->htcap * sizeof *d->ht;
}

static uint32_t hash_state(const uint32_t *buf, size_t len, uint8_t flags)
{
    uint32_t h = 2166136261u ^ flags;
    for (size_t i = 0; i < len; i++) h = (h ^ buf[i]) * 16777619u;
    return h ^ (h >> 15);
}

static void grow_table(gram_dfa *d)
{
    size_t cap = d->htcap ? d->htcap * 2 : 1024;
    uint32_t *ht = MUSE_CALLOC(cap, sizeof *ht);
    for (size_t q = 0; q < d->nst; q++) {
        size_t i = d->hash[q] & (cap - 1);
        while (ht[i]) i = (i + 1) & (cap - 1);
        ht[i] = (uint32_t)q + 1;
    }
    free(d->ht);
    d->ht = ht;
    d->htcap = cap;
}

/* The state of stack set s (interned), or GRAM_DFA_DEAD when it has no stack and no pop. */
static uint32_t intern(gram_dfa *d, const gram_sset *s)
{
    uint8_t flags = (uint8_t)((s->nstacks ? GRAM_DFA_LIVE : 0) | (s->popped ? GRAM_DFA_POPPED : 0));
    if (!flags) return GRAM_DFA_DEAD;
    uint32_t h = hash_state(s->buf, s->len, flags);
    if ((d->nst + 1) * 2 > d->htcap) grow_table(d);
    size_t i = h & (d->htcap - 1);
    for (; d->ht[i]; i = (i + 1) & (d->htcap - 1)) {
        uint32_t q = d->ht[i] - 1;
        if (d->hash[q] == h && d->flags[q] == flags && d->len[q] == s->len &&
            (!s->len || memcmp(d->pool + d->off[q], s->buf, s->len * sizeof *s->buf) == 0))
            return q;
    }
    if (d->nst == d->stcap) {
        d->stcap = d->stcap ? d->stcap * 2 : 256;
        d->off = realloc(d->off, d->stcap * sizeof *d->off);
        d->len = realloc(d->len, d->stcap * sizeof *d->len);
        d->hash = realloc(d->hash, d->stcap * sizeof *d->hash);
        d->flags = realloc(d->flags, d->stcap);
        d->trans = realloc(d->trans, d->stcap * d->ncls * sizeof *d->trans);
        MUSE_CHECK(d->off && d->len && d->hash && d->flags && d->trans);
    }
    if (d->plen + s->len > d->pcap) {
        d->pcap = (d->plen + s->len) * 2;
        d->pool = realloc(d->pool, d->pcap * sizeof *d->pool);
        MUSE_CHECK(d->pool);
    }
    uint32_t q = (uint32_t)d->nst++;
    if (s->len) memcpy(d->pool + d->plen, s->buf, s->len * sizeof *s->buf);
    d->off[q] = d->plen;
    d->len[q] = (uint32_t)s->len;
    d->hash[q] = h;
    d->flags[q] = flags;
    d->plen += s->len;
    for (uint32_t c = 0; c < d->ncls; c++) d->trans[(size_t)q * d->ncls + c] = GRAM_DFA_UNK;
    d->ht[i] = q + 1;
    return q;
}

uint32_t gram_dfa_start(gram_dfa *d, uint32_t x)
{
    gram_sset_clear(&d->out);
    gram_expand(d->g, &d->g->sent, 1, x, &d->out);
    return intern(d, &d->out);
}

uint32_t gram_dfa_step(gram_dfa *d, uint32_t q, uint32_t c)
{
    uint32_t t = GRAM_DFA_DEAD;
    if (d->flags[q] & GRAM_DFA_LIVE) {
        /* a view of the pool: intern may move it, but only after gram_step has read it */
        gram_sset in = {.buf = d->pool + d->off[q], .len = d->len[q], .cap = d->len[q]};
        gram_step(d->g, &in, d->rep[c], &d->out);
        t = intern(d, &d->out);
    }
    d->trans[(size_t)q * d->ncls + c] = t;
    return t;
}
