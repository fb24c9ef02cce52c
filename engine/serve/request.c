/* Parses and checks the module's request body again (the module is not trusted): sampling
 * fields, stop strings, the prompt rendered to token ids; integer fields read from their own
 * text, exactly (a double cannot hold every seed). */
#include "serve/request.h"

#include <ctype.h>
#include <math.h>

#include "abi/muse_limits.h"
#include "abi/muse_ring.h"
#include "base/sha256.h"

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

/* A value's text in the body: the members of a JSON text and the children cJSON parsed from it
 * come in the same order, so a node's text is found by walking both together. */
typedef struct {
    const char *p;
    size_t n;
} text_span;

/* What cJSON skips as whitespace (any byte <= 32), so the walk agrees with its parse. */
static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (unsigned char)*p <= 32) p++;
    return p;
}

/* The end of the value starting at p (never past end). */
static const char *skip_value(const char *p, const char *end)
{
    size_t depth = 0;
    do {
        if (p >= end) return end;
        if (*p == '"') {
            for (p++; p < end && *p != '"'; p++)
                if (*p == '\\' && p + 1 < end) p++; /* the escaped byte, maybe a quote */
            p += p < end;
        } else if (*p == '{' || *p == '[') {
            depth++;
            p++;
        } else if (*p == '}' || *p == ']') {
            if (depth == 0) return p;
            depth--;
            p++;
        } else if (depth > 0) {
            p++;
        } else {
            while (p < end && *p != ',' && *p != '}' && *p != ']' && (unsigned char)*p > 32) p++;
        }
    } while (depth > 0);
    return p;
}

typedef struct {
    const char *p, *end;
    bool object;
} text_iter;

static void iter_init(text_iter *it, text_span s)
{
    it->p = s.n ? s.p + 1 : s.p;
    it->end = s.p + s.n;
    it->object = s.n && s.p[0] == '{';
}

/* The next element's (or member value's) text; false when the container ends. */
static bool iter_next(text_iter *it, text_span *out)
{
    const char *p = skip_ws(it->p, it->end);
    if (p < it->end && *p == ',') p = skip_ws(p + 1, it->end);
    if (p >= it->end || *p == '}' || *p == ']') return false;
    if (it->object) {
        p = skip_ws(skip_value(p, it->end), it->end); /* the key */
        if (p < it->end && *p == ':') p = skip_ws(p + 1, it->end);
    }
    out->p = p;
    it->p = skip_value(p, it->end);
    out->n = (size_t)(it->p - p);
    return true;
}

/* The exact value of a number's text (RFC 8259 grammar) when it is an integer: true with *neg
 * and *mag (|value| <= 2^64 - 1); false when it is not a number, not an integer, or larger.
 * 2e3, 20.0 and -0 are the integers 2000, 20 and 0. */
static bool text_int(text_span s, bool *neg, uint64_t *mag)
{
    *neg = false;
    *mag = 0;
    if (!s.p) return false; /* the field's text was not found */
    const char *p = s.p, *end = s.p + s.n, *ip, *fp = NULL;
    size_t ni, nf = 0, nd, i, k;
    int64_t exp = 0, e;
    uint64_t v = 0;
    bool eneg = false;
#define DIGIT(j) ((j) < ni ? ip[j] : fp[(j)-ni])
    if (p < end && *p == '-') {
        *neg = true;
        p++;
    }
    for (ip = p; p < end && *p >= '0' && *p <= '9'; p++) {
    }
    ni = (size_t)(p - ip);
    if (ni == 0 || (ip[0] == '0' && ni > 1)) return false;
    if (p < end && *p == '.') {
        for (fp = ++p; p < end && *p >= '0' && *p <= '9'; p++) {
        }
        nf = (size_t)(p - fp);
        if (nf == 0) return false;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        for (k = 0; p < end && *p >= '0' && *p <= '9'; p++, k++)
            exp = exp < 1000000000 ? exp * 10 + (*p - '0') : exp; /* saturates: enough */
        if (k == 0) return false;
        if (eneg) exp = -exp;
    }
    if (p != end) return false;
    /* value = D * 10^e, D the integer digits then the fraction digits */
    nd = ni + nf;
    e = exp - (int64_t)nf;
    while (nd > 0 && DIGIT(nd - 1) == '0') { /* trailing zeros move into the exponent */
        nd--;
        e++;
    }
    if (nd == 0) {
        *neg = false; /* every digit zero: 0, -0 too */
        return true;
    }
    if (e < 0) return false; /* a non-zero digit after the decimal point */
    for (i = 0; DIGIT(i) == '0'; i++) {
    }
    if ((int64_t)(nd - i) + e > 20) return false;
    for (; i < nd; i++) {
        unsigned c = (unsigned)(DIGIT(i) - '0');
        if (v > (UINT64_MAX - c) / 10) return false;
        v = v * 10 + c;
    }
    for (; e > 0; e--) {
        if (v > UINT64_MAX / 10) return false;
        v *= 10;
    }
#undef DIGIT
    *mag = v;
    return true;
}

