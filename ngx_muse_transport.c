/*
 * ngx_muse_transport: the link between a worker and the engine. Maps the engine's segment,
 * claims a slot and writes the request record, rings the doorbell socket, and drains the
 * slot's event ring into HTTP output (one record reader, one framer), with back-pressure.
 */

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include "ngx_muse_module.h"

#define NGX_MUSE_BATCH        64
#define NGX_MUSE_BUF_SIZE     4096

static void ngx_muse_drain(ngx_muse_ctx_t *ctx);

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
        ngx_free(m);
    }
}

static muse_ring_header *
ngx_muse_hdr(ngx_muse_map_t *m)
{
    return (muse_ring_header *) m->base;
}

/* The current segment, remapped when the engine recreated it (new inode) or when the old
 * mapping says DOWN. NULL when the engine is absent or speaks another ABI (logged once). */
ngx_muse_map_t *
ngx_muse_attach(ngx_muse_engine_t *eng, ngx_log_t *log)
{
    int               fd;
    struct stat       st;
    void             *base;
    const char       *why;
    ngx_muse_map_t   *m;
    muse_ring_header  lay;
    muse_ring_header *h;

    fd = shm_open((char *) eng->shm_name.data, O_RDWR, 0);
    if (fd == -1) {
        ngx_log_error(NGX_LOG_INFO, log, ngx_errno, "muse: engine segment \"%V\" absent",
                      &eng->shm_name);
        return NULL;
    }
    if (fstat(fd, &st) == -1) {
        close(fd);
        return NULL;
    }
    m = eng->map;
    if (m && m->dev == st.st_dev && m->ino == st.st_ino && (off_t) m->size == st.st_size) {
        close(fd);
        return m;
    }
    if (m) {
        m->retired = 1;
        eng->map = NULL;
        m->refs++;
        ngx_muse_map_unref(m);
    }
    if (st.st_size < (off_t) sizeof(muse_ring_header)) {
        close(fd);
        return NULL;
    }
    base = mmap(NULL, st.st_size, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno, "muse: mmap of \"%V\" failed",
                      &eng->shm_name);
        return NULL;
    }
    /* check a private copy: the shared header could change between check and use */
    ngx_memcpy(&lay, base, sizeof(lay));
    h = &lay;
    if (muse_ring_check_header(h, st.st_size, &why) != 0) {
        if (h->magic == MUSE_RING_MAGIC && h->abi_version != MUSE_RING_ABI_VERSION) {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "muse: engine segment \"%V\" speaks ABI version %uD, this module "
                          "speaks %uD: upgrade the engine and the module together",
                          &eng->shm_name, h->abi_version, (uint32_t) MUSE_RING_ABI_VERSION);
        } else {
            ngx_log_error(NGX_LOG_ERR, log, 0, "muse: engine segment \"%V\" refused: %s",
                          &eng->shm_name, why);
        }
        munmap(base, st.st_size);
        return NULL;
    }
    m = ngx_alloc(sizeof(ngx_muse_map_t), log);
    if (m == NULL) {
        munmap(base, st.st_size);
        return NULL;
    }
    m->base = base;
    m->lay = lay;
    m->size = st.st_size;
    m->dev = st.st_dev;
    m->ino = st.st_ino;
    m->refs = 0;
    m->retired = 0;
    eng->map = m;
    return m;
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
    ngx_msec_t            t;

    ngx_msec_t            waited;

    mcf = ngx_http_get_module_loc_conf(ctx->request, ngx_muse_module);
    if (ctx->headers_sent || ctx->admitted) {
        t = mcf->idle_timeout;
    } else {
        /* the queue deadline counts from the request's start, not from the last wake-up */
        waited = ngx_current_msec - ctx->started;
        t = waited < mcf->queue_timeout ? mcf->queue_timeout - waited : 1;
    }
    ngx_add_timer(ctx->peer->read, t);
}

