/* The forward plan of MUSE_SPARK.md over a backend's operations: one call runs every row of
 * a round (prompt chunks and decode tokens of many sequences) through every layer, then the
 * head and the sampler, between the backend's begin_round and end_round. */
#ifndef MUSE_FORWARD_H
#define MUSE_FORWARD_H

#include "backend/backend.h"

typedef struct muse_forward muse_forward;

/* What a world of processes does before the plan changes the ranks' state: rank 0 publishes
 * each round and snapshot first so the other ranks replay them (tp/follow.h supplies it;
 * the plan knows nothing of tp/). */
typedef struct {
    /* before round r runs: 0, or -1 with e set and the round not run */
    int (*before_round)(void *ctx, const muse_backend *be, const muse_round *r, muse_err *e);
    /* before a snapshot save (1) or load; a failure shows in the next round */
    void (*before_snapshot)(void *ctx, int save, int seq, int64_t end_pos, int slot);
    void *ctx;
} muse_round_hook;

/* Allocates every activation buffer from the backend once (max_rows rows each). */
muse_forward *muse_forward_create(muse_backend *be);
/* The floats of those buffers (the memory plan counts them before any backend exists): [0] a
 * row of max_rows, [1] a row of max_wanted (the logits). */
void muse_forward_act_floats(const muse_model *m, long floats[2]);
void muse_forward_destroy(muse_forward *f);
muse_backend *muse_forward_backend(const muse_forward *f);
/* Sets (a copy of) the round hook; NULL: none (the default: one process). */
void muse_forward_set_hook(muse_forward *f, const muse_round_hook *hook);

/* Runs the round; out gets the drawn ids (and logits when asked), valid until the next run.
 * Refuses bad tokens, positions and slots by name; a device failure comes back as -1. */
int muse_forward_run(muse_forward *f, const muse_round *r, muse_round_out *out, muse_err *e);

/* The prompt cache's snapshot save (save 1) or load through the plan, so every rank of a
 * world of processes does it too. */
void muse_forward_snapshot(muse_forward *f, int save, int seq, int64_t end_pos, int slot);

#endif
