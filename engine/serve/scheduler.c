#include "serve/scheduler.h"

#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "serve/openai.h"
#include "serve/prompt_cache.h"
#include "text/reply.h"
#include "serve/request.h"
#include "base/sha256.h"
#include "base/threadpool.h"

typedef enum { LANE_FREE, LANE_PREFILL, LANE_DECODE, LANE_FINISHING } lane_state;

typedef struct {
    uint32_t type;
    int status;
    char *data;
    size_t len;
} record;

typedef struct muse_sched muse_sched;

typedef struct {
    muse_sched *sched;
    lane_state state;
    muse_slot_ref ref; /* the request's slot handle */
    muse_gen_request req;
    muse_oa_ctx oa;
    int64_t fed;       /* prompt tokens in the KV cache */
    int32_t next;      /* the token the next decode row feeds */
    int64_t generated; /* tokens sampled */
    uint64_t served;   /* round this lane last ran in (LRU order) */
    muse_sha256 sha;
    muse_reply *reply;           /* chat */
    muse_detok detok;            /* completions */
    muse_buf pending;            /* completions: text held back for stop strings */
    muse_buf content, reasoning; /* non-streaming */
    cJSON *tool_calls;           /* non-streaming */
    const char *finish_reason;
    record *out; /* records not yet in the ring */
    size_t n_out, cap_out;
    double t_admit, t_first, t_last;
    double t_record; /* when the last record went to the ring */
    bool kv_wait;    /* sat out the last round for want of KV blocks */
    /* prompt cache: block-chain keys of the prompt and the prefix points still to keep */
    int64_t cached;      /* prompt tokens taken from the cache */
    uint8_t (*keys)[32]; /* keys[i]: the prefix of i + 1 blocks */
    int64_t *cuts;       /* block-aligned prefix ends, ascending */
    int n_cuts, next_cut;
} lane;

struct muse_sched {
    muse_sched_opts o;
    muse_forward *fwd;
    const muse_config *cfg;
    const muse_tokenizer *tok;
    muse_server *srv;
    muse_chat_ids ids;
    muse_pool *sample_pool;  /* draws the lanes of a round in parallel (model backend only) */
    muse_sampler **samplers; /* one per pool thread: a sampler's scratch is its own */
    char *detok_buf;         /* the longest text one token can decode to */
    size_t detok_cap;
    muse_backend *be;   /* NULL for the script backend */
    muse_pcache *cache; /* NULL when off */
    lane *lanes;
    uint64_t round;
    uint64_t seed_counter;
    uint64_t admitted; /* requests taken into lanes (the OOM test hook counts them) */
    /* batch buffers, sized once */
    int32_t *b_tokens, *b_seqs;
    int64_t *b_pos;
    uint8_t *b_want;
    int *b_lane_of_logits; /* lane of each logits row */
    int32_t *b_drawn;      /* the token drawn from each logits row */
    const float *b_logits; /* this round's logits, for the sampling threads */
    pthread_mutex_t stats_mu;
    muse_sched_stats stats;
};

static uint64_t mix_seed(uint64_t a, uint64_t b)
{
    uint64_t x = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void hist_init(muse_hist *h, const double *le, int n)
{
    h->n = n;
    memcpy(h->le, le, (size_t)n * sizeof *le);
}

static void hist_observe(muse_hist *h, double v)
{
    for (int i = 0; i < h->n; i++)
        if (v <= h->le[i]) h->counts[i]++;
    h->count++;
    h->sum += v;
}

static void stat_add(muse_sched *s, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&s->stats_mu);
    *field += n;
    pthread_mutex_unlock(&s->stats_mu);
}

/* Queues a record (takes ownership of data). */
static void push_record(lane *l, uint32_t type, int status, char *data)
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
static int flush_lane(muse_sched *s, lane *l)
{
    size_t i = 0;
    for (; i < l->n_out; i++) {
        record *r = &l->out[i];
        int rc = muse_server_emit(s->srv, l->ref, r->type, r->status, r->data, r->len);
        if (rc == 1) break;
        free(r->data); /* sent, or the slot is gone: either way it is done */
        l->t_record = now_ms();
    }
    memmove(l->out, l->out + i, (l->n_out - i) * sizeof *l->out);
    l->n_out -= i;
    return l->n_out == 0;
}

/* ---- reply events -> records ---- */

