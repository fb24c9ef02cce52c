/* What the grammar files share: the flat element array, the stack sets the automaton steps,
 * the vocabulary trie. Not for callers outside engine/grammar/. */
#ifndef MUSE_GRAM_INTERNAL_H
#define MUSE_GRAM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "grammar/grammar.h"

/* An element is a uint32: the kind in the top 2 bits, its argument below. A rule is a list of
 * alternatives, each a run of elements closed by G_END. */
#define G_END      0u /* end of an alternative: return to the frame below */
#define G_TERM     1u /* one byte from the set sets[arg] */
#define G_REF      2u /* enter rule arg */
#define G_SENT     3u /* the bottom of a local run (precomputation): the caller's context */
#define G_KIND(e)  ((e) >> 30)
#define G_ARG(e)   ((e)&0x3fffffffu)
#define G_MK(k, a) (((uint32_t)(k) << 30) | (uint32_t)(a))

#define GRAM_MAX_FRAMES 96   /* nesting a stack holds; deeper paths are dropped */
#define GRAM_MAX_STACKS 2048 /* stacks one state holds; more are dropped */
#define GRAM_MAX_ELEMS  (1u << 22)

typedef struct {
    uint32_t w[8];
} gram_set;

static inline bool gram_set_has(const gram_set *s, unsigned b)
{
    return (s->w[b >> 5] >> (b & 31)) & 1u;
}

/* A node of a table's exit trie: the bytes of tokens after the point where they leave the
 * element's rule. Tokens whose remaining bytes end here are tok[tok_lo, tok_hi). */
typedef struct {
    uint32_t first; /* first child (children contiguous, in byte order) */
    uint32_t tok_lo, tok_hi;
    uint16_t nchild;
    uint8_t byte;
    uint8_t pad; /* zero: tables compare with memcmp */
} gram_exit;

/* The table of a stack top (gram_table.c): the tokens accepted whatever lies below it (a
 * bitmap over the vocabulary, or the sorted ids when fewer), and the tokens that leave the
 * top's rule partway, by their remaining bytes, checked against the stack below at each step. */
typedef struct {
    uint8_t *bits; /* (vocab + 7) / 8 bytes, or NULL: ids */
    uint32_t *ids;
    uint32_t nids;
    gram_exit *exit; /* nexit 0: no token leaves the rule with bytes to spare */
    uint32_t nexit;
    uint32_t *exit_tok;
    uint32_t nexit_tok;
    size_t bytes;
    uint64_t hash;
} gram_pre;

struct muse_gvocab {
    size_t n;             /* tokens */
    uint32_t *node_first; /* per node: first child */
    uint16_t *node_nchild;
    uint8_t *node_byte;
    uint32_t *node_parent;
    uint16_t *node_depth;
    int32_t *node_tok;  /* a token ending here, or -1 */
    uint32_t *dup_next; /* tokens with the same bytes: a chain, -1 ends */
    /* the same in node order: node k's tokens are tok_by_node[node_tok_off[k] ..
     * node_tok_off[k + 1]), so a walk reads them in sequence */
    uint32_t *node_tok_off;
    uint32_t *tok_by_node;
    size_t nnodes;
    size_t max_depth;
    const uint8_t **tok_bytes; /* owned copies */
    size_t *tok_len;
    uint8_t *text_mask; /* tokens with bytes */
};

struct muse_grammar {
    uint32_t *el; /* elements */
    size_t nel;
    uint32_t *rule_alt; /* per rule: index into alts */
    uint32_t *rule_nalt;
    uint32_t *alts; /* element index where each alternative starts */
    size_t nrules;
    gram_set *sets;
    size_t nsets;
    uint32_t root; /* the start rule */
    uint32_t sent; /* index of the G_SENT element */
    const muse_gvocab *vocab;
    /* the tables (gram_table.c): filled at compile time or by the fill worker (gram_fill.c);
     * read only once ready is set */
    pthread_mutex_t mu; /* with cv: waiting for ready */
    pthread_cond_t cv;
    _Atomic int ready;
    gram_pre *pres; /* distinct tables */
    uint32_t npres;
    uint32_t *el_pre; /* per element: its table in pres, or UINT32_MAX (no table) */
    size_t table_bytes;
    uint32_t untabled; /* reachable stack tops left without a table (the cap) */
    double fill_s;
    struct muse_grammar *fill_next; /* the fill worker's queue */
    /* the cache's */
    char *key;
    int kind;
    int refs;
    struct muse_grammar *next;
};

