/* The shared-memory ABI between muse-engine and ngx_muse_module: the only header both include.
 *
 * C11, no engine or nginx includes. Everything in the segment is addressed by offsets from
 * its base, never by pointers. Neither side trusts the other: every length, offset and index
 * read from the segment goes through a bounds-checking helper below. docs/abi.md describes
 * the protocol (slot life cycle, doorbell socket, seqlock) in prose.
 *
 * The segment is an anonymous memfd sealed against shrinking and growing; the engine hands its
 * descriptor to each worker over the unix socket (SCM_RIGHTS, with muse_hello_msg) and it
 * never has a name a local user could plant.
 *
 * Segment layout (all offsets 64-byte aligned):
 *   [0, 256)                        muse_ring_header
 *   [health_offset, +16+health_bytes) muse_health_page + health text (seqlock)
 *   [slot_table_offset, +slot_count*slot_stride) slots; slot i at slot_table_offset+i*stride:
 *       muse_ring_slot (192 bytes) | request area (request_bytes) | event ring (ring_bytes)
 */
#ifndef MUSE_RING_H
#define MUSE_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MUSE_RING_MAGIC       0x474e49524553554dULL /* "MUSERING" little-endian */
#define MUSE_RING_ABI_VERSION 2u

#define MUSE_RING_ALIGN         64u
#define MUSE_RING_MAX_SLOTS     4096u
#define MUSE_RING_MIN_RING      4096u
#define MUSE_RING_MAX_RING      (1u << 30)
#define MUSE_RING_MIN_REQUEST   1024u
#define MUSE_RING_MAX_REQUEST   (1u << 30)
#define MUSE_RING_MAX_HEALTH    (1u << 20)
#define MUSE_RING_HEALTH_BYTES  65536u
#define MUSE_RING_MAX_SCOPE     32u /* a scope crosses as a keyed digest, never raw */
#define MUSE_SCOPE_DIGEST_BYTES 32u /* HMAC-SHA-256(scope_key, the configured scope value) */
#define MUSE_SCOPE_KEY_BYTES    32u

/* Engine state in the header (muse_ring_header.state). */
enum {
    MUSE_ENGINE_STARTING = 1, /* segment exists, model loading: requests get 503 */
    MUSE_ENGINE_SERVING = 2,
    MUSE_ENGINE_DOWN = 3,  /* stopped cleanly or draining */
    MUSE_ENGINE_FATAL = 4, /* sticky error: the engine will exit */
};

/* Slot state (muse_ring_slot.state). Who may move it is fixed:
 * FREE -> CLAIMED (worker, CAS) -> SUBMITTED (worker, after writing the request record)
 * SUBMITTED -> ACTIVE (engine, on a valid claim message) -> FREE (engine, when both the
 * scheduler finished and the worker closed the doorbell). CLAIMED/SUBMITTED -> FREE by the
 * engine's reaper when the claimer died or never connected. */
enum {
    MUSE_SLOT_FREE = 0,
    MUSE_SLOT_CLAIMED = 1,
    MUSE_SLOT_SUBMITTED = 2,
    MUSE_SLOT_ACTIVE = 3,
};

/* Request kinds (muse_request_record.kind). */
enum { MUSE_KIND_CHAT = 1, MUSE_KIND_COMPLETIONS = 2 };

/* Request flags (muse_request_record.flags). */
#define MUSE_REQ_STREAM        1u
#define MUSE_REQ_INCLUDE_USAGE 2u
#define MUSE_REQ_FLAGS_KNOWN   3u

/* Event record types (muse_event_header.type). */
enum {
    MUSE_EV_DATA = 1,      /* stream: payload is one SSE data: payload (chunk JSON) */
    MUSE_EV_BODY = 2,      /* non-stream: payload appended to the response body */
    MUSE_EV_ERROR = 3,     /* http_status + error JSON; after stream start: data: event */
    MUSE_EV_KEEPALIVE = 4, /* stream: ": keepalive" comment line; payload ignored */
    MUSE_EV_END = 5,       /* the response is complete (stream: data: [DONE]) */
};

