/* engine/grammar: schemas against accepted and rejected texts, keyword errors naming the
 * path, and every mask against a brute-force check of each token on random walks. */
#include "tap.h"

#include <limits.h>
#include <stdlib.h>

#include "grammar/frame.h"
#include "grammar/grammar.h"

static muse_gvocab *vocab;
static size_t nv;
static uint8_t **tb;
static size_t *tl;

/* Every single byte, JSON-ish pieces, byte-level BPE style tokens that split UTF-8
 * characters, and random strings over a JSON alphabet. Token 0 is a special (no bytes). */
static void make_vocab(void)
{
    static const char *pieces[] = {"{\"",      "\":",      "\",",      "\"}",          "\"]",
                                   "true",     "false",    "null",     " \"",          "12",
                                   "123",      "0.",       ".5",       "e+",           "-1",
                                   "abc",      "name",     "\"name\"", "\"name\":\"",  "\": \"",
                                   "},{",      "[{",       "}]",       "  ",           "\n  ",
                                   "\\n",      "\\u00",    "\\\"",     "\xc3",         "\xa9",
                                   "\xc3\xa9", "\xe2\x82", "\xac\"",   "\xf0\x9f\x98", "\x80",
                                   "2024-",    "01-",      "-01",      "T12:",         ":00Z",
                                   "@",        ".com",     "a@b",      "00000000-",    "abcd",
                                   ", ",       "[]",       "{}",       "\"\"",         "1e5",
                                   "99",       "100",      ",\"",      "\"x\"",        NULL};
    size_t np = 0;
    while (pieces[np]) np++;
    size_t nrand = 600;
    nv = 1 + 256 + np + nrand;
    tb = calloc(nv, sizeof *tb);
    tl = calloc(nv, sizeof *tl);
    size_t k = 1;
    for (int b = 0; b < 256; b++, k++) {
        tb[k] = malloc(1);
        tb[k][0] = (uint8_t)b;
        tl[k] = 1;
    }
    for (size_t i = 0; i < np; i++, k++) {
        tl[k] = strlen(pieces[i]);
        tb[k] = malloc(tl[k]);
        memcpy(tb[k], pieces[i], tl[k]);
    }
    static const char alpha[] = "{}[]\":, 0123456789.-+eEtrufalsn\\abcxyz\n";
    srand(7);
    for (size_t i = 0; i < nrand; i++, k++) {
        tl[k] = 1 + (size_t)rand() % 6;
        tb[k] = malloc(tl[k]);
        for (size_t j = 0; j < tl[k]; j++) tb[k][j] = (uint8_t)alpha[rand() % (sizeof alpha - 1)];
    }
    vocab = muse_gvocab_build((const uint8_t *const *)tb, tl, nv);
}

static muse_grammar *compile(const char *schema)
{
    muse_grammar *g = NULL;
    muse_gerr e;
    if (muse_grammar_compile(MUSE_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), vocab, &g, &e))
        diag("compile failed: %s at %s: %s", e.keyword, e.path, e.msg);
    return g;
}

static int accepts(muse_grammar *g, const char *text)
{
    muse_gstate *s = muse_gstate_new(g);
    int r = muse_gstate_advance_bytes(s, (const uint8_t *)text, strlen(text)) == 0 &&
            muse_gstate_done(s);
    muse_gstate_free(s);
    return r;
}

typedef struct {
    const char *schema;
    const char *yes[8];
    const char *no[8];
} cases;

