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
ngx_muse_is_num(cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble >= lo
           && v->valuedouble <= hi;
}

/* ------------------------------------------------------------------------------------------ */
/* strict JSON (RFC 8259), counted, before cJSON sees a byte                                   */

static int
ngx_muse_syntax(ngx_muse_verr_t *err, const unsigned char *body, const unsigned char *at,
    const unsigned char *end, const char *what)
{
    err->status = 400;
    err->type = "invalid_request_error";
    err->code = "invalid_json";
    err->param[0] = '\0';
    err->offset = (size_t) (at - body);
    if (at >= end) {
        snprintf(err->text, sizeof(err->text), "the request body is not valid JSON: %s at "
                 "byte offset %zu (the end of the body)", what, err->offset);
    } else {
        snprintf(err->text, sizeof(err->text), "the request body is not valid JSON: %s at "
                 "byte offset %zu (0x%02x)", what, err->offset, (unsigned) *at);
    }
    err->message = err->text;
    return -1;
}

static const unsigned char *
ngx_muse_ws(const unsigned char *p, const unsigned char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
        p++;
    }
    return p;
}

static int
ngx_muse_hex4(const unsigned char *p, const unsigned char *end, uint32_t *cp)
{
    int  i, d;

    *cp = 0;
    for (i = 0; i < 4; i++) {
        if (p + i >= end) {
            return -1;
        }
        d = p[i] >= '0' && p[i] <= '9' ? p[i] - '0'
            : p[i] >= 'a' && p[i] <= 'f' ? p[i] - 'a' + 10
            : p[i] >= 'A' && p[i] <= 'F' ? p[i] - 'A' + 10 : -1;
        if (d < 0) {
            return -1;
        }
        *cp = (*cp << 4) | (uint32_t) d;
    }
    return 0;
}

/* A string from its opening quote: *pp moves past the closing one. */
static int
ngx_muse_scan_string(const unsigned char *body, const unsigned char **pp,
    const unsigned char *end, ngx_muse_verr_t *err)
{
    const unsigned char  *p = *pp + 1;
    uint32_t              cp, lo;

    for ( ;; ) {
        if (p >= end) {
            return ngx_muse_syntax(err, body, p, end, "a string is not closed");
        }
        if (*p == '"') {
            *pp = p + 1;
            return 0;
        }
        if (*p == '\n') {
            return ngx_muse_syntax(err, body, p, end, "a raw newline inside a string (write "
                                   "it as \\\\n)");
        }
        if (*p < 0x20) {
            return ngx_muse_syntax(err, body, p, end, "a raw control character inside a "
                                   "string (escape it as \\\\u00XX)");
        }
        if (*p != '\\') {
            p++;
            continue;
        }
        if (p + 1 >= end) {
            return ngx_muse_syntax(err, body, p + 1, end, "a string is not closed");
        }
        switch (p[1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            p += 2;
            continue;
        case 'u':
            break;
        default:
            return ngx_muse_syntax(err, body, p + 1, end, "an invalid escape (JSON has "
                                   "\\\\\\\" \\\\\\\\ \\\\/ \\\\b \\\\f \\\\n \\\\r \\\\t "
                                   "and \\\\uXXXX)");
        }
        if (ngx_muse_hex4(p + 2, end, &cp) != 0) {
            return ngx_muse_syntax(err, body, p + 1, end, "\\\\u needs four hex digits");
        }
        if (cp == 0) {
            ngx_muse_syntax(err, body, p, end, "");
            err->code = NULL;
            snprintf(err->text, sizeof(err->text), "NUL characters are not allowed in the "
                     "request (\\\\u0000 at byte offset %zu)", err->offset);
            return -1;
        }
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return ngx_muse_syntax(err, body, p, end, "a lone low surrogate escape (it must "
                                   "follow a high one)");
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (p + 7 >= end || p[6] != '\\' || p[7] != 'u'
                || ngx_muse_hex4(p + 8, end, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
            {
                return ngx_muse_syntax(err, body, p, end, "a lone high surrogate escape (a "
                                       "low one \\\\uDC00..\\\\uDFFF must follow)");
            }
            p += 6;
        }
        p += 6;
    }
}

/* A number from its first byte (a minus or a digit): *pp moves past it. */
static int
ngx_muse_scan_number(const unsigned char *body, const unsigned char **pp,
    const unsigned char *end, ngx_muse_verr_t *err)
{
    const unsigned char  *p = *pp;

    if (*p == '-') {
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') {
        return ngx_muse_syntax(err, body, p, end, "a digit must follow the minus sign");
    }
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') {
            return ngx_muse_syntax(err, body, p, end, "a number has a leading zero");
        }
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') {
            return ngx_muse_syntax(err, body, p, end, "a digit must follow the decimal point");
        }
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            p++;
        }
        if (p >= end || *p < '0' || *p > '9') {
            return ngx_muse_syntax(err, body, p, end, "a digit must follow the exponent");
        }
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
    }
    *pp = p;
    return 0;
}

