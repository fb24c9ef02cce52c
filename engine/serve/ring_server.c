/* The engine's IO side: shared-memory segment, doorbell socket, libevent loop (ring_server.h). */
#include "serve/ring_server.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <sys/random.h>
#include <event2/event.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/sha256.h"

#define SIDE_DONE     1u /* the scheduler finished (or never will get it) */
#define SIDE_GONE     2u /* the worker closed its doorbell */
#define REAP_AFTER_NS (10ull * 1000000000ull)

typedef struct {
    muse_server *server;
    uint32_t index;
    pthread_mutex_t mu; /* guards fd against close while the scheduler rings */
    int fd;             /* doorbell, -1 when none */
    struct event *ev;   /* IO thread: EOF watcher */
    _Atomic uint32_t sides;
    _Atomic int cancelled;
    _Atomic uint64_t generation; /* the claimed generation (private copy); 0 while free */
    uint64_t head;               /* authoritative head; the shared one is only published */
    uint8_t *request;            /* private copy of the request record (request_bytes + 1) */
    muse_request_view view;
    /* the reaper's own view of a claimed slot: what it saw and when it first saw it */
    uint64_t seen_gen, seen_ns;
    uint32_t seen_pid;
} slot_priv;

typedef struct pending_conn {
    muse_server *s;
    int fd;
    struct event *ev;
    uint8_t buf[sizeof(muse_auth_msg)]; /* the answer to the challenge, then the claim */
    size_t got, want;
    int authed;        /* the hello went: a claim is next */
    uint8_t nonce[32]; /* the challenge's, with a worker key */
} pending_conn;

struct muse_server {
    char shm_name[256], socket_path[108]; /* shm_name: the memfd's label (/proc/PID/fd) */
    uint32_t abi_version;
    int shm_fd, listen_fd, stop_fd;
    uint8_t scope_key[MUSE_SCOPE_KEY_BYTES]; /* handed over with the segment, never in it */
    uint8_t worker_key[256];                 /* the peer must prove it holds it; len 0: off */
    size_t worker_key_len;
    uint8_t *base;
    muse_ring_header *hdr; /* shared: only state, heartbeat and magic are written there */
    muse_ring_header lay;  /* the layout as created: a worker may scribble on the shared copy */
    slot_priv *slots;
    struct event_base *evb;
    struct event *listen_ev, *stop_ev, *reap_ev;
    pthread_t io;
    int io_started;
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    uint32_t *queue, qhead, qcount;
    pthread_mutex_t health_mu;
};

static muse_ring_slot *shm_slot(muse_server *s, uint32_t i)
{
    return muse_ring_slot_at(s->base, &s->lay, i);
}

/* ---- slot ownership ---- */

static void slot_free(muse_server *s, uint32_t i)
{
    slot_priv *p = &s->slots[i];
    atomic_store(&p->generation, 0); /* first: any handle to the old request is stale now */
    atomic_store(&p->cancelled, 0);
    atomic_store(&p->sides, 0);
    atomic_store(&shm_slot(s, i)->state, MUSE_SLOT_FREE);
}

/* One side (scheduler or worker) lets go; the second one frees the slot. */
static void slot_release_side(muse_server *s, uint32_t i, uint32_t side)
{
    uint32_t old = atomic_fetch_or(&s->slots[i].sides, side);
    if (old & side) return;
    if ((old | side) == (SIDE_DONE | SIDE_GONE)) slot_free(s, i);
}

static void slot_close_doorbell(muse_server *s, uint32_t i)
{
    slot_priv *p = &s->slots[i];
    if (p->ev) {
        event_free(p->ev);
        p->ev = NULL;
    }
    pthread_mutex_lock(&p->mu);
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    pthread_mutex_unlock(&p->mu);
}