typedef struct muse_ring_header {
    uint64_t magic;                /* 0: MUSE_RING_MAGIC, written last at creation */
    uint32_t abi_version;          /* 8: MUSE_RING_ABI_VERSION; never moves */
    uint32_t header_bytes;         /* 12: sizeof(muse_ring_header) */
    uint64_t generation;           /* 16: random per segment creation, never 0 */
    uint64_t total_bytes;          /* 24: size of the whole segment */
    uint32_t slot_count;           /* 32 */
    uint32_t slot_header_bytes;    /* 36: sizeof(muse_ring_slot) */
    uint64_t slot_stride;          /* 40 */
    uint64_t slot_table_offset;    /* 48 */
    uint64_t request_bytes;        /* 56: request area per slot */
    uint64_t ring_bytes;           /* 64: event ring per slot, a power of two */
    uint64_t health_offset;        /* 72 */
    uint64_t health_bytes;         /* 80: health text capacity */
    uint32_t engine_pid;           /* 88 */
    _Atomic uint32_t state;        /* 92: MUSE_ENGINE_* */
    _Atomic uint64_t heartbeat_ns; /* 96: CLOCK_MONOTONIC of the last heartbeat */
    uint64_t started_unix_ns;      /* 104: CLOCK_REALTIME at creation */
    uint8_t reserved[144];         /* 112..256 */
} muse_ring_header;

typedef struct muse_ring_slot {
    _Atomic uint32_t state;      /* 0: MUSE_SLOT_* */
    _Atomic uint32_t owner_pid;  /* 4: pid of the claiming worker */
    _Atomic uint64_t generation; /* 8: bumped by every claim; records carry it */
    _Atomic uint64_t claim_ns;   /* 16: CLOCK_MONOTONIC of the claim (reaper) */
    uint8_t pad0[40];            /* 24..64 */
    _Atomic uint64_t head;       /* 64: ring bytes written by the engine (monotonic) */
    _Atomic uint32_t wake;       /* 72: 1 while a doorbell byte is outstanding */
    uint8_t pad1[52];            /* 76..128 */
    _Atomic uint64_t tail;       /* 128: ring bytes consumed by the worker (monotonic) */
    uint8_t pad2[56];            /* 136..192 */
} muse_ring_slot;

/* In the slot's request area: this header, then scope bytes, then body bytes. */
typedef struct muse_request_record {
    uint32_t magic;        /* MUSE_REQUEST_MAGIC */
    uint32_t header_bytes; /* sizeof(muse_request_record) */
    uint64_t generation;   /* the slot generation the worker claimed */
    uint32_t kind;         /* MUSE_KIND_* */
    uint32_t flags;        /* MUSE_REQ_* */
    uint32_t scope_len;    /* 0 (no scope) or MUSE_SCOPE_DIGEST_BYTES */
    uint32_t body_len;     /* compact JSON of the validated request */
} muse_request_record;
#define MUSE_REQUEST_MAGIC 0x5145524du /* "MREQ" */

/* One event record in a slot's ring: this header, then length payload bytes, padded to 8. */
typedef struct muse_event_header {
    uint32_t length;      /* payload bytes */
    uint16_t type;        /* MUSE_EV_* */
    uint16_t http_status; /* MUSE_EV_ERROR: 400..599; else 0 */
    uint64_t generation;  /* slot generation; a stale one is rejected */
} muse_event_header;

/* Sent by the worker as the first 32 bytes on the doorbell socket ("claim slot S gen G"). */
typedef struct muse_claim_msg {
    uint32_t magic;              /* MUSE_CLAIM_MAGIC */
    uint32_t abi_version;        /* MUSE_RING_ABI_VERSION */
    uint64_t segment_generation; /* muse_ring_header.generation the worker mapped */
    uint64_t slot_generation;    /* muse_ring_slot.generation it claimed */
    uint32_t slot;
    uint32_t reserved; /* 0 */
} muse_claim_msg;
#define MUSE_CLAIM_MAGIC 0x4d4c434du /* "MCLM" */

/* Sent by the engine as the first 64 bytes on every accepted connection, with the segment's
 * descriptor attached (SCM_RIGHTS). The worker checks SO_PEERCRED, the magic, the ABI, that
 * the descriptor is sealed (no shrink, no grow) and total_bytes long, and that the mapped
 * header's generation equals this one. scope_key never touches shared memory. */
