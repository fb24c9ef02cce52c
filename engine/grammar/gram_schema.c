/* JSON Schema to grammar rules: each schema node becomes a rule over bytes; $ref targets are
 * rules made once (so recursion is a cycle of rules); a keyword outside the supported set is
 * an error naming it and its path. */
#include "grammar/gram_internal.h"

#include <cjson/cJSON.h>
#include <math.h>

#include "base/muse_common.h"

#define WS_MAX      8  /* whitespace bytes between two tokens of JSON */
#define INT_DIGITS  16 /* digits of an integer without an upper bound */
#define FRAC_DIGITS 16
#define LEN_MAX     1024 /* minLength / maxLength / minItems / maxItems we expand */
#define BOUND_MAX   1e15 /* |minimum|, |maximum| for exact digit grammars */
#define NONE        UINT32_MAX

typedef struct {
    const char *ref;
    uint32_t rule;
} ref_memo;

typedef struct {
    gram_builder *b;
    const cJSON *root;
    muse_gerr *err;
    char path[160];
    int depth;
    uint32_t ws, any, str, num, anyobj, anyarr;
    uint32_t digits_any[24]; /* exactly L digits, made once per L (same_len) */
    ref_memo *refs;
    size_t nrefs, refcap;
    bool atem; /* values inside ATEM tags: '<' only escaped */
} ctx;

static int fail(ctx *c, const char *kw, const char *msg)
{
    if (c->err->keyword[0] == '\0') {
        snprintf(c->err->keyword, sizeof c->err->keyword, "%s", kw);
        snprintf(c->err->path, sizeof c->err->path, "%s", c->path[0] ? c->path : "/");
        snprintf(c->err->msg, sizeof c->err->msg, "%s", msg);
    }
    return -1;
}

static size_t path_push(ctx *c, const char *seg)
{
    size_t n = strlen(c->path);
    snprintf(c->path + n, sizeof c->path - n, "/%s", seg);
    return n;
}
static void path_pop(ctx *c, size_t n)
{
    c->path[n] = '\0';
}

/* ---- small rule makers ---- */

static uint32_t rule_lit(ctx *c, const char *s, size_t n)
{
    uint32_t r = gb_rule_new(c->b);
    gb_lit(c->b, gb_alt_new(c->b, r), s, n);
    return r;
}

/* set repeated min..max times (max NONE: unbounded). */
static uint32_t rule_rep(ctx *c, const gram_set *s, uint32_t min, uint32_t max)
{
    if (max == NONE) {
        uint32_t loop = gb_rule_new(c->b);
        gb_alt *a = gb_alt_new(c->b, loop);
        gb_term(c->b, a, s);
        gb_ref(c->b, a, loop);
        gb_alt_new(c->b, loop);
        uint32_t next = loop;
        for (uint32_t k = min; k > 0; k--) {
            uint32_t r = gb_rule_new(c->b);
            a = gb_alt_new(c->b, r);
            gb_term(c->b, a, s);
            gb_ref(c->b, a, next);
            next = r;
        }
        return next;
    }
    uint32_t next = gb_rule_new(c->b);
    gb_alt_new(c->b, next); /* after max: nothing */
    for (uint32_t k = max; k > 0; k--) {
        uint32_t r = gb_rule_new(c->b);
        gb_alt *a = gb_alt_new(c->b, r);
        gb_term(c->b, a, s);
        gb_ref(c->b, a, next);
        if (k - 1 >= min) gb_alt_new(c->b, r); /* enough already: may stop */
        next = r;
    }
    return next;
}

static gram_set set_range(unsigned lo, unsigned hi)
{
    gram_set s = {{0}};
    for (unsigned x = lo; x <= hi && x < 256; x++) s.w[x >> 5] |= 1u << (x & 31);
    return s;
}
static void set_add(gram_set *s, unsigned lo, unsigned hi)
{
    for (unsigned x = lo; x <= hi && x < 256; x++) s->w[x >> 5] |= 1u << (x & 31);
}

static uint32_t ws_rule(ctx *c)
{
    if (c->ws == NONE) {
        gram_set s = {{0}};
        set_add(&s, ' ', ' ');
        set_add(&s, '\t', '\t');
        set_add(&s, '\n', '\n');
        set_add(&s, '\r', '\r');
        c->ws = rule_rep(c, &s, 0, WS_MAX);
    }
    return c->ws;
}

/* One JSON string character (UTF-8 checked byte by byte, no surrogate escapes), then rule
 * next: added as alternatives of r so the string stays in one rule frame. */
static void char_alts(ctx *c, uint32_t r, uint32_t next)
{
    gram_builder *b = c->b;
    gb_alt *a;
    gram_set s = set_range(0x20, 0x7f);
    s.w['"' >> 5] &= ~(1u << ('"' & 31));
    s.w['\\' >> 5] &= ~(1u << ('\\' & 31));
    if (c->atem) s.w['<' >> 5] &= ~(1u << ('<' & 31)); /* no "</atem:parameter>" in a value */
    gram_set cont = set_range(0x80, 0xbf), hex = set_range('0', '9');
    set_add(&hex, 'a', 'f');
    set_add(&hex, 'A', 'F');
    a = gb_alt_new(b, r);
    gb_term(b, a, &s);
    gb_ref(b, a, next);
    a = gb_alt_new(b, r); /* two-byte escapes */
    gb_byte(b, a, '\\');
    gram_set e = {{0}};
    for (const char *p = "\"\\/bfnrt"; *p; p++) set_add(&e, (unsigned char)*p, (unsigned char)*p);
    gb_term(b, a, &e);
    gb_ref(b, a, next);
    gram_set h1 = set_range('0', '9'); /* \uXXXX outside D800-DFFF */
    set_add(&h1, 'a', 'c');
    set_add(&h1, 'A', 'C');
    set_add(&h1, 'e', 'f');
    set_add(&h1, 'E', 'F');
    a = gb_alt_new(b, r);
    gb_lit(b, a, "\\u", 2);
    gb_term(b, a, &h1);
    gb_term(b, a, &hex);
    gb_term(b, a, &hex);
    gb_term(b, a, &hex);
    gb_ref(b, a, next);
    gram_set dD = {{0}};
    set_add(&dD, 'd', 'd');
    set_add(&dD, 'D', 'D');
    a = gb_alt_new(b, r);
    gb_lit(b, a, "\\u", 2);
    gb_term(b, a, &dD);
    gb_range(b, a, '0', '7');
    gb_term(b, a, &hex);
    gb_term(b, a, &hex);
    gb_ref(b, a, next);
    /* UTF-8: {lead, second byte range, continuation bytes after} */
    static const unsigned utf[][4] = {{0xc2, 0xdf, 0x80, 0xbf}, {0xe0, 0xe0, 0xa0, 0xbf},
                                      {0xe1, 0xec, 0x80, 0xbf}, {0xed, 0xed, 0x80, 0x9f},
                                      {0xee, 0xef, 0x80, 0xbf}, {0xf0, 0xf0, 0x90, 0xbf},
                                      {0xf1, 0xf3, 0x80, 0xbf}, {0xf4, 0xf4, 0x80, 0x8f}};
    for (size_t i = 0; i < sizeof utf / sizeof utf[0]; i++) {
        unsigned extra = utf[i][0] >= 0xf0 ? 2 : utf[i][0] >= 0xe0 ? 1 : 0;
        a = gb_alt_new(b, r);
        gb_range(b, a, utf[i][0], utf[i][1]);
        gb_range(b, a, utf[i][2], utf[i][3]);
        for (unsigned k = 0; k < extra; k++) gb_term(b, a, &cont);
        gb_ref(b, a, next);
    }
}

