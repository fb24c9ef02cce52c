/* The rendezvous of a world of processes (rendezvous.h). Rank 0 listens on --tp-master and
 * waits for ranks 1 .. W-1; each connects (retrying until the deadline) and sends a hello:
 * magic, protocol version, byte order, world, its rank and what must agree. Rank 0 checks it
 * and, once the world is whole, answers each with its own values and the id it publishes; a
 * mismatch is answered with its kind, so both sides name both values. */
#include "tp/rendezvous.h"

#include <sys/random.h>
#include <unistd.h>

#include "base/sha256.h"
#include "tp/net.h"

#define MAGIC           "muse-tp\n"
#define VERSION         1
#define HELLO_LEN       104
#define REPLY_LEN       (24 + 48 + 32 + MUSE_TP_ID_BYTES)
#define N_AGREE         6
#define BYTE_ORDER_MARK 0x01020304u /* sent as the host holds it: floats cross as they are */

enum { ST_OK, ST_VERSION, ST_ORDER, ST_WORLD, ST_RANK, ST_DUPLICATE, ST_AGREE };

/* What every rank must agree on. */
typedef struct {
    int64_t v[N_AGREE];
    uint8_t model[32];
} agree;

static const char *const agree_names[N_AGREE] = {
    "max rows a round (--max-rows, --chunk)",
    "KV slots (--streams)",
    "context (--context; generate: prompt + --max-tokens)",
    "KV blocks (--kv-blocks)",
    "prompt-cache snapshot slots (--prompt-cache-gib)",
    "exact rows"};

int muse_tp_check_flags(const muse_tp_flags *f, long long ranks, muse_err *e)
{
    int given = (f->world > 0) + (f->rank >= 0) + (f->master != NULL);
    if (!given && f->timeout_ms)
        return muse_fail(e, "--tp-timeout-ms goes with --tp-world, --tp-rank and --tp-master");
    if (!given) return 0;
    if (given < 3)
        return muse_fail(e,
                         "%s: --tp-world W, --tp-rank R and --tp-master HOST:PORT go together; "
                         "give all three",
                         f->world <= 0 ? "--tp-world"
                         : f->rank < 0 ? "--tp-rank"
                                       : "--tp-master");
    if (f->rank >= f->world)
        return muse_fail(e, "--tp-rank %lld: outside 0 .. %lld (--tp-world %lld)", f->rank,
                         f->world - 1, f->world);
    if (ranks > 1)
        return muse_fail(e,
                         "--ranks %lld with --tp-world %lld: a process of a world holds one "
                         "rank; give one of them",
                         ranks, f->world);
    char host[256], port[16];
    return muse_net_split("--tp-master", f->master, host, sizeof host, port, sizeof port, e);
}

/* The model's identity: its config and the shape and first bytes of every tensor (a pack
 * written from another seed or config differs there; reading all of it would take minutes). */
static void model_digest(const muse_model *m, uint8_t out[32])
{
    muse_sha256 s;
    muse_sha256_init(&s);
    muse_sha256_update(&s, &m->cfg, sizeof m->cfg); /* zeroed before it was filled */
    for (size_t i = 0; i < muse_st_count(m->st); i++) {
        const muse_tensor *t = muse_st_at(m->st, i);
        uint8_t meta[8 + 8 * MUSE_MAX_DIMS + 8];
        muse_sha256_update(&s, t->name, strlen(t->name) + 1);
        muse_put64(meta, (uint64_t)t->dtype << 8 | (uint64_t)t->ndim);
        for (int d = 0; d < MUSE_MAX_DIMS; d++)
            muse_put64(meta + 8 + 8 * d, d < t->ndim ? (uint64_t)t->shape[d] : 0);
        muse_put64(meta + 8 + 8 * MUSE_MAX_DIMS, t->nbytes);
        muse_sha256_update(&s, meta, sizeof meta);
        muse_sha256_update(&s, t->data, t->nbytes < 64 ? t->nbytes : 64);
    }
    muse_sha256_final(&s, out);
}