typedef struct muse_hello_msg {
    uint32_t magic;        /* MUSE_HELLO_MAGIC */
    uint32_t abi_version;  /* MUSE_RING_ABI_VERSION; offset 4 in every version */
    uint64_t generation;   /* == muse_ring_header.generation of the attached segment */
    uint64_t total_bytes;  /* the segment's sealed size */
    uint32_t engine_pid;   /* informational */
    uint32_t reserved;     /* 0 */
    uint8_t scope_key[32]; /* MUSE_SCOPE_KEY_BYTES, random per engine start */
} muse_hello_msg;
#define MUSE_HELLO_MAGIC 0x4f4c484du /* "MHLO" */

/* With a worker key (muse-engine serve --worker-key, muse_engine's third argument), every
 * accepted connection first gets this challenge instead of the hello; the peer answers with
 * muse_auth_msg, and only a right answer gets the hello and the segment. The key never crosses
 * the socket; a nonce is random per connection, so an answer cannot be replayed. */
typedef struct muse_challenge_msg {
    uint32_t magic;       /* MUSE_CHALLENGE_MAGIC */
    uint32_t abi_version; /* MUSE_RING_ABI_VERSION; offset 4, as in the hello */
    uint8_t nonce[32];
    uint32_t engine_pid; /* informational */
    uint8_t reserved[20];
} muse_challenge_msg;
#define MUSE_CHALLENGE_MAGIC 0x4c48434du /* "MCHL" */

/* The worker's answer: mac = HMAC-SHA-256(worker key, MUSE_AUTH_LABEL || nonce). */
typedef struct muse_auth_msg {
    uint32_t magic;       /* MUSE_AUTH_MAGIC */
    uint32_t abi_version; /* MUSE_RING_ABI_VERSION */
    uint8_t mac[32];
    uint8_t reserved[24]; /* 0 */
} muse_auth_msg;
#define MUSE_AUTH_MAGIC 0x5455414du /* "MAUT" */
#define MUSE_AUTH_LABEL "muse worker key v1"

/* The health page: seqlock sequence (odd while the engine writes), then text. */
typedef struct muse_health_page {
    _Atomic uint32_t seq;
    uint32_t length; /* bytes of health text (JSON) */
    uint32_t reserved[2];
} muse_health_page;

_Static_assert(sizeof(_Atomic uint32_t) == 4, "atomic u32 is 4 bytes");
_Static_assert(sizeof(_Atomic uint64_t) == 8, "atomic u64 is 8 bytes");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free (address-free across processes)");
_Static_assert(sizeof(muse_ring_header) == 256, "header is 256 bytes");
_Static_assert(offsetof(muse_ring_header, abi_version) == 8, "abi_version never moves");
_Static_assert(offsetof(muse_ring_header, heartbeat_ns) == 96, "header layout");
_Static_assert(offsetof(muse_ring_header, reserved) == 112, "header layout");
_Static_assert(sizeof(muse_ring_slot) == 192, "slot header is 192 bytes");
_Static_assert(offsetof(muse_ring_slot, head) == 64, "head on its own cache line");
_Static_assert(offsetof(muse_ring_slot, tail) == 128, "tail on its own cache line");
_Static_assert(sizeof(muse_request_record) == 32, "request record header is 32 bytes");
_Static_assert(sizeof(muse_event_header) == 16, "event header is 16 bytes");
_Static_assert(sizeof(muse_claim_msg) == 32, "claim message is 32 bytes");
_Static_assert(sizeof(muse_health_page) == 16, "health page header is 16 bytes");
_Static_assert(sizeof(muse_hello_msg) == 64, "hello message is 64 bytes");
_Static_assert(offsetof(muse_hello_msg, abi_version) == 4, "hello abi_version never moves");
_Static_assert(sizeof(((muse_hello_msg *)0)->scope_key) == MUSE_SCOPE_KEY_BYTES, "scope key");
_Static_assert(sizeof(muse_challenge_msg) == sizeof(muse_hello_msg),
               "a challenge reads as a hello");
_Static_assert(offsetof(muse_challenge_msg, abi_version) == 4, "challenge abi_version at 4");
_Static_assert(sizeof(muse_auth_msg) == 64, "auth message is 64 bytes");

/* ---- layout ---- */

static inline uint64_t muse_ring_align_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

