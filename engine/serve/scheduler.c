/* The scheduler: rounds and admission. Each round takes every running lane's next rows into
 * one forward (scheduler.h); a lane's output lives in lane_output.c, its prompt-cache glue in
 * lane_cache.c, their shared state in sched_lane.h. */
#include "serve/scheduler.h"

#include <math.h>
#include <unistd.h>

#include "base/threadpool.h"
#include "serve/sched_lane.h"

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
    muse_gstate_free(l->gs);
    muse_gframe_free(l->frame);
    free(l->mask);
    muse_reply_destroy(l->reply);
    free(l->pending.p);
    free(l->content.p);
    free(l->reasoning.p);
    cJSON_Delete(l->tool_calls);
    memset(l, 0, sizeof *l);
    l->sched = s;
    l->state = LANE_FREE;
}

/* The vocabulary's bytes for constrained decoding, built once on the first constraint. */
static const muse_gvocab *sched_gvocab(void *ctx)
{
    muse_sched *s = ctx;
    if (s->gvocab || !s->tok) return s->gvocab;
    int64_t V = s->cfg ? s->cfg->vocab_size : muse_tokenizer_vocab_size(s->tok);
    const uint8_t **bytes = MUSE_CALLOC((size_t)V, sizeof *bytes);
    size_t *lens = MUSE_CALLOC((size_t)V, sizeof *lens);
    for (int64_t i = 0; i < V; i++) {
        /* control tokens stand for no text: a mask never allows them (end tokens aside) */
        if (muse_tokenizer_is_special(s->tok, (int32_t)i)) continue;
        bytes[i] = muse_tokenizer_token_bytes(s->tok, (int32_t)i, &lens[i]);
        if (!bytes[i]) lens[i] = 0;
    }
    s->gvocab = muse_gvocab_build(bytes, lens, (size_t)V);
    free(bytes);
    free(lens);
    return s->gvocab;
}

/* A chat lane's frame over its recipients (grammar/frame.h); -1 with err's message. */
static int lane_frame(muse_sched *s, lane *l, muse_api_error *err)
{
    /* reasoning may take half of max_tokens: the answer keeps the other half */
    muse_gframe_ids ids = {.start = s->ids.start,
                           .message = s->ids.message,
                           .eom = s->ids.eom,
                           .reasoning_max = l->req.max_tokens / 2};
    ids.ends[ids.nends++] = s->ids.end_of_text;
    ids.ends[ids.nends++] = s->ids.eot;
    for (int i = 0; s->cfg && i < s->cfg->n_eos && ids.nends < MUSE_GFRAME_MAX_ENDS; i++)
        ids.ends[ids.nends++] = (int32_t)s->cfg->eos_ids[i];
    muse_gframe_rcpt r[64];
    size_t n = l->req.n_rcpt < 64 ? l->req.n_rcpt : 64;
    for (size_t i = 0; i < n; i++)
        r[i] = (muse_gframe_rcpt){l->req.rcpt_names[i], l->req.rcpt_bodies[i]};
    muse_gerr ge;
    if (muse_gframe_new(&ids, s->gvocab, r, n, &l->frame, &ge) == 0) return 0;
    snprintf(err->message, sizeof err->message, "%s: %s", err->param, ge.msg);
    return -1;
}