/* The top-level fields whose integers are read from their text. */
enum { F_TOP_K, F_SEED, F_MAX_TOKENS, F_MAX_COMPLETION_TOKENS, F_PROMPT, F_COUNT };
static const char *const span_names[F_COUNT] = {"top_k", "seed", "max_tokens",
                                                "max_completion_tokens", "prompt"};

static void field_spans(const cJSON *root, const char *body, size_t len, text_span *sp)
{
    memset(sp, 0, F_COUNT * sizeof *sp);
    const char *p = skip_ws(body, body + len);
    text_iter it;
    iter_init(&it, (text_span){p, (size_t)(body + len - p)});
    text_span s;
    for (const cJSON *c = root->child; c && iter_next(&it, &s); c = c->next)
        for (int i = 0; i < F_COUNT; i++)
            if (c->string && strcmp(c->string, span_names[i]) == 0) sp[i] = s;
}

static const text_span *field_span(const char *name, const text_span *sp)
{
    for (int i = 0; i < F_COUNT; i++)
        if (strcmp(name, span_names[i]) == 0) return &sp[i];
    return NULL;
}

/* An integer field in [lo, hi] (0 <= lo), read from its text; absent or null -> def. */
static int integer(const cJSON *root, const text_span *sp, const char *name, uint64_t lo,
                   uint64_t hi, int64_t def, int64_t *out, muse_api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    const text_span *s = field_span(name, sp);
    bool neg;
    uint64_t mag;
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !s || !text_int(*s, &neg, &mag) || (neg && mag) || mag < lo ||
        mag > hi) {
        char msg[128];
        snprintf(msg, sizeof msg, "'%%s' must be an integer in [%llu, %llu]",
                 (unsigned long long)lo, (unsigned long long)hi);
        return bad(err, name, msg, name);
    }
    *out = (int64_t)mag;
    return 0;
}

/* The seed: an integer in [-2^63, 2^64 - 1]; a negative s is the seed 2^64 + s. */
static int seed_field(const cJSON *root, const text_span *sp, bool *given, uint64_t *seed,
                      muse_api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "seed");
    bool neg;
    uint64_t mag;
    *given = v && !cJSON_IsNull(v);
    if (!*given) return 0;
    if (!cJSON_IsNumber(v) || !text_int(sp[F_SEED], &neg, &mag) || (neg && mag > (1ull << 63)))
        return bad(err, "seed",
                   "'%s' must be an integer from -9223372036854775808 to 18446744073709551615 (a "
                   "negative seed s is the seed 2^64 + s)",
                   "seed");
    *seed = neg ? 0 - mag : mag;
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

static int render_completion(const muse_request_env *env, const cJSON *root, const text_span *sp,
                             muse_gen_request *r, muse_api_error *err)
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
        text_iter ti;
        iter_init(&ti, sp[F_PROMPT]);
        cJSON_ArrayForEach(it, p)
        {
            text_span s = {0};
            bool neg;
            uint64_t id;
            if (!cJSON_IsNumber(it) || !iter_next(&ti, &s) || !text_int(s, &neg, &id) ||
                (neg && id) || id >= (uint64_t)vocab)
                return bad(err, "prompt", "'%s' token ids must be integers in the vocabulary",
                           "prompt");
            r->prompt[i++] = (int32_t)id;
        }
        r->n_prompt = n;
    } else {
        return bad(err, "prompt", "'%s' must be a non-empty string or array of token ids",
                   "prompt");
    }
    if (r->n_prompt == 0) return bad(err, "prompt", "'%s' is empty after tokenization", "prompt");
    return 0;
}