static void on_text(lane *l, const char *field, const char *p, size_t n)
{
    if (!n) return;
    if (l->req.stream)
        push_record(l, MUSE_EV_DATA, 0, muse_oa_delta_chunk(&l->oa, field, p, n));
    else
        muse_buf_add(strcmp(field, "content") == 0 ? &l->content : &l->reasoning, p, n);
}

static void on_reply_event(void *ctx, const muse_reply_ev *ev)
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
            push_record(
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

/* ---- completions text: stop strings over the detokenized stream ---- */

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

/* ---- lane life ---- */

static void lane_release(muse_sched *s, lane *l)
{
    muse_server_finish(s->srv, l->ref);
    if (s->be) muse_kv_release(&s->be->kv, (int)(l - s->lanes));
    free(l->keys);
    free(l->cuts);
    for (size_t i = 0; i < l->n_out; i++) free(l->out[i].data);
    free(l->out);
    muse_request_free(&l->req);
    muse_reply_destroy(l->reply);
    free(l->pending.p);
    free(l->content.p);
    free(l->reasoning.p);
    cJSON_Delete(l->tool_calls);
    memset(l, 0, sizeof *l);
    l->sched = s;
    l->state = LANE_FREE;
}

static void error_record(lane *l, int status, const muse_api_error *err)
{
    push_record(l, MUSE_EV_ERROR, status, muse_oa_error(err));
}

/* The end of a response: finish chunk + usage, or the whole body, then END. */
static void lane_finish(muse_sched *s, lane *l, const char *reason)
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
        push_record(l, MUSE_EV_DATA, 0, muse_oa_finish_chunk(&l->oa, finish, &m));
        if (l->req.include_usage) push_record(l, MUSE_EV_DATA, 0, muse_oa_usage_chunk(&l->oa, &u));
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
            push_record(l, MUSE_EV_BODY, 0, part);
        }
        free(body);
    }
    stat_add(s, &s->stats.tokens_out, (uint64_t)l->generated);
    pthread_mutex_lock(&s->stats_mu);
    if (l->t_first > 0) hist_observe(&s->stats.ttft_seconds, m.ttft_ms / 1e3);
    if (m.decode_tokens_per_s > 0)
        hist_observe(&s->stats.decode_tokens_per_second, m.decode_tokens_per_s);
    pthread_mutex_unlock(&s->stats_mu);
    l->state = LANE_FINISHING;
}

/* Prefix points worth keeping: after each end of a message (system block, earlier turns),
 * the end of the prompt, and the last block that leaves a token to read (what the same prompt
 * sent again resumes from), each rounded down to a block. Ascending, no repeats. */
static void cache_plan(muse_sched *s, lane *l)
{
    int64_t n = (int64_t)l->req.n_prompt, last = -1;
    l->cuts = MUSE_MALLOC((size_t)(n / MUSE_KV_BLOCK + 2) * sizeof *l->cuts);
    for (int64_t i = 0; i <= n; i++) {
        bool end = i == n || l->req.prompt[i] == s->ids.eot || l->req.prompt[i] == s->ids.eom;
        if (!end) continue;
        int64_t cuts[2] = {(n - 1) / MUSE_KV_BLOCK * MUSE_KV_BLOCK,
                           n / MUSE_KV_BLOCK * MUSE_KV_BLOCK};
        if (i < n) cuts[0] = cuts[1] = (i + 1) / MUSE_KV_BLOCK * MUSE_KV_BLOCK;
        for (int k = 0; k < 2; k++)
            if (cuts[k] > l->cached && cuts[k] > last) l->cuts[l->n_cuts++] = last = cuts[k];
    }
}

/* Resumes a new lane from the longest cached prefix that leaves a token to read. */
static void cache_resume(muse_sched *s, lane *l, const char *scope, size_t scope_len)
{
    int64_t n_blocks = (int64_t)l->req.n_prompt / MUSE_KV_BLOCK;
    int seq = (int)(l - s->lanes);
    l->keys = MUSE_MALLOC((size_t)(n_blocks ? n_blocks : 1) * sizeof *l->keys);
    muse_pcache_keys(scope, scope_len, l->req.prompt, n_blocks, l->keys);
    const muse_pcache_entry *hit = NULL;
    for (int64_t b = ((int64_t)l->req.n_prompt - 1) / MUSE_KV_BLOCK; b > 0 && !hit; b--)
        hit = muse_pcache_find(s->cache, l->keys[b - 1]);
    if (((int64_t)l->req.n_prompt - 1) / MUSE_KV_BLOCK > 0)
        muse_pcache_count(s->cache, hit != NULL);
    if (hit) {
        muse_kv_share(&s->be->kv, seq, hit->blocks, hit->n_blocks);
        l->cached = l->fed = hit->n_blocks * MUSE_KV_BLOCK;
        s->be->ops->sliding_load(s->be, seq, l->cached, hit->sliding);
    }
    cache_plan(s, l);
}

