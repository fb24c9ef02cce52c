/* Tokenizer unit tests on t/data/tokenizer_tiny.json. Also a driver for other tests:
 *   test_tokenizer tokenize|detokenize ...   runs the muse-engine subcommand
 *   test_tokenizer --bench TOKENIZER FILE    prints encode speed in MB/s (one core) */
#include <time.h>
#include <unistd.h>

#include "cmd/cmd_tokenize.h"
#include "tap.h"
#include "text/tokenizer.h"

#define TINY "t/data/tokenizer_tiny.json"

/* Ids in the tiny file: bytes are ids 0..255 (id = byte value), then these. */
enum {
    ID_BC = 256,
    ID_AB,
    ID_XY,
    ID_XYZ,
    ID_AA,
    ID_AAAA,
    ID_SPACE_A,
    ID_F09F,
    ID_9880,
    ID_GRIN,
    ID_CA,
    ID_EOT = 300,
    ID_START,
    ID_PLAIN_ADDED
};

static muse_tokenizer *load_or_die(const char *path)
{
    muse_tokenizer *t;
    muse_err e;
    if (muse_tokenizer_load(path, &t, &e)) {
        printf("Bail out! %s\n", e.msg);
        exit(1);
    }
    return t;
}

/* Encodes text and renders the ids as "1,2,3" for comparisons. */
static const char *encode_str(const muse_tokenizer *t, const char *text, size_t len)
{
    static char out[8192];
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    muse_err e;
    if (muse_tokenize(t, text, len, &ids, &n, &cap, &e)) {
        snprintf(out, sizeof out, "error: %s", e.msg);
    } else {
        size_t o = 0;
        out[0] = '\0';
        for (size_t i = 0; i < n && o < sizeof out - 16; i++)
            o += (size_t)snprintf(out + o, sizeof out - o, i ? ",%d" : "%d", ids[i]);
    }
    free(ids);
    return out;
}
#define ENC(t, s) encode_str((t), (s), strlen(s))

