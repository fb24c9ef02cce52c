/* A lane's output: reply events and completion text become records (stop strings held back
 * until they can no longer match), records go into the slot's ring, and a response ends with
 * its finish chunk, usage and token_sha. */
#include "serve/sched_lane.h"

#include "serve/hist.h"

/* Queues a record (takes ownership of data). */
void muse_lane_push(lane *l, uint32_t type, int status, char *data)
{
    if (l->n_out == l->cap_out) {
        l->cap_out = l->cap_out ? 2 * l->cap_out : 8;
        l->out = realloc(l->out, l->cap_out * sizeof *l->out);
        MUSE_CHECK(l->out);
    }
    size_t len = data ? strlen(data) : 0;
    if (len > muse_server_max_payload(l->sched->srv)) { /* it could never enter the ring */
        muse_api_error err = {.status = 500, .type = "server_error", .code = "event_too_large"};
        snprintf(
            err.message, sizeof err.message,
            "an event of this reply is larger than the engine's output ring; raise the ring size");
        free(data);
        data = muse_oa_error(&err);
        type = MUSE_EV_ERROR;
        status = 500;
        len = strlen(data);
    }
    l->out[l->n_out++] = (record){type, status, data, len};
}

/* Moves queued records into the ring; 1 when everything went (else back-pressure). */
int muse_lane_flush(muse_sched *s, lane *l)
{
    size_t i = 0;
    for (; i < l->n_out; i++) {
        record *r = &l->out[i];
        int rc = muse_server_emit(s->srv, l->ref, r->type, r->status, r->data, r->len);
        if (rc == 1) break;
        free(r->data); /* sent, or the slot is gone: either way it is done */
        l->t_record = muse_now_ms();
    }
    memmove(l->out, l->out + i, (l->n_out - i) * sizeof *l->out);
    l->n_out -= i;
    return l->n_out == 0;
}

static void on_text(lane *l, const char *field, const char *p, size_t n)
{
    if (!n) return;
    if (l->req.stream)
        muse_lane_push(l, MUSE_EV_DATA, 0, muse_oa_delta_chunk(&l->oa, field, p, n));
    else
        muse_buf_add(strcmp(field, "content") == 0 ? &l->content : &l->reasoning, p, n);
}

void muse_lane_reply_event(void *ctx, const muse_reply_ev *ev)
{
    lane *l = ctx;
    switch (ev->kind) {
    case MUSE_EV_REASONING:
        on_text(l, "reasoning_content", ev->text, ev->len);
        break;
    case MUSE_EV_CONTENT:
        if (ev->unsplit && !l->req.stream) l->reasoning.len = 0; /* the whole turn is content */
        on_text(l, "content", ev->text, ev->len);
        break;
    case MUSE_EV_TOOL_CALL:
        if (l->req.stream) {
            muse_lane_push(
                l, MUSE_EV_DATA, 0,
                muse_oa_tool_chunk(&l->oa, ev->call_index, ev->call_id, ev->name, ev->arguments));
        } else {
            if (!l->tool_calls) l->tool_calls = cJSON_CreateArray();
            cJSON_AddItemToArray(l->tool_calls,
                                 muse_oa_tool_call(ev->call_id, ev->name, ev->arguments));
        }
        break;
    case MUSE_EV_FINISH:
        l->finish_reason = ev->finish_reason;
        break;
    }
}

static size_t utf8_boundary(const char *p, size_t n)
{
    while (n > 0 && ((unsigned char)p[n] & 0xC0) == 0x80) n--;
    return n;
}

/* Emits pending text that can no longer start a stop string; 1 when a stop string matched. */
static int completion_text(lane *l, const char *p, size_t n, bool final)
{
    muse_buf_add(&l->pending, p, n);
    size_t cut = l->pending.len, longest = 0;
    int stopped = 0;
    for (size_t i = 0; i < l->req.n_stops; i++) {
        size_t sl = strlen(l->req.stops[i]);
        if (sl > longest) longest = sl;
        const char *hit =
            l->pending.p ? memmem(l->pending.p, l->pending.len, l->req.stops[i], sl) : NULL;
        if (hit && (size_t)(hit - l->pending.p) < cut) {
            cut = (size_t)(hit - l->pending.p);
            stopped = 1;
        }
    }
    if (!stopped && !final && longest > 0)
        cut = l->pending.len > longest - 1
                  ? utf8_boundary(l->pending.p, l->pending.len - (longest - 1))
                  : 0;
    on_text(l, "content", l->pending.p, cut);
    if (stopped || final)
        l->pending.len = 0;
    else {
        memmove(l->pending.p, l->pending.p + cut, l->pending.len - cut);
        l->pending.len -= cut;
    }
    return stopped;
}

static bool is_stop_id(const muse_sched *s, int32_t id)
{
    if (id == s->ids.end_of_text || id == s->ids.eot) return true;
    for (int i = 0; s->cfg && i < s->cfg->n_eos; i++)
        if (s->cfg->eos_ids[i] == id) return true;
    return false;
}

void muse_lane_error(lane *l, int status, const muse_api_error *err)
{
    muse_lane_push(l, MUSE_EV_ERROR, status, muse_oa_error(err));
}

