/* The constrained chat turn's frame: headers as literal grammars over the recipients, free
 * reasoning that can only end its message, recipients' bodies through their grammars. */
#include "grammar/frame.h"

#include <cjson/cJSON.h>

#include "base/muse_common.h"

#define HDR_MAX 256 /* header bytes kept: " to=" or "assistant to=" and a recipient name */

typedef enum { F_HEAD, F_SELF, F_START, F_BODY, F_DONE } phase;

struct muse_gframe {
    muse_gframe_ids ids;
    const muse_gvocab *v;
    muse_gframe_rcpt *r;
    size_t n;
    muse_grammar *head[2]; /* [0] the turn's first header (self or a recipient), [1] after */
    const char *prefix[2];
    int which;       /* the header being written */
    muse_gstate *gs; /* the header's or the body's automaton */
    int rcpt;        /* the body's recipient */
    phase ph;
    int64_t self_left; /* reasoning tokens left */
    char hdr[HDR_MAX];
    size_t hdr_len;
};

static void set_bit(const muse_gframe *f, uint8_t *mask, int32_t t)
{
    if (t >= 0 && (size_t)t < muse_gvocab_size(f->v)) mask[t >> 3] |= (uint8_t)(1u << (t & 7));
}

static void set_ends(const muse_gframe *f, uint8_t *mask)
{
    for (size_t i = 0; i < f->ids.nends; i++) set_bit(f, mask, f->ids.ends[i]);
}

/* An end id may be a text token (a config's eos id can be a byte): cleared where it would end
 * the turn before its time. */
static void clear_ends(const muse_gframe *f, uint8_t *mask)
{
    for (size_t i = 0; i < f->ids.nends; i++) {
        int32_t t = f->ids.ends[i];
        if (t >= 0 && (size_t)t < muse_gvocab_size(f->v))
            mask[t >> 3] &= (uint8_t) ~(1u << (t & 7));
    }
}

/* The literal grammar of a header: prefix + each name (and prefix + "self" when self). */
static muse_grammar *header(const muse_gvocab *v, const char *prefix, const muse_gframe_rcpt *r,
                            size_t n, bool self, muse_gerr *err)
{
    cJSON *list = cJSON_CreateArray();
    char buf[HDR_MAX];
    for (size_t i = 0; i <= n; i++) {
        if (i == n && !self) break;
        snprintf(buf, sizeof buf, "%s%s", prefix, i == n ? "self" : r[i].name);
        cJSON_AddItemToArray(list, cJSON_CreateString(buf));
    }
    char *text = cJSON_PrintUnformatted(list);
    cJSON_Delete(list);
    muse_grammar *g = NULL;
    if (!text || muse_grammar_get(MUSE_GRAMMAR_LITERALS, text, strlen(text), v, &g, err)) g = NULL;
    free(text);
    return g;
}

int muse_gframe_new(const muse_gframe_ids *ids, const muse_gvocab *v, const muse_gframe_rcpt *r,
                    size_t n, muse_gframe **out, muse_gerr *err)
{
    memset(err, 0, sizeof *err);
    *out = NULL;
    if (n == 0) {
        snprintf(err->keyword, sizeof err->keyword, "recipients");
        snprintf(err->path, sizeof err->path, "/");
        snprintf(err->msg, sizeof err->msg, "a frame needs at least one recipient");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(r[i].name);
        bool ok = len > 0 && len < 128 && strcmp(r[i].name, "self") != 0;
        for (size_t k = 0; ok && k < len; k++) {
            char ch = r[i].name[k]; /* the reply parser's recipient characters */
            ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '-' || ch == '.' || ch == ':';
        }
        if (!ok) {
            snprintf(err->keyword, sizeof err->keyword, "name");
            snprintf(err->path, sizeof err->path, "/");
            snprintf(err->msg, sizeof err->msg,
                     "a recipient's name must be 1-127 of letters, digits, _ - . : (not self)");
            return -1;
        }
    }
    muse_gframe *f = MUSE_CALLOC(1, sizeof *f);
    f->ids = *ids;
    if (f->ids.nends > MUSE_GFRAME_MAX_ENDS) f->ids.nends = MUSE_GFRAME_MAX_ENDS;
    f->v = v;
    f->n = n;
    f->r = MUSE_CALLOC(n ? n : 1, sizeof *f->r);
    if (n) memcpy(f->r, r, n * sizeof *r);
    f->prefix[0] = " to=";
    f->prefix[1] = "assistant to=";
    f->head[0] = header(v, f->prefix[0], r, n, true, err);
    f->head[1] = header(v, f->prefix[1], r, n, false, err);
    if (!f->head[0] || !f->head[1]) {
        muse_gframe_free(f);
        return -1;
    }
    f->gs = muse_gstate_new(f->head[0]);
    f->ph = F_HEAD;
    f->self_left = ids->reasoning_max;
    *out = f;
    return 0;
}

