/* muse-bench tokenizer: muse_tokenize and muse_detok_push speed on one core. */

#include "base/clock.h"
#include "bench.h"
#include "bench_table.h"
#include "base/flags.h"
#include "pack/config.h"
#include "base/muse_common.h"
#include "pack/pack_random.h"
#include "text/tokenizer.h"

/* Deterministic English-like prose: sentences from common words, commas, numbers, paragraphs. */
static char *make_prose(size_t bytes, size_t *len)
{
    static const char *const words[] = {
        "the",        "of",          "and",         "to",        "in",        "a",
        "is",         "that",        "for",         "it",        "as",        "was",
        "with",       "be",          "by",          "on",        "not",       "he",
        "this",       "are",         "or",          "his",       "from",      "at",
        "which",      "but",         "have",        "an",        "had",       "they",
        "you",        "were",        "their",       "one",       "all",       "we",
        "can",        "her",         "has",         "there",     "been",      "if",
        "more",       "when",        "will",        "would",     "who",       "so",
        "no",         "people",      "time",        "year",      "way",       "day",
        "thing",      "man",         "world",       "life",      "hand",      "part",
        "child",      "eye",         "woman",       "place",     "work",      "week",
        "case",       "point",       "government",  "company",   "number",    "group",
        "problem",    "fact",        "important",   "different", "small",     "large",
        "national",   "young",       "public",      "possible",  "political", "between",
        "through",    "however",     "because",     "without",   "children",  "question",
        "understand", "information", "development", "system",    "program",   "language",
        "weather",    "mountain",    "river",       "library",   "engineer",  "measure",
        "careful",    "quickly",     "although",    "model",     "server",    "request",
        "response",   "token",       "stream",      "answer",    "history",   "science",
        "music",      "garden",      "kitchen",     "morning",   "evening",   "beautiful",
        "difficult",  "remember",    "consider",    "continue",  "provide",   "describe"};
    const size_t nw = sizeof words / sizeof *words;
    char *s = MUSE_MALLOC(bytes + 256);
    size_t n = 0;
    uint64_t key = 0x5EED;
    uint64_t c = 0;
    while (n < bytes) {
        int sentences = 3 + (int)(muse_mix64(key + c++) % 5);
        for (int si = 0; si < sentences && n < bytes; si++) {
            int len_w = 5 + (int)(muse_mix64(key + c++) % 16);
            for (int wi = 0; wi < len_w; wi++) {
                uint64_t r = muse_mix64(key + c++);
                char word[32];
                if (r % 29 == 0)
                    snprintf(word, sizeof word, "%u", (unsigned)(r >> 40) % 2027);
                else
                    snprintf(word, sizeof word, "%s", words[(r >> 8) % nw]);
                if (wi == 0 && word[0] >= 'a' && word[0] <= 'z') word[0] = (char)(word[0] - 32);
                n += (size_t)snprintf(s + n, 64, "%s%s%s", wi ? " " : "", word,
                                      (wi + 1 < len_w && r % 11 == 0) ? "," : "");
            }
            n += (size_t)snprintf(s + n, 8, "%s", (c % 13 == 0) ? "? " : ". ");
        }
        s[n - 1] = '\n';
        s[n++] = '\n';
    }
    s[n] = 0;
    *len = n;
    return s;
}