static void agree_make(const muse_model *m, const muse_backend_opts *o, agree *a)
{
    int64_t v[N_AGREE] = {o->max_rows,  o->max_seqs,       o->context,
                          o->kv_blocks, o->snapshot_slots, o->exact_rows};
    memcpy(a->v, v, sizeof v);
    model_digest(m, a->model);
}

static void agree_put(uint8_t *p, const agree *a)
{
    for (int i = 0; i < N_AGREE; i++) muse_put64(p + 8 * i, (uint64_t)a->v[i]);
    memcpy(p + 8 * N_AGREE, a->model, 32);
}

static void agree_get(const uint8_t *p, agree *a)
{
    for (int i = 0; i < N_AGREE; i++) a->v[i] = (int64_t)muse_get64(p + 8 * i);
    memcpy(a->model, p + 8 * N_AGREE, 32);
}

/* The first difference between rank 0's values and rank r's, named with both; 0 when none. */
static int agree_diff(const agree *a0, const agree *ar, int r, char *out, size_t len)
{
    for (int i = 0; i < N_AGREE; i++)
        if (a0->v[i] != ar->v[i]) {
            snprintf(out, len, "%s: rank 0 has %lld, rank %d has %lld", agree_names[i],
                     (long long)a0->v[i], r, (long long)ar->v[i]);
            return 1;
        }
    if (memcmp(a0->model, ar->model, 32)) {
        char h0[65], hr[65];
        muse_sha256_hex(a0->model, h0);
        muse_sha256_hex(ar->model, hr);
        snprintf(out, len,
                 "the model (config.json, tensor shapes and contents) differs: rank 0 has "
                 "%.16s, rank %d has %.16s; give every rank the same pack",
                 h0, r, hr);
        return 1;
    }
    return 0;
}

static void put_hello(uint8_t *p, int world, int rank, const agree *a)
{
    uint32_t bom = BYTE_ORDER_MARK;
    memcpy(p, MAGIC, 8);
    muse_put32(p + 8, VERSION);
    memcpy(p + 12, &bom, 4);
    muse_put32(p + 16, (uint32_t)world);
    muse_put32(p + 20, (uint32_t)rank);
    agree_put(p + 24, a);
}

static void put_reply(uint8_t *p, int status, int world, const agree *a, const uint8_t *id)
{
    memset(p, 0, REPLY_LEN);
    memcpy(p, MAGIC, 8);
    muse_put32(p + 8, VERSION);
    muse_put32(p + 12, (uint32_t)status);
    muse_put32(p + 16, (uint32_t)world);
    agree_put(p + 24, a);
    memcpy(p + 24 + 48 + 32, id, MUSE_TP_ID_BYTES);
}

/* Rank 0's check of one hello: a status, and the reason in why. */
static int check_hello(const uint8_t *h, int world, const agree *mine, int *fds, int *rank,
                       char *why, size_t len)
{
    uint32_t bom;
    memcpy(&bom, h + 12, 4);
    uint32_t version = muse_get32(h + 8), w = muse_get32(h + 16), r = muse_get32(h + 20);
    *rank = -1;
    if (version != VERSION)
        return snprintf(why, len,
                        "protocol version %u, rank 0 speaks %d (use one build of "
                        "muse-engine everywhere)",
                        version, VERSION),
               ST_VERSION;
    if (bom != BYTE_ORDER_MARK) return snprintf(why, len, "a host of another byte order"), ST_ORDER;
    if ((int)w != world)
        return snprintf(why, len, "--tp-world %u, rank 0 has --tp-world %d", w, world), ST_WORLD;
    if (r < 1 || (int)r >= world)
        return snprintf(why, len, "--tp-rank %u, outside 1 .. %d", r, world - 1), ST_RANK;
    *rank = (int)r;
    if (fds[r] >= 0)
        return snprintf(why, len, "--tp-rank %u, which another process already has", r),
               ST_DUPLICATE;
    agree theirs;
    agree_get(h + 24, &theirs);
    return agree_diff(mine, &theirs, (int)r, why, len) ? ST_AGREE : ST_OK;
}

static void close_all(int *fds, int n)
{
    for (int k = 0; k < n; k++)
        if (fds[k] >= 0) close(fds[k]);
}

