/* Streaming reply parser: a state machine over generated ids. Control tokens count only as ids;
 * headers are checked byte by byte as they arrive; text is emitted as soon as it can no longer
 * become a stop string or complete a UTF-8 character. Work per token is O(token bytes + stop
 * string length): nothing rescans the reply. */
#include "text/reply.h"

#include <stdlib.h>
#include <string.h>

#define RECIPIENT_MAX 128

static void buf_drop_front(muse_buf *b, size_t n)
{
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = '\0';
}

typedef enum { ST_HEADER_START, ST_HEADER_TEXT, ST_BODY, ST_DONE } state;
typedef enum { TO_SELF, TO_USER, TO_TOOL } recipient;

struct muse_reply {
    muse_reply_config c;
    int32_t *stop_ids;
    char **fn_names;
    char *stops[MUSE_REPLY_MAX_STOPS];
    size_t stop_len[MUSE_REPLY_MAX_STOPS];
    size_t max_stop_len;

    state st;
    const char *hdr_prefix; /* literal text before the recipient */
    size_t hdr_prefix_len;
    recipient to;
    int visible;   /* a content delta or a tool call was emitted */
    size_t ncalls; /* tool calls emitted */
    size_t reasoning_tokens;
    muse_buf hdr;      /* header text so far */
    muse_buf pending;  /* body text not yet emitted (self / user) */
    muse_buf tool;     /* tool-call body, parsed at its end */
    muse_buf fallback; /* the turn's text while nothing visible was emitted */
    muse_buf scratch;  /* sanitized output */
};

/* ---- UTF-8 ---- */

static void put_replacement(muse_buf *out)
{
    muse_buf_add(out, "\xEF\xBF\xBD", 3);
}

/* Copies in[0..n) to out as valid UTF-8, each invalid maximal subpart becoming U+FFFD. An
 * incomplete character at the end is held back (not consumed) unless final. Returns consumed. */
static size_t utf8_sanitize(const uint8_t *in, size_t n, int final, muse_buf *out)
{
    size_t i = 0;
    while (i < n) {
        uint8_t b = in[i];
        if (b < 0x80) {
            muse_buf_add(out, &in[i++], 1);
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF)
            need = 1;
        else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else {
            put_replacement(out);
            i++;
            continue;
        }
        size_t j = 1;
        for (; j <= need && i + j < n; j++) {
            uint8_t c = in[i + j];
            if (c < (j == 1 ? lo : 0x80) || c > (j == 1 ? hi : 0xBF)) break;
        }
        if (j > need) {
            muse_buf_add(out, &in[i], need + 1);
            i += need + 1;
        } else if (i + j == n && !final) {
            return i; /* may still complete */
        } else {
            put_replacement(out);
            i += j;
        }
    }
    return n;
}

/* ---- events ---- */

static void emit(muse_reply *r, const muse_reply_ev *ev)
{
    r->c.emit(r->c.emit_ctx, ev);
}

/* Emits in[0..n) as a text delta of kind; returns the bytes consumed (see utf8_sanitize). */
static size_t emit_text(muse_reply *r, muse_reply_ev_kind kind, const char *in, size_t n, int final)
{
    r->scratch.len = 0;
    size_t used = utf8_sanitize((const uint8_t *)in, n, final, &r->scratch);
    if (r->scratch.len == 0) return used;
    if (kind == MUSE_EV_REASONING && !r->visible)
        muse_buf_add(&r->fallback, r->scratch.p, r->scratch.len);
    if (kind == MUSE_EV_CONTENT) r->visible = 1;
    muse_reply_ev ev = {.kind = kind, .text = r->scratch.p, .len = r->scratch.len};
    emit(r, &ev);
    return used;
}

static muse_reply_ev_kind body_kind(const muse_reply *r)
{
    return r->to == TO_SELF ? MUSE_EV_REASONING : MUSE_EV_CONTENT;
}

/* ---- stop strings ---- */

/* Earliest start of a stop string in s[0..n), or -1. */
static long find_stop(const muse_reply *r, const char *s, size_t n)
{
    long best = -1;
    for (size_t k = 0; k < r->c.nstop_strings; k++) {
        const char *hit = memmem(s, n, r->stops[k], r->stop_len[k]);
        if (hit && (best < 0 || hit - s < best)) best = hit - s;
    }
    return best;
}

