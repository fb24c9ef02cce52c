/* What muse-bench decode, prompt, chat and stages share: a model on a backend with its forward,
 * and timed rounds of it (a prompt chunk of one sequence, a decode round of several). */
#ifndef MUSE_BENCH_ENGINE_H
#define MUSE_BENCH_ENGINE_H

#include "backend/backend.h"
#include "model/forward.h"
#include "model/model.h"

typedef struct {
    muse_model model;
    muse_backend *be;
    muse_forward *fwd;
    int64_t vocab;
    long max_rows;
    /* one round's batch, [max_rows] each */
    int32_t *tok, *seq;
    int64_t *pos, *draw;
    uint8_t *want;
    muse_sampling *sp;
} bench_engine;

/* The backend and forward for c->model (loaded by the caller): rounds of up to max_rows rows
 * over max_seqs sequences of context positions. 0, or -1 with why (the model freed). */
int bench_engine_start(bench_engine *c, const char *backend, muse_kernels kernels, long max_rows,
                       int max_seqs, int64_t context, int threads, muse_err *e);
void bench_engine_close(bench_engine *c);
/* The same without owning the model: attach leaves it loaded on failure, detach destroys the
 * backend and forward only, so one model serves several backends in turn. */
int bench_engine_attach(bench_engine *c, const char *backend, muse_kernels kernels, long max_rows,
                        int max_seqs, int64_t context, int threads, muse_err *e);
void bench_engine_detach(bench_engine *c);

/* Seconds of one round of `rows` consecutive positions pos .. of sequence seq, the last row's
 * token drawn greedily when `draw`; -1 after saying why on stderr (a device error is an error,
 * never an abort). */
double bench_engine_chunk(bench_engine *c, int seq, int64_t pos, long rows, int draw);
/* Seconds of one decode round: one row at pos for each of sequences 0 .. streams-1, every row
 * drawn greedily; -1 as above. */
double bench_engine_decode(bench_engine *c, int streams, int64_t pos);

#endif
