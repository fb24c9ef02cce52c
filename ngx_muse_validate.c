/*
 * ngx_muse_validate: validates an OpenAI chat or completions request body field by field
 * (API.md) before it reaches the engine. Pure C (libc + cJSON): no nginx types, so the same
 * code runs in nginx, in t/unit/test_validate and under libFuzzer (t/fuzz/fuzz_validate).
 */

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "abi/muse_limits.h"
#include "abi/muse_ring.h"
#include "ngx_muse_validate.h"

/* A param echoed into an error must be a plain field name (it can come from the client). */
static int
ngx_muse_param_safe(const char *p)
{
    size_t  i;

    for (i = 0; p[i]; i++) {
        if (i >= 64 || !(isalnum((unsigned char) p[i]) || strchr("_.[]-", p[i]))) {
            return 0;
        }
    }
    return i > 0;
}

static int
ngx_muse_bad(ngx_muse_verr_t *err, const char *param, const char *message)
{
    err->status = 400;
    err->type = "invalid_request_error";
    err->code = NULL;
    err->message = message;
    err->param[0] = '\0';
    if (param && ngx_muse_param_safe(param)) {
        snprintf(err->param, sizeof(err->param), "%s", param);
    }
    return -1;
}

static int
ngx_muse_bad_at(ngx_muse_verr_t *err, const char *fmt, int i, int j, const char *message)
{
    char  path[NGX_MUSE_V_PARAM_LEN];

    snprintf(path, sizeof(path), fmt, i, j);
    return ngx_muse_bad(err, path, message);
}

static int
ngx_muse_is_int(cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && floor(v->valuedouble) == v->valuedouble
           && v->valuedouble >= lo && v->valuedouble <= hi;
}

static int
ngx_muse_is_num(cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble >= lo
           && v->valuedouble <= hi;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF. */
static int
ngx_muse_utf8_ok(const unsigned char *p, size_t n)
{
    size_t    i = 0, k, len;
    uint32_t  cp, min;

    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
        else { return 0; }
        if (i + len > n) { return 0; }
        for (k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) { return 0; }
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { return 0; }
        i += len;
    }
    return 1;
}

static int
ngx_muse_key_cmp(const void *a, const void *b)
{
    return strcmp(*(char * const *) a, *(char * const *) b);
}

/* Every string valid UTF-8, no duplicate keys (depth: ngx_muse_json_shape bounded it). Names
 * the top-level field. */
static int
ngx_muse_check_tree(cJSON *node, const char *field, int depth, ngx_muse_verr_t *err)
{
    cJSON   *c;
    char   **keys;
    size_t   n = 0, i;
    int      rc = 0;

    if (cJSON_IsString(node) && !ngx_muse_utf8_ok((unsigned char *) node->valuestring,
                                                  strlen(node->valuestring)))
    {
        return ngx_muse_bad(err, field, "string is not valid UTF-8");
    }
    if (!cJSON_IsArray(node) && !cJSON_IsObject(node)) {
        return 0;
    }
    for (c = node->child; c; c = c->next) {
        n++;
        if (c->string && !ngx_muse_utf8_ok((unsigned char *) c->string, strlen(c->string))) {
            return ngx_muse_bad(err, depth ? field : NULL, "object key is not valid UTF-8");
        }
        if (ngx_muse_check_tree(c, depth ? field : c->string, depth + 1, err) != 0) {
            return -1;
        }
    }
    if (!cJSON_IsObject(node) || n < 2) {
        return 0;
    }
    keys = malloc(n * sizeof(char *));
    if (keys == NULL) {
        return ngx_muse_bad(err, field, "out of memory");
    }
    for (i = 0, c = node->child; c; c = c->next) {
        keys[i++] = c->string;
    }
    qsort(keys, n, sizeof(char *), ngx_muse_key_cmp);
    for (i = 1; i < n; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            rc = ngx_muse_bad(err, depth ? field : keys[i], "duplicate key in object");
            break;
        }
    }
    free(keys);
    return rc;
}

static int
ngx_muse_depth(cJSON *node)
{
    int     d = 0, x;
    cJSON  *c;

    for (c = node->child; c; c = c->next) {
        x = ngx_muse_depth(c);
        d = x > d ? x : d;
    }
    return d + 1;
}

static int
ngx_muse_str_in(cJSON *v, const char **set)
{
    if (!cJSON_IsString(v)) {
        return 0;
    }
    for (; *set; set++) {
        if (strcmp(v->valuestring, *set) == 0) {
            return 1;
        }
    }
    return 0;
}


