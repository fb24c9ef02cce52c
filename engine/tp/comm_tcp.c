/* The TCP communicator (comm.h): a star through rank 0. A sum: every rank sends its buffer to
 * rank 0, which adds them in rank order (rank 0's + rank 1's + ...) and sends the sum back, so
 * the float additions are those of one process holding every rank. Every message carries a
 * header (magic, operation, length) checked against what the receiver expects: ranks out of
 * step are an error, never a misread. Simplicity and exactness over speed. */
#include <poll.h>
#include <unistd.h>

#include "tp/comm.h"
#include "tp/net.h"

#define MSG_MAGIC 0x4354504du /* "MPTC" */

enum { OP_SUM = 1, OP_GATHER = 2, OP_BCAST = 3 };
static const char *const op_names[] = {"?", "sum", "gather", "broadcast"};

typedef struct {
    muse_comm base;
    int fd[MUSE_TP_MAX_WORLD]; /* rank 0: the link to rank k; others: fd[0], the link to 0 */
    float *scratch;            /* rank 0: one peer's buffer of a sum */
    size_t scratch_n;
} tcp_comm;

static int64_t deadline(const tcp_comm *t)
{
    return muse_now_ms_int() + t->base.timeout_ms;
}

static int send_msg(tcp_comm *t, int k, uint32_t op, const void *buf, size_t len)
{
    uint8_t h[16];
    muse_put32(h, MSG_MAGIC);
    muse_put32(h + 4, op);
    muse_put64(h + 8, len);
    muse_err e = {{0}};
    int64_t d = deadline(t);
    if (muse_net_write(t->fd[k], h, sizeof h, d, &e) || muse_net_write(t->fd[k], buf, len, d, &e))
        return muse_comm_fail(&t->base, k, e.msg);
    return 0;
}

/* Reads the header of the next message from rank k: it must be op with exactly want bytes
 * (or at most want when !exact); *len gets the length. wait_ms: -1 waits for ever. */
static int recv_head(tcp_comm *t, int k, uint32_t op, size_t want, int exact, size_t *len,
                     int wait_ms)
{
    uint8_t h[16];
    muse_err e = {{0}};
    int64_t d = wait_ms < 0 ? -1 : muse_now_ms_int() + wait_ms;
    if (muse_net_read(t->fd[k], h, sizeof h, d, &e)) return muse_comm_fail(&t->base, k, e.msg);
    uint32_t got = muse_get32(h + 4);
    uint64_t n = muse_get64(h + 8);
    char why[160];
    if (muse_get32(h) != MSG_MAGIC || got != op) {
        snprintf(why, sizeof why, "out of step: sent a %s where a %s was due",
                 got < 4 ? op_names[got] : "message of no known kind", op_names[op]);
        return muse_comm_fail(&t->base, k, why);
    }
    if (exact ? n != want : n > want) {
        snprintf(why, sizeof why, "out of step: a %s of %llu bytes where %s%zu were due",
                 op_names[op], (unsigned long long)n, exact ? "" : "at most ", want);
        return muse_comm_fail(&t->base, k, why);
    }
    *len = (size_t)n;
    return 0;
}

static int recv_body(tcp_comm *t, int k, void *buf, size_t len)
{
    muse_err e = {{0}};
    if (muse_net_read(t->fd[k], buf, len, deadline(t), &e))
        return muse_comm_fail(&t->base, k, e.msg);
    return 0;
}

static int tcp_all_reduce(muse_comm *c, float *buf, size_t n)
{
    tcp_comm *t = (tcp_comm *)c;
    size_t bytes = n * sizeof *buf, len;
    if (c->rank) /* a follower: its part up, the sum back */
        return send_msg(t, 0, OP_SUM, buf, bytes) ||
                       recv_head(t, 0, OP_SUM, bytes, 1, &len, c->timeout_ms) ||
                       recv_body(t, 0, buf, bytes)
                   ? -1
                   : 0;
    if (n > t->scratch_n) { /* grows to the largest sum once, then stays */
        float *s = realloc(t->scratch, bytes);
        if (!s) return muse_comm_fail(c, 0, "no memory for a sum's buffer");
        t->scratch = s;
        t->scratch_n = n;
    }
    for (int k = 1; k < c->world; k++) { /* rank order: the same additions as one process */
        if (recv_head(t, k, OP_SUM, bytes, 1, &len, c->timeout_ms) ||
            recv_body(t, k, t->scratch, bytes))
            return -1;
        for (size_t i = 0; i < n; i++) buf[i] += t->scratch[i];
    }
    for (int k = 1; k < c->world; k++)
        if (send_msg(t, k, OP_SUM, buf, bytes)) return -1;
    return 0;
}

