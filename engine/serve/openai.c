#include "serve/openai.h"

#include "abi/muse_ring.h"

static cJSON *base(const muse_oa_ctx *c, bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    const char *object = c->kind == MUSE_KIND_CHAT
                             ? (chunk ? "chat.completion.chunk" : "chat.completion")
                             : "text_completion";
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->model);
    return o;
}

/* choices[0] with index; for chat a delta (stream) object is added by the caller. */
static cJSON *one_choice(cJSON *o)
{
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    return ch;
}

static cJSON *string_n(const char *s, size_t len)
{
    char *copy = MUSE_MALLOC(len + 1);
    memcpy(copy, s, len);
    copy[len] = 0;
    cJSON *v = cJSON_CreateString(copy);
    free(copy);
    return v;
}

static char *print(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    MUSE_CHECK(s);
    return s;
}

static cJSON *chunk_with_delta(const muse_oa_ctx *c, cJSON **delta)
{
    cJSON *o = base(c, true);
    cJSON *ch = one_choice(o);
    if (c->kind == MUSE_KIND_CHAT) {
        *delta = cJSON_AddObjectToObject(ch, "delta");
    } else {
        *delta = ch;
        cJSON_AddNullToObject(ch, "logprobs");
    }
    return o;
}

char *muse_oa_role_chunk(const muse_oa_ctx *c)
{
    cJSON *delta;
    cJSON *o = chunk_with_delta(c, &delta);
    if (c->kind == MUSE_KIND_CHAT) {
        cJSON_AddStringToObject(delta, "role", "assistant");
        cJSON_AddStringToObject(delta, "content", "");
    } else { /* a text_completion choice has no role: an empty text starts the stream */
        cJSON_AddStringToObject(delta, "text", "");
    }
    cJSON_AddNullToObject(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0),
                          "finish_reason");
    return print(o);
}

char *muse_oa_delta_chunk(const muse_oa_ctx *c, const char *field, const char *text, size_t len)
{
    cJSON *delta;
    cJSON *o = chunk_with_delta(c, &delta);
    cJSON_AddItemToObject(delta, c->kind == MUSE_KIND_CHAT ? field : "text", string_n(text, len));
    cJSON_AddNullToObject(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0),
                          "finish_reason");
    return print(o);
}

cJSON *muse_oa_tool_call(const char *id, const char *name, const char *arguments)
{
    cJSON *call = cJSON_CreateObject();
    cJSON_AddStringToObject(call, "id", id);
    cJSON_AddStringToObject(call, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(call, "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", arguments);
    return call;
}

char *muse_oa_tool_chunk(const muse_oa_ctx *c, int index, const char *id, const char *name,
                         const char *arguments)
{
    cJSON *delta;
    cJSON *o = chunk_with_delta(c, &delta);
    cJSON *calls = cJSON_AddArrayToObject(delta, "tool_calls");
    cJSON *call = muse_oa_tool_call(id, name, arguments);
    cJSON_AddNumberToObject(call, "index", index);
    cJSON_AddItemToArray(calls, call);
    cJSON_AddNullToObject(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0),
                          "finish_reason");
    return print(o);
}

static void add_muse(cJSON *o, const muse_oa_muse *m)
{
    cJSON *mb = cJSON_AddObjectToObject(o, "muse");
    cJSON_AddStringToObject(mb, "token_sha", m->token_sha);
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)m->seed);
    cJSON_AddRawToObject(mb, "seed", seed); /* exact: a double cannot hold every uint64 */
    cJSON_AddNumberToObject(mb, "ttft_ms", m->ttft_ms);
    cJSON_AddNumberToObject(mb, "decode_tokens_per_s", m->decode_tokens_per_s);
}

static void add_usage(cJSON *o, const muse_oa_usage *u)
{
    cJSON *us = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(us, "prompt_tokens", (double)u->prompt_tokens);
    cJSON_AddNumberToObject(us, "completion_tokens", (double)u->completion_tokens);
    cJSON_AddNumberToObject(us, "total_tokens", (double)(u->prompt_tokens + u->completion_tokens));
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(us, "prompt_tokens_details"), "cached_tokens",
                            (double)u->cached_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(us, "completion_tokens_details"),
                            "reasoning_tokens", (double)u->reasoning_tokens);
}

char *muse_oa_finish_chunk(const muse_oa_ctx *c, const char *finish_reason, const muse_oa_muse *m)
{
    cJSON *delta;
    cJSON *o = chunk_with_delta(c, &delta);
    if (c->kind != MUSE_KIND_CHAT) cJSON_AddStringToObject(delta, "text", "");
    cJSON_AddStringToObject(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0),
                            "finish_reason", finish_reason);
    add_muse(o, m);
    return print(o);
}

char *muse_oa_usage_chunk(const muse_oa_ctx *c, const muse_oa_usage *u)
{
    cJSON *o = base(c, true);
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, u);
    return print(o);
}

char *muse_oa_response(const muse_oa_ctx *c, const char *content, size_t content_len,
                       const char *reasoning, size_t reasoning_len, const cJSON *tool_calls,
                       const char *finish_reason, const muse_oa_usage *u, const muse_oa_muse *m)
{
    cJSON *o = base(c, false);
    cJSON *ch = one_choice(o);
    if (c->kind == MUSE_KIND_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (content_len || !tool_calls)
            cJSON_AddItemToObject(msg, "content", string_n(content, content_len));
        else
            cJSON_AddNullToObject(msg, "content");
        if (reasoning_len)
            cJSON_AddItemToObject(msg, "reasoning_content", string_n(reasoning, reasoning_len));
        if (tool_calls) cJSON_AddItemToObject(msg, "tool_calls", cJSON_Duplicate(tool_calls, 1));
    } else {
        cJSON_AddItemToObject(ch, "text", string_n(content, content_len));
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", finish_reason);
    add_usage(o, u);
    add_muse(o, m);
    return print(o);
}

char *muse_oa_error(const muse_api_error *err)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "server_error");
    if (err->param[0])
        cJSON_AddStringToObject(e, "param", err->param);
    else
        cJSON_AddNullToObject(e, "param");
    if (err->code)
        cJSON_AddStringToObject(e, "code", err->code);
    else
        cJSON_AddNullToObject(e, "code");
    return print(o);
}
