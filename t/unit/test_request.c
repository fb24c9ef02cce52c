/* serve/request.c reads integer fields from their own text, exactly, whatever the module sent:
 * seeds past 2^53 and up to 2^64 - 1, negative seeds as 2^64 + s, max_tokens, top_k and token
 * ids; anything past the range, fractional or not RFC 8259 number text is a 400 naming the field.
 */
#include <stdint.h>

#include "abi/muse_ring.h"
#include "serve/request.h"
#include "tap.h"

static muse_tokenizer *tok;

static int parse(const char *body, muse_gen_request *r, muse_api_error *err)
{
    muse_request_env env = {NULL, tok, NULL, 100, 5};
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

int main(void)
{
    muse_err e = {{0}};
    if (muse_tokenizer_load("t/data/tokenizer_tiny.json", &tok, &e) != 0) {
        ok(0, "load t/data/tokenizer_tiny.json: %s", e.msg);
        return done_testing();
    }
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
