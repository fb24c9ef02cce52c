/* muse-bench grammar: the time of one token mask (muse_gstate_mask over the whole vocabulary)
 * for each schema of a corpus, on random walks through the automaton: p50, p99 and max; and
 * the compile (rules and tables) of each schema, with the tables' bytes. */
#include <math.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "base/clock.h"
#include "base/flags.h"
#include "base/muse_common.h"
#include "bench.h"
#include "bench_table.h"
#include "grammar/grammar.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The k-th allowed token of a mask (k taken modulo the count), or -1 when none. */
static int32_t pick(const uint8_t *m, size_t V, uint64_t k)
{
    size_t n = 0;
    for (size_t t = 0; t < V; t++) n += (m[t >> 3] >> (t & 7)) & 1;
    if (!n) return -1;
    k %= n;
    for (size_t t = 0; t < V; t++)
        if (((m[t >> 3] >> (t & 7)) & 1) && k-- == 0) return (int32_t)t;
    return -1;
}

int bench_cmd_grammar(int argc, char **argv)
{
    const char *tok_path = NULL, *corpus_path = NULL;
    long long steps = 64, cap_mib = 0;
    bool as_json = false;
    muse_err e = {{0}};
    const muse_flag table[] = {
        MUSE_FLAG_S("tokenizer", &tok_path, "FILE", "the tokenizer", .required = true),
        MUSE_FLAG_S("schemas", &corpus_path, "FILE", "a JSON array of JSON Schemas",
                    .required = true),
        MUSE_FLAG_L("steps", &steps, 1, 4096, "N", "masks timed a schema (a random walk)"),
        MUSE_FLAG_L("table-cap", &cap_mib, 0, 1 << 20, "MIB",
                    "cap on one grammar's tables (0: the default)"),
        MUSE_FLAG_B("json", &as_json, "print JSON instead of a table"),
    };
    int prc = bench_parse_flags("grammar", "Mask time a token over a corpus of schemas.\n", table,
                                sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    if (!tok_path || !corpus_path)
        return bench_usage_error("grammar", "--tokenizer FILE and --schemas FILE are required");
    muse_tokenizer *tk;
    if (muse_tokenizer_load(tok_path, &tk, &e)) {
        fprintf(stderr, "muse-bench grammar: %s\n", e.msg);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    cJSON *corpus = NULL;
    if (muse_read_file(corpus_path, (size_t)64 << 20, &text, &len, &e) == 0)
        corpus = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsArray(corpus)) {
        fprintf(stderr, "muse-bench grammar: --schemas %s: %s\n", corpus_path,
                e.msg[0] ? e.msg : "not a JSON array of schemas");
        cJSON_Delete(corpus);
        muse_tokenizer_free(tk);
        return 1;
    }
    size_t V = (size_t)muse_tokenizer_vocab_size(tk);
    const uint8_t **bytes = MUSE_CALLOC(V, sizeof *bytes);
    size_t *lens = MUSE_CALLOC(V, sizeof *lens);
    for (size_t i = 0; i < V; i++) {
        if (muse_tokenizer_is_special(tk, (int32_t)i)) continue;
        bytes[i] = muse_tokenizer_token_bytes(tk, (int32_t)i, &lens[i]);
        if (!bytes[i]) lens[i] = 0;
    }
    double t0 = muse_now_s();
    muse_gvocab *v = muse_gvocab_build(bytes, lens, V);
    double build_s = muse_now_s() - t0;
    if (cap_mib) muse_grammar_set_table_cap((size_t)cap_mib << 20);
    size_t nsch = (size_t)cJSON_GetArraySize(corpus), cap = nsch * (size_t)steps, nt = 0;
    double *ts = MUSE_MALLOC((cap ? cap : 1) * sizeof *ts);
    double *cms = MUSE_MALLOC((nsch ? nsch : 1) * sizeof *cms),
           *mib = MUSE_MALLOC((nsch ? nsch : 1) * sizeof *mib);
    uint8_t *mask = MUSE_MALLOC((V + 7) / 8);
    size_t compiled = 0, untabled = 0, capped = 0;
    double rules_max = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    /* what a held token adds besides its mask: the masked draw over a free one, the step */
    double *tadd = MUSE_MALLOC((cap ? cap : 1) * sizeof *tadd),
           *tdm = MUSE_MALLOC((cap ? cap : 1) * sizeof *tdm);
    double *tdf = MUSE_MALLOC((cap ? cap : 1) * sizeof *tdf),
           *tav = MUSE_MALLOC((cap ? cap : 1) * sizeof *tav);
    size_t nd = 0;
    float *logits = MUSE_MALLOC(V * sizeof *logits);
    for (size_t i = 0; i < V; i++) /* a fixed spread of logits (the walk's rng left alone) */
        logits[i] = (float)((double)(muse_mix64(i + 1) >> 11) * 0x1p-53 * 16.0 - 8.0);
    muse_sampler *smp = muse_sampler_create((int64_t)V);
    muse_sampling sp = {.temperature = 0.8f, .top_p = 1, .seed = 1};
    const cJSON *sc;
    cJSON_ArrayForEach(sc, corpus)
    {
        char *s = cJSON_PrintUnformatted(sc);
        muse_grammar *g = NULL;
        muse_gerr ge;
        double c0 = muse_now_s();
        int rc = s ? muse_grammar_compile(MUSE_GRAMMAR_JSON_SCHEMA, s, strlen(s), v, &g, &ge) : -1;
        double c1 = muse_now_s();
        free(s);
        if (rc) continue;
        muse_gtable_stats st_t;
        muse_grammar_table_stats(g, &st_t);
        cms[compiled] = (c1 - c0) * 1e3;
        double rules = (c1 - c0 - st_t.fill_s) * 1e3; /* what the scheduler pays in serving */
        if (rules > rules_max) rules_max = rules;
        mib[compiled] = (double)st_t.bytes / (1 << 20);
        compiled++;
        untabled += st_t.untabled;
        capped += st_t.untabled > 0;
        muse_gstate *st = muse_gstate_new(g);
        for (long long k = 0; k < steps; k++) {
            double a = muse_now_s();
            muse_gstate_mask(st, mask);
            double tm = muse_now_s() - a;
            ts[nt++] = tm;
            a = muse_now_s();
            muse_sample_masked(smp, logits, mask, &sp, k);
            double b = muse_now_s();
            muse_sample(smp, logits, &sp, k);
            double c = muse_now_s();
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int32_t t = pick(mask, V, rng >> 17);
            double d = muse_now_s();
            int adv = t < 0 ? -1 : muse_gstate_advance(st, t);
            double e2 = muse_now_s();
            tdm[nd] = b - a;
            tdf[nd] = c - b;
            tav[nd] = e2 - d;
            tadd[nd++] = tm + (b - a) - (c - b) + (e2 - d);
            if (adv) break; /* complete and closed */
        }
        muse_gstate_free(st);
        muse_grammar_free(g);
    }
    qsort(ts, nt, sizeof *ts, cmp_d);
    double p50 = nt ? ts[nt / 2] : 0, p99 = nt ? ts[(size_t)floor(0.99 * (double)(nt - 1))] : 0;
    double mx = nt ? ts[nt - 1] : 0;
    static const char *const cols[] = {"vocab",
                                       "schemas",
                                       "masks",
                                       "p50 us",
                                       "p99 us",
                                       "max us",
                                       "compile ms p50",
                                       "compile ms p99",
                                       "compile ms max",
                                       "rules ms max",
                                       "tables MiB p50",
                                       "tables MiB max",
                                       "tops without a table",
                                       "trie build s"};
    bench_table tb;
    bench_table_begin(&tb, "grammar", "Token masks over a corpus of JSON Schemas (one core)", cols,
                      14, as_json);
    const char *cells[] = {bench_fmt("%.0f", (double)V),
                           bench_fmt("%.0f", (double)compiled),
                           bench_fmt("%.0f", (double)nt),
                           bench_fmt("%.1f", p50 * 1e6),
                           bench_fmt("%.1f", p99 * 1e6),
                           bench_fmt("%.1f", mx * 1e6),
                           bench_fmt("%.2f", bench_quantile(cms, compiled, 0.5)),
                           bench_fmt("%.2f", bench_quantile(cms, compiled, 0.99)),
                           bench_fmt("%.2f", bench_quantile(cms, compiled, 1.0)),
                           bench_fmt("%.2f", rules_max),
                           bench_fmt("%.3f", bench_quantile(mib, compiled, 0.5)),
                           bench_fmt("%.3f", bench_quantile(mib, compiled, 1.0)),
                           bench_fmt("%.0f", (double)untabled),
                           bench_fmt("%.3f", build_s)};
    bench_table_row(&tb, cells);
    bench_table_note(&tb, "tokenizer", tok_path);
    bench_table_note(&tb, "schemas", corpus_path);
    bench_table_note(&tb, "walk", "a random allowed token each step; every mask counts");
    bench_table_note(&tb, "compile",
                     "muse_grammar_compile: the rules and every stack top's table; 'rules' "
                     "without the tables (serving: the scheduler's share, the fill worker's "
                     "is the rest)");
    char note[160];
    snprintf(note, sizeof note,
             "%zu MiB a grammar; %zu schemas over it (their tops without a "
             "table walk the whole trie each step)",
             muse_grammar_table_cap() >> 20, capped);
    bench_table_note(&tb, "table cap", note);
    bench_table_note(&tb, "target", "p99 under 50 us at vocab 202048");
    bench_table_end(&tb);
    static const char *const cols2[] = {
        "vocab",       "tokens",       "mask us p50", "masked draw us p50", "free draw us p50",
        "step us p50", "added us p50", "added us p99"};
    bench_table_begin(&tb, "grammar-token",
                      "What a held token adds to a free one on the host: its mask, the masked "
                      "draw over a free draw, the automaton's step (one core)",
                      cols2, 8, as_json);
    double ta50 = bench_quantile(tadd, nd, 0.5), ta99 = bench_quantile(tadd, nd, 0.99);
    const char *cells2[] = {bench_fmt("%.0f", (double)V),
                            bench_fmt("%.0f", (double)nd),
                            bench_fmt("%.1f", p50 * 1e6),
                            bench_fmt("%.1f", bench_quantile(tdm, nd, 0.5) * 1e6),
                            bench_fmt("%.1f", bench_quantile(tdf, nd, 0.5) * 1e6),
                            bench_fmt("%.1f", bench_quantile(tav, nd, 0.5) * 1e6),
                            bench_fmt("%.1f", ta50 * 1e6),
                            bench_fmt("%.1f", ta99 * 1e6)};
    bench_table_row(&tb, cells2);
    bench_table_note(&tb, "draw", "muse_sample_masked vs muse_sample on fixed logits, T 0.8");
    bench_table_note(&tb, "added",
                     "mask + masked draw - free draw + step, each token (the server's copy of "
                     "the mask into the round is not in it)");
    bench_table_end(&tb);
    muse_sampler_destroy(smp);
    free(logits);
    free(tadd);
    free(tdm);
    free(tdf);
    free(tav);
    free(cms);
    free(mib);
    free(mask);
    free(ts);
    free(bytes);
    free(lens);
    muse_gvocab_free(v);
    cJSON_Delete(corpus);
    muse_tokenizer_free(tk);
    return 0;
}
