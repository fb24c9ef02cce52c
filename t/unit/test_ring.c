/* The shared-memory ABI (muse_ring.h) and the engine's IO side (ring_server.c): records,
 * corruption both ways, back-pressure, wraparound, and a worker talking to a live server. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "serve/ring_server.h"
#include "tap.h"

/* ---- pure ABI helpers ---- */

static void test_layout(void)
{
    muse_ring_header h;
    const char *why;
    memset(&h, 0, sizeof h);
    is_int(muse_ring_layout(&h, 4, 8192, 4096, 4096), 0, "layout for 4 slots");
    h.magic = MUSE_RING_MAGIC;
    h.abi_version = MUSE_RING_ABI_VERSION;
    h.generation = 7;
    is_int(h.slot_stride, 192 + 8192 + 4096, "slot stride = header + request + ring");
    is_int(h.slot_table_offset % 64, 0, "slot table 64-aligned");
    is_int(muse_ring_check_header(&h, h.total_bytes, &why), 0, "valid header accepted (%s)", why);
    ok(muse_ring_check_header(&h, h.total_bytes - 1, &why) == -1, "short mapping: %s", why);
    muse_ring_header bad = h;
    bad.abi_version = MUSE_RING_ABI_VERSION + 1;
    ok(muse_ring_check_header(&bad, h.total_bytes, &why) == -1 && strstr(why, "ABI"),
       "other ABI version refused: %s", why);
    bad = h;
    bad.slot_count = 1u << 30;
    ok(muse_ring_check_header(&bad, h.total_bytes, &why) == -1, "huge slot_count: %s", why);
    bad = h;
    bad.slot_table_offset += 64;
    ok(muse_ring_check_header(&bad, h.total_bytes, &why) == -1, "moved slot table: %s", why);
    bad = h;
    bad.ring_bytes = 6000;
    ok(muse_ring_check_header(&bad, h.total_bytes, &why) == -1, "ring not power of 2: %s", why);
    ok(muse_ring_layout(&bad, 0, 8192, 4096, 4096) == -1, "0 slots refused");
    static uint8_t fake[64];
    ok(muse_ring_slot_at(fake, &h, 4) == NULL, "slot index 4 of 4 out of range");
}

static void test_request_record(void)
{
    uint8_t area[1024];
    muse_request_view v;
    const char *why, *body = "{\"messages\":[]}";
    memset(area, 0xAB, sizeof area);
    const char *digest = "0123456789abcdef0123456789abcdef"; /* a scope is a 32-byte digest */
    is_int(muse_request_encode(area, sizeof area, 42, MUSE_KIND_CHAT, MUSE_REQ_STREAM, digest, 32,
                               body, strlen(body)),
           0, "encode");
    ok(muse_request_encode(area, sizeof area, 42, MUSE_KIND_CHAT, 0, "tenant", 6, body,
                           strlen(body)) == -1,
       "encode refuses a scope that is not a digest (a raw value never enters the segment)");
    is_int(muse_request_decode(area, sizeof area, 42, &v, &why), 0, "decode (%s)", why);
    ok(v.kind == MUSE_KIND_CHAT && v.flags == MUSE_REQ_STREAM && v.generation == 42, "fields");
    ok(v.scope_len == 32 && memcmp(v.scope, digest, 32) == 0, "scope digest round trip");
    ok(v.body_len == strlen(body) && memcmp(v.body, body, v.body_len) == 0, "body round trip");
    ok(muse_request_decode(area, sizeof area, 43, &v, &why) == -1 && strstr(why, "stale"),
       "stale generation rejected: %s", why);
    ok(muse_request_encode(area, 40, 1, MUSE_KIND_CHAT, 0, NULL, 0, body, strlen(body)) == -1,
       "encode refuses a record past the area");
    ok(muse_request_decode(area, 40, 42, &v, &why) == -1, "decode with short area: %s", why);
    muse_request_record r;
    memcpy(&r, area, sizeof r);
    r.body_len = 0xFFFFFFF0u;
    memcpy(area, &r, sizeof r);
    ok(muse_request_decode(area, sizeof area, 42, &v, &why) == -1 && strstr(why, "past"),
       "body_len past the area rejected: %s", why);
    r.body_len = 3;
    r.scope_len = 100000;
    memcpy(area, &r, sizeof r);
    ok(muse_request_decode(area, sizeof area, 42, &v, &why) == -1, "huge scope: %s", why);
    r.scope_len = 6;
    memcpy(area, &r, sizeof r);
    ok(muse_request_decode(area, sizeof area, 42, &v, &why) == -1, "6-byte scope: %s", why);
    r.scope_len = 0;
    r.kind = 9;
    memcpy(area, &r, sizeof r);
    ok(muse_request_decode(area, sizeof area, 42, &v, &why) == -1, "unknown kind: %s", why);
}

