/* The forward plan of MUSE_SPARK.md over a backend's operations: one call runs every row of
 * a batch (prompt chunks and decode tokens of many sequences) through every layer. */
#ifndef MUSE_FORWARD_H
#define MUSE_FORWARD_H

#include "backend/backend.h"

typedef struct muse_forward muse_forward;

/* Sizes every activation buffer for be->opts.max_rows once. */
muse_forward *muse_forward_create(muse_backend *be);
void muse_forward_destroy(muse_forward *f);
muse_backend *muse_forward_backend(const muse_forward *f);

/* Runs the batch; returns the logits of the wanted rows, [n_wanted, vocab_size], owned by
 * the plan and valid until the next run. Refuses bad tokens, positions and slots by name. */
const float *muse_forward_run(muse_forward *f, const muse_batch *b, muse_err *e);

#endif