static void ring_doorbell(muse_server *s, uint32_t i)
{
    slot_priv *p = &s->slots[i];
    if (atomic_exchange(&shm_slot(s, i)->wake, 1u) != 0) return;
    pthread_mutex_lock(&p->mu);
    /* a full socket buffer already holds a wake-up; any other failure must not eat this one */
    if (p->fd >= 0 && send(p->fd, "e", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN)
        atomic_store(&shm_slot(s, i)->wake, 0u);
    pthread_mutex_unlock(&p->mu);
}

/* ---- IO thread: doorbell connections ---- */

static void on_doorbell(evutil_socket_t fd, short what, void *arg);

static void queue_push(muse_server *s, uint32_t i)
{
    pthread_mutex_lock(&s->qmu);
    uint32_t n = s->lay.slot_count;
    s->queue[(s->qhead + s->qcount) % n] = i;
    s->qcount++;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
}

/* Writes an error + END record straight into a slot nobody schedules, then marks it done. */
static void reject_slot(muse_server *s, uint32_t i, const char *why)
{
    char msg[256];
    int n = snprintf(msg, sizeof msg,
                     "{\"error\":{\"message\":\"the engine rejected the request record: %s\","
                     "\"type\":\"server_error\",\"param\":null,\"code\":\"bad_record\"}}",
                     why);
    fprintf(stderr, "muse-engine: slot %u: request record rejected: %s\n", i, why);
    if (n < 0 || (size_t)n >= sizeof msg) n = (int)strlen(msg);
    muse_slot_ref ref = {i, atomic_load(&s->slots[i].generation)};
    muse_server_emit(s, ref, MUSE_EV_ERROR, 500, msg, (size_t)n);
    muse_server_finish(s, ref);
}

static int claim_is_valid(muse_server *s, int fd, const muse_claim_msg *m, const char **why)
{
    struct ucred cred;
    socklen_t cl = sizeof cred;
    muse_ring_slot *sl;
    if (m->magic != MUSE_CLAIM_MAGIC) return *why = "bad claim magic", 0;
    if (m->abi_version != s->abi_version) return *why = "claim ABI version mismatch", 0;
    if (m->segment_generation != s->lay.generation) return *why = "stale segment generation", 0;
    if (!(sl = shm_slot(s, m->slot))) return *why = "slot index out of range", 0;
    if (s->slots[m->slot].fd >= 0 || atomic_load(&s->slots[m->slot].sides) != 0)
        return *why = "slot already has a doorbell", 0;
    if (atomic_load(&sl->state) != MUSE_SLOT_SUBMITTED) return *why = "slot not submitted", 0;
    if (atomic_load(&sl->generation) != m->slot_generation)
        return *why = "stale slot generation", 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
        return *why = "cannot tell who the claimer is", 0;
    if ((uint32_t)cred.pid != atomic_load(&sl->owner_pid))
        return *why = "claimer is not the slot owner", 0;
    return 1;
}

static void accept_claim(muse_server *s, int fd, const muse_claim_msg *m)
{
    uint32_t i = m->slot;
    slot_priv *p = &s->slots[i];
    muse_ring_slot *sl = shm_slot(s, i);
    const char *why;

    atomic_store(&sl->state, MUSE_SLOT_ACTIVE);
    p->generation = m->slot_generation;
    p->head = 0;
    atomic_store(&sl->head, 0);
    atomic_store(&p->cancelled, 0);
    atomic_store(&p->sides, 0);
    p->fd = fd;
    p->ev = event_new(s->evb, fd, EV_READ | EV_PERSIST, on_doorbell, p);
    MUSE_CHECK(p->ev && event_add(p->ev, NULL) == 0);
    /* The worker may still scribble on the shared area: decode a private copy, of only the
     * bytes the header claims (bounded by the area; decode checks them against that length) */
    const uint8_t *area = muse_ring_request_area(sl);
    muse_request_record rec;
    memcpy(&rec, area, sizeof rec);
    uint64_t used = (uint64_t)sizeof rec + rec.scope_len + rec.body_len;
    size_t n = used < s->lay.request_bytes ? (size_t)used : s->lay.request_bytes;
    memcpy(p->request, area, n);
    if (muse_request_decode(p->request, n, p->generation, &p->view, &why)) {
        reject_slot(s, i, why);
        return;
    }
    /* Terminate the body for JSON parsers; the area has one spare byte past request_bytes. */
    ((uint8_t *)p->view.body)[p->view.body_len] = 0;
    queue_push(s, i);
}

static void pending_free(pending_conn *pc, int close_fd)
{
    event_free(pc->ev);
    if (close_fd) close(pc->fd);
    free(pc);
}

static int send_hello(muse_server *s, int c);

/* The peer, for the log: pid and uid from SO_PEERCRED. */
static void peer_names(int fd, char *out, size_t cap)
{
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
        snprintf(out, cap, "pid %d, uid %u, gid %u", (int)cred.pid, (unsigned)cred.uid,
                 (unsigned)cred.gid);
    else
        snprintf(out, cap, "unknown peer");
}

/* The challenge's answer: HMAC-SHA-256(worker key, label || nonce), compared in constant time. */
static int auth_is_valid(muse_server *s, const pending_conn *pc)
{
    muse_auth_msg a;
    uint8_t msg[sizeof MUSE_AUTH_LABEL - 1 + 32], want[32];
    memcpy(&a, pc->buf, sizeof a);
    memcpy(msg, MUSE_AUTH_LABEL, sizeof MUSE_AUTH_LABEL - 1);
    memcpy(msg + sizeof MUSE_AUTH_LABEL - 1, pc->nonce, 32);
    muse_hmac_sha256(s->worker_key, s->worker_key_len, msg, sizeof msg, want);
    int mac_ok = muse_equal_ct(a.mac, want, sizeof want);
    return mac_ok && a.magic == MUSE_AUTH_MAGIC && a.abi_version == s->abi_version;
}

static void on_pending(evutil_socket_t fd, short what, void *arg)
{
    pending_conn *pc = arg;
    muse_server *s = pc->s;
    muse_claim_msg m;
    const char *why;
    char who[96];
    if (what & EV_TIMEOUT) { /* connected but never said which slot: not a worker */
        if (!pc->authed) {
            peer_names(fd, who, sizeof who);
            fprintf(stderr,
                    "muse-engine: a peer (%s) did not answer the worker-key challenge "
                    "in time: closed, no segment sent\n",
                    who);
        }
        pending_free(pc, 1);
        return;
    }
    ssize_t n = recv(fd, pc->buf + pc->got, pc->want - pc->got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        if (!pc->authed) {
            peer_names(fd, who, sizeof who);
            fprintf(stderr,
                    "muse-engine: a peer (%s) closed without answering the worker-key "
                    "challenge: no segment sent\n",
                    who);
        }
        pending_free(pc, 1);
        return;
    }
    pc->got += (size_t)n;
    if (pc->got < pc->want) return;
    if (!pc->authed) {
        if (!auth_is_valid(s, pc)) {
            peer_names(fd, who, sizeof who);
            fprintf(stderr,
                    "muse-engine: refused a peer (%s) without the worker key: wrong "
                    "answer to the challenge, no segment sent\n",
                    who);
            pending_free(pc, 1);
            return;
        }
        pc->authed = 1;
        pc->got = 0;
        pc->want = sizeof(muse_claim_msg);
        if (send_hello(s, fd) != 0) pending_free(pc, 1);
        return;
    }
    memcpy(&m, pc->buf, sizeof m);
    if (!claim_is_valid(s, fd, &m, &why)) {
        fprintf(stderr, "muse-engine: claim refused: %s\n", why);
        pending_free(pc, 1);
        return;
    }
    pending_free(pc, 0);
    accept_claim(s, fd, &m);
}

/* Anything readable on an accepted doorbell is EOF (cancel) or a protocol violation. */
static void on_doorbell(evutil_socket_t fd, short what, void *arg)
{
    slot_priv *p = arg;
    char buf[64];
    (void)what;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) fprintf(stderr, "muse-engine: slot %u: unexpected bytes on doorbell\n", p->index);
    atomic_store(&p->cancelled, 1);
    slot_close_doorbell(p->server, p->index);
    slot_release_side(p->server, p->index, SIDE_GONE);
}

