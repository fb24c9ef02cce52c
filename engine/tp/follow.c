/* The round stream (follow.h). A record: its kind, then the fields in this host's layout (the
 * rendezvous checked every rank has the same byte order and build). Followers check every
 * length and index before using it: the stream is bounded by max rows, slots and blocks. */
#include "tp/follow.h"

enum { REC_STOP = 1, REC_ROUND = 2, REC_SNAPSHOT = 3 };
enum { HAS_WANT = 1, HAS_SAMPLING = 2, HAS_DRAW_POS = 4, RETURN_LOGITS = 8 };

/* A round's record: u32 kind, u32 flags, i64 rows, i64 wanted, i64 tables, then tokens
 * [rows] i32, positions [rows] i64, seqs [rows] i32, want [rows] u8, sampling [wanted],
 * draw_pos [wanted] i64, and per table: seq i32, blocks [blocks_per_seq] i32. */
#define ROUND_HEAD 32

static size_t round_bytes(long rows, long wanted, long tables, int64_t bps)
{
    return ROUND_HEAD + (size_t)rows * (4 + 8 + 4 + 1) +
           (size_t)wanted * (sizeof(muse_sampling) + 8) + (size_t)tables * (4 + 4 * (size_t)bps);
}

typedef struct {
    uint8_t *p;
} cursor;

static void put(cursor *c, const void *src, size_t n)
{
    if (n) memcpy(c->p, src, n);
    c->p += n;
}

static void put32(cursor *c, int32_t v)
{
    put(c, &v, 4);
}

static void put64(cursor *c, int64_t v)
{
    put(c, &v, 8);
}

/* One buffer for the records rank 0 sends, grown to the largest round once. */
static uint8_t *record_buf(muse_comm *c, size_t n)
{
    if (n > c->rec_cap) {
        uint8_t *b = realloc(c->rec, n);
        if (!b) return NULL;
        c->rec = b;
        c->rec_cap = n;
    }
    return c->rec;
}

static int send_record(muse_comm *c, uint8_t *buf, size_t len)
{
    return muse_comm_broadcast(c, buf, &len, len, -1);
}

int muse_tp_lead_round(muse_comm *c, const muse_backend *be, const muse_round *r)
{
    long wanted = 0, tables = 0;
    for (long i = 0; i < r->rows; i++) {
        if (!r->want_logits || r->want_logits[i]) wanted++;
        if (!i || r->seqs[i] != r->seqs[i - 1]) tables++;
    }
    int64_t bps = be->kv.blocks_per_seq;
    size_t len = round_bytes(r->rows, wanted, tables, bps);
    uint8_t *buf = record_buf(c, len);
    if (!buf) return muse_comm_fail(c, 0, "no memory for a round's record");
    uint32_t flags = (r->want_logits ? HAS_WANT : 0) | (r->sampling ? HAS_SAMPLING : 0) |
                     (r->draw_pos ? HAS_DRAW_POS : 0) | (r->return_logits ? RETURN_LOGITS : 0);
    cursor w = {buf};
    put32(&w, REC_ROUND);
    put32(&w, (int32_t)flags);
    put64(&w, r->rows);
    put64(&w, wanted);
    put64(&w, tables);
    put(&w, r->tokens, (size_t)r->rows * 4);
    put(&w, r->positions, (size_t)r->rows * 8);
    put(&w, r->seqs, (size_t)r->rows * 4);
    if (r->want_logits)
        put(&w, r->want_logits, (size_t)r->rows);
    else
        memset(w.p, 1, (size_t)r->rows), w.p += r->rows;
    if (r->sampling)
        put(&w, r->sampling, (size_t)wanted * sizeof *r->sampling);
    else
        memset(w.p, 0, (size_t)wanted * sizeof *r->sampling), w.p += wanted * sizeof *r->sampling;
    if (r->sampling && r->draw_pos)
        put(&w, r->draw_pos, (size_t)wanted * 8);
    else
        memset(w.p, 0, (size_t)wanted * 8), w.p += wanted * 8;
    for (long i = 0; i < r->rows; i++) {
        if (i && r->seqs[i] == r->seqs[i - 1]) continue;
        put32(&w, r->seqs[i]);
        /* a slot outside the pool is check_batch's to refuse; it sends no table */
        if (r->seqs[i] >= 0 && r->seqs[i] < be->kv.max_seqs)
            put(&w, muse_kv_table(&be->kv, r->seqs[i]), (size_t)bps * 4);
        else
            memset(w.p, 0xff, (size_t)bps * 4), w.p += bps * 4;
    }
    MUSE_CHECK((size_t)(w.p - buf) == len);
    return send_record(c, buf, len);
}

