/*
 * ngx_muse_transport: the link between a worker and the engine. Connects to the engine's
 * socket (checking who holds it), takes the sealed segment the engine hands over with its
 * hello, claims a slot and writes the request record, and drains the slot's event ring into
 * HTTP output (one record reader, one framer), with back-pressure.
 */

#include "ngx_muse_module.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include "base/sha256.h"

#define NGX_MUSE_BATCH        64
#define NGX_MUSE_BUF_SIZE     4096
#define NGX_MUSE_SEALS        (F_SEAL_SHRINK|F_SEAL_GROW)

static void ngx_muse_drain(ngx_muse_ctx_t *ctx);
static void ngx_muse_peer_read(ngx_event_t *rev);
static void ngx_muse_peer_write(ngx_event_t *wev);

uint64_t
ngx_muse_mono_ns(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

void
ngx_muse_map_unref(ngx_muse_map_t *m)
{
    if (m == NULL) {
        return;
    }
    if (m->refs > 0) {
        m->refs--;
    }
    if (m->refs == 0 && m->retired) {
        munmap(m->base, m->size);
        ngx_explicit_memzero(m->scope_key, sizeof(m->scope_key));
        ngx_free(m);
    }
}

static muse_ring_header *
ngx_muse_hdr(ngx_muse_map_t *m)
{
    return (muse_ring_header *) m->base;
}

/* The module saw the engine go (doorbell closed by the engine, connect refused): /health says
 * so at once, until a new segment arrives or the engine's heartbeat moves again. */
void
ngx_muse_mark_down(ngx_muse_engine_t *eng, const char *reason)
{
    eng->down = reason;
    eng->down_gen = eng->map ? eng->map->lay.generation : 0;
    eng->down_beat = eng->map ? atomic_load(&ngx_muse_hdr(eng->map)->heartbeat_ns) : 0;
}

/* The engine's hello came with a segment this worker holds now: whatever was seen before is
 * history, /health tells the current state only. */
static void
ngx_muse_mark_up(ngx_muse_engine_t *eng)
{
    eng->down = NULL;
}

/* The reason /health gives for the engine being gone, or NULL when nothing says so now. */
const char *
ngx_muse_down_reason(ngx_muse_engine_t *eng)
{
    if (eng->down == NULL) {
        return NULL;
    }
    if (eng->map && (eng->map->lay.generation != eng->down_gen
                     || atomic_load(&ngx_muse_hdr(eng->map)->heartbeat_ns) != eng->down_beat))
    {
        eng->down = NULL;     /* a live heartbeat came back */
    }
    return eng->down;
}

/* The current segment serves: SERVING, a fresh heartbeat, nothing seen going wrong. Says
 * nothing of whether the engine behind the socket is still the one that made the segment:
 * ngx_muse_claim_ahead does. */
ngx_uint_t
ngx_muse_map_fresh(ngx_muse_engine_t *eng)
{
    muse_ring_header  *h;

    if (eng->map == NULL || ngx_muse_down_reason(eng) != NULL) {
        return 0;
    }
    h = ngx_muse_hdr(eng->map);
    return atomic_load(&h->state) == MUSE_ENGINE_SERVING
           && (ngx_muse_mono_ns() - atomic_load(&h->heartbeat_ns)) / 1000000
              <= NGX_MUSE_STALE_MS;
}

/* A request may claim in the mapped segment before the hello: it serves, and the socket is
 * the very one its hello came on (an engine restarted within the heartbeat's 3 s binds a new
 * socket; its hello then brings the new segment first). */
static ngx_uint_t
ngx_muse_claim_ahead(ngx_muse_ctx_t *ctx)
{
    ngx_muse_map_t  *m = ctx->engine->map;

    /* with a worker key the challenge comes first: the claim waits for the hello */
    return m != NULL && ctx->engine->key_len == 0 && ngx_muse_map_fresh(ctx->engine)
           && ctx->sock_ino != 0
           && m->sock_ino == ctx->sock_ino && m->sock_dev == ctx->sock_dev;
}

/* Maps the segment descriptor of a hello, unless it is the one already mapped. Only a sealed
 * descriptor (no shrink, no grow: no SIGBUS) of the announced size and a valid header of the
 * announced generation is taken. Closes fd. */
static ngx_int_t
ngx_muse_adopt(ngx_muse_ctx_t *ctx, int fd, muse_hello_msg *hello, const char **why)
{
    ngx_muse_engine_t *eng = ctx->engine;
    ngx_log_t         *log = ctx->request->connection->log;
    struct stat        st;
    void              *base;
    int                seals;
    ngx_muse_map_t    *m;
    muse_ring_header   lay;
    const char        *bad;

    m = eng->map;
    if (m && m->lay.generation == hello->generation && m->size == hello->total_bytes) {
        close(fd);
        m->sock_ino = ctx->sock_ino;
        m->sock_dev = ctx->sock_dev;
        ngx_muse_mark_up(eng);
        return NGX_OK;
    }
    seals = fcntl(fd, F_GET_SEALS);
    if (seals == -1 || (seals & NGX_MUSE_SEALS) != NGX_MUSE_SEALS || (seals & F_SEAL_WRITE)) {
        close(fd);
        ngx_log_error(NGX_LOG_ERR, log, 0, "muse: the engine's segment is not sealed against "
                      "shrinking and growing (seals %d): refused", seals);
        ngx_muse_mark_down(eng, "the engine handed over an unsealed segment");
        return *why = "the engine's segment is not sealed", NGX_ERROR;
    }
    if (fstat(fd, &st) == -1 || st.st_size < (off_t) sizeof(muse_ring_header)
        || (uint64_t) st.st_size != hello->total_bytes)
    {
        close(fd);
        ngx_log_error(NGX_LOG_ERR, log, 0, "muse: the engine's segment is not the size its "
                      "hello announced: refused");
        ngx_muse_mark_down(eng, "the engine handed over a segment of the wrong size");
        return *why = "the engine's segment has the wrong size", NGX_ERROR;
    }
    base = mmap(NULL, st.st_size, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno, "muse: mmap of the engine's segment failed");
        ngx_muse_mark_down(eng, "cannot map the engine's segment");
        return *why = "cannot map the engine's segment", NGX_ERROR;
    }
    /* check a private copy: the shared header could change between check and use */
    ngx_memcpy(&lay, base, sizeof(lay));
    if (muse_ring_check_header(&lay, st.st_size, &bad) != 0
        || lay.generation != hello->generation)
    {
        ngx_log_error(NGX_LOG_ERR, log, 0, "muse: the engine's segment refused: %s",
                      lay.generation != hello->generation ? "generation differs from the hello"
                                                          : bad);
        munmap(base, st.st_size);
        ngx_muse_mark_down(eng, "the engine handed over a malformed segment");
        return *why = "the engine's segment is malformed", NGX_ERROR;
    }
    m = ngx_alloc(sizeof(ngx_muse_map_t), log);
    if (m == NULL) {
        munmap(base, st.st_size);
        return *why = "out of memory", NGX_ERROR;
    }
    m->base = base;
    m->lay = lay;
    m->size = st.st_size;
    m->sock_ino = ctx->sock_ino;
    m->sock_dev = ctx->sock_dev;
    m->refs = 0;
    m->retired = 0;
    ngx_memcpy(m->scope_key, hello->scope_key, sizeof(m->scope_key));
    if (eng->map) {
        eng->map->retired = 1;
        eng->map->refs++;
        ngx_muse_map_unref(eng->map);
    }
    eng->map = m;
    ngx_muse_mark_up(eng);        /* a new generation clears what the old one left */
    return NGX_OK;
}