static void
ngx_muse_peer_read(ngx_event_t *rev)
{
    ngx_connection_t     *pc = rev->data, *c;
    ngx_muse_ctx_t       *ctx = pc->data;
    ngx_http_request_t   *r = ctx->request;
    u_char                buf[256];
    ssize_t               n;

    c = r->connection;
    if (rev->timedout) {
        rev->timedout = 0;
        if (!ctx->headers_sent && !ctx->admitted) {
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
    for ( ;; ) {
        n = recv(pc->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            continue;
        }
        if (n == 0 || (ngx_socket_errno != NGX_EAGAIN && ngx_socket_errno != NGX_EINTR)) {
            ctx->peer_eof = 1;
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

/* Claims a free slot (CAS), writes the record, connects the doorbell and sends the claim. */
ngx_int_t
ngx_muse_submit(ngx_http_request_t *r, ngx_muse_ctx_t *ctx, ngx_str_t *body,
    ngx_uint_t kind, ngx_uint_t flags, ngx_str_t *scope, const char **why)
{
    muse_ring_header     *h;
    muse_ring_slot       *sl = NULL;
    muse_claim_msg        msg;
    struct sockaddr_un    sa;
    ngx_uint_t            i, start;
    uint32_t              want;
    int                   fd;
    ngx_connection_t     *pc;

    ctx->map = ngx_muse_attach(ctx->engine, r->connection->log);
    if (ctx->map == NULL) {
        return *why = "the engine is not running", NGX_DECLINED;
    }
    ctx->map->refs++;
    h = ngx_muse_hdr(ctx->map);
    if (atomic_load(&h->state) != MUSE_ENGINE_SERVING) {
        return *why = "the engine is starting or stopping; retry later", NGX_DECLINED;
    }
    if ((ngx_muse_mono_ns() - atomic_load(&h->heartbeat_ns)) / 1000000 > NGX_MUSE_STALE_MS) {
        return *why = "the engine is not answering; retry later", NGX_DECLINED;
    }
    if (muse_request_record_bytes(scope->len, body->len) > ctx->map->lay.request_bytes) {
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
    if (muse_request_encode(muse_ring_request_area(sl), ctx->map->lay.request_bytes, ctx->slot_generation,
                            kind, (uint32_t) flags, scope->data, scope->len, body->data,
                            body->len) != 0)
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

    fd = socket(AF_UNIX, SOCK_STREAM|SOCK_NONBLOCK|SOCK_CLOEXEC, 0);
    ngx_memzero(&sa, sizeof(sa));
    sa.sun_family = AF_UNIX;
    ngx_memcpy(sa.sun_path, ctx->engine->socket_path.data, ctx->engine->socket_path.len);
    ngx_memzero(&msg, sizeof(msg));
    msg.magic = MUSE_CLAIM_MAGIC;
    msg.abi_version = MUSE_RING_ABI_VERSION;
    msg.segment_generation = ctx->seg_generation;
    msg.slot_generation = ctx->slot_generation;
    msg.slot = ctx->slot;
    if (fd == -1 || connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == -1
        || send(fd, &msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t) sizeof(msg))
    {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, ngx_socket_errno,
                      "muse: cannot reach the engine's socket");
        if (fd != -1) {
            close(fd);
        }
        want = MUSE_SLOT_SUBMITTED;
        atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_FREE);
        return *why = "the engine is not answering; retry later", NGX_DECLINED;
    }
    pc = ngx_get_connection(fd, r->connection->log);
    if (pc == NULL) {
        close(fd);   /* the engine sees EOF and frees the slot */
        return *why = "out of connections", NGX_DECLINED;
    }
    pc->data = ctx;
    pc->read->handler = ngx_muse_peer_read;
    pc->write->handler = ngx_muse_peer_write;
    pc->read->log = pc->write->log = pc->log;
    pc->write->ready = 1;
    ctx->peer = pc;
    if (ngx_handle_read_event(pc->read, 0) != NGX_OK) {
        return *why = "cannot watch the engine socket", NGX_DECLINED;
    }
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