static void relisten(evutil_socket_t fd, short what, void *arg)
{
    muse_server *s = arg;
    (void)fd, (void)what;
    event_add(s->listen_ev, NULL);
}

/* The first bytes on every connection: the hello and the segment's descriptor (SCM_RIGHTS).
 * A fresh socket's buffer is empty, so 64 bytes go at once or the peer is not reading. */
static int send_hello(muse_server *s, int c)
{
    muse_hello_msg h;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&h, 0, sizeof h);
    memset(&ctl, 0, sizeof ctl);
    h.magic = MUSE_HELLO_MAGIC;
    h.abi_version = s->abi_version;
    h.generation = s->lay.generation;
    h.total_bytes = s->lay.total_bytes;
    h.engine_pid = (uint32_t)getpid();
    memcpy(h.scope_key, s->scope_key, sizeof h.scope_key);
    struct iovec iov = {&h, sizeof h};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &s->shm_fd, sizeof(int));
    ssize_t n = sendmsg(c, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    return n == (ssize_t)sizeof h ? 0 : -1;
}

/* With a worker key: a fresh nonce a connection, no descriptor; the hello waits for the answer. */
static int send_challenge(muse_server *s, pending_conn *pc)
{
    muse_challenge_msg ch;
    memset(&ch, 0, sizeof ch);
    if (getrandom(pc->nonce, sizeof pc->nonce, 0) != (ssize_t)sizeof pc->nonce) return -1;
    ch.magic = MUSE_CHALLENGE_MAGIC;
    ch.abi_version = s->abi_version;
    memcpy(ch.nonce, pc->nonce, sizeof ch.nonce);
    ch.engine_pid = (uint32_t)getpid();
    pc->want = sizeof(muse_auth_msg);
    return send(pc->fd, &ch, sizeof ch, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof ch ? 0 : -1;
}

static void on_accept(evutil_socket_t fd, short what, void *arg)
{
    muse_server *s = arg;
    (void)what;
    for (int k = 0; k < 64; k++) {
        int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS)) {
            /* out of descriptors: a level-triggered listener would spin; listen again in 1 s */
            static const struct timeval one_s = {1, 0};
            fprintf(stderr, "muse-engine: accept: %s; pausing the listener for 1 s\n",
                    strerror(errno));
            event_del(s->listen_ev);
            event_base_once(s->evb, -1, EV_TIMEOUT, relisten, s, &one_s);
            return;
        }
        if (c < 0) return;
        pending_conn *pc = calloc(1, sizeof *pc);
        if (!pc) {
            close(c);
            continue;
        }
        pc->s = s;
        pc->fd = c;
        pc->want = sizeof(muse_claim_msg);
        pc->authed = s->worker_key_len == 0;
        if (pc->authed ? send_hello(s, c) != 0 : send_challenge(s, pc) != 0) {
            close(c);
            free(pc);
            continue;
        }
        static const struct timeval claim_within = {2, 0};
        pc->ev = event_new(s->evb, c, EV_READ | EV_PERSIST, on_pending, pc);
        if (!pc->ev || event_add(pc->ev, &claim_within) != 0) {
            if (pc->ev) event_free(pc->ev);
            close(c);
            free(pc);
        }
    }
}

