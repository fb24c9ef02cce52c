/* The module's pure validator (ngx_muse_validate.c, built here without nginx): RFC 8259 strict
 * JSON with the byte offset of the first error, the item and depth limits, and integer fields
 * read exactly from their text (seed, max_tokens, top_k, n, best_of, token ids). */
#include <stdlib.h>

#include "ngx_muse_validate.h"
#include "tap.h"

static const ngx_muse_vconf_t CHAT = {NGX_MUSE_V_CHAT, "muse-spark", 10, 1 << 20};
static const ngx_muse_vconf_t COMPL = {NGX_MUSE_V_COMPLETIONS, "muse-spark", 10, 1 << 20};

static int check(const char *text, size_t max, ngx_muse_verr_t *err)
{
    memset(err, 0, sizeof *err);
    return ngx_muse_json_check((const unsigned char *)text, strlen(text), max, err);
}

static void accepts(const char *text)
{
    ngx_muse_verr_t err;
    int rc = check(text, 1 << 20, &err);
    char shown[80];
    size_t i;
    for (i = 0; text[i] && i + 1 < sizeof shown; i++)
        shown[i] = (unsigned char)text[i] < 0x20 ? '.' : text[i];
    shown[i] = '\0';
    ok(rc == 0, "valid JSON accepted: %s", shown);
    if (rc) diag("%s", err.message);
}

/* Refused as a syntax error (code invalid_json) at offset, the message naming that offset. */
static void refuses_at(const char *text, size_t len, size_t offset, const char *what)
{
    ngx_muse_verr_t err;
    memset(&err, 0, sizeof err);
    int rc = ngx_muse_json_check((const unsigned char *)text, len, 1 << 20, &err);
    char want[64];
    snprintf(want, sizeof want, "byte offset %zu ", offset);
    ok(rc == -1 && err.status == 400 && err.code && strcmp(err.code, "invalid_json") == 0 &&
           err.offset == offset && strstr(err.message, want) != NULL,
       "%s: invalid_json at byte offset %zu", what, offset);
    if (rc != -1 || err.offset != offset)
        diag("rc %d, offset %zu, message %s", rc, err.offset, rc ? err.message : "-");
}

#define REFUSES_AT(text, offset, what) refuses_at(text, sizeof(text) - 1, offset, what)

/* The whole validator on a body: 0, or -1 with err. */
static int body(const ngx_muse_vconf_t *vc, const char *text, ngx_muse_verr_t *err)
{
    uint32_t flags;
    memset(err, 0, sizeof *err);
    return ngx_muse_validate_body(vc, (const unsigned char *)text, strlen(text), &flags, err);
}

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

/* A chat body with one more field: accepted or refused naming the field. */
static void field(const char *name, const char *value, int want_ok)
{
    char text[512];
    ngx_muse_verr_t err;
    snprintf(text, sizeof text, "{" MSG ",\"%s\":%s}", name, value);
    int rc = body(&CHAT, text, &err);
    if (want_ok) {
        ok(rc == 0, "%s %s accepted", name, value);
        if (rc) diag("%s", err.message);
    } else {
        ok(rc == -1 && err.status == 400 && strcmp(err.param, name) == 0, "%s %s refused naming %s",
           name, value, name);
        if (rc == 0) diag("accepted");
    }
}

static void prompt(const char *ids, int want_ok)
{
    char text[512];
    ngx_muse_verr_t err;
    snprintf(text, sizeof text, "{\"prompt\":%s}", ids);
    int rc = body(&COMPL, text, &err);
    ok(want_ok ? rc == 0 : rc == -1 && strcmp(err.param, "prompt") == 0, "prompt %s %s", ids,
       want_ok ? "accepted" : "refused naming prompt");
}

