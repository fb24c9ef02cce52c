/* The memory plan's arithmetic (pool blocks, budgets, what is left for streams) and the /health
 * JSON built from it: every field, with the values it was given. */
#include <cjson/cJSON.h>

#include "serve/health.h"
#include "serve/memory_plan.h"
#include "tap.h"

static double num(const cJSON *o, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *part = strtok(buf, "."); part && o; part = strtok(NULL, "."))
        o = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, atoi(part))
                             : cJSON_GetObjectItemCaseSensitive(o, part);
    return cJSON_IsNumber(o) ? o->valuedouble : -1;
}

static void plan_arithmetic(void)
{
    /* 3072 bytes a position: a block of 16 is 49152; context 100 needs 7 blocks a stream */
    muse_memory_opts o = {.streams = 4,
                          .queue = 16,
                          .context = 100,
                          .prompt_cache_gib = 0.5,
                          .reserve_gib = 2,
                          .request_bytes = 4100 * 1024,
                          .kv_bytes_per_token = 3072};
    muse_memory_plan p;
    muse_memory_plan_make(&o, &p);
    is_int(p.n_ranks, 1, "one rank today");
    is_int(p.slots, 20, "slots: streams + queue");
    const muse_rank_plan *r = &p.ranks[0];
    is_int(r->kv_block_bytes, 49152, "a block: 16 positions x 3072 bytes");
    is_int(r->blocks_per_stream, 7, "a stream's context of 100: 7 blocks of 16 (rounded up)");
    is_int(r->cache_blocks, 10922, "0.5 GiB of prompt cache: 536870912 / 49152 = 10922 blocks");
    is_int(r->kv_blocks, 4 * 7 + 10922, "the pool: every stream's context + the cache's blocks");
    is_int(r->prompt_cache_bytes, 536870912, "the prompt cache budget in bytes");
    is_int(r->reserve_bytes, 2147483648LL, "the reserve in bytes");
    is_int(r->request_bytes, 20LL * 4100 * 1024, "request areas: 20 slots x 4100 KiB");

    o.kv_blocks = 64;
    muse_memory_plan_make(&o, &p);
    is_int(p.ranks[0].kv_blocks, 64, "--kv-blocks sets the pool as given");
    is_int(p.ranks[0].cache_blocks, 0, "... and the cache adds nothing to it");

    o.kv_blocks = 0;
    o.streams = 4096;
    o.context = 1 << 30;
    muse_memory_plan_make(&o, &p);
    is_int(p.ranks[0].kv_blocks, INT32_MAX, "a pool past INT32_MAX blocks is capped");

    o = (muse_memory_opts){.streams = 2, .context = 4096, .prompt_cache_gib = 1};
    muse_memory_plan_make(&o, &p);
    ok(p.ranks[0].kv_block_bytes == 0 && p.ranks[0].cache_blocks == 0,
       "no model (script backend): no KV blocks and no division by zero");

    /* left for streams: free blocks, plus the rings of the free lanes */
    o = (muse_memory_opts){.streams = 4, .context = 64, .kv_bytes_per_token = 1024};
    muse_memory_plan_make(&o, &p);
    muse_memory_plan_measured(&p, 0, 5000, 16384 * 16 + 4 * 1000, 16384 * 16, 777);
    is_int(p.ranks[0].workspace_bytes, 777, "the measured workspace is kept");
    is_int(p.ranks[0].weights_bytes, 5000, "the measured weights are kept");
    muse_memory_opts o2 = o;
    o2.ranks = 2;
    muse_memory_plan p2;
    muse_memory_plan_make(&o2, &p2);
    ok(p2.n_ranks == 2 && p2.ranks[1].rank == 1 && p2.ranks[1].kv_blocks == p2.ranks[0].kv_blocks,
       "two ranks: each plans the same pool");
    is_int(muse_memory_plan_left(&p, 0, 5, 3), 5 * 16384 + 3 * 1000,
           "left: 5 free blocks of 16 KiB + 3 free lanes' rings of 1000 bytes");
    is_int(muse_memory_plan_left(&p, 0, 0, -1), 0, "no free lanes, no free blocks: nothing left");
    is_int(muse_memory_plan_left(&p, 1, 5, 3), 0, "a rank the plan has not: nothing");
    muse_memory_plan_measured(&p, 0, 5000, 100, 16384 * 16, 0);
    is_int(muse_memory_plan_left(&p, 0, 1, 4), 16384, "a pool larger than kv_bytes: no rings");

    char text[1024];
    size_t n = muse_memory_plan_text(&p, text, sizeof text);
    ok(n == strlen(text) && strstr(text, "rank 0: ") == text && strstr(text, "16 blocks"),
       "the start-up text names the rank and the pool's blocks: %s", text);
    n = muse_memory_plan_text(&p, text, 10);
    ok(n == 9 && strlen(text) == 9, "a short buffer: the text is cut, still terminated");
}

