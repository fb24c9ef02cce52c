/* Constrained decoding: JSON Schema compiled to a byte-level pushdown automaton, stepped a
 * token at a time, giving per step the bitmap of the vocabulary's tokens that keep the text
 * a prefix of some value the schema admits. docs/grammar.md has the keyword set. */
#ifndef MUSE_GRAMMAR_H
#define MUSE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A compile error: the schema keyword and its JSON path (e.g. "pattern" at
 * "/properties/name"), and a message that says what is supported. */
typedef struct {
    char keyword[48];
    char path[160];
    char msg[320];
} muse_gerr;

/* The vocabulary as bytes: a trie over every token's bytes, built once per tokenizer.
 * bytes[i] of lens[i] bytes is token i; a token with len 0 (special tokens) is never
 * allowed by a mask. Read-only once built. */
typedef struct muse_gvocab muse_gvocab;
muse_gvocab *muse_gvocab_build(const uint8_t *const *bytes, const size_t *lens, size_t n);
void muse_gvocab_free(muse_gvocab *v);
size_t muse_gvocab_size(const muse_gvocab *v);
/* Bit t set for every token with bytes (vocab/8 bytes rounded up): what a free body may draw. */
const uint8_t *muse_gvocab_text_mask(const muse_gvocab *v);
/* Token t's bytes (NULL and *len 0 for a token without text). */
const uint8_t *muse_gvocab_token(const muse_gvocab *v, int32_t t, size_t *len);

/* A compiled schema, bound to one vocabulary, with a table per stack top filled once (at
 * compile, or by the fill worker for grammars from the cache); read-only once filled, so one
 * grammar serves many streams on any thread. */
typedef struct muse_grammar muse_grammar;

/* MUSE_GRAMMAR_JSON_SCHEMA: text is a JSON Schema. MUSE_GRAMMAR_JSON_OBJECT: any JSON object
 * (text ignored). MUSE_GRAMMAR_JSON_VALUE: any JSON value (text ignored).
 * MUSE_GRAMMAR_LITERALS: text is a JSON array of strings; exactly one of them (chat headers).
 * MUSE_GRAMMAR_ATEM: text is {"name": function, "parameters": JSON Schema}: one ATEM call
 * block (CHAT.md) of that function whose parameters are the schema's properties in order, each
 * value JSON held to its property's schema ('<' in strings only as \u003c, so a value never
 * closes its tag). */
enum {
    MUSE_GRAMMAR_JSON_SCHEMA = 0,
    MUSE_GRAMMAR_JSON_OBJECT = 1,
    MUSE_GRAMMAR_JSON_VALUE = 2,
    MUSE_GRAMMAR_LITERALS = 3,
    MUSE_GRAMMAR_ATEM = 4
};

/* 0 and *out (free with muse_grammar_free), or -1 and *err names the keyword and path. The
 * tables are filled before it returns. */
int muse_grammar_compile(int kind, const char *text, size_t len, const muse_gvocab *v,
                         muse_grammar **out, muse_gerr *err);
void muse_grammar_free(muse_grammar *g);
/* Rules and elements of the compiled grammar (for tests and the bench). */
size_t muse_grammar_elements(const muse_grammar *g);

/* The tables: bytes held (tables, deduplicated, and the per-element index), the stack tops
 * left without one by the cap, the seconds the fill took. A top without a table still gets
 * exact masks, by a walk of the whole vocabulary against its stack at each step (milliseconds
 * at a vocabulary of 200k: the cap bounds memory, not correctness). */
typedef struct {
    size_t bytes;
    size_t tables;
    size_t untabled;
    double fill_s;
} muse_gtable_stats;
void muse_grammar_table_stats(const muse_grammar *g, muse_gtable_stats *out);
/* The byte cap on one grammar's tables (default 256 MiB); process-wide. */
void muse_grammar_set_table_cap(size_t bytes);
size_t muse_grammar_table_cap(void);
/* True once g's tables are filled (a mask before then waits for them). */
bool muse_grammar_ready(const muse_grammar *g);

/* The cache: one compiled grammar per distinct (kind, canonical schema text), refcounted.
 * muse_grammar_get compiles the rules on a miss and queues the tables for the fill worker (one
 * thread), so the caller pays only the rules; muse_grammar_ready says when masks cost no wait.
 * muse_grammar_put drops a reference. Thread-safe. */
int muse_grammar_get(int kind, const char *text, size_t len, const muse_gvocab *v,
                     muse_grammar **out, muse_gerr *err);
void muse_grammar_put(muse_grammar *g);
/* The canonical text the cache keys on (cJSON's compact print), malloc'd; NULL on bad JSON. */
char *muse_grammar_canonical(const char *text, size_t len);

/* One stream's position in the automaton. */
typedef struct muse_gstate muse_gstate;
muse_gstate *muse_gstate_new(const muse_grammar *g);
muse_gstate *muse_gstate_copy(const muse_gstate *s);
void muse_gstate_free(muse_gstate *s);
/* True once the state's grammar has its tables (muse_grammar_ready). */
bool muse_gstate_ready(const muse_gstate *s);

/* Sets bit t of mask (vocab/8 bytes rounded up, zeroed here first) for every token whose
 * bytes keep the text a valid prefix. The end token is the caller's: allowed iff done. */
void muse_gstate_mask(muse_gstate *s, uint8_t *mask);
/* Steps over a token's bytes; 0 ok, -1 when they leave the grammar (the state is then
 * unchanged). */
int muse_gstate_advance_bytes(muse_gstate *s, const uint8_t *bytes, size_t n);
int muse_gstate_advance(muse_gstate *s, int32_t token);
/* True when the text so far is a complete value (it may still continue, e.g. digits). */
bool muse_gstate_done(const muse_gstate *s);
/* True when nothing can follow: no byte continues the text. */
bool muse_gstate_dead(const muse_gstate *s);

#endif