/* Length of the longest tail of s[0..n) that is a proper prefix of a stop string. */
static size_t stop_prefix_tail(const muse_reply *r, const char *s, size_t n)
{
    size_t k = r->max_stop_len ? r->max_stop_len - 1 : 0;
    if (k > n) k = n;
    for (; k > 0; k--)
        for (size_t j = 0; j < r->c.nstop_strings; j++)
            if (r->stop_len[j] > k && memcmp(s + n - k, r->stops[j], k) == 0) return k;
    return 0;
}

/* ---- tool calls ---- */

static void call_id(uint64_t seed, size_t index, char out[30])
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(index + 1));
    memcpy(out, "call_", 5);
    for (int i = 0; i < 24; i++) {
        x += 0x9E3779B97F4A7C15ull; /* splitmix64 */
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        out[5 + i] = alphabet[z % 62];
    }
    out[29] = '\0';
}

typedef struct {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        c->p++;
}

static int eat(cursor *c, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* Reads up to (not including) lit; moves past lit. */
static int until(cursor *c, const char *lit, const char **s, size_t *n)
{
    const char *hit = memmem(c->p, (size_t)(c->end - c->p), lit, strlen(lit));
    if (!hit) return 0;
    *s = c->p;
    *n = (size_t)(hit - c->p);
    c->p = hit + strlen(lit);
    return 1;
}

/* A value that parses as JSON is JSON, otherwise the string itself. */
static cJSON *atem_value(muse_reply *r, const char *s, size_t n)
{
    r->scratch.len = 0;
    utf8_sanitize((const uint8_t *)s, n, 1, &r->scratch);
    muse_buf_add(&r->scratch, "", 0);
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithOpts(r->scratch.p, &end, 1);
    if (!v) v = cJSON_CreateString(r->scratch.p);
    MUSE_CHECK(v != NULL);
    return v;
}

static int known_function(const muse_reply *r, const char *s, size_t n)
{
    for (size_t k = 0; k < r->c.nfunction_names; k++)
        if (strlen(r->fn_names[k]) == n && memcmp(r->fn_names[k], s, n) == 0) return 1;
    return 0;
}

/* <atem:parameter name="K">V</atem:parameter> ... </atem:invoke>, into args. */
static int parse_parameters(muse_reply *r, cursor *c, cJSON *args)
{
    for (;;) {
        skip_ws(c);
        if (eat(c, "</atem:invoke>")) return 0;
        const char *name, *value;
        size_t nlen, vlen;
        if (!eat(c, "<atem:parameter name=\"") || !until(c, "\">", &name, &nlen) ||
            !until(c, "</atem:parameter>", &value, &vlen) || nlen == 0 || memchr(name, '"', nlen) ||
            memchr(name, '\0', nlen))
            return -1;
        char *key = strndup(name, nlen);
        MUSE_CHECK(key != NULL);
        cJSON *v = atem_value(r, value, vlen);
        if (cJSON_GetObjectItemCaseSensitive(args, key))
            cJSON_ReplaceItemInObjectCaseSensitive(args, key, v);
        else
            cJSON_AddItemToObject(args, key, v);
        free(key);
    }
}

typedef struct {
    char *name, *arguments;
} parsed_call;

static void free_calls(parsed_call *calls, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        free(calls[k].name);
        free(calls[k].arguments);
    }
    free(calls);
}

