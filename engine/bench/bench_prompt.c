/* muse-bench prompt on a backend (no --url): each prompt length processed in rounds of up to
 * --rows rows of one sequence, its first token drawn at the end; prompt tokens/s and the time
 * to first token, with no server, HTTP or prompt cache in the way. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_engine.h"
#include "bench_ops.h"
#include "bench_table.h"

enum { MAX_LENGTHS = 16, MAX_REPS = 64 };

typedef struct {
    const char *backend, *json, *baseline, *kernels, *lengths_s;
    muse_kernels path;
    bench_weights w;
    long long rows, reps, threads, copy_mib;
} prompt_flags;

static const char *const prompt_cols[] = {"model",        "backend",      "prompt tokens",
                                          "rows a round", "reps",         "TTFT p50 ms",
                                          "TTFT max ms",  "prompt tok/s", "note"};
static const char *const prompt_keys[] = {"model", "backend", "prompt tokens"};

/* Seconds from the first round of a fresh sequence of len tokens to its first token; -1. */
static double prompt_once(bench_engine *c, long long len, long rows)
{
    muse_kv_release(&c->be->kv, 0);
    double s = 0, t = 0;
    for (long long pos = 0; pos < len && s >= 0; pos += rows) {
        long n = len - pos < rows ? (long)(len - pos) : rows;
        t += s = bench_engine_chunk(c, 0, pos, n, pos + n >= len);
    }
    return s < 0 ? -1 : t;
}

/* One row: reps of the prompt (after a warm-up of one round); -1 on a device error. */
static int prompt_row(bench_table *t, bench_engine *c, const prompt_flags *f, long long len)
{
    const char *name = c->model.dir;
    int64_t limit = c->model.cfg.max_position_embeddings;
    char note[160] = "";
    if (limit > 0 && len + 1 > limit) {
        snprintf(note, sizeof note,
                 "skipped: %lld prompt + 1 token > the pack's max_position_embeddings %lld", len,
                 (long long)limit);
        const char *cells[] = {name, f->backend, bench_fmt("%.0f", (double)len), "-", "0", "-", "-",
                               "-",  note};
        bench_table_row(t, cells);
        return 0;
    }
    double v[MAX_REPS];
    if (bench_engine_chunk(c, 0, 0, 1, 1) < 0) return -1; /* a warm-up */
    for (long long r = 0; r < f->reps; r++)
        if ((v[r] = prompt_once(c, len, (long)f->rows)) < 0) return -1;
    double p50 = bench_quantile(v, (size_t)f->reps, 0.5),
           max = bench_quantile(v, (size_t)f->reps, 1);
    const char *cells[] = {name,
                           f->backend,
                           bench_fmt("%.0f", (double)len),
                           bench_fmt("%.0f", (double)f->rows),
                           bench_fmt("%.0f", (double)f->reps),
                           bench_fmt("%.2f", p50 * 1e3),
                           bench_fmt("%.2f", max * 1e3),
                           bench_fmt("%.1f", (double)len / p50),
                           note};
    bench_table_row(t, cells);
    return 0;
}