/* A string of min..max characters (max NONE: unbounded), quotes included. */
static uint32_t string_rule(ctx *c, uint32_t min, uint32_t max)
{
    if (min == 0 && max == NONE && c->str != NONE) return c->str;
    uint32_t tail; /* the rule after which any number of characters, then the quote */
    if (max == NONE) {
        tail = gb_rule_new(c->b);
        char_alts(c, tail, tail);
        gb_byte(c->b, gb_alt_new(c->b, tail), '"');
        for (uint32_t k = min; k > 0; k--) {
            uint32_t r = gb_rule_new(c->b);
            char_alts(c, r, tail);
            tail = r;
        }
    } else {
        tail = gb_rule_new(c->b);
        gb_byte(c->b, gb_alt_new(c->b, tail), '"');
        for (uint32_t k = max; k > 0; k--) {
            uint32_t r = gb_rule_new(c->b);
            char_alts(c, r, tail);
            if (k - 1 >= min) gb_byte(c->b, gb_alt_new(c->b, r), '"');
            tail = r;
        }
    }
    uint32_t r = gb_rule_new(c->b);
    gb_alt *a = gb_alt_new(c->b, r);
    gb_byte(c->b, a, '"');
    gb_ref(c->b, a, tail);
    if (min == 0 && max == NONE) c->str = r;
    return r;
}

/* ---- numbers ---- */

static uint32_t digits(ctx *c, uint32_t min, uint32_t max)
{
    gram_set d = set_range('0', '9');
    return rule_rep(c, &d, min, max);
}

/* Exactly n digits, one rule per n. */
static uint32_t exact_digits(ctx *c, size_t n)
{
    if (n >= sizeof c->digits_any / sizeof c->digits_any[0])
        return digits(c, (uint32_t)n, (uint32_t)n);
    if (c->digits_any[n] == NONE) c->digits_any[n] = digits(c, (uint32_t)n, (uint32_t)n);
    return c->digits_any[n];
}

static bool all_of(const char *s, size_t L, char d)
{
    for (size_t i = 0; i < L; i++)
        if (s[i] != d) return false;
    return true;
}

/* Decimal texts (no leading zeros) of the integers in [A, B], both of L digits. */
static uint32_t same_len(ctx *c, const char *A, const char *B, size_t L)
{
    /* [0..0, 9..9] is any L digits: one rule per length, else the two branches below would
     * each recurse into it again (2^L rules for an unbounded integer) */
    if (L > 1 && all_of(A, L, '0') && all_of(B, L, '9')) return exact_digits(c, L);
    uint32_t r = gb_rule_new(c->b);
    gb_alt *a;
    if (L == 1) {
        gb_range(c->b, gb_alt_new(c->b, r), (unsigned char)A[0], (unsigned char)B[0]);
        return r;
    }
    if (A[0] == B[0]) {
        a = gb_alt_new(c->b, r);
        gb_byte(c->b, a, (unsigned char)A[0]);
        gb_ref(c->b, a, same_len(c, A + 1, B + 1, L - 1));
        return r;
    }
    char nines[24], zeros[24];
    memset(nines, '9', L - 1);
    memset(zeros, '0', L - 1);
    a = gb_alt_new(c->b, r);
    gb_byte(c->b, a, (unsigned char)A[0]);
    gb_ref(c->b, a, same_len(c, A + 1, nines, L - 1));
    if (A[0] + 1 <= B[0] - 1) {
        a = gb_alt_new(c->b, r);
        gb_range(c->b, a, (unsigned char)A[0] + 1, (unsigned char)B[0] - 1);
        gb_ref(c->b, a, exact_digits(c, L - 1));
    }
    a = gb_alt_new(c->b, r);
    gb_byte(c->b, a, (unsigned char)B[0]);
    gb_ref(c->b, a, same_len(c, zeros, B + 1, L - 1));
    return r;
}

static uint64_t pow10u(size_t k)
{
    uint64_t p = 1;
    while (k--) p *= 10;
    return p;
}

/* Integers in [lo, hi] (hi UINT64_MAX: up to INT_DIGITS digits), lo >= 0, as decimal text. */
static uint32_t nonneg(ctx *c, uint64_t lo, uint64_t hi)
{
    uint32_t r = gb_rule_new(c->b);
    char A[24], B[24];
    size_t la = (size_t)snprintf(A, sizeof A, "%llu", (unsigned long long)lo);
    size_t lmax = hi == UINT64_MAX ? INT_DIGITS
                                   : (size_t)snprintf(B, sizeof B, "%llu", (unsigned long long)hi);
    if (hi != UINT64_MAX && hi < lo) return r; /* no alternative: nothing matches */
    for (size_t L = la; L <= lmax; L++) {
        uint64_t a = L == la ? lo : pow10u(L - 1);
        uint64_t top = pow10u(L) - 1, bb = hi != UINT64_MAX && hi < top ? hi : top;
        if (L > la && a > bb) break;
        snprintf(A, sizeof A, "%llu", (unsigned long long)a);
        snprintf(B, sizeof B, "%llu", (unsigned long long)bb);
        gb_ref(c->b, gb_alt_new(c->b, r), same_len(c, A, B, L));
    }
    return r;
}

static int bound(ctx *c, const cJSON *node, const char *kw, double *v, bool *has)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(node, kw);
    *has = false;
    if (!x) return 0;
    size_t n = path_push(c, kw);
    int rc = 0;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
        rc = fail(c, kw, "must be a number");
    else if (fabs(x->valuedouble) > BOUND_MAX)
        rc = fail(c, kw, "bounds beyond 1e15 in magnitude are not supported");
    path_pop(c, n);
    if (rc) return -1;
    *v = x->valuedouble;
    *has = true;
    return 0;
}