enum { RB = 4096 };
static uint8_t ring[RB];

/* Reads up to n records at *tail, checking each payload against its sequence number. */
static int consume(uint64_t head, uint64_t *tail, int n, int *seq)
{
    muse_event_header got;
    uint8_t out[700];
    const char *why;
    int bad = 0;
    for (int c = 0; c < n; c++) {
        int rc = muse_ring_peek(ring, RB, head, *tail, 5, &got, &why);
        if (rc == 0) break;
        if (rc < 0 || got.length > sizeof out) return bad + 1;
        muse_ring_copy_out(ring, RB, *tail + 16, out, got.length);
        for (uint32_t k = 0; k < got.length; k++) bad += out[k] != (uint8_t)(*seq * 7 + (int)k);
        (*seq)++;
        *tail += muse_event_record_bytes(got.length);
    }
    return bad;
}

/* Pushes records of varying sizes over many laps of a 4 KiB ring; reads them back in order. */
static void test_ring_wrap_and_full(void)
{
    uint8_t payload[700], out[700];
    uint64_t head = 0, tail = 0, nh;
    muse_event_header h, got;
    const char *why;
    int put_seq = 0, get_seq = 0, bad = 0, fulls = 0;
    for (int round = 0; round < 2000; round++) {
        int len = (round * 37) % 690 + 1;
        for (int k = 0; k < len; k++) payload[k] = (uint8_t)(put_seq * 7 + k);
        memset(&h, 0, sizeof h);
        h.length = (uint32_t)len;
        h.type = MUSE_EV_DATA;
        h.generation = 5;
        int rc = muse_ring_put(ring, RB, head, tail, 16, &h, payload, &nh);
        if (rc == 1) {
            fulls++;
            bad += consume(head, &tail, 2, &get_seq);
            continue;
        }
        if (rc != 0) {
            bad++;
            continue;
        }
        head = nh;
        put_seq++;
        if (round % 3 == 0) bad += consume(head, &tail, 1, &get_seq);
    }
    bad += consume(head, &tail, 1000, &get_seq);
    ok(head > 20 * RB, "many laps around the ring (%llu bytes)", (unsigned long long)head);
    ok(fulls > 10, "ring full reported %d times", fulls);
    is_int(bad, 0, "every record read back intact, in order, nothing overwritten");
    ok(put_seq == get_seq && head == tail, "every record put was read (%d)", put_seq);

    /* full means full: the unread record survives a refused put */
    head = tail = 0;
    memset(&h, 0, sizeof h);
    h.type = MUSE_EV_DATA;
    h.generation = 9;
    h.length = 2000;
    memset(payload, 'A', sizeof payload);
    static uint8_t big[4096];
    memset(big, 'A', sizeof big);
    is_int(muse_ring_put(ring, RB, head, tail, 16, &h, big, &head), 0, "2000-byte record fits");
    is_int(muse_ring_put(ring, RB, head, tail, 16, &h, big, &nh), 0, "second fits");
    h.length = 100;
    memset(big, 'B', sizeof big);
    is_int(muse_ring_put(ring, RB, nh, tail, 16, &h, big, &nh), 1, "third: ring full");
    is_int(muse_ring_peek(ring, RB, head, tail, 9, &got, &why), 1, "first record still there");
    muse_ring_copy_out(ring, RB, 16, out, 1);
    is_int(out[0], 'A', "not overwritten");
    h.length = 5000;
    ok(muse_ring_put(ring, RB, 0, 0, 16, &h, big, &nh) == -1, "record larger than ring: -1");

    /* corrupt positions and records, as a worker or engine could write them */
    ok(muse_ring_put(ring, RB, 64, 128, 16, &h, big, &nh) == -1, "tail ahead of head: -1");
    ok(muse_ring_put(ring, RB, 8192, 0, 16, &h, big, &nh) == -1, "more unread than ring: -1");
    ok(muse_ring_peek(ring, RB, 8, 0, 9, &got, &why) == -1, "partial header: %s", why);
    ok(muse_ring_peek(ring, RB, 4096, 3, 9, &got, &why) == -1, "unaligned tail: %s", why);
    ok(muse_ring_peek(ring, RB, head, 0, 10, &got, &why) == -1 && strstr(why, "stale"),
       "stale generation: %s", why);
    muse_event_header evil = {.length = 0xFFFFFFFFu, .type = MUSE_EV_DATA, .generation = 9};
    muse_ring_copy_in(ring, RB, 0, &evil, sizeof evil);
    ok(muse_ring_peek(ring, RB, 64, 0, 9, &got, &why) == -1, "huge length: %s", why);
    evil.length = 100;
    muse_ring_copy_in(ring, RB, 0, &evil, sizeof evil);
    ok(muse_ring_peek(ring, RB, 64, 0, 9, &got, &why) == -1, "length past head: %s", why);
    evil.length = 8;
    evil.type = 77;
    muse_ring_copy_in(ring, RB, 0, &evil, sizeof evil);
    ok(muse_ring_peek(ring, RB, 64, 0, 9, &got, &why) == -1, "unknown type: %s", why);
    evil.type = MUSE_EV_ERROR;
    evil.http_status = 200;
    muse_ring_copy_in(ring, RB, 0, &evil, sizeof evil);
    ok(muse_ring_peek(ring, RB, 64, 0, 9, &got, &why) == -1, "error with 200: %s", why);
}

