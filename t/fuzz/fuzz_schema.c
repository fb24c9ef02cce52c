/* libFuzzer: the grammar engine over arbitrary schema text. The input is compiled as a JSON
 * Schema and as a function's parameters (ATEM) against a small synthetic vocabulary, then
 * walked a few steps: each step's mask is taken, an allowed token picked by the input's bytes
 * must advance, a token outside the mask must not. A refusal must name a keyword, a path and
 * a reason. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

#define STEPS 16

static muse_gvocab *vocab;
static size_t nv;

/* Every byte, JSON pieces and tokens that split UTF-8 characters, then short random runs
 * over a JSON alphabet (a fixed seed: the same vocabulary every run). Token 0 has no bytes. */
static void make_vocab(void)
{
    static const char *pieces[] = {
        "{\"",   "\":",       "\",",     "\"}",  "\"]",  "true",     "false",     "null",
        " \"",   "12",        "123",     "0.",   ".5",   "e+",       "-1",        "abc",
        "name",  "\"name\"",  "\": \"",  "},{",  "[{",   "}]",       "  ",        "\n  ",
        "\\n",   "\\u00",     "\\\"",    "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82",  "\xf0\x9f\x98",
        "2024-", "01-",       "T12:",    ":00Z", "@",    ".com",     "00000000-", "abcd",
        ", ",    "[]",        "{}",      "\"\"", "1e5",  "99",       "<atem:",    "\">\n",
        "</",    "parameter", "\\u003c", NULL};
    static const char alpha[] = "{}[]\":, 0123456789.-+eEtrufalsn\\abcxyz<>\n";
    size_t np = 0;
    while (pieces[np]) np++;
    enum { NRAND = 200 };
    nv = 1 + 256 + np + NRAND;
    uint8_t **b = calloc(nv, sizeof *b);
    size_t *l = calloc(nv, sizeof *l);
    size_t k = 1;
    for (int c = 0; c < 256; c++, k++) {
        b[k] = malloc(1);
        b[k][0] = (uint8_t)c;
        l[k] = 1;
    }
    for (size_t i = 0; i < np; i++, k++) {
        l[k] = strlen(pieces[i]);
        b[k] = malloc(l[k]);
        memcpy(b[k], pieces[i], l[k]);
    }
    uint32_t r = 7;
    for (size_t i = 0; i < NRAND; i++, k++) {
        r = r * 1103515245u + 12345u;
        l[k] = 1 + (r >> 16) % 6;
        b[k] = malloc(l[k]);
        for (size_t j = 0; j < l[k]; j++) {
            r = r * 1103515245u + 12345u;
            b[k][j] = (uint8_t)alpha[(r >> 16) % (sizeof alpha - 1)];
        }
    }
    vocab = muse_gvocab_build((const uint8_t *const *)b, l, nv);
    for (size_t i = 0; i < nv; i++) free(b[i]);
    free(b);
    free(l);
}

static int bit(const uint8_t *m, size_t t)
{
    return (m[t >> 3] >> (t & 7)) & 1;
}

/* Compiles text as kind; on success walks STEPS steps with tokens picked by data's bytes. */
static void one(int kind, const char *text, size_t len, const uint8_t *data, size_t size)
{
    muse_grammar *g = (muse_grammar *)1;
    muse_gerr e;
    memset(&e, 0x5a, sizeof e); /* compile must fill it */
    if (muse_grammar_compile(kind, text, len, vocab, &g, &e) != 0) {
        if (g || !e.keyword[0] || !e.path[0] || !e.msg[0] ||
            !memchr(e.keyword, 0, sizeof e.keyword) || !memchr(e.path, 0, sizeof e.path) ||
            !memchr(e.msg, 0, sizeof e.msg))
            __builtin_trap(); /* a refusal says what, where and why */
        return;
    }
    if (!g) __builtin_trap();
    muse_gstate *s = muse_gstate_new(g);
    uint8_t *mask = malloc((nv + 7) / 8);
    size_t *allowed = malloc(nv * sizeof *allowed);
    for (size_t step = 0; step < STEPS && !muse_gstate_dead(s); step++) {
        muse_gstate_mask(s, mask);
        size_t na = 0, no = SIZE_MAX;
        for (size_t t = 0; t < nv; t++) {
            if (bit(mask, t))
                allowed[na++] = t;
            else if (no == SIZE_MAX && t > 0 && t % 7 == step % 7)
                no = t;
        }
        if (bit(mask, 0)) __builtin_trap(); /* a token without bytes is never allowed */
        if (no != SIZE_MAX) {               /* outside the mask: refused, the state as it was */
            muse_gstate *c = muse_gstate_copy(s);
            if (muse_gstate_advance(c, (int32_t)no) == 0) __builtin_trap();
            muse_gstate_free(c);
        }
        if (na == 0) break;
        uint8_t pick = size ? data[(step * 13 + 1) % size] : 0;
        if (muse_gstate_done(s) && pick % 5 == 0) break;
        size_t t = allowed[((size_t)pick * 31 + step) % na];
        if (muse_gstate_advance(s, (int32_t)t) != 0) __builtin_trap(); /* the mask promised it */
        if (muse_gstate_dead(s) && !muse_gstate_done(s)) __builtin_trap();
    }
    free(allowed);
    free(mask);
    muse_gstate_free(s);
    muse_grammar_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!vocab) make_vocab();
    if (size > 1 << 16) return 0;
    one(MUSE_GRAMMAR_JSON_SCHEMA, (const char *)data, size, data, size);
    /* the same text as a function's parameters (the tools path) */
    static const char pre[] = "{\"name\":\"f\",\"parameters\":";
    char *t = malloc(sizeof pre + size + 1);
    memcpy(t, pre, sizeof pre - 1);
    memcpy(t + sizeof pre - 1, data, size);
    t[sizeof pre - 1 + size] = '}';
    one(MUSE_GRAMMAR_ATEM, t, sizeof pre + size, data, size);
    free(t);
    /* canonical text (the cache's key) compiles like the original */
    char *canon = muse_grammar_canonical((const char *)data, size);
    free(canon);
    return 0;
}