int bench_cmd_tokenizer(int argc, char **argv)
{
    const char *tok_path = NULL, *text_path = NULL;
    bool as_json = false;
    long long chunk = 4096;
    double min_s = 1.0;
    muse_err e = {{0}};
    const muse_flag table[] = {
        MUSE_FLAG_S("tokenizer", &tok_path, "FILE", "the tokenizer", .required = true),
        MUSE_FLAG_S("text", &text_path, "FILE", "the text", .def = "generated prose"),
        MUSE_FLAG_L("chunk", &chunk, 64, 1 << 24, "BYTES", "bytes a piece (ending at a newline)"),
        MUSE_FLAG_D("min-s", &min_s, 0.01, 60, "S", "seconds each measure runs at least"),
        MUSE_FLAG_B("json", &as_json, "print JSON instead of a table"),
    };
    int prc = bench_parse_flags("tokenizer", "Encode MB/s and decode tokens/s on one core.\n",
                                table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    if (!tok_path) return bench_usage_error("tokenizer", "--tokenizer FILE is required");
    muse_tokenizer *tk;
    if (muse_tokenizer_load(tok_path, &tk, &e)) {
        fprintf(stderr, "muse-bench tokenizer: %s\n", e.msg);
        return 1;
    }
    size_t len = 0;
    char *text = NULL;
    int read_rc = 0; /* 1 GiB is plenty for a benchmark text */
    if (text_path)
        read_rc = muse_read_file(text_path, (size_t)1 << 30, &text, &len, &e);
    else
        text = make_prose((size_t)2 << 20, &len);
    if (read_rc || !text) {
        fprintf(stderr, "muse-bench tokenizer: %s\n", e.msg);
        muse_tokenizer_free(tk);
        return 1;
    }
    /* Pieces of about --chunk bytes ending at a newline: the size of one message. */
    int32_t *ids = NULL;
    size_t nids = 0, cap = 0;
    long passes = 0;
    double t0 = muse_now_s(), t;
    int rc = 0;
    do {
        nids = 0;
        for (size_t off = 0; off < len && rc == 0;) {
            size_t end = off + (size_t)chunk < len ? off + (size_t)chunk : len;
            while (end < len && end > off + 1 && text[end - 1] != '\n') end--;
            if (end <= off + 1) end = off + (size_t)chunk < len ? off + (size_t)chunk : len;
            rc = muse_tokenize(tk, text + off, end - off, &ids, &nids, &cap, &e);
            off = end;
        }
        passes++;
        t = muse_now_s() - t0;
    } while (rc == 0 && t < min_s && passes < 10000);
    if (rc) {
        fprintf(stderr, "muse-bench tokenizer: %s\n", e.msg);
        free(text);
        free(ids);
        muse_tokenizer_free(tk);
        return 1;
    }
    double enc_mbs = (double)len * (double)passes / t / 1e6;
    /* Decode: stream every id through a muse_detok, as the server does. */
    size_t bound = 3 * (muse_tokenizer_max_token_bytes(tk) + 3);
    char *out = MUSE_MALLOC(bound);
    long dpasses = 0;
    volatile long sink = 0;
    t0 = muse_now_s();
    do {
        muse_detok d = {{0}, 0};
        for (size_t i = 0; i < nids; i++) sink += muse_detok_push(tk, &d, ids[i], out, bound);
        sink += muse_detok_finish(&d, out, bound);
        dpasses++;
        t = muse_now_s() - t0;
    } while (t < min_s && dpasses < 100000);
    double dec_tps = (double)nids * (double)dpasses / t;
    static const char *const cols[] = {"text bytes",  "tokens",          "bytes/token",
                                       "encode MB/s", "decode tokens/s", "decode MB/s"};
    bench_table tb;
    bench_table_begin(&tb, "tokenizer",
                      "Tokenizer on one core: muse_tokenize in pieces, muse_detok_push", cols, 6,
                      as_json);
    const char *cells[] = {bench_fmt("%.0f", (double)len),
                           bench_fmt("%.0f", (double)nids),
                           bench_fmt("%.2f", (double)len / (double)nids),
                           bench_fmt("%.2f", enc_mbs),
                           bench_fmt("%.0f", dec_tps),
                           bench_fmt("%.1f", dec_tps * (double)len / (double)nids / 1e6)};
    bench_table_row(&tb, cells);
    bench_table_note(&tb, "tokenizer", tok_path);
    bench_table_note(&tb, "text", text_path ? text_path : "generated English-like prose (2 MiB)");
    char piece[64];
    snprintf(piece, sizeof piece, "%lld bytes, ending at a newline", chunk);
    bench_table_note(&tb, "piece", piece);
    bench_table_note(&tb, "target", "encode >= 10 MB/s of English on one core");
    bench_table_end(&tb);
    (void)sink;
    free(out);
    free(ids);
    free(text);
    muse_tokenizer_free(tk);
    return 0;
}