int main(void)
{
    ngx_muse_verr_t err;

    /* RFC 8259 texts that must pass */
    accepts("{}");
    accepts("[]");
    accepts("0");
    accepts("-0");
    accepts("-0.0e+00");
    accepts("1.5E-3");
    accepts("\"\"");
    accepts("\"a\\u00e9\\ud83d\\ude00\\\"\\\\\\/\\b\\f\\n\\r\\t\"");
    accepts(" \t\r\n{ \"a\" : [ 1 , 2 , { \"b\" : null } ] , \"c\":true,\"d\":false } \n");
    accepts("[\"\xc3\xa9\"]");
    accepts("{\"\":0}");

    /* everything else the RFC forbids, each at its byte */
    REFUSES_AT("{\"max_tokens\": 02}", 16, "leading zero");
    REFUSES_AT("-01", 2, "leading zero after a minus");
    REFUSES_AT("{\"max_tokens\": 2.}", 17, "trailing dot");
    REFUSES_AT("2.", 2, "trailing dot at the end");
    REFUSES_AT(".5", 0, "leading dot");
    REFUSES_AT("+1", 0, "plus sign");
    REFUSES_AT("-", 1, "bare minus");
    REFUSES_AT("-a", 1, "minus then a letter");
    REFUSES_AT("1e", 2, "exponent without digits");
    REFUSES_AT("1e+", 3, "signed exponent without digits");
    REFUSES_AT("0x10", 1, "hex number");
    REFUSES_AT("[1,]", 3, "trailing comma in an array");
    REFUSES_AT("{\"a\":1,}", 7, "trailing comma in an object");
    REFUSES_AT("[,1]", 1, "leading comma");
    REFUSES_AT("[1 2]", 3, "missing comma");
    REFUSES_AT("{\"a\" 1}", 5, "missing colon");
    REFUSES_AT("{1:2}", 1, "number as a key");
    REFUSES_AT("{'a':1}", 1, "single quotes");
    REFUSES_AT("\"a\nb\"", 2, "raw newline in a string");
    REFUSES_AT("\"a\x01\"", 2, "raw control byte in a string");
    REFUSES_AT("\"a\tb\"", 2, "raw tab in a string");
    REFUSES_AT("\"a\x1f\"", 2, "raw 0x1f in a string");
    REFUSES_AT("\"\\x\"", 2, "invalid escape");
    REFUSES_AT("\"\\'\"", 2, "escaped single quote");
    REFUSES_AT("\"\\u12\"", 2, "short \\u escape");
    REFUSES_AT("\"\\u12g4\"", 2, "non-hex \\u escape");
    REFUSES_AT("\"ab\\ud800\"", 3, "lone high surrogate");
    REFUSES_AT("\"\\udc00\"", 1, "lone low surrogate");
    REFUSES_AT("\"\\ud800\\u0041\"", 1, "high surrogate then no low one");
    REFUSES_AT("\"abc", 4, "unterminated string");
    REFUSES_AT("\"abc\\", 5, "unterminated string after a backslash");
    REFUSES_AT("tru", 0, "truncated literal");
    REFUSES_AT("True", 0, "capitalised literal");
    REFUSES_AT("NaN", 0, "NaN");
    REFUSES_AT("-Infinity", 1, "-Infinity");
    REFUSES_AT("[", 1, "open array");
    REFUSES_AT("{\"a\":", 5, "missing value");
    REFUSES_AT("1 x", 2, "trailing bytes");
    REFUSES_AT("{} {}", 3, "two values");
    REFUSES_AT(" ", 1, "whitespace only");
    REFUSES_AT("\xef\xbb\xbf{}", 0, "byte order mark");
    REFUSES_AT("\x0b{}", 0, "vertical tab is not JSON whitespace");
    REFUSES_AT("{\"a\":1}\x00", 7, "NUL after the value");
    REFUSES_AT("[\x80]", 1, "non-ASCII outside a string");
    REFUSES_AT("/* c */{}", 0, "comment");

    /* the policies at the same scan */
    ok(check("[\"a\\u0000\"]", 1 << 20, &err) == -1 && err.offset == 3 && err.code == NULL &&
           strstr(err.message, "NUL characters are not allowed") &&
           strstr(err.message, "byte offset 3"),
       "\\u0000 refused as NUL, naming its offset");
    ok(check("[\"a\\\\u0000\"]", 1 << 20, &err) == 0, "an escaped backslash before u0000 is text");
    char deep[512];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    deep[400] = '\0';
    ok(check(deep, 1 << 20, &err) == 0, "200 levels pass");
    memset(deep, '[', 201);
    memset(deep + 201, ']', 201);
    deep[402] = '\0';
    ok(check(deep, 1 << 20, &err) == -1 && strstr(err.message, "deeper than 200 levels"),
       "201 levels refused");
    memset(deep, '[', 300); /* refused by depth before the missing brackets matter */
    deep[300] = '\0';
    ok(check(deep, 1 << 20, &err) == -1 && strstr(err.message, "deeper than 200"),
       "300 open brackets: the depth is the error");
    ok(check("{\"a\":[1,2]}", 5, &err) == 0, "5 items (a key and 4 values) pass a limit of 5");
    ok(check("{\"a\":[1,2]}", 4, &err) == -1 && strstr(err.message, "muse_max_json_values"),
       "... and not a limit of 4");

    /* the whole validator: syntax errors come back as 400 invalid_json */
    ok(body(&CHAT, "{" MSG "}", &err) == 0, "a plain chat body passes");
    const char *lz = "{" MSG ",\"max_tokens\": 02}";
    ok(body(&CHAT, lz, &err) == -1 && err.status == 400 && err.code &&
           strcmp(err.code, "invalid_json") == 0 &&
           err.offset == (size_t)(strstr(lz, "02") - lz) + 1,
       "a leading zero in a chat body: 400 invalid_json at its offset");
    const char *nl = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}";
    ok(body(&CHAT, nl, &err) == -1 && err.offset == (size_t)(strchr(nl, '\n') - nl) &&
           strstr(err.message, "raw newline"),
       "a raw newline in content: 400 naming its offset");
    ok(ngx_muse_validate_body(&CHAT, (const unsigned char *)"{" MSG "}\0 ", strlen("{" MSG "}") + 2,
                              &(uint32_t){0}, &err) == -1 &&
           err.offset == strlen("{" MSG "}") && strstr(err.message, "NUL"),
       "a raw NUL byte: refused with its offset");
    ok(body(&CHAT, "", &err) == -1 && strstr(err.message, "empty"), "empty body");
    ok(body(&CHAT, "[]", &err) == -1 && strstr(err.message, "must be a JSON object"),
       "an array body");
    ok(body(&CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", &err) == -1 &&
           strcmp(err.param, "messages") == 0,
       "invalid UTF-8 is still named by its field");

    /* seeds: [-2^63, 2^64 - 1], exact */
    field("seed", "0", 1);
    field("seed", "9007199254740991", 1);
    field("seed", "9007199254740993", 1);
    field("seed", "8000000000000001", 1);
    field("seed", "9223372036854775807", 1);
    field("seed", "18446744073709551615", 1);
    field("seed", "-1", 1);
    field("seed", "-9223372036854775808", 1);
    field("seed", "1e3", 1);
    field("seed", "12.0", 1);
    field("seed", "1.8e19", 1);
    field("seed", "1844674407370955161.5e1", 1);
    field("seed", "18446744073709551616", 0);
    field("seed", "18446744073709551615.5", 0);
    field("seed", "1e20", 0);
    field("seed", "-9223372036854775809", 0);
    field("seed", "1.5", 0);
    field("seed", "1e-1", 0);
    field("seed", "\"7\"", 0);
    field("seed", "null", 0);
    field("seed", "99999999999999999999999999999999999999", 0);
    {
        char text[256];
        snprintf(text, sizeof text, "{" MSG ",\"seed\":18446744073709551616}");
        body(&CHAT, text, &err);
        ok(strstr(err.message, "-9223372036854775808 to 18446744073709551615") != NULL,
           "the seed's message names the range");
    }
    /* other integer fields */
    field("max_tokens", "2147483647", 1);
    field("max_tokens", "2.0e0", 1);
    field("max_tokens", "0.5e1", 1);
    field("max_tokens", "100e-2", 1);
    field("max_tokens", "2147483648", 0);
    field("max_tokens", "1e308", 0);
    field("max_tokens", "1e999", 0);
    field("max_tokens", "-0", 0);
    field("max_tokens", "0", 0);
    field("max_tokens", "123e-1", 0);
    field("max_tokens", "1e-1000000000000", 0);
    field("max_completion_tokens", "9223372036854775807", 0);
    field("max_completion_tokens", "16", 1);
    field("top_k", "1073741824", 1);
    field("top_k", "0", 1);
    field("top_k", "1073741825", 0);
    field("top_k", "4294967296", 0);
    field("top_k", "-1", 0);
    field("n", "1", 1);
    field("n", "1.0", 1);
    field("n", "2", 0);
    field("n", "4294967297", 0);
    field("n", "18446744073709551617", 0);
    field("temperature", "0.7", 1);
    field("temperature", "2.5", 0);
    {
        /* a member named with escapes is still found: its text is read, not a neighbour's */
        ngx_muse_verr_t e2;
        ok(body(&CHAT, "{" MSG ",\"s\\u0065ed\":18446744073709551616}", &e2) == -1 &&
               strcmp(e2.param, "seed") == 0,
           "an escaped key names the same field");
        ok(body(&CHAT, "{\"user\":\"seed\",\"seed\":7," MSG "}", &e2) == 0,
           "a string value seed does not confuse the field walk");
        ok(body(&CHAT, "{\"x\":[1,{\"seed\":1.5}],\"seed\":7," MSG "}", &e2) == 0,
           "nested members of the same name are not the field");
        ok(body(&CHAT, "{\"x\":[1,{\"seed\":7}],\"seed\":1.5," MSG "}", &e2) == -1 &&
               strcmp(e2.param, "seed") == 0,
           "... and the field is still checked");
    }
    prompt("[1, 2.0, 3e0, 0, 2147483647]", 1);
    prompt("[1.5]", 0);
    prompt("[2147483648]", 0);
    prompt("[-1]", 0);
    prompt("[1, 9007199254740993]", 0);
    prompt("[[1]]", 0);
    prompt("[ 1 , 2 ]", 1);
    {
        ngx_muse_verr_t e2;
        ok(body(&COMPL, "{\"prompt\":[1,2],\"best_of\":1.0}", &e2) == 0, "best_of 1.0 passes");
        ok(body(&COMPL, "{\"prompt\":[1,2],\"best_of\":18446744073709551617}", &e2) == -1 &&
               strcmp(e2.param, "best_of") == 0,
           "best_of 2^64 + 1 refused");
    }
    /* a long prompt of token ids: each read from its text */
    {
        size_t n = 100000, cap = n * 8 + 64, at = 0;
        char *big = malloc(cap);
        at += (size_t)snprintf(big + at, cap - at, "{\"prompt\":[");
        for (size_t i = 0; i < n; i++)
            at += (size_t)snprintf(big + at, cap - at, "%s%zu", i ? "," : "", i * 7 % 100000);
        snprintf(big + at, cap - at, "]}");
        ok(body(&COMPL, big, &err) == 0, "100000 token ids pass");
        big[at - 1] = '5'; /* the last id 99993 becomes 999935 */
        ok(body(&COMPL, big, &err) == 0, "... still in range");
        memcpy(big + at - 6, ".5", 2);
        ok(body(&COMPL, big, &err) == -1 && strcmp(err.param, "prompt") == 0,
           "... and the last one made 99.593: refused");
        free(big);
    }
    return done_testing();
}