static int tcp_gather(muse_comm *c, const void *send, const size_t *bytes, void *recv)
{
    tcp_comm *t = (tcp_comm *)c;
    if (c->rank) return send_msg(t, 0, OP_GATHER, send, bytes[c->rank]);
    uint8_t *at = recv;
    if (send != recv) memmove(at, send, bytes[0]);
    at += bytes[0];
    for (int k = 1; k < c->world; k++) {
        size_t len;
        if (recv_head(t, k, OP_GATHER, bytes[k], 1, &len, c->timeout_ms) ||
            recv_body(t, k, at, len))
            return -1;
        at += len;
    }
    return 0;
}

static int tcp_broadcast(muse_comm *c, void *buf, size_t *len, size_t cap, int wait_ms)
{
    tcp_comm *t = (tcp_comm *)c;
    if (c->rank)
        return recv_head(t, 0, OP_BCAST, cap, 0, len, wait_ms) || recv_body(t, 0, buf, *len) ? -1
                                                                                             : 0;
    for (int k = 1; k < c->world; k++)
        if (send_msg(t, k, OP_BCAST, buf, *len)) return -1;
    return 0;
}

/* A peer that exited or closed its end shows as a hang-up on the link, data or not. */
static int tcp_watch(const muse_comm *c, muse_err *e)
{
    const tcp_comm *t = (const tcp_comm *)c;
    struct pollfd p[MUSE_TP_MAX_WORLD];
    int n = 0, rank_of[MUSE_TP_MAX_WORLD];
    for (int k = 0; k < c->world; k++)
        if (t->fd[k] >= 0) {
            p[n] = (struct pollfd){.fd = t->fd[k], .events = POLLRDHUP};
            rank_of[n++] = k;
        }
    if (poll(p, (nfds_t)n, 0) <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (p[i].revents & (POLLRDHUP | POLLHUP | POLLERR))
            return muse_fail(e, "rank %d (%s) stopped: closed the connection", rank_of[i],
                             c->peer[rank_of[i]]);
    return 0;
}

static void tcp_destroy(muse_comm *c)
{
    tcp_comm *t = (tcp_comm *)c;
    for (int k = 0; k < c->world; k++)
        if (t->fd[k] >= 0) close(t->fd[k]);
    free(t->scratch);
    free(t);
}

static const muse_comm_ops tcp_ops = {
    .name = "tcp",
    .all_reduce_f32 = tcp_all_reduce,
    .gather = tcp_gather,
    .broadcast = tcp_broadcast,
    .watch = tcp_watch,
    .destroy = tcp_destroy,
};

muse_comm *muse_comm_tcp_create(int rank, int world, const int *fds, int timeout_ms)
{
    tcp_comm *t = MUSE_CALLOC(1, sizeof *t);
    t->base.ops = &tcp_ops;
    t->base.rank = rank;
    t->base.world = world;
    t->base.timeout_ms = timeout_ms;
    for (int k = 0; k < MUSE_TP_MAX_WORLD; k++) t->fd[k] = -1;
    for (int k = 0; k < world; k++) t->fd[k] = fds[k];
    return &t->base;
}

int muse_comm_fail(muse_comm *c, int rank, const char *why)
{
    if (!c->failed) {
        c->failed = 1;
        muse_fail(&c->err, "rank %d (%s) stopped: %s", rank, c->peer[rank], why);
    }
    return -1;
}

void muse_comm_destroy(muse_comm *c)
{
    if (!c) return;
    free(c->rec);
    c->ops->destroy(c);
}