/* One pass, no recursion: a stack of the open containers (at most the nesting limit), the
 * items counted as they start, so a body of millions of tiny items or a 100k-deep one is
 * refused before cJSON spends its ~64 bytes an item on it. */
int
ngx_muse_json_check(const unsigned char *body, size_t len, size_t max_values,
    ngx_muse_verr_t *err)
{
    const unsigned char  *p = body, *end = body + len;
    unsigned char         open[MUSE_LIMIT_JSON_NESTING];
    size_t                depth = 0, items = 0;

    err->offset = (size_t) -1;
    p = ngx_muse_ws(p, end);

value:
    if (p >= end) {
        return ngx_muse_syntax(err, body, p, end, "a value is missing");
    }
    if (++items > max_values) {
        return ngx_muse_bad(err, NULL, "the request has more JSON items (values and keys) "
                            "than muse_max_json_values allows; send less, or raise "
                            "muse_max_json_values");
    }
    switch (*p) {
    case '{':
    case '[':
        if (depth >= MUSE_LIMIT_JSON_NESTING) {
            return ngx_muse_bad(err, NULL, "the request nests JSON deeper than "
                                MUSE_XSTR(MUSE_LIMIT_JSON_NESTING) " levels");
        }
        open[depth++] = *p;
        p = ngx_muse_ws(p + 1, end);
        if (p < end && *p == (open[depth - 1] == '{' ? '}' : ']')) {
            depth--;
            p++;
            goto next;
        }
        if (open[depth - 1] == '{') {
            goto key;
        }
        goto value;
    case '"':
        if (ngx_muse_scan_string(body, &p, end, err) != 0) {
            return -1;
        }
        goto next;
    case 't':
    case 'f':
    case 'n':
        {
            const char  *lit = *p == 't' ? "true" : *p == 'f' ? "false" : "null";
            size_t       n = strlen(lit);

            if ((size_t) (end - p) < n || memcmp(p, lit, n) != 0) {
                return ngx_muse_syntax(err, body, p, end, "not a value (true, false and "
                                       "null are lowercase and whole)");
            }
            p += n;
        }
        goto next;
    default:
        if (*p == '-' || (*p >= '0' && *p <= '9')) {
            if (ngx_muse_scan_number(body, &p, end, err) != 0) {
                return -1;
            }
            goto next;
        }
        return ngx_muse_syntax(err, body, p, end, *p == '+' || *p == '.'
                               ? "a number must start with a digit or a minus sign"
                               : "not a value");
    }

key:
    if (p >= end || *p != '"') {
        return ngx_muse_syntax(err, body, p, end, p < end && *p == '}'
                               ? "a trailing comma before }" : "an object key (a string) "
                               "is missing");
    }
    if (++items > max_values) {
        return ngx_muse_bad(err, NULL, "the request has more JSON items (values and keys) "
                            "than muse_max_json_values allows; send less, or raise "
                            "muse_max_json_values");
    }
    if (ngx_muse_scan_string(body, &p, end, err) != 0) {
        return -1;
    }
    p = ngx_muse_ws(p, end);
    if (p >= end || *p != ':') {
        return ngx_muse_syntax(err, body, p, end, "a colon must follow an object key");
    }
    p = ngx_muse_ws(p + 1, end);
    goto value;

next:
    p = ngx_muse_ws(p, end);
    if (depth == 0) {
        return p == end ? 0 : ngx_muse_syntax(err, body, p, end, "bytes after the JSON value");
    }
    if (p < end && *p == ',') {
        p = ngx_muse_ws(p + 1, end);
        if (open[depth - 1] == '{') {
            goto key;
        }
        if (p < end && *p == ']') {
            return ngx_muse_syntax(err, body, p, end, "a trailing comma before ]");
        }
        goto value;
    }
    if (p < end && *p == (open[depth - 1] == '{' ? '}' : ']')) {
        depth--;
        p++;
        goto next;
    }
    return ngx_muse_syntax(err, body, p, end, open[depth - 1] == '{'
                           ? "a comma or } must follow an object member"
                           : "a comma or ] must follow an array element");
}