/* The engine asks for proof of the worker key: HMAC-SHA-256(key, label || nonce); the hello
 * follows on the same connection. NGX_AGAIN: answered, wait for the hello. */
static ngx_int_t
ngx_muse_answer_challenge(ngx_muse_ctx_t *ctx, muse_challenge_msg *ch, const char **why)
{
    ngx_muse_engine_t  *eng = ctx->engine;
    ngx_log_t          *log = ctx->request->connection->log;
    muse_auth_msg       a;
    u_char              msg[sizeof(MUSE_AUTH_LABEL) - 1 + sizeof(ch->nonce)];

    if (ctx->challenged || ch->abi_version != MUSE_RING_ABI_VERSION) {
        ngx_muse_mark_down(eng, "the engine's socket does not speak the muse protocol");
        return *why = "the engine's socket does not speak the muse protocol", NGX_ERROR;
    }
    if (eng->key_len == 0) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "muse: the engine on \"%V\" asks for the worker "
                      "key: give muse_engine the key file muse-engine serve --worker-key "
                      "reads, as its third argument", &eng->socket_path);
        ngx_muse_mark_down(eng, "the engine asks for a worker key this nginx does not have");
        return *why = "the engine is not available to this server", NGX_ERROR;
    }
    ngx_memcpy(msg, MUSE_AUTH_LABEL, sizeof(MUSE_AUTH_LABEL) - 1);
    ngx_memcpy(msg + sizeof(MUSE_AUTH_LABEL) - 1, ch->nonce, sizeof(ch->nonce));
    ngx_memzero(&a, sizeof(a));
    a.magic = MUSE_AUTH_MAGIC;
    a.abi_version = MUSE_RING_ABI_VERSION;
    muse_hmac_sha256(eng->key, eng->key_len, msg, sizeof(msg), a.mac);
    /* a fresh socket's buffer is empty: 64 bytes go at once or the engine is not reading */
    if (send(ctx->peer->fd, &a, sizeof(a), MSG_NOSIGNAL|MSG_DONTWAIT) != (ssize_t) sizeof(a)) {
        ngx_muse_mark_down(eng, "cannot answer the engine's challenge");
        return *why = "the engine is not answering; retry later", NGX_ERROR;
    }
    ctx->challenged = 1;
    return NGX_AGAIN;
}