static int64_t gen_integer(ctx *c, const cJSON *node)
{
    double lo = 0, hi = 0, xlo = 0, xhi = 0;
    bool hl, hh, hxl, hxh;
    if (bound(c, node, "minimum", &lo, &hl) || bound(c, node, "maximum", &hi, &hh) ||
        bound(c, node, "exclusiveMinimum", &xlo, &hxl) ||
        bound(c, node, "exclusiveMaximum", &xhi, &hxh))
        return -1;
    int64_t L = 0, H = 0;
    bool has_l = hl || hxl, has_h = hh || hxh;
    if (hl) L = (int64_t)ceil(lo);
    if (hxl && (!hl || (int64_t)floor(xlo) + 1 > L)) L = (int64_t)floor(xlo) + 1;
    if (hh) H = (int64_t)floor(hi);
    if (hxh && (!hh || (int64_t)ceil(xhi) - 1 < H)) H = (int64_t)ceil(xhi) - 1;
    if (has_l && has_h && L > H)
        return fail(c, "minimum", "minimum is above maximum: no integer fits");
    uint32_t r = gb_rule_new(c->b);
    if (!has_h || H >= 0) { /* the non-negative part */
        uint64_t a = has_l && L > 0 ? (uint64_t)L : 0;
        gb_ref(c->b, gb_alt_new(c->b, r), nonneg(c, a, has_h ? (uint64_t)H : UINT64_MAX));
    }
    if (!has_l || L < 0) { /* the negative part: -m, m in [mlo, mhi] */
        uint64_t mlo = has_h && H < 0 ? (uint64_t)-H : 1;
        uint64_t mhi = has_l ? (uint64_t)-L : UINT64_MAX;
        gb_alt *a = gb_alt_new(c->b, r);
        gb_byte(c->b, a, '-');
        gb_ref(c->b, a, nonneg(c, mlo, mhi));
    }
    return r;
}

static uint32_t frac_opt(ctx *c, bool zeros_only)
{
    uint32_t r = gb_rule_new(c->b);
    gb_alt_new(c->b, r);
    gb_alt *a = gb_alt_new(c->b, r);
    gb_byte(c->b, a, '.');
    if (zeros_only) {
        gram_set z = set_range('0', '0');
        gb_ref(c->b, a, rule_rep(c, &z, 1, FRAC_DIGITS));
    } else {
        gb_ref(c->b, a, digits(c, 1, FRAC_DIGITS));
    }
    return r;
}

static uint32_t number_any(ctx *c)
{
    if (c->num != NONE) return c->num;
    uint32_t intp = gb_rule_new(c->b);
    gb_byte(c->b, gb_alt_new(c->b, intp), '0');
    gb_alt *a = gb_alt_new(c->b, intp);
    gb_range(c->b, a, '1', '9');
    gb_ref(c->b, a, digits(c, 0, INT_DIGITS - 1));
    uint32_t exp = gb_rule_new(c->b);
    gb_alt_new(c->b, exp);
    a = gb_alt_new(c->b, exp);
    gram_set e = {{0}}, pm = {{0}};
    set_add(&e, 'e', 'e');
    set_add(&e, 'E', 'E');
    set_add(&pm, '+', '+');
    set_add(&pm, '-', '-');
    gb_term(c->b, a, &e);
    gb_ref(c->b, a, rule_rep(c, &pm, 0, 1));
    gb_ref(c->b, a, digits(c, 1, 2));
    uint32_t r = gb_rule_new(c->b);
    a = gb_alt_new(c->b, r);
    gb_ref(c->b, a, intp);
    gb_ref(c->b, a, frac_opt(c, false));
    gb_ref(c->b, a, exp);
    a = gb_alt_new(c->b, r);
    gb_byte(c->b, a, '-');
    gb_ref(c->b, a, intp);
    gb_ref(c->b, a, frac_opt(c, false));
    gb_ref(c->b, a, exp);
    c->num = r;
    return r;
}

static int64_t gen_number(ctx *c, const cJSON *node)
{
    double lo = 0, hi = 0, x = 0;
    bool hl, hh, hx;
    if (bound(c, node, "minimum", &lo, &hl) || bound(c, node, "maximum", &hi, &hh)) return -1;
    for (const char *const *k = (const char *const[]){"exclusiveMinimum", "exclusiveMaximum", NULL};
         *k; k++) {
        if (bound(c, node, *k, &x, &hx)) return -1;
        if (hx) {
            size_t n = path_push(c, *k);
            fail(c, *k, "is supported on integers only; on a number use minimum/maximum");
            path_pop(c, n);
            return -1;
        }
    }
    if (!hl && !hh) return number_any(c);
    const char *kw = hl ? "minimum" : "maximum";
    if ((hl && (lo < 0 || lo != floor(lo))) || (hh && (hi < 0 || hi != floor(hi))) ||
        (hl && hh && lo > hi)) {
        size_t n = path_push(c, kw);
        fail(c, kw, "on a number only whole bounds >= 0 (minimum <= maximum) are supported");
        path_pop(c, n);
        return -1;
    }
    uint32_t r = gb_rule_new(c->b);
    uint64_t L = hl ? (uint64_t)lo : 0;
    gb_alt *a;
    if (hh) {
        uint64_t H = (uint64_t)hi;
        if (H > L) {
            a = gb_alt_new(c->b, r);
            gb_ref(c->b, a, nonneg(c, L, H - 1));
            gb_ref(c->b, a, frac_opt(c, false));
        }
        a = gb_alt_new(c->b, r);
        gb_ref(c->b, a, nonneg(c, H, H));
        gb_ref(c->b, a, frac_opt(c, true));
    } else {
        a = gb_alt_new(c->b, r);
        gb_ref(c->b, a, nonneg(c, L, UINT64_MAX));
        gb_ref(c->b, a, frac_opt(c, false));
    }
    if (!hl) { /* any negative number */
        uint32_t neg = gb_rule_new(c->b);
        a = gb_alt_new(c->b, neg);
        gb_byte(c->b, a, '0');
        gb_ref(c->b, a, frac_opt(c, false));
        a = gb_alt_new(c->b, neg);
        gb_ref(c->b, a, nonneg(c, 1, UINT64_MAX));
        gb_ref(c->b, a, frac_opt(c, false));
        a = gb_alt_new(c->b, r);
        gb_byte(c->b, a, '-');
        gb_ref(c->b, a, neg);
    }
    return r;
}

/* ---- strings and formats ---- */

static uint32_t two_digits(ctx *c, const char *alts[])
{
    uint32_t r = gb_rule_new(c->b);
    for (; *alts; alts++) {
        gb_alt *a = gb_alt_new(c->b, r);
        gb_range(c->b, a, (unsigned char)(*alts)[0], (unsigned char)(*alts)[1]);
        gb_range(c->b, a, (unsigned char)(*alts)[2], (unsigned char)(*alts)[3]);
    }
    return r;
}