/* ------------------------------------------------------------------------------------------ */
/* integers read from their own text, never through a double                                   */

typedef struct {
    const unsigned char  *p;
    size_t                n;
} ngx_muse_span_t;

/* The top-level fields whose integers the checks read from the text. */
enum {
    NGX_MUSE_F_MAX_TOKENS,
    NGX_MUSE_F_MAX_COMPLETION_TOKENS,
    NGX_MUSE_F_TOP_K,
    NGX_MUSE_F_SEED,
    NGX_MUSE_F_N,
    NGX_MUSE_F_BEST_OF,
    NGX_MUSE_F_PROMPT,
    NGX_MUSE_F_COUNT
};

static const char  *ngx_muse_span_fields[NGX_MUSE_F_COUNT] = {
    "max_tokens", "max_completion_tokens", "top_k", "seed", "n", "best_of", "prompt"
};

/* The exact value of a number's text (RFC 8259 grammar) when it is an integer: 1 with *neg and
 * *mag (|value| <= 2^64 - 1); 0 when it is not a number, not an integer, or larger. 2e3, 20.0
 * and -0 are the integers 2000, 20 and 0. */
static int
ngx_muse_text_int(const unsigned char *p, size_t n, int *neg, uint64_t *mag)
{
    const unsigned char  *end = p + n, *ip, *fp = NULL;
    size_t                ni, nf = 0, nd, i, k;
    int64_t               exp = 0, e;
    uint64_t              v = 0;
    int                   eneg = 0, c;

#define NGX_MUSE_DIGIT(j)  ((j) < ni ? ip[j] : fp[(j) - ni])

    *neg = 0;
    *mag = 0;
    if (p < end && *p == '-') {
        *neg = 1;
        p++;
    }
    for (ip = p; p < end && *p >= '0' && *p <= '9'; p++) { /* void */ }
    ni = (size_t) (p - ip);
    if (ni == 0 || (ip[0] == '0' && ni > 1)) {
        return 0;
    }
    if (p < end && *p == '.') {
        for (fp = ++p; p < end && *p >= '0' && *p <= '9'; p++) { /* void */ }
        nf = (size_t) (p - fp);
        if (nf == 0) {
            return 0;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            eneg = *p++ == '-';
        }
        for (k = 0; p < end && *p >= '0' && *p <= '9'; p++, k++) {
            exp = exp < 1000000000 ? exp * 10 + (*p - '0') : exp;   /* saturates, enough */
        }
        if (k == 0) {
            return 0;
        }
        exp = eneg ? -exp : exp;
    }
    if (p != end) {
        return 0;
    }
    /* value = D * 10^e, D the integer digits then the fraction digits */
    nd = ni + nf;
    e = exp - (int64_t) nf;
    while (nd > 0 && NGX_MUSE_DIGIT(nd - 1) == '0') {
        nd--;                       /* trailing zeros move into the exponent */
        e++;
    }
    if (nd == 0) {
        *neg = 0;                   /* every digit zero: 0 (-0 too) */
        return 1;
    }
    if (e < 0) {
        return 0;                   /* a non-zero digit after the decimal point */
    }
    for (i = 0; NGX_MUSE_DIGIT(i) == '0'; i++) { /* leading zeros, as in 0.5e1 */ }
    if ((int64_t) (nd - i) + e > 20) {
        return 0;
    }
    for ( /* void */ ; i < nd; i++) {
        c = NGX_MUSE_DIGIT(i) - '0';
        if (v > (UINT64_MAX - (uint64_t) c) / 10) {
            return 0;
        }
        v = v * 10 + (uint64_t) c;
    }
    for ( /* void */ ; e > 0; e--) {
        if (v > UINT64_MAX / 10) {
            return 0;
        }
        v *= 10;
    }
#undef NGX_MUSE_DIGIT
    *mag = v;
    return 1;
}