/* Bytes of one slot: header, request area and ring, rounded to 64. */
static inline uint64_t muse_ring_slot_stride(uint64_t request_bytes, uint64_t ring_bytes)
{
    return muse_ring_align_up(sizeof(muse_ring_slot) + request_bytes + ring_bytes, MUSE_RING_ALIGN);
}

/* Fills every size and offset of a header for these parameters; 0 ok, -1 out of range. */
static inline int muse_ring_layout(muse_ring_header *h, uint32_t slots, uint64_t request_bytes,
                                   uint64_t ring_bytes, uint64_t health_bytes)
{
    if (slots < 1 || slots > MUSE_RING_MAX_SLOTS) return -1;
    if (ring_bytes < MUSE_RING_MIN_RING || ring_bytes > MUSE_RING_MAX_RING ||
        (ring_bytes & (ring_bytes - 1)))
        return -1;
    if (request_bytes < MUSE_RING_MIN_REQUEST || request_bytes > MUSE_RING_MAX_REQUEST ||
        request_bytes % 8)
        return -1;
    if (health_bytes < 1024 || health_bytes > MUSE_RING_MAX_HEALTH) return -1;
    h->header_bytes = sizeof(muse_ring_header);
    h->slot_count = slots;
    h->slot_header_bytes = sizeof(muse_ring_slot);
    h->request_bytes = request_bytes;
    h->ring_bytes = ring_bytes;
    h->health_offset = sizeof(muse_ring_header);
    h->health_bytes = health_bytes;
    h->slot_table_offset = muse_ring_align_up(
        h->health_offset + sizeof(muse_health_page) + health_bytes, MUSE_RING_ALIGN);
    h->slot_stride = muse_ring_slot_stride(request_bytes, ring_bytes);
    h->total_bytes = h->slot_table_offset + (uint64_t)slots * h->slot_stride;
    return 0;
}

/* Validates a mapped header against the mapping's real size. 0 ok; else -1 and *why names the
 * first bad field (a static string). Recomputes every derived size: nothing is taken on trust. */
static inline int muse_ring_check_header(const muse_ring_header *h, uint64_t mapped_bytes,
                                         const char **why)
{
    muse_ring_header want;
    *why = "ok";
    if (mapped_bytes < sizeof(muse_ring_header)) return *why = "segment smaller than header", -1;
    if (h->magic != MUSE_RING_MAGIC) return *why = "bad magic (engine not ready?)", -1;
    if (h->abi_version != MUSE_RING_ABI_VERSION) return *why = "ABI version mismatch", -1;
    if (h->header_bytes != sizeof(muse_ring_header)) return *why = "header_bytes", -1;
    if (h->slot_header_bytes != sizeof(muse_ring_slot)) return *why = "slot_header_bytes", -1;
    if (h->generation == 0) return *why = "generation 0", -1;
    memset(&want, 0, sizeof want);
    if (muse_ring_layout(&want, h->slot_count, h->request_bytes, h->ring_bytes, h->health_bytes) !=
        0)
        return *why = "slot_count/request_bytes/ring_bytes/health_bytes out of range", -1;
    if (want.slot_table_offset != h->slot_table_offset || want.slot_stride != h->slot_stride ||
        want.health_offset != h->health_offset || want.total_bytes != h->total_bytes)
        return *why = "offsets disagree with sizes", -1;
    if (h->total_bytes > mapped_bytes) return *why = "segment smaller than total_bytes", -1;
    return 0;
}

/* Slot i of a checked segment, or NULL when i is out of range. */
static inline muse_ring_slot *muse_ring_slot_at(void *base, const muse_ring_header *h, uint32_t i)
{
    if (i >= h->slot_count) return NULL;
    return (muse_ring_slot *)((uint8_t *)base + h->slot_table_offset +
                              (uint64_t)i * h->slot_stride);
}
static inline uint8_t *muse_ring_request_area(muse_ring_slot *s)
{
    return (uint8_t *)s + sizeof(muse_ring_slot);
}
static inline uint8_t *muse_ring_event_area(muse_ring_slot *s, const muse_ring_header *h)
{
    return (uint8_t *)s + sizeof(muse_ring_slot) + h->request_bytes;
}
static inline muse_health_page *muse_ring_health(void *base, const muse_ring_header *h)
{
    return (muse_health_page *)((uint8_t *)base + h->health_offset);
}