static void health_json(void)
{
    muse_memory_opts o = {.streams = 4, .context = 64, .kv_bytes_per_token = 1024};
    muse_memory_plan p;
    muse_memory_plan_make(&o, &p);
    muse_memory_plan_measured(&p, 0, 5000, 16384 * 16 + 4 * 1000, 16384 * 16, 777);
    muse_sched_stats st = {.running = 1,
                           .max = 4,
                           .requests = 9,
                           .tokens_in = 100,
                           .tokens_out = 50,
                           .errors = 2,
                           .cancelled = 1,
                           .cache_budget = 1,
                           .cache_bytes = 4096,
                           .cache_entries = 3,
                           .cache_hits = 5,
                           .cache_misses = 6,
                           .kv_free_blocks = 5};
    st.ttft_seconds =
        (muse_hist){.n = 2, .le = {0.5, 1}, .counts = {1, 3}, .count = 4, .sum = 1.25};
    muse_health h = {.status = muse_health_status(1, 10, 5),
                     .model_id = "muse-spark",
                     .backend = "cpu",
                     .pid = 42,
                     .uptime_s = 12.4,
                     .queued = 2,
                     .context_length = 64,
                     .prompt_cache_gib = 0.5,
                     .st = &st,
                     .plan = &p,
                     .total_bytes = 68719476736ULL,
                     .weights_bytes = 123456789,
                     .reserve_bytes = 5,
                     .free_bytes = 10,
                     .peak_bytes = 999};
    char *json = muse_health_json(&h);
    cJSON *root = cJSON_Parse(json);
    ok(root != NULL, "/health is JSON");
    is_str(cJSON_GetStringValue(cJSON_GetObjectItem(root, "status")), "ok", "status ok");
    is_str(cJSON_GetStringValue(cJSON_GetObjectItem(root, "model")), "muse-spark", "model");
    is_str(
        cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "engine"), "backend")),
        "cpu", "engine.backend");
    is_str(
        cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "engine"), "version")),
        MUSE_VERSION, "engine.version");
    const struct {
        const char *path;
        double want;
    } fields[] = {{"engine.pid", 42},
                  {"engine.uptime_s", 12},
                  {"engine.heartbeat_age_ms", 0},
                  {"streams.running", 1},
                  {"streams.queued", 2},
                  {"streams.max", 4},
                  {"context_length", 64},
                  {"prompt_cache.gib", 0.5},
                  {"prompt_cache.used_bytes", 4096},
                  {"prompt_cache.entries", 3},
                  {"prompt_cache.hits", 5},
                  {"prompt_cache.misses", 6},
                  {"ranks.0.rank", 0},
                  {"ranks.0.memory.total_bytes", 68719476736.0},
                  {"ranks.0.memory.weights_bytes", 5000}, /* the rank's own, measured */
                  {"ranks.0.memory.kv_bytes", 16384 * 16 + 4000},
                  {"ranks.0.memory.prompt_cache_bytes", 4096},
                  {"ranks.0.memory.workspace_bytes", 777},
                  {"ranks.0.memory.reserve_bytes", 5},
                  {"ranks.0.memory.free_bytes", 10},
                  {"ranks.0.memory.left_for_streams_bytes", 5 * 16384 + 3 * 1000},
                  {"ranks.0.memory.peak_bytes", 999},
                  {"counters.requests", 9},
                  {"counters.tokens_in", 100},
                  {"counters.tokens_out", 50},
                  {"counters.errors", 2},
                  {"counters.cancelled", 1},
                  {"histograms.ttft_seconds.le.1", 1},
                  {"histograms.ttft_seconds.counts.1", 3},
                  {"histograms.ttft_seconds.sum", 1.25},
                  {"histograms.ttft_seconds.count", 4},
                  {"histograms.decode_tokens_per_second.count", 0}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        ok(num(root, fields[i].path) == fields[i].want, "%s = %g (got %g)", fields[i].path,
           fields[i].want, num(root, fields[i].path));
    ok(strstr(json, "\"total_bytes\":68719476736,") != NULL, "large byte counts print whole");
    cJSON_Delete(root);
    free(json);

    h.status = muse_health_status(0, 10, 5);
    h.plan = NULL;
    st.cache_budget = 0;
    json = muse_health_json(&h);
    root = cJSON_Parse(json);
    is_str(cJSON_GetStringValue(cJSON_GetObjectItem(root, "status")), "starting",
           "state 0: starting");
    ok(num(root, "ranks.0.memory.kv_bytes") == 0 &&
           num(root, "ranks.0.memory.left_for_streams_bytes") == 0,
       "no plan yet: no KV and nothing left");
    ok(num(root, "prompt_cache.gib") == 0, "no cache budget: gib 0");
    cJSON_Delete(root);
    free(json);
    is_str(muse_health_status(1, 4, 5), "degraded", "less free than the reserve: degraded");
    is_str(muse_health_status(1, 0, 5), "ok", "free unknown (0): ok");
    is_str(muse_health_status(2, 10, 5), "down", "state 2: down");
}

int main(void)
{
    plan_arithmetic();
    health_json();
    return done_testing();
}