/* Whether a number node holds an integer in [lo, hi] (lo >= 0), read from its text. */
static int
ngx_muse_int_in(cJSON *v, const ngx_muse_span_t *s, uint64_t lo, uint64_t hi)
{
    int       neg;
    uint64_t  mag;

    return cJSON_IsNumber(v) && s->p != NULL && ngx_muse_text_int(s->p, s->n, &neg, &mag)
           && !neg && mag >= lo && mag <= hi;
}

/* The seed: an integer in [-2^63, 2^64 - 1]; a negative s is the seed 2^64 + s. */
static int
ngx_muse_seed_ok(cJSON *v, const ngx_muse_span_t *s)
{
    int       neg;
    uint64_t  mag;

    return cJSON_IsNumber(v) && s->p != NULL && ngx_muse_text_int(s->p, s->n, &neg, &mag)
           && (!neg || mag <= (uint64_t) 1 << 63);
}

/* The end of the value starting at p in a text ngx_muse_json_check passed. */
static const unsigned char *
ngx_muse_skip_value(const unsigned char *p, const unsigned char *end)
{
    size_t  depth = 0;

    do {
        if (p >= end) {
            return end;
        }
        if (*p == '"') {
            for (p++; p < end && *p != '"'; p++) {
                if (*p == '\\' && p + 1 < end) {
                    p++;        /* the escaped byte, maybe a quote */
                }
            }
            p += p < end;
        } else if (*p == '{' || *p == '[') {
            depth++;
            p++;
        } else if (*p == '}' || *p == ']') {
            if (depth == 0) {
                return p;
            }
            depth--;
            p++;
        } else if (depth > 0) {
            p++;
        } else {
            while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\t'
                   && *p != '\n' && *p != '\r')
            {
                p++;
            }
        }
    } while (depth > 0);
    return p;
}

/* The next element's (or member's value's) text in a container from a checked text. 1: *s
 * holds it; 0: the container ended. it->p starts just after the opening bracket. */
typedef struct {
    const unsigned char  *p, *end;
    int                   object;
} ngx_muse_iter_t;

static int
ngx_muse_iter_next(ngx_muse_iter_t *it, ngx_muse_span_t *s)
{
    const unsigned char  *p = ngx_muse_ws(it->p, it->end);

    if (p < it->end && *p == ',') {
        p = ngx_muse_ws(p + 1, it->end);
    }
    if (p >= it->end || *p == '}' || *p == ']') {
        return 0;
    }
    if (it->object) {
        p = ngx_muse_skip_value(p, it->end);    /* the key */
        p = ngx_muse_ws(p, it->end);
        p = ngx_muse_ws(p + (p < it->end), it->end);    /* the colon */
    }
    s->p = p;
    it->p = ngx_muse_skip_value(p, it->end);
    s->n = (size_t) (it->p - p);
    return 1;
}

