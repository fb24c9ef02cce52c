/* A generation request as the engine runs it: parsed from the module's validated JSON body
 * (validated again here: the other side is not trusted), rendered to prompt token ids. */
#ifndef MUSE_REQUEST_H
#define MUSE_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "text/chat.h"
#include "pack/config.h"
#include "text/sampler.h"
#include "text/tokenizer.h"
#include "grammar/grammar.h"

#include "abi/muse_limits.h"

#define MUSE_MAX_STOPS MUSE_LIMIT_STOPS

typedef struct {
    int kind; /* MUSE_KIND_CHAT or MUSE_KIND_COMPLETIONS (muse_ring.h) */
    bool stream, include_usage;
    int32_t *prompt; /* malloc'd */
    size_t n_prompt;
    muse_sampling sampling;
    bool seed_given;
    int64_t max_tokens; /* resolved: never past the context */
    char *stops[MUSE_MAX_STOPS];
    size_t n_stops;
    char **fn_names; /* chat tools, for the reply parser */
    size_t n_fn;
    bool parallel_tool_calls;
    /* response_format json_object / json_schema: the compiled constraint (a cache reference,
     * muse_grammar_put on free) and the SHA-256 of its kind and canonical text; NULL: free text */
    muse_grammar *grammar;
    uint8_t grammar_sha[32];
    /* chat under a constraint (grammar/frame.h): the messages the answer may go to, "user"
     * and/or functions, each body's grammar (NULL: free; bodies other than grammar are
     * references of their own); grammar_sha then covers them all. n_rcpt 0: no frame */
    char **rcpt_names;
    muse_grammar **rcpt_bodies;
    size_t n_rcpt;
} muse_gen_request;

/* An error for the client: HTTP status, OpenAI type/param/code and a message that never
 * echoes user bytes. */
typedef struct {
    int status;
    const char *type, *code;
    char param[64];
    char message[512];
} muse_api_error;

typedef struct {
    const muse_config *cfg; /* sampling defaults from generation_config.json (may be NULL) */
    const muse_tokenizer *tok;
    const muse_chat_ids *ids;
    int64_t context;       /* positions a stream may hold */
    uint64_t default_seed; /* used when the request gives none */
    /* The vocabulary as bytes for constraints, built on first use (NULL: constraints are
     * refused; masks 0: the backend cannot apply them, refused with the reason). */
    const muse_gvocab *(*gvocab)(void *ctx);
    void *gvocab_ctx;
    int masks;
} muse_request_env;

/* 0 ok; -1 with *err filled (400 with param for bad fields, context_length_exceeded). */
int muse_request_parse(const muse_request_env *env, int kind, uint32_t flags, const char *body,
                       size_t len, muse_gen_request *r, muse_api_error *err);
void muse_request_free(muse_gen_request *r);

#endif