/* Frees slots whose claimer died or never connected. */
static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    muse_server *s = arg;
    uint64_t now = (uint64_t)muse_now_ns();
    (void)fd, (void)what;
    for (uint32_t i = 0; i < s->lay.slot_count; i++) {
        muse_ring_slot *sl = shm_slot(s, i);
        uint32_t st = atomic_load(&sl->state);
        slot_priv *p = &s->slots[i];
        if (st != MUSE_SLOT_CLAIMED && st != MUSE_SLOT_SUBMITTED) {
            p->seen_ns = 0;
            continue;
        }
        if (p->fd >= 0) continue;
        /* judge only a claim seen unchanged since the last pass: a worker that just won the
         * slot may not have written its pid and generation yet (times are the reaper's own) */
        uint32_t pid = atomic_load(&sl->owner_pid);
        uint64_t gen = atomic_load(&sl->generation);
        if (!p->seen_ns || p->seen_gen != gen || p->seen_pid != pid) {
            p->seen_ns = now;
            p->seen_gen = gen;
            p->seen_pid = pid;
            continue;
        }
        int dead = pid != 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        if (dead || now - p->seen_ns > REAP_AFTER_NS) {
            p->seen_ns = 0;
            if (atomic_compare_exchange_strong(&sl->state, &st, MUSE_SLOT_FREE))
                fprintf(stderr, "muse-engine: slot %u reclaimed from %s worker %u\n", i,
                        dead ? "dead" : "silent", pid);
        }
    }
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    uint64_t v;
    (void)what;
    (void)!read(fd, &v, sizeof v);
    event_base_loopbreak(((muse_server *)arg)->evb);
}

static void *io_main(void *arg)
{
    muse_server *s = arg;
    event_base_dispatch(s->evb);
    return NULL;
}

/* ---- setup ---- */

/* One directory on the socket's path (lstat: a link is refused, by name). own: the socket's
 * own directory, which even a sticky bit does not excuse. 0 ok, 1 missing, -1 refused. */
