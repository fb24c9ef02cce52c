/* The streaming reply parser (CHAT.md "Parsing what the model writes"): generated token ids in,
 * reasoning / content deltas, tool calls and the finish reason out, one token at a time. */
#ifndef MUSE_REPLY_H
#define MUSE_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "text/chat.h"
#include "base/muse_common.h"

#define MUSE_REPLY_MAX_STOPS 4
#define MUSE_REPLY_STOP_MAX  256 /* bytes per stop string */

/* The bytes a token id stands for (NULL or *len 0: no text). */
typedef const uint8_t *(*muse_token_bytes_fn)(void *ctx, int32_t id, size_t *len);

typedef enum {
    MUSE_EV_REASONING, /* text delta of reasoning_content */
    MUSE_EV_CONTENT,   /* text delta of content */
    MUSE_EV_TOOL_CALL, /* one whole call */
    MUSE_EV_FINISH     /* last event of the turn */
} muse_reply_ev_kind;

/* Pointers are valid only during the emit callback. */
typedef struct {
    muse_reply_ev_kind kind;
    const char *text; /* REASONING / CONTENT: delta, valid UTF-8, len > 0 */
    size_t len;
    int unsplit; /* CONTENT: the turn ended before any visible message; this is the turn's whole
                    text (reasoning already streamed included): a non-streaming response puts it
                    in content and leaves reasoning_content out */
    const char *call_id, *name, *arguments; /* TOOL_CALL; arguments: a JSON object string */
    int call_index;                         /* TOOL_CALL: 0, 1, ... in this reply */
    const char *finish_reason;              /* FINISH: "stop" | "length" | "tool_calls" | hint */
} muse_reply_ev;
typedef void (*muse_reply_emit_fn)(void *ctx, const muse_reply_ev *ev);

typedef struct {
    muse_chat_ids ids;
    const int32_t *stop_ids; /* extra end-of-turn ids (the config's eos ids) */
    size_t nstop_ids;
    const char *const *function_names; /* the request's functions; other names are not calls */
    size_t nfunction_names;
    const char *const *stop_strings; /* the request's stop, up to MUSE_REPLY_MAX_STOPS */
    size_t nstop_strings;
    int parallel_tool_calls; /* 1: after a call's <|eom|>, read on for more call messages */
    uint64_t call_id_seed;   /* call ids: "call_" + 24 chars from (seed, call index) */
    muse_token_bytes_fn token_bytes;
    void *token_ctx;
    muse_reply_emit_fn emit;
    void *emit_ctx;
} muse_reply_config;

typedef struct muse_reply muse_reply;

/* Copies what it needs from c. Fails on a bad stop string (naming stop[i]). */
int muse_reply_create(const muse_reply_config *c, muse_reply **out, muse_err *e);
void muse_reply_destroy(muse_reply *r);
/* Ready for a new turn (right after <|start|>assistant) with a new call-id seed. */
void muse_reply_reset(muse_reply *r, uint64_t call_id_seed);

/* Feeds one generated id. Returns 1 when generation must stop (end of turn, stop id, stop
 * string, end of the tool calls); FINISH has then been emitted and later pushes are ignored. */
int muse_reply_push(muse_reply *r, int32_t id);
/* Ends the turn from outside (max_tokens: "length"; cancel: the caller's hint): flushes what is
 * held back and emits FINISH (reason "tool_calls" when calls were made). No-op when done. */
void muse_reply_finish(muse_reply *r, const char *reason_hint);

int muse_reply_done(const muse_reply *r);
/* Tokens pushed while inside a reasoning (to=self) body, its end token included. */
size_t muse_reply_reasoning_tokens(const muse_reply *r);

#endif
