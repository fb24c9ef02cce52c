/* The scheduler's lanes and its state, shared by its files: scheduler.c (rounds and
 * admission), lane_output.c (records, events, stop strings, finishing) and lane_cache.c (the
 * prompt-cache glue). Private to engine/serve; the API is scheduler.h. */
#ifndef MUSE_SCHED_LANE_H
#define MUSE_SCHED_LANE_H

#include <pthread.h>
#include <time.h>

#include "base/clock.h"
#include "base/sha256.h"
#include "serve/openai.h"
#include "serve/prompt_cache.h"
#include "serve/request.h"
#include "serve/scheduler.h"
#include "grammar/frame.h"
#include "text/reply.h"

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
    /* response_format: the automaton and this round's mask (vocab/8 bytes); NULL: free */
    muse_gstate *gs;
    uint8_t *mask;
    muse_gframe *frame; /* chat under a constraint: the turn's frame (gs stays NULL) */
} lane;

struct muse_sched {
    muse_sched_opts o;
    muse_forward *fwd;
    const muse_config *cfg;
    const muse_tokenizer *tok;
    muse_server *srv;
    muse_chat_ids ids;
    char *detok_buf; /* the longest text one token can decode to */
    size_t detok_cap;
    muse_backend *be;   /* NULL for the script backend */
    muse_pcache *cache; /* NULL when off */
    lane *lanes;
    uint64_t round;
    uint64_t seed_counter;
    uint64_t admitted; /* requests taken into lanes (the OOM test hook counts them) */
    bool grammar_wait; /* a lane sat out the last round for its grammar's tables */
    /* batch buffers, sized once */
    int32_t *b_tokens, *b_seqs;
    int64_t *b_pos;
    uint8_t *b_want;
    int *b_lane_of_logits;     /* lane of each logits row */
    muse_sampling *b_sampling; /* sampling of each logits row */
    int64_t *b_draw_pos;       /* position of the token drawn from each logits row */
    const uint8_t **b_masks;   /* mask of each logits row (NULL: free) */
    muse_gvocab *gvocab;       /* the vocabulary as bytes, built on the first constraint */
    pthread_mutex_t stats_mu;
    muse_sched_stats stats;
};

static inline uint64_t mix_seed(uint64_t a, uint64_t b)
{
    uint64_t x = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static inline void stat_add(muse_sched *s, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&s->stats_mu);
    *field += n;
    pthread_mutex_unlock(&s->stats_mu);
}

/* lane_output.c: a lane's records and the end of its response */
void muse_lane_push(lane *l, uint32_t type, int status, char *data);
int muse_lane_flush(muse_sched *s, lane *l);
void muse_lane_reply_event(void *ctx, const muse_reply_ev *ev);
void muse_lane_error(lane *l, int status, const muse_api_error *err);
void muse_lane_finish(muse_sched *s, lane *l, const char *reason);
/* One sampled token: into the hash, the parser, the stop rules. */
void muse_lane_token(muse_sched *s, lane *l, int32_t tok);
/* A constrained lane's mask for its next draw: the automaton's tokens, and the end tokens
 * only when the value is complete (chat: the frame's). */
void muse_lane_mask(muse_sched *s, lane *l);

/* lane_cache.c: where a prompt may be kept, resuming from the cache, keeping prefixes */
void muse_lane_cache_plan(muse_sched *s, lane *l);
void muse_lane_cache_resume(muse_sched *s, lane *l, const char *scope, size_t scope_len);
void muse_lane_cache_keep(muse_sched *s, lane *l);

#endif