/* Reads the engine's hello and its descriptor. NGX_AGAIN: not here yet. */
static ngx_int_t
ngx_muse_read_hello(ngx_muse_ctx_t *ctx, const char **why)
{
    ngx_log_t        *log = ctx->request->connection->log;
    muse_hello_msg    hello;
    struct iovec      iov;
    struct msghdr     msg;
    struct cmsghdr   *cm;
    ssize_t           n;
    int               fd = -1, got;
    size_t            k, nfd;
    union {
        struct cmsghdr  align;
        char            buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;

    iov.iov_base = &hello;
    iov.iov_len = sizeof(hello);
    ngx_memzero(&msg, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    n = recvmsg(ctx->peer->fd, &msg, MSG_CMSG_CLOEXEC|MSG_DONTWAIT);
    if (n == -1 && (ngx_socket_errno == NGX_EAGAIN || ngx_socket_errno == NGX_EINTR)) {
        return NGX_AGAIN;
    }
    /* every descriptor that came is ours to close, whatever else is wrong */
    nfd = 0;
    for (cm = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL; cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        for (k = 0; k < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++) {
            ngx_memcpy(&got, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
            if (nfd++ == 0) {
                fd = got;
            } else {
                close(got);
            }
        }
    }
    if (fd >= 0 && (nfd != 1 || (msg.msg_flags & MSG_CTRUNC))) {
        close(fd);
        fd = -1;
    }
    if (n <= 0) {
        ngx_muse_mark_down(ctx->engine, ctx->challenged
                           ? "the engine refused this worker's key (check muse_engine's key "
                             "file against muse-engine serve --worker-key)"
                           : "the engine closed the connection before its hello");
        return *why = "the engine closed the connection; retry later", NGX_ERROR;
    }
    if (n == (ssize_t) sizeof(hello) && hello.magic == MUSE_CHALLENGE_MAGIC) {
        if (fd >= 0) {
            close(fd);
        }
        return ngx_muse_answer_challenge(ctx, (muse_challenge_msg *) (void *) &hello, why);
    }
    if (n != (ssize_t) sizeof(hello) || hello.magic != MUSE_HELLO_MAGIC) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "muse: \"%V\" did not greet like a muse engine",
                      &ctx->engine->socket_path);
        ngx_muse_mark_down(ctx->engine, "the engine's socket does not speak the muse protocol");
        if (fd >= 0) {
            close(fd);
        }
        return *why = "the engine's socket does not speak the muse protocol", NGX_ERROR;
    }
    if (hello.abi_version != MUSE_RING_ABI_VERSION) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "muse: the engine on \"%V\" speaks ABI version "
                      "%uD, this module speaks %uD: upgrade the engine and the module "
                      "together", &ctx->engine->socket_path, hello.abi_version,
                      (uint32_t) MUSE_RING_ABI_VERSION);
        ngx_muse_mark_down(ctx->engine, "the engine speaks another ABI version");
        if (fd >= 0) {
            close(fd);
        }
        return *why = "the engine speaks another ABI version", NGX_ERROR;
    }
    if (fd < 0) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "muse: the engine's hello came without exactly one "
                      "segment descriptor");
        ngx_muse_mark_down(ctx->engine, "the engine's hello came without its segment");
        return *why = "the engine sent no segment", NGX_ERROR;
    }
    ctx->hello = 1;
    return ngx_muse_adopt(ctx, fd, &hello, why);
}

/* Connects to the engine's socket and checks that the engine's user holds it (SO_PEERCRED);
 * the hello then arrives on ctx->peer. NGX_DECLINED: *why says why, nothing is connected. */
ngx_int_t
ngx_muse_connect(ngx_muse_ctx_t *ctx, const char **why)
{
    ngx_muse_engine_t   *eng = ctx->engine;
    ngx_log_t           *log = ctx->request->connection->log;
    struct sockaddr_un   sa;
    struct stat          sst;
    struct ucred         cred;
    socklen_t            len = sizeof(cred);
    ngx_connection_t    *pc;
    ngx_err_t            err;
    int                  fd;

    fd = socket(AF_UNIX, SOCK_STREAM|SOCK_NONBLOCK|SOCK_CLOEXEC, 0);
    if (fd == -1) {
        ngx_log_error(NGX_LOG_ALERT, log, ngx_socket_errno, "muse: socket(AF_UNIX) failed");
        return *why = "out of sockets; retry later", NGX_DECLINED;
    }
    ngx_memzero(&sa, sizeof(sa));
    sa.sun_family = AF_UNIX;
    ngx_memcpy(sa.sun_path, eng->socket_path.data, eng->socket_path.len);
    /* which socket this is: an engine restarted binds a new one (a new inode), so a segment
     * adopted from the old one is not trusted ahead of the new engine's hello */
    ctx->sock_ino = 0;
    ctx->sock_dev = 0;
    if (lstat(sa.sun_path, &sst) == 0) {
        ctx->sock_ino = sst.st_ino;
        ctx->sock_dev = sst.st_dev;
    }
    if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == -1) {
        err = ngx_socket_errno;
        close(fd);
        if (err == NGX_EAGAIN) {
            /* the backlog is full: nobody accepts (stopped, wedged) or a flood */
            ngx_muse_mark_down(eng, "the engine's socket backlog is full (stopped or "
                               "overloaded engine)");
            return *why = "the engine's socket is full; retry later", NGX_DECLINED;
        }
        ngx_log_error(NGX_LOG_INFO, log, err, "muse: connect to the engine's socket \"%V\"",
                      &eng->socket_path);
        ngx_muse_mark_down(eng, err == NGX_ENOENT ? "engine not running (no socket)"
                                : "engine not running (its socket refused the connection)");
        return *why = "the engine is not running", NGX_DECLINED;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == -1 || cred.uid != eng->uid) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "muse: the socket \"%V\" is held by uid %d, not by "
                      "the engine's user \"%V\" (uid %d): refused; check muse_engine and "
                      "who runs muse-engine", &eng->socket_path, (int) cred.uid, &eng->user,
                      (int) eng->uid);
        close(fd);
        ngx_muse_mark_down(eng, "the engine's socket is held by another user");
        return *why = "the engine is not running", NGX_DECLINED;
    }
    pc = ngx_get_connection(fd, log);
    if (pc == NULL) {
        close(fd);
        return *why = "out of connections", NGX_DECLINED;
    }
    pc->data = ctx;
    pc->read->handler = ngx_muse_peer_read;
    pc->write->handler = ngx_muse_peer_write;
    pc->read->log = pc->write->log = pc->log;
    pc->write->ready = 1;
    ctx->peer = pc;
    if (ngx_handle_read_event(pc->read, 0) != NGX_OK) {
        ngx_muse_close_peer(ctx);
        return *why = "cannot watch the engine socket", NGX_DECLINED;
    }
    return NGX_OK;
}