static const cases table[] = {
    {"{\"type\":\"integer\"}", {"0", "-12", "123456"}, {"01", "1.5", "\"1\"", "-", "+1"}},
    {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":120}",
     {"5", "9", "10", "99", "100", "120"},
     {"4", "121", "0", "-5", "200", "1000", "05"}},
    {"{\"type\":\"integer\",\"minimum\":-20,\"maximum\":-3}",
     {"-3", "-20", "-15"},
     {"-2", "-21", "0", "3"}},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", {"1", "77"}, {"0", "-1"}},
    {"{\"type\":\"number\"}", {"0", "-1.25", "3e5", "1E-2", "0.0"}, {"1.", ".5", "--1", "1e"}},
    {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
     {"0", "0.5", "1", "1.0", "0.999"},
     {"1.5", "-0.1", "2", "1.01"}},
    {"{\"type\":\"string\"}",
     {"\"\"", "\"abc\"", "\"\\n\\u00e9\"", "\"\xc3\xa9\""},
     {"abc", "\"\\x\"", "\"\\ud800\"", "\"\xc3\"", "\"\x01\"", "\"\xed\xa0\x80\""}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
     {"\"ab\"", "\"abc\"", "\"\xc3\xa9\xc3\xa9\""},
     {"\"a\"", "\"abcd\"", "\"\""}},
    {"{\"type\":\"string\",\"format\":\"date\"}",
     {"\"2024-02-28\"", "\"1999-12-31\""},
     {"\"2024-02-30\"", "\"2024-13-01\"", "\"0999-01-01\"", "\"2024-1-01\""}},
    {"{\"type\":\"string\",\"format\":\"date-time\"}",
     {"\"2024-01-05T12:30:00Z\"", "\"2024-01-05T23:59:59.123+02:00\""},
     {"\"2024-01-05 12:30:00Z\"", "\"2024-01-05T24:00:00Z\""}},
    {"{\"type\":\"string\",\"format\":\"uuid\"}",
     {"\"123e4567-e89b-12d3-a456-426614174000\""},
     {"\"123e4567e89b12d3a456426614174000\""}},
    {"{\"type\":\"string\",\"format\":\"email\"}",
     {"\"a.b@example.com\""},
     {"\"ab\"", "\"@x.com\""}},
    {"{\"enum\":[\"red\",\"green\",1,null]}",
     {"\"red\"", "\"green\"", "1", "null"},
     {"\"blue\"", "2", "\"Red\""}},
    {"{\"const\":{\"a\":[1,2]}}", {"{\"a\":[1,2]}"}, {"{\"a\":[1]}", "{}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}"
     "},"
     "\"required\":[\"b\"],\"additionalProperties\":false}",
     {"{\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{ \"a\" : 1 , \"b\" : \"\" }"},
     {"{}", "{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{\"b\":\"x\",}", "{\"c\":1,\"b\":\"x\"}"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}",
     {"[true]", "[true,false]", "[ true , false , true ]"},
     {"[]", "[true,true,true,true]", "[1]", "[true,]"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":"
     "false}",
     {"[\"a\",1]", "[\"a\"]", "[]"},
     {"[1]", "[\"a\",1,2]"}},
    {"{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", {"\"x\"", "null"}, {"1"}},
    {"{\"type\":[\"integer\",\"null\"]}", {"3", "null"}, {"\"3\""}},
    {"{\"type\":\"string\",\"nullable\":true}", {"\"3\"", "null"}, {"3"}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
     "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
     "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]}]}"},
     {"{\"v\":1,\"kids\":[{}]}", "{\"kids\":[]}"}},
    {"{}", {"1", "{\"a\":[true,null,\"x\",{}]}", "[]"}, {"{a:1}", "[1,]"}},
    /* enum/const beside type: only the values of that type (an enum value of another type
     * was generated and failed validation) */
    {"{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", {"\"a\"", "\"b\""}, {"1"}},
    {"{\"type\":[\"integer\",\"null\"],\"enum\":[1,1.5,\"x\",null]}",
     {"1", "null"},
     {"1.5", "\"x\""}},
    /* additionalProperties as a schema: the values of names beyond properties (a map was any
     * object, a required name without a property any value) */
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":0,"
     "\"maximum\":9}}",
     {"{}", "{\"a\":1,\"b\":9}", "{ \"\" : 0 }"},
     {"{\"a\":\"x\"}", "{\"a\":10}", "{\"a\":[]}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},\"required\":[\"a\","
     "\"b\"],\"additionalProperties\":{\"type\":\"null\"}}",
     {"{\"a\":true,\"b\":null}"},
     {"{\"a\":true,\"b\":1}", "{\"a\":true}"}},
    {"{\"type\":\"object\"}", {"{}", "{\"k\":{\"z\":[1,2]}}"}, {"[]", "1"}},
};

static void test_table(void)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        muse_grammar *g = compile(table[i].schema);
        ok(g != NULL, "compiles %s", table[i].schema);
        if (!g) continue;
        for (int j = 0; table[i].yes[j]; j++)
            ok(accepts(g, table[i].yes[j]), "%s accepts %s", table[i].schema, table[i].yes[j]);
        for (int j = 0; table[i].no[j]; j++)
            ok(!accepts(g, table[i].no[j]), "%s rejects %s", table[i].schema, table[i].no[j]);
        muse_grammar_free(g);
    }
}