/* After a forward: a lane whose prompt just reached a prefix point leaves it in the cache. */
static void cache_keep(muse_sched *s, lane *l)
{
    while (l->next_cut < l->n_cuts && l->cuts[l->next_cut] <= l->fed) {
        int64_t cut = l->cuts[l->next_cut++], n_blocks = cut / MUSE_KV_BLOCK;
        if (cut != l->fed || muse_pcache_find(s->cache, l->keys[n_blocks - 1])) continue;
        int seq = (int)(l - s->lanes);
        size_t bytes = s->be->ops->sliding_bytes(s->be, cut);
        void *snap = MUSE_MALLOC(bytes ? bytes : 1);
        s->be->ops->sliding_save(s->be, seq, cut, snap);
        muse_pcache_insert(s->cache, l->keys[n_blocks - 1], n_blocks,
                           muse_kv_table(&s->be->kv, seq), snap, bytes);
    }
}

static void lane_admit(muse_sched *s, lane *l, const muse_request *rq)
{
    /* a default seed below 2^53, so a JSON client can read it back exactly and reuse it */
    muse_request_env env = {s->cfg, s->tok, &s->ids, s->o.context,
                            mix_seed(++s->seed_counter, (uint64_t)time(NULL)) >> 11};
    muse_api_error err;
    l->ref = rq->ref;
    l->t_admit = now_ms();
    stat_add(s, &s->stats.requests, 1);
    if (muse_request_parse(&env, (int)rq->kind, rq->flags, rq->body, rq->body_len, &l->req, &err)) {
        stat_add(s, &s->stats.errors, 1);
        error_record(l, err.status, &err);
        l->state = LANE_FINISHING;
        return;
    }
    if (++s->admitted == (uint64_t)s->o.fault_oom_request) { /* test builds only */
        err = (muse_api_error){.status = 503, .type = "server_error", .code = "out_of_memory"};
        snprintf(err.message, sizeof err.message,
                 "the device ran out of memory for this request (injected fault); retry later");
        stat_add(s, &s->stats.errors, 1);
        error_record(l, 503, &err);
        l->state = LANE_FINISHING;
        return;
    }
    static const char hex[] = "0123456789abcdef";
    snprintf(l->oa.id, sizeof l->oa.id, "%s", rq->kind == MUSE_KIND_CHAT ? "chatcmpl-" : "cmpl-");
    size_t at = strlen(l->oa.id);
    uint64_t r = mix_seed(env.default_seed, rq->ref.index);
    for (int i = 0; i < 24; i++, r = mix_seed(r, (uint64_t)i)) l->oa.id[at++] = hex[r & 15];
    l->oa.id[at] = 0;
    l->oa.model = s->o.model_id;
    l->oa.created = (int64_t)time(NULL);
    l->oa.kind = (int)rq->kind;
    muse_sha256_init(&l->sha);
    stat_add(s, &s->stats.tokens_in, l->req.n_prompt);
    if (rq->kind == MUSE_KIND_CHAT) {
        muse_reply_config rc = {.ids = s->ids,
                                .stop_ids = NULL,
                                .function_names = (const char *const *)l->req.fn_names,
                                .nfunction_names = l->req.n_fn,
                                .stop_strings = (const char *const *)l->req.stops,
                                .nstop_strings = l->req.n_stops,
                                .parallel_tool_calls = l->req.parallel_tool_calls,
                                .call_id_seed = env.default_seed,
                                .token_bytes = muse_tokenizer_text_bytes,
                                .token_ctx = (void *)s->tok,
                                .emit = on_reply_event,
                                .emit_ctx = l};
        int32_t eos[MUSE_MAX_EOS];
        size_t neos = 0;
        for (int i = 0; s->cfg && i < s->cfg->n_eos; i++) eos[neos++] = (int32_t)s->cfg->eos_ids[i];
        rc.stop_ids = eos;
        rc.nstop_ids = neos;
        muse_err e = {{0}};
        if (muse_reply_create(&rc, &l->reply, &e)) {
            err = (muse_api_error){
                .status = 400, .type = "invalid_request_error", .code = "invalid_value"};
            snprintf(err.param, sizeof err.param, "stop");
            snprintf(err.message, sizeof err.message, "%.400s", e.msg);
            stat_add(s, &s->stats.errors, 1);
            error_record(l, 400, &err);
            l->state = LANE_FINISHING;
            return;
        }
    }
    if (s->cache) cache_resume(s, l, rq->scope, rq->scope_len);
    /* the first record tells the module the request is admitted (its queue timer stops) */
    if (l->req.stream)
        push_record(l, MUSE_EV_DATA, 0, muse_oa_role_chunk(&l->oa));
    else
        push_record(l, MUSE_EV_KEEPALIVE, 0, NULL);
    l->state = LANE_PREFILL;
    l->served = 0; /* new lanes go first */
}