/* Parses an ATEM block into calls; -1 when malformed or naming an unknown function. */
static int parse_atem(muse_reply *r, const char *s, size_t n, parsed_call **out, size_t *nout)
{
    cursor c = {s, s + n};
    parsed_call *calls = NULL;
    size_t ncalls = 0;
    skip_ws(&c);
    int wrapped = eat(&c, "<atem:function_calls>");
    for (;;) {
        skip_ws(&c);
        const char *name;
        size_t nlen;
        if (!eat(&c, "<atem:invoke name=\"")) break;
        if (!until(&c, "\">", &name, &nlen) || !known_function(r, name, nlen)) goto bad;
        cJSON *args = cJSON_CreateObject();
        MUSE_CHECK(args != NULL);
        if (parse_parameters(r, &c, args) != 0) {
            cJSON_Delete(args);
            goto bad;
        }
        parsed_call *nc = realloc(calls, (ncalls + 1) * sizeof *nc);
        MUSE_CHECK(nc != NULL);
        calls = nc;
        calls[ncalls].name = strndup(name, nlen);
        calls[ncalls].arguments = cJSON_PrintUnformatted(args);
        MUSE_CHECK(calls[ncalls].name && calls[ncalls].arguments);
        ncalls++;
        cJSON_Delete(args);
    }
    if (ncalls == 0) goto bad;
    skip_ws(&c);
    if (wrapped && !eat(&c, "</atem:function_calls>")) goto bad;
    skip_ws(&c);
    if (c.p != c.end) goto bad;
    *out = calls;
    *nout = ncalls;
    return 0;
bad:
    free_calls(calls, ncalls);
    return -1;
}

/* A finished tool-recipient message: its calls, or (malformed) its text as content. */
static void end_tool_message(muse_reply *r)
{
    parsed_call *calls;
    size_t n;
    if (parse_atem(r, r->tool.p ? r->tool.p : "", r->tool.len, &calls, &n) != 0) {
        emit_text(r, MUSE_EV_CONTENT, r->tool.p, r->tool.len, 1);
        r->tool.len = 0;
        return;
    }
    for (size_t k = 0; k < n; k++) {
        char id[30];
        call_id(r->c.call_id_seed, r->ncalls, id);
        muse_reply_ev ev = {.kind = MUSE_EV_TOOL_CALL,
                            .call_id = id,
                            .name = calls[k].name,
                            .arguments = calls[k].arguments,
                            .call_index = (int)r->ncalls};
        emit(r, &ev);
        r->ncalls++;
    }
    r->visible = 1;
    free_calls(calls, n);
    r->tool.len = 0;
}

/* ---- turn structure ---- */

/* Emits what a self / user message still holds back. */
static void flush_pending(muse_reply *r)
{
    emit_text(r, body_kind(r), r->pending.p, r->pending.len, 1);
    r->pending.len = 0;
}

static void end_turn(muse_reply *r, const char *reason)
{
    if (r->st == ST_DONE) return;
    if (r->st == ST_BODY && r->to == TO_TOOL)
        emit_text(r, MUSE_EV_CONTENT, r->tool.p, r->tool.len, 1); /* cut off: not a call */
    else if (r->st == ST_BODY)
        flush_pending(r);
    else if (r->st == ST_HEADER_TEXT && !r->visible && r->fallback.len == 0)
        muse_buf_add(&r->fallback, r->hdr.p, r->hdr.len); /* a broken header is all there is */
    r->tool.len = r->pending.len = r->hdr.len = 0;
    if (!r->visible && r->fallback.len > 0) {
        r->scratch.len = 0;
        utf8_sanitize((const uint8_t *)r->fallback.p, r->fallback.len, 1, &r->scratch);
        muse_reply_ev ev = {
            .kind = MUSE_EV_CONTENT, .text = r->scratch.p, .len = r->scratch.len, .unsplit = 1};
        r->visible = 1;
        emit(r, &ev);
    }
    muse_reply_ev fin = {.kind = MUSE_EV_FINISH,
                         .finish_reason = r->ncalls ? "tool_calls" : reason};
    r->st = ST_DONE;
    emit(r, &fin);
}

/* End of a message by <|eom|> (or an unannounced <|start|>): the turn goes on unless the calls
 * are complete. */
static void end_message(muse_reply *r)
{
    if (r->to == TO_TOOL) {
        size_t before = r->ncalls;
        end_tool_message(r);
        if (r->ncalls > before && !r->c.parallel_tool_calls) {
            end_turn(r, "tool_calls");
            return;
        }
    } else {
        flush_pending(r);
    }
    r->st = ST_HEADER_START;
}

static int recipient_char(uint8_t ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-' || ch == '.' || ch == ':';
}

static void begin_header(muse_reply *r, const char *prefix)
{
    r->st = ST_HEADER_TEXT;
    r->hdr_prefix = prefix;
    r->hdr_prefix_len = strlen(prefix);
    r->hdr.len = 0;
}

