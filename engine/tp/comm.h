/* The communicator between the ranks of a world that spans processes (or hosts): the three
 * collectives a backend and the round stream need, behind a small table so a transport slots
 * in (TCP now, used by the CPU backend; NCCL later for CUDA). Sums run in rank order 0, 1, ...
 * so the bits equal one process holding every rank (--ranks W). Errors are sticky: after the
 * first failure every call returns -1 at once and muse_comm_error names the rank that failed. */
#ifndef MUSE_TP_COMM_H
#define MUSE_TP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "base/muse_common.h"

#define MUSE_TP_ID_BYTES  128 /* the opaque id rank 0 publishes (NCCL's ncclUniqueId) */
#define MUSE_TP_MAX_WORLD 8   /* MUSE_MAX_RANKS of backend.h (asserted there) */

typedef struct muse_comm muse_comm;

typedef struct {
    const char *name;
    /* buf[n] = the sum over ranks of every rank's buf[n], added in rank order; all hold it */
    int (*all_reduce_f32)(muse_comm *c, float *buf, size_t n);
    /* Rank 0 gets every rank's part laid side by side in rank order in recv (bytes[k] from
     * rank k, its own first); other ranks send theirs. recv is used on rank 0 only. */
    int (*gather)(muse_comm *c, const void *send, const size_t *bytes, void *recv);
    /* Rank 0 sends *len bytes of buf; the others receive at most cap into buf, *len set.
     * wait_ms bounds the wait for the start (-1: none, a follower between rounds). */
    int (*broadcast)(muse_comm *c, void *buf, size_t *len, size_t cap, int wait_ms);
    /* Between rounds, from another thread: 0 while every peer's link is up, else -1 naming the
     * first lost in e. Reads nothing and changes no state, so it may run beside a collective. */
    int (*watch)(const muse_comm *c, muse_err *e);
    void (*destroy)(muse_comm *c);
} muse_comm_ops;

struct muse_comm {
    const muse_comm_ops *ops;
    int rank, world;
    int timeout_ms;                   /* a collective's wait on a peer */
    uint8_t id[MUSE_TP_ID_BYTES];     /* what rank 0 published at the rendezvous */
    char peer[MUSE_TP_MAX_WORLD][96]; /* HOST:PORT of each rank, for the log lines */
    uint8_t *rec; /* rank 0: the round stream's record buffer (follow.c), grown once */
    size_t rec_cap;
    int failed;
    muse_err err; /* the first failure: "rank 1 (10.0.0.2:41234) stopped: ..." */
};

static inline int muse_comm_all_reduce_f32(muse_comm *c, float *buf, size_t n)
{
    return c->failed ? -1 : c->ops->all_reduce_f32(c, buf, n);
}
static inline int muse_comm_gather(muse_comm *c, const void *send, const size_t *bytes, void *recv)
{
    return c->failed ? -1 : c->ops->gather(c, send, bytes, recv);
}
static inline int muse_comm_broadcast(muse_comm *c, void *buf, size_t *len, size_t cap, int wait_ms)
{
    return c->failed ? -1 : c->ops->broadcast(c, buf, len, cap, wait_ms);
}
/* 0 while the world is whole; else -1 with the first failure in e. */
static inline int muse_comm_error(const muse_comm *c, muse_err *e)
{
    if (!c->failed) return 0;
    if (e) *e = c->err;
    return -1;
}
static inline int muse_comm_watch(const muse_comm *c, muse_err *e)
{
    return c->ops->watch(c, e);
}
void muse_comm_destroy(muse_comm *c);

/* Records the first failure (sticky) naming rank and its address; returns -1. */
int muse_comm_fail(muse_comm *c, int rank, const char *why);

/* The TCP transport over the links the rendezvous made: fds[k] the link to rank k on rank 0
 * (fds[0] unused), fds[0] the link to rank 0 elsewhere. Takes the descriptors. */
muse_comm *muse_comm_tcp_create(int rank, int world, const int *fds, int timeout_ms);

#endif