/* Writes a copy of the tiny file with one text replacement, for variants of the format. */
static const char *tiny_variant(const char *from, const char *to)
{
    static char path[64];
    if (path[0]) unlink(path); /* the previous variant is loaded by now */
    static int serial;
    FILE *f = fopen(TINY, "rb");
    MUSE_CHECK(f != NULL);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *at = strstr(buf, from);
    MUSE_CHECK(at != NULL);
    snprintf(path, sizeof path, "/tmp/muse_tok_variant_%d_%d.json", (int)getpid(), serial++);
    f = fopen(path, "wb");
    MUSE_CHECK(f != NULL);
    fwrite(buf, 1, (size_t)(at - buf), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    return path;
}

static void test_merges(const muse_tokenizer *t)
{
    is_str(ENC(t, "abc"), "97,256", "b c (rank 0) merges before a b (rank 1): abc -> a + bc");
    is_str(ENC(t, "ab"), "257", "ab is one token");
    is_str(ENC(t, "aaa"), "260,97", "equal ranks merge leftmost first: aaa -> aa + a");
    is_str(ENC(t, "aaaaaaaaaa"), "261,261,260", "aa aa merges after a a");
    is_str(ENC(t, "a a"), "97,262", "pre-tokenizer splits ' a' into its own piece");
    is_str(ENC(t, "12345"), "49,50,51,52,53", "digits split in groups of three, no merges");
    is_str(ENC(t, ""), "", "empty text gives no ids");
}

static void test_ignore_merges(void)
{
    muse_tokenizer *t = load_or_die(TINY);
    is_str(ENC(t, "xyz"), "259", "ignore_merges: a piece in the vocab maps to its id");
    is_str(ENC(t, "xyzx"), "258,122,120", "a piece not in the vocab goes through merges");
    is_str(ENC(t, "\xF0\x9F\x98\x80"), "265", "emoji piece found whole");
    muse_tokenizer_free(t);
    t = load_or_die(tiny_variant("\"ignore_merges\": true", "\"ignore_merges\": false"));
    is_str(ENC(t, "xyz"), "258,122", "without ignore_merges xyz is reached only by merges");
    is_str(ENC(t, "\xF0\x9F\x98\x80"), "263,264", "emoji split in two merged halves");
    muse_tokenizer_free(t);
}

static void test_added_tokens(const muse_tokenizer *t)
{
    is_str(ENC(t, "<|eot|>"), "60,124,101,111,116,124,62", "<|eot|> in text is plain text");
    is_str(ENC(t, "plain added"), "112,108,97,105,110,262,100,100,101,100",
           "a non-special added token is not matched in text either");
    is_int(muse_tokenizer_special_id(t, "<|eot|>"), ID_EOT, "special_id finds <|eot|>");
    is_int(muse_tokenizer_special_id(t, "<|start|>"), ID_START, "special_id finds <|start|>");
    is_int(muse_tokenizer_special_id(t, "<|nope|>"), -1, "special_id of unknown content");
    ok(muse_tokenizer_is_special(t, ID_EOT), "<|eot|> is special");
    ok(!muse_tokenizer_is_special(t, ID_PLAIN_ADDED), "added token without special flag");
    ok(!muse_tokenizer_is_special(t, ID_AB), "model token is not special");
    ok(!muse_tokenizer_is_special(t, 99999), "out of range id is not special");
    is_int(muse_tokenizer_vocab_size(t), 303, "vocab size is highest id + 1");
    size_t len = 0;
    const uint8_t *b = muse_tokenizer_token_bytes(t, ID_START, &len);
    ok(b && len == 9 && memcmp(b, "<|start|>", 9) == 0, "added token bytes are its content");
    b = muse_tokenizer_token_bytes(t, ID_SPACE_A, &len);
    ok(b && len == 2 && memcmp(b, " a", 2) == 0, "byte-level 'Ġa' undoes to ' a'");
    b = muse_tokenizer_token_bytes(t, 0, &len);
    ok(b && len == 1 && b[0] == 0, "byte 0 token (byte-level U+0100) is the zero byte");
    ok(!muse_tokenizer_token_bytes(t, 280, &len), "unused id has no bytes");
    ok(!muse_tokenizer_token_bytes(t, -1, &len), "negative id has no bytes");
}

/* Streams ids through the decoder; returns the concatenated output. */
static const char *detok_ids(const muse_tokenizer *t, const int32_t *ids, size_t n, int finish)
{
    static char out[4096];
    char piece[256];
    size_t o = 0;
    muse_detok d = {0};
    for (size_t i = 0; i < n; i++) {
        long got = muse_detok_push(t, &d, ids[i], piece, sizeof piece);
        if (got < 0) return "(unknown id)";
        memcpy(out + o, piece, (size_t)got);
        o += (size_t)got;
    }
    if (finish) o += (size_t)muse_detok_finish(&d, out + o, sizeof out - o);
    out[o] = '\0';
    return out;
}

static void test_detok_stream(const muse_tokenizer *t)
{
    muse_detok d = {0};
    char out[64];
    is_int(muse_detok_push(t, &d, ID_F09F, out, sizeof out), 0,
           "first half of a 4-byte emoji is held back");
    is_int(d.nheld, 2, "two bytes held");
    long got = muse_detok_push(t, &d, ID_9880, out, sizeof out);
    ok(got == 4 && memcmp(out, "\xF0\x9F\x98\x80", 4) == 0, "second half completes the emoji");
    is_int(muse_detok_finish(&d, out, sizeof out), 0, "nothing left to flush");

    int32_t split3[] = {0xF0, 0x9F, 0x98, 0x80, 'a'};
    is_str(detok_ids(t, split3, 5, 1),
           "\xF0\x9F\x98\x80"
           "a",
           "emoji byte by byte");
    int32_t tail[] = {'a', ID_F09F};
    is_str(detok_ids(t, tail, 2, 0), "a", "unfinished tail held back");
    is_str(detok_ids(t, tail, 2, 1), "a\xEF\xBF\xBD", "finish flushes the tail as U+FFFD");
    int32_t broken[] = {ID_F09F, 'a'};
    is_str(detok_ids(t, broken, 2, 1),
           "\xEF\xBF\xBD"
           "a",
           "cut-off character then ASCII");
    int32_t invalid[] = {0xFF, 0x80, 'b', 0xC0, 0xAF};
    is_str(detok_ids(t, invalid, 5, 1),
           "\xEF\xBF\xBD\xEF\xBF\xBD"
           "b\xEF\xBF\xBD\xEF\xBF\xBD",
           "invalid bytes each become U+FFFD");
    int32_t surrogate[] = {0xED, 0xA0, 0x80};
    is_str(detok_ids(t, surrogate, 3, 1), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD",
           "encoded surrogate is invalid");
    int32_t special[] = {ID_START, 'h', 'i', ID_EOT};
    is_str(detok_ids(t, special, 4, 1), "<|start|>hi<|eot|>", "added tokens decode to content");
    muse_detok d2 = {0};
    is_int(muse_detok_push(t, &d2, 280, out, sizeof out), -1, "unknown id gives -1");
    ok(muse_detok_bound(t, ID_AAAA) >= 3 * (4 + 3), "bound covers worst case");
}

static void test_invalid_utf8(const muse_tokenizer *t)
{
    const char text[] = "a\xFF"
                        "b\xC3 \xE2\x82 xyz\x80\xF0\x9F\x98";
    size_t len = sizeof text - 1;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    muse_err e;
    ok(muse_tokenize(t, text, len, &ids, &n, &cap, &e) == 0, "invalid UTF-8 encodes");
    char back[256];
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = 0;
        const uint8_t *b = muse_tokenizer_token_bytes(t, ids[i], &l);
        if (b && o + l < sizeof back) memcpy(back + o, b, l);
        o += l;
    }
    ok(o == len && memcmp(back, text, len) == 0, "token bytes give back the input bytes");
    free(ids);
}

