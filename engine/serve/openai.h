/* OpenAI-shaped JSON for one response: stream chunks, the whole non-streaming body, usage,
 * the muse block and errors. Every string is built with cJSON, so it is valid JSON. */
#ifndef MUSE_OPENAI_H
#define MUSE_OPENAI_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "serve/request.h"

typedef struct {
    char id[48];       /* "chatcmpl-..." or "cmpl-..." */
    const char *model; /* served model id */
    int64_t created;   /* unix seconds */
    int kind;          /* MUSE_KIND_CHAT or MUSE_KIND_COMPLETIONS */
} muse_oa_ctx;

typedef struct {
    int64_t prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens;
} muse_oa_usage;

typedef struct {
    char token_sha[65];
    uint64_t seed;
    double ttft_ms, decode_tokens_per_s;
} muse_oa_muse;

/* Stream chunks (malloc'd JSON text). field: "content" or "reasoning_content". */
char *muse_oa_role_chunk(const muse_oa_ctx *c);
char *muse_oa_delta_chunk(const muse_oa_ctx *c, const char *field, const char *text, size_t len);
char *muse_oa_tool_chunk(const muse_oa_ctx *c, int index, const char *id, const char *name,
                         const char *arguments);
char *muse_oa_finish_chunk(const muse_oa_ctx *c, const char *finish_reason, const muse_oa_muse *m);
char *muse_oa_usage_chunk(const muse_oa_ctx *c, const muse_oa_usage *u);

/* The non-streaming body. tool_calls: a cJSON array of OpenAI tool calls or NULL. */
char *muse_oa_response(const muse_oa_ctx *c, const char *content, size_t content_len,
                       const char *reasoning, size_t reasoning_len, const cJSON *tool_calls,
                       const char *finish_reason, const muse_oa_usage *u, const muse_oa_muse *m);
/* One OpenAI tool call object, for building the non-streaming tool_calls array. */
cJSON *muse_oa_tool_call(const char *id, const char *name, const char *arguments);

/* {"error":{"message","type","param","code"}} */
char *muse_oa_error(const muse_api_error *err);

#endif