static uint32_t date_rule(ctx *c)
{
    uint32_t r = gb_rule_new(c->b);
    static const char *m31[] = {"01", "03", "05", "07", "08", "10", "12", NULL};
    static const char *m30[] = {"04", "06", "09", "11", NULL};
    uint32_t d31 = two_digits(c, (const char *[]){"0019", "1229", "3301", NULL});
    uint32_t d30 = two_digits(c, (const char *[]){"0019", "1229", "3300", NULL});
    uint32_t d28 = two_digits(c, (const char *[]){"0019", "1119", "2228", NULL});
    uint32_t year = gb_rule_new(c->b);
    gb_alt *a = gb_alt_new(c->b, year);
    gb_range(c->b, a, '1', '9');
    gb_ref(c->b, a, digits(c, 3, 3));
    for (int k = 0; k < 3; k++) {
        const char **ms = k == 0 ? m31 : k == 1 ? m30 : (const char *[]){"02", NULL};
        for (; *ms; ms++) {
            a = gb_alt_new(c->b, r);
            gb_ref(c->b, a, year);
            gb_byte(c->b, a, '-');
            gb_lit(c->b, a, *ms, 2);
            gb_byte(c->b, a, '-');
            gb_ref(c->b, a, k == 0 ? d31 : k == 1 ? d30 : d28);
        }
    }
    return r;
}

static uint32_t time_rule(ctx *c)
{
    uint32_t hh = two_digits(c, (const char *[]){"0119", "2223", NULL});
    uint32_t mm = two_digits(c, (const char *[]){"0509", NULL});
    uint32_t r = gb_rule_new(c->b), frac = gb_rule_new(c->b), zone = gb_rule_new(c->b);
    gb_alt_new(c->b, frac);
    gb_alt *a = gb_alt_new(c->b, frac);
    gb_byte(c->b, a, '.');
    gb_ref(c->b, a, digits(c, 1, 6));
    gb_byte(c->b, gb_alt_new(c->b, zone), 'Z');
    a = gb_alt_new(c->b, zone);
    gram_set pm = {{0}};
    set_add(&pm, '+', '+');
    set_add(&pm, '-', '-');
    gb_term(c->b, a, &pm);
    gb_ref(c->b, a, hh);
    gb_byte(c->b, a, ':');
    gb_ref(c->b, a, mm);
    a = gb_alt_new(c->b, r);
    gb_ref(c->b, a, hh);
    gb_byte(c->b, a, ':');
    gb_ref(c->b, a, mm);
    gb_byte(c->b, a, ':');
    gb_ref(c->b, a, mm);
    gb_ref(c->b, a, frac);
    gb_ref(c->b, a, zone);
    return r;
}

static int64_t format_rule(ctx *c, const char *f)
{
    uint32_t r = gb_rule_new(c->b);
    gb_alt *a = gb_alt_new(c->b, r);
    gb_byte(c->b, a, '"');
    if (strcmp(f, "date") == 0) {
        gb_ref(c->b, a, date_rule(c));
    } else if (strcmp(f, "time") == 0) {
        gb_ref(c->b, a, time_rule(c));
    } else if (strcmp(f, "date-time") == 0) {
        gb_ref(c->b, a, date_rule(c));
        gb_byte(c->b, a, 'T');
        gb_ref(c->b, a, time_rule(c));
    } else if (strcmp(f, "uuid") == 0) {
        gram_set h = set_range('0', '9');
        set_add(&h, 'a', 'f');
        static const uint32_t parts[] = {8, 4, 4, 4, 12};
        for (int i = 0; i < 5; i++) {
            if (i) gb_byte(c->b, a, '-');
            gb_ref(c->b, a, rule_rep(c, &h, parts[i], parts[i]));
        }
    } else if (strcmp(f, "email") == 0) {
        gram_set al = set_range('a', 'z'), loc;
        set_add(&al, 'A', 'Z');
        set_add(&al, '0', '9');
        loc = al;
        set_add(&loc, '.', '.');
        set_add(&loc, '_', '_');
        set_add(&loc, '+', '+');
        set_add(&loc, '-', '-');
        gb_term(c->b, a, &al);
        gb_ref(c->b, a, rule_rep(c, &loc, 0, 31));
        gb_byte(c->b, a, '@');
        gb_ref(c->b, a, rule_rep(c, &al, 1, 24));
        gram_set lo = set_range('a', 'z');
        gb_byte(c->b, a, '.');
        gb_ref(c->b, a, rule_rep(c, &lo, 2, 6));
    } else {
        return fail(c, "format", "supported formats are date, time, date-time, uuid and email");
    }
    gb_byte(c->b, a, '"');
    return r;
}

static int count_kw(ctx *c, const cJSON *node, const char *kw, uint32_t *out)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(node, kw);
    if (!x) return 0;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble) ||
        x->valuedouble > LEN_MAX) {
        size_t n = path_push(c, kw);
        fail(c, kw, "must be a whole number from 0 to 1024");
        path_pop(c, n);
        return -1;
    }
    *out = (uint32_t)x->valuedouble;
    return 0;
}

static int64_t gen_string(ctx *c, const cJSON *node)
{
    uint32_t mn = 0, mx = NONE;
    if (count_kw(c, node, "minLength", &mn) || count_kw(c, node, "maxLength", &mx)) return -1;
    if (mx != NONE && mn > mx) return fail(c, "minLength", "minLength is above maxLength");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(node, "format");
    if (f) {
        size_t n = path_push(c, "format");
        int64_t r;
        if (!cJSON_IsString(f))
            r = fail(c, "format", "must be a string");
        else if (mn || mx != NONE)
            r = fail(c, "format", "format together with minLength/maxLength is not supported");
        else
            r = format_rule(c, f->valuestring);
        path_pop(c, n);
        return r;
    }
    return string_rule(c, mn, mx);
}

/* ---- any JSON value ---- */

static uint32_t any_value(ctx *c);

static uint32_t any_object(ctx *c)
{
    if (c->anyobj != NONE) return c->anyobj;
    uint32_t ws = ws_rule(c), r = gb_rule_new(c->b), rest = gb_rule_new(c->b),
             more = gb_rule_new(c->b), member = gb_rule_new(c->b);
    c->anyobj = r;
    gb_alt *a = gb_alt_new(c->b, member);
    gb_ref(c->b, a, string_rule(c, 0, NONE));
    gb_ref(c->b, a, ws);
    gb_byte(c->b, a, ':');
    gb_ref(c->b, a, ws);
    gb_ref(c->b, a, any_value(c));
    a = gb_alt_new(c->b, r);
    gb_byte(c->b, a, '{');
    gb_ref(c->b, a, ws);
    gb_ref(c->b, a, rest);
    gb_byte(c->b, gb_alt_new(c->b, rest), '}');
    a = gb_alt_new(c->b, rest);
    gb_ref(c->b, a, member);
    gb_ref(c->b, a, more);
    a = gb_alt_new(c->b, more);
    gb_ref(c->b, a, ws);
    gb_byte(c->b, a, '}');
    a = gb_alt_new(c->b, more);
    gb_ref(c->b, a, ws);
    gb_byte(c->b, a, ',');
    gb_ref(c->b, a, ws);
    gb_ref(c->b, a, member);
    gb_ref(c->b, a, more);
    return r;
}