/* The end of a response: finish chunk + usage, or the whole body, then END. */
void muse_lane_finish(muse_sched *s, lane *l, const char *reason)
{
    if (l->req.kind == MUSE_KIND_CHAT)
        muse_reply_finish(l->reply, reason);
    else {
        char tail[16];
        long n = muse_detok_finish(&l->detok, tail, sizeof tail);
        completion_text(l, tail, n > 0 ? (size_t)n : 0, true);
    }
    const char *finish = l->finish_reason ? l->finish_reason : reason;
    muse_oa_usage u = {(int64_t)l->req.n_prompt, l->generated, l->cached,
                       l->reply ? (int64_t)muse_reply_reasoning_tokens(l->reply) : 0};
    muse_oa_muse m = {.seed = l->req.sampling.seed};
    uint8_t digest[32];
    muse_sha256_final(&l->sha, digest);
    muse_sha256_hex(digest, m.token_sha);
    m.ttft_ms = l->t_first > 0 ? l->t_first - l->t_admit : 0;
    m.decode_tokens_per_s = l->generated > 1 && l->t_last > l->t_first
                                ? (double)(l->generated - 1) * 1e3 / (l->t_last - l->t_first)
                                : 0;
    if (l->req.stream) {
        muse_lane_push(l, MUSE_EV_DATA, 0, muse_oa_finish_chunk(&l->oa, finish, &m));
        if (l->req.include_usage)
            muse_lane_push(l, MUSE_EV_DATA, 0, muse_oa_usage_chunk(&l->oa, &u));
    } else {
        char *body =
            muse_oa_response(&l->oa, l->content.p ? l->content.p : "", l->content.len,
                             l->reasoning.p, l->reasoning.len, l->tool_calls, finish, &u, &m);
        size_t max = muse_server_max_payload(s->srv), len = strlen(body);
        for (size_t at = 0; at < len; at += max) { /* a body larger than one record goes in parts */
            size_t n = len - at < max ? len - at : max;
            char *part = MUSE_MALLOC(n + 1);
            memcpy(part, body + at, n);
            part[n] = 0;
            muse_lane_push(l, MUSE_EV_BODY, 0, part);
        }
        free(body);
    }
    stat_add(s, &s->stats.tokens_out, (uint64_t)l->generated);
    pthread_mutex_lock(&s->stats_mu);
    if (l->t_first > 0) muse_hist_observe(&s->stats.ttft_seconds, m.ttft_ms / 1e3);
    if (m.decode_tokens_per_s > 0)
        muse_hist_observe(&s->stats.decode_tokens_per_second, m.decode_tokens_per_s);
    pthread_mutex_unlock(&s->stats_mu);
    l->state = LANE_FINISHING;
}

void muse_lane_token(muse_sched *s, lane *l, int32_t tok)
{
    double t = muse_now_ms();
    if (!l->generated) l->t_first = t;
    l->t_last = t;
    l->generated++;
    uint8_t le[4] = {(uint8_t)tok, (uint8_t)(tok >> 8), (uint8_t)(tok >> 16), (uint8_t)(tok >> 24)};
    muse_sha256_update(&l->sha, le, 4);
    int stop;
    if (l->gs && !is_stop_id(s, tok)) muse_gstate_advance(l->gs, tok); /* the mask allowed it */
    if (l->frame) muse_gframe_push(l->frame, tok);
    if (l->req.kind == MUSE_KIND_CHAT) {
        stop = muse_reply_push(l->reply, tok);
    } else if (is_stop_id(s, tok)) {
        stop = 1;
    } else if (muse_tokenizer_is_special(s->tok, tok)) {
        stop = 0; /* a control token stands for no text */
    } else {
        long n = muse_detok_push(s->tok, &l->detok, tok, s->detok_buf, s->detok_cap);
        stop = completion_text(l, s->detok_buf, n > 0 ? (size_t)n : 0, false);
        if (stop) l->detok.nheld = 0; /* nothing after a stop string, not even a held byte */
    }
    if (stop) {
        muse_lane_finish(s, l, "stop");
    } else if (l->generated >= l->req.max_tokens ||
               (int64_t)l->req.n_prompt + l->generated >= s->o.context) {
        muse_lane_finish(s, l, "length");
    } else if (s->o.fault_after_tokens > 0 && l->generated >= s->o.fault_after_tokens) {
        muse_api_error err = {.status = 500, .type = "server_error", .code = "engine_fault"};
        snprintf(err.message, sizeof err.message,
                 "the engine failed while generating (injected fault)");
        stat_add(s, &s->stats.errors, 1);
        muse_lane_error(l, 500, &err);
        l->state = LANE_FINISHING;
    } else {
        l->next = tok;
        l->state = LANE_DECODE;
    }
}

void muse_lane_mask(muse_sched *s, lane *l)
{
    if (l->frame) {
        muse_gframe_mask(l->frame, l->mask);
        return;
    }
    muse_gstate_mask(l->gs, l->mask);
    if (!muse_gstate_done(l->gs)) return;
    int64_t V = s->cfg ? s->cfg->vocab_size : 0;
    int32_t ends[2 + MUSE_MAX_EOS] = {s->ids.end_of_text, s->ids.eot};
    size_t n = 2;
    for (int i = 0; s->cfg && i < s->cfg->n_eos && n < sizeof ends / sizeof ends[0]; i++)
        ends[n++] = (int32_t)s->cfg->eos_ids[i];
    for (size_t i = 0; i < n; i++)
        if (ends[i] >= 0 && ends[i] < V) l->mask[ends[i] >> 3] |= (uint8_t)(1u << (ends[i] & 7));
}