static void test_health_page(void)
{
    static uint8_t mem[16 + 2048];
    char out[2048];
    uint64_t len = 0;
    muse_health_page *p = (muse_health_page *)mem;
    const char *j = "{\"status\":\"ok\"}";
    muse_health_write(p, 2048, j, strlen(j));
    is_int(muse_health_read(p, 2048, out, sizeof out, &len), 0, "health read");
    ok(len == strlen(j) && memcmp(out, j, len) == 0, "health text round trip");
    is_int(atomic_load(&p->seq) % 2, 0, "seq even after write");
    atomic_store(&p->seq, 3);
    ok(muse_health_read(p, 2048, out, sizeof out, &len) == -1, "odd seq forever: bounded -1");
    atomic_store(&p->seq, 4);
    p->length = 1u << 30;
    ok(muse_health_read(p, 2048, out, sizeof out, &len) == -1, "length past page: -1");
}

/* ---- a worker talking to a live server ---- */

typedef struct {
    uint8_t *base;
    size_t size;
    muse_ring_header *h;
} mapping;

/* Connects to the engine's socket and reads its hello; *seg gets the descriptor (or -1). */
static int worker_connect(const char *sock, muse_hello_msg *hello, int *seg)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
    *seg = -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
    struct iovec iov = {hello, sizeof *hello};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    if (recvmsg(fd, &m, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof *hello) return -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    if (cm && cm->cmsg_type == SCM_RIGHTS) memcpy(seg, CMSG_DATA(cm), sizeof(int));
    return fd;
}

/* The worker's side of the hello: a sealed descriptor of the announced size, mapped. */
static int map_segment(const char *sock, mapping *m, muse_hello_msg *hello)
{
    struct stat st;
    const char *why;
    int seg, fd = worker_connect(sock, hello, &seg);
    if (fd < 0 || seg < 0) return -1;
    close(fd);
    int seals = fcntl(seg, F_GET_SEALS);
    if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) return -2;
    fstat(seg, &st);
    if ((uint64_t)st.st_size != hello->total_bytes) return -3;
    m->size = (size_t)st.st_size;
    m->base = mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_SHARED, seg, 0);
    close(seg);
    if (m->base == MAP_FAILED) return -1;
    m->h = (muse_ring_header *)m->base;
    if (m->h->generation != hello->generation) return -4;
    return muse_ring_check_header(m->h, m->size, &why);
}