/* Lowest-rank-first BPE over the tiny file's letter merges, as an independent reference. */
static void reference_bpe(const char *s, char *out, size_t cap)
{
    static const struct {
        const char *l, *r;
        int id;
    } merges[] = {{"b", "c", ID_BC}, {"a", "b", ID_AB},     {"x", "y", ID_XY},
                  {"a", "a", ID_AA}, {"aa", "aa", ID_AAAA}, {" ", "a", ID_SPACE_A},
                  {"", "", -1},      {"", "", -1},          {"c", "a", ID_CA}};
    char parts[512][8];
    int ids[512], n = 0;
    for (; s[n]; n++) {
        parts[n][0] = s[n];
        parts[n][1] = '\0';
        ids[n] = (unsigned char)s[n];
    }
    for (;;) {
        int best = -1, best_rank = 1 << 30;
        for (int i = 0; i + 1 < n; i++)
            for (int r = 0; r < (int)(sizeof merges / sizeof merges[0]) && r < best_rank; r++)
                if (strcmp(parts[i], merges[r].l) == 0 && strcmp(parts[i + 1], merges[r].r) == 0)
                    best = i, best_rank = r;
        if (best < 0) break;
        char joined[16];
        snprintf(joined, sizeof joined, "%s%s", parts[best], parts[best + 1]);
        memcpy(parts[best], joined, sizeof parts[best]);
        ids[best] = merges[best_rank].id;
        memmove(parts + best + 1, parts + best + 2, (size_t)(n - best - 2) * sizeof parts[0]);
        memmove(ids + best + 1, ids + best + 2, (size_t)(n - best - 2) * sizeof ids[0]);
        n--;
    }
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) o += (size_t)snprintf(out + o, cap - o, i ? ",%d" : "%d", ids[i]);
}

static void test_random_pieces_against_reference(const muse_tokenizer *t)
{
    uint32_t seed = 12345;
    int mismatches = 0, tested = 0;
    for (int round = 0; round < 400; round++) {
        char s[301], want[4096];
        int len = round % 4 == 0 ? 300 : 1 + (int)(seed % 60);
        for (int i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            s[i] = "aabc"[(seed >> 16) % 4];
        }
        s[len] = '\0';
        if (strcmp(s, "xyz") == 0) continue;
        reference_bpe(s, want, sizeof want);
        const char *got = ENC(t, s);
        tested++;
        if (strcmp(got, want) != 0 && mismatches++ == 0)
            diag("first mismatch on '%s': got %s want %s", s, got, want);
    }
    is_int(mismatches, 0, "scan and heap BPE match the reference on %d random pieces", tested);
}

