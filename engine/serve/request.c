#include "serve/request.h"

#include <math.h>

#include "abi/muse_limits.h"
#include "abi/muse_ring.h"

static int bad(muse_api_error *err, const char *param, const char *fmt, const char *what)
{
    err->status = 400;
    err->type = "invalid_request_error";
    err->code = "invalid_value";
    snprintf(err->param, sizeof err->param, "%s", param);
    snprintf(err->message, sizeof err->message, fmt, what);
    return -1;
}

/* A number field within [lo, hi], absent -> def. */
static int number(const cJSON *root, const char *name, double lo, double hi, double def,
                  double *out, muse_api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi) {
        char msg[128];
        snprintf(msg, sizeof msg, "'%%s' must be a number in [%g, %g]", lo, hi);
        return bad(err, name, msg, name);
    }
    *out = v->valuedouble;
    return 0;
}

static int integer(const cJSON *root, const char *name, double lo, double hi, double def,
                   double *out, muse_api_error *err)
{
    if (number(root, name, lo, hi, def, out, err)) return -1;
    if (*out != floor(*out)) return bad(err, name, "'%s' must be an integer", name);
    return 0;
}

static int parse_stops(const cJSON *root, muse_gen_request *r, muse_api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0] || strlen(v->valuestring) > MUSE_LIMIT_STOP_BYTES)
            return bad(err, "stop",
                       "'%s' must be a non-empty string of at most " MUSE_XSTR(
                           MUSE_LIMIT_STOP_BYTES) " bytes",
                       "stop");
        r->stops[r->n_stops++] = strdup(v->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > MUSE_LIMIT_STOPS)
        return bad(
            err, "stop",
            "'%s' must be a string or an array of up to " MUSE_XSTR(MUSE_LIMIT_STOPS) " strings",
            "stop");
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        if (!cJSON_IsString(it) || !it->valuestring[0] ||
            strlen(it->valuestring) > MUSE_LIMIT_STOP_BYTES)
            return bad(err, "stop",
                       "'%s' entries must be non-empty strings of at most " MUSE_XSTR(
                           MUSE_LIMIT_STOP_BYTES) " bytes",
                       "stop");
        r->stops[r->n_stops++] = strdup(it->valuestring);
    }
    return 0;
}

static int tokenize_cb(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n,
                       size_t *cap, muse_err *e)
{
    return muse_tokenize(ctx, text, len, ids, n, cap, e);
}

static int render_chat(const muse_request_env *env, const cJSON *root, muse_gen_request *r,
                       muse_api_error *err)
{
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0)
        return bad(err, "messages", "'%s' must be a non-empty array", "messages");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (cJSON_IsString(choice) && strcmp(choice->valuestring, "none") == 0) tools = NULL;
    if (tools && cJSON_IsNull(tools)) tools = NULL;
    const char *effort =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort"));
    muse_chat_render render = {0};
    muse_err e = {{0}};
    if (muse_chat_render_messages(messages, tools, effort, env->ids, &render, &e)) {
        /* the renderer names the JSON path first, e.g. "messages[2].role: ..." */
        char param[64];
        size_t n = strcspn(e.msg, ": ");
        snprintf(param, sizeof param, "%.*s", (int)(n < sizeof param ? n : sizeof param - 1),
                 e.msg);
        return bad(err, param, "%.400s", e.msg);
    }
    int rc = muse_chat_render_flatten(&render, tokenize_cb, (void *)env->tok, &r->prompt,
                                      &r->n_prompt, &e);
    if (rc == 0 && render.nfn) {
        r->fn_names = MUSE_CALLOC(render.nfn, sizeof *r->fn_names);
        for (size_t i = 0; i < render.nfn; i++) r->fn_names[i] = strdup(render.fn_names[i]);
        r->n_fn = render.nfn;
    }
    muse_chat_render_free(&render);
    if (rc) return bad(err, "messages", "%.400s", e.msg);
    return 0;
}

static int render_completion(const muse_request_env *env, const cJSON *root, muse_gen_request *r,
                             muse_api_error *err)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    muse_err e = {{0}};
    if (cJSON_IsString(p)) {
        size_t cap = 0;
        if (muse_tokenize(env->tok, p->valuestring, strlen(p->valuestring), &r->prompt,
                          &r->n_prompt, &cap, &e))
            return bad(err, "prompt", "%.400s", e.msg);
    } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0) {
        size_t n = (size_t)cJSON_GetArraySize(p), i = 0;
        r->prompt = MUSE_MALLOC(n * sizeof *r->prompt);
        const cJSON *it;
        int64_t vocab = muse_tokenizer_vocab_size(env->tok);
        cJSON_ArrayForEach(it, p)
        {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (double)vocab ||
                it->valuedouble != floor(it->valuedouble))
                return bad(err, "prompt", "'%s' token ids must be integers in the vocabulary",
                           "prompt");
            r->prompt[i++] = (int32_t)it->valuedouble;
        }
        r->n_prompt = n;
    } else {
        return bad(err, "prompt", "'%s' must be a non-empty string or array of token ids",
                   "prompt");
    }
    if (r->n_prompt == 0) return bad(err, "prompt", "'%s' is empty after tokenization", "prompt");
    return 0;
}

