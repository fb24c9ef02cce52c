/* serve/request.c reads integer fields from their own text, exactly, whatever the module sent:
 * seeds past 2^53 and up to 2^64 - 1, negative seeds as 2^64 + s, max_tokens, top_k and token
 * ids; anything past the range, fractional or not RFC 8259 number text is a 400 naming the field.
 */
#include <stdint.h>

#include "abi/muse_ring.h"
#include "serve/request.h"
#include "tap.h"

#include <stdlib.h>

static muse_tokenizer *tok;

static muse_gvocab *gv;
static int masks_on = 1;
static const muse_gvocab *get_gv(void *ctx)
{
    (void)ctx;
    if (!gv) {
        int64_t V = muse_tokenizer_vocab_size(tok);
        const uint8_t **b = calloc((size_t)V, sizeof *b);
        size_t *n = calloc((size_t)V, sizeof *n);
        for (int64_t i = 0; i < V; i++) b[i] = muse_tokenizer_token_bytes(tok, (int32_t)i, &n[i]);
        gv = muse_gvocab_build(b, n, (size_t)V);
        free(b);
        free(n);
    }
    return gv;
}

static int parse(const char *body, muse_gen_request *r, muse_api_error *err)
{
    muse_request_env env = {NULL, tok, NULL, 100, 5, get_gv, NULL, masks_on};
    return muse_request_parse(&env, MUSE_KIND_COMPLETIONS, 0, body, strlen(body), r, err);
}

/* A completions body with one more field; the seed the request runs with, or -1 refused. */
static void seed_is(const char *text, uint64_t want)
{
    char body[256];
    muse_gen_request r;
    muse_api_error err;
    snprintf(body, sizeof body, "{\"prompt\":[1,2],\"seed\":%s}", text);
    int rc = parse(body, &r, &err);
    ok(rc == 0 && r.seed_given && r.sampling.seed == want, "seed %s runs as %llu", text,
       (unsigned long long)want);
    if (rc) diag("%s", err.message);
    if (rc == 0) {
        if (r.sampling.seed != want) diag("got %llu", (unsigned long long)r.sampling.seed);
        muse_request_free(&r);
    }
}

static void refused(const char *body, const char *param, const char *what)
{
    muse_gen_request r;
    muse_api_error err;
    int rc = parse(body, &r, &err);
    ok(rc == -1 && err.status == 400 && strcmp(err.param, param) == 0, "%s: 400 naming %s", what,
       param);
    if (rc == 0) muse_request_free(&r);
}

/* response_format: none, json_object, json_schema; bad schemas name the keyword and path. */
static void test_response_format(void)
{
    static const struct {
        const char *rf;
        int status; /* 0: parsed */
        int constrained;
        const char *param, *in_msg;
    } c[] = {
        {"{\"type\":\"text\"}", 0, 0, NULL, NULL},
        {"null", 0, 0, NULL, NULL},
        {"{\"type\":\"json_object\"}", 0, 1, NULL, NULL},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"strict\":true,"
         "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}",
         0, 1, NULL, NULL},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"properties\":{\"a\":{"
         "\"type\":\"string\",\"pattern\":\"x\"}}}}}",
         400, 0, "response_format.json_schema.schema",
         "keyword 'pattern' at '/properties/a/pattern'"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"x<y\":1}}}", 400, 0,
         "response_format.json_schema.schema", "keyword '(not shown)' at '(not shown)'"},
        {"{\"type\":\"json_schema\"}", 400, 0, "response_format.json_schema", "must be an object"},
        {"{\"type\":\"yaml\"}", 400, 0, "response_format.type", "json_schema"},
        {"7", 400, 0, "response_format", "must be an object"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\":\"hi\",\"response_format\":%s}", c[i].rf);
        muse_gen_request r;
        muse_api_error err;
        int rc = parse(body, &r, &err);
        if (c[i].status == 0) {
            ok(rc == 0, "response_format %s parses (%s)", c[i].rf, rc ? err.message : "");
            ok((r.grammar != NULL) == c[i].constrained, "constrained: %d", c[i].constrained);
            if (rc == 0) muse_request_free(&r);
        } else {
            ok(rc == -1 && err.status == c[i].status, "response_format %s refused", c[i].rf);
            is_str(err.param, c[i].param, "param");
            ok(strstr(err.message, c[i].in_msg) != NULL, "message says %s: %s", c[i].in_msg,
               err.message);
        }
    }
    masks_on = 0;
    muse_gen_request r;
    muse_api_error err;
    ok(parse("{\"prompt\":\"hi\",\"response_format\":{\"type\":\"json_object\"}}", &r, &err) ==
               -1 &&
           strstr(err.message, "token masks"),
       "a backend without masks refuses constraints: %s", err.message);
    masks_on = 1;
}