/* ---- request record ---- */

typedef struct {
    uint64_t generation;
    uint32_t kind, flags;
    const uint8_t *scope;
    uint32_t scope_len;
    const uint8_t *body;
    uint32_t body_len;
} muse_request_view;

/* Bytes a request record needs. */
static inline uint64_t muse_request_record_bytes(uint64_t scope_len, uint64_t body_len)
{
    return sizeof(muse_request_record) + scope_len + body_len;
}

/* Worker: writes a record into an area of cap bytes. 0 ok, -1 does not fit or bad field. */
static inline int muse_request_encode(uint8_t *area, uint64_t cap, uint64_t generation,
                                      uint32_t kind, uint32_t flags, const void *scope,
                                      uint64_t scope_len, const void *body, uint64_t body_len)
{
    muse_request_record r;
    if ((scope_len != 0 && scope_len != MUSE_SCOPE_DIGEST_BYTES) || body_len > UINT32_MAX)
        return -1;
    if (muse_request_record_bytes(scope_len, body_len) > cap) return -1;
    if (kind != MUSE_KIND_CHAT && kind != MUSE_KIND_COMPLETIONS) return -1;
    if (flags & ~MUSE_REQ_FLAGS_KNOWN) return -1;
    r.magic = MUSE_REQUEST_MAGIC;
    r.header_bytes = sizeof r;
    r.generation = generation;
    r.kind = kind;
    r.flags = flags;
    r.scope_len = (uint32_t)scope_len;
    r.body_len = (uint32_t)body_len;
    memcpy(area, &r, sizeof r);
    if (scope_len) memcpy(area + sizeof r, scope, scope_len);
    if (body_len) memcpy(area + sizeof r + scope_len, body, body_len);
    return 0;
}

/* Engine: decodes a record from an area of cap bytes (a private copy: the worker may still
 * scribble on the shared one). 0 ok; -1 bad and *why says which field. */
static inline int muse_request_decode(const uint8_t *area, uint64_t cap, uint64_t generation,
                                      muse_request_view *v, const char **why)
{
    muse_request_record r;
    *why = "ok";
    if (cap < sizeof r) return *why = "area smaller than record header", -1;
    memcpy(&r, area, sizeof r);
    if (r.magic != MUSE_REQUEST_MAGIC) return *why = "bad request magic", -1;
    if (r.header_bytes != sizeof r) return *why = "bad request header_bytes", -1;
    if (r.generation != generation) return *why = "stale request generation", -1;
    if (r.kind != MUSE_KIND_CHAT && r.kind != MUSE_KIND_COMPLETIONS)
        return *why = "unknown request kind", -1;
    if (r.flags & ~MUSE_REQ_FLAGS_KNOWN) return *why = "unknown request flags", -1;
    if (r.scope_len != 0 && r.scope_len != MUSE_SCOPE_DIGEST_BYTES)
        return *why = "scope_len is neither 0 nor a digest", -1;
    if (muse_request_record_bytes(r.scope_len, r.body_len) > cap)
        return *why = "record length past the request area", -1;
    v->generation = r.generation;
    v->kind = r.kind;
    v->flags = r.flags;
    v->scope = area + sizeof r;
    v->scope_len = r.scope_len;
    v->body = area + sizeof r + r.scope_len;
    v->body_len = r.body_len;
    return 0;
}

/* ---- event ring: single producer (engine), single consumer (worker) ---- */

/* Bytes one record takes in the ring. */
static inline uint64_t muse_event_record_bytes(uint64_t payload_len)
{
    return sizeof(muse_event_header) + muse_ring_align_up(payload_len, 8);
}

/* head/tail pair sane: tail 8-aligned and not ahead of head, at most ring_bytes unread. */
static inline int muse_ring_positions_ok(uint64_t head, uint64_t tail, uint64_t ring_bytes)
{
    return tail % 8 == 0 && head % 8 == 0 && head - tail <= ring_bytes;
}

static inline void muse_ring_copy_in(uint8_t *ring, uint64_t ring_bytes, uint64_t pos,
                                     const void *src, uint64_t n)
{
    uint64_t off = pos & (ring_bytes - 1), first = n < ring_bytes - off ? n : ring_bytes - off;
    memcpy(ring + off, src, first);
    if (n > first) memcpy(ring, (const uint8_t *)src + first, n - first);
}