static int check_one_dir(const char *dir, int own, muse_err *e)
{
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT) return 1;
        return muse_fail(e, "socket directory %s: %s", dir, strerror(errno));
    }
    if (S_ISLNK(st.st_mode))
        return muse_fail(e,
                         "%s on the socket's path is a symbolic link, which its owner could "
                         "point elsewhere: name the real directory (e.g. /run, not /var/run)",
                         dir);
    if (!S_ISDIR(st.st_mode)) return muse_fail(e, "socket directory %s is not a directory", dir);
    int others = (st.st_mode & (S_IWGRP | S_IWOTH)) && (own || !(st.st_mode & S_ISVTX));
    if (others || (st.st_uid != geteuid() && st.st_uid != 0))
        return muse_fail(e,
                         "socket directory %s can be written by others than this user (mode "
                         "%04o, owner uid %u): make it owned by the engine's user (or root), "
                         "mode 0750 (group: the nginx workers') or 0755",
                         dir, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
    return 0;
}

/* Every directory from / down to the socket's must be a real directory owned by this user or
 * root and writable by nobody else (a sticky one above the socket's own excepted): whoever can
 * write one could put their own listener in the socket's place. A relative path is taken from
 * the working directory, which getcwd names without links. */
static int check_socket_dir(const char *path, muse_err *e)
{
    char full[PATH_MAX + 108], pre[sizeof full];
    if (path[0] == '/') {
        snprintf(full, sizeof full, "%s", path);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return muse_fail(e, "getcwd: %s", strerror(errno));
        snprintf(full, sizeof full, "%s/%s", cwd, path);
    }
    size_t n = (size_t)(strrchr(full, '/') - full);
    n = n ? n : 1; /* a socket in / itself */
    int rc = check_one_dir("/", n == 1, e);
    size_t last = 1;
    for (size_t i = 2; rc == 0 && i <= n; i++) {
        if (i < n && full[i] != '/') continue;
        memcpy(pre, full, i);
        pre[i] = 0;
        rc = check_one_dir(pre, i == n, e);
        if (rc == 0) last = i;
    }
    if (rc == 1) {
        memcpy(pre, full, last);
        pre[last] = 0;
        if (check_one_dir(pre, 1, e)) return -1;
        return muse_fail(e, "socket directory %.*s: %s (create it, owned by the engine's user)",
                         (int)n, full, strerror(ENOENT));
    }
    return rc;
}

static int make_socket(muse_server *s, int gid, muse_err *e)
{
    struct sockaddr_un a;
    struct stat st;
    if (check_socket_dir(s->socket_path, e)) return -1;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, s->socket_path, strlen(s->socket_path) + 1);
    if (lstat(s->socket_path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return muse_fail(e,
                             "socket path %s exists and is not a socket; remove it or pick "
                             "another --socket",
                             s->socket_path);
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&a, sizeof a) == 0;
        if (probe >= 0) close(probe);
        if (live)
            return muse_fail(e, "another engine answers on %s; stop it or pick another --socket",
                             s->socket_path);
        unlink(s->socket_path);
    }
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0) return muse_fail(e, "socket(AF_UNIX): %s", strerror(errno));
    mode_t old = umask(0177); /* born 0600: no window where others can connect */
    int rc = bind(s->listen_fd, (struct sockaddr *)&a, sizeof a);
    umask(old);
    if (rc != 0) return muse_fail(e, "bind %s: %s", s->socket_path, strerror(errno));
    if (gid >= 0 && chown(s->socket_path, (uid_t)-1, (gid_t)gid) != 0)
        return muse_fail(e,
                         "chown %s to group %d: %s (run the engine as a member of the nginx "
                         "workers' group)",
                         s->socket_path, gid, strerror(errno));
    if (chmod(s->socket_path, 0660) != 0)
        return muse_fail(e, "chmod %s: %s", s->socket_path, strerror(errno));
    if (listen(s->listen_fd, 512) != 0)
        return muse_fail(e, "listen %s: %s", s->socket_path, strerror(errno));
    return 0;
}