int bench_prompt_backend(int argc, char **argv)
{
    prompt_flags f = {.backend = "cpu",
                      .lengths_s = "512,4096,32768",
                      .rows = 256,
                      .reps = 1,
                      .w = {.synthetic = -1}};
    const muse_flag table[] = {
        MUSE_FLAG_S("backend", &f.backend, "cpu|cuda", "the backend to measure", .def = "cpu"),
        MUSE_KERNELS_FLAG(&f.kernels),
        MUSE_FLAG_S("model", &f.w.dir, "DIR", "the pack (or --synthetic-weights)"),
        BENCH_SYNTHETIC_FLAGS(f.w),
        MUSE_FLAG_S("lengths", &f.lengths_s, "N,N,...", "prompt lengths, a row each",
                    .def = "512,4096,32768"),
        MUSE_FLAG_L("rows", &f.rows, 1, 4096, "M", "rows a round (the server's --max-rows)"),
        MUSE_FLAG_L("reps", &f.reps, 1, MAX_REPS, "R", "prompts a row"),
        MUSE_FLAG_L("threads", &f.threads, 0, 1024, "N", "cpu threads", .def = "0: one per core"),
        MUSE_FLAG_L("copy-mib", &f.copy_mib, 0, 65536, "MIB", "the copy bandwidth's buffer",
                    .def = "0: 1024 on cuda, 256 on cpu"),
        MUSE_FLAG_S("json", &f.json, "FILE", "also write the table as JSON to FILE (-: stdout)"),
        MUSE_FLAG_S("baseline", &f.baseline, "FILE",
                    "a previous --json FILE: a column of this run's TTFT p50 over its"),
    };
    int prc = bench_parse_flags(
        "prompt",
        "Prompt tokens/s and TTFT on a backend: each length in rounds of --rows rows of one\n"
        "sequence, then its first token. With --url URL: through a server's HTTP API instead\n"
        "(muse-bench prompt --url URL --help lists those flags).\n",
        table, sizeof table / sizeof *table, argc, argv);
    if (prc != MUSE_FLAGS_RUN) return prc;
    if ((prc = bench_kernels_flag("prompt", f.kernels, &f.path))) return prc;
    long long lengths[MAX_LENGTHS], longest = 1;
    char why[512], title[256];
    int nl = bench_parse_int_list("--lengths", f.lengths_s, 1, 1 << 24, lengths, MAX_LENGTHS, why,
                                  sizeof why);
    if (nl <= 0) return bench_usage_error("prompt", why);
    if (!f.w.dir && f.w.synthetic < 0)
        return bench_usage_error("prompt", "--model DIR (or --synthetic-weights SEED --config "
                                           "FILE), or --url URL, is required");
    muse_err e = {{0}};
    bench_engine c;
    memset(&c, 0, sizeof c);
    if (bench_weights_load(&f.w, f.backend, &c.model, &e)) {
        fprintf(stderr, "muse-bench prompt: %s\n", e.msg);
        return 1;
    }
    int64_t limit = c.model.cfg.max_position_embeddings;
    for (int i = 0; i < nl; i++)
        if (lengths[i] > longest && (limit <= 0 || lengths[i] + 1 <= limit)) longest = lengths[i];
    if (bench_engine_start(&c, f.backend, f.path, (long)f.rows, 1, longest + 1, (int)f.threads,
                           &e)) {
        fprintf(stderr, "muse-bench prompt: %s\n", e.msg);
        return 1;
    }
    snprintf(title, sizeof title,
             "Prompt processing on %s: a fresh sequence in rounds of %lld rows, then its first "
             "token (greedy)",
             f.backend, f.rows);
    bench_table t;
    bench_table_open(&t, "prompt", title, prompt_cols, 9, f.json && !strcmp(f.json, "-"));
    bench_table_io io = {f.json, f.baseline, prompt_keys, 3, "TTFT p50 ms", argc, argv};
    double bw;
    int rc = 1;
    if (bench_table_io_setup(&t, &io, why, sizeof why)) {
        fprintf(stderr, "muse-bench prompt: %s\n", why);
        bench_table_discard(&t);
        goto done;
    }
    if (bench_copy_head(c.be, (long)f.copy_mib, &t, &bw, &e)) {
        fprintf(stderr, "muse-bench prompt: %s\n", e.msg);
        bench_table_discard(&t);
        goto done;
    }
    bench_table_head(&t, "TTFT",
                     "the first round's start to the first token drawn (every round waited for)");
    bench_table_header(&t);
    rc = 0;
    for (int i = 0; i < nl && !rc; i++) rc = prompt_row(&t, &c, &f, lengths[i]) ? 1 : 0;
    if (bench_table_end(&t)) rc = 1;
done:
    bench_engine_close(&c);
    return rc;
}