/* The container's iterator, from its value text. */
static void
ngx_muse_iter_init(ngx_muse_iter_t *it, const ngx_muse_span_t *s)
{
    it->p = s->n > 0 ? s->p + 1 : s->p;
    it->end = s->p + s->n;
    it->object = s->n > 0 && s->p[0] == '{';
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

/* response_format: its shape here; the schema's keywords are compiled (and refused with the
 * keyword and its path) by the engine. */
static int
ngx_muse_check_response_format(cJSON *rf, ngx_muse_verr_t *err)
{
    static const char  *types[] = { "text", "json_object", "json_schema", NULL };
    cJSON              *type, *js, *schema, *name, *strict;

    if (rf == NULL || cJSON_IsNull(rf)) {
        return 0;
    }
    type = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (!ngx_muse_str_in(type, types)) {
        return ngx_muse_bad(err, "response_format.type",
                            "response_format.type must be text, json_object or json_schema");
    }
    if (strcmp(type->valuestring, "json_schema") != 0) {
        return 0;
    }
    js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    schema = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
    name = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "name") : NULL;
    strict = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "strict") : NULL;
    if (!cJSON_IsObject(js)) {
        return ngx_muse_bad(err, "response_format.json_schema",
                            "response_format.json_schema must be an object with a schema");
    }
    if (name && !cJSON_IsString(name)) {
        return ngx_muse_bad(err, "response_format.json_schema.name",
                            "response_format.json_schema.name must be a string");
    }
    if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict)) {
        return ngx_muse_bad(err, "response_format.json_schema.strict",
                            "response_format.json_schema.strict must be a boolean");
    }
    if (!(cJSON_IsObject(schema) || cJSON_IsBool(schema))
        || ngx_muse_depth(schema) > MUSE_LIMIT_SCHEMA_DEPTH)
    {
        return ngx_muse_bad(err, "response_format.json_schema.schema",
                            "response_format.json_schema.schema must be a JSON schema nested at "
                            "most " MUSE_XSTR(MUSE_LIMIT_SCHEMA_DEPTH) " deep");
    }
    return 0;
}

/* Fields whose meaning the server does not implement: 400 naming them, never a silent 200. */
static int
ngx_muse_check_unsupported(cJSON *root, int kind, const ngx_muse_span_t *sp,
    ngx_muse_verr_t *err)
{
    static const char  *refused[] = { "logit_bias", "top_logprobs",
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
        if (v && !ngx_muse_int_in(v, &sp[NGX_MUSE_F_BEST_OF], 1, 1)) {
            return ngx_muse_bad(err, "best_of", "only best_of 1 is supported");
        }
    }
    return 0;
}

static int
ngx_muse_check_prompt(cJSON *prompt, const ngx_muse_span_t *text, ngx_muse_verr_t *err)
{
    cJSON            *c;
    ngx_muse_iter_t   it;
    ngx_muse_span_t   s;

    if (cJSON_IsString(prompt)) {
        return 0;
    }
    if (!cJSON_IsArray(prompt) || prompt->child == NULL) {
        return ngx_muse_bad(err, "prompt", "prompt must be a string or a non-empty array of "
                                           "token ids");
    }
    ngx_muse_iter_init(&it, text);
    for (c = prompt->child; c; c = c->next) {
        s.p = NULL;
        if (!ngx_muse_iter_next(&it, &s) || !ngx_muse_int_in(c, &s, 0, MUSE_LIMIT_TOKEN_ID_MAX)) {
            return ngx_muse_bad(err, "prompt", "token ids must be integers from 0 to "
                                MUSE_XSTR(MUSE_LIMIT_TOKEN_ID_MAX));
        }
    }
    return 0;
}

/* The text of each top-level field whose integers are read exactly: the members of the text
 * and the children of the parsed object come in the same order. */
static void
ngx_muse_field_spans(cJSON *root, const unsigned char *body, size_t len, ngx_muse_span_t *sp)
{
    ngx_muse_iter_t   it;
    ngx_muse_span_t   whole, s;
    cJSON            *c;
    size_t            i;

    memset(sp, 0, NGX_MUSE_F_COUNT * sizeof(ngx_muse_span_t));
    whole.p = ngx_muse_ws(body, body + len);
    whole.n = (size_t) (body + len - whole.p);
    ngx_muse_iter_init(&it, &whole);
    for (c = root->child; c && ngx_muse_iter_next(&it, &s); c = c->next) {
        for (i = 0; i < NGX_MUSE_F_COUNT; i++) {
            if (strcmp(c->string, ngx_muse_span_fields[i]) == 0) {
                sp[i] = s;
            }
        }
    }
}