int main(void)
{
    muse_err e = {{0}};
    if (muse_tokenizer_load("t/data/tokenizer_tiny.json", &tok, &e) != 0) {
        ok(0, "load t/data/tokenizer_tiny.json: %s", e.msg);
        return done_testing();
    }
    test_response_format();
    seed_is("0", 0);
    seed_is("9007199254740991", 9007199254740991ull);
    seed_is("9007199254740993", 9007199254740993ull);
    seed_is("8000000000000001", 8000000000000001ull);
    seed_is("9223372036854775807", 9223372036854775807ull);
    seed_is("18446744073709551615", UINT64_MAX);
    seed_is("-1", UINT64_MAX);
    seed_is("-9223372036854775808", 1ull << 63);
    seed_is("1e3", 1000);
    seed_is("12.50e1", 125);
    seed_is("-0", 0);

    muse_gen_request r;
    muse_api_error err;
    ok(parse("{\"prompt\":[1,2]}", &r, &err) == 0 && !r.seed_given && r.sampling.seed == 5,
       "no seed: the default");
    muse_request_free(&r);

    refused("{\"prompt\":[1,2],\"seed\":18446744073709551616}", "seed", "seed 2^64");
    parse("{\"prompt\":[1,2],\"seed\":18446744073709551616}", &r, &err);
    ok(strstr(err.message, "-9223372036854775808 to 18446744073709551615") != NULL,
       "the seed's message names the range");
    refused("{\"prompt\":[1,2],\"seed\":-9223372036854775809}", "seed", "seed -2^63 - 1");
    refused("{\"prompt\":[1,2],\"seed\":1.5}", "seed", "seed 1.5");
    refused("{\"prompt\":[1,2],\"seed\":02}", "seed",
            "seed 02 (cJSON reads it, the text is not JSON)");
    refused("{\"prompt\":[1,2],\"seed\":\"7\"}", "seed", "seed as a string");

    /* the walk follows cJSON on any input: its whitespace (any byte <= 32), escaped keys */
    ok(parse("{\x01\"prompt\"\x02:\x03[1,\x1f 2]\x04,\"s\\u0065ed\"\x05:\x06 9007199254740993\x07}",
             &r, &err) == 0 &&
           r.sampling.seed == 9007199254740993ull && r.n_prompt == 2 && r.prompt[1] == 2,
       "control bytes as whitespace and an escaped key: the seed's own text is read");
    muse_request_free(&r);
    ok(parse("{\"user\":\"\\\"seed\\\":1,\",\"x\":[{\"seed\":3}],\"seed\":7,\"prompt\":[1]}", &r,
             &err) == 0 &&
           r.sampling.seed == 7,
       "quotes and the name inside strings and nested objects do not move the walk");
    muse_request_free(&r);

    /* other integers */
    ok(parse("{\"prompt\":[1,2.0,3e0,0.4e1],\"max_tokens\":2.0e1,\"top_k\":10}", &r, &err) == 0 &&
           r.n_prompt == 4 && r.prompt[1] == 2 && r.prompt[2] == 3 && r.prompt[3] == 4 &&
           r.max_tokens == 20 && r.sampling.top_k == 10,
       "integers written as 2.0, 3e0 and 0.4e1 read as such");
    muse_request_free(&r);
    refused("{\"prompt\":[1,2],\"max_tokens\":2147483648}", "max_tokens", "max_tokens 2^31");
    refused("{\"prompt\":[1,2],\"max_tokens\":1e999}", "max_tokens", "max_tokens 1e999");
    refused("{\"prompt\":[1,2],\"max_tokens\":1.5}", "max_tokens", "max_tokens 1.5");
    refused("{\"prompt\":[1,2],\"max_tokens\":0}", "max_tokens", "max_tokens 0");
    refused("{\"prompt\":[1,2],\"max_completion_tokens\":-3}", "max_completion_tokens",
            "max_completion_tokens -3");
    refused("{\"prompt\":[1,2],\"top_k\":1073741825}", "top_k", "top_k past its limit");
    refused("{\"prompt\":[1,2],\"top_k\":18446744073709551617}", "top_k", "top_k 2^64 + 1");
    refused("{\"prompt\":[1,2.5]}", "prompt", "a fractional token id");
    refused("{\"prompt\":[1,100000]}", "prompt", "a token id past the vocabulary");
    refused("{\"prompt\":[1,4294967297]}", "prompt",
            "token id 2^32 + 1 (an int32 cast would wrap)");
    refused("{\"prompt\":[1,-0.5]}", "prompt", "a negative token id");

    muse_tokenizer_free(tok);
    return done_testing();
}
