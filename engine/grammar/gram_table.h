/* What the table fill uses and nothing else does: the rules' follow sets (gram_follow.c) and
 * the local automaton as a DFA (gram_dfa.c). Not for callers outside engine/grammar/. */
#ifndef MUSE_GRAM_TABLE_H
#define MUSE_GRAM_TABLE_H

#include "grammar/gram_internal.h"

/* Which rule each element belongs to, which rules the root reaches, and the bytes that can
 * come next once a rule is complete (FOLLOW, over bytes; the root's is empty). */
typedef struct {
    uint32_t *rule_of; /* per element; UINT32_MAX for the G_SENT */
    uint8_t *reach;    /* per rule */
    gram_set *follow;  /* per rule */
} gram_follow;

void gram_follow_build(const muse_grammar *g, gram_follow *f);
void gram_follow_free(gram_follow *f);

/* The local automaton: a run from the sentinel (one rule's text, the rules it calls, then
 * "popped" once the rule is complete) as a DFA whose states are the stack sets gram_step
 * reaches, each interned once, its successors over the grammar's byte classes (bytes no set
 * tells apart) computed on first use. */
#define GRAM_DFA_DEAD   UINT32_MAX
#define GRAM_DFA_UNK    (UINT32_MAX - 1)
#define GRAM_DFA_LIVE   1u /* stacks left: the rule can go on */
#define GRAM_DFA_POPPED 2u /* the rule can be complete here */

typedef struct {
    const muse_grammar *g;
    uint8_t cls[256];
    uint8_t rep[256]; /* a byte of each class */
    uint32_t ncls;
    uint32_t *pool; /* state contents (gram_sset buffers) */
    size_t plen, pcap;
    size_t *off;
    uint32_t *len, *hash;
    uint8_t *flags;
    uint32_t *trans; /* nst * ncls: GRAM_DFA_UNK until computed */
    size_t nst, stcap;
    uint32_t *ht; /* open addressing: state + 1, 0 empty */
    size_t htcap;
    gram_sset out;
} gram_dfa;

void gram_dfa_init(gram_dfa *d, const muse_grammar *g);
void gram_dfa_free(gram_dfa *d);
/* Drops every state (keeps the byte classes): bounds the memory between two elements. */
void gram_dfa_reset(gram_dfa *d);
size_t gram_dfa_bytes(const gram_dfa *d);
/* The state of a run whose top is element x, or GRAM_DFA_DEAD. */
uint32_t gram_dfa_start(gram_dfa *d, uint32_t x);
/* The successor of q over byte class c (computes and records it). */
uint32_t gram_dfa_step(gram_dfa *d, uint32_t q, uint32_t c);

static inline uint32_t gram_dfa_next(gram_dfa *d, uint32_t q, uint8_t byte)
{
    uint32_t c = d->cls[byte], t = d->trans[(size_t)q * d->ncls + c];
    return t != GRAM_DFA_UNK ? t : gram_dfa_step(d, q, c);
}

#endif
