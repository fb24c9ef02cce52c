/* Renders an OpenAI chat request (messages, tools) into the Muse chat format of CHAT.md:
 * a list of text segments (tokenized with special parsing OFF) and control-token ids. */
#ifndef MUSE_CHAT_H
#define MUSE_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/muse_common.h"
#include "text/tokenizer.h"

/* One piece of the rendering: text bytes buf[off..off+len), or a control token id. */
typedef struct {
    int is_special;
    int32_t id;
    size_t off, len;
} muse_chat_seg;

/* Control-token ids, read from the pack's tokenizer by content. */
typedef struct {
    int32_t begin_of_text, end_of_text, eom, eot, start, message;
} muse_chat_ids;

typedef struct {
    muse_buf text; /* all text bytes, NUL-terminated */
    muse_chat_seg *segs;
    size_t nsegs, segcap;
    muse_chat_ids ids; /* the ids used, so specials can be written back as strings */
    char **fn_names;   /* the request's function names in tools order (for the reply parser) */
    size_t nfn;
} muse_chat_render;

/* Muse Glimmer's ids: 200000, 200001, 200007, 200008, 200022, 200023. */
void muse_chat_ids_default(muse_chat_ids *ids);
/* Reads the six control ids from the tokenizer; fails naming a missing token. */
int muse_chat_ids_from_tokenizer(const muse_tokenizer *t, muse_chat_ids *ids, muse_err *e);

/* Renders messages (+ tools, may be NULL) with reasoning_effort "low" | "medium" | "high"
 * (NULL: high) and appends the generation prompt <|start|>assistant. On bad input fails with
 * a message naming the JSON path (e.g. messages[2].role) and the fix; *out is then empty. */
int muse_chat_render_messages(const cJSON *messages, const cJSON *tools,
                              const char *reasoning_effort, const muse_chat_ids *ids,
                              muse_chat_render *out, muse_err *e);
void muse_chat_render_free(muse_chat_render *r);

/* Tokenizes a text piece with special parsing OFF, appending to *ids (realloc'd). */
typedef int (*muse_chat_tokenize_fn)(void *ctx, const char *text, size_t len, int32_t **ids,
                                     size_t *n, size_t *cap, muse_err *e);
/* Flattens the rendering to token ids: text segments through fn, specials by id.
 * *ids is malloc'd (free it). */
int muse_chat_render_flatten(const muse_chat_render *r, muse_chat_tokenize_fn fn, void *ctx,
                             int32_t **ids, size_t *n, muse_err *e);
/* The same with the real tokenizer (muse_tokenize). */
int muse_chat_render_tokens(const muse_chat_render *r, const muse_tokenizer *t, int32_t **ids,
                            size_t *n, muse_err *e);

/* For goldens: the rendering as text with specials written as "<|start|>" etc. malloc'd,
 * NUL-terminated; *len (may be NULL) gets its length. */
char *muse_chat_render_text(const muse_chat_render *r, size_t *len);

#endif