static int sampling(const muse_request_env *env, const cJSON *root, const text_span *sp,
                    muse_gen_request *r, muse_api_error *err)
{
    const muse_config *c = env->cfg;
    double t, p, mp;
    int64_t k;
    uint64_t seed = env->default_seed;
    double dt = c && c->gen_temperature >= 0 ? c->gen_temperature : 1.0;
    double dp = c && c->gen_top_p > 0 ? c->gen_top_p : 1.0;
    int64_t dk = c && c->gen_top_k >= 0 ? (int64_t)c->gen_top_k : 0;
    if (number(root, "temperature", 0, 2, dt, &t, err) ||
        number(root, "top_p", 0, 1, dp, &p, err) ||
        integer(root, sp, "top_k", 0, MUSE_LIMIT_TOP_K_MAX, dk, &k, err) ||
        number(root, "min_p", 0, 1, 0, &mp, err) ||
        seed_field(root, sp, &r->seed_given, &seed, err))
        return -1;
    if (p <= 0) return bad(err, "top_p", "'%s' must be in (0, 1]", "top_p");
    r->sampling = (muse_sampling){(float)t, (int)k, (float)p, (float)mp, seed};
    return 0;
}

/* A keyword or path from the schema goes into the message only when it is plain (letters,
 * digits, $ _ - . / ~, short): user bytes are otherwise not echoed. */
static const char *plain(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 120) return "(not shown)";
    for (const char *p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || strchr("$_-./~", *p))) return "(not shown)";
    return s;
}

/* response_format: text (no constraint), json_object, json_schema {name, schema, strict}. */
static int response_format(const muse_request_env *env, const cJSON *root, muse_gen_request *r,
                           muse_api_error *err)
{
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!rf || cJSON_IsNull(rf)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return bad(err, "response_format", "'%s' must be an object with a type", "response_format");
    int kind;
    char *text = NULL;
    if (strcmp(type->valuestring, "text") == 0) return 0;
    if (strcmp(type->valuestring, "json_object") == 0) {
        kind = MUSE_GRAMMAR_JSON_OBJECT;
    } else if (strcmp(type->valuestring, "json_schema") == 0) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
        if (!cJSON_IsObject(js))
            return bad(err, "response_format.json_schema", "'%s' must be an object",
                       "response_format.json_schema");
        if (name && !cJSON_IsString(name))
            return bad(err, "response_format.json_schema.name", "'%s' must be a string",
                       "response_format.json_schema.name");
        if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
            return bad(err, "response_format.json_schema.strict", "'%s' must be a boolean",
                       "response_format.json_schema.strict");
        if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
            return bad(err, "response_format.json_schema.schema",
                       "'%s' must be a JSON Schema object", "response_format.json_schema.schema");
        kind = MUSE_GRAMMAR_JSON_SCHEMA;
        text = cJSON_PrintUnformatted(schema);
        if (!text) return bad(err, "response_format", "%s: out of memory", "response_format");
    } else {
        return bad(err, "response_format.type", "'%s' must be text, json_object or json_schema",
                   "response_format.type");
    }
    const muse_gvocab *v = env->gvocab ? env->gvocab(env->gvocab_ctx) : NULL;
    if (!v || !env->masks) {
        free(text);
        return bad(err, "response_format",
                   "'%s' needs a backend whose sampler applies token masks; this engine's does "
                   "not (run --backend cpu or cuda)",
                   "response_format");
    }
    muse_gerr ge;
    int rc = muse_grammar_get(kind, text, text ? strlen(text) : 0, v, &r->grammar, &ge);
    if (rc == 0) {
        muse_sha256 h;
        muse_sha256_init(&h);
        uint8_t k = (uint8_t)kind;
        muse_sha256_update(&h, &k, 1);
        if (text) muse_sha256_update(&h, text, strlen(text));
        muse_sha256_final(&h, r->grammar_sha);
    }
    free(text);
    if (rc) {
        err->status = 400;
        err->type = "invalid_request_error";
        err->code = "invalid_schema";
        snprintf(err->param, sizeof err->param, "response_format.json_schema.schema");
        snprintf(err->message, sizeof err->message,
                 "response_format.json_schema.schema: keyword '%s' at '%s': %s", plain(ge.keyword),
                 plain(ge.path), ge.msg);
        return -1;
    }
    return 0;
}

static void add_rcpt(muse_gen_request *r, const char *name, muse_grammar *body)
{
    char **names = realloc(r->rcpt_names, (r->n_rcpt + 1) * sizeof *names);
    MUSE_CHECK(names != NULL);
    r->rcpt_names = names;
    muse_grammar **bodies = realloc(r->rcpt_bodies, (r->n_rcpt + 1) * sizeof *bodies);
    MUSE_CHECK(bodies != NULL);
    r->rcpt_bodies = bodies;
    r->rcpt_names[r->n_rcpt] = strdup(name);
    MUSE_CHECK(r->rcpt_names[r->n_rcpt] != NULL);
    r->rcpt_bodies[r->n_rcpt++] = body;
}