static void test_errors(void)
{
    static const struct {
        const char *schema, *kw, *path;
    } bad[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "pattern", "/pattern"},
        {"{\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":{\"not\":{}}}}}}",
         "not", "/properties/a/properties/b/not"},
        {"{\"type\":\"strin\"}", "type", "/type"},
        {"{\"items\":{\"format\":\"ipv4\"}}", "format", "/items/format"},
        {"{\"$ref\":\"http://x/y\"}", "$ref", "/$ref"},
        {"{\"$ref\":\"#/$defs/missing\"}", "$ref", "/$ref"},
        {"{\"anyOf\":[]}", "anyOf", "/anyOf"},
        {"{\"type\":\"number\",\"minimum\":-1.5}", "minimum", "/minimum"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems", "/uniqueItems"},
        {"{\"properties\":{\"a/b\":{\"type\":\"string\",\"maxLength\":99999}}}", "maxLength",
         "/properties/a~1b/maxLength"},
        {"false", "false", "/"},
        {"[1", "schema", "/"},
        /* a const or an enum whose values the type beside excludes: nothing fits both */
        {"{\"type\":\"string\",\"const\":5}", "const", "/const"},
        {"{\"type\":\"integer\",\"enum\":[\"a\",1.5]}", "enum", "/enum"},
        {"{\"additionalProperties\":3}", "additionalProperties", "/additionalProperties"},
        /* an unknown keyword with an empty name still names something */
        {"{\"\":1}", "(empty name)", "/"},
        /* left recursion: the automaton's expansion looped (two self references: 2^256
         * paths, a hang) */
        {"{\"anyOf\":[{\"$ref\":\"#\"},{\"$ref\":\"#\"},{\"type\":\"null\"}]}", "$ref", "/"},
        {"{\"$defs\":{\"a\":{\"allOf\":[{\"$ref\":\"#/$defs/a\"}]}},\"type\":\"array\","
         "\"items\":{\"$ref\":\"#/$defs/a\"}}",
         "$ref", "/$defs/a"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        muse_grammar *g = NULL;
        muse_gerr e;
        int rc = muse_grammar_compile(MUSE_GRAMMAR_JSON_SCHEMA, bad[i].schema,
                                      strlen(bad[i].schema), vocab, &g, &e);
        ok(rc == -1 && g == NULL, "refuses %s", bad[i].schema);
        is_str(e.keyword, bad[i].kw, "keyword named");
        is_str(e.path, bad[i].path, "path named");
        ok(e.msg[0] != '\0', "a message: %s", e.msg);
    }
}

/* The brute-force mask: each token tried on a copy of the state. */
static size_t check_mask(muse_gstate *s, const uint8_t *mask)
{
    size_t wrong = 0;
    for (size_t t = 0; t < nv; t++) {
        int want = 0;
        if (tl[t]) {
            muse_gstate *c = muse_gstate_copy(s);
            want = muse_gstate_advance_bytes(c, tb[t], tl[t]) == 0;
            muse_gstate_free(c);
        }
        int got = (mask[t >> 3] >> (t & 7)) & 1;
        if (got != want) {
            if (wrong < 3)
                diag("token %zu (%.*s): mask %d, brute force %d", t, (int)tl[t],
                     (const char *)tb[t], got, want);
            wrong++;
        }
    }
    return wrong;
}

/* Random walks from g's start, each mask checked against the brute force; returns the
 * differences, counts steps and complete values. */
static size_t walk_check(muse_grammar *g, unsigned salt, size_t *steps, size_t *done)
{
    uint8_t *mask = malloc((nv + 7) / 8);
    size_t wrong = 0;
    for (unsigned seed = 1; seed <= 6; seed++) {
        srand(seed * 31 + salt);
        muse_gstate *s = muse_gstate_new(g);
        for (int step = 0; step < 40; step++) {
            muse_gstate_mask(s, mask);
            wrong += check_mask(s, mask);
            (*steps)++;
            size_t allowed[4096], na = 0;
            for (size_t t = 0; t < nv && na < 4096; t++)
                if ((mask[t >> 3] >> (t & 7)) & 1) allowed[na++] = t;
            if (muse_gstate_done(s) && (na == 0 || rand() % 4 == 0)) {
                (*done)++;
                break;
            }
            if (na == 0) break;
            size_t t = allowed[(size_t)rand() % na];
            if (muse_gstate_advance(s, (int32_t)t) != 0) {
                wrong++;
                break;
            }
        }
        muse_gstate_free(s);
    }
    free(mask);
    return wrong;
}

/* Schemas whose masks are checked token by token: nesting, strings that close inside tokens
 * ("\",", "\"}"), length chains, formats, recursion, bounded numbers, alternatives. */
static const char *mask_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
    "\"integer\",\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{"
    "\"enum\":"
    "[\"x\",\"abc\"]}}},\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"string\",\"maxLength\":4}",
    "{}",
    "{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"array\",\"items\":{\"type\":\"string\","
    "\"format\":\"date\"}}]}",
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\","
    "\"items\":{"
    "\"$ref\":\"#/$defs/n\"}}},\"additionalProperties\":false}},\"$ref\":\"#/$defs/n\"}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":2,"
    "\"maxLength\":6},\"b\":{\"type\":\"string\",\"format\":\"email\"},\"c\":{\"type\":"
    "\"number\"}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"integer\","
    "\"exclusiveMinimum\":-5,\"maximum\":120}},\"minItems\":1,\"maxItems\":3}",
    "{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":"
    "\"date-time\"},\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"n\":{\"type\":"
    "[\"integer\",\"null\"]}}}",
    "{\"oneOf\":[{\"const\":\"abc\"},{\"const\":\"abcd\"},{\"type\":\"string\","
    "\"maxLength\":2},{\"enum\":[1,12,123,true]}]}",
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"},{\"type\":\"string\"}],"
    "\"items\":{\"type\":\"number\",\"minimum\":0,\"maximum\":99}}",
    "{\"type\":\"object\"}",
};

static void test_masks(void)
{
    size_t steps = 0, wrong = 0, done = 0;
    for (size_t i = 0; i < sizeof mask_schemas / sizeof mask_schemas[0]; i++) {
        muse_grammar *g = compile(mask_schemas[i]);
        if (!g) {
            ok(0, "compiles mask schema %zu", i);
            continue;
        }
        wrong += walk_check(g, (unsigned)i, &steps, &done);
        muse_grammar_free(g);
    }
    is_int(wrong, 0, "masks equal the brute-force check over %zu steps", steps);
    ok(done > 0, "walks reach complete values (%zu)", done);
    /* the other kinds: any object, any value, literals, an ATEM call */
    static const struct {
        int kind;
        const char *text;
    } kinds[] = {
        {MUSE_GRAMMAR_JSON_OBJECT, ""},
        {MUSE_GRAMMAR_JSON_VALUE, ""},
        {MUSE_GRAMMAR_LITERALS, "[\"user\",\"self\",\"name\",\"na\"]"},
        {MUSE_GRAMMAR_ATEM, "{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
                            "{\"q\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}},"
                            "\"required\":[\"q\"]}}"},
    };
    steps = wrong = done = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        muse_grammar *g = NULL;
        muse_gerr e;
        if (muse_grammar_compile(kinds[i].kind, kinds[i].text, strlen(kinds[i].text), vocab, &g,
                                 &e)) {
            ok(0, "compiles kind %d: %s", kinds[i].kind, e.msg);
            continue;
        }
        wrong += walk_check(g, 100 + (unsigned)i, &steps, &done);
        muse_grammar_free(g);
    }
    is_int(wrong, 0, "other kinds: masks equal the brute-force check over %zu steps", steps);
}