/* Connects (reading the hello), claims slot i, writes the record and sends the claim on the
 * same connection. Returns the socket. */
static int worker_submit(mapping *m, const char *sock, uint32_t i, const char *body,
                         uint64_t *gen_out, int corrupt)
{
    muse_hello_msg hello;
    int seg, fd = worker_connect(sock, &hello, &seg);
    if (fd < 0) return -1;
    if (seg >= 0) close(seg);
    muse_ring_slot *sl = muse_ring_slot_at(m->base, m->h, i);
    uint32_t want = MUSE_SLOT_FREE;
    if (!atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_CLAIMED)) return -1;
    uint64_t gen = atomic_fetch_add(&sl->generation, 1) + 1;
    atomic_store(&sl->owner_pid, (uint32_t)getpid());
    atomic_store(&sl->head, 0);
    atomic_store(&sl->tail, 0);
    atomic_store(&sl->wake, 0);
    muse_request_encode(muse_ring_request_area(sl), m->h->request_bytes, gen, MUSE_KIND_CHAT,
                        MUSE_REQ_STREAM, "scopeX-digest-of-32-bytes-......", 32, body,
                        strlen(body));
    if (corrupt) ((muse_request_record *)muse_ring_request_area(sl))->body_len = 1u << 31;
    atomic_store(&sl->state, MUSE_SLOT_SUBMITTED);
    muse_claim_msg c = {.magic = MUSE_CLAIM_MAGIC,
                        .abi_version = MUSE_RING_ABI_VERSION,
                        .segment_generation = m->h->generation,
                        .slot_generation = corrupt == 2 ? gen + 5 : gen,
                        .slot = i};
    if (write(fd, &c, sizeof c) != (ssize_t)sizeof c) return -1;
    *gen_out = gen;
    return fd;
}

/* Reads every available record into types[]; returns how many, -1 on corruption. */
static int worker_drain(mapping *m, uint32_t i, uint64_t gen, int *types, int max, char *last,
                        size_t lastcap)
{
    muse_ring_slot *sl = muse_ring_slot_at(m->base, m->h, i);
    uint8_t *ring = muse_ring_event_area(sl, m->h);
    muse_event_header h;
    const char *why;
    int n = 0;
    atomic_store(&sl->wake, 0);
    while (n < max) {
        uint64_t head = atomic_load(&sl->head), tail = atomic_load(&sl->tail);
        int rc = muse_ring_peek(ring, m->h->ring_bytes, head, tail, gen, &h, &why);
        if (rc == 0) break;
        if (rc < 0) return -1;
        size_t c = h.length < lastcap - 1 ? h.length : lastcap - 1;
        if (c) { /* keep the last non-empty payload (END has none) */
            muse_ring_copy_out(ring, m->h->ring_bytes, tail + 16, last, c);
            last[c] = 0;
        }
        types[n++] = h.type;
        atomic_store(&sl->tail, tail + muse_event_record_bytes(h.length));
    }
    return n;
}

static int wait_readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

static int wait_free(muse_server *s, int ms)
{
    for (int t = 0; t < ms; t++) {
        if (muse_server_busy_slots(s) == 0) return 1;
        usleep(1000);
    }
    return 0;
}