/* Header text: the literal prefix, then recipient characters; anything else ends the turn. */
static void header_text(muse_reply *r, const uint8_t *s, size_t n)
{
    size_t from = r->hdr.len;
    muse_buf_add(&r->hdr, s, n);
    for (size_t i = from; i < r->hdr.len; i++) {
        uint8_t ch = (uint8_t)r->hdr.p[i];
        int fits = i < r->hdr_prefix_len
                       ? ch == (uint8_t)r->hdr_prefix[i]
                       : recipient_char(ch) && i < r->hdr_prefix_len + RECIPIENT_MAX;
        if (!fits) {
            end_turn(r, "stop");
            return;
        }
    }
}

/* <|message|> closes the header: pick the body kind from the recipient. */
static void header_done(muse_reply *r)
{
    size_t rlen = r->hdr.len > r->hdr_prefix_len ? r->hdr.len - r->hdr_prefix_len : 0;
    const char *rcpt = r->hdr.p + r->hdr_prefix_len;
    if (rlen == 0) {
        end_turn(r, "stop");
        return;
    }
    if (rlen == 4 && memcmp(rcpt, "self", 4) == 0)
        r->to = TO_SELF;
    else if (rlen == 4 && memcmp(rcpt, "user", 4) == 0)
        r->to = TO_USER;
    else
        r->to = TO_TOOL;
    if (r->ncalls > 0 && r->to != TO_TOOL) { /* after calls only more calls may follow */
        end_turn(r, "tool_calls");
        return;
    }
    r->hdr.len = 0;
    r->st = ST_BODY;
}

/* Self / user text: emit all that can no longer turn into a stop string; stop at one. */
static void body_text(muse_reply *r, const uint8_t *s, size_t n)
{
    muse_buf_add(&r->pending, s, n);
    long at = find_stop(r, r->pending.p, r->pending.len);
    if (at >= 0) {
        emit_text(r, body_kind(r), r->pending.p, (size_t)at, 1);
        r->pending.len = 0;
        end_turn(r, "stop");
        return;
    }
    size_t hold = stop_prefix_tail(r, r->pending.p, r->pending.len);
    /* A held stop prefix starts a character, so a cut character before it is invalid. */
    size_t used = emit_text(r, body_kind(r), r->pending.p, r->pending.len - hold, hold > 0);
    buf_drop_front(&r->pending, used);
}

static int is_end_of_turn(const muse_reply *r, int32_t id)
{
    if (id == r->c.ids.eot || id == r->c.ids.end_of_text) return 1;
    for (size_t k = 0; k < r->c.nstop_ids; k++)
        if (r->stop_ids[k] == id) return 1;
    return 0;
}

static int is_control(const muse_reply *r, int32_t id)
{
    const muse_chat_ids *c = &r->c.ids;
    return id == c->begin_of_text || id == c->eom || id == c->start || id == c->message ||
           is_end_of_turn(r, id);
}

static void control_token(muse_reply *r, int32_t id)
{
    const muse_chat_ids *c = &r->c.ids;
    if (is_end_of_turn(r, id)) {
        if (r->st == ST_BODY && r->to == TO_TOOL) end_tool_message(r);
        end_turn(r, "stop");
    } else if (r->st == ST_HEADER_START && id == c->start) {
        begin_header(r, "assistant to=");
    } else if (r->st == ST_HEADER_TEXT && id == c->message) {
        header_done(r);
    } else if (r->st == ST_BODY && (id == c->eom || id == c->start)) {
        end_message(r);
        if (id == c->start && r->st == ST_HEADER_START) begin_header(r, "assistant to=");
    } else {
        end_turn(r, "stop"); /* a control token out of place: the structure is broken */
    }
}

static void text_token(muse_reply *r, const uint8_t *s, size_t n)
{
    if (n == 0) return;
    if (r->st == ST_HEADER_TEXT) {
        header_text(r, s, n);
    } else if (r->st == ST_HEADER_START) {
        if (!r->visible && r->fallback.len == 0) muse_buf_add(&r->fallback, s, n);
        end_turn(r, "stop");
    } else if (r->to == TO_TOOL) {
        muse_buf_add(&r->tool, s, n);
    } else {
        body_text(r, s, n);
    }
}