/* HMAC-SHA-256 (RFC 2104) of the scope value under the engine's key: the digest crosses the
 * ring, the value (often a credential) never does, and any length works. */
static void
ngx_muse_scope_digest(const u_char *key, const u_char *data, size_t len, u_char *out)
{
    muse_sha256  s;
    u_char       pad[64], inner[32];
    ngx_uint_t   i;

    for (i = 0; i < 64; i++) {
        pad[i] = (i < MUSE_SCOPE_KEY_BYTES ? key[i] : 0) ^ 0x36;
    }
    muse_sha256_init(&s);
    muse_sha256_update(&s, pad, 64);
    muse_sha256_update(&s, data, len);
    muse_sha256_final(&s, inner);
    for (i = 0; i < 64; i++) {
        pad[i] ^= 0x36 ^ 0x5c;
    }
    muse_sha256_init(&s);
    muse_sha256_update(&s, pad, 64);
    muse_sha256_update(&s, inner, 32);
    muse_sha256_final(&s, out);
    ngx_explicit_memzero(pad, sizeof(pad));
}

/* After the hello: claims a free slot (CAS), writes the record and sends the claim on the
 * connection, which is now the slot's doorbell. NGX_ABORT: the request cannot fit. */
static ngx_int_t
ngx_muse_claim(ngx_muse_ctx_t *ctx, const char **why)
{
    muse_ring_header     *h;
    muse_ring_slot       *sl = NULL;
    muse_claim_msg        msg;
    ngx_uint_t            i, start;
    uint32_t              want;
    u_char                digest[MUSE_SCOPE_DIGEST_BYTES];
    size_t                scope_len = 0;

    ctx->map = ctx->engine->map;
    ctx->map->refs++;
    h = ngx_muse_hdr(ctx->map);
    if (atomic_load(&h->state) != MUSE_ENGINE_SERVING) {
        return *why = "the engine is starting or stopping; retry later", NGX_DECLINED;
    }
    if ((ngx_muse_mono_ns() - atomic_load(&h->heartbeat_ns)) / 1000000 > NGX_MUSE_STALE_MS) {
        return *why = "the engine is not answering; retry later", NGX_DECLINED;
    }
    if (ctx->has_scope) {
        ngx_muse_scope_digest(ctx->map->scope_key, ctx->scope.data, ctx->scope.len, digest);
        scope_len = sizeof(digest);
    }
    if (muse_request_record_bytes(scope_len, ctx->body.len) > ctx->map->lay.request_bytes) {
        return *why = "too large", NGX_ABORT;
    }
    start = (ngx_uint_t) ngx_pid + (ngx_uint_t) ngx_random();
    for (i = 0; i < ctx->map->lay.slot_count; i++) {
        ctx->slot = (uint32_t) ((start + i) % ctx->map->lay.slot_count);
        sl = muse_ring_slot_at(ctx->map->base, &ctx->map->lay, ctx->slot);
        want = MUSE_SLOT_FREE;
        if (atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_CLAIMED)) {
            break;
        }
        sl = NULL;
    }
    if (sl == NULL) {
        return *why = "all engine slots are busy; retry later", NGX_DECLINED;
    }
    ctx->seg_generation = ctx->map->lay.generation;
    ctx->slot_generation = atomic_fetch_add(&sl->generation, 1) + 1;
    atomic_store(&sl->owner_pid, (uint32_t) ngx_pid);
    atomic_store(&sl->claim_ns, ngx_muse_mono_ns());
    atomic_store(&sl->head, 0);
    atomic_store(&sl->tail, 0);
    atomic_store(&sl->wake, 0);
    if (muse_request_encode(muse_ring_request_area(sl), ctx->map->lay.request_bytes,
                            ctx->slot_generation, ctx->kind, (uint32_t) ctx->flags, digest,
                            scope_len, ctx->body.data, ctx->body.len) != 0)
    {
        want = MUSE_SLOT_CLAIMED;
        atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_FREE);
        return *why = "request record does not fit", NGX_ABORT;
    }
    /* only from CLAIMED: the engine's reaper may have taken back a slot it thought dead */
    want = MUSE_SLOT_CLAIMED;
    if (!atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_SUBMITTED)) {
        return *why = "the engine took the slot back; retry", NGX_DECLINED;
    }
    ngx_memzero(&msg, sizeof(msg));
    msg.magic = MUSE_CLAIM_MAGIC;
    msg.abi_version = MUSE_RING_ABI_VERSION;
    msg.segment_generation = ctx->seg_generation;
    msg.slot_generation = ctx->slot_generation;
    msg.slot = ctx->slot;
    if (send(ctx->peer->fd, &msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t) sizeof(msg)) {
        ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, ngx_socket_errno,
                      "muse: cannot send the claim to the engine");
        want = MUSE_SLOT_SUBMITTED;
        atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_FREE);
        return *why = "the engine is not answering; retry later", NGX_DECLINED;
    }
    ctx->claimed = 1;
    return NGX_OK;
}