static int make_segment(muse_server *s, const muse_server_opts *o, muse_err *e)
{
    muse_ring_header h;
    memset(&h, 0, sizeof h);
    size_t ring = o->ring_bytes ? o->ring_bytes : 256 * 1024;
    size_t req = o->request_bytes ? o->request_bytes : 1024 * 1024 + 4096;
    size_t health = o->health_bytes ? o->health_bytes : MUSE_RING_HEALTH_BYTES;
    if (muse_ring_layout(&h, (uint32_t)o->slots, req, ring, health) != 0 || o->slots < 1)
        return muse_fail(e,
                         "ring server: slots %d (1..%u), ring_bytes %zu (power of two, 4 KiB.."
                         "1 GiB), request_bytes %zu (multiple of 8, >= 1 KiB): out of range",
                         o->slots, MUSE_RING_MAX_SLOTS, ring, req);
    /* anonymous and sealed: no name to plant, no size anyone can change under a worker */
    s->shm_fd = memfd_create(s->shm_name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (s->shm_fd < 0) return muse_fail(e, "memfd_create: %s", strerror(errno));
    if (ftruncate(s->shm_fd, (off_t)h.total_bytes) != 0)
        return muse_fail(e, "sizing the segment to %llu bytes: %s",
                         (unsigned long long)h.total_bytes, strerror(errno));
    if (fcntl(s->shm_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        return muse_fail(e, "sealing the segment: %s", strerror(errno));
    if (getrandom(&h.generation, sizeof h.generation, 0) != (ssize_t)sizeof h.generation ||
        getrandom(s->scope_key, sizeof s->scope_key, 0) != (ssize_t)sizeof s->scope_key)
        return muse_fail(e, "getrandom: %s", strerror(errno));
    h.generation |= 1u; /* never 0 */
    void *b = mmap(NULL, h.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->shm_fd, 0);
    if (b == MAP_FAILED) return muse_fail(e, "mmap of the segment: %s", strerror(errno));
    s->base = b;
    s->hdr = b;
    h.abi_version = s->abi_version;
    h.engine_pid = (uint32_t)getpid();
    h.started_unix_ns = (uint64_t)muse_unix_ns();
    h.magic = 0;
    memcpy(s->hdr, &h, sizeof h);
    memcpy(&s->lay, &h, sizeof h);
    atomic_store(&s->hdr->state, MUSE_ENGINE_STARTING);
    atomic_store(&s->hdr->heartbeat_ns, (uint64_t)muse_now_ns());
    atomic_thread_fence(memory_order_release);
    /* Magic last: a worker that maps during creation sees "not ready". */
    ((volatile muse_ring_header *)s->hdr)->magic = MUSE_RING_MAGIC;
    return 0;
}

static int make_loop(muse_server *s, muse_err *e)
{
    struct timeval one_s = {1, 0};
    s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->stop_fd < 0) return muse_fail(e, "eventfd: %s", strerror(errno));
    s->evb = event_base_new();
    if (!s->evb) return muse_fail(e, "libevent: event_base_new failed");
    s->listen_ev = event_new(s->evb, s->listen_fd, EV_READ | EV_PERSIST, on_accept, s);
    s->stop_ev = event_new(s->evb, s->stop_fd, EV_READ | EV_PERSIST, on_stop, s);
    s->reap_ev = event_new(s->evb, -1, EV_PERSIST, on_reap, s);
    if (!s->listen_ev || !s->stop_ev || !s->reap_ev || event_add(s->listen_ev, NULL) ||
        event_add(s->stop_ev, NULL) || event_add(s->reap_ev, &one_s))
        return muse_fail(e, "libevent: cannot register events");
    if (pthread_create(&s->io, NULL, io_main, s) != 0)
        return muse_fail(e, "cannot start the ring server IO thread");
    s->io_started = 1;
    return 0;
}

int muse_server_start(const muse_server_opts *o, muse_server **out, muse_err *e)
{
    *out = NULL;
    const char *label = o->shm_name ? o->shm_name : "muse-engine";
    label += label[0] == '/';
    if (!label[0] || strlen(label) > 200 || strchr(label, '/'))
        return muse_fail(e, "segment label must be 1..200 bytes without '/', e.g. muse-engine");
    if (!o->socket_path || !o->socket_path[0] || strlen(o->socket_path) >= 108)
        return muse_fail(e, "socket path must be 1..107 bytes");
    muse_server *s = MUSE_CALLOC(1, sizeof *s);
    snprintf(s->shm_name, sizeof s->shm_name, "%s", label);
    snprintf(s->socket_path, sizeof s->socket_path, "%s", o->socket_path);
    s->abi_version = o->abi_version ? o->abi_version : MUSE_RING_ABI_VERSION;
    if (o->worker_key && (o->worker_key_len < 32 || o->worker_key_len > sizeof s->worker_key)) {
        free(s);
        return muse_fail(e, "worker key of %zu bytes: it takes 32..256", o->worker_key_len);
    }
    if (o->worker_key) {
        memcpy(s->worker_key, o->worker_key, o->worker_key_len);
        s->worker_key_len = o->worker_key_len;
    }
    s->shm_fd = s->listen_fd = s->stop_fd = -1;
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    pthread_mutex_init(&s->health_mu, NULL);
    if (make_socket(s, o->socket_gid, e) || make_segment(s, o, e)) {
        muse_server_stop(s);
        return -1;
    }
    uint32_t n = s->lay.slot_count;
    s->queue = MUSE_CALLOC(n, sizeof *s->queue);
    s->slots = MUSE_CALLOC(n, sizeof *s->slots);
    for (uint32_t i = 0; i < n; i++) {
        s->slots[i].server = s;
        s->slots[i].index = i;
        s->slots[i].fd = -1;
        pthread_mutex_init(&s->slots[i].mu, NULL);
        s->slots[i].request = MUSE_MALLOC(s->lay.request_bytes + 1);
    }
    if (make_loop(s, e)) {
        muse_server_stop(s);
        return -1;
    }
    *out = s;
    return 0;
}

/* ---- scheduler API ---- */

int muse_server_wait(muse_server *s, int timeout_ms)
{
    pthread_mutex_lock(&s->qmu);
    if (s->qcount == 0 && timeout_ms != 0) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&s->qcv, &s->qmu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += timeout_ms / 1000;
            ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&s->qcv, &s->qmu, &ts);
        }
    }
    int any = s->qcount > 0;
    pthread_mutex_unlock(&s->qmu);
    return any;
}