/* The tables: every reachable top has one under the default cap; under a cap of one byte none
 * has, and under a small cap some have; the masks stay those of the brute force either way
 * (tops without a table walk the whole trie). */
static void test_table_cap(void)
{
    size_t def = muse_grammar_table_cap();
    muse_grammar *g = compile(mask_schemas[5]);
    muse_gtable_stats st;
    muse_grammar_table_stats(g, &st);
    ok(st.bytes > 0 && st.tables > 0 && st.untabled == 0,
       "default cap: %zu tables, %zu bytes, none left out", st.tables, st.bytes);
    size_t full = st.bytes;
    muse_grammar_free(g);
    size_t caps[] = {1, full / 3};
    for (size_t c = 0; c < 2; c++) {
        muse_grammar_set_table_cap(caps[c]);
        size_t steps = 0, wrong = 0, done = 0, some = 0, none = 0;
        for (size_t i = 0; i < sizeof mask_schemas / sizeof mask_schemas[0]; i++) {
            g = compile(mask_schemas[i]);
            if (!g) continue;
            muse_grammar_table_stats(g, &st);
            some += st.tables > 0;
            none += st.untabled > 0;
            wrong += walk_check(g, 200 + (unsigned)i, &steps, &done);
            muse_grammar_free(g);
        }
        is_int(wrong, 0, "cap %zu bytes: masks equal the brute-force check over %zu steps", caps[c],
               steps);
        ok(none > 0, "cap %zu bytes: %zu grammars have tops without a table", caps[c], none);
        if (c == 0) is_int(some, 0, "cap 1 byte: no grammar has a table");
    }
    muse_grammar_set_table_cap(def);
}