void
ngx_muse_close_peer(ngx_muse_ctx_t *ctx)
{
    if (ctx->peer) {
        ngx_close_connection(ctx->peer);   /* removes its events and timers */
        ctx->peer = NULL;
    }
    if (ctx->map) {
        ngx_muse_map_unref(ctx->map);
        ctx->map = NULL;
    }
}

/* Client gone, timeout or request freed: the doorbell closes, the engine cancels. */
void
ngx_muse_cleanup(void *data)
{
    ngx_muse_ctx_t  *ctx = data;

    ctx->finished = 1;
    ngx_muse_close_peer(ctx);
}

static void
ngx_muse_finish(ngx_muse_ctx_t *ctx, ngx_int_t rc)
{
    ngx_http_request_t  *r = ctx->request;

    if (ctx->finished) {
        return;
    }
    ctx->finished = 1;
    ngx_muse_close_peer(ctx);
    ngx_http_finalize_request(r, rc);
}

static void
ngx_muse_peer_write(ngx_event_t *wev)
{
}

void
ngx_muse_arm_timer(ngx_muse_ctx_t *ctx)
{
    ngx_muse_loc_conf_t  *mcf;
    ngx_msec_t            t, waited;

    mcf = ngx_http_get_module_loc_conf(ctx->request, ngx_muse_module);
    if (ctx->headers_sent || ctx->admitted) {
        t = mcf->idle_timeout;
    } else {
        /* the queue deadline counts from the request's start, not from the last wake-up */
        waited = ngx_current_msec - ctx->started;
        t = waited < mcf->queue_timeout ? mcf->queue_timeout - waited : 1;
    }
    if (!ctx->hello) {
        /* a stopped engine's backlog accepts and then nothing comes: the hello has its own,
         * short deadline (a status page has only this one) */
        waited = ngx_current_msec - ctx->started;
        waited = waited < mcf->handshake_timeout ? mcf->handshake_timeout - waited : 1;
        if (ctx->status || waited < t) {
            t = waited;
        }
    }
    ngx_add_timer(ctx->peer->read, t);
}

/* Before the claim: the hello came (or failed, or timed out); a status page answers now, a
 * request claims its slot or gets its error. */
static void
ngx_muse_after_hello(ngx_muse_ctx_t *ctx, ngx_int_t rc, const char *why)
{
    ngx_http_request_t  *r = ctx->request;

    if (ctx->status) {
        ngx_muse_close_peer(ctx);
        ctx->finished = 1;
        ngx_http_finalize_request(r, ngx_muse_status_answer(r, rc == NGX_OK ? NULL : why));
        return;
    }
    if (rc == NGX_OK) {
        rc = ngx_muse_claim(ctx, &why);
    }
    if (rc == NGX_ABORT) {
        ngx_muse_finish(ctx, ngx_muse_send_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                        "invalid_request_error", NULL, "request_too_large",
                        "the request is larger than the engine's request area; send less, "
                        "or start muse-engine serve with a larger --request-kib"));
        return;
    }
    if (rc != NGX_OK) {
        ngx_muse_finish(ctx, ngx_muse_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                        "server_error", NULL, "engine_unavailable", why));
        return;
    }
    ngx_muse_arm_timer(ctx);
}