int muse_server_next_request(muse_server *s, muse_request *out)
{
    for (;;) {
        uint32_t i;
        pthread_mutex_lock(&s->qmu);
        if (s->qcount == 0) {
            pthread_mutex_unlock(&s->qmu);
            return 0;
        }
        i = s->queue[s->qhead];
        s->qhead = (s->qhead + 1) % s->lay.slot_count;
        s->qcount--;
        pthread_mutex_unlock(&s->qmu);
        slot_priv *p = &s->slots[i];
        if (atomic_load(&p->cancelled)) { /* gone while queued: nobody will finish it */
            slot_release_side(s, i, SIDE_DONE);
            continue;
        }
        out->ref = (muse_slot_ref){i, atomic_load(&p->generation)};
        out->kind = p->view.kind;
        out->flags = p->view.flags;
        out->scope = (const char *)p->view.scope;
        out->scope_len = p->view.scope_len;
        out->body = (const char *)p->view.body;
        out->body_len = p->view.body_len;
        return 1;
    }
}

/* The handle's request still owns its slot and has not finished. Reads sides before the
 * generation: slot_free zeroes the generation before it clears DONE from sides. */
static int ref_live(muse_server *s, muse_slot_ref ref)
{
    if (ref.index >= s->lay.slot_count || ref.generation == 0) return 0;
    slot_priv *p = &s->slots[ref.index];
    if (atomic_load(&p->sides) & SIDE_DONE) return 0;
    return atomic_load(&p->generation) == ref.generation;
}

int muse_server_is_cancelled(muse_server *s, muse_slot_ref ref)
{
    return !ref_live(s, ref) || atomic_load(&s->slots[ref.index].cancelled) != 0;
}

size_t muse_server_max_payload(const muse_server *s)
{
    /* one record plus the reserved END record must fit */
    return s->lay.ring_bytes - 2 * sizeof(muse_event_header);
}