/* An unbounded integer is a few hundred elements (same_len made 2^16 rules of it once). */
static void test_integer_size(void)
{
    muse_grammar *g = compile("{\"type\":\"integer\"}");
    ok(g && muse_grammar_elements(g) < 5000, "{\"type\":\"integer\"}: %zu elements",
       g ? muse_grammar_elements(g) : 0);
    muse_grammar_free(g);
}

static void test_cache(void)
{
    const char *a = "{\"type\": \"integer\"}", *b = "{ \"type\":\"integer\" }";
    muse_grammar *g1, *g2;
    muse_gerr e;
    ok(muse_grammar_get(MUSE_GRAMMAR_JSON_SCHEMA, a, strlen(a), vocab, &g1, &e) == 0, "get a");
    ok(muse_grammar_get(MUSE_GRAMMAR_JSON_SCHEMA, b, strlen(b), vocab, &g2, &e) == 0, "get b");
    ok(g1 == g2, "the same canonical text is compiled once");
    muse_grammar_put(g1);
    muse_grammar_put(g2);
    /* the cache's grammars are filled by the worker: a mask right away waits for the tables and
     * equals the one of a grammar compiled (and filled) in place */
    const char *sch = mask_schemas[5];
    muse_grammar *gc = NULL, *gd = compile(sch);
    ok(muse_grammar_get(MUSE_GRAMMAR_JSON_SCHEMA, sch, strlen(sch), vocab, &gc, &e) == 0,
       "get a schema to fill on the worker");
    muse_gstate *sc = muse_gstate_new(gc), *sd = muse_gstate_new(gd);
    uint8_t *mc = malloc((nv + 7) / 8), *md = malloc((nv + 7) / 8);
    muse_gstate_mask(sc, mc);
    muse_gstate_mask(sd, md);
    ok(memcmp(mc, md, (nv + 7) / 8) == 0, "the worker-filled grammar's first mask is the same");
    ok(muse_gstate_ready(sc) && muse_grammar_ready(gc), "ready once a mask returned");
    muse_gstate_free(sc);
    muse_gstate_free(sd);
    free(mc);
    free(md);
    muse_grammar_put(gc);
    muse_grammar_free(gd);
}

/* Unbounded integers: the digit grammar doubled per digit (2.4M elements for one integer),
 * so a schema with two was refused as too large; now a few hundred elements. */
static void test_sizes(void)
{
    muse_grammar *g = compile("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                              "\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"number\","
                              "\"minimum\":1}},\"required\":[\"a\",\"b\",\"c\"]}");
    ok(g != NULL, "two unbounded integers and a number with a minimum compile");
    ok(g && muse_grammar_elements(g) < 5000, "in a small grammar (%zu elements)",
       g ? muse_grammar_elements(g) : 0);
    ok(g && accepts(g, "{\"a\":-1234567890123456,\"b\":0,\"c\":1.5}"), "and accept values");
    muse_grammar_free(g);
    /* anyOf over the same $ref nested 20 deep: 2^20 expansion paths, refused at compile */
    char s[4096];
    size_t n = (size_t)snprintf(s, sizeof s, "{\"$defs\":{");
    for (char d = 'a'; d < 'u'; d++)
        n += (size_t)snprintf(
            s + n, sizeof s - n,
            "\"%c\":{\"anyOf\":[{\"$ref\":\"#/$defs/%c\"},{\"$ref\":\"#/$defs/%c\"}]},", d, d + 1,
            d + 1);
    snprintf(s + n, sizeof s - n, "\"u\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/a\"}");
    muse_gerr e;
    g = NULL;
    ok(muse_grammar_compile(MUSE_GRAMMAR_JSON_SCHEMA, s, strlen(s), vocab, &g, &e) == -1 &&
           strcmp(e.keyword, "anyOf") == 0,
       "anyOf nested over the same $ref: refused (%s: %s)", e.keyword, e.msg);
}