static muse_comm *lead(const muse_tp_flags *f, const char *host, const char *port, const agree *a,
                       muse_err *e)
{
    int world = (int)f->world, timeout = (int)f->timeout_ms;
    int fds[MUSE_TP_MAX_WORLD];
    char peers[MUSE_TP_MAX_WORLD][96];
    for (int k = 0; k < MUSE_TP_MAX_WORLD; k++) fds[k] = -1;
    uint8_t id[MUSE_TP_ID_BYTES];
    if (getrandom(id, sizeof id, 0) != (ssize_t)sizeof id) memset(id, 0, sizeof id);
    int lfd = muse_net_listen(host, port, e);
    if (lfd < 0) return muse_fail(e, "--tp-master %s: %s", f->master, e->msg), NULL;
    int64_t deadline = muse_now_ms_int() + timeout;
    for (int joined = 1; joined < world;) {
        char peer[96];
        muse_err ae = {{0}};
        int fd = muse_net_accept(lfd, deadline, peer, sizeof peer, &ae);
        if (fd < 0) {
            char missing[64] = "";
            for (int k = 1; k < world; k++)
                if (fds[k] < 0)
                    snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%d",
                             missing[0] ? ", " : "", k);
            muse_fail(e, "--tp-master %s: rank %s did not join within %d ms (%s)", f->master,
                      missing, timeout, ae.msg);
            break;
        }
        muse_net_tune(fd);
        uint8_t h[HELLO_LEN];
        int64_t hd = muse_now_ms_int() + 5000; /* a stranger may not hold the door */
        if (muse_net_read(fd, h, sizeof h, hd < deadline ? hd : deadline, &ae) ||
            memcmp(h, MAGIC, 8)) {
            fprintf(stderr,
                    "muse-engine: --tp-master %s: ignored a connection from %s: not a "
                    "muse rank (%s)\n",
                    f->master, peer, ae.msg[0] ? ae.msg : "no muse hello");
            close(fd);
            continue;
        }
        int r;
        char why[512];
        int st = check_hello(h, world, a, fds, &r, why, sizeof why);
        if (st != ST_OK) {
            uint8_t rep[REPLY_LEN];
            put_reply(rep, st, world, a, id);
            muse_net_write(fd, rep, sizeof rep, muse_now_ms_int() + 1000, &ae);
            close(fd);
            muse_fail(e, "--tp-master %s: the process at %s does not fit this world: %s", f->master,
                      peer, why);
            break;
        }
        fds[r] = fd;
        snprintf(peers[r], sizeof peers[r], "%s", peer);
        joined++;
    }
    close(lfd);
    for (int k = 1; k < world && !e->msg[0]; k++) { /* the world is whole: everyone starts */
        uint8_t rep[REPLY_LEN];
        muse_err we = {{0}};
        put_reply(rep, ST_OK, world, a, id);
        if (muse_net_write(fds[k], rep, sizeof rep, deadline + 1000, &we))
            muse_fail(e, "rank %d (%s) stopped: %s", k, peers[k], we.msg);
    }
    if (e->msg[0]) {
        close_all(fds, world);
        return NULL;
    }
    muse_comm *c = muse_comm_tcp_create(0, world, fds, timeout);
    memcpy(c->id, id, sizeof id);
    snprintf(c->peer[0], sizeof c->peer[0], "%s", f->master);
    for (int k = 1; k < world; k++) snprintf(c->peer[k], sizeof c->peer[k], "%s", peers[k]);
    return c;
}

/* Printable start of what a stranger sent, for the error. */
static void shown(const uint8_t *p, size_t n, char *out, size_t len)
{
    size_t j = 0;
    for (size_t i = 0; i < n && j + 5 < len; i++)
        j += (size_t)snprintf(out + j, len - j,
                              p[i] >= 32 && p[i] < 127 && p[i] != '"' ? "%c" : "\\x%02x", p[i]);
    out[j] = 0;
}

