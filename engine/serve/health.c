/* Builds the /health JSON with cJSON (see health.h). */
#include "serve/health.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/muse_common.h"

const char *muse_health_status(int state, uint64_t free_bytes, uint64_t reserve_bytes)
{
    if (state == 0) return "starting";
    if (state == 2) return "down";
    return free_bytes && free_bytes < reserve_bytes ? "degraded" : "ok";
}

uint64_t muse_proc_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0) {
            v = strtoull(line + kl, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

cJSON *muse_hist_json(const muse_hist *h)
{
    cJSON *o = cJSON_CreateObject(), *le = cJSON_AddArrayToObject(o, "le"),
          *counts = cJSON_AddArrayToObject(o, "counts");
    for (int i = 0; i < h->n && i < MUSE_HIST_MAX; i++) {
        cJSON_AddItemToArray(le, cJSON_CreateNumber(h->le[i]));
        cJSON_AddItemToArray(counts, cJSON_CreateNumber((double)h->counts[i]));
    }
    cJSON_AddNumberToObject(o, "sum", round(h->sum * 1e6) / 1e6); /* microsecond figures */
    cJSON_AddNumberToObject(o, "count", (double)h->count);
    return o;
}

static void add_u64(cJSON *o, const char *name, uint64_t v)
{
    cJSON_AddNumberToObject(o, name, (double)v);
}

char *muse_health_json(const muse_health *h)
{
    static const muse_sched_stats none;
    const muse_sched_stats *st = h->st ? h->st : &none;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", h->status);
    cJSON_AddStringToObject(root, "model", h->model_id ? h->model_id : "");
    cJSON *engine = cJSON_AddObjectToObject(root, "engine");
    cJSON_AddNumberToObject(engine, "pid", h->pid);
    cJSON_AddStringToObject(engine, "version", MUSE_VERSION);
    cJSON_AddNumberToObject(engine, "uptime_s", round(h->uptime_s));
    cJSON_AddNumberToObject(engine, "heartbeat_age_ms", 0);
    cJSON_AddStringToObject(engine, "backend", h->backend ? h->backend : "");
    cJSON *streams = cJSON_AddObjectToObject(root, "streams");
    cJSON_AddNumberToObject(streams, "running", st->running);
    cJSON_AddNumberToObject(streams, "queued", h->queued);
    cJSON_AddNumberToObject(streams, "max", st->max);
    cJSON_AddNumberToObject(root, "context_length", (double)h->context_length);
    cJSON *cache = cJSON_AddObjectToObject(root, "prompt_cache");
    cJSON_AddNumberToObject(cache, "gib", st->cache_budget ? h->prompt_cache_gib : 0.0);
    add_u64(cache, "used_bytes", st->cache_bytes);
    add_u64(cache, "entries", st->cache_entries);
    add_u64(cache, "hits", st->cache_hits);
    add_u64(cache, "misses", st->cache_misses);
    cJSON *ranks = cJSON_AddArrayToObject(root, "ranks");
    int n_ranks = h->plan ? h->plan->n_ranks : 1;
    for (int i = 0; i < n_ranks; i++) {
        const muse_rank_plan *ri = h->plan ? &h->plan->ranks[i] : NULL;
        cJSON *rank = cJSON_CreateObject();
        cJSON_AddNumberToObject(rank, "rank", i);
        cJSON_AddStringToObject(rank, "device", h->device ? h->device : "cpu");
        cJSON_AddStringToObject(rank, "arch", h->arch ? h->arch : "");
        cJSON_AddStringToObject(rank, "device_kind",
                                muse_device_kind_name(h->plan ? h->plan->device_kind : 0));
        cJSON *mem = cJSON_AddObjectToObject(rank, "memory");
        int dev = i < MUSE_PLAN_MAX_RANKS && h->rank_total[i]; /* a GPU's own memory */
        add_u64(mem, "total_bytes", dev ? h->rank_total[i] : h->total_bytes);
        /* the plan's device limit (0: none) and its sum of every term */
        add_u64(mem, "device_bytes", ri ? ri->device_bytes : 0);
        add_u64(mem, "planned_bytes", ri ? ri->total_bytes : 0);
        add_u64(mem, "pool_bytes", ri ? ri->pool_bytes : 0);
        add_u64(mem, "sliding_bytes",
                ri && ri->kv_bytes > ri->pool_bytes ? ri->kv_bytes - ri->pool_bytes : 0);
        add_u64(mem, "snapshots_bytes", ri ? ri->snapshots_bytes : 0);
        add_u64(mem, "request_bytes", ri ? ri->request_bytes : 0);
        add_u64(mem, "prompt_cache_budget_bytes", ri ? ri->prompt_cache_bytes : 0);
        add_u64(mem, "weights_bytes",
                ri && ri->weights_bytes ? ri->weights_bytes : h->weights_bytes);
        add_u64(mem, "kv_bytes", ri ? ri->kv_bytes : 0);
        add_u64(mem, "prompt_cache_bytes", st->cache_bytes);
        add_u64(mem, "workspace_bytes", ri ? ri->workspace_bytes : 0);
        add_u64(mem, "reserve_bytes", h->reserve_bytes);
        add_u64(mem, "free_bytes", dev ? h->rank_free[i] : h->free_bytes);
        add_u64(mem, "left_for_streams_bytes",
                ri ? muse_memory_plan_left(h->plan, i, st->kv_free_blocks, st->max - st->running)
                   : 0);
        add_u64(mem, "peak_bytes", h->peak_bytes);
        cJSON_AddItemToArray(ranks, rank);
    }
    cJSON *counters = cJSON_AddObjectToObject(root, "counters");
    add_u64(counters, "requests", st->requests);
    add_u64(counters, "tokens_in", st->tokens_in);
    add_u64(counters, "tokens_out", st->tokens_out);
    add_u64(counters, "errors", st->errors);
    add_u64(counters, "cancelled", st->cancelled);
    cJSON *hist = cJSON_AddObjectToObject(root, "histograms");
    cJSON_AddItemToObject(hist, "ttft_seconds", muse_hist_json(&st->ttft_seconds));
    cJSON_AddItemToObject(hist, "decode_tokens_per_second",
                          muse_hist_json(&st->decode_tokens_per_second));
    cJSON_AddItemToObject(hist, "round_rows", muse_hist_json(&st->round_rows));
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    MUSE_CHECK(json);
    return json;
}