/* Every integer in a window against its bounds, for bound shapes the digit grammar splits
 * differently (same first digit, all-zero and all-nine tails, lengths apart). */
static void test_integers(void)
{
    static const struct {
        const char *schema;
        long lo, hi; /* LONG_MIN/LONG_MAX: unbounded */
    } r[] = {
        {"{\"type\":\"integer\"}", LONG_MIN, LONG_MAX},
        {"{\"type\":\"integer\",\"minimum\":5}", 5, LONG_MAX},
        {"{\"type\":\"integer\",\"maximum\":-3}", LONG_MIN, -3},
        {"{\"type\":\"integer\",\"minimum\":17,\"maximum\":4321}", 17, 4321},
        {"{\"type\":\"integer\",\"minimum\":100,\"maximum\":999}", 100, 999},
        {"{\"type\":\"integer\",\"minimum\":-1000,\"maximum\":0}", -1000, 0},
        {"{\"type\":\"integer\",\"minimum\":1990,\"maximum\":2099}", 1990, 2099},
        {"{\"type\":\"integer\",\"minimum\":-99999,\"maximum\":99999}", -99999, 99999},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1000}", 1, 999},
        {"{\"type\":\"number\",\"minimum\":5}", 5, LONG_MAX},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        muse_grammar *g = compile(r[i].schema);
        size_t wrong = 0;
        char t[32];
        for (long x = -12000; g && x <= 12000; x++) {
            snprintf(t, sizeof t, "%ld", x);
            if (accepts(g, t) != (x >= r[i].lo && x <= r[i].hi) && wrong++ < 3)
                diag("%s: %s", r[i].schema, t);
        }
        static const long far[] = {99999999, 100000000, 123456789, -99999999, 2147483647};
        for (size_t k = 0; g && k < sizeof far / sizeof far[0]; k++) {
            snprintf(t, sizeof t, "%ld", far[k]);
            if (accepts(g, t) != (far[k] >= r[i].lo && far[k] <= r[i].hi) && wrong++ < 3)
                diag("%s: %s", r[i].schema, t);
        }
        ok(g && wrong == 0, "%s: exactly the integers in range", r[i].schema);
        muse_grammar_free(g);
    }
}

static int accepts_kind(int kind, const char *spec, const char *text)
{
    muse_grammar *g = NULL;
    muse_gerr e;
    if (muse_grammar_compile(kind, spec, strlen(spec), vocab, &g, &e)) {
        diag("compile failed: %s at %s: %s", e.keyword, e.path, e.msg);
        return -1;
    }
    int r = accepts(g, text);
    muse_grammar_free(g);
    return r;
}

/* The ATEM kind: the call block of CHAT.md, parameters in order, values JSON of their schema,
 * '<' only escaped; the literals kind: exactly one of its strings. */
