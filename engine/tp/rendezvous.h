/* How the processes of one tensor-parallel world find each other: the --tp-* flags, what every
 * rank must agree on, and the rendezvous at rank 0's HOST:PORT that checks it and hands out the
 * id rank 0 publishes (an opaque 128 bytes: NCCL's unique id once CUDA joins). */
#ifndef MUSE_TP_RENDEZVOUS_H
#define MUSE_TP_RENDEZVOUS_H

#include "backend/backend.h"
#include "tp/comm.h"

#define MUSE_TP_TIMEOUT_MS 30000 /* --tp-timeout-ms when not given */

/* The flags as parsed: world 0, rank -1, master NULL, timeout 0 when not given. */
typedef struct {
    long long world, rank;
    const char *master; /* HOST:PORT rank 0 listens on */
    long long timeout_ms;
} muse_tp_flags;

/* Flag entries every command shares (append to its table). */
#define MUSE_TP_FLAG_ENTRIES(f)                                                                    \
    MUSE_FLAG_L("tp-world", &(f)->world, 2, MUSE_MAX_RANKS, "W",                                   \
                "ranks in a world of several processes (one rank each), e.g. one a\n"              \
                "host; with --tp-rank and --tp-master",                                            \
                .def = "off: every rank in this process"),                                         \
        MUSE_FLAG_L("tp-rank", &(f)->rank, 0, MUSE_MAX_RANKS - 1, "R",                             \
                    "this process's rank, 0 .. W-1 (0 serves; the others follow it)", .def = ""),  \
        MUSE_FLAG_S("tp-master", &(f)->master, "HOST:PORT",                                        \
                    "where rank 0 listens and the other ranks connect", .def = ""),                \
        MUSE_FLAG_L("tp-timeout-ms", &(f)->timeout_ms, 1, 3600000, "N",                            \
                    "how long the ranks wait for each other (at the start, and for a\n"            \
                    "peer's part of a sum)",                                                       \
                    .def = "30000")

/* Before anything is loaded: the flags given all together or not at all, R within 0 .. W-1,
 * HOST:PORT well formed, no --ranks N > 1 beside them. 0 when off or valid, else -1 with an
 * error naming the flag. */
int muse_tp_check_flags(const muse_tp_flags *f, long long ranks, muse_err *e);
static inline int muse_tp_on(const muse_tp_flags *f)
{
    return f->world > 1;
}

/* Joins the world of f for the model and backend options o (what must agree: the model's
 * config and a sample of every tensor, max rows, KV slots, context, KV blocks, snapshot slots,
 * exact rows): rank 0 waits for every other rank, the others connect to it with retries, all
 * within the timeout. Sets o->tp_rank, tp_world and comm. -1 with an error naming the flag,
 * the ranks and both values of anything that differs. */
int muse_tp_join(const muse_tp_flags *f, const muse_model *m, muse_backend_opts *o, muse_comm **out,
                 muse_err *e);

#endif