static void
ngx_muse_peer_read(ngx_event_t *rev)
{
    ngx_connection_t     *pc = rev->data, *c;
    ngx_muse_ctx_t       *ctx = pc->data;
    ngx_http_request_t   *r = ctx->request;
    u_char                buf[256];
    ssize_t               n;
    ngx_int_t             rc;
    const char           *why = "";

    c = r->connection;
    if (rev->timedout) {
        rev->timedout = 0;
        if (!ctx->hello) {
            ngx_log_error(NGX_LOG_WARN, c->log, 0, "muse: the engine did not send its hello on "
                          "\"%V\" within muse_handshake_timeout: stopped or wedged",
                          &ctx->engine->socket_path);
            ngx_muse_mark_down(ctx->engine, "the engine accepts connections but does not "
                               "answer (stopped or wedged): no hello within "
                               "muse_handshake_timeout");
            if (ctx->claimed) {
                /* claimed ahead: the engine's reaper takes the slot back once it runs */
                ngx_muse_finish(ctx, ngx_muse_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                "server_error", NULL, "engine_unavailable",
                                "the engine is not answering; retry later"));
            } else {
                ngx_muse_after_hello(ctx, NGX_ERROR, "the engine is not answering; retry later");
            }
        } else if (!ctx->headers_sent && !ctx->admitted) {
            ngx_log_error(NGX_LOG_WARN, c->log, 0, "muse: no answer from the engine within "
                          "muse_queue_timeout; cancelling");
            ngx_muse_finish(ctx, ngx_muse_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                            "server_error", NULL, "queue_timeout",
                            "the engine did not start this request in time; retry later"));
        } else if (c->buffered || ctx->busy) {
            /* the client is the slow side, not the engine: send_timeout governs that */
            ngx_muse_arm_timer(ctx);
            return;
        } else {
            ctx->peer_eof = 1;   /* idle: treat as a dead engine */
            ngx_log_error(NGX_LOG_WARN, c->log, 0, "muse: engine idle past muse_idle_timeout");
            ngx_muse_drain(ctx);
        }
        ngx_http_run_posted_requests(c);
        return;
    }
    if (!ctx->hello) {
        rc = ngx_muse_read_hello(ctx, &why);
        if (rc == NGX_AGAIN) {
            if (ngx_handle_read_event(rev, 0) != NGX_OK) {
                ngx_muse_after_hello(ctx, NGX_ERROR, "cannot watch the engine socket");
                ngx_http_run_posted_requests(c);
            }
            return;
        }
        if (!ctx->claimed || rc != NGX_OK) {
            ngx_muse_after_hello(ctx, rc, why);
            ngx_http_run_posted_requests(c);
            return;
        }
        if (ctx->engine->map->lay.generation != ctx->seg_generation) {
            /* claimed ahead in a segment the engine no longer has: it restarted just now */
            ngx_muse_finish(ctx, ngx_muse_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                            "server_error", NULL, "engine_unavailable",
                            "the engine restarted; retry"));
            ngx_http_run_posted_requests(c);
            return;
        }
        /* the claim went ahead of the hello: doorbell bytes may follow */
    }
    for ( ;; ) {
        n = recv(pc->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            continue;
        }
        if (n == 0 || (ngx_socket_errno != NGX_EAGAIN && ngx_socket_errno != NGX_EINTR)) {
            ctx->peer_eof = 1;
            ctx->peer_closed = 1;
        }
        rev->ready = 0;
        break;
    }
    if (!ctx->peer_eof && ngx_handle_read_event(rev, 0) != NGX_OK) {
        ctx->peer_eof = 1;
    }
    ngx_muse_drain(ctx);
    ngx_http_run_posted_requests(c);
}

/* A request: connect, then (in peer_read) hello, claim, drain. NGX_DECLINED: *why;
 * NGX_ABORT: larger than the engine's request area. */
ngx_int_t
ngx_muse_submit(ngx_muse_ctx_t *ctx, const char **why)
{
    ngx_muse_map_t  *m = ctx->engine->map;
    ngx_uint_t       i;
    ngx_int_t        rc;

    if (m && ngx_muse_map_fresh(ctx->engine)) {
        /* a full slot table refuses at once, without a round trip to the engine */
        for (i = 0; i < m->lay.slot_count; i++) {
            if (atomic_load(&muse_ring_slot_at(m->base, &m->lay, i)->state)
                == MUSE_SLOT_FREE)
            {
                break;
            }
        }
        if (i == m->lay.slot_count) {
            return *why = "all engine slots are busy; retry later", NGX_DECLINED;
        }
    }
    if (ngx_muse_connect(ctx, why) != NGX_OK) {
        return NGX_DECLINED;
    }
    if (ngx_muse_claim_ahead(ctx)) {
        /* the engine's user holds the socket and this segment serves: claim now, ahead of
         * the hello, which must then name the same generation (else: 503, retry) */
        rc = ngx_muse_claim(ctx, why);
        if (rc != NGX_OK) {
            ngx_muse_close_peer(ctx);
            return rc;
        }
    }
    ngx_muse_arm_timer(ctx);
    return NGX_OK;
}

static ngx_int_t
ngx_muse_start_output(ngx_muse_ctx_t *ctx)
{
    ngx_http_request_t        *r = ctx->request;
    ngx_http_core_loc_conf_t  *clcf;
    ngx_int_t                  rc;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = -1;
    if (ctx->stream) {
        ngx_str_set(&r->headers_out.content_type, "text/event-stream");
        /* small events must not wait for Nagle, as with unbuffered proxying */
        clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
        if (clcf->tcp_nodelay && ngx_tcp_nodelay(r->connection) != NGX_OK) {
            return NGX_ERROR;
        }
        if (ngx_muse_add_header(r, "Cache-Control", "no-cache") != NGX_OK
            || ngx_muse_add_header(r, "X-Accel-Buffering", "no") != NGX_OK)
        {
            return NGX_ERROR;
        }
    } else {
        ngx_str_set(&r->headers_out.content_type, "application/json");
    }
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    ctx->headers_sent = 1;
    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK) {
        return NGX_ERROR;
    }
    ngx_muse_arm_timer(ctx);
    return ngx_http_send_special(r, NGX_HTTP_FLUSH);
}

/* A buffer of at least size bytes from the free list (reused across events). */
static ngx_buf_t *
ngx_muse_get_buf(ngx_muse_ctx_t *ctx, ngx_chain_t ***last, size_t size)
{
    ngx_chain_t  *cl;
    ngx_buf_t    *b;
    size_t        cap = size > NGX_MUSE_BUF_SIZE ? size : NGX_MUSE_BUF_SIZE;

    cl = ngx_chain_get_free_buf(ctx->request->pool, &ctx->free);
    if (cl == NULL) {
        return NULL;
    }
    b = cl->buf;
    if (b->start == NULL || (size_t) (b->end - b->start) < size) {
        b->start = ngx_palloc(ctx->request->pool, cap);
        if (b->start == NULL) {
            return NULL;
        }
        b->end = b->start + cap;
    }
    b->pos = b->last = b->start;
    b->temporary = 1;
    b->tag = (ngx_buf_tag_t) &ngx_muse_module;
    b->flush = 1;
    **last = cl;
    *last = &cl->next;
    cl->next = NULL;
    return b;
}

