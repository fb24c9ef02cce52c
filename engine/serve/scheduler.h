/* The scheduler: up to `streams` lanes decode together, round by round. Each round takes
 * every running lane's next decode token and chunks of newly admitted prompts (within the
 * row budget, least recently served first) into one forward: up to max_rows prompt rows when
 * no lane decodes; while lanes do, busy_rows rows with their tokens (the gap between tokens
 * stays one short round), the prompts at least half of it.
 * Admission and cancellation happen between rounds; a lane whose output ring is full waits
 * (back-pressure). */
#ifndef MUSE_SCHEDULER_H
#define MUSE_SCHEDULER_H

#include <signal.h>

#include "model/forward.h"
#include "serve/hist.h"
#include "serve/ring_server.h"
#include "text/tokenizer.h"

typedef struct {
    int streams;          /* lanes = KV sequence slots */
    long max_rows;        /* row budget of a round (the backend's max_rows) */
    long busy_rows;       /* rows a round while lanes decode, theirs among them (0: max_rows) */
    int64_t context;      /* positions a lane may hold */
    const char *model_id; /* served id, in every response */
    /* script backend (tests): replays these token ids instead of running the model */
    const int32_t *const *script;
    const size_t *script_len;
    size_t n_script;
    int script_delay_ms;            /* pause between script rounds, so streaming is observable */
    long fault_after_tokens;        /* test builds: fail a stream after this many tokens (0: off) */
    long fault_stall_after_tokens;  /* test builds: a lane stops emitting after this many tokens */
    long fault_oom_request;         /* test builds: the Nth admitted request runs out of memory */
    long fault_sticky_after_tokens; /* test builds: a sticky device error after this many tokens */
    uint64_t prompt_cache_bytes;    /* 0: no prompt cache */
    int keepalive_ms;               /* a lane silent this long sends a keepalive record (0: 5000) */
} muse_sched_opts;

/* muse-engine serve's exit status after a sticky device error (the segment is left FATAL). */
#define MUSE_EXIT_DEVICE_FATAL 3

typedef struct {
    int running, max;
    uint64_t requests, tokens_in, tokens_out, errors, cancelled;
    muse_hist ttft_seconds, decode_tokens_per_second;
    muse_hist round_rows; /* rows of each round the model ran */
    uint64_t cache_budget, cache_bytes, cache_entries, cache_hits, cache_misses;
    uint64_t kv_free_blocks; /* full-attention KV blocks no stream or cache entry holds */
} muse_sched_stats;

typedef struct muse_sched muse_sched;

/* fwd and cfg may be NULL for the script backend. */
muse_sched *muse_sched_create(const muse_sched_opts *o, muse_forward *fwd, const muse_config *cfg,
                              const muse_tokenizer *tok, muse_server *srv, muse_err *e);
/* Runs rounds until *stopping is set, then drains: running streams finish (or get an error
 * event after drain_ms), queued ones are refused. */
void muse_sched_run(muse_sched *s, volatile sig_atomic_t *stopping, int drain_ms);
/* A consistent snapshot, callable from another thread. */
void muse_sched_stats_get(muse_sched *s, muse_sched_stats *out);
void muse_sched_destroy(muse_sched *s);

#endif