int muse_tp_lead_snapshot(muse_comm *c, int save, int seq, int64_t end_pos, int slot)
{
    uint8_t buf[24];
    cursor w = {buf};
    put32(&w, REC_SNAPSHOT);
    put32(&w, save);
    put32(&w, seq);
    put32(&w, slot);
    put64(&w, end_pos);
    return send_record(c, buf, sizeof buf);
}

/* The round hook's two calls (forward.h) for rank 0. */
static int lead_round_hook(void *ctx, const muse_backend *be, const muse_round *r, muse_err *e)
{
    muse_comm *c = ctx;
    return muse_tp_lead_round(c, be, r) ? muse_comm_error(c, e) : 0;
}

static void lead_snapshot_hook(void *ctx, int save, int seq, int64_t end_pos, int slot)
{
    muse_tp_lead_snapshot(ctx, save, seq, end_pos, slot);
}

void muse_tp_lead_forward(muse_comm *c, muse_forward *f)
{
    if (!c || c->rank != 0) return;
    muse_round_hook hook = {lead_round_hook, lead_snapshot_hook, c};
    muse_forward_set_hook(f, &hook);
}

void muse_tp_close(muse_comm *c)
{
    if (!c) return;
    if (c->rank == 0) {
        uint8_t buf[8] = {0};
        int32_t kind = REC_STOP;
        memcpy(buf, &kind, 4);
        send_record(c, buf, sizeof buf); /* a rank already gone has nothing to stop */
    }
    muse_comm_destroy(c);
}

/* ---- the follower's side ---- */

typedef struct {
    int32_t *tokens, *seqs;
    int64_t *positions, *draw_pos;
    uint8_t *want;
    muse_sampling *sampling;
} round_arrays;

static void take(const uint8_t **at, void *dst, size_t n)
{
    if (n) memcpy(dst, *at, n);
    *at += n;
}

/* Decodes a round record of len bytes into r (arrays in a), its tables into be->kv. */
static int decode_round(const uint8_t *buf, size_t len, muse_backend *be, round_arrays *a,
                        muse_round *r, muse_err *e)
{
    const muse_backend_opts *o = &be->opts;
    if (len < ROUND_HEAD) return muse_fail(e, "a round record of %zu bytes is too short", len);
    int32_t flags;
    int64_t rows, wanted, tables, bps = be->kv.blocks_per_seq;
    memcpy(&flags, buf + 4, 4);
    memcpy(&rows, buf + 8, 8);
    memcpy(&wanted, buf + 16, 8);
    memcpy(&tables, buf + 24, 8);
    if (rows < 1 || rows > o->max_rows || wanted < 0 || wanted > rows || tables < 1 ||
        tables > rows || len != round_bytes((long)rows, (long)wanted, (long)tables, bps))
        return muse_fail(e,
                         "a round record of %zu bytes does not hold %lld rows (at most %ld), "
                         "%lld wanted and %lld tables",
                         len, (long long)rows, o->max_rows, (long long)wanted, (long long)tables);
    const uint8_t *at = buf + ROUND_HEAD;
    take(&at, a->tokens, (size_t)rows * 4);
    take(&at, a->positions, (size_t)rows * 8);
    take(&at, a->seqs, (size_t)rows * 4);
    take(&at, a->want, (size_t)rows);
    take(&at, a->sampling, (size_t)wanted * sizeof *a->sampling);
    take(&at, a->draw_pos, (size_t)wanted * 8);
    long counted = 0;
    for (long i = 0; i < rows; i++) counted += a->want[i] != 0;
    if (counted != wanted)
        return muse_fail(e, "a round record wants %lld rows but marks %ld", (long long)wanted,
                         counted);
    for (int64_t t = 0; t < tables; t++) {
        int32_t seq;
        take(&at, &seq, 4);
        if (seq < 0 || seq >= o->max_seqs)
            return muse_fail(e, "a round record names KV slot %d, outside 0 .. %d", seq,
                             o->max_seqs - 1);
        int32_t *table = muse_kv_table(&be->kv, seq);
        take(&at, table, (size_t)bps * 4);
        for (int64_t b = 0; b < bps; b++)
            if (table[b] < -1 || table[b] >= be->kv.n_blocks)
                return muse_fail(e,
                                 "a round record gives slot %d block %d, outside the pool's "
                                 "0 .. %d",
                                 seq, table[b], be->kv.n_blocks - 1);
    }
    *r = (muse_round){.rows = (long)rows,
                      .tokens = a->tokens,
                      .positions = a->positions,
                      .seqs = a->seqs,
                      .want_logits = (flags & HAS_WANT) ? a->want : NULL,
                      .sampling = (flags & HAS_SAMPLING) ? a->sampling : NULL,
                      .draw_pos = (flags & HAS_DRAW_POS) ? a->draw_pos : NULL,
                      .return_logits = (flags & RETURN_LOGITS) != 0};
    return 0;
}