/* The request fields of API.md. Sets *flags (MUSE_REQ_*). */
static int
ngx_muse_check_fields(const ngx_muse_vconf_t *vc, cJSON *root, const unsigned char *body,
    size_t len, uint32_t *flags, ngx_muse_verr_t *err)
{
    static const char  *efforts[] = { "low", "medium", "high", NULL };
    cJSON              *v, *inc;
    ngx_muse_span_t     sp[NGX_MUSE_F_COUNT];

    if (!cJSON_IsObject(root)) {
        return ngx_muse_bad(err, NULL, "the request body must be a JSON object");
    }
    ngx_muse_field_spans(root, body, len, sp);
    if (ngx_muse_check_unsupported(root, vc->kind, sp, err) != 0
        || ngx_muse_check_response_format(
               cJSON_GetObjectItemCaseSensitive(root, "response_format"), err) != 0)
    {
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
    } else if (ngx_muse_check_prompt(cJSON_GetObjectItemCaseSensitive(root, "prompt"),
                                     &sp[NGX_MUSE_F_PROMPT], err)
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
    NGX_MUSE_RANGE("max_tokens",
                   ngx_muse_int_in(v, &sp[NGX_MUSE_F_MAX_TOKENS], 1, MUSE_LIMIT_MAX_TOKENS),
                   "max_tokens must be an integer from 1 to "
                   MUSE_XSTR(MUSE_LIMIT_MAX_TOKENS))
    NGX_MUSE_RANGE("max_completion_tokens",
                   ngx_muse_int_in(v, &sp[NGX_MUSE_F_MAX_COMPLETION_TOKENS], 1,
                                   MUSE_LIMIT_MAX_TOKENS),
                   "max_completion_tokens must be an integer from 1 to "
                   MUSE_XSTR(MUSE_LIMIT_MAX_TOKENS))
    NGX_MUSE_RANGE("temperature", ngx_muse_is_num(v, 0, MUSE_LIMIT_TEMPERATURE_MAX),
                   "temperature must be a number from 0 to "
                   MUSE_XSTR(MUSE_LIMIT_TEMPERATURE_MAX))
    NGX_MUSE_RANGE("top_p", ngx_muse_is_num(v, 0, 1) && v->valuedouble > 0,
                   "top_p must be a number in (0, 1]")
    NGX_MUSE_RANGE("top_k", ngx_muse_int_in(v, &sp[NGX_MUSE_F_TOP_K], 0, MUSE_LIMIT_TOP_K_MAX),
                   "top_k must be an integer from 0 (off) to "
                   MUSE_XSTR(MUSE_LIMIT_TOP_K_MAX))
    NGX_MUSE_RANGE("min_p", ngx_muse_is_num(v, 0, 1), "min_p must be a number from 0 to 1")
    NGX_MUSE_RANGE("seed", ngx_muse_seed_ok(v, &sp[NGX_MUSE_F_SEED]),
                   "seed must be an integer from -9223372036854775808 to "
                   "18446744073709551615 (a negative seed s is the seed 2^64 + s)")
    NGX_MUSE_RANGE("n", ngx_muse_int_in(v, &sp[NGX_MUSE_F_N], 1, 1), "only n = 1 is supported")
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

int
ngx_muse_validate_body(const ngx_muse_vconf_t *vc, const unsigned char *body, size_t len,
    uint32_t *flags, ngx_muse_verr_t *err)
{
    const unsigned char  *nul;
    cJSON                *root;
    char                 *copy;
    int                   rc;

    *flags = 0;
    err->offset = (size_t) -1;
    if (len == 0) {
        return ngx_muse_bad(err, NULL, "the request body is empty; send a JSON object");
    }
    nul = memchr(body, '\0', len);
    if (nul != NULL) {
        ngx_muse_bad(err, NULL, "");
        err->offset = (size_t) (nul - body);
        snprintf(err->text, sizeof(err->text), "NUL characters are not allowed in the request "
                 "(a NUL byte at byte offset %zu)", err->offset);
        err->message = err->text;
        return -1;
    }
    if (ngx_muse_json_check(body, len, vc->max_json_values, err) != 0) {
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
        /* the text passed the strict check: only memory can fail here */
        return ngx_muse_bad(err, NULL, "the request body could not be parsed (out of memory)");
    }
    rc = ngx_muse_check_tree(root, NULL, 0, err);
    if (rc == 0) {
        rc = ngx_muse_check_fields(vc, root, body, len, flags, err);
    }
    cJSON_Delete(root);
    return rc;
}
