/* libFuzzer: the nginx module's validator (ngx_muse_validate.c, built without nginx) on mutated
 * request bodies. Its strict-JSON decision must equal the one of a plain recursive-descent RFC
 * 8259 recognizer written here (with the module's documented policies: \u0000 and lone
 * surrogate escapes refused, at most 200 levels, at most N items); whatever the whole validator
 * accepts must be JSON the reference accepts, valid UTF-8, and parsed by cJSON. The first byte
 * picks the item limit (small, to reach it) and the endpoint; the rest is the body. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ngx_muse_validate.h"

#define REF_MAX_DEPTH 200 /* MUSE_LIMIT_JSON_NESTING, restated: the reference is independent */

typedef struct {
    const uint8_t *p, *end;
    size_t items, max_items;
    int depth;
} ref_t;

static int ref_value(ref_t *r);

static int peek(const ref_t *r)
{
    return r->p < r->end ? *r->p : -1;
}

static int next(ref_t *r)
{
    return r->p < r->end ? *r->p++ : -1;
}

static void ws(ref_t *r)
{
    while (peek(r) == ' ' || peek(r) == '\t' || peek(r) == '\n' || peek(r) == '\r') r->p++;
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int hex4(ref_t *r, unsigned *cp)
{
    *cp = 0;
    for (int i = 0; i < 4; i++) {
        int c = next(r), d;
        if (is_digit(c))
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return 0;
        *cp = *cp * 16 + (unsigned)d;
    }
    return 1;
}

/* string = quotation-mark *char quotation-mark (RFC 8259 section 7) */
static int ref_string(ref_t *r)
{
    if (next(r) != '"') return 0;
    for (;;) {
        int c = next(r);
        if (c < 0 || c < 0x20) return 0; /* the end, or an unescaped control character */
        if (c == '"') return 1;
        if (c != '\\') continue;
        c = next(r);
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
            c == 't')
            continue;
        if (c != 'u') return 0;
        unsigned cp, lo;
        if (!hex4(r, &cp) || cp == 0) return 0;     /* policy: no NUL */
        if (cp >= 0xDC00 && cp <= 0xDFFF) return 0; /* policy: no lone low surrogate */
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (next(r) != '\\' || next(r) != 'u' || !hex4(r, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                return 0; /* policy: a high surrogate needs its low one */
        }
    }
}

/* number = [ minus ] int [ frac ] [ exp ] (section 6) */
static int ref_number(ref_t *r)
{
    if (peek(r) == '-') r->p++;
    if (peek(r) == '0') {
        r->p++;
    } else if (is_digit(peek(r))) {
        while (is_digit(peek(r))) r->p++;
    } else {
        return 0;
    }
    if (peek(r) == '.') {
        r->p++;
        if (!is_digit(peek(r))) return 0;
        while (is_digit(peek(r))) r->p++;
    }
    if (peek(r) == 'e' || peek(r) == 'E') {
        r->p++;
        if (peek(r) == '+' || peek(r) == '-') r->p++;
        if (!is_digit(peek(r))) return 0;
        while (is_digit(peek(r))) r->p++;
    }
    return 1;
}

static int literal(ref_t *r, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return 0;
    r->p += n;
    return 1;
}

/* array = begin-array [ value *( value-separator value ) ] end-array */
static int ref_array(ref_t *r)
{
    r->p++;
    if (++r->depth > REF_MAX_DEPTH) return 0;
    ws(r);
    if (peek(r) == ']') {
        r->p++;
        r->depth--;
        return 1;
    }
    for (;;) {
        if (!ref_value(r)) return 0;
        ws(r);
        int c = next(r);
        if (c == ']') break;
        if (c != ',') return 0;
        ws(r);
    }
    r->depth--;
    return 1;
}

/* object = begin-object [ member *( value-separator member ) ] end-object */
static int ref_object(ref_t *r)
{
    r->p++;
    if (++r->depth > REF_MAX_DEPTH) return 0;
    ws(r);
    if (peek(r) == '}') {
        r->p++;
        r->depth--;
        return 1;
    }
    for (;;) {
        if (++r->items > r->max_items || !ref_string(r)) return 0; /* a key is an item */
        ws(r);
        if (next(r) != ':') return 0;
        ws(r);
        if (!ref_value(r)) return 0;
        ws(r);
        int c = next(r);
        if (c == '}') break;
        if (c != ',') return 0;
        ws(r);
    }
    r->depth--;
    return 1;
}

static int ref_value(ref_t *r)
{
    if (++r->items > r->max_items) return 0;
    switch (peek(r)) {
    case '{':
        return ref_object(r);
    case '[':
        return ref_array(r);
    case '"':
        return ref_string(r);
    case 't':
        return literal(r, "true");
    case 'f':
        return literal(r, "false");
    case 'n':
        return literal(r, "null");
    default:
        return ref_number(r);
    }
}

/* JSON-text = ws value ws */
static int ref_json(const uint8_t *p, size_t n, size_t max_items)
{
    ref_t r = {p, p + n, 0, max_items, 0};
    ws(&r);
    if (!ref_value(&r)) return 0;
    ws(&r);
    return r.p == r.end;
}

/* Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing past U+10FFFF. */
static int utf8_ok(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            k = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + k >= n) return 0; /* the continuation bytes are i + 1 .. i + k */
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (p[i + j] & 0x3F);
        }
        static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += k + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    /* 0x00..0x7f: an item limit of 1..128 (reached by small bodies); else the default */
    size_t max_items = data[0] < 0x80 ? (size_t)(data[0] & 0x7f) + 1 : 1048576;
    const ngx_muse_vconf_t vc = {(data[0] & 1) ? 1 : 2, "muse-spark", 10, max_items};
    const uint8_t *body = data + 1;
    size_t len = size - 1;

    ngx_muse_verr_t err;
    memset(&err, 0, sizeof err);
    int strict = ngx_muse_json_check(body, len, max_items, &err) == 0;
    if (strict != ref_json(body, len, max_items)) __builtin_trap(); /* a parser differential */
    if (!strict && (!err.message || err.status != 400)) __builtin_trap();
    if (!strict && err.code && strcmp(err.code, "invalid_json") == 0 && err.offset > len)
        __builtin_trap(); /* a syntax error names a byte of the body (or its end) */

    uint32_t flags = 0;
    memset(&err, 0, sizeof err);
    int rc = ngx_muse_validate_body(&vc, body, len, &flags, &err);
    if (rc == 0 && (!strict || !utf8_ok(body, len) || memchr(body, 0, len))) __builtin_trap();
    if (rc != 0 && (!err.message || (err.status != 400 && err.status != 404))) __builtin_trap();
    if (rc != 0 && strict && strstr(err.message, "could not be parsed")) __builtin_trap();
    return 0;
}