/* A sticky device error (a CUDA context that can do nothing more): mark the segment FATAL and
 * exit at once; the doorbells close with the process, so every worker ends its streams. */
static void sticky_device_error(muse_sched *s)
{
    fprintf(stderr, "muse-engine serve: sticky device error (injected by "
                    "--fault-sticky-after-tokens); marking the segment FATAL and exiting\n");
    muse_server_set_state(s->srv, MUSE_ENGINE_FATAL);
    _exit(MUSE_EXIT_DEVICE_FATAL);
}

/* One sampled token: into the hash, the parser, the stop rules. */
static void lane_token(muse_sched *s, lane *l, int32_t tok)
{
    if (s->o.fault_sticky_after_tokens > 0 && l->generated >= s->o.fault_sticky_after_tokens)
        sticky_device_error(s);
    double t = now_ms();
    if (!l->generated) l->t_first = t;
    l->t_last = t;
    l->generated++;
    uint8_t le[4] = {(uint8_t)tok, (uint8_t)(tok >> 8), (uint8_t)(tok >> 16), (uint8_t)(tok >> 24)};
    muse_sha256_update(&l->sha, le, 4);
    int stop;
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
        lane_finish(s, l, "stop");
    } else if (l->generated >= l->req.max_tokens ||
               (int64_t)l->req.n_prompt + l->generated >= s->o.context) {
        lane_finish(s, l, "length");
    } else if (s->o.fault_after_tokens > 0 && l->generated >= s->o.fault_after_tokens) {
        muse_api_error err = {.status = 500, .type = "server_error", .code = "engine_fault"};
        snprintf(err.message, sizeof err.message,
                 "the engine failed while generating (injected fault)");
        stat_add(s, &s->stats.errors, 1);
        error_record(l, 500, &err);
        l->state = LANE_FINISHING;
    } else {
        l->next = tok;
        l->state = LANE_DECODE;
    }
}

/* ---- rounds ---- */

/* Takes queued requests into free lanes; returns how many it took. */
static int admit(muse_sched *s, bool draining)
{
    muse_request rq;
    int taken = 0;
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if (l->state != LANE_FREE) continue;
        if (!muse_server_next_request(s->srv, &rq)) return taken;
        taken++;
        if (draining) {
            muse_api_error err = {
                .status = 503, .type = "server_error", .code = "engine_unavailable"};
            snprintf(err.message, sizeof err.message, "the engine is shutting down; retry shortly");
            l->ref = rq.ref;
            error_record(l, 503, &err);
            l->state = LANE_FINISHING;
            continue;
        }
        lane_admit(s, l, &rq);
    }
    return taken;
}

static void cancel_gone(muse_sched *s)
{
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if (l->state == LANE_FREE || !muse_server_is_cancelled(s->srv, l->ref)) continue;
        if (l->state != LANE_FINISHING) stat_add(s, &s->stats.cancelled, 1);
        lane_release(s, l);
    }
}

