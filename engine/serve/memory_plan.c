/* The memory plan's arithmetic (see memory_plan.h): every term per rank from the config and the
 * flags, the fit check, the context that fits, and what is left for streams. */
#include "serve/memory_plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/flags.h"
#include "model/kv_pool.h"
#include "model/plan_weights.h"
#include "serve/prompt_cache.h"

#define GIB 1073741824.0

const char *muse_device_kind_name(muse_device_kind k)
{
    return k == MUSE_DEVICE_DISCRETE ? "discrete" : k == MUSE_DEVICE_UNIFIED ? "unified" : "cpu";
}

uint64_t muse_reserve_default_bytes(muse_device_kind k, uint64_t device_bytes)
{
    uint64_t floor, part;
    switch (k) {
    case MUSE_DEVICE_DISCRETE: /* the driver, the context and fragmentation */
        floor = 1ull << 30;
        part = device_bytes / 32;
        break;
    case MUSE_DEVICE_UNIFIED: /* the host's own processes share the same memory */
        floor = 4ull << 30;
        part = device_bytes / 10;
        break;
    default:
        return 0;
    }
    return part > floor ? part : floor;
}

int muse_reserve_resolve(double flag_gib, muse_device_kind k, uint64_t device_bytes, double *gib,
                         muse_err *e)
{
    if (flag_gib >= 0) {
        *gib = flag_gib;
        return 0;
    }
    const char *env = getenv(MUSE_RESERVE_ENV);
    if (env && *env) {
        char *end;
        errno = 0;
        double v = strtod(env, &end);
        if (errno || *end || !isfinite(v) || v < 0 || v > 1048576)
            return muse_fail(e,
                             "%s=%s: must be a size in GiB in 0 .. 1048576; unset it for the "
                             "device's default or give --reserve-gib",
                             MUSE_RESERVE_ENV, env);
        *gib = v;
        return 0;
    }
    *gib = (double)muse_reserve_default_bytes(k, device_bytes) / GIB;
    return 0;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* The largest EXL3 workspace a Linear needs for rows (exl3.c: rows x (k floats + n doubles)). */
static uint64_t exl3_ws(const muse_config *c, long rows)
{
    int64_t H = c->hidden_size, Q = c->n_heads * c->head_dim;
    int64_t I = c->intermediate_size, M = c->moe_intermediate_size;
    int64_t S = c->num_shared_experts * M, V = (c->vocab_size + 127) / 128 * 128;
    int64_t kn[][2] = {{H, Q}, {Q, H}, {H, I}, {I, H}, {H, M}, {M, H}, {H, S}, {S, H}, {H, V}};
    uint64_t best = 0;
    for (size_t i = 0; i < sizeof kn / sizeof *kn; i++)
        if (kn[i][0] > 0 && kn[i][1] > 0)
            best =
                max_u64(best, (uint64_t)rows * ((uint64_t)kn[i][0] * 4 + (uint64_t)kn[i][1] * 8));
    return best;
}

/* An estimate of a rank's workspace as the CPU backend sizes it: the forward pass's activations,
 * the EXL3 workspace, the MoE buffers, per-thread scratch and the round's staging. */
static uint64_t workspace_estimate(const muse_memory_opts *o, int64_t blocks_per_stream)
{
    const muse_config *c = o->cfg;
    uint64_t R = (uint64_t)(o->max_rows > 0 ? o->max_rows : 256);
    uint64_t H = (uint64_t)c->hidden_size, Q = (uint64_t)(c->n_heads * c->head_dim);
    uint64_t KV = (uint64_t)(c->n_kv_heads * c->head_dim), I = (uint64_t)c->intermediate_size;
    uint64_t V = (uint64_t)c->vocab_size, E = (uint64_t)c->num_experts;
    uint64_t K = (uint64_t)c->num_experts_per_tok;
    uint64_t M = (uint64_t)c->moe_intermediate_size *
                 (uint64_t)(c->num_shared_experts > 1 ? c->num_shared_experts : 1);
    if (o->bits > 0) V = (V + 127) / 128 * 128;
    uint64_t ws = R * 4 * (3 * H + 3 * Q + 2 * KV + 3 * I + V);
    if (o->bits > 0) ws += exl3_ws(c, (long)R);
    if (E) ws += R * (E * 4 + K * 8 + 4 + H * 12 + M * 12);
    uint64_t widest = max_u64(max_u64(H, I), max_u64(M, Q));
    uint64_t threads = (uint64_t)(o->threads > 0 ? o->threads : 1);
    ws += threads * (widest * 4 + ((uint64_t)o->context + (uint64_t)c->head_dim) * 8);
    ws += R * 96 + (uint64_t)o->streams * (uint64_t)blocks_per_stream * 4;
    return ws;
}

static void total_of(muse_rank_plan *r)
{
    r->total_bytes = r->weights_bytes + r->kv_bytes + r->snapshots_bytes + r->workspace_bytes +
                     r->request_bytes + r->reserve_bytes;
}

void muse_memory_plan_make(const muse_memory_opts *o, muse_memory_plan *p)
{
    memset(p, 0, sizeof *p);
    p->streams = o->streams;
    p->slots = o->streams + o->queue;
    p->context = o->context;
    p->device_kind = o->device_kind;
    p->n_ranks =
        o->ranks > 1 ? (o->ranks < MUSE_PLAN_MAX_RANKS ? o->ranks : MUSE_PLAN_MAX_RANKS) : 1;
    const muse_config *c = o->cfg;
    /* a rank's pool holds its KV heads of every position */
    uint64_t per_token = c ? muse_kv_rank_bytes(c, muse_kv_full_bytes_per_token(c), p->n_ranks)
                           : o->kv_bytes_per_token;
    muse_rank_plan *r = &p->ranks[0];
    r->kv_block_bytes = MUSE_KV_BLOCK * per_token;
    r->blocks_per_stream = (o->context + MUSE_KV_BLOCK - 1) / MUSE_KV_BLOCK;
    r->prompt_cache_bytes = muse_gib_bytes(o->prompt_cache_gib);
    r->reserve_bytes = o->reserve_gib >= 0
                           ? muse_gib_bytes(o->reserve_gib)
                           : muse_reserve_default_bytes(o->device_kind, o->device_bytes);
    /* the shared segment's area and the engine's private copy, every slot */
    r->request_bytes = 2 * (uint64_t)p->slots * o->request_bytes;
    r->device_bytes = o->device_bytes;
    /* the pool holds every stream's context, plus what the prompt cache may keep */
    if (!o->kv_blocks && r->kv_block_bytes)
        r->cache_blocks = (int64_t)(o->prompt_cache_gib * GIB / (double)r->kv_block_bytes);
    int64_t blocks =
        o->kv_blocks ? o->kv_blocks : o->streams * r->blocks_per_stream + r->cache_blocks;
    r->kv_blocks = blocks > INT32_MAX ? INT32_MAX : blocks;
    r->pool_bytes = (uint64_t)r->kv_blocks * r->kv_block_bytes;
    r->kv_bytes = r->pool_bytes;
    if (c) {
        /* sliding layers: a ring a lane of min(context, W + max_rows - 1) positions */
        int64_t R = o->max_rows > 0 ? o->max_rows : 256, cap = o->context;
        if (c->sliding_window + R - 1 < cap) cap = c->sliding_window + R - 1;
        uint64_t kvw = (uint64_t)(muse_kv_heads_per_rank(c, p->n_ranks) * c->head_dim);
        for (int64_t i = 0; i < c->num_layers; i++)
            if (c->attn_kind[i] == MUSE_ATTN_SLIDING)
                r->kv_bytes += (uint64_t)o->streams * (uint64_t)cap * kvw * 2 * 2;
        uint64_t snap = muse_kv_rank_bytes(c, muse_kv_snapshot_bytes(c), p->n_ranks);
        r->snapshot_slots = muse_pcache_slots_for(r->prompt_cache_bytes, snap);
        r->snapshots_bytes = (uint64_t)r->snapshot_slots * snap;
        r->workspace_bytes =
            o->workspace_bytes ? o->workspace_bytes : workspace_estimate(o, r->blocks_per_stream);
    }
    for (int i = p->n_ranks - 1; i >= 0; i--) {
        p->ranks[i] = *r;
        p->ranks[i].rank = i;
        if (c)
            p->ranks[i].weights_bytes =
                muse_plan_weights_rank(c, o->bits, o->head_bits, i, p->n_ranks) + o->weights_extra;
        total_of(&p->ranks[i]);
    }
}

void muse_memory_plan_measured(muse_memory_plan *p, int rank, uint64_t weights_bytes,
                               uint64_t kv_bytes, uint64_t pool_bytes, uint64_t workspace_bytes,
                               uint64_t snapshots_bytes)
{
    if (rank < 0 || rank >= p->n_ranks) return;
    muse_rank_plan *r = &p->ranks[rank];
    r->weights_bytes = weights_bytes;
    r->kv_bytes = kv_bytes;
    r->pool_bytes = pool_bytes;
    r->workspace_bytes = workspace_bytes;
    r->snapshots_bytes = snapshots_bytes;
    total_of(r);
}

int muse_memory_plan_misfit(const muse_memory_plan *p)
{
    for (int i = 0; i < p->n_ranks; i++)
        if (p->ranks[i].device_bytes && p->ranks[i].total_bytes > p->ranks[i].device_bytes)
            return i;
    return -1;
}

static double gib(uint64_t bytes)
{
    return (double)bytes / GIB;
}

size_t muse_memory_plan_refusal(const muse_memory_plan *p, char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = 0;
    for (int i = 0; i < p->n_ranks && at < len; i++) {
        const muse_rank_plan *r = &p->ranks[i];
        int w = snprintf(
            buf + at, len - at,
            "%srank %d needs %.2f GiB of its %.2f GiB (%s): weights %.2f + kv pool %.2f + "
            "sliding rings %.2f + snapshots %.2f + workspace %.2f + requests %.2f + reserve "
            "%.2f GiB%s",
            i ? "; " : "", r->rank, gib(r->total_bytes), gib(r->device_bytes),
            muse_device_kind_name(p->device_kind), gib(r->weights_bytes), gib(r->pool_bytes),
            gib(r->kv_bytes > r->pool_bytes ? r->kv_bytes - r->pool_bytes : 0),
            gib(r->snapshots_bytes), gib(r->workspace_bytes), gib(r->request_bytes),
            gib(r->reserve_bytes),
            r->device_bytes && r->total_bytes > r->device_bytes ? " (does not fit)" : "");
        if (w < 0) break;
        at += (size_t)w;
    }
    if (at < len) {
        int w = snprintf(buf + at, len - at,
                         ". The plan does not fit: use fewer streams (--streams), a shorter "
                         "context (--context), a smaller KV pool (--kv-blocks), fewer rows a "
                         "round (--max-rows), a smaller prompt cache (--prompt-cache-gib), a "
                         "smaller reserve (--reserve-gib), or more ranks (--ranks)");
        if (w > 0) at += (size_t)w;
    }
    return at < len ? at : (len ? len - 1 : 0);
}

int64_t muse_memory_plan_context_fits(const muse_memory_opts *o, int streams)
{
    int64_t most = o->cfg ? o->cfg->max_position_embeddings : o->context;
    if (!o->device_bytes || !o->cfg) return most;
    muse_memory_opts t = *o;
    t.streams = streams;
    t.kv_blocks = 0; /* the pool follows the context being tried */
    muse_memory_plan p;
    int64_t lo = 0, hi = most / MUSE_KV_BLOCK; /* blocks: lo fits (or is 0), hi + 1 does not */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        t.context = mid * MUSE_KV_BLOCK;
        muse_memory_plan_make(&t, &p);
        if (muse_memory_plan_misfit(&p) < 0)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo * MUSE_KV_BLOCK;
}

long muse_memory_plan_most_rows(const muse_memory_opts *o, long most,
                                uint64_t (*ws)(void *ctx, long rows), void *ctx)
{
    if (!o->device_bytes) return o->max_rows;
    for (long rows = most; rows > o->max_rows; rows /= 2) {
        muse_memory_opts t = *o;
        t.max_rows = rows;
        if (!(t.workspace_bytes = ws(ctx, rows))) break;
        muse_memory_plan p;
        muse_memory_plan_make(&t, &p);
        if (muse_memory_plan_misfit(&p) < 0) return rows;
    }
    return o->max_rows;
}

uint64_t muse_memory_plan_left(const muse_memory_plan *p, int rank, uint64_t free_blocks,
                               int free_lanes)
{
    if (rank < 0 || rank >= p->n_ranks) return 0;
    const muse_rank_plan *r = &p->ranks[rank];
    uint64_t rings = r->kv_bytes > r->pool_bytes && p->streams
                         ? (r->kv_bytes - r->pool_bytes) / (uint64_t)p->streams
                         : 0;
    return free_blocks * r->kv_block_bytes + rings * (uint64_t)(free_lanes > 0 ? free_lanes : 0);
}

static double mib(uint64_t bytes)
{
    return (double)bytes / 1048576.0;
}

size_t muse_memory_plan_text(const muse_memory_plan *p, char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = 0;
    for (int i = 0; i < p->n_ranks && at < len; i++) {
        const muse_rank_plan *r = &p->ranks[i];
        int w =
            snprintf(buf + at, len - at,
                     "%srank %d: weights %.1f MiB, KV %.1f MiB (pool %lld blocks of %.3f MiB, "
                     "%lld a stream, "
                     "%lld for the prompt cache; rings %.1f MiB), prompt cache %.1f MiB "
                     "(snapshots %.1f MiB), "
                     "workspace %.1f MiB, requests %.1f MiB (%d slots), reserve %.1f MiB, "
                     "total %.1f MiB of %s",
                     i ? "\n" : "", r->rank, mib(r->weights_bytes), mib(r->kv_bytes),
                     (long long)r->kv_blocks, mib(r->kv_block_bytes),
                     (long long)r->blocks_per_stream, (long long)r->cache_blocks,
                     mib(r->kv_bytes > r->pool_bytes ? r->kv_bytes - r->pool_bytes : 0),
                     mib(r->prompt_cache_bytes), mib(r->snapshots_bytes), mib(r->workspace_bytes),
                     mib(r->request_bytes), p->slots, mib(r->reserve_bytes), mib(r->total_bytes),
                     r->device_bytes ? "" : "no device limit");
        if (w < 0) break;
        at += (size_t)w;
        if (r->device_bytes && at < len) {
            w = snprintf(buf + at, len - at, "%.1f MiB", mib(r->device_bytes));
            if (w < 0) break;
            at += (size_t)w;
        }
    }
    return at < len ? at : (len ? len - 1 : 0);
}

size_t muse_memory_plan_table(const muse_memory_plan *p, char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = 0;
    const char *names[] = {"weights",  "kv pool", "sliding rings", "snapshots", "workspace",
                           "requests", "reserve", "total",         "device",    "free"};
    for (int row = -1; row < (int)(sizeof names / sizeof *names) && at < len; row++) {
        int w = snprintf(buf + at, len - at, "%-15s", row < 0 ? "term (GiB)" : names[row]);
        for (int i = 0; i < p->n_ranks && w >= 0 && at + (size_t)w < len; i++) {
            const muse_rank_plan *r = &p->ranks[i];
            uint64_t rings = r->kv_bytes > r->pool_bytes ? r->kv_bytes - r->pool_bytes : 0;
            uint64_t v[] = {r->weights_bytes,
                            r->pool_bytes,
                            rings,
                            r->snapshots_bytes,
                            r->workspace_bytes,
                            r->request_bytes,
                            r->reserve_bytes,
                            r->total_bytes,
                            r->device_bytes,
                            r->device_bytes > r->total_bytes ? r->device_bytes - r->total_bytes
                                                             : 0};
            int x;
            if (row < 0)
                x = snprintf(buf + at + w, len - at - (size_t)w, "  %10s %d", "rank", r->rank);
            else if (row >= 8 && !r->device_bytes)
                x = snprintf(buf + at + w, len - at - (size_t)w, "  %12s", "no limit");
            else if (row == 9 && r->total_bytes > r->device_bytes)
                x = snprintf(buf + at + w, len - at - (size_t)w, "  %12.2f",
                             -gib(r->total_bytes - r->device_bytes));
            else
                x = snprintf(buf + at + w, len - at - (size_t)w, "  %12.2f", gib(v[row]));
            if (x < 0) break;
            w += x;
        }
        if (w < 0) break;
        at += (size_t)w;
        if (at < len) {
            w = snprintf(buf + at, len - at, "\n");
            if (w > 0) at += (size_t)w;
        }
    }
    return at < len ? at : (len ? len - 1 : 0);
}
