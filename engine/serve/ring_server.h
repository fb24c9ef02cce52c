/* The engine's IO side: owns the shared-memory segment (muse_ring.h) and the doorbell socket,
 * runs a libevent loop on its own thread, and hands validated requests to the scheduler.
 *
 * Threads: muse_server_start spawns the IO thread. Every other function is for the scheduler
 * (one thread; muse_server_set_health/heartbeat/set_state may also be called from any one
 * other thread). Steady state allocates nothing on the scheduler side.
 *
 * A request's life: next_request hands it out (its views stay valid until finish), the
 * scheduler emits event records (emit returns 1 when the slot's ring is full: retry next
 * round, that is the back-pressure), polls is_cancelled between rounds, and calls finish
 * exactly once (also after a cancel). The slot is reused only after both finish was called and
 * the worker closed its doorbell. */
#ifndef MUSE_RING_SERVER_H
#define MUSE_RING_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/muse_common.h"
#include "abi/muse_ring.h"

typedef struct muse_server muse_server;

typedef struct {
    const char *shm_name;      /* label of the segment's memfd, seen in /proc/PID/fd as
                                * /memfd:LABEL (a leading '/' is dropped; NULL: muse-engine);
                                * nothing is created under any name */
    const char *socket_path;   /* unix socket path, < 108 bytes */
    int slots;                 /* concurrent requests (slot table size) */
    size_t ring_bytes;         /* per-slot event ring, power of two >= 4096 (0: 256 KiB) */
    size_t request_bytes;      /* per-slot request area, >= 1024 (0: 1 MiB + 4 KiB) */
    size_t health_bytes;       /* health text capacity (0: 64 KiB) */
    int socket_gid;            /* group of the nginx workers for the socket; -1: keep */
    uint32_t abi_version;      /* 0: MUSE_RING_ABI_VERSION; tests set others */
    const uint8_t *worker_key; /* NULL: the hello goes to any peer the socket's mode lets in;
                                * else only a peer that answers the challenge with its HMAC */
    size_t worker_key_len;     /* 32..256 (base/keyfile.h) */
} muse_server_opts;

/* A request's handle: its slot and the generation the slot had when the request was handed
 * out. A stale handle (the request finished, the slot maybe reused) is refused, so it can never
 * write into another request's ring. */
typedef struct {
    uint32_t index;
    uint64_t generation;
} muse_slot_ref;

typedef struct {
    muse_slot_ref ref;
    uint32_t kind, flags; /* MUSE_KIND_*, MUSE_REQ_* */
    const char *scope;    /* not NUL-terminated */
    size_t scope_len;
    const char *body; /* compact JSON, NUL-terminated (private copy) */
    size_t body_len;
} muse_request;

/* Creates the segment (an anonymous memfd sealed against shrink and grow, a random generation
 * and scope key) and the socket (0660, in a directory only this user or root may write), starts
 * the IO thread. Every accepted connection first gets a muse_hello_msg with the segment's
 * descriptor (SCM_RIGHTS), or with a worker key a muse_challenge_msg, and the hello only after
 * a right muse_auth_msg (a wrong one is logged and closed). State is STARTING until
 * muse_server_set_state(s, MUSE_ENGINE_SERVING). Refuses when another engine answers on the socket.
 */
int muse_server_start(const muse_server_opts *o, muse_server **out, muse_err *e);

/* Blocks up to timeout_ms (-1: forever) until a request is queued. 1 one is queued, 0 none. */
int muse_server_wait(muse_server *s, int timeout_ms);

/* 1 got one (views valid until muse_server_finish of its ref), 0 none queued. */
int muse_server_next_request(muse_server *s, muse_request *out);

/* 1 when the worker closed the doorbell (client gone), the slot is otherwise dead, or the
 * handle is stale. */
int muse_server_is_cancelled(muse_server *s, muse_slot_ref ref);

/* Appends one record and rings the doorbell. type MUSE_EV_DATA/BODY/ERROR/KEEPALIVE;
 * http_status only for MUSE_EV_ERROR (400..599). 0 ok, 1 ring full (retry next round),
 * -1 slot gone (cancelled, finished, corrupt, stale handle) or record larger than the ring can ever
 * hold (see muse_server_max_payload). */
int muse_server_emit(muse_server *s, muse_slot_ref ref, uint32_t type, int http_status,
                     const void *data, size_t len);

/* Largest payload one record can carry. */
size_t muse_server_max_payload(const muse_server *s);

/* Appends the END record (room for it is always reserved) and gives the slot back; a stale
 * handle does nothing. */
void muse_server_finish(muse_server *s, muse_slot_ref ref);

/* Publishes the /health JSON text (seqlock) and beats the heartbeat. */
void muse_server_set_health(muse_server *s, const char *json, size_t len);
void muse_server_heartbeat(muse_server *s);
/* MUSE_ENGINE_STARTING/SERVING/DOWN/FATAL into the segment header. */
void muse_server_set_state(muse_server *s, uint32_t state);

/* The cache-scope key handed to workers with the segment (32 bytes; tests check digests). */
const uint8_t *muse_server_scope_key(const muse_server *s);

/* Segment generation and slot count (tests, logs). */
uint64_t muse_server_generation(const muse_server *s);
int muse_server_slots(const muse_server *s);
/* Slots not FREE right now (tests: back to baseline after drain). */
int muse_server_busy_slots(const muse_server *s);

/* Marks the segment DOWN, stops the IO thread, closes every doorbell, unlinks the socket,
 * closes the segment (workers' mappings stay valid until they remap), frees everything. */
void muse_server_stop(muse_server *s);

#endif