static int
ngx_muse_stop_ok(cJSON *v)
{
    return cJSON_IsString(v) && v->valuestring[0] != '\0'
           && strlen(v->valuestring) <= MUSE_LIMIT_STOP_BYTES;
}

static int
ngx_muse_check_stop(cJSON *v, ngx_muse_verr_t *err)
{
    cJSON  *c;
    int     n = 0;

    if (cJSON_IsString(v)) {
        return ngx_muse_stop_ok(v) ? 0 : ngx_muse_bad(err, "stop", "stop string must be 1.."
                                    MUSE_XSTR(MUSE_LIMIT_STOP_BYTES) " bytes");
    }
    if (!cJSON_IsArray(v)) {
        return ngx_muse_bad(err, "stop", "stop must be a string or an array of strings");
    }
    for (c = v->child; c; c = c->next) {
        if (++n > MUSE_LIMIT_STOPS) {
            return ngx_muse_bad(err, "stop", "at most " MUSE_XSTR(MUSE_LIMIT_STOPS)
                                " stop strings");
        }
        if (!ngx_muse_stop_ok(c)) {
            return ngx_muse_bad(err, "stop", "stop strings must be strings of 1.."
                                MUSE_XSTR(MUSE_LIMIT_STOP_BYTES) " bytes");
        }
    }
    return 0;
}

static int
ngx_muse_check_messages(cJSON *msgs, ngx_muse_verr_t *err)
{
    static const char  *roles[] = { "system", "developer", "user", "assistant", "tool", NULL };
    cJSON              *m, *role, *content, *part, *type;
    int                 i = 0, j;

    if (!cJSON_IsArray(msgs)) {
        return ngx_muse_bad(err, "messages", "messages must be an array");
    }
    if (msgs->child == NULL) {
        return ngx_muse_bad(err, "messages", "messages must not be empty");
    }
    for (m = msgs->child; m; m = m->next, i++) {
        if (i >= MUSE_LIMIT_MESSAGES) {
            return ngx_muse_bad(err, "messages", "at most " MUSE_XSTR(MUSE_LIMIT_MESSAGES)
                                " messages");
        }
        if (!cJSON_IsObject(m)) {
            return ngx_muse_bad_at(err, "messages[%d]", i, 0, "each message must be an object");
        }
        role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!ngx_muse_str_in(role, roles)) {
            return ngx_muse_bad_at(err, "messages[%d].role", i, 0,
                                   "role must be system, developer, user, assistant or tool");
        }
        content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (content == NULL || cJSON_IsNull(content)) {
            if (strcmp(role->valuestring, "assistant") == 0
                && cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))
            {
                continue;
            }
            return ngx_muse_bad_at(err, "messages[%d].content", i, 0, "content is required");
        }
        if (cJSON_IsString(content)) {
            continue;
        }
        if (!cJSON_IsArray(content)) {
            return ngx_muse_bad_at(err, "messages[%d].content", i, 0,
                                   "content must be a string or an array of text parts");
        }
        for (j = 0, part = content->child; part; part = part->next, j++) {
            type = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
            if (!cJSON_IsString(type)) {
                return ngx_muse_bad_at(err, "messages[%d].content[%d]", i, j,
                                       "content parts must be objects with a type");
            }
            if (strcmp(type->valuestring, "text") != 0) {
                return ngx_muse_bad_at(err, "messages[%d].content[%d]", i, j,
                                       "only text content parts are supported (no images "
                                       "or audio)");
            }
            if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(part, "text"))) {
                return ngx_muse_bad_at(err, "messages[%d].content[%d].text", i, j,
                                       "text part needs a string text");
            }
        }
    }
    return 0;
}

