/* muse-bench's model on a backend: the backend and forward made for a loaded model, and one
 * timed round of it (a prompt chunk of one sequence, or a decode row of each of several). */
#include "bench_engine.h"

#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/muse_common.h"

int bench_engine_attach(bench_engine *c, const char *backend, muse_kernels kernels, long max_rows,
                        int max_seqs, int64_t context, int threads, muse_err *e)
{
    muse_backend_opts o = {.max_rows = max_rows,
                           .max_seqs = max_seqs,
                           .context = context,
                           .threads = threads,
                           .kernels = kernels};
    if (!(c->be = muse_backend_create(backend, &c->model, &o, e))) return -1;
    c->fwd = muse_forward_create(c->be);
    c->vocab = c->model.cfg.vocab_size;
    c->max_rows = max_rows;
    size_t n = (size_t)max_rows;
    c->tok = MUSE_MALLOC(n * sizeof *c->tok);
    c->seq = MUSE_MALLOC(n * sizeof *c->seq);
    c->pos = MUSE_MALLOC(n * sizeof *c->pos);
    c->draw = MUSE_MALLOC(n * sizeof *c->draw);
    c->want = MUSE_MALLOC(n * sizeof *c->want);
    c->sp = MUSE_CALLOC(n, sizeof *c->sp); /* greedy: temperature 0 */
    return 0;
}

int bench_engine_start(bench_engine *c, const char *backend, muse_kernels kernels, long max_rows,
                       int max_seqs, int64_t context, int threads, muse_err *e)
{
    int rc = bench_engine_attach(c, backend, kernels, max_rows, max_seqs, context, threads, e);
    if (rc) muse_model_free(&c->model);
    return rc;
}

void bench_engine_close(bench_engine *c)
{
    bench_engine_detach(c);
    muse_model_free(&c->model);
    memset(c, 0, sizeof *c);
}

void bench_engine_detach(bench_engine *c)
{
    muse_forward_destroy(c->fwd);
    muse_backend_destroy(c->be);
    c->fwd = NULL;
    c->be = NULL;
    free(c->tok);
    free(c->seq);
    free(c->pos);
    free(c->draw);
    free(c->want);
    free(c->sp);
    c->tok = c->seq = NULL;
    c->pos = c->draw = NULL;
    c->want = NULL;
    c->sp = NULL;
}

/* The round of c's batch (rows filled in), its wanted rows drawn greedily; seconds or -1. */
static double run_round(bench_engine *c, long rows)
{
    long wanted = 0;
    for (long i = 0; i < rows; i++)
        if (c->want[i]) c->draw[wanted++] = c->pos[i] + 1;
    muse_round b = {.rows = rows,
                    .tokens = c->tok,
                    .positions = c->pos,
                    .seqs = c->seq,
                    .want_logits = c->want,
                    .sampling = wanted ? c->sp : NULL,
                    .draw_pos = wanted ? c->draw : NULL};
    for (long i = 0; i < rows; i++) /* the scheduler's job */
        if (i == rows - 1 || c->seq[i + 1] != c->seq[i])
            if (muse_kv_ensure(&c->be->kv, c->seq[i], c->pos[i] + 1)) {
                fprintf(stderr, "muse-bench: no KV blocks for sequence %d at position %lld\n",
                        (int)c->seq[i], (long long)c->pos[i]);
                return -1;
            }
    muse_round_out out;
    muse_err e = {{0}};
    double t0 = muse_now_s();
    int rc = muse_forward_run(c->fwd, &b, &out, &e);
    double t = muse_now_s() - t0;
    if (rc)
        fprintf(stderr, "muse-bench: forward at position %lld: %s\n", (long long)c->pos[0], e.msg);
    return rc ? -1 : t;
}

/* A token id of position p of sequence s, spread over the vocabulary. */
static int32_t token_of(const bench_engine *c, int s, int64_t p)
{
    return (int32_t)(((uint64_t)p * 2654435761u + (uint64_t)s * 40503u) % (uint64_t)c->vocab);
}

double bench_engine_chunk(bench_engine *c, int seq, int64_t pos, long rows, int draw)
{
    MUSE_CHECK(rows >= 1 && rows <= c->max_rows);
    for (long i = 0; i < rows; i++) {
        c->tok[i] = token_of(c, seq, pos + i);
        c->pos[i] = pos + i;
        c->seq[i] = seq;
        c->want[i] = draw && i == rows - 1;
    }
    return run_round(c, rows);
}

double bench_engine_decode(bench_engine *c, int streams, int64_t pos)
{
    MUSE_CHECK(streams >= 1 && streams <= c->max_rows);
    for (int s = 0; s < streams; s++) {
        c->tok[s] = token_of(c, s, pos);
        c->pos[s] = pos;
        c->seq[s] = s;
        c->want[s] = 1;
    }
    return run_round(c, streams);
}