static ngx_int_t
ngx_muse_fail_stream(ngx_muse_ctx_t *ctx, const char *code, const char *message)
{
    ngx_http_request_t  *r = ctx->request;
    ngx_chain_t         *out = NULL, **last = &out;
    ngx_buf_t           *b;
    ngx_int_t            rc;

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0, "muse: %s", message);
    if (!ctx->headers_sent) {
        return ngx_muse_send_error(r, code[0] == 'b' ? NGX_HTTP_BAD_GATEWAY
                                                     : NGX_HTTP_SERVICE_UNAVAILABLE,
                                   "server_error", NULL, code, message);
    }
    if (!ctx->stream) {
        /* half a JSON body must not end like a whole one: abort the connection */
        return NGX_ERROR;
    }
    b = ngx_muse_get_buf(ctx, &last, 256 + ngx_strlen(message));
    if (b == NULL) {
        return NGX_ERROR;
    }
    if (ctx->stream) {
        b->last = ngx_sprintf(b->last, "data: {\"error\":{\"message\":\"%s\",\"type\":"
                              "\"server_error\",\"param\":null,\"code\":\"%s\"}}\n\n",
                              message, code);
    }
    b->last_buf = 1;
    rc = ngx_http_output_filter(r, out);
    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}


/* Output is backed up: wait for the client, under send_timeout. 0, or NGX_ERROR. */
static ngx_int_t
ngx_muse_wait_client(ngx_http_request_t *r)
{
    ngx_connection_t          *c = r->connection;
    ngx_http_core_loc_conf_t  *clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (!c->write->ready && !c->write->timer_set) {
        ngx_add_timer(c->write, clcf->send_timeout);
    }
    return ngx_handle_write_event(c->write, clcf->send_lowat) == NGX_OK ? NGX_OK : NGX_ERROR;
}

/* Takes records from the ring while nginx's output keeps up; stops when it backs up. */

/* The record reader: the next valid record at the slot's tail. 1 a record (*ev filled; its
 * payload starts at *pos), 0 the ring is empty, -1 corrupt (logged). */
static ngx_int_t
ngx_muse_next_record(ngx_muse_ctx_t *ctx, muse_ring_slot *sl, muse_event_header *ev,
    uint64_t *pos)
{
    const char  *why;
    uint64_t     head, tail;
    int          rc;

    head = atomic_load(&sl->head);
    tail = atomic_load(&sl->tail);
    rc = muse_ring_peek(muse_ring_event_area(sl, &ctx->map->lay), ctx->map->lay.ring_bytes,
                        head, tail, ctx->slot_generation, ev, &why);
    if (rc < 0) {
        ngx_log_error(NGX_LOG_ERR, ctx->request->connection->log, 0,
                      "muse: corrupt record from the engine in slot %uD: %s", ctx->slot, why);
    }
    *pos = tail + sizeof(muse_event_header);
    return rc;
}

/* Marks the record read: the engine may reuse its bytes. */
static void
ngx_muse_consume(muse_ring_slot *sl, const muse_event_header *ev)
{
    atomic_store(&sl->tail, atomic_load(&sl->tail) + muse_event_record_bytes(ev->length));
}

/* The framer: one record as HTTP bytes into b (SSE for a stream, the body as it is otherwise).
 * Returns 1 when the record ends the response. */
static ngx_uint_t
ngx_muse_frame(ngx_muse_ctx_t *ctx, muse_ring_slot *sl, const muse_event_header *ev,
    uint64_t pos, ngx_buf_t *b)
{
    ngx_uint_t  end = 0;

    switch (ev->type) {
    case MUSE_EV_KEEPALIVE:
        if (ctx->stream) {
            b->last = ngx_cpymem(b->last, ": keepalive\n\n", 13);
        }
        break;
    case MUSE_EV_END:
        if (ctx->stream) {
            b->last = ngx_cpymem(b->last, "data: [DONE]\n\n", 14);
        }
        end = 1;
        break;
    default:   /* DATA, BODY, or an ERROR after the stream started: then it ends */
        if (ctx->stream) {
            b->last = ngx_cpymem(b->last, "data: ", 6);
        }
        muse_ring_copy_out(muse_ring_event_area(sl, &ctx->map->lay), ctx->map->lay.ring_bytes,
                           pos, b->last, ev->length);
        b->last += ev->length;
        if (ctx->stream) {
            b->last = ngx_cpymem(b->last, "\n\n", 2);
        }
        end = ev->type == MUSE_EV_ERROR;
        break;
    }
    if (end) {
        b->last_buf = 1;
    }
    if (b->last == b->pos) {
        b->temporary = 0;   /* an empty END/keepalive: a special buffer, not data */
    }
    return end;
}

/* An error record before any byte was sent: its status and JSON become the response. */
static ngx_int_t
ngx_muse_error_response(ngx_muse_ctx_t *ctx, muse_ring_slot *sl, const muse_event_header *ev,
    uint64_t pos)
{
    ngx_http_request_t  *r = ctx->request;
    u_char              *p;

    p = ngx_pnalloc(r->pool, ev->length);
    if (p == NULL) {
        return NGX_ERROR;
    }
    muse_ring_copy_out(muse_ring_event_area(sl, &ctx->map->lay), ctx->map->lay.ring_bytes, pos,
                       p, ev->length);
    ngx_muse_consume(sl, ev);
    ctx->headers_sent = 1;
    return ngx_muse_send_body(r, ev->http_status, "application/json", p, ev->length);
}

