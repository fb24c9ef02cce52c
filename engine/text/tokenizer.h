/* Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json. */
#ifndef MUSE_TOKENIZER_H
#define MUSE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/muse_common.h"

typedef struct muse_tokenizer muse_tokenizer;

int muse_tokenizer_load(const char *path, muse_tokenizer **out, muse_err *e);
void muse_tokenizer_free(muse_tokenizer *t);

/* Highest id + 1 over the model vocabulary and the added tokens. */
int64_t muse_tokenizer_vocab_size(const muse_tokenizer *t);

/* A loaded tokenizer is read-only: every function below may run on several threads at once
 * (a muse_detok belongs to one stream). */

/* Encodes user text as ordinary text: special-token parsing is OFF, so "<|start|>" in the
 * text becomes plain text tokens. Appends to *ids (realloc'd, *cap its capacity). */
int muse_tokenize(const muse_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                  size_t *cap, muse_err *e);

/* Id of an added/special token by its exact content (e.g. "<|eot|>"), or -1. */
int32_t muse_tokenizer_special_id(const muse_tokenizer *t, const char *content);
/* 1 when id is an added token marked special. */
int muse_tokenizer_is_special(const muse_tokenizer *t, int32_t id);
/* Length in bytes of the longest token (model or added). */
size_t muse_tokenizer_max_token_bytes(const muse_tokenizer *t);

/* The raw bytes a token stands for (byte-level mapping undone), or NULL for an unknown id. */
const uint8_t *muse_tokenizer_token_bytes(const muse_tokenizer *t, int32_t id, size_t *len);
/* The same for reply text: special tokens stand for no text. A muse_token_bytes_fn. */
const uint8_t *muse_tokenizer_text_bytes(void *tokenizer, int32_t id, size_t *len);

/* Streaming decode: whole UTF-8 characters only; bytes of an unfinished character are held
 * back until it completes; muse_detok_finish flushes a never-finished tail as U+FFFD. */
typedef struct {
    uint8_t held[4];
    int nheld;
} muse_detok;
/* Appends the decodable bytes of id to out (cap bytes; needs at most token length + 4 + 3 *
 * invalid bytes) and returns how many were written, or -1 for an unknown id. Invalid UTF-8
 * sequences become U+FFFD. */
long muse_detok_push(const muse_tokenizer *t, muse_detok *d, int32_t id, char *out, size_t cap);
long muse_detok_finish(muse_detok *d, char *out, size_t cap);
/* Output capacity muse_detok_push needs for id in the worst case (0 for an unknown id);
 * 3 * (muse_tokenizer_max_token_bytes + 3) covers every id; finish needs 3 bytes. A smaller
 * cap that the output outgrows is a caller bug and aborts (MUSE_CHECK). */
size_t muse_detok_bound(const muse_tokenizer *t, int32_t id);

#endif