int muse_reply_push(muse_reply *r, int32_t id)
{
    if (r->st == ST_DONE) return 1;
    if (r->st == ST_BODY && r->to == TO_SELF) r->reasoning_tokens++;
    if (is_control(r, id)) {
        control_token(r, id);
    } else {
        size_t n = 0;
        const uint8_t *s = r->c.token_bytes(r->c.token_ctx, id, &n);
        text_token(r, s, s ? n : 0);
    }
    return r->st == ST_DONE;
}

void muse_reply_finish(muse_reply *r, const char *reason_hint)
{
    end_turn(r, reason_hint ? reason_hint : "length");
}

int muse_reply_done(const muse_reply *r)
{
    return r->st == ST_DONE;
}

size_t muse_reply_reasoning_tokens(const muse_reply *r)
{
    return r->reasoning_tokens;
}

/* ---- lifetime ---- */

static int valid_utf8(const char *s, size_t n)
{
    muse_buf tmp = {0};
    size_t used = utf8_sanitize((const uint8_t *)s, n, 0, &tmp);
    int ok = used == n && tmp.len == n;
    free(tmp.p);
    return ok;
}

int muse_reply_create(const muse_reply_config *c, muse_reply **out, muse_err *e)
{
    *out = NULL;
    MUSE_CHECK(c->token_bytes && c->emit);
    if (c->nstop_strings > MUSE_REPLY_MAX_STOPS)
        return muse_fail(e, "stop has %zu strings: give at most %d", c->nstop_strings,
                         MUSE_REPLY_MAX_STOPS);
    for (size_t k = 0; k < c->nstop_strings; k++) {
        size_t n = strlen(c->stop_strings[k]);
        if (n == 0 || n > MUSE_REPLY_STOP_MAX || !valid_utf8(c->stop_strings[k], n))
            return muse_fail(e, "stop[%zu] must be 1-%d bytes of UTF-8 text", k,
                             MUSE_REPLY_STOP_MAX);
    }
    muse_reply *r = MUSE_CALLOC(1, sizeof *r);
    r->c = *c;
    r->stop_ids = MUSE_CALLOC(c->nstop_ids ? c->nstop_ids : 1, sizeof *r->stop_ids);
    if (c->nstop_ids) memcpy(r->stop_ids, c->stop_ids, c->nstop_ids * sizeof *r->stop_ids);
    r->fn_names = MUSE_CALLOC(c->nfunction_names ? c->nfunction_names : 1, sizeof *r->fn_names);
    for (size_t k = 0; k < c->nfunction_names; k++) {
        r->fn_names[k] = strdup(c->function_names[k]);
        MUSE_CHECK(r->fn_names[k] != NULL);
    }
    for (size_t k = 0; k < c->nstop_strings; k++) {
        r->stops[k] = strdup(c->stop_strings[k]);
        MUSE_CHECK(r->stops[k] != NULL);
        r->stop_len[k] = strlen(r->stops[k]);
        if (r->stop_len[k] > r->max_stop_len) r->max_stop_len = r->stop_len[k];
    }
    r->c.stop_ids = NULL;
    r->c.function_names = NULL;
    r->c.stop_strings = NULL;
    muse_reply_reset(r, c->call_id_seed);
    *out = r;
    return 0;
}

void muse_reply_reset(muse_reply *r, uint64_t call_id_seed)
{
    r->c.call_id_seed = call_id_seed;
    r->visible = 0;
    r->ncalls = 0;
    r->reasoning_tokens = 0;
    r->pending.len = r->tool.len = r->fallback.len = r->hdr.len = 0;
    begin_header(r, " to=");
}

void muse_reply_destroy(muse_reply *r)
{
    if (!r) return;
    free(r->stop_ids);
    for (size_t k = 0; k < r->c.nfunction_names; k++) free(r->fn_names[k]);
    free(r->fn_names);
    for (size_t k = 0; k < r->c.nstop_strings; k++) free(r->stops[k]);
    free(r->hdr.p);
    free(r->pending.p);
    free(r->tool.p);
    free(r->fallback.p);
    free(r->scratch.p);
    free(r);
}