static void test_atem(void)
{
    const char *spec = "{\"name\":\"weather.get\",\"parameters\":{\"type\":\"object\","
                       "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
                       "\"integer\",\"minimum\":1,\"maximum\":14}},\"required\":[\"days\"]}}";
#define CALL(body)                                                                                 \
    "<atem:function_calls>\n<atem:invoke name=\"weather.get\">\n" body                             \
    "</atem:invoke>\n</atem:function_calls>"
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, spec,
                    CALL("<atem:parameter name=\"city\">\"Paris\"</atem:parameter>\n"
                         "<atem:parameter name=\"days\">3</atem:parameter>\n")) == 1,
       "atem: both parameters");
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, spec,
                    CALL("<atem:parameter name=\"days\">14</atem:parameter>\n")) == 1,
       "atem: the optional parameter left out");
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, spec, CALL("")) == 0, "atem: a required parameter missing");
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, spec,
                    CALL("<atem:parameter name=\"days\">15</atem:parameter>\n")) == 0,
       "atem: a value outside its schema");
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, spec,
                    CALL("<atem:parameter name=\"days\">2</atem:parameter>\n"
                         "<atem:parameter name=\"city\">\"x\"</atem:parameter>\n")) == 0,
       "atem: parameters out of the schema's order");
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, spec,
                    CALL("<atem:parameter name=\"city\">\"a</atem:parameter>\"</atem:parameter>\n"
                         "<atem:parameter name=\"days\">3</atem:parameter>\n")) == 0,
       "atem: a raw '<' in a string value (it could close the tag)");
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, spec,
                    CALL("<atem:parameter name=\"city\">\"a\\u003cb\"</atem:parameter>\n"
                         "<atem:parameter name=\"days\">3</atem:parameter>\n")) == 1,
       "atem: '<' escaped as \\u003c");
    /* an enum value with '<' is written escaped too (it was written raw: it could close
     * the tag) */
    const char *espec = "{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
                        "\"t\":{\"enum\":[\"</atem:parameter>\",\"x\"]}},\"required\":[\"t\"]}}";
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, espec,
                    "<atem:function_calls>\n<atem:invoke name=\"f\">\n<atem:parameter "
                    "name=\"t\">\"\\u003c/atem:parameter>\"</atem:parameter>\n</atem:invoke>\n"
                    "</atem:function_calls>") == 1 &&
           accepts_kind(MUSE_GRAMMAR_ATEM, espec,
                        "<atem:function_calls>\n<atem:invoke name=\"f\">\n<atem:parameter "
                        "name=\"t\">\"</atem:parameter>\"</atem:parameter>\n</atem:invoke>\n"
                        "</atem:function_calls>") == 0,
       "atem: an enum value's '<' only as \\u003c");
    ok(accepts_kind(MUSE_GRAMMAR_ATEM, "{\"name\":\"f\"}",
                    "<atem:function_calls>\n<atem:invoke name=\"f\">\n</atem:invoke>\n"
                    "</atem:function_calls>") == 1,
       "atem: a function without parameters");
    muse_grammar *g = NULL;
    muse_gerr e;
    const char *badp = "{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":"
                       "{\"type\":\"string\",\"pattern\":\"a\"}}}}";
    ok(muse_grammar_compile(MUSE_GRAMMAR_ATEM, badp, strlen(badp), vocab, &g, &e) == -1 &&
           strcmp(e.keyword, "pattern") == 0 && strcmp(e.path, "/properties/x/pattern") == 0,
       "atem: an unsupported keyword names its path in the parameters (%s at %s)", e.keyword,
       e.path);
    const char *top = "{\"name\":\"f\",\"parameters\":{\"anyOf\":[{\"type\":\"object\"}]}}";
    ok(muse_grammar_compile(MUSE_GRAMMAR_ATEM, top, strlen(top), vocab, &g, &e) == -1 &&
           strcmp(e.keyword, "anyOf") == 0,
       "atem: parameters that are not a plain object are refused (%s)", e.keyword);
    const char *lit = "[\" to=self\",\" to=user\"]";
    ok(accepts_kind(MUSE_GRAMMAR_LITERALS, lit, " to=user") == 1 &&
           accepts_kind(MUSE_GRAMMAR_LITERALS, lit, " to=self") == 1 &&
           accepts_kind(MUSE_GRAMMAR_LITERALS, lit, " to=use") == 0 &&
           accepts_kind(MUSE_GRAMMAR_LITERALS, lit, " to=users") == 0,
       "literals: exactly one of the strings");
#undef CALL
}

static int bit(const uint8_t *m, int t)
{
    return (m[t >> 3] >> (t & 7)) & 1;
}

/* The frame over a vocabulary of the 256 bytes and four control ids: the header, reasoning
 * with its budget, the forced answer header, the body to its grammar, the end only when done. */