static void lane_admit(muse_sched *s, lane *l, const muse_request *rq)
{
    /* a default seed below 2^53, so a JSON client can read it back exactly and reuse it */
    muse_request_env env = {s->cfg,
                            s->tok,
                            &s->ids,
                            s->o.context,
                            mix_seed(++s->seed_counter, (uint64_t)time(NULL)) >> 11,
                            sched_gvocab,
                            s,
                            s->be ? s->be->masks : 1};
    muse_api_error err;
    l->ref = rq->ref;
    l->t_admit = muse_now_ms();
    stat_add(s, &s->stats.requests, 1);
    if (muse_request_parse(&env, (int)rq->kind, rq->flags, rq->body, rq->body_len, &l->req, &err)) {
        stat_add(s, &s->stats.errors, 1);
        muse_lane_error(l, err.status, &err);
        l->state = LANE_FINISHING;
        return;
    }
    if ((l->req.grammar || l->req.n_rcpt) && s->be) { /* script backends' tokens: no mask */
        err = (muse_api_error){
            .status = 400, .type = "invalid_request_error", .code = "invalid_schema"};
        snprintf(err.param, sizeof err.param, "%s",
                 l->req.grammar ? "response_format" : "tool_choice");
        l->mask = MUSE_MALLOC(((size_t)s->cfg->vocab_size + 7) / 8);
        if (rq->kind == MUSE_KIND_CHAT) {
            if (lane_frame(s, l, &err) == 0) err.status = 0;
        } else {
            l->gs = muse_gstate_new(l->req.grammar);
            if (!muse_gstate_dead(l->gs))
                err.status = 0;
            else
                snprintf(err.message, sizeof err.message,
                         "response_format: the schema admits no value that can be generated");
        }
        if (err.status) {
            stat_add(s, &s->stats.errors, 1);
            muse_lane_error(l, 400, &err);
            l->state = LANE_FINISHING;
            return;
        }
    }
    if (++s->admitted == (uint64_t)s->o.fault_oom_request) { /* test builds only */
        err = (muse_api_error){.status = 503, .type = "server_error", .code = "out_of_memory"};
        snprintf(err.message, sizeof err.message,
                 "the device ran out of memory for this request (injected fault); retry later");
        stat_add(s, &s->stats.errors, 1);
        muse_lane_error(l, 503, &err);
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
                                .emit = muse_lane_reply_event,
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
            muse_lane_error(l, 400, &err);
            l->state = LANE_FINISHING;
            return;
        }
    }
    if (s->cache && (l->req.grammar || l->req.n_rcpt)) {
        /* the constraint is part of the keys: a constrained prompt resumes only its own kind */
        char scope[MUSE_RING_MAX_SCOPE + 2 + 64];
        size_t n = rq->scope_len < MUSE_RING_MAX_SCOPE ? rq->scope_len : MUSE_RING_MAX_SCOPE;
        memcpy(scope, rq->scope, n);
        scope[n++] = '#';
        muse_sha256_hex(l->req.grammar_sha, scope + n);
        muse_lane_cache_resume(s, l, scope, n + 64);
    } else if (s->cache) {
        muse_lane_cache_resume(s, l, rq->scope, rq->scope_len);
    }
    /* the first record tells the module the request is admitted (its queue timer stops) */
    if (l->req.stream)
        muse_lane_push(l, MUSE_EV_DATA, 0, muse_oa_role_chunk(&l->oa));
    else
        muse_lane_push(l, MUSE_EV_KEEPALIVE, 0, NULL);
    l->state = LANE_PREFILL;
    l->served = 0; /* new lanes go first */
}

/* A failed round (a device error: a CUDA context that can do nothing more): mark the segment
 * FATAL and exit at once; the doorbells close with the process, so every worker ends its
 * streams and nothing is served from a broken context. */
static void round_failed(muse_sched *s, const muse_err *e)
{
    fprintf(stderr,
            "muse-engine serve: sticky device error: %s; marking the segment FATAL and "
            "exiting\n",
            e->msg);
    muse_server_set_state(s->srv, MUSE_ENGINE_FATAL);
    _exit(MUSE_EXIT_DEVICE_FATAL);
}