static int
ngx_muse_check_tools(cJSON *tools, cJSON *choice, ngx_muse_verr_t *err)
{
    static const char  *modes[] = { "auto", "none", "required", NULL };
    static const char  *function[] = { "function", NULL };
    cJSON              *t, *fn, *name, *params, *cn;
    int                 i = 0, found = 0;

    if (tools) {
        if (!cJSON_IsArray(tools)) {
            return ngx_muse_bad(err, "tools", "tools must be an array");
        }
        for (t = tools->child; t; t = t->next, i++) {
            if (i >= MUSE_LIMIT_TOOLS) {
                return ngx_muse_bad(err, "tools", "at most " MUSE_XSTR(MUSE_LIMIT_TOOLS)
                                    " tools");
            }
            fn = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "function") : NULL;
            if (!cJSON_IsObject(t)
                || !ngx_muse_str_in(cJSON_GetObjectItemCaseSensitive(t, "type"), function)
                || !cJSON_IsObject(fn))
            {
                return ngx_muse_bad_at(err, "tools[%d]", i, 0,
                                       "a tool must be {\\\"type\\\":\\\"function\\\","
                                       "\\\"function\\\":{...}}");
            }
            name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(name) || name->valuestring[0] == '\0'
                || strlen(name->valuestring) > MUSE_LIMIT_TOOL_NAME_BYTES)
            {
                return ngx_muse_bad_at(err, "tools[%d].function.name", i, 0,
                                       "function name must be a string of 1.."
                                       MUSE_XSTR(MUSE_LIMIT_TOOL_NAME_BYTES) " bytes");
            }
            params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            if (params && (!cJSON_IsObject(params)
                           || ngx_muse_depth(params) > MUSE_LIMIT_SCHEMA_DEPTH))
            {
                return ngx_muse_bad_at(err, "tools[%d].function.parameters", i, 0,
                                       "parameters must be a JSON schema object nested at "
                                       "most " MUSE_XSTR(MUSE_LIMIT_SCHEMA_DEPTH) " deep");
            }
        }
    }
    if (choice == NULL || ngx_muse_str_in(choice, modes)) {
        return 0;
    }
    fn = cJSON_IsObject(choice) ? cJSON_GetObjectItemCaseSensitive(choice, "function") : NULL;
    cn = fn ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
    if (!cJSON_IsString(cn)) {
        return ngx_muse_bad(err, "tool_choice",
                            "tool_choice must be auto, none, required or a named function");
    }
    for (t = tools ? tools->child : NULL; t; t = t->next) {
        name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"),
                                                "name");
        found |= cJSON_IsString(name) && strcmp(name->valuestring, cn->valuestring) == 0;
    }
    return found ? 0
                 : ngx_muse_bad(err, "tool_choice", "tool_choice names no function in tools");
}

/* Fields whose meaning the server does not implement: 400 naming them, never a silent 200. */
static int
ngx_muse_check_unsupported(cJSON *root, int kind, ngx_muse_verr_t *err)
{
    static const char  *refused[] = { "logit_bias", "response_format", "top_logprobs",
                                      "functions", "function_call", "audio", "modalities",
                                      "prediction", "web_search_options", NULL };
    const char        **f;
    cJSON              *v;

    for (f = refused; *f; f++) {
        if (cJSON_GetObjectItemCaseSensitive(root, *f)) {
            return ngx_muse_bad(err, *f, "this field is not supported by this server");
        }
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (v && !cJSON_IsFalse(v) && !cJSON_IsNull(v)) {
        return ngx_muse_bad(err, "logprobs", "logprobs is not supported by this server");
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "frequency_penalty");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0)) {
        return ngx_muse_bad(err, "frequency_penalty", "only frequency_penalty 0 is supported");
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "presence_penalty");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0)) {
        return ngx_muse_bad(err, "presence_penalty", "only presence_penalty 0 is supported");
    }
    if (kind == NGX_MUSE_V_COMPLETIONS) {
        v = cJSON_GetObjectItemCaseSensitive(root, "echo");
        if (v && !cJSON_IsFalse(v)) {
            return ngx_muse_bad(err, "echo", "echo is not supported by this server");
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (v && !cJSON_IsNull(v)) {
            return ngx_muse_bad(err, "suffix", "suffix is not supported by this server");
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "best_of");
        if (v && !ngx_muse_is_int(v, 1, 1)) {
            return ngx_muse_bad(err, "best_of", "only best_of 1 is supported");
        }
    }
    return 0;
}

static int
ngx_muse_check_prompt(cJSON *prompt, ngx_muse_verr_t *err)
{
    cJSON  *c;

    if (cJSON_IsString(prompt)) {
        return 0;
    }
    if (!cJSON_IsArray(prompt) || prompt->child == NULL) {
        return ngx_muse_bad(err, "prompt", "prompt must be a string or a non-empty array of "
                                           "token ids");
    }
    for (c = prompt->child; c; c = c->next) {
        if (!ngx_muse_is_int(c, 0, MUSE_LIMIT_TOKEN_ID_MAX)) {
            return ngx_muse_bad(err, "prompt", "token ids must be integers >= 0");
        }
    }
    return 0;
}