static inline void muse_ring_copy_out(const uint8_t *ring, uint64_t ring_bytes, uint64_t pos,
                                      void *dst, uint64_t n)
{
    uint64_t off = pos & (ring_bytes - 1), first = n < ring_bytes - off ? n : ring_bytes - off;
    memcpy(dst, ring + off, first);
    if (n > first) memcpy((uint8_t *)dst + first, ring, n - first);
}

/* Engine: appends one record at head if it fits in front of tail while leaving `reserve`
 * bytes free (room for the END record). Never overwrites unread bytes.
 * 0 written (*new_head set), 1 ring full (retry later), -1 tail corrupt or record too large. */
static inline int muse_ring_put(uint8_t *ring, uint64_t ring_bytes, uint64_t head, uint64_t tail,
                                uint64_t reserve, const muse_event_header *h, const void *payload,
                                uint64_t *new_head)
{
    uint64_t need = muse_event_record_bytes(h->length);
    if (!muse_ring_positions_ok(head, tail, ring_bytes)) return -1;
    if (need + reserve > ring_bytes) return -1;
    if (need + reserve > ring_bytes - (head - tail)) return 1;
    muse_ring_copy_in(ring, ring_bytes, head, h, sizeof *h);
    if (h->length) muse_ring_copy_in(ring, ring_bytes, head + sizeof *h, payload, h->length);
    *new_head = head + need;
    return 0;
}

/* Worker: looks at the record at tail. 1 a valid record (*h filled; its payload starts at
 * tail+16), 0 ring empty, -1 corrupt (bad positions, length past head, unknown type, stale
 * generation) and *why says which. */
static inline int muse_ring_peek(const uint8_t *ring, uint64_t ring_bytes, uint64_t head,
                                 uint64_t tail, uint64_t generation, muse_event_header *h,
                                 const char **why)
{
    *why = "ok";
    if (!muse_ring_positions_ok(head, tail, ring_bytes)) return *why = "ring positions", -1;
    if (head == tail) return 0;
    if (head - tail < sizeof *h) return *why = "partial record header", -1;
    muse_ring_copy_out(ring, ring_bytes, tail, h, sizeof *h);
    if (h->length > ring_bytes - sizeof *h) return *why = "record length past ring", -1;
    if (muse_event_record_bytes(h->length) > head - tail) return *why = "record past head", -1;
    if (h->type < MUSE_EV_DATA || h->type > MUSE_EV_END) return *why = "unknown record type", -1;
    if (h->generation != generation) return *why = "stale record generation", -1;
    if (h->type == MUSE_EV_ERROR && (h->http_status < 400 || h->http_status > 599))
        return *why = "error record status", -1;
    return 1;
}

/* ---- health page: seqlock, one writer (engine), many readers (workers) ---- */

static inline void muse_health_write(muse_health_page *p, uint64_t cap, const void *text,
                                     uint64_t len)
{
    uint32_t s = atomic_load_explicit(&p->seq, memory_order_relaxed);
    if (len > cap) len = cap;
    atomic_store_explicit(&p->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    p->length = (uint32_t)len;
    memcpy((uint8_t *)(p + 1), text, len);
    atomic_store_explicit(&p->seq, s + 2, memory_order_release);
}

/* Copies a consistent snapshot of the health text into dst (dst_cap bytes). 0 ok with *len
 * set; -1 when no consistent copy was seen within a bounded number of tries or the length is
 * out of range. Bounds the length before copying, even inside a torn read. */
static inline int muse_health_read(const muse_health_page *p, uint64_t cap, void *dst,
                                   uint64_t dst_cap, uint64_t *len)
{
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t s1 = atomic_load_explicit(&p->seq, memory_order_acquire);
        if (s1 & 1) continue;
        uint64_t n = ((const volatile muse_health_page *)p)->length;
        if (n > cap || n > dst_cap) n = 0;
        memcpy(dst, (const uint8_t *)(p + 1), n);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->seq, memory_order_relaxed) != s1) continue;
        if (((const volatile muse_health_page *)p)->length > cap ||
            ((const volatile muse_health_page *)p)->length > dst_cap)
            return -1;
        *len = n;
        return 0;
    }
    return -1;
}

#endif