/* Takes records from the ring while nginx's output keeps up; stops when it backs up. */
static void
ngx_muse_drain(ngx_muse_ctx_t *ctx)
{
    ngx_http_request_t   *r = ctx->request;
    ngx_connection_t     *c = r->connection;
    muse_ring_slot       *sl;
    muse_event_header     ev;
    ngx_chain_t          *out, **last;
    ngx_buf_t            *b;
    uint64_t              pos;
    ngx_uint_t            n, end = 0;
    ngx_int_t             rc;

    if (ctx->finished || ctx->map == NULL) {
        return;
    }
    sl = muse_ring_slot_at(ctx->map->base, &ctx->map->lay, ctx->slot);

    for ( ;; ) {
        if (c->buffered || ctx->busy) {
            /* back-pressure: the client write handler resumes us */
            if (ngx_muse_wait_client(r) != NGX_OK) {
                ngx_muse_finish(ctx, NGX_ERROR);
            }
            return;
        }
        if (ngx_muse_hdr(ctx->map)->generation != ctx->seg_generation
            || atomic_load(&sl->generation) != ctx->slot_generation)
        {
            ngx_muse_finish(ctx, ngx_muse_fail_stream(ctx, "engine_unavailable",
                            "the engine restarted during this request"));
            return;
        }
        atomic_store(&sl->wake, 0);
        out = NULL;
        last = &out;
        for (n = 0; n < NGX_MUSE_BATCH && !end; n++) {
            rc = ngx_muse_next_record(ctx, sl, &ev, &pos);
            if (rc == 0) {
                break;
            }
            if (rc < 0) {
                ngx_muse_finish(ctx, ngx_muse_fail_stream(ctx, "bad_engine_record",
                                "the engine sent a corrupt record"));
                return;
            }
            ctx->admitted = 1;
            if (ev.type == MUSE_EV_KEEPALIVE && !ctx->stream) {
                /* a non-streaming answer is still being made: nothing to send yet */
                ngx_muse_consume(sl, &ev);
                ctx->last_event = ngx_current_msec;
                continue;
            }
            if (ev.type == MUSE_EV_ERROR && !ctx->stream) {
                /* before the body: the error is the response; after: the body cannot turn
                 * into an error, so the connection is cut */
                ngx_muse_finish(ctx, ctx->headers_sent
                                     ? NGX_ERROR : ngx_muse_error_response(ctx, sl, &ev, pos));
                return;
            }
            if (ev.type == MUSE_EV_ERROR && !ctx->headers_sent) {
                ngx_muse_finish(ctx, ngx_muse_error_response(ctx, sl, &ev, pos));
                return;
            }
            if (!ctx->headers_sent && ngx_muse_start_output(ctx) == NGX_ERROR) {
                ngx_muse_finish(ctx, NGX_ERROR);
                return;
            }
            b = ngx_muse_get_buf(ctx, &last, ev.length + 32);
            if (b == NULL) {
                ngx_muse_finish(ctx, NGX_ERROR);
                return;
            }
            end = ngx_muse_frame(ctx, sl, &ev, pos, b);
            ngx_muse_consume(sl, &ev);
        }
        if (out == NULL) {
            break;
        }
        ctx->last_event = ngx_current_msec;
        rc = ngx_http_output_filter(r, out);
        ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &out,
                                (ngx_buf_tag_t) &ngx_muse_module);
        if (rc == NGX_ERROR) {
            ngx_muse_finish(ctx, NGX_ERROR);
            return;
        }
        if (end) {
            ngx_muse_finish(ctx, rc);
            return;
        }
    }
    if (ctx->peer_eof) {
        /* the engine closed without END: died, or idle past muse_idle_timeout */
        if (ctx->peer_closed) {
            ngx_muse_mark_down(ctx->engine, "the engine closed a doorbell mid-request");
        }
        ngx_muse_finish(ctx, ngx_muse_fail_stream(ctx, "engine_unavailable",
                        "the engine stopped before finishing this request"));
        return;
    }
    if (ctx->peer) {
        ngx_muse_arm_timer(ctx);
    }
}

void
ngx_muse_client_write(ngx_http_request_t *r)
{
    ngx_muse_ctx_t  *ctx = ngx_http_get_module_ctx(r, ngx_muse_module);
    ngx_event_t     *wev = r->connection->write;
    ngx_chain_t     *none = NULL;   /* update_chains dereferences its out argument */
    ngx_int_t        rc;

    if (ctx == NULL || ctx->finished) {
        return;
    }
    if (wev->timedout) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, NGX_ETIMEDOUT,
                      "client timed out (send_timeout); cancelling");
        r->connection->timedout = 1;
        ngx_muse_finish(ctx, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }
    if (wev->timer_set) {
        ngx_del_timer(wev);
    }
    rc = ngx_http_output_filter(r, NULL);
    ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &none,
                            (ngx_buf_tag_t) &ngx_muse_module);
    if (rc == NGX_ERROR) {
        ngx_muse_finish(ctx, NGX_ERROR);
        return;
    }
    ngx_muse_drain(ctx);
}