/* Chat under a constraint: response_format holds the to=user answer; tool_choice "required"
 * or a named function holds the call's ATEM body to the function's parameters (the answer
 * then goes to a function); with response_format and tool_choice auto, tool calls stay free. */
static int chat_constraint(const muse_request_env *env, const cJSON *root, muse_gen_request *r,
                           muse_api_error *err)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const char *named = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(choice, "function"), "name"));
    bool required = cJSON_IsString(choice) && strcmp(choice->valuestring, "required") == 0;
    if (!cJSON_IsArray(tools) ||
        (cJSON_IsString(choice) && strcmp(choice->valuestring, "none") == 0))
        tools = NULL;
    if (!cJSON_IsObject(choice)) named = NULL;
    if (!r->grammar && !((required || named) && tools)) return 0; /* free, as without */
    const muse_gvocab *v = env->gvocab ? env->gvocab(env->gvocab_ctx) : NULL;
    if (!v || !env->masks)
        return bad(err, r->grammar ? "response_format" : "tool_choice",
                   "'%s' needs a backend whose sampler applies token masks; this engine's does "
                   "not (run --backend cpu until the CUDA sampler takes them)",
                   r->grammar ? "response_format" : "tool_choice");
    muse_sha256 h;
    muse_sha256_init(&h);
    muse_sha256_update(&h, "frame", 6);
    if (r->grammar && !required && !named) {
        add_rcpt(r, "user", r->grammar);
        muse_sha256_update(&h, "user", 5);
        muse_sha256_update(&h, r->grammar_sha, 32);
    }
    int i = -1;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        i++;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
        if (!name || (named && strcmp(name, named) != 0)) continue;
        muse_sha256_update(&h, name, strlen(name) + 1);
        if (!required && !named) { /* auto beside response_format: the call is free */
            add_rcpt(r, name, NULL);
            muse_sha256_update(&h, "free", 5);
            continue;
        }
        cJSON *spec = cJSON_CreateObject();
        cJSON_AddStringToObject(spec, "name", name);
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        cJSON_AddItemToObject(spec, "parameters",
                              params ? cJSON_Duplicate(params, 1) : cJSON_CreateObject());
        char *text = cJSON_PrintUnformatted(spec);
        cJSON_Delete(spec);
        if (!text) return bad(err, "tools", "%s: out of memory", "tools");
        muse_grammar *g = NULL;
        muse_gerr ge;
        if (muse_grammar_get(MUSE_GRAMMAR_ATEM, text, strlen(text), v, &g, &ge)) {
            free(text);
            err->status = 400;
            err->type = "invalid_request_error";
            err->code = "invalid_schema";
            snprintf(err->param, sizeof err->param, "tools[%d].function.parameters", i);
            snprintf(err->message, sizeof err->message, "%s: keyword '%s' at '%s': %s", err->param,
                     plain(ge.keyword), plain(ge.path), ge.msg);
            return -1;
        }
        uint8_t k = MUSE_GRAMMAR_ATEM;
        muse_sha256_update(&h, &k, 1);
        muse_sha256_update(&h, text, strlen(text) + 1);
        free(text);
        add_rcpt(r, name, g);
    }
    if (r->n_rcpt == 0)
        return bad(err, "tool_choice", "'%s' names no function of tools", "tool_choice");
    muse_sha256_final(&h, r->grammar_sha);
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
    text_span sp[F_COUNT];
    field_spans(root, body, len, sp);
    if (sampling(env, root, sp, r, err) || parse_stops(root, r, err) ||
        response_format(env, root, r, err))
        goto out;
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    r->parallel_tool_calls = !cJSON_IsFalse(ptc);
    if ((kind == MUSE_KIND_CHAT
             ? render_chat(env, root, r, err) || chat_constraint(env, root, r, err)
             : render_completion(env, root, sp, r, err)))
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
    int64_t mt;
    const char *mt_name = cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")
                              ? "max_completion_tokens"
                              : "max_tokens";
    if (integer(root, sp, mt_name, 1, MUSE_LIMIT_MAX_TOKENS, left, &mt, err)) goto out;
    if (mt > left) {
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
    r->max_tokens = mt;
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
    for (size_t i = 0; i < r->n_rcpt; i++) {
        free(r->rcpt_names[i]);
        if (r->rcpt_bodies[i] != r->grammar) muse_grammar_put(r->rcpt_bodies[i]);
    }
    free(r->rcpt_names);
    free(r->rcpt_bodies);
    muse_grammar_put(r->grammar);
    memset(r, 0, sizeof *r);
}
