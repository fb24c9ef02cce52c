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
    is_int(r->request_bytes, 2 * 20LL * 4100 * 1024,
           "request areas: 20 slots x 4100 KiB, shared and private copy");

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
    muse_memory_plan_measured(&p, 0, 5000, 16384 * 16 + 4 * 1000, 16384 * 16, 777, 0);
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
    muse_memory_plan_measured(&p, 0, 5000, 100, 16384 * 16, 0, 0);
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
    muse_memory_plan_measured(&p, 0, 5000, 16384 * 16 + 4 * 1000, 16384 * 16, 777, 0);
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
    st.round_rows =
        (muse_hist){.n = 3, .le = {1, 8, 64}, .counts = {5, 7, 9}, .count = 10, .sum = 300};
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
                  {"histograms.decode_tokens_per_second.count", 0},
                  {"histograms.round_rows.le.2", 64},
                  {"histograms.round_rows.counts.2", 9},
                  {"histograms.round_rows.count", 10}};
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

/* Reserve defaults by device kind, the fit check and the context that fits. */
static void plan_fit(void)
{
    const uint64_t G = 1ull << 30;
    is_int(muse_reserve_default_bytes(MUSE_DEVICE_CPU, 64 * G), 0, "cpu: no reserve by default");
    is_int(muse_reserve_default_bytes(MUSE_DEVICE_DISCRETE, 16 * G), G,
           "discrete 16 GiB: the 1 GiB floor (1/32 is 0.5)");
    is_int(muse_reserve_default_bytes(MUSE_DEVICE_DISCRETE, 141 * G), 141 * G / 32,
           "discrete 141 GiB: 1/32 of it");
    is_int(muse_reserve_default_bytes(MUSE_DEVICE_UNIFIED, 16 * G), 4 * G,
           "unified 16 GiB: the 4 GiB floor");
    is_int(muse_reserve_default_bytes(MUSE_DEVICE_UNIFIED, 128 * G), 128 * G / 10,
           "unified 128 GiB: 1/10 of it");
    double gib = -2;
    muse_err e = {{0}};
    unsetenv(MUSE_RESERVE_ENV);
    ok(muse_reserve_resolve(2.5, MUSE_DEVICE_DISCRETE, 141 * G, &gib, &e) == 0 && gib == 2.5,
       "--reserve-gib wins");
    setenv(MUSE_RESERVE_ENV, "3", 1);
    ok(muse_reserve_resolve(-1, MUSE_DEVICE_DISCRETE, 141 * G, &gib, &e) == 0 && gib == 3,
       "then " MUSE_RESERVE_ENV);
    setenv(MUSE_RESERVE_ENV, "lots", 1);
    ok(muse_reserve_resolve(-1, MUSE_DEVICE_CPU, 0, &gib, &e) == -1 &&
           strstr(e.msg, MUSE_RESERVE_ENV "=lots") != NULL,
       "a bad " MUSE_RESERVE_ENV " is refused by name: %s", e.msg);
    unsetenv(MUSE_RESERVE_ENV);
    ok(muse_reserve_resolve(-1, MUSE_DEVICE_UNIFIED, 16 * G, &gib, &e) == 0 && gib == 4,
       "else the device's default");

    /* one full layer of 2 KV heads x 64: 512 bytes a position; a block of 16 is 8 KiB */
    static muse_config c;
    c.vocab_size = 256, c.hidden_size = 128, c.num_layers = 2, c.n_heads = 2, c.n_kv_heads = 2;
    c.head_dim = 64, c.attn_kind[0] = MUSE_ATTN_FULL, c.attn_kind[1] = MUSE_ATTN_SLIDING;
    c.sliding_window = 8, c.mlp_kind[0] = c.mlp_kind[1] = MUSE_MLP_DENSE;
    c.intermediate_size = 256, c.max_position_embeddings = 100000;
    muse_memory_opts o = {.streams = 1,
                          .context = 1024,
                          .cfg = &c,
                          .max_rows = 16,
                          .reserve_gib = -1,
                          .device_kind = MUSE_DEVICE_CPU};
    muse_memory_plan p;
    muse_memory_plan_make(&o, &p);
    const muse_rank_plan *r = &p.ranks[0];
    is_int(r->kv_block_bytes, 8192, "config: a block is 16 x 512 bytes");
    is_int(r->pool_bytes, 64 * 8192, "the pool: 64 blocks of 8 KiB");
    is_int(r->kv_bytes - r->pool_bytes, 23 * 256 * 2, "the ring: 8 + 16 - 1 positions of K+V");
    is_int(r->reserve_bytes, 0, "cpu: no reserve");
    /* weights: embed 256x128 + final norm, 4 norms a layer, q k v gate o 128x128, MLP 3x128x256 */
    uint64_t w = 256 * 128 * 2 + 128 * 2 +
                 2 * (4 * 128 * 2 + 5 * 128 * 128 * 2 + 3 * 128 * 256 * 2) + 128 * 256 * 2;
    is_int(r->weights_bytes, w, "fp16 weights: every tensor's bytes");
    ok(r->total_bytes == r->weights_bytes + r->kv_bytes + r->snapshots_bytes + r->workspace_bytes +
                             r->request_bytes + r->reserve_bytes,
       "the total is every term");
    ok(muse_memory_plan_misfit(&p) == -1, "no device limit: fits");
    is_int(muse_memory_plan_context_fits(&o, 4), 100000, "no limit: max_position_embeddings");
    o.device_bytes = r->total_bytes;
    muse_memory_plan_make(&o, &p);
    ok(muse_memory_plan_misfit(&p) == -1, "a device of exactly the total: fits");
    o.device_bytes = r->total_bytes - 1;
    muse_memory_plan_make(&o, &p);
    ok(muse_memory_plan_misfit(&p) == 0, "one byte less: rank 0 does not fit");
    char text[2048];
    muse_memory_plan_refusal(&p, text, sizeof text);
    ok(strstr(text, "weights") && strstr(text, "kv pool") && strstr(text, "reserve") &&
           strstr(text, "--streams") && strstr(text, "--context") &&
           strstr(text, "--prompt-cache-gib") && strstr(text, "--reserve-gib"),
       "the refusal names the terms and the flags: %s", text);
    /* the device leaves room for the fixed terms plus 100 blocks of one stream */
    o.device_bytes = p.ranks[0].total_bytes - r->pool_bytes + 100 * 8192 + 4000;
    int64_t one = muse_memory_plan_context_fits(&o, 1);
    ok(one % 16 == 0 && one > 0, "context that fits at 1 stream: whole blocks (%lld)",
       (long long)one);
    o.context = one;
    muse_memory_plan_make(&o, &p);
    ok(muse_memory_plan_misfit(&p) == -1, "... and it fits");
    o.context = one + 16;
    muse_memory_plan_make(&o, &p);
    ok(muse_memory_plan_misfit(&p) == 0, "... one block more does not");
    o.context = 1024;
    ok(muse_memory_plan_context_fits(&o, 4) < one, "4 streams fit less context each");
    o.device_bytes = 1000;
    is_int(muse_memory_plan_context_fits(&o, 1), 0, "a device too small for the weights: 0");
    o = (muse_memory_opts){.streams = 1,
                           .context = 64,
                           .cfg = &c,
                           .reserve_gib = -1,
                           .device_kind = MUSE_DEVICE_DISCRETE,
                           .device_bytes = 64 * G};
    muse_memory_plan_make(&o, &p);
    is_int(p.ranks[0].reserve_bytes, 2 * G, "discrete 64 GiB: reserve 2 GiB in the plan");
}

int main(void)
{
    plan_fit();
    plan_arithmetic();
    health_json();
    return done_testing();
}