static int emit_record(muse_server *s, muse_slot_ref ref, uint32_t type, int http_status,
                       const void *data, size_t len, uint64_t reserve)
{
    muse_event_header h;
    uint64_t new_head;
    if (!ref_live(s, ref)) return -1;
    uint32_t slot = ref.index;
    slot_priv *p = &s->slots[slot];
    muse_ring_slot *sl = shm_slot(s, slot);
    if (type != MUSE_EV_END && atomic_load(&p->cancelled)) return -1;
    if (type == MUSE_EV_ERROR && (http_status < 400 || http_status > 599)) return -1;
    if (len > UINT32_MAX) return -1;
    memset(&h, 0, sizeof h);
    h.length = (uint32_t)len;
    h.type = (uint16_t)type;
    h.http_status = type == MUSE_EV_ERROR ? (uint16_t)http_status : 0;
    h.generation = ref.generation;
    uint64_t tail = atomic_load(&sl->tail);
    int rc = muse_ring_put(muse_ring_event_area(sl, &s->lay), s->lay.ring_bytes, p->head, tail,
                           reserve, &h, data, &new_head);
    if (rc == -1) {
        if (!muse_ring_positions_ok(p->head, tail, s->lay.ring_bytes)) {
            fprintf(stderr, "muse-engine: slot %u: worker wrote a corrupt tail; cancelling\n",
                    slot);
            atomic_store(&p->cancelled, 1);
            /* the worker learns at once (EOF on its doorbell), the IO thread sees it go */
            pthread_mutex_lock(&p->mu);
            if (p->fd >= 0) shutdown(p->fd, SHUT_RDWR);
            pthread_mutex_unlock(&p->mu);
        }
        return -1;
    }
    if (rc == 1) return 1;
    p->head = new_head;
    atomic_store(&sl->head, new_head);
    ring_doorbell(s, slot);
    return 0;
}

int muse_server_emit(muse_server *s, muse_slot_ref ref, uint32_t type, int http_status,
                     const void *data, size_t len)
{
    if (type < MUSE_EV_DATA || type >= MUSE_EV_END) return -1;
    return emit_record(s, ref, type, http_status, data, len, sizeof(muse_event_header));
}

void muse_server_finish(muse_server *s, muse_slot_ref ref)
{
    if (!ref_live(s, ref)) return;
    emit_record(s, ref, MUSE_EV_END, 0, "", 0, 0);
    slot_release_side(s, ref.index, SIDE_DONE);
}

void muse_server_heartbeat(muse_server *s)
{
    atomic_store(&s->hdr->heartbeat_ns, (uint64_t)muse_now_ns());
}

void muse_server_set_health(muse_server *s, const char *json, size_t len)
{
    pthread_mutex_lock(&s->health_mu);
    muse_health_write(muse_ring_health(s->base, &s->lay), s->lay.health_bytes, json, len);
    pthread_mutex_unlock(&s->health_mu);
    muse_server_heartbeat(s);
}

void muse_server_set_state(muse_server *s, uint32_t state)
{
    atomic_store(&s->hdr->state, state);
}

const uint8_t *muse_server_scope_key(const muse_server *s)
{
    return s->scope_key;
}

uint64_t muse_server_generation(const muse_server *s)
{
    return s->lay.generation;
}
int muse_server_slots(const muse_server *s)
{
    return (int)s->lay.slot_count;
}

int muse_server_busy_slots(const muse_server *s)
{
    int busy = 0;
    for (uint32_t i = 0; i < s->lay.slot_count; i++)
        busy += atomic_load(&muse_ring_slot_at(s->base, &s->lay, i)->state) != MUSE_SLOT_FREE;
    return busy;
}

void muse_server_stop(muse_server *s)
{
    if (!s) return;
    if (s->hdr) atomic_store(&s->hdr->state, MUSE_ENGINE_DOWN);
    if (s->io_started) {
        uint64_t one = 1;
        (void)!write(s->stop_fd, &one, sizeof one);
        pthread_join(s->io, NULL);
    }
    if (s->slots) {
        for (uint32_t i = 0; i < s->lay.slot_count; i++) {
            slot_close_doorbell(s, i);
            pthread_mutex_destroy(&s->slots[i].mu);
            free(s->slots[i].request);
        }
    }
    if (s->listen_ev) event_free(s->listen_ev);
    if (s->stop_ev) event_free(s->stop_ev);
    if (s->reap_ev) event_free(s->reap_ev);
    if (s->evb) event_base_free(s->evb); /* pending claim connections leak their fd: exiting */
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        unlink(s->socket_path);
    }
    if (s->stop_fd >= 0) close(s->stop_fd);
    if (s->base) munmap(s->base, s->lay.total_bytes);
    if (s->shm_fd >= 0) close(s->shm_fd); /* workers keep their mapping until they remap */
    explicit_bzero(s->scope_key, sizeof s->scope_key);
    explicit_bzero(s->worker_key, sizeof s->worker_key);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    pthread_mutex_destroy(&s->health_mu);
    free(s->queue);
    free(s->slots);
    free(s);
}