/* Lanes in least-recently-served order (a stable insertion sort over few lanes). */
static int order_lanes(muse_sched *s, int *order)
{
    int n = 0;
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if (l->state != LANE_PREFILL && l->state != LANE_DECODE) continue;
        if (l->n_out) continue; /* its ring is full: paused until the client reads */
        if (s->o.fault_stall_after_tokens > 0 && l->generated >= s->o.fault_stall_after_tokens)
            continue; /* test builds: a lane that never emits again */
        int j = n++;
        while (j > 0 && s->lanes[order[j - 1]].served > l->served) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    return n;
}

/* KV blocks for positions [0, end) of a lane, taking them back from the prompt cache when the
 * pool is short; 0 when the lane must wait. */
static bool kv_reserve(muse_sched *s, int seq, int64_t end)
{
    while (muse_kv_ensure(&s->be->kv, seq, end))
        if (!s->cache || !muse_pcache_evict_one(s->cache)) return false;
    return true;
}

/* Every runnable lane waits for KV blocks that only running lanes could free: the newest
 * waiting lane gives its blocks back with an error, so the others can go on. */
static void refuse_kv_starved(muse_sched *s)
{
    lane *newest = NULL;
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if (l->kv_wait && (!newest || l->t_admit > newest->t_admit)) newest = l;
    }
    if (!newest) return;
    muse_api_error err = {.status = 503, .type = "server_error", .code = "kv_cache_full"};
    snprintf(err.message, sizeof err.message,
             "the KV cache has no room for this request alongside the running ones; retry later or "
             "raise the engine's --kv-blocks");
    stat_add(s, &s->stats.errors, 1);
    error_record(newest, 503, &err);
    muse_kv_release(&s->be->kv, (int)(newest - s->lanes));
    newest->state = LANE_FINISHING;
}

/* Builds and runs one forward; returns the rows run (0: nothing to do). */
/* Draws the tokens of logits rows [begin, end) with this thread's sampler. */
static void draw_rows(void *ctx, long begin, long end, int thread)
{
    muse_sched *s = ctx;
    int64_t V = s->cfg->vocab_size;
    for (long i = begin; i < end; i++) {
        const lane *l = &s->lanes[s->b_lane_of_logits[i]];
        int64_t position = (int64_t)l->req.n_prompt + l->generated; /* of the token drawn */
        s->b_drawn[i] = (int32_t)muse_sample(s->samplers[thread], s->b_logits + i * V,
                                             &l->req.sampling, position);
    }
}

static long model_round(muse_sched *s)
{
    int order[4096];
    int n = order_lanes(s, order), waiting = 0;
    long rows = 0, nlogits = 0;
    for (int k = 0; k < n && rows < s->o.max_rows; k++) {
        lane *l = &s->lanes[order[k]];
        long take = 1;
        if (l->state == LANE_PREFILL) {
            take = (long)l->req.n_prompt - (long)l->fed;
            if (take > s->o.max_rows - rows) take = s->o.max_rows - rows;
            /* a chunk ends at the next prefix point so the cache can keep its state */
            if (l->next_cut < l->n_cuts && l->cuts[l->next_cut] > l->fed &&
                l->cuts[l->next_cut] - l->fed < take)
                take = (long)(l->cuts[l->next_cut] - l->fed);
        }
        int64_t end =
            l->state == LANE_PREFILL ? l->fed + take : (int64_t)l->req.n_prompt + l->generated;
        if (!kv_reserve(s, (int)order[k], end)) {
            waiting++;
            l->kv_wait = true;
            continue;
        }
        l->kv_wait = false;
        for (long r = 0; r < take; r++) {
            int64_t pos =
                l->state == LANE_PREFILL ? l->fed + r : (int64_t)l->req.n_prompt + l->generated - 1;
            s->b_tokens[rows] = l->state == LANE_PREFILL ? l->req.prompt[l->fed + r] : l->next;
            s->b_pos[rows] = pos;
            s->b_seqs[rows] = order[k];
            s->b_want[rows] = l->state == LANE_DECODE || l->fed + r + 1 == (int64_t)l->req.n_prompt;
            if (s->b_want[rows]) s->b_lane_of_logits[nlogits++] = order[k];
            rows++;
        }
        if (l->state == LANE_PREFILL) l->fed += take;
        l->served = s->round;
    }
    if (!rows) {
        if (waiting) refuse_kv_starved(s);
        return 0;
    }
    muse_batch b = {rows, s->b_tokens, s->b_pos, s->b_seqs, s->b_want};
    muse_err e = {{0}};
    const float *logits = muse_forward_run(s->fwd, &b, &e);
    MUSE_CHECK(logits); /* the batch is built here from checked requests */
    if (s->cache)
        for (int k = 0; k < n; k++) cache_keep(s, &s->lanes[order[k]]);
    /* every draw depends only on its own logits, seed and position: the split cannot matter */
    s->b_logits = logits;
    muse_pool_run_t(s->sample_pool, draw_rows, s, nlogits);
    for (long i = 0; i < nlogits; i++)
        lane_token(s, &s->lanes[s->b_lane_of_logits[i]], s->b_drawn[i]);
    return rows;
}