/* The request fields of API.md. Sets *flags (MUSE_REQ_*). */
static int
ngx_muse_check_fields(const ngx_muse_vconf_t *vc, cJSON *root, uint32_t *flags,
    ngx_muse_verr_t *err)
{
    static const char  *efforts[] = { "low", "medium", "high", NULL };
    cJSON              *v, *inc;

    if (!cJSON_IsObject(root)) {
        return ngx_muse_bad(err, NULL, "the request body must be a JSON object");
    }
    if (ngx_muse_check_unsupported(root, vc->kind, err) != 0) {
        return -1;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsString(v)) {
        return ngx_muse_bad(err, "model", "model must be a string");
    }
    if (v && (strlen(v->valuestring) != vc->model_id_len
              || memcmp(v->valuestring, vc->model_id, vc->model_id_len) != 0))
    {
        ngx_muse_bad(err, "model", "The model does not exist or you do not have access to it.");
        err->status = 404;
        err->code = "model_not_found";
        return -1;
    }
    if (vc->kind == NGX_MUSE_V_CHAT) {
        if (ngx_muse_check_messages(cJSON_GetObjectItemCaseSensitive(root, "messages"), err)
            != 0)
        {
            return -1;
        }
        if (ngx_muse_check_tools(cJSON_GetObjectItemCaseSensitive(root, "tools"),
                                 cJSON_GetObjectItemCaseSensitive(root, "tool_choice"), err)
            != 0)
        {
            return -1;
        }
    } else if (ngx_muse_check_prompt(cJSON_GetObjectItemCaseSensitive(root, "prompt"), err)
               != 0)
    {
        return -1;
    }
    *flags = 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stream"))) {
        if (!cJSON_IsBool(v)) {
            return ngx_muse_bad(err, "stream", "stream must be a boolean");
        }
        *flags |= cJSON_IsTrue(v) ? MUSE_REQ_STREAM : 0;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stream_options"))) {
        inc = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "include_usage") : NULL;
        if (!cJSON_IsObject(v) || (inc && !cJSON_IsBool(inc))) {
            return ngx_muse_bad(err, "stream_options",
                                "stream_options must be {\\\"include_usage\\\": boolean}");
        }
        *flags |= cJSON_IsTrue(inc) ? MUSE_REQ_INCLUDE_USAGE : 0;
    }
#define NGX_MUSE_RANGE(name, test, msg)                                                     \
    if ((v = cJSON_GetObjectItemCaseSensitive(root, name)) && !(test)) {                     \
        return ngx_muse_bad(err, name, msg);                                                 \
    }
    NGX_MUSE_RANGE("max_tokens", ngx_muse_is_int(v, 1, MUSE_LIMIT_MAX_TOKENS),
                   "max_tokens must be an integer from 1 to "
                   MUSE_XSTR(MUSE_LIMIT_MAX_TOKENS))
    NGX_MUSE_RANGE("max_completion_tokens", ngx_muse_is_int(v, 1, MUSE_LIMIT_MAX_TOKENS),
                   "max_completion_tokens must be an integer from 1 to "
                   MUSE_XSTR(MUSE_LIMIT_MAX_TOKENS))
    NGX_MUSE_RANGE("temperature", ngx_muse_is_num(v, 0, MUSE_LIMIT_TEMPERATURE_MAX),
                   "temperature must be a number from 0 to "
                   MUSE_XSTR(MUSE_LIMIT_TEMPERATURE_MAX))
    NGX_MUSE_RANGE("top_p", ngx_muse_is_num(v, 0, 1) && v->valuedouble > 0,
                   "top_p must be a number in (0, 1]")
    NGX_MUSE_RANGE("top_k", ngx_muse_is_int(v, 0, MUSE_LIMIT_TOP_K_MAX),
                   "top_k must be an integer from 0 (off) to "
                   MUSE_XSTR(MUSE_LIMIT_TOP_K_MAX))
    NGX_MUSE_RANGE("min_p", ngx_muse_is_num(v, 0, 1), "min_p must be a number from 0 to 1")
    NGX_MUSE_RANGE("seed", ngx_muse_is_int(v, -9007199254740992.0, 9007199254740992.0),
                   "seed must be an integer")
    NGX_MUSE_RANGE("n", ngx_muse_is_int(v, 1, 1), "only n = 1 is supported")
    NGX_MUSE_RANGE("parallel_tool_calls", cJSON_IsBool(v),
                   "parallel_tool_calls must be a boolean")
    NGX_MUSE_RANGE("reasoning_effort", ngx_muse_str_in(v, efforts),
                   "reasoning_effort must be low, medium or high")
    NGX_MUSE_RANGE("user", cJSON_IsString(v), "user must be a string")