static uint32_t any_array(ctx *c)
{
    if (c->anyarr != NONE) return c->anyarr;
    uint32_t ws = ws_rule(c), r = gb_rule_new(c->b), rest = gb_rule_new(c->b),
             more = gb_rule_new(c->b);
    c->anyarr = r;
    uint32_t v = any_value(c);
    gb_alt *a = gb_alt_new(c->b, r);
    gb_byte(c->b, a, '[');
    gb_ref(c->b, a, ws);
    gb_ref(c->b, a, rest);
    gb_byte(c->b, gb_alt_new(c->b, rest), ']');
    a = gb_alt_new(c->b, rest);
    gb_ref(c->b, a, v);
    gb_ref(c->b, a, more);
    a = gb_alt_new(c->b, more);
    gb_ref(c->b, a, ws);
    gb_byte(c->b, a, ']');
    a = gb_alt_new(c->b, more);
    gb_ref(c->b, a, ws);
    gb_byte(c->b, a, ',');
    gb_ref(c->b, a, ws);
    gb_ref(c->b, a, v);
    gb_ref(c->b, a, more);
    return r;
}

static uint32_t any_value(ctx *c)
{
    if (c->any != NONE) return c->any;
    uint32_t r = gb_rule_new(c->b);
    c->any = r;
    gb_ref(c->b, gb_alt_new(c->b, r), any_object(c));
    gb_ref(c->b, gb_alt_new(c->b, r), any_array(c));
    gb_ref(c->b, gb_alt_new(c->b, r), string_rule(c, 0, NONE));
    gb_ref(c->b, gb_alt_new(c->b, r), number_any(c));
    gb_lit(c->b, gb_alt_new(c->b, r), "true", 4);
    gb_lit(c->b, gb_alt_new(c->b, r), "false", 5);
    gb_lit(c->b, gb_alt_new(c->b, r), "null", 4);
    return r;
}

/* ---- schema nodes ---- */

static int64_t gen(ctx *c, const cJSON *node);

static int64_t literal(ctx *c, const cJSON *v)
{
    char *s = cJSON_PrintUnformatted(v);
    if (!s) return fail(c, "const", "could not print the value");
    uint32_t r = gb_rule_new(c->b);
    gb_alt *a = gb_alt_new(c->b, r);
    for (const char *p = s; *p; p++) { /* '<' is only inside strings in printed JSON */
        if (*p == '<' && c->atem)
            gb_lit(c->b, a, "\\u003c", 6);
        else
            gb_byte(c->b, a, (unsigned char)*p);
    }
    free(s);
    return r;
}

static int64_t gen_sub(ctx *c, const cJSON *node, const char *seg)
{
    size_t n = path_push(c, seg);
    int64_t r = gen(c, node);
    path_pop(c, n);
    return r;
}

static int64_t gen_object(ctx *c, const cJSON *node)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(node, "additionalProperties");
    if (props && !cJSON_IsObject(props)) {
        size_t n = path_push(c, "properties");
        fail(c, "properties", "must be an object");
        path_pop(c, n);
        return -1;
    }
    if (req && !cJSON_IsArray(req)) {
        size_t n = path_push(c, "required");
        fail(c, "required", "must be an array of strings");
        path_pop(c, n);
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, req) if (!cJSON_IsString(it))
    {
        size_t n = path_push(c, "required");
        fail(c, "required", "must be an array of strings");
        path_pop(c, n);
        return -1;
    }
    size_t np = 0;
    cJSON_ArrayForEach(it, props) np++;
    /* required names without a property schema: taken with any value */
    size_t nx = 0;
    cJSON_ArrayForEach(it, req) if (!cJSON_GetObjectItemCaseSensitive(props, it->valuestring)) nx++;
    if (np == 0 && nx == 0 && !cJSON_IsFalse(addl)) return any_object(c);
    if (nx && cJSON_IsFalse(addl))
        return fail(c, "required", "names a property that additionalProperties false forbids");
    size_t n = np + nx;
    uint32_t *key = MUSE_CALLOC(n, sizeof *key), *val = MUSE_CALLOC(n, sizeof *val);
    bool *must = MUSE_CALLOC(n, sizeof *must);
    size_t i = 0;
    int rc = 0;
    cJSON_ArrayForEach(it, props)
    {
        cJSON *ks = cJSON_CreateString(it->string);
        key[i] = (uint32_t)literal(c, ks);
        cJSON_Delete(ks);
        const cJSON *q;
        cJSON_ArrayForEach(q, req) if (strcmp(q->valuestring, it->string) == 0) must[i] = true;
        size_t m = path_push(c, "properties");
        /* a name with '/' or '~' is written as JSON Pointer escapes it */
        char seg[96];
        size_t k = 0;
        for (const char *p = it->string; *p && k + 3 < sizeof seg; p++) {
            if (*p == '~' || *p == '/') {
                seg[k++] = '~';
                seg[k++] = *p == '~' ? '0' : '1';
            } else {
                seg[k++] = *p;
            }
        }
        seg[k] = '\0';
        int64_t v = gen_sub(c, it, seg);
        path_pop(c, m);
        if (v < 0) {
            rc = -1;
            break;
        }
        val[i++] = (uint32_t)v;
    }
    cJSON_ArrayForEach(it, req)
    {
        if (rc || cJSON_GetObjectItemCaseSensitive(props, it->valuestring)) continue;
        cJSON *ks = cJSON_CreateString(it->valuestring);
        key[i] = (uint32_t)literal(c, ks);
        cJSON_Delete(ks);
        must[i] = true;
        val[i++] = any_value(c);
    }
    int64_t out = -1;
    if (rc == 0) {
        uint32_t ws = ws_rule(c);
        uint32_t next[2]; /* R[i+1][0], R[i+1][1] */
        next[0] = gb_rule_new(c->b);
        gb_alt_new(c->b, next[0]);
        next[1] = next[0];
        for (size_t j = n; j-- > 0;) {
            uint32_t cur[2];
            for (int k = 0; k < 2; k++) {
                cur[k] = gb_rule_new(c->b);
                gb_alt *a = gb_alt_new(c->b, cur[k]);
                if (k) {
                    gb_ref(c->b, a, ws);
                    gb_byte(c->b, a, ',');
                    gb_ref(c->b, a, ws);
                }
                gb_ref(c->b, a, key[j]);
                gb_ref(c->b, a, ws);
                gb_byte(c->b, a, ':');
                gb_ref(c->b, a, ws);
                gb_ref(c->b, a, val[j]);
                gb_ref(c->b, a, next[1]);
                if (!must[j]) gb_ref(c->b, gb_alt_new(c->b, cur[k]), next[k]);
            }
            next[0] = cur[0];
            next[1] = cur[1];
        }
        uint32_t r = gb_rule_new(c->b);
        gb_alt *a = gb_alt_new(c->b, r);
        gb_byte(c->b, a, '{');
        gb_ref(c->b, a, ws);
        gb_ref(c->b, a, next[0]);
        gb_ref(c->b, a, ws);
        gb_byte(c->b, a, '}');
        out = r;
    }
    free(key);
    free(val);
    free(must);
    return out;
}