/* A set of stacks. Each stack is [n, frame0 .. frame(n-1)], its top the last frame (a G_TERM
 * element, or G_SENT once a local run left its rule). accept: the root rule is complete. */
typedef struct {
    uint32_t *buf;
    size_t len, cap;
    uint32_t nstacks;
    bool accept, popped;
} gram_sset;

void gram_sset_clear(gram_sset *s);
void gram_sset_free(gram_sset *s);
void gram_sset_copy(gram_sset *dst, const gram_sset *src);
/* Every stack that frames (n of them) followed by element x expands to, added to out. */
void gram_expand(const muse_grammar *g, const uint32_t *frames, uint32_t n, uint32_t x,
                 gram_sset *out);
/* out = the stacks of in stepped over byte b. */
void gram_step(const muse_grammar *g, const gram_sset *in, unsigned b, gram_sset *out);
static inline bool gram_sset_live(const gram_sset *s)
{
    return s->nstacks > 0;
}

struct muse_gstate {
    const muse_grammar *g;
    gram_sset cur;
    gram_sset *scratch; /* one per trie depth + 2, for masks and steps */
    size_t nscratch;
    uint32_t *stamp; /* per table: the mask call that ORed it last */
    size_t nstamp;
    uint32_t gen;
};

/* Builder: rules with alternatives of symbols (G_TERM / G_REF elements), flattened at the end. */
typedef struct {
    uint32_t *sym;
    size_t n, cap;
} gb_alt;
typedef struct {
    gb_alt *alt;
    size_t n, cap;
} gb_rule;
typedef struct {
    gb_rule *rules;
    size_t nrules, cap;
    gram_set *sets;
    size_t nsets, setcap;
    size_t nsym; /* elements so far, bounded by GRAM_MAX_ELEMS */
    bool full;
} gram_builder;

uint32_t gb_rule_new(gram_builder *b);
/* Starts a new alternative of rule r and returns it. */
gb_alt *gb_alt_new(gram_builder *b, uint32_t r);
void gb_term(gram_builder *b, gb_alt *a, const gram_set *s);
void gb_byte(gram_builder *b, gb_alt *a, unsigned c);
void gb_range(gram_builder *b, gb_alt *a, unsigned lo, unsigned hi);
void gb_lit(gram_builder *b, gb_alt *a, const char *s, size_t n);
void gb_ref(gram_builder *b, gb_alt *a, uint32_t r);
/* Flattens into g (el, rules, alts, sets); frees the builder. */
void gb_finish(gram_builder *b, muse_grammar *g);
void gb_free(gram_builder *b);
/* Checks what one expansion can cost: 0, or -1 with *bad the rule at fault and *why
 * GB_LEFT_RECURSIVE (a rule reached again before any byte: the automaton would loop) or
 * GB_TOO_BRANCHY (over GB_BRANCH_MAX byte-set tops reached before a byte, e.g. anyOf nested
 * over the same $ref: expansion would take exponential time) or GB_TOO_DEEP. */
#define GB_BRANCH_MAX 32768
enum { GB_LEFT_RECURSIVE = 1, GB_TOO_BRANCHY = 2, GB_TOO_DEEP = 3 };
int gb_check(const gram_builder *b, uint32_t *bad, int *why);

/* Compiles a schema (cJSON tree) into b; returns the root rule or -1 with err. */
struct cJSON;
int64_t gram_schema_compile(gram_builder *b, const struct cJSON *schema, int kind, muse_gerr *err);

/* Fills every reachable stack top's table (up to the cap), then sets ready. */
void gram_tables_fill(muse_grammar *g);
void gram_tables_free(muse_grammar *g);
/* Queues g for the fill worker (takes a reference, put back when filled). */
void gram_fill_async(muse_grammar *g);
/* Blocks until g's tables are filled. */
void gram_wait_ready(const muse_grammar *g);

#endif