static void test_frame(void)
{
    enum { START = 256, MESSAGE = 257, EOM = 258, EOT = 259, NV = 260 };
    uint8_t bytes[256];
    const uint8_t *b[NV];
    size_t l[NV];
    for (int i = 0; i < NV; i++) {
        if (i < 256) bytes[i] = (uint8_t)i;
        b[i] = i < 256 ? &bytes[i] : NULL;
        l[i] = i < 256;
    }
    muse_gvocab *v = muse_gvocab_build(b, l, NV);
    muse_grammar *g = NULL;
    muse_gerr e;
    const char *sch = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},"
                      "\"required\":[\"a\"],\"additionalProperties\":false}";
    muse_grammar_compile(MUSE_GRAMMAR_JSON_SCHEMA, sch, strlen(sch), v, &g, &e);
    muse_gframe_ids ids = {.start = START,
                           .message = MESSAGE,
                           .eom = EOM,
                           .ends = {EOT, 'Q'},
                           .nends = 2,
                           .reasoning_max = 3};
    muse_gframe_rcpt r = {"user", g};
    muse_gframe *f = NULL;
    ok(muse_gframe_new(&ids, v, &r, 1, &f, &e) == 0, "frame: made");
    uint8_t m[(NV + 7) / 8];
    int good = 1;
    static const char hs[] = " to=self";
    for (size_t i = 0; hs[i]; i++) {
        muse_gframe_mask(f, m);
        good &= bit(m, (unsigned char)hs[i]) && !bit(m, MESSAGE) && !bit(m, EOT) && !bit(m, 'x');
        if (i == 4) good &= bit(m, 'u') && bit(m, 's');
        muse_gframe_push(f, (unsigned char)hs[i]);
    }
    muse_gframe_mask(f, m);
    ok(good && bit(m, MESSAGE) && !bit(m, 'x'),
       "frame: the first header is self or user, then <|message|>");
    muse_gframe_push(f, MESSAGE);
    ok(muse_gframe_where(f) == -1, "frame: in reasoning");
    muse_gframe_mask(f, m);
    ok(bit(m, 'x') && bit(m, EOM) && !bit(m, EOT) && !bit(m, 'Q') && !bit(m, START),
       "frame: reasoning is free text that ends its message, never the turn (a text end id "
       "cleared)");
    for (int k = 0; k < 3; k++) muse_gframe_push(f, 'x');
    muse_gframe_mask(f, m);
    int only = bit(m, EOM);
    for (int t = 0; t < NV; t++)
        if (t != EOM && bit(m, t)) only = 0;
    ok(only, "frame: its budget spent, only <|eom|>");
    muse_gframe_push(f, EOM);
    muse_gframe_mask(f, m);
    ok(bit(m, START) && !bit(m, 'a'), "frame: then <|start|>");
    muse_gframe_push(f, START);
    good = 1;
    for (const char *p = "assistant to=user"; *p; p++) {
        muse_gframe_mask(f, m);
        int n = 0;
        for (int t = 0; t < NV; t++) n += bit(m, t);
        good &= n == 1 && bit(m, (unsigned char)*p);
        muse_gframe_push(f, (unsigned char)*p);
    }
    muse_gframe_mask(f, m);
    ok(good && bit(m, MESSAGE), "frame: the answer header forced byte by byte");
    muse_gframe_push(f, MESSAGE);
    ok(muse_gframe_where(f) == 0, "frame: in the answer");
    for (const char *p = "{\"a\":true"; *p; p++) {
        muse_gframe_mask(f, m);
        good &= bit(m, (unsigned char)*p) && !bit(m, EOT);
        muse_gframe_push(f, (unsigned char)*p);
    }
    ok(good, "frame: the answer held to the schema, no end before it is complete");
    muse_gframe_mask(f, m);
    ok(bit(m, '}') && !bit(m, EOT) && !bit(m, ','), "frame: only the object's close");
    muse_gframe_push(f, '}');
    muse_gframe_mask(f, m);
    ok(bit(m, EOT) && bit(m, 'Q') && !bit(m, EOM), "frame: complete: the end ids");
    muse_gframe_free(f);
    muse_gframe_rcpt badr = {"us er", g};
    ok(muse_gframe_new(&ids, v, &badr, 1, &f, &e) == -1,
       "frame: a recipient name the header cannot hold is refused");
    muse_grammar_free(g);
    muse_gvocab_free(v);
}

int main(void)
{
    make_vocab();
    test_table();
    test_errors();
    test_masks();
    test_sizes();
    test_integers();
    test_table_cap();
    test_integer_size();
    test_cache();
    test_atem();
    test_frame();
    muse_gvocab_free(vocab);
    for (size_t i = 0; i < nv; i++) free(tb[i]);
    free(tb);
    free(tl);
    printf("1..%d\n", tap_n);
    return tap_failed != 0;
}