static int64_t gen_array(ctx *c, const cJSON *node)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(node, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(node, "prefixItems");
    const cJSON *uniq = cJSON_GetObjectItemCaseSensitive(node, "uniqueItems");
    uint32_t mn = 0, mx = NONE;
    if (count_kw(c, node, "minItems", &mn) || count_kw(c, node, "maxItems", &mx)) return -1;
    if (uniq && !cJSON_IsFalse(uniq)) {
        size_t n = path_push(c, "uniqueItems");
        fail(c, "uniqueItems", "only uniqueItems false is supported");
        path_pop(c, n);
        return -1;
    }
    if (prefix && !cJSON_IsArray(prefix)) {
        size_t n = path_push(c, "prefixItems");
        fail(c, "prefixItems", "must be an array of schemas");
        path_pop(c, n);
        return -1;
    }
    size_t m = (size_t)cJSON_GetArraySize(prefix);
    if (m > LEN_MAX) return fail(c, "prefixItems", "at most 1024 entries are supported");
    uint32_t *pe = MUSE_CALLOC(m + 1, sizeof *pe);
    size_t i = 0;
    const cJSON *it;
    int rc = 0;
    size_t pn = path_push(c, "prefixItems");
    cJSON_ArrayForEach(it, prefix)
    {
        char seg[24];
        snprintf(seg, sizeof seg, "%zu", i);
        int64_t v = gen_sub(c, it, seg);
        if (v < 0) {
            rc = -1;
            break;
        }
        pe[i++] = (uint32_t)v;
    }
    path_pop(c, pn);
    int64_t item = -1;
    if (rc == 0) {
        if (cJSON_IsFalse(items)) {
            if (mx == NONE || mx > m) mx = (uint32_t)m;
        } else {
            item = items ? gen_sub(c, items, "items") : any_value(c);
            if (item < 0) rc = -1;
        }
    }
    if (rc == 0 && mn > mx) rc = fail(c, "minItems", "minItems is above what the array may hold");
    int64_t out = -1;
    if (rc == 0) {
        uint32_t ws = ws_rule(c);
        /* A(j): after j items. Beyond max(m, mn) with no maxItems: one loop rule. */
        size_t chain = mx != NONE ? mx : (m > mn ? m : mn);
        uint32_t loop = NONE;
        if (mx == NONE) {
            loop = gb_rule_new(c->b);
            gb_alt *a = gb_alt_new(c->b, loop);
            gb_ref(c->b, a, ws);
            gb_byte(c->b, a, ']');
            a = gb_alt_new(c->b, loop);
            gb_ref(c->b, a, ws);
            gb_byte(c->b, a, ',');
            gb_ref(c->b, a, ws);
            gb_ref(c->b, a, (uint32_t)item);
            gb_ref(c->b, a, loop);
        }
        uint32_t next = loop; /* A(chain) */
        if (mx != NONE) {
            next = gb_rule_new(c->b);
            gb_alt *a = gb_alt_new(c->b, next);
            gb_ref(c->b, a, ws);
            gb_byte(c->b, a, ']');
        }
        for (size_t j = chain; j-- > 1;) { /* A(j) for j = chain-1 .. 1 */
            uint32_t r = gb_rule_new(c->b);
            gb_alt *a;
            if (j >= mn) {
                a = gb_alt_new(c->b, r);
                gb_ref(c->b, a, ws);
                gb_byte(c->b, a, ']');
            }
            a = gb_alt_new(c->b, r);
            gb_ref(c->b, a, ws);
            gb_byte(c->b, a, ',');
            gb_ref(c->b, a, ws);
            gb_ref(c->b, a, j < m ? pe[j] : (uint32_t)item);
            gb_ref(c->b, a, next);
            next = r;
        }
        uint32_t r = gb_rule_new(c->b);
        gb_alt *a;
        if (mn == 0) {
            a = gb_alt_new(c->b, r);
            gb_byte(c->b, a, '[');
            gb_ref(c->b, a, ws);
            gb_byte(c->b, a, ']');
        }
        if (mx == NONE || mx >= 1) {
            a = gb_alt_new(c->b, r);
            gb_byte(c->b, a, '[');
            gb_ref(c->b, a, ws);
            gb_ref(c->b, a, m > 0 ? pe[0] : (uint32_t)item);
            gb_ref(c->b, a, chain >= 1 ? next : loop);
        }
        out = r;
    }
    free(pe);
    return out;
}

static int64_t gen_type(ctx *c, const cJSON *node, const char *t)
{
    uint32_t r;
    if (strcmp(t, "null") == 0) return rule_lit(c, "null", 4);
    if (strcmp(t, "boolean") == 0) {
        r = gb_rule_new(c->b);
        gb_lit(c->b, gb_alt_new(c->b, r), "true", 4);
        gb_lit(c->b, gb_alt_new(c->b, r), "false", 5);
        return r;
    }
    if (strcmp(t, "integer") == 0) return gen_integer(c, node);
    if (strcmp(t, "number") == 0) return gen_number(c, node);
    if (strcmp(t, "string") == 0) return gen_string(c, node);
    if (strcmp(t, "object") == 0) return gen_object(c, node);
    if (strcmp(t, "array") == 0) return gen_array(c, node);
    size_t n = path_push(c, "type");
    fail(c, "type", "must be null, boolean, integer, number, string, object or array");
    path_pop(c, n);
    return -1;
}

/* Keywords that only annotate: accepted and ignored. */
static const char *const annot[] = {"title", "description", "default",    "examples", "$schema",
                                    "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                    "$defs", "definitions", NULL};
static const char *const known[] = {"type",
                                    "properties",
                                    "required",
                                    "additionalProperties",
                                    "items",
                                    "prefixItems",
                                    "minItems",
                                    "maxItems",
                                    "enum",
                                    "const",
                                    "anyOf",
                                    "oneOf",
                                    "allOf",
                                    "$ref",
                                    "minLength",
                                    "maxLength",
                                    "format",
                                    "minimum",
                                    "maximum",
                                    "exclusiveMinimum",
                                    "exclusiveMaximum",
                                    "nullable",
                                    "uniqueItems",
                                    NULL};

static bool in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (strcmp(*l, s) == 0) return true;
    return false;
}