/* Test builds: --fault-sticky-after-tokens forces the device-failure path of the next round. */
static void maybe_inject_sticky(muse_sched *s, const lane *l)
{
    if (s->o.fault_sticky_after_tokens <= 0 || l->generated < s->o.fault_sticky_after_tokens)
        return;
    if (s->be) {
        s->be->fault_pending = 1;
        return;
    }
    muse_err e;
    muse_fail(&e, "device error injected by --fault-sticky-after-tokens (script backend)");
    round_failed(s, &e);
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
            muse_lane_error(l, 503, &err);
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

/* Test builds: a lane that never emits again, keepalives included (a hung engine). */
static bool lane_stalled(const muse_sched *s, const lane *l)
{
    return s->o.fault_stall_after_tokens > 0 && l->generated >= s->o.fault_stall_after_tokens;
}

/* Lanes in least-recently-served order (a stable insertion sort over few lanes). */
static int order_lanes(muse_sched *s, int *order)
{
    int n = 0;
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if (l->state != LANE_PREFILL && l->state != LANE_DECODE) continue;
        if (l->n_out) continue; /* its ring is full: paused until the client reads */
        if (lane_stalled(s, l)) continue;
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
    muse_lane_error(newest, 503, &err);
    muse_kv_release(&s->be->kv, (int)(newest - s->lanes));
    newest->state = LANE_FINISHING;
}

/* Whether a constrained lane's grammars still lack their tables (the fill worker's): its
 * first draw waits, so a mask never makes the round wait. */
static bool grammar_pending(const lane *l)
{
    return (l->gs && !muse_gstate_ready(l->gs)) || (l->frame && !muse_gframe_ready(l->frame));
}

/* Builds and runs one round; returns the rows run (0: nothing to do). */
static long model_round(muse_sched *s)
{
    int order[4096];
    int n = order_lanes(s, order), waiting = 0;
    long rows = 0, nlogits = 0;
    bool masked = false; /* a round with no constrained row passes no masks */
    s->grammar_wait = false;
    /* prompt rows: while lanes decode, what busy_rows leaves beside their tokens, so the round
     * stays in busy_rows' row bucket (a round of 256 prompt rows and 16 tokens ran as 512 rows)
     * and each next token waits one short round; at least half of busy_rows, so prompts go on
     * beside many streams. Else max_rows (a lone prompt's rounds share each expert's decode
     * among more rows). */
    long prompt_cap = s->o.max_rows, prompt_rows = 0, decoding = 0;
    for (int k = 0; k < n; k++) decoding += s->lanes[order[k]].state == LANE_DECODE;
    if (decoding && s->o.busy_rows > 0) {
        long least = (s->o.busy_rows + 1) / 2;
        prompt_cap = s->o.busy_rows - decoding > least ? s->o.busy_rows - decoding : least;
        if (prompt_cap > s->o.max_rows) prompt_cap = s->o.max_rows;
    }
    for (int k = 0; k < n && rows < s->o.max_rows; k++) {
        lane *l = &s->lanes[order[k]];
        long take = 1;
        bool pending = grammar_pending(l);
        if (pending && l->state != LANE_PREFILL) {
            s->grammar_wait = true;
            continue;
        }
        if (l->state == LANE_PREFILL) {
            take = (long)l->req.n_prompt - (long)l->fed;
            if (pending) take--; /* the prompt, but not the row that draws */
            if (take <= 0) {
                s->grammar_wait = true;
                continue;
            }
            if (take > s->o.max_rows - rows) take = s->o.max_rows - rows;
            if (take > prompt_cap - prompt_rows) take = prompt_cap - prompt_rows;
            if (take <= 0) continue; /* the round's prompt rows are taken */
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
            if (s->b_want[rows]) {
                s->b_sampling[nlogits] = l->req.sampling;
                s->b_draw_pos[nlogits] = (int64_t)l->req.n_prompt + l->generated; /* drawn */
                s->b_masks[nlogits] = NULL;
                if (l->gs || l->frame) {
                    muse_lane_mask(s, l);
                    s->b_masks[nlogits] = l->mask;
                    masked = true;
                }
                s->b_lane_of_logits[nlogits++] = order[k];
            }
            rows++;
        }
        if (l->state == LANE_PREFILL) l->fed += take, prompt_rows += take;
        l->served = s->round;
    }
    if (!rows) {
        if (waiting) refuse_kv_starved(s);
        return 0;
    }
    pthread_mutex_lock(&s->stats_mu);
    muse_hist_observe(&s->stats.round_rows, (double)rows);
    pthread_mutex_unlock(&s->stats_mu);
    muse_round b = {.rows = rows,
                    .tokens = s->b_tokens,
                    .positions = s->b_pos,
                    .seqs = s->b_seqs,
                    .want_logits = s->b_want,
                    .sampling = s->b_sampling,
                    .draw_pos = s->b_draw_pos,
                    .masks = masked ? s->b_masks : NULL};
    muse_round_out out;
    muse_err e = {{0}};
    if (muse_forward_run(s->fwd, &b, &out, &e)) round_failed(s, &e);
    MUSE_CHECK(out.wanted == nlogits && out.tokens);
    if (s->cache)
        for (int k = 0; k < n; k++) muse_lane_cache_keep(s, &s->lanes[order[k]]);
    for (long i = 0; i < nlogits; i++) {
        lane *l = &s->lanes[s->b_lane_of_logits[i]];
        maybe_inject_sticky(s, l);
        muse_lane_token(s, l, out.tokens[i]);
    }
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
        maybe_inject_sticky(s, l);
        if ((size_t)l->generated < s->o.script_len[which])
            muse_lane_token(s, l, s->o.script[which][l->generated]);
        else
            muse_lane_finish(s, l, "length");
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
    double now = muse_now_ms(), every = s->o.keepalive_ms > 0 ? s->o.keepalive_ms : 5000;
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if ((l->state == LANE_PREFILL || l->state == LANE_DECODE) && !l->n_out &&
            !lane_stalled(s, l) && now - l->t_record >= every)
            muse_lane_push(l, MUSE_EV_KEEPALIVE, 0, NULL);
    }
}