static int sampling(const muse_request_env *env, const cJSON *root, muse_gen_request *r,
                    muse_api_error *err)
{
    const muse_config *c = env->cfg;
    double t, p, k, mp, seed;
    double dt = c && c->gen_temperature >= 0 ? c->gen_temperature : 1.0;
    double dp = c && c->gen_top_p > 0 ? c->gen_top_p : 1.0;
    double dk = c && c->gen_top_k >= 0 ? (double)c->gen_top_k : 0.0;
    if (number(root, "temperature", 0, 2, dt, &t, err) ||
        number(root, "top_p", 0, 1, dp, &p, err) ||
        integer(root, "top_k", 0, MUSE_LIMIT_TOP_K_MAX, dk, &k, err) ||
        number(root, "min_p", 0, 1, 0, &mp, err) ||
        integer(root, "seed", -9.2e18, 9.2e18, -1e300, &seed, err))
        return -1;
    if (p <= 0) return bad(err, "top_p", "'%s' must be in (0, 1]", "top_p");
    r->seed_given = seed != -1e300;
    r->sampling = (muse_sampling){(float)t, (int)k, (float)p, (float)mp,
                                  r->seed_given ? (uint64_t)(int64_t)seed : env->default_seed};
    return 0;
}

int muse_request_parse(const muse_request_env *env, int kind, uint32_t flags, const char *body,
                       size_t len, muse_gen_request *r, muse_api_error *err)
{
    memset(r, 0, sizeof *r);
    memset(err, 0, sizeof *err);
    r->kind = kind;
    r->stream = flags & MUSE_REQ_STREAM;
    r->include_usage = flags & MUSE_REQ_INCLUDE_USAGE;
    cJSON *root = cJSON_ParseWithLength(body, len);
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        bad(err, "", "the request body is not a JSON %s", "object");
        goto out;
    }
    if (sampling(env, root, r, err) || parse_stops(root, r, err)) goto out;
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    r->parallel_tool_calls = !cJSON_IsFalse(ptc);
    if ((kind == MUSE_KIND_CHAT ? render_chat(env, root, r, err)
                                : render_completion(env, root, r, err)))
        goto out;
    int64_t left = env->context - (int64_t)r->n_prompt;
    if (left < 1) {
        err->status = 400;
        err->type = "invalid_request_error";
        err->code = "context_length_exceeded";
        snprintf(err->param, sizeof err->param, "%s",
                 kind == MUSE_KIND_CHAT ? "messages" : "prompt");
        snprintf(err->message, sizeof err->message,
                 "This model's maximum context length is %lld tokens. However, your %s resulted in "
                 "%zu tokens. Please reduce the length of the %s.",
                 (long long)env->context, kind == MUSE_KIND_CHAT ? "messages" : "prompt",
                 r->n_prompt, kind == MUSE_KIND_CHAT ? "messages" : "prompt");
        goto out;
    }
    double mt;
    const char *mt_name = cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")
                              ? "max_completion_tokens"
                              : "max_tokens";
    if (integer(root, mt_name, 1, MUSE_LIMIT_MAX_TOKENS, (double)left, &mt, err)) goto out;
    if ((int64_t)mt > left) {
        err->status = 400;
        err->type = "invalid_request_error";
        err->code = "context_length_exceeded";
        snprintf(err->param, sizeof err->param, "%s", mt_name);
        snprintf(
            err->message, sizeof err->message,
            "This model's maximum context length is %lld tokens. However, you requested %lld "
            "tokens (%zu in the prompt, %lld for the completion). Please reduce the prompt or %s.",
            (long long)env->context, (long long)r->n_prompt + (long long)mt, r->n_prompt,
            (long long)mt, mt_name);
        goto out;
    }
    r->max_tokens = (int64_t)mt;
    rc = 0;
out:
    cJSON_Delete(root);
    if (rc) muse_request_free(r);
    return rc;
}

void muse_request_free(muse_gen_request *r)
{
    free(r->prompt);
    for (size_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
    for (size_t i = 0; i < r->n_fn; i++) free(r->fn_names[i]);
    free(r->fn_names);
    memset(r, 0, sizeof *r);
}