static int64_t gen_ref(ctx *c, const char *ref)
{
    for (size_t i = 0; i < c->nrefs; i++)
        if (strcmp(c->refs[i].ref, ref) == 0) return c->refs[i].rule;
    if (ref[0] != '#')
        return fail(c, "$ref", "only local references (#, #/$defs/...) are supported");
    const cJSON *t = c->root;
    char seg[128];
    for (const char *p = ref + 1; *p == '/' && t;) {
        size_t k = 0;
        for (p++; *p && *p != '/'; p++) {
            if (k + 1 >= sizeof seg) return fail(c, "$ref", "a reference segment is too long");
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[k++] = p[1] == '0' ? '~' : '/';
                p++;
            } else {
                seg[k++] = *p;
            }
        }
        seg[k] = '\0';
        if (cJSON_IsArray(t)) {
            char *end;
            long idx = strtol(seg, &end, 10);
            t = *end || k == 0 ? NULL : cJSON_GetArrayItem(t, (int)idx);
        } else {
            t = cJSON_GetObjectItemCaseSensitive(t, seg);
        }
        if (*p && *p != '/') t = NULL;
    }
    if (!t || (ref[1] && ref[1] != '/'))
        return fail(c, "$ref", "the reference names nothing in this schema");
    if (c->nrefs == c->refcap) {
        c->refcap = c->refcap ? c->refcap * 2 : 8;
        c->refs = realloc(c->refs, c->refcap * sizeof *c->refs);
        MUSE_CHECK(c->refs);
    }
    uint32_t r = gb_rule_new(c->b);
    c->refs[c->nrefs++] = (ref_memo){ref, r};
    char saved[sizeof c->path];
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref + 1);
    int64_t v = gen(c, t);
    memcpy(c->path, saved, sizeof saved);
    if (v < 0) return -1;
    gb_ref(c->b, gb_alt_new(c->b, r), (uint32_t)v);
    return r;
}

static int64_t gen_alts(ctx *c, const cJSON *list, const char *kw)
{
    size_t n = path_push(c, kw);
    int64_t r = -1;
    if (!cJSON_IsArray(list) || !list->child) {
        fail(c, kw, "must be a non-empty array of schemas");
    } else {
        r = gb_rule_new(c->b);
        size_t i = 0;
        for (const cJSON *it = list->child; it; it = it->next, i++) {
            char seg[24];
            snprintf(seg, sizeof seg, "%zu", i);
            int64_t v = gen_sub(c, it, seg);
            if (v < 0) {
                r = -1;
                break;
            }
            gb_ref(c->b, gb_alt_new(c->b, (uint32_t)r), (uint32_t)v);
        }
    }
    path_pop(c, n);
    return r;
}

static int64_t gen(ctx *c, const cJSON *node)
{
    if (c->b->full) return fail(c, "schema", "the schema compiles to too large a grammar");
    if (++c->depth > 64) {
        c->depth--;
        return fail(c, "schema", "schemas nest at most 64 deep");
    }
    int64_t r = -1;
    if (cJSON_IsTrue(node)) {
        r = any_value(c);
        goto out;
    }
    if (cJSON_IsFalse(node)) {
        fail(c, "false", "the schema false admits no value");
        goto out;
    }
    if (!cJSON_IsObject(node)) {
        fail(c, "schema", "a schema must be an object or a boolean");
        goto out;
    }
    const cJSON *k;
    size_t constraints = 0;
    for (k = node->child; k; k = k->next) {
        if (in_list(annot, k->string)) continue;
        if (!in_list(known, k->string)) {
            size_t n = path_push(c, k->string);
            fail(c, k->string,
                 "this keyword is not supported; docs/grammar.md lists the "
                 "supported keywords");
            path_pop(c, n);
            goto out;
        }
        constraints++;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(node, "$ref");
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(node, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(node, "enum");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(node, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(node, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(node, "allOf");
    const char *solo = ref   ? "$ref"
                       : cst ? "const"
                       : en  ? "enum"
                       : any ? "anyOf"
                       : one ? "oneOf"
                       : all ? "allOf"
                             : NULL;
    if (solo && constraints > 1) {
        /* these carry the whole constraint; another one beside it could go unchecked */
        bool only_type =
            constraints == 2 && cJSON_GetObjectItemCaseSensitive(node, "type") && (cst || en);
        if (!only_type) {
            size_t n = path_push(c, solo);
            fail(c, solo, "cannot be combined with other constraining keywords here");
            path_pop(c, n);
            goto out;
        }
    }
    if (ref) {
        size_t n = path_push(c, "$ref");
        r = cJSON_IsString(ref) ? gen_ref(c, ref->valuestring)
                                : fail(c, "$ref", "must be a string");
        path_pop(c, n);
        goto out;
    }
    if (cst) {
        r = literal(c, cst);
        goto out;
    }
    if (en) {
        size_t n = path_push(c, "enum");
        if (!cJSON_IsArray(en) || !en->child) {
            fail(c, "enum", "must be a non-empty array");
        } else {
            r = gb_rule_new(c->b);
            for (const cJSON *it = en->child; it; it = it->next) {
                char *s = cJSON_PrintUnformatted(it);
                if (s) gb_lit(c->b, gb_alt_new(c->b, (uint32_t)r), s, strlen(s));
                free(s);
            }
        }
        path_pop(c, n);
        goto out;
    }
    if (any || one) {
        r = gen_alts(c, any ? any : one, any ? "anyOf" : "oneOf");
        goto out;
    }
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1) {
            size_t n = path_push(c, "allOf");
            fail(c, "allOf", "only an allOf of one schema is supported");
            path_pop(c, n);
            goto out;
        }
        size_t n = path_push(c, "allOf");
        r = gen_sub(c, all->child, "0");
        path_pop(c, n);
        goto out;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(node, "type");
    const cJSON *nullable = cJSON_GetObjectItemCaseSensitive(node, "nullable");
    bool add_null = cJSON_IsTrue(nullable);
    const char *inferred = NULL;
    if (!type) {
        if (cJSON_GetObjectItemCaseSensitive(node, "properties") ||
            cJSON_GetObjectItemCaseSensitive(node, "required") ||
            cJSON_GetObjectItemCaseSensitive(node, "additionalProperties"))
            inferred = "object";
        else if (cJSON_GetObjectItemCaseSensitive(node, "items") ||
                 cJSON_GetObjectItemCaseSensitive(node, "prefixItems") ||
                 cJSON_GetObjectItemCaseSensitive(node, "minItems") ||
                 cJSON_GetObjectItemCaseSensitive(node, "maxItems"))
            inferred = "array";
        else if (cJSON_GetObjectItemCaseSensitive(node, "minLength") ||
                 cJSON_GetObjectItemCaseSensitive(node, "maxLength") ||
                 cJSON_GetObjectItemCaseSensitive(node, "format"))
            inferred = "string";
        else if (cJSON_GetObjectItemCaseSensitive(node, "minimum") ||
                 cJSON_GetObjectItemCaseSensitive(node, "maximum"))
            inferred = "number";
    }
    if (!type && !inferred) {
        r = any_value(c);
    } else if (inferred || cJSON_IsString(type)) {
        int64_t v = gen_type(c, node, inferred ? inferred : type->valuestring);
        if (v >= 0 && add_null) {
            r = gb_rule_new(c->b);
            gb_ref(c->b, gb_alt_new(c->b, (uint32_t)r), (uint32_t)v);
            gb_lit(c->b, gb_alt_new(c->b, (uint32_t)r), "null", 4);
        } else {
            r = v;
        }
    } else if (cJSON_IsArray(type) && type->child) {
        r = gb_rule_new(c->b);
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) {
                size_t n = path_push(c, "type");
                r = fail(c, "type", "must be a string or an array of strings");
                path_pop(c, n);
                break;
            }
            int64_t v = gen_type(c, node, t->valuestring);
            if (v < 0) {
                r = -1;
                break;
            }
            gb_ref(c->b, gb_alt_new(c->b, (uint32_t)r), (uint32_t)v);
        }
        if (r >= 0 && add_null) gb_lit(c->b, gb_alt_new(c->b, (uint32_t)r), "null", 4);
    } else {
        size_t n = path_push(c, "type");
        fail(c, "type", "must be a string or a non-empty array of strings");
        path_pop(c, n);
    }
out:
    c->depth--;
    if (r >= 0 && c->b->full)
        return fail(c, "schema", "the schema compiles to too large a grammar");
    return r;
}

/* One of the strings of a JSON array, byte for byte. */
static int64_t gen_literals(ctx *c, const cJSON *list)
{
    if (!cJSON_IsArray(list) || !list->child)
        return fail(c, "literals", "must be a non-empty array of strings");
    uint32_t r = gb_rule_new(c->b);
    const cJSON *it;
    cJSON_ArrayForEach(it, list)
    {
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return fail(c, "literals", "must be a non-empty array of non-empty strings");
        gb_lit(c->b, gb_alt_new(c->b, r), it->valuestring, strlen(it->valuestring));
    }
    return r;
}

/* A name fit for name="..." in ATEM: no quote, no '>' or '<', no control bytes. */
static bool atem_name(const char *s)
{
    if (!s[0]) return false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == '"' || *p == '<' || *p == '>') return false;
    return true;
}