static muse_comm *follow(const muse_tp_flags *f, const char *host, const char *port, const agree *a,
                         muse_err *e)
{
    int world = (int)f->world, rank = (int)f->rank, timeout = (int)f->timeout_ms;
    int64_t deadline = muse_now_ms_int() + timeout;
    muse_err ce = {{0}};
    int fd;
    while ((fd = muse_net_connect(host, port, deadline, &ce)) < 0) { /* rank 0 may start later */
        if (muse_now_ms_int() + 100 >= deadline)
            return muse_fail(e, "--tp-master %s: no rank 0 answered within %d ms: %s", f->master,
                             timeout, ce.msg),
                   NULL;
        usleep(100 * 1000);
    }
    muse_net_tune(fd);
    uint8_t h[HELLO_LEN], rep[REPLY_LEN];
    put_hello(h, world, rank, a);
    if (muse_net_write(fd, h, sizeof h, deadline, &ce) ||
        muse_net_read(fd, rep, 8, deadline, &ce)) {
        close(fd);
        /* rank 0 answers once every rank has joined, and closes on a rank it refuses */
        return muse_fail(e,
                         "--tp-master %s: connected, but no muse rank 0 answered within %d ms "
                         "(%s); rank 0 answers once all %d ranks have joined, and says in its "
                         "log why it refused one",
                         f->master, timeout, ce.msg, world),
               NULL;
    }
    if (memcmp(rep, MAGIC, 8)) {
        char s[64];
        shown(rep, 8, s, sizeof s);
        close(fd);
        return muse_fail(e, "--tp-master %s answered but is not a muse rank 0 (it sent \"%s\")",
                         f->master, s),
               NULL;
    }
    if (muse_net_read(fd, rep + 8, sizeof rep - 8, deadline, &ce)) {
        close(fd);
        return muse_fail(e, "--tp-master %s: rank 0 stopped during the rendezvous: %s", f->master,
                         ce.msg),
               NULL;
    }
    agree theirs;
    agree_get(rep + 24, &theirs);
    uint32_t st = muse_get32(rep + 12), w = muse_get32(rep + 16);
    char why[512] = "";
    if (st == ST_WORLD || (st == ST_OK && (int)w != world))
        snprintf(why, sizeof why, "--tp-world %d, rank 0 has --tp-world %u", world, w);
    else if (st == ST_AGREE || (st == ST_OK && agree_diff(&theirs, a, rank, why, sizeof why)))
        agree_diff(&theirs, a, rank, why, sizeof why);
    else if (st == ST_DUPLICATE)
        snprintf(why, sizeof why, "--tp-rank %d, which another process already has", rank);
    else if (st == ST_VERSION)
        snprintf(why, sizeof why,
                 "rank 0 speaks another protocol version (use one build of "
                 "muse-engine everywhere)");
    else if (st != ST_OK)
        snprintf(why, sizeof why, "rank 0 refused it (status %u)", st);
    if (why[0]) {
        close(fd);
        return muse_fail(e,
                         "--tp-master %s: this process (rank %d) does not fit rank 0's "
                         "world: %s",
                         f->master, rank, why),
               NULL;
    }
    int fds[MUSE_TP_MAX_WORLD] = {fd};
    muse_comm *c = muse_comm_tcp_create(rank, world, fds, timeout);
    memcpy(c->id, rep + 24 + 48 + 32, MUSE_TP_ID_BYTES);
    snprintf(c->peer[0], sizeof c->peer[0], "%s", f->master);
    return c;
}

int muse_tp_join(const muse_tp_flags *fl, const muse_model *m, muse_backend_opts *o,
                 muse_comm **out, muse_err *e)
{
    *out = NULL;
    if (!muse_tp_on(fl)) return 0;
    muse_tp_flags f = *fl;
    if (f.timeout_ms <= 0) f.timeout_ms = MUSE_TP_TIMEOUT_MS;
    char host[256], port[16];
    if (muse_net_split("--tp-master", f.master, host, sizeof host, port, sizeof port, e)) return -1;
    agree a;
    agree_make(m, o, &a);
    muse_comm *c = f.rank == 0 ? lead(&f, host, port, &a, e) : follow(&f, host, port, &a, e);
    if (!c) return -1;
    o->tp_rank = (int)f.rank;
    o->tp_world = (int)f.world;
    o->comm = c;
    *out = c;
    return 0;
}