/* The script backend: each running lane takes its next scripted token. */
static long script_round(muse_sched *s)
{
    int order[4096];
    int n = order_lanes(s, order);
    for (int k = 0; k < n; k++) {
        lane *l = &s->lanes[order[k]];
        l->fed = (int64_t)l->req.n_prompt;
        size_t which = (size_t)(l->req.sampling.seed % s->o.n_script);
        if ((size_t)l->generated < s->o.script_len[which])
            lane_token(s, l, s->o.script[which][l->generated]);
        else
            lane_finish(s, l, "length");
        l->served = s->round;
    }
    if (n && s->o.script_delay_ms > 0) {
        struct timespec ts = {s->o.script_delay_ms / 1000,
                              (s->o.script_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return n;
}

/* A long prompt or a long non-streaming answer sends a keepalive now and then, so nginx
 * knows the engine is at work (SSE: a ": keepalive" comment). */
static void keepalives(muse_sched *s)
{
    double now = now_ms(), every = s->o.keepalive_ms > 0 ? s->o.keepalive_ms : 5000;
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if ((l->state == LANE_PREFILL || l->state == LANE_DECODE) && !l->n_out &&
            now - l->t_record >= every)
            push_record(l, MUSE_EV_KEEPALIVE, 0, NULL);
    }
}

static bool flush_all(muse_sched *s)
{
    bool pending = false;
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if (l->state == LANE_FREE) continue;
        int done = flush_lane(s, l);
        if (done && l->state == LANE_FINISHING)
            lane_release(s, l);
        else if (!done)
            pending = true;
    }
    return pending;
}

static int running(const muse_sched *s)
{
    int n = 0;
    for (int i = 0; i < s->o.streams; i++) n += s->lanes[i].state != LANE_FREE;
    return n;
}

void muse_sched_run(muse_sched *s, volatile sig_atomic_t *stopping, int drain_ms)
{
    double drain_deadline = 0;
    for (;;) {
        bool draining = *stopping != 0;
        if (draining && drain_deadline == 0) drain_deadline = now_ms() + drain_ms;
        cancel_gone(s);
        int admitted = admit(s, draining);
        s->round++;
        long rows = s->fwd ? model_round(s) : script_round(s);
        keepalives(s);
        bool pending = flush_all(s);
        int run = running(s);
        muse_pcache_stats cs = {0};
        if (s->cache) muse_pcache_stats_get(s->cache, &cs);
        pthread_mutex_lock(&s->stats_mu);
        s->stats.running = run;
        s->stats.cache_budget = cs.budget_bytes;
        s->stats.cache_bytes = cs.used_bytes;
        s->stats.cache_entries = cs.entries;
        s->stats.cache_hits = cs.hits;
        s->stats.cache_misses = cs.misses;
        s->stats.kv_free_blocks = s->be ? (uint64_t)s->be->kv.n_free : 0;
        pthread_mutex_unlock(&s->stats_mu);
        if (draining && (run == 0 || now_ms() > drain_deadline)) break;
        /* idle, or waiting on readers; lanes admitted this round (their first records were just
         * flushed) run next round without the idle wait */
        if (!rows && !admitted) muse_server_wait(s->srv, pending ? 2 : 100);
    }
    for (int i = 0; i < s->o.streams; i++) { /* drain deadline passed: tell the clients */
        lane *l = &s->lanes[i];
        if (l->state == LANE_FREE) continue;
        if (l->state != LANE_FINISHING) {
            muse_api_error err = {
                .status = 503, .type = "server_error", .code = "engine_unavailable"};
            snprintf(err.message, sizeof err.message,
                     "the engine shut down before the reply finished");
            error_record(l, 503, &err);
        }
        flush_lane(s, l);
        lane_release(s, l);
    }
}

void muse_sched_stats_get(muse_sched *s, muse_sched_stats *out)
{
    pthread_mutex_lock(&s->stats_mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->stats_mu);
}

muse_sched *muse_sched_create(const muse_sched_opts *o, muse_forward *fwd, const muse_config *cfg,
                              const muse_tokenizer *tok, muse_server *srv, muse_err *e)
{
    if (o->streams < 1 || o->streams > 4096)
        return muse_fail(e, "--streams must be 1 .. 4096"), NULL;
    if (!fwd && o->n_script == 0)
        return muse_fail(e, "the script backend needs --script FILE with at least one token list"),
               NULL;
    int64_t vocab = cfg ? cfg->vocab_size : muse_tokenizer_vocab_size(tok);
    if (cfg && muse_tokenizer_vocab_size(tok) > vocab)
        return muse_fail(e,
                         "the tokenizer has %lld ids but config.json's vocab_size is %lld; use the "
                         "pack's own tokenizer.json",
                         (long long)muse_tokenizer_vocab_size(tok), (long long)vocab),
               NULL;
    muse_sched *s = MUSE_CALLOC(1, sizeof *s);
    s->o = *o;
    s->fwd = fwd;
    s->cfg = cfg;
    s->tok = tok;
    s->srv = srv;
    if (muse_chat_ids_from_tokenizer(tok, &s->ids, e)) {
        free(s);
        return NULL;
    }
    if (fwd) {
        s->be = muse_forward_backend(fwd);
        if (o->prompt_cache_bytes)
            s->cache = muse_pcache_create(o->prompt_cache_bytes, &s->be->kv, s->be->kv_block_bytes);
    }
    if (fwd) { /* more threads than lanes would never draw */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int threads = o->sample_threads > 0 ? o->sample_threads : cores > 0 ? (int)cores : 1;
        s->sample_pool = muse_pool_create(threads < o->streams ? threads : o->streams);
    }
    int n_samplers = muse_pool_threads(s->sample_pool);
    s->samplers = MUSE_CALLOC((size_t)n_samplers, sizeof *s->samplers);
    for (int i = 0; i < n_samplers; i++) {
        s->samplers[i] = muse_sampler_create(vocab);
        MUSE_CHECK(s->samplers[i]);
    }
    s->detok_cap = 3 * (muse_tokenizer_max_token_bytes(tok) + 4) + 16;
    s->detok_buf = MUSE_MALLOC(s->detok_cap);
    s->lanes = MUSE_CALLOC((size_t)o->streams, sizeof *s->lanes);
    for (int i = 0; i < o->streams; i++) s->lanes[i].sched = s;
    size_t R = (size_t)(o->max_rows > 0 ? o->max_rows : 1);
    s->b_tokens = MUSE_MALLOC(R * sizeof *s->b_tokens);
    s->b_seqs = MUSE_MALLOC(R * sizeof *s->b_seqs);
    s->b_pos = MUSE_MALLOC(R * sizeof *s->b_pos);
    s->b_want = MUSE_MALLOC(R * sizeof *s->b_want);
    s->b_lane_of_logits = MUSE_MALLOC(R * sizeof *s->b_lane_of_logits);
    s->b_drawn = MUSE_MALLOC(R * sizeof *s->b_drawn);
    pthread_mutex_init(&s->stats_mu, NULL);
    s->stats.max = o->streams;
    static const double ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double rate_le[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000};
    hist_init(&s->stats.ttft_seconds, ttft_le, (int)(sizeof ttft_le / sizeof *ttft_le));
    hist_init(&s->stats.decode_tokens_per_second, rate_le, (int)(sizeof rate_le / sizeof *rate_le));
    return s;
}

void muse_sched_destroy(muse_sched *s)
{
    if (!s) return;
    for (int i = 0; i < muse_pool_threads(s->sample_pool); i++)
        muse_sampler_destroy(s->samplers[i]);
    free(s->samplers);
    muse_pool_destroy(s->sample_pool);
    muse_pcache_destroy(s->cache);
    free(s->detok_buf);
    free(s->lanes);
    free(s->b_tokens);
    free(s->b_seqs);
    free(s->b_pos);
    free(s->b_want);
    free(s->b_lane_of_logits);
    free(s->b_drawn);
    pthread_mutex_destroy(&s->stats_mu);
    free(s);
}