static bool flush_all(muse_sched *s)
{
    bool pending = false;
    for (int i = 0; i < s->o.streams; i++) {
        lane *l = &s->lanes[i];
        if (l->state == LANE_FREE) continue;
        int done = muse_lane_flush(s, l);
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
        if (draining && drain_deadline == 0) drain_deadline = muse_now_ms() + drain_ms;
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
        if (draining && (run == 0 || muse_now_ms() > drain_deadline)) break;
        /* idle, or waiting on readers; lanes admitted this round (their first records were just
         * flushed) run next round without the idle wait */
        if (!rows && !admitted) muse_server_wait(s->srv, pending || s->grammar_wait ? 2 : 100);
    }
    for (int i = 0; i < s->o.streams; i++) { /* drain deadline passed: tell the clients */
        lane *l = &s->lanes[i];
        if (l->state == LANE_FREE) continue;
        if (l->state != LANE_FINISHING) {
            muse_api_error err = {
                .status = 503, .type = "server_error", .code = "engine_unavailable"};
            snprintf(err.message, sizeof err.message,
                     "the engine shut down before the reply finished");
            muse_lane_error(l, 503, &err);
        }
        muse_lane_flush(s, l);
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
            s->cache = muse_pcache_create(o->prompt_cache_bytes, &s->be->kv, s->be->kv_block_bytes,
                                          s->be->opts.snapshot_slots, s->be->snapshot_bytes);
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
    s->b_sampling = MUSE_MALLOC(R * sizeof *s->b_sampling);
    s->b_draw_pos = MUSE_MALLOC(R * sizeof *s->b_draw_pos);
    s->b_masks = MUSE_CALLOC(R, sizeof *s->b_masks);
    pthread_mutex_init(&s->stats_mu, NULL);
    s->stats.max = o->streams;
    static const double ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double rate_le[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000};
    muse_hist_init(&s->stats.ttft_seconds, ttft_le, (int)(sizeof ttft_le / sizeof *ttft_le));
    muse_hist_init(&s->stats.decode_tokens_per_second, rate_le,
                   (int)(sizeof rate_le / sizeof *rate_le));
    static const double rows_le[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
    muse_hist_init(&s->stats.round_rows, rows_le, (int)(sizeof rows_le / sizeof *rows_le));
    return s;
}

void muse_sched_destroy(muse_sched *s)
{
    if (!s) return;
    muse_pcache_destroy(s->cache);
    free(s->detok_buf);
    free(s->lanes);
    free(s->b_tokens);
    free(s->b_seqs);
    free(s->b_pos);
    free(s->b_want);
    free(s->b_lane_of_logits);
    free(s->b_sampling);
    free(s->b_draw_pos);
    free(s->b_masks);
    muse_gvocab_free(s->gvocab);
    pthread_mutex_destroy(&s->stats_mu);
    free(s);
}