static int replay_snapshot(const uint8_t *buf, size_t len, muse_backend *be, muse_err *e)
{
    int32_t save, seq, slot;
    int64_t end_pos;
    if (len != 24) return muse_fail(e, "a snapshot record of %zu bytes, not 24", len);
    memcpy(&save, buf + 4, 4);
    memcpy(&seq, buf + 8, 4);
    memcpy(&slot, buf + 12, 4);
    memcpy(&end_pos, buf + 16, 8);
    if (seq < 0 || seq >= be->opts.max_seqs || slot < 0 || slot >= be->opts.snapshot_slots ||
        end_pos < 0 || end_pos > be->opts.context)
        return muse_fail(e,
                         "a snapshot record names slot %d, seq %d, end %lld: outside the "
                         "backend's sizes",
                         slot, seq, (long long)end_pos);
    (save ? be->ops->snapshot_save : be->ops->snapshot_load)(be, seq, end_pos, slot);
    return 0;
}

int muse_tp_follow(muse_comm *c, muse_forward *f, muse_err *e)
{
    muse_backend *be = muse_forward_backend(f);
    long R = be->opts.max_rows;
    size_t cap = round_bytes(R, R, R, be->kv.blocks_per_seq);
    uint8_t *buf = MUSE_MALLOC(cap);
    round_arrays a = {MUSE_MALLOC((size_t)R * 4), MUSE_MALLOC((size_t)R * 4),
                      MUSE_MALLOC((size_t)R * 8), MUSE_MALLOC((size_t)R * 8),
                      MUSE_MALLOC((size_t)R),     MUSE_MALLOC((size_t)R * sizeof(muse_sampling))};
    int rc = -1;
    for (;;) {
        size_t len = 0;
        int32_t kind = 0;
        if (muse_comm_broadcast(c, buf, &len, cap, -1)) { /* between rounds: no deadline */
            muse_comm_error(c, e);
            break;
        }
        if (len >= 4) memcpy(&kind, buf, 4);
        if (kind == REC_STOP) {
            rc = 0;
            break;
        }
        if (kind == REC_SNAPSHOT) {
            if (replay_snapshot(buf, len, be, e)) break;
            continue;
        }
        if (kind != REC_ROUND) {
            muse_fail(e, "rank 0 sent a record of no known kind (%d)", kind);
            break;
        }
        muse_round r;
        muse_round_out out;
        if (decode_round(buf, len, be, &a, &r, e) || muse_forward_run(f, &r, &out, e)) break;
    }
    free(buf);
    free(a.tokens);
    free(a.seqs);
    free(a.positions);
    free(a.draw_pos);
    free(a.want);
    free(a.sampling);
    return rc;
}