/* Keywords a function's parameters schema may have at its top (it is always an object). */
static const char *const atem_top[] = {"type",  "properties",  "required", "additionalProperties",
                                       "$defs", "definitions", NULL};

/* The ATEM block of one call: <atem:function_calls>, the invoke of name, one parameter tag a
 * property in the schema's order (required ones always, optional ones or not), each value the
 * JSON its property's schema admits. */
static int64_t gen_atem(ctx *c, const cJSON *spec)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(spec, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(spec, "parameters");
    if (!cJSON_IsString(name) || !atem_name(name->valuestring))
        return fail(c, "name", "the function's name must be text without quotes or angle brackets");
    if (params && !cJSON_IsObject(params))
        return fail(c, "parameters", "must be a JSON Schema object of type object");
    c->root = params;
    c->atem = true;
    const cJSON *k, *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "type");
    for (k = params ? params->child : NULL; k; k = k->next) {
        if (in_list(annot, k->string) || in_list(atem_top, k->string)) continue;
        size_t n = path_push(c, k->string);
        fail(c, k->string,
             "is not supported at the top of a function's parameters (an object "
             "with properties, required, additionalProperties, $defs)");
        path_pop(c, n);
        return -1;
    }
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "object") == 0))
        return fail(c, "type", "a function's parameters must be of type object");
    if ((props && !cJSON_IsObject(props)) || (req && !cJSON_IsArray(req)))
        return fail(c, props && !cJSON_IsObject(props) ? "properties" : "required",
                    "properties must be an object and required an array of names");
    cJSON_ArrayForEach(k, req) if (!cJSON_IsString(k) ||
                                   !cJSON_GetObjectItemCaseSensitive(props, k->valuestring))
    {
        return fail(c, "required", "names a parameter without a schema in properties");
    }
    size_t n = 0;
    cJSON_ArrayForEach(k, props) n++;
    uint32_t *val = MUSE_CALLOC(n ? n : 1, sizeof *val);
    const cJSON **item = MUSE_CALLOC(n ? n : 1, sizeof *item);
    size_t i = 0;
    int rc = 0;
    cJSON_ArrayForEach(k, props)
    {
        size_t m = path_push(c, "properties");
        if (!atem_name(k->string)) {
            fail(c, "properties",
                 "a parameter's name must be text without quotes or angle brackets");
            path_pop(c, m);
            rc = -1;
            break;
        }
        char seg[96];
        snprintf(seg, sizeof seg, "%s", strpbrk(k->string, "/~") ? "(name)" : k->string);
        int64_t v = gen_sub(c, k, seg);
        path_pop(c, m);
        if (v < 0) {
            rc = -1;
            break;
        }
        item[i] = k;
        val[i++] = (uint32_t)v;
    }
    uint32_t next = gb_rule_new(c->b); /* after the last parameter */
    gb_alt_new(c->b, next);
    for (i = n; rc == 0 && i-- > 0;) {
        bool must = false;
        const cJSON *q;
        cJSON_ArrayForEach(q, req) if (strcmp(q->valuestring, item[i]->string) == 0) must = true;
        uint32_t r = gb_rule_new(c->b);
        gb_alt *a = gb_alt_new(c->b, r);
        gb_lit(c->b, a, "<atem:parameter name=\"", 22);
        gb_lit(c->b, a, item[i]->string, strlen(item[i]->string));
        gb_lit(c->b, a, "\">", 2);
        gb_ref(c->b, a, val[i]);
        gb_lit(c->b, a, "</atem:parameter>\n", 18);
        gb_ref(c->b, a, next);
        if (!must) gb_ref(c->b, gb_alt_new(c->b, r), next);
        next = r;
    }
    free(item);
    if (rc) {
        free(val);
        return -1;
    }
    free(val);
    uint32_t r = gb_rule_new(c->b);
    gb_alt *a = gb_alt_new(c->b, r);
    static const char open[] = "<atem:function_calls>\n<atem:invoke name=\"";
    static const char close[] = "</atem:invoke>\n</atem:function_calls>";
    gb_lit(c->b, a, open, sizeof open - 1);
    gb_lit(c->b, a, name->valuestring, strlen(name->valuestring));
    gb_lit(c->b, a, "\">\n", 3);
    gb_ref(c->b, a, next);
    gb_lit(c->b, a, close, sizeof close - 1);
    if (c->b->full) return fail(c, "parameters", "the schema compiles to too large a grammar");
    return r;
}

int64_t gram_schema_compile(gram_builder *b, const cJSON *schema, int kind, muse_gerr *err)
{
    ctx c = {.b = b, .root = schema, .err = err};
    c.ws = c.any = c.str = c.num = c.anyobj = c.anyarr = NONE;
    for (size_t i = 0; i < sizeof c.digits_any / sizeof c.digits_any[0]; i++)
        c.digits_any[i] = NONE;
    int64_t r;
    if (kind == MUSE_GRAMMAR_JSON_OBJECT)
        r = any_object(&c);
    else if (kind == MUSE_GRAMMAR_JSON_VALUE)
        r = any_value(&c);
    else if (kind == MUSE_GRAMMAR_LITERALS)
        r = gen_literals(&c, schema);
    else if (kind == MUSE_GRAMMAR_ATEM)
        r = gen_atem(&c, schema);
    else
        r = gen(&c, schema);
    free(c.refs);
    return r;
}
