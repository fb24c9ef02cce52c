/*
 * ngx_muse_module.h: the types and functions the module's files share (ngx_muse_module.c the
 * handler and directives, ngx_muse_transport.c the engine link and ring drain,
 * ngx_muse_status.c the status pages). Not installed; nothing outside the module includes it.
 */

#ifndef NGX_MUSE_MODULE_H
#define NGX_MUSE_MODULE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "abi/muse_limits.h"
#include "abi/muse_ring.h"
#include "base/keyfile.h"

#define NGX_MUSE_SERVE_CHAT        1
#define NGX_MUSE_SERVE_COMPLETIONS 2
#define NGX_MUSE_SERVE_MODELS      3
#define NGX_MUSE_SERVE_HEALTH      4
#define NGX_MUSE_SERVE_METRICS     5

#define NGX_MUSE_HEALTH_FULL       1   /* muse_health_view full: the engine's whole page */
#define NGX_MUSE_HEALTH_PUBLIC     2   /* public: status and reason only */

#define NGX_MUSE_STALE_MS     3000
#define NGX_MUSE_HANDSHAKE_MS 1000   /* muse_handshake_timeout's default: the hello's wait */

/* One mapping of the engine's segment in this worker; retired mappings live until their last
 * request lets go. */
typedef struct ngx_muse_map_s {
    u_char                 *base;
    muse_ring_header        lay;    /* the checked layout: never re-read from the segment */
    size_t                  size;
    ino_t                   sock_ino;   /* the socket the hello came on: a new one is a new
                                         * engine, whatever this segment's heartbeat says */
    dev_t                   sock_dev;
    u_char                  scope_key[MUSE_SCOPE_KEY_BYTES];  /* from the hello */
    ngx_uint_t              refs;
    unsigned                retired:1;
} ngx_muse_map_t;

typedef struct {
    ngx_str_t               socket_path;
    ngx_str_t               user;         /* the engine's user, as configured */
    ngx_uid_t               uid;          /* SO_PEERCRED of the socket must say this */
    ngx_muse_map_t         *map;          /* current mapping in this worker */
    const char             *down;         /* why the module saw the engine go, or NULL */
    uint64_t                down_gen;     /* the segment and heartbeat it saw then */
    uint64_t                down_beat;
    size_t                  key_len;      /* the worker key (0: none), read by the master */
    u_char                  key[MUSE_KEY_MAX_BYTES];
} ngx_muse_engine_t;

typedef struct {
    ngx_uint_t              serve;
    ngx_muse_engine_t      *engine;
    ngx_str_t               model_id;
    ngx_msec_t              queue_timeout;
    ngx_msec_t              idle_timeout;
    ngx_msec_t              handshake_timeout;  /* connect to hello: a stopped engine's
                                                 * backlog accepts, then nothing comes */
    ngx_array_t            *api_keys;     /* of ngx_str_t */
    ngx_int_t               scope_index;
    ngx_uint_t              max_json_values;
    ngx_uint_t              health_view;  /* NGX_MUSE_HEALTH_* */
} ngx_muse_loc_conf_t;

typedef struct {
    ngx_http_request_t     *request;
    ngx_muse_engine_t      *engine;
    ngx_muse_map_t         *map;
    ngx_connection_t       *peer;         /* the doorbell; closing it cancels */
    uint64_t                seg_generation;
    uint64_t                slot_generation;
    uint32_t                slot;
    ngx_msec_t              started;
    ngx_msec_t              last_event;
    ino_t                   sock_ino;     /* the socket path's inode at connect (lstat) */
    dev_t                   sock_dev;
    ngx_chain_t            *free;
    ngx_chain_t            *busy;
    ngx_str_t               body;         /* the validated request to send */
    ngx_str_t               scope;        /* the cache scope's value (hashed at the claim) */
    ngx_uint_t              kind;         /* MUSE_KIND_* */
    ngx_uint_t              flags;        /* MUSE_REQ_* */
    unsigned                status:1;     /* a status page waiting for the hello */
    unsigned                has_scope:1;
    unsigned                hello:1;      /* the engine's hello came on peer */
    unsigned                challenged:1; /* the engine's challenge came and was answered */
    unsigned                claimed:1;    /* the claim went: peer is the slot's doorbell */
    unsigned                peer_closed:1;  /* the engine closed the doorbell */
    unsigned                stream:1;
    unsigned                headers_sent:1;
    unsigned                admitted:1;     /* the engine has sent a record: idle timer now */
    unsigned                peer_eof:1;
    unsigned                finished:1;
} ngx_muse_ctx_t;

extern ngx_module_t  ngx_muse_module;

/* ngx_muse_module.c: responses */
ngx_int_t ngx_muse_add_header(ngx_http_request_t *r, const char *name, const char *value);
ngx_int_t ngx_muse_send_body(ngx_http_request_t *r, ngx_uint_t status, const char *type,
    u_char *data, size_t len);
ngx_int_t ngx_muse_send_error(ngx_http_request_t *r, ngx_uint_t status, const char *type,
    const char *param, const char *code, const char *message);

/* ngx_muse_transport.c: the engine's segment, submitting, the ring drain */
uint64_t ngx_muse_mono_ns(void);
void ngx_muse_map_unref(ngx_muse_map_t *m);
void ngx_muse_mark_down(ngx_muse_engine_t *eng, const char *reason);
const char *ngx_muse_down_reason(ngx_muse_engine_t *eng);
ngx_uint_t ngx_muse_map_fresh(ngx_muse_engine_t *eng);
ngx_int_t ngx_muse_connect(ngx_muse_ctx_t *ctx, const char **why);
ngx_int_t ngx_muse_submit(ngx_muse_ctx_t *ctx, const char **why);
void ngx_muse_close_peer(ngx_muse_ctx_t *ctx);
void ngx_muse_cleanup(void *data);
void ngx_muse_arm_timer(ngx_muse_ctx_t *ctx);
void ngx_muse_client_write(ngx_http_request_t *r);

/* ngx_muse_status.c: /v1/models, /health, /metrics */
ngx_int_t ngx_muse_status_page(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf);
ngx_int_t ngx_muse_status_answer(ngx_http_request_t *r, const char *why);

#endif /* NGX_MUSE_MODULE_H */