#undef NGX_MUSE_RANGE
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stop"))) {
        if (ngx_muse_check_stop(v, err) != 0) {
            return -1;
        }
    }
    return 0;
}

/* A JSON escape \u0000 (not itself escaped) would become a NUL that cJSON silently cuts at. */
static int
ngx_muse_has_nul_escape(const unsigned char *p, size_t n)
{
    size_t  i, k;

    for (i = 0; i + 6 <= n; i++) {
        if (p[i] != '\\' || p[i + 1] != 'u' || memcmp(p + i + 2, "0000", 4) != 0) {
            continue;
        }
        for (k = 0; k < i && p[i - 1 - k] == '\\'; k++) { /* count backslashes before */ }
        if (k % 2 == 0) {
            return 1;
        }
    }
    return 0;
}

/* Counts the items (values and object keys) and the nesting of a JSON text without building
 * it, so a body of millions of tiny items or a 100k-deep one is refused before cJSON spends
 * its ~64 bytes an item on it. */
static int
ngx_muse_json_shape(const ngx_muse_vconf_t *vc, const unsigned char *p, size_t len,
    ngx_muse_verr_t *err)
{
    const unsigned char  *end = p + len;
    size_t                items = 0, depth = 0;
    int                   in_string = 0, expect = 1;

    for ( /* void */ ; p < end; p++) {
        if (in_string) {
            if (*p == '\\' && p + 1 < end) {
                p++;    /* the escaped character, maybe a quote */
            } else if (*p == '"') {
                in_string = 0;
            }
            continue;
        }
        if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') {
            continue;
        }
        if (expect && *p != ']' && *p != '}' && ++items > vc->max_json_values) {
            return ngx_muse_bad(err, NULL,
                                "the request has more JSON items (values and keys) than "
                                "muse_max_json_values allows; send less, or raise "
                                "muse_max_json_values");
        }
        expect = 0;
        switch (*p) {
        case '"':
            in_string = 1;
            break;
        case '[':
        case '{':
            if (++depth > MUSE_LIMIT_JSON_NESTING) {
                return ngx_muse_bad(err, NULL, "the request nests JSON deeper than "
                                    MUSE_XSTR(MUSE_LIMIT_JSON_NESTING) " levels");
            }
            expect = 1;
            break;
        case ']':
        case '}':
            depth -= depth > 0;
            break;
        case ',':
        case ':':
            expect = 1;
            break;
        }
    }
    return 0;
}

int
ngx_muse_validate_body(const ngx_muse_vconf_t *vc, const unsigned char *body, size_t len,
    uint32_t *flags, char **out, size_t *out_len, ngx_muse_verr_t *err)
{
    cJSON  *root;
    char   *printed, *copy;
    int     rc;

    *out = NULL;
    *out_len = 0;
    *flags = 0;
    if (len == 0) {
        return ngx_muse_bad(err, NULL, "the request body is empty; send a JSON object");
    }
    if (memchr(body, '\0', len) != NULL || ngx_muse_has_nul_escape(body, len)) {
        return ngx_muse_bad(err, NULL, "NUL characters are not allowed in the request");
    }
    if (ngx_muse_json_shape(vc, body, len, err) != 0) {
        return -1;
    }
    /* cJSON refuses trailing bytes only before a NUL: parse a terminated copy */
    copy = malloc(len + 1);
    if (copy == NULL) {
        return ngx_muse_bad(err, NULL, "out of memory");
    }
    memcpy(copy, body, len);
    copy[len] = '\0';
    root = cJSON_ParseWithOpts(copy, NULL, 1);
    free(copy);
    if (root == NULL) {
        return ngx_muse_bad(err, NULL, "the request body is not valid JSON");
    }
    rc = ngx_muse_check_tree(root, NULL, 0, err);
    if (rc == 0) {
        rc = ngx_muse_check_fields(vc, root, flags, err);
    }
    if (rc == 0) {
        printed = cJSON_PrintUnformatted(root);
        if (printed == NULL) {
            rc = ngx_muse_bad(err, NULL, "out of memory");
        } else {
            *out = printed;
            *out_len = strlen(printed);
        }
    }
    cJSON_Delete(root);
    return rc;
}