static void test_load_errors(void)
{
    muse_tokenizer *t = NULL;
    muse_err e;
    const char *p = tiny_variant("\"type\": \"Split\"", "\"type\": \"Whitespace\"");
    ok(muse_tokenizer_load(p, &t, &e) == -1 && strstr(e.msg, "\"Whitespace\"") &&
           strstr(e.msg, "not supported"),
       "unknown pre-tokenizer refused by name: %s", e.msg);
    ok(t == NULL, "no tokenizer on failure");
    p = tiny_variant("\"behavior\": \"Isolated\"", "\"behavior\": \"MergedWithNext\"");
    ok(muse_tokenizer_load(p, &t, &e) == -1 && strstr(e.msg, "MergedWithNext"),
       "unsupported Split behavior named: %s", e.msg);
    p = tiny_variant("\"type\": \"BPE\"", "\"type\": \"WordPiece\"");
    ok(muse_tokenizer_load(p, &t, &e) == -1 && strstr(e.msg, "WordPiece"),
       "unsupported model type named: %s", e.msg);
    p = tiny_variant("\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}");
    ok(muse_tokenizer_load(p, &t, &e) == -1 && strstr(e.msg, "NFC"), "normalizer named: %s", e.msg);
    p = tiny_variant("\"c a\"", "\"c q\"");
    ok(muse_tokenizer_load(p, &t, &e) == -1 && strstr(e.msg, "merges[8]"),
       "merge to a token missing from the vocab: %s", e.msg);
    p = tiny_variant("\"ca\": 266", "\"ca\": -3");
    ok(muse_tokenizer_load(p, &t, &e) == -1 && strstr(e.msg, "'ca'"), "negative id: %s", e.msg);
    p = tiny_variant("\"ca\": 266", "\"ca\": 99999999999");
    ok(muse_tokenizer_load(p, &t, &e) == -1 && strstr(e.msg, "'ca'"), "huge id: %s", e.msg);
    p = tiny_variant("\"version\"", "\"version\" x");
    ok(muse_tokenizer_load(p, &t, &e) == -1 && strstr(e.msg, "not valid JSON"), "bad JSON: %s",
       e.msg);
    ok(muse_tokenizer_load("/nonexistent/tokenizer.json", &t, &e) == -1 &&
           strstr(e.msg, "/nonexistent/tokenizer.json"),
       "missing file named: %s", e.msg);
}

static void test_bytelevel_regex(void)
{
    /* ByteLevel alone with use_regex: GPT-2's split, and add_prefix_space. */
    const char *p =
        tiny_variant("\"pre_tokenizer\": {",
                     "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
                     "\"use_regex\": true}, \"x\": {");
    muse_tokenizer *t = load_or_die(p);
    is_str(ENC(t, "a a"), "262,262", "add_prefix_space makes 'a a' two ' a' pieces");
    is_str(ENC(t, "123456"), "32,49,50,51,52,53,54", "GPT-2 split keeps digit runs whole");
    muse_tokenizer_free(t);
}

/* Llama-3's split regex (scoped (?i:...) and \r\n classes) loads and splits with PCRE2. */
static void test_llama3_regex(void)
{
    const char *p = tiny_variant(
        "\" ?\\\\p{L}+| ?\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+|\\\\s+(?!\\\\S)|\\\\s+\"",
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"");
    muse_tokenizer *t = load_or_die(p);
    is_str(ENC(t, "He'LL x a"), "72,101,39,76,76,32,120,262", "Llama-3 regex encodes");
    muse_tokenizer_free(t);
}

static int bench(const char *tokenizer, const char *file)
{
    muse_tokenizer *t = load_or_die(tokenizer);
    FILE *f = fopen(file, "rb");
    if (!f) {
        fprintf(stderr, "bench: cannot open %s\n", file);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = MUSE_MALLOC((size_t)len);
    size_t got = fread(text, 1, (size_t)len, f);
    fclose(f);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    muse_err e;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        struct timespec a, b;
        n = 0;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (muse_tokenize(t, text, got, &ids, &n, &cap, &e)) {
            fprintf(stderr, "bench: %s\n", e.msg);
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        if (s < best) best = s;
    }
    printf("%zu bytes -> %zu tokens; best of 5: %.3f s = %.1f MB/s\n", got, n, best,
           (double)got / best / 1e6);
    free(ids);
    free(text);
    muse_tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "tokenize") == 0) return muse_cmd_tokenize(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "detokenize") == 0)
        return muse_cmd_detokenize(argc - 1, argv + 1);
    if (argc == 4 && strcmp(argv[1], "--bench") == 0) return bench(argv[2], argv[3]);

    muse_tokenizer *t = load_or_die(TINY);
    test_merges(t);
    test_ignore_merges();
    test_added_tokens(t);
    test_detok_stream(t);
    test_invalid_utf8(t);
    test_random_pieces_against_reference(t);
    test_load_errors();
    test_bytelevel_regex();
    test_llama3_regex();
    unlink(tiny_variant("\"version\"", "\"version\""));
    muse_tokenizer_free(t);
    return done_testing();
}