void muse_gframe_free(muse_gframe *f)
{
    if (!f) return;
    muse_gstate_free(f->gs);
    muse_grammar_put(f->head[0]);
    muse_grammar_put(f->head[1]);
    free(f->r);
    free(f);
}

bool muse_gframe_ready(const muse_gframe *f)
{
    if (!muse_grammar_ready(f->head[0]) || !muse_grammar_ready(f->head[1])) return false;
    for (size_t i = 0; i < f->n; i++)
        if (!muse_grammar_ready(f->r[i].body)) return false;
    return true;
}

void muse_gframe_mask(muse_gframe *f, uint8_t *mask)
{
    size_t nb = (muse_gvocab_size(f->v) + 7) / 8;
    switch (f->ph) {
    case F_HEAD:
        muse_gstate_mask(f->gs, mask);
        if (muse_gstate_done(f->gs)) set_bit(f, mask, f->ids.message);
        break;
    case F_SELF: /* reasoning is free text; it ends its message, never the turn */
        if (f->self_left > 0)
            memcpy(mask, muse_gvocab_text_mask(f->v), nb);
        else
            memset(mask, 0, nb); /* its budget spent: the answer's room is kept */
        set_bit(f, mask, f->ids.eom);
        break;
    case F_START:
        memset(mask, 0, nb);
        set_bit(f, mask, f->ids.start);
        break;
    case F_BODY:
        if (f->gs) {
            muse_gstate_mask(f->gs, mask);
        } else {
            memcpy(mask, muse_gvocab_text_mask(f->v), nb);
            set_bit(f, mask, f->ids.eom);
        }
        break;
    case F_DONE:
        memset(mask, 0, nb);
        break;
    }
    if (f->ph != F_BODY || (f->gs && !muse_gstate_done(f->gs))) clear_ends(f, mask);
    if (f->ph == F_DONE || (f->ph == F_BODY && (!f->gs || muse_gstate_done(f->gs))))
        set_ends(f, mask);
}

static void begin_head(muse_gframe *f, int which)
{
    muse_gstate_free(f->gs);
    f->gs = muse_gstate_new(f->head[which]);
    f->which = which;
    f->hdr_len = 0;
    f->ph = F_HEAD;
}

/* <|message|>: the header's recipient picks the body. */
static void header_done(muse_gframe *f)
{
    size_t pl = strlen(f->prefix[f->which]);
    const char *name = f->hdr + pl;
    size_t len = f->hdr_len > pl ? f->hdr_len - pl : 0;
    muse_gstate_free(f->gs);
    f->gs = NULL;
    f->ph = F_DONE;
    if (len == 4 && memcmp(name, "self", 4) == 0 && f->which == 0) {
        f->ph = F_SELF;
        return;
    }
    for (size_t i = 0; i < f->n; i++) {
        if (strlen(f->r[i].name) != len || memcmp(f->r[i].name, name, len) != 0) continue;
        f->rcpt = (int)i;
        f->ph = F_BODY;
        if (f->r[i].body) f->gs = muse_gstate_new(f->r[i].body);
        return;
    }
}

static bool is_end(const muse_gframe *f, int32_t tok)
{
    for (size_t i = 0; i < f->ids.nends; i++)
        if (f->ids.ends[i] == tok) return true;
    return false;
}

void muse_gframe_push(muse_gframe *f, int32_t tok)
{
    size_t n = 0;
    const uint8_t *b = muse_gvocab_token(f->v, tok, &n);
    if (is_end(f, tok)) {
        f->ph = F_DONE;
        return;
    }
    switch (f->ph) {
    case F_HEAD:
        if (tok == f->ids.message && muse_gstate_done(f->gs)) {
            header_done(f);
        } else if (!b || f->hdr_len + n > sizeof f->hdr || muse_gstate_advance_bytes(f->gs, b, n)) {
            f->ph = F_DONE;
        } else {
            memcpy(f->hdr + f->hdr_len, b, n);
            f->hdr_len += n;
        }
        break;
    case F_SELF:
        f->self_left--;
        if (tok == f->ids.eom) f->ph = F_START;
        break;
    case F_START:
        if (tok == f->ids.start && f->head[1])
            begin_head(f, 1);
        else
            f->ph = F_DONE;
        break;
    case F_BODY:
        if (!f->gs && tok == f->ids.eom && f->head[1]) {
            f->ph = F_START;
        } else if (f->gs && (!b || muse_gstate_advance_bytes(f->gs, b, n))) {
            f->ph = F_DONE;
        }
        break;
    case F_DONE:
        break;
    }
}

int muse_gframe_where(const muse_gframe *f)
{
    return f->ph == F_BODY ? f->rcpt : f->ph == F_SELF ? -1 : -2;
}