static void test_server(void)
{
    char shm[64], dir[64], sock[108], last[4096];
    int types[256];
    muse_server *s;
    muse_err e = {{0}};
    muse_request rq;
    mapping m;
    uint64_t gen;
    snprintf(shm, sizeof shm, "/muse-test-ring-%d", (int)getpid());
    snprintf(dir, sizeof dir, "/tmp/muse-test-ring-XXXXXX");
    if (!mkdtemp(dir)) {
        ok(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    snprintf(sock, sizeof sock, "%s/engine.sock", dir);
    muse_server_opts o = {.shm_name = shm,
                          .socket_path = sock,
                          .slots = 3,
                          .ring_bytes = 4096,
                          .request_bytes = 4096,
                          .socket_gid = -1};
    if (muse_server_start(&o, &s, &e) != 0) {
        ok(0, "server start: %s", e.msg);
        return;
    }
    muse_server_set_state(s, MUSE_ENGINE_SERVING);
    struct stat st;
    ok(stat(sock, &st) == 0 && (st.st_mode & 0777) == 0660, "socket is 0660");
    muse_hello_msg hello;
    is_int(map_segment(sock, &m, &hello), 0, "worker maps the sealed segment of the hello");
    ok(hello.magic == MUSE_HELLO_MAGIC && hello.abi_version == MUSE_RING_ABI_VERSION &&
           hello.generation == muse_server_generation(s),
       "hello: magic, ABI, generation");
    ok(memcmp(hello.scope_key, muse_server_scope_key(s), MUSE_SCOPE_KEY_BYTES) == 0,
       "hello carries the scope key");
    ok(memmem(m.base, m.size, hello.scope_key, MUSE_SCOPE_KEY_BYTES) == NULL,
       "the scope key is nowhere in the segment");
    char devshm[80];
    snprintf(devshm, sizeof devshm, "/dev/shm%s", shm);
    ok(access(devshm, F_OK) != 0 && errno == ENOENT, "nothing under the name in /dev/shm");
    {
        int seg, c = worker_connect(sock, &hello, &seg);
        ok(c >= 0 && seg >= 0, "every connection gets the descriptor");
        int seals = fcntl(seg, F_GET_SEALS);
        ok((seals & F_SEAL_SEAL) && !(seals & F_SEAL_WRITE), "sealed for good, still writable");
        ok(ftruncate(seg, 4096) != 0 && errno == EPERM, "shrinking it fails: EPERM");
        ok(ftruncate(seg, (off_t)hello.total_bytes * 2) != 0 && errno == EPERM,
           "growing it fails: EPERM");
        ok(fcntl(seg, F_ADD_SEALS, F_SEAL_WRITE) != 0, "nobody can add a seal (F_SEAL_SEAL)");
        close(seg);
        close(c);
    }
    muse_server_set_health(s, "{\"status\":\"ok\"}", 15);
    uint64_t hl = 0;
    is_int(
        muse_health_read(muse_ring_health(m.base, m.h), m.h->health_bytes, last, sizeof last, &hl),
        0, "worker reads health");
    is_int(hl, 15, "health length");

    /* happy path with back-pressure */
    int fd = worker_submit(&m, sock, 1, "{\"hello\":1}", &gen, 0);
    ok(fd >= 0, "worker submitted slot 1");
    ok(muse_server_wait(s, 2000) == 1 && muse_server_next_request(s, &rq) == 1, "request out");
    ok(rq.ref.index == 1 && rq.ref.generation == gen && rq.kind == MUSE_KIND_CHAT,
       "slot, gen, kind");
    is_str(rq.body, "{\"hello\":1}", "body NUL-terminated private copy");
    ok(rq.scope_len == 32 && memcmp(rq.scope, "scopeX-digest", 13) == 0, "scope digest");
    char pay[1000];
    memset(pay, 'x', sizeof pay);
    int emitted = 0, rc;
    muse_slot_ref first = rq.ref;
    while ((rc = muse_server_emit(s, first, MUSE_EV_DATA, 0, pay, 500)) == 0) emitted++;
    is_int(rc, 1, "ring full -> emit returns 1");
    ok(emitted == 7, "7 records of 516 bytes fit a 4 KiB ring with END reserved (%d)", emitted);
    ok(wait_readable(fd, 1000), "doorbell rang");
    char b[16];
    ok(recv(fd, b, sizeof b, MSG_DONTWAIT) == 1, "one doorbell byte for many records");
    is_int(worker_drain(&m, 1, gen, types, 256, last, sizeof last), emitted, "worker drains all");
    is_int(muse_server_emit(s, first, MUSE_EV_DATA, 0, "tail", 4), 0, "emit after drain");
    muse_slot_ref wrong_gen = {1, gen + 1}, wrong_index = {2, gen}, past_end = {1u << 30, gen};
    is_int(muse_server_emit(s, wrong_gen, MUSE_EV_DATA, 0, "x", 1), -1, "another generation: -1");
    is_int(muse_server_emit(s, wrong_index, MUSE_EV_DATA, 0, "x", 1), -1, "another slot: -1");
    is_int(muse_server_emit(s, past_end, MUSE_EV_DATA, 0, "x", 1), -1, "index past the table: -1");
    ok(muse_server_is_cancelled(s, wrong_gen) && !muse_server_is_cancelled(s, first),
       "a stale handle reads as cancelled, the live one does not");
    muse_server_finish(s, wrong_gen); /* must not end the live request */
    ok(muse_server_emit(s, first, MUSE_EV_ERROR, 200, "{}", 2) == -1, "error record with 200: -1");
    ok(muse_server_emit(s, first, MUSE_EV_DATA, 0, pay, 5000) == -1, "payload over ring: -1");
    muse_server_finish(s, first);
    ok(wait_readable(fd, 1000), "doorbell rang again");
    int n = worker_drain(&m, 1, gen, types, 256, last, sizeof last);
    ok(n == 2 && types[0] == MUSE_EV_DATA && types[1] == MUSE_EV_END, "DATA then END (%d)", n);
    is_int(muse_server_busy_slots(s), 1, "slot held until the worker closes");
    close(fd);
    ok(wait_free(s, 2000), "slot free after the worker closed");
    is_int(muse_server_emit(s, first, MUSE_EV_DATA, 0, "x", 1), -1, "the finished handle: -1");
    ok(muse_server_is_cancelled(s, first), "the finished handle reads as cancelled");

    /* cancel: the worker closes first */
    fd = worker_submit(&m, sock, 0, "{}", &gen, 0);
    ok(muse_server_wait(s, 2000) == 1 && muse_server_next_request(s, &rq) == 1, "second request");
    close(fd);
    for (int t = 0; t < 2000 && !muse_server_is_cancelled(s, rq.ref); t++) usleep(1000);
    ok(muse_server_is_cancelled(s, rq.ref), "closing the doorbell cancels");
    is_int(muse_server_emit(s, rq.ref, MUSE_EV_DATA, 0, "x", 1), -1, "emit to cancelled: -1");
    muse_server_finish(s, rq.ref);
    ok(wait_free(s, 2000), "cancelled slot freed after finish");

    /* corrupt record from the worker: error record back, no crash */
    fd = worker_submit(&m, sock, 2, "{}", &gen, 1);
    ok(wait_readable(fd, 2000), "engine answered the corrupt record");
    usleep(20000);
    n = worker_drain(&m, 2, gen, types, 256, last, sizeof last);
    ok(n == 2 && types[0] == MUSE_EV_ERROR && types[1] == MUSE_EV_END, "ERROR + END (%d)", n);
    ok(strstr(last, "bad_record") != NULL, "error names the code: %s", last);
    ok(muse_server_next_request(s, &rq) == 0, "corrupt request never reaches the scheduler");
    close(fd);
    ok(wait_free(s, 2000), "slot freed");

    /* stale generation in the claim: engine hangs up */
    fd = worker_submit(&m, sock, 0, "{}", &gen, 2);
    ok(wait_readable(fd, 2000) && recv(fd, b, sizeof b, 0) == 0, "stale claim: EOF");
    close(fd);
    ok(muse_server_next_request(s, &rq) == 0, "stale claim never reaches the scheduler");
    atomic_store(&muse_ring_slot_at(m.base, m.h, 0)->state, MUSE_SLOT_FREE);

    /* worker corrupts its tail: engine cancels the slot instead of overwriting */
    fd = worker_submit(&m, sock, 1, "{}", &gen, 0);
    ok(muse_server_wait(s, 2000) == 1 && muse_server_next_request(s, &rq) == 1, "request");
    atomic_store(&muse_ring_slot_at(m.base, m.h, 1)->tail, 12345);
    is_int(muse_server_emit(s, rq.ref, MUSE_EV_DATA, 0, "x", 1), -1, "corrupt tail: -1");
    ok(muse_server_is_cancelled(s, rq.ref), "and the slot is cancelled");
    muse_server_finish(s, rq.ref);
    close(fd);
    ok(wait_free(s, 2000), "slot freed");

    /* a connection that never claims a slot is closed after 2 s, not held forever */
    int idle = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un ia = {.sun_family = AF_UNIX};
    snprintf(ia.sun_path, sizeof ia.sun_path, "%s", sock);
    ok(connect(idle, (struct sockaddr *)&ia, sizeof ia) == 0, "a silent connection is accepted");
    char ib[sizeof(muse_hello_msg)];
    ok(wait_readable(idle, 1000) && read(idle, ib, sizeof ib) == (ssize_t)sizeof ib, "hello");
    ok(wait_readable(idle, 4000) && read(idle, ib, 1) == 0, "and closed by the engine within 4 s");
    close(idle);

    /* stop: header says DOWN, names unlinked */
    uint64_t g = muse_server_generation(s);
    muse_server_stop(s);
    ok(atomic_load(&m.h->state) == MUSE_ENGINE_DOWN && m.h->generation == g, "old mapping: DOWN");
    ok(access(sock, F_OK) != 0, "socket unlinked");
    uint8_t old_key[MUSE_SCOPE_KEY_BYTES];
    memcpy(old_key, hello.scope_key, sizeof old_key);

    /* a restart is a new segment, a new generation and a new scope key */
    muse_server *s2, *s3;
    ok(muse_server_start(&o, &s2, &e) == 0, "restart");
    mapping m2;
    is_int(map_segment(sock, &m2, &hello), 0, "the restarted engine hands over its segment");
    ok(hello.generation != g && m2.h->generation != g, "a new generation");
    ok(memcmp(hello.scope_key, old_key, sizeof old_key) != 0, "a new scope key");
    ok(atomic_load(&m.h->state) == MUSE_ENGINE_DOWN, "the old mapping still reads DOWN");
    munmap(m.base, m.size);
    munmap(m2.base, m2.size);
    /* a second engine on a live socket is refused */
    ok(muse_server_start(&o, &s3, &e) == -1 && strstr(e.msg, "another engine"), "%s", e.msg);
    muse_server_stop(s2);

    /* a socket directory others can write is refused, by name */
    chmod(dir, 0777);
    ok(muse_server_start(&o, &s3, &e) == -1 && strstr(e.msg, dir) && strstr(e.msg, "others"),
       "world-writable socket directory refused: %s", e.msg);
    chmod(dir, 0700);

    /* issue 23: a symbolic link anywhere on the socket's path is refused, naming it */
    char link[80], via[160];
    snprintf(link, sizeof link, "%s-link", dir);
    unlink(link);
    ok(symlink(dir, link) == 0, "a link to the socket directory");
    snprintf(via, sizeof via, "%s/engine.sock", link);
    o.socket_path = via;
    ok(muse_server_start(&o, &s3, &e) == -1 && strstr(e.msg, link) &&
           strstr(e.msg, "symbolic link"),
       "socket path through a link refused: %s", e.msg);
    ok(access(sock, F_OK) != 0, "nothing bound through the link");
    unlink(link);
    /* a directory above the socket's that others can write (not sticky) is refused too */
    char sub[96];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    ok(mkdir(sub, 0700) == 0, "a socket directory below the test's");
    snprintf(via, sizeof via, "%s/engine.sock", sub);
    chmod(dir, 0777);
    ok(muse_server_start(&o, &s3, &e) == -1 && strstr(e.msg, dir) && strstr(e.msg, "others"),
       "a world-writable directory above the socket's refused: %s", e.msg);
    chmod(dir, 0700);
    ok(muse_server_start(&o, &s3, &e) == 0, "the same path with the parent fixed: served");
    muse_server_stop(s3);
    o.socket_path = sock;
    rmdir(sub);
    rmdir(dir);
}

int main(void)
{
    test_layout();
    test_request_record();
    test_ring_wrap_and_full();
    test_health_page();
    test_server();
    return done_testing();
}
