/* A constrained chat turn's frame (CHAT.md): which messages the turn may write and what each
 * body is held to, stepped a token at a time next to the reply parser. The first header names
 * self (reasoning, free text ending with <|eom|>) or one of the recipients; after reasoning
 * (or once it has taken reasoning_max tokens) the next header is forced to a recipient; a
 * recipient's body is held to its grammar and the end-of-turn ids are allowed only once its value
 * is complete. docs/grammar.md says why. */
#ifndef MUSE_GRAMMAR_FRAME_H
#define MUSE_GRAMMAR_FRAME_H

#include "grammar/grammar.h"

#define MUSE_GFRAME_MAX_ENDS 8

/* The control ids the frame writes (CHAT.md) and the end-of-turn ids. */
typedef struct {
    int32_t start, message, eom;
    int32_t ends[MUSE_GFRAME_MAX_ENDS];
    size_t nends;
    int64_t reasoning_max; /* tokens the reasoning body may take before <|eom|> is forced */
} muse_gframe_ids;

/* A message the answer may go to: "user" or a function's name, and what its body is held to
 * (NULL: free text, ended by <|eom|> or an end id). The frame borrows body. */
typedef struct {
    const char *name;
    const muse_grammar *body;
} muse_gframe_rcpt;

typedef struct muse_gframe muse_gframe;

/* 0 and *out, or -1 with *err (a recipient name the headers cannot hold). */
int muse_gframe_new(const muse_gframe_ids *ids, const muse_gvocab *v, const muse_gframe_rcpt *r,
                    size_t n, muse_gframe **out, muse_gerr *err);
void muse_gframe_free(muse_gframe *f);
/* True once every grammar of the frame has its tables (muse_grammar_ready). */
bool muse_gframe_ready(const muse_gframe *f);
/* The next draw's mask (vocab/8 bytes rounded up, written whole). */
void muse_gframe_mask(muse_gframe *f, uint8_t *mask);
/* One drawn token (a mask's token: anything else leaves the frame done, every end allowed). */
void muse_gframe_push(muse_gframe *f, int32_t tok);
/* Which message the turn is in: -2 a header, -1 reasoning, k >= 0 recipient k's body. */
int muse_gframe_where(const muse_gframe *f);

#endif
