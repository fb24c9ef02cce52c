/* muse-engine serve: the engine process. Loads the pack, creates the shared-memory segment
 * and doorbell socket (ring_server), runs the scheduler, and publishes /health. */
#include "cmd/cmd_serve.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <getopt.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "base/cli.h"
#include "serve/prompt_cache.h"
#include "serve/scheduler.h"

typedef struct {
    const char *model, *tokenizer, *listen, *shm, *backend, *script, *model_id, *group;
    const char *config, *codebook; /* --synthetic-weights: the shape, the EXL3 codebook */
    long long synthetic, bits;     /* the seed (-1: none), EXL3 bits (0: fp16) */
    long long streams, queue, context, max_rows, threads, script_delay_ms, drain_ms, ranks;
    long long fault_after_tokens, fault_stall_after_tokens, fault_oom_request;
    long long fault_sticky_after_tokens, kv_blocks, keepalive_ms, request_kib;
    bool fault_heap_overflow;
    double reserve_gib, prompt_cache_gib;
} serve_flags;

static volatile sig_atomic_t stopping;
static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static const char serve_help[] =
    "usage: muse-engine serve --model DIR --listen SOCKET [--shm NAME] [--streams N] [--queue N]\n"
    "                         [--context N] [--max-rows N] [--threads N] [--model-id ID]\n"
    "                         [--group GROUP] [--reserve-gib X] [--drain-ms N]\n"
    "                         [--prompt-cache-gib X] [--kv-blocks N] [--request-kib N]\n"
    "                         [--backend cpu|script] [--tokenizer FILE] [--script FILE]\n"
    "Serves a pack to ngx_muse_module through a sealed memfd segment (--shm: its label, default "
    "/muse-engine)\n"
    "handed over a unix socket (--listen, 0660 for --group, the nginx workers' group).\n"
    "  --streams N      streams decoded together (lanes), default 4\n"
    "  --queue N        requests waiting behind them, default 16 (more get 503 with Retry-After)\n"
    "  --context N      positions a stream may hold, default min(max_position_embeddings, 4096)\n"
    "  --max-rows N     rows a round (prompt chunks + decode tokens), default 256\n"
    "  --ranks N        tensor-parallel ranks in this process (default 1; sums in rank order)\n"
    "  --threads N      threads for matrix products and for drawing the streams' tokens of a\n"
    "                   round, default one per core\n"
    "  --reserve-gib X  memory reserved for the rest of the machine, shown in /health\n"
    "                   (default: the MUSE_RESERVE_GIB environment variable, else 0)\n"
    "  --drain-ms N     on SIGTERM, how long running streams may finish, default 30000\n"
    "  --prompt-cache-gib X  prompt cache budget (KV blocks + sliding state), default 1; 0: off\n"
    "  --keepalive-ms N a stream silent this long (a long prompt, a long non-streaming answer)\n"
    "                   sends a keepalive, default 5000 (keep it under nginx's muse_idle_timeout)\n"
    "  --request-kib N  largest request (scope + compact JSON body) a slot holds, default 4100\n"
    "                   (4 MiB + 4 KiB: a prompt of the whole context fits); nginx answers larger\n"
    "                   ones 413 request_too_large. Keep client_max_body_size at or below it\n"
    "  --kv-blocks N    full-attention KV blocks of 16 positions in the pool; default: enough for\n"
    "                   every stream's whole context plus the prompt cache budget\n"
    "  --backend script replays token ids from --script FILE (a JSON array of id arrays) instead\n"
    "                   of running the model; request i gets list seed %% count. For tests.\n"
    "  --tokenizer      default DIR/tokenizer.json\n"
    "  --synthetic-weights SEED --config FILE [--bits B] [--codebook mul1|mcg|3inst]\n"
    "                   weights filled from SEED in memory for the shape of FILE (no pack;\n"
    "                   fp16, or EXL3 at B bits with the head at 6); needs --tokenizer\n";

static int bad(const char *msg)
{
    fprintf(stderr, "muse-engine serve: %s (see muse-engine serve --help)\n", msg);
    return 2;
}

static int parse_flags(int argc, char **argv, serve_flags *f)
{
    static const struct option opts[] = {{"model", 1, 0, 'm'},
                                         {"tokenizer", 1, 0, 'T'},
                                         {"listen", 1, 0, 'l'},
                                         {"shm", 1, 0, 's'},
                                         {"backend", 1, 0, 'b'},
                                         {"script", 1, 0, 'S'},
                                         {"model-id", 1, 0, 'i'},
                                         {"group", 1, 0, 'g'},
                                         {"streams", 1, 0, 'n'},
                                         {"queue", 1, 0, 'q'},
                                         {"context", 1, 0, 'c'},
                                         {"max-rows", 1, 0, 'r'},
                                         {"threads", 1, 0, 'j'},
                                         {"ranks", 1, 0, 'N'},
                                         {"synthetic-weights", 1, 0, 'Y'},
                                         {"config", 1, 0, 'C'},
                                         {"bits", 1, 0, 'B'},
                                         {"codebook", 1, 0, 'k'},
                                         {"script-delay-ms", 1, 0, 'd'},
                                         {"drain-ms", 1, 0, 'D'},
                                         {"reserve-gib", 1, 0, 'R'},
                                         {"prompt-cache-gib", 1, 0, 'P'},
                                         {"kv-blocks", 1, 0, 'K'},
                                         {"keepalive-ms", 1, 0, 'A'},
                                         {"request-kib", 1, 0, 'Q'},
#ifdef MUSE_TEST_HOOKS
                                         {"fault-after-tokens", 1, 0, 'F'},
                                         {"fault-stall-after-tokens", 1, 0, 'W'},
                                         {"fault-oom-request", 1, 0, 'O'},
                                         {"fault-sticky-after-tokens", 1, 0, 'X'},
                                         {"fault-heap-overflow", 0, 0, 'H'},
#endif
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *env_reserve = getenv("MUSE_RESERVE_GIB");
    *f = (serve_flags){.shm = "/muse-engine",
                       .backend = "cpu",
                       .streams = 4,
                       .ranks = 1,
                       .synthetic = -1,
                       .queue = 16,
                       .max_rows = 256,
                       .drain_ms = 30000,
                       .request_kib = 4100,
                       .prompt_cache_gib = 1,
                       .reserve_gib = env_reserve ? atof(env_reserve) : 0};
    muse_err e = {{0}};
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = 0;
        switch (ch) {
        case 'm':
            f->model = optarg;
            break;
        case 'T':
            f->tokenizer = optarg;
            break;
        case 'l':
            f->listen = optarg;
            break;
        case 's':
            f->shm = optarg;
            break;
        case 'b':
            f->backend = optarg;
            break;
        case 'S':
            f->script = optarg;
            break;
        case 'i':
            f->model_id = optarg;
            break;
        case 'g':
            f->group = optarg;
            break;
        case 'n':
            rc = muse_parse_long("--streams", optarg, 1, 4096, &f->streams, &e);
            break;
        case 'q':
            rc = muse_parse_long("--queue", optarg, 0, 4096, &f->queue, &e);
            break;
        case 'c':
            rc = muse_parse_long("--context", optarg, 1, 1 << 30, &f->context, &e);
            break;
        case 'r':
            rc = muse_parse_long("--max-rows", optarg, 1, 4096, &f->max_rows, &e);
            break;
        case 'j':
            rc = muse_parse_long("--threads", optarg, 0, 1024, &f->threads, &e);
            break;
        case 'N':
            rc = muse_parse_long("--ranks", optarg, 1, MUSE_MAX_RANKS, &f->ranks, &e);
            break;
        case 'Y':
            rc = muse_parse_long("--synthetic-weights", optarg, 0, INT64_MAX, &f->synthetic, &e);
            break;
        case 'C':
            f->config = optarg;
            break;
        case 'B':
            rc = muse_parse_long("--bits", optarg, 0, 8, &f->bits, &e);
            break;
        case 'k':
            f->codebook = optarg;
            break;
        case 'd':
            rc = muse_parse_long("--script-delay-ms", optarg, 0, 10000, &f->script_delay_ms, &e);
            break;
        case 'D':
            rc = muse_parse_long("--drain-ms", optarg, 0, 3600000, &f->drain_ms, &e);
            break;
        case 'F':
            rc = muse_parse_long("--fault-after-tokens", optarg, 1, 1 << 30, &f->fault_after_tokens,
                                 &e);
            break;
        case 'W':
            rc = muse_parse_long("--fault-stall-after-tokens", optarg, 1, 1 << 30,
                                 &f->fault_stall_after_tokens, &e);
            break;
        case 'O':
            rc = muse_parse_long("--fault-oom-request", optarg, 1, 1 << 30, &f->fault_oom_request,
                                 &e);
            break;
        case 'H':
            f->fault_heap_overflow = true;
            break;
        case 'X':
            rc = muse_parse_long("--fault-sticky-after-tokens", optarg, 1, 1 << 30,
                                 &f->fault_sticky_after_tokens, &e);
            break;
        case 'R':
            rc = muse_parse_double("--reserve-gib", optarg, 0, 1 << 20, &f->reserve_gib, &e);
            break;
        case 'P':
            rc = muse_parse_double("--prompt-cache-gib", optarg, 0, 1 << 20, &f->prompt_cache_gib,
                                   &e);
            break;
        case 'A':
            rc = muse_parse_long("--keepalive-ms", optarg, 10, 3600000, &f->keepalive_ms, &e);
            break;
        case 'Q':
            rc = muse_parse_long("--request-kib", optarg, 1, 65536, &f->request_kib, &e);
            break;
        case 'K':
            rc = muse_parse_long("--kv-blocks", optarg, 1, INT32_MAX, &f->kv_blocks, &e);
            break;
        case 'h':
            fputs(serve_help, stdout);
            return 0;
        default:
            return bad("unknown option or missing value");
        }
        if (rc) return bad(e.msg);
    }
    if (optind < argc) return bad("unexpected argument");
    if (!f->listen) return bad("--listen SOCKET is required");
    for (const char *p = f->model_id; p && *p; p++) /* it goes into JSON and headers as is */
        if (!(isalnum((unsigned char)*p) || strchr("-_.:/", *p)))
            return bad("--model-id may hold letters, digits and - _ . : / only");
    bool script = strcmp(f->backend, "script") == 0;
    if (!script && strcmp(f->backend, "cpu") != 0) return bad("--backend must be cpu or script");
    if (script && !f->script) return bad("--backend script needs --script FILE");
    if (f->synthetic >= 0 && f->model)
        return bad("--model and --synthetic-weights name the weights twice: give one");
    if (f->synthetic >= 0 && (!f->config || !f->tokenizer))
        return bad("--synthetic-weights SEED needs --config FILE and --tokenizer FILE");
    if (f->synthetic < 0 && (f->config || f->bits || f->codebook))
        return bad("--config, --bits and --codebook go with --synthetic-weights SEED");
    if (!script && !f->model && f->synthetic < 0)
        return bad("--model DIR (or --synthetic-weights SEED --config FILE) is required");
    if (script && !f->model && !f->tokenizer)
        return bad("--backend script needs --tokenizer FILE or --model DIR");
    return -1;
}

/* The script file: a JSON array of arrays of token ids. */
static int load_script(const char *path, int32_t ***seqs, size_t **lens, size_t *n, muse_err *e)
{
    char *buf;
    size_t len;
    if (muse_read_file(path, 64 << 20, &buf, &len, e)) return -1;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    int count = cJSON_IsArray(root) ? cJSON_GetArraySize(root) : 0;
    if (count <= 0) {
        cJSON_Delete(root);
        return muse_fail(e, "%s: --script must be a JSON array of token id arrays", path);
    }
    *seqs = MUSE_CALLOC((size_t)count, sizeof **seqs);
    *lens = MUSE_CALLOC((size_t)count, sizeof **lens);
    *n = (size_t)count;
    int i = 0;
    const cJSON *seq;
    cJSON_ArrayForEach(seq, root)
    {
        int m = cJSON_IsArray(seq) ? cJSON_GetArraySize(seq) : -1;
        if (m < 0) {
            cJSON_Delete(root);
            return muse_fail(e, "%s: entry %d of --script is not an array of token ids", path, i);
        }
        (*seqs)[i] = MUSE_MALLOC((size_t)(m ? m : 1) * sizeof(int32_t));
        (*lens)[i] = (size_t)m;
        int j = 0;
        const cJSON *id;
        cJSON_ArrayForEach(id, seq)
        {
            double v = cJSON_IsNumber(id) ? id->valuedouble : -1;
            if (v < 0 || v > INT32_MAX || v != (double)(int32_t)v) { /* "581" or 1.5 is no id */
                cJSON_Delete(root);
                return muse_fail(
                    e, "%s: entry %d, item %d of --script is not a token id (an integer >= 0)",
                    path, i, j);
            }
            (*seqs)[i][j++] = (int32_t)v;
        }
        i++;
    }
    cJSON_Delete(root);
    return 0;
}

typedef struct {
    muse_server *srv;
    muse_sched *sched;
    const serve_flags *f;
    const muse_model *model;
    const muse_backend *be;
    double started;
    /* 0 starting, 1 ok, 2 down. The pointers above are set before state becomes 1 (release)
     * and read only after it is seen (acquire). */
    _Atomic int state;
    _Atomic int quit;
} health_ctx;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* kB figure of a /proc file line ("MemAvailable:", "VmHWM:"), in bytes; 0 when absent. */
static uint64_t proc_kb(const char *path, const char *key)
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

static void publish_health(health_ctx *h)
{
    int state = atomic_load(&h->state);
    bool up = state != 0; /* the model, backend and scheduler exist */
    muse_sched_stats st = {0};
    if (up) muse_sched_stats_get(h->sched, &st);
    const serve_flags *f = h->f;
    uint64_t total = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t weights = up && h->model && h->model->st ? muse_st_total_bytes(h->model->st) : 0;
    const muse_rank_mem *r0 = up && h->be ? &h->be->ranks[0] : NULL;
    uint64_t kv = r0 ? r0->kv + r0->sliding : 0;
    uint64_t ws = r0 ? r0->workspace + r0->staging + r0->snapshots : 0;
    uint64_t reserve = (uint64_t)(f->reserve_gib * 1073741824.0);
    uint64_t avail = proc_kb("/proc/meminfo", "MemAvailable:");
    /* what admission can still hand out: free pool blocks, and the rings of the free lanes */
    uint64_t left = 0;
    if (up && h->be) {
        uint64_t pool = (uint64_t)h->be->kv.n_blocks * h->be->kv_block_bytes;
        uint64_t rings = kv > pool && f->streams ? (kv - pool) / (uint64_t)f->streams : 0;
        left = st.kv_free_blocks * h->be->kv_block_bytes + rings * (uint64_t)(st.max - st.running);
    }
    int busy = h->srv ? muse_server_busy_slots(h->srv) : 0;
    const char *status = state == 0   ? "starting"
                         : state == 2 ? "down"
                                      : (avail && avail < reserve ? "degraded" : "ok");
    char json[8192], hist[2][1024];
    if (muse_hist_json(&st.ttft_seconds, "ttft_seconds", hist[0], sizeof hist[0]) < 0 ||
        muse_hist_json(&st.decode_tokens_per_second, "decode_tokens_per_second", hist[1],
                       sizeof hist[1]) < 0)
        hist[0][0] = hist[1][0] = 0;
    int n = snprintf(
        json, sizeof json,
        "{\"status\":\"%s\",\"model\":\"%s\",\"engine\":{\"pid\":%d,\"version\":\"%s\",\"uptime_"
        "s\":%.0f,\"heartbeat_age_ms\":0,\"backend\":\"%s\"},"
        "\"streams\":{\"running\":%d,\"queued\":%d,\"max\":%d},\"context_length\":%lld,"
        "\"prompt_cache\":{\"gib\":%g,\"used_bytes\":%llu,\"entries\":%llu,\"hits\":%llu,"
        "\"misses\":%llu},"
        "\"ranks\":[{\"rank\":0,\"device\":\"cpu\",\"arch\":\"x86_64\",\"memory\":{\"total_bytes\":"
        "%llu,\"weights_bytes\":%llu,"
        "\"kv_bytes\":%llu,\"prompt_cache_bytes\":%llu,\"workspace_bytes\":%llu,\"reserve_bytes\":%"
        "llu,\"free_bytes\":%llu,"
        "\"left_for_streams_bytes\":%llu,\"peak_bytes\":%llu}}],"
        "\"counters\":{\"requests\":%llu,\"tokens_in\":%llu,\"tokens_out\":%llu,\"errors\":%llu,"
        "\"cancelled\":%llu},"
        "\"histograms\":{%s%s%s}}",
        status, f->model_id, (int)getpid(), MUSE_VERSION, now_s() - h->started, f->backend,
        st.running, busy > st.running ? busy - st.running : 0, st.max,
        (long long)(up ? f->context : 0), st.cache_budget ? f->prompt_cache_gib : 0.0,
        (unsigned long long)st.cache_bytes, (unsigned long long)st.cache_entries,
        (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses,
        (unsigned long long)total, (unsigned long long)weights, (unsigned long long)kv,
        (unsigned long long)st.cache_bytes, (unsigned long long)ws, (unsigned long long)reserve,
        (unsigned long long)avail, (unsigned long long)left,
        (unsigned long long)proc_kb("/proc/self/status", "VmHWM:"), (unsigned long long)st.requests,
        (unsigned long long)st.tokens_in, (unsigned long long)st.tokens_out,
        (unsigned long long)st.errors, (unsigned long long)st.cancelled, hist[0],
        hist[0][0] && hist[1][0] ? "," : "", hist[0][0] ? hist[1] : "");
    if (n > 0 && (size_t)n < sizeof json) muse_server_set_health(h->srv, json, (size_t)n);
}

/* The heartbeat and /health page, four times a second, whatever the scheduler is doing. */
static void *health_main(void *p)
{
    health_ctx *h = p;
    while (!atomic_load(&h->quit)) {
        publish_health(h);
        struct timespec ts = {0, 250000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int muse_cmd_serve(int argc, char **argv)
{
    serve_flags f;
    int rc = parse_flags(argc, argv, &f);
    if (rc >= 0) return rc;
    bool script = strcmp(f.backend, "script") == 0;
    muse_err e = {{0}};
    char tokpath[4096];
    if (!f.tokenizer) {
        snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", f.model);
        f.tokenizer = tokpath;
    }
    if (!f.model_id) f.model_id = "muse-spark";
    gid_t gid = (gid_t)-1;
    if (f.group) {
        struct group *g = getgrnam(f.group);
        if (!g) return bad("--group names no group on this machine");
        gid = g->gr_gid;
    }
    muse_model model = {0};
    muse_backend *be = NULL;
    muse_forward *fwd = NULL;
    muse_tokenizer *tok = NULL;
    muse_server *srv = NULL;
    muse_sched *sched = NULL;
    int32_t **script_seqs = NULL;
    size_t *script_lens = NULL, n_script = 0;
    pthread_t health_tid;
    health_ctx h = {.f = &f, .started = now_s()};
    bool health_running = false;
    rc = 1;
#ifdef MUSE_TEST_HOOKS
    if (f.fault_heap_overflow) { /* test builds: proves the sanitizer build reports */
        volatile size_t past = 16;
        char *small = MUSE_MALLOC(16);
        memset(small, 1, 16);
        fprintf(stderr, "muse-engine serve: read %d past a 16-byte block\n", small[past]);
        free(small);
    }
#endif

    muse_server_opts so = {.shm_name = f.shm,
                           .socket_path = f.listen,
                           .slots = (int)(f.streams + f.queue),
                           .request_bytes = (size_t)f.request_kib * 1024,
                           .socket_gid = (int)gid};
    if (muse_server_start(&so, &srv, &e)) goto fail;
    h.srv = srv;
    publish_health(&h);
    if (pthread_create(&health_tid, NULL, health_main, &h) == 0) health_running = true;
    if (muse_tokenizer_load(f.tokenizer, &tok, &e)) goto fail;
    if (script) {
        if (load_script(f.script, &script_seqs, &script_lens, &n_script, &e)) goto fail;
        if (!f.context) f.context = 4096;
    } else {
        muse_synthetic syn = {f.config, (uint64_t)f.synthetic, (int)f.bits, f.codebook};
        if (f.synthetic >= 0 ? muse_model_synthetic(&syn, &model, &e)
                             : muse_model_load(f.model, &model, &e))
            goto fail;
        h.model = &model;
        if (!f.context)
            f.context =
                model.cfg.max_position_embeddings < 4096 ? model.cfg.max_position_embeddings : 4096;
        if (f.context > model.cfg.max_position_embeddings) {
            muse_fail(&e, "--context %lld exceeds the pack's max_position_embeddings %lld",
                      f.context, (long long)model.cfg.max_position_embeddings);
            goto fail;
        }
        /* the pool holds every stream's context, plus what the prompt cache may keep */
        int ranks = (int)f.ranks; /* the pool and the cache are sized a rank */
        uint64_t block_bytes =
            MUSE_KV_BLOCK *
            muse_kv_rank_bytes(&model.cfg, muse_kv_full_bytes_per_token(&model.cfg), ranks);
        int64_t per_seq = (f.context + MUSE_KV_BLOCK - 1) / MUSE_KV_BLOCK;
        int64_t blocks = f.kv_blocks ? f.kv_blocks : f.streams * per_seq;
        if (!f.kv_blocks && block_bytes)
            blocks += (int64_t)(f.prompt_cache_gib * 1073741824.0 / (double)block_bytes);
        if (blocks > INT32_MAX) blocks = INT32_MAX;
        uint64_t cache_bytes = (uint64_t)(f.prompt_cache_gib * 1073741824.0);
        muse_backend_opts bo = {
            .max_rows = (long)f.max_rows,
            .max_seqs = (int)f.streams,
            .context = f.context,
            .threads = (int)f.threads,
            .ranks = (int)f.ranks,
            .kv_blocks = blocks,
            .snapshot_slots = muse_pcache_slots_for(
                cache_bytes,
                muse_kv_rank_bytes(&model.cfg, muse_kv_snapshot_bytes(&model.cfg), ranks))};
        if (!(be = muse_backend_create(f.backend, &model, &bo, &e))) goto fail;
        h.be = be;
        fwd = muse_forward_create(be);
    }
    muse_sched_opts o = {.streams = (int)f.streams,
                         .max_rows = (long)f.max_rows,
                         .context = f.context,
                         .model_id = f.model_id,
                         .script = (const int32_t *const *)script_seqs,
                         .script_len = script_lens,
                         .n_script = n_script,
                         .script_delay_ms = (int)f.script_delay_ms,
                         .fault_after_tokens = (long)f.fault_after_tokens,
                         .fault_stall_after_tokens = (long)f.fault_stall_after_tokens,
                         .fault_oom_request = (long)f.fault_oom_request,
                         .fault_sticky_after_tokens = (long)f.fault_sticky_after_tokens,
                         .prompt_cache_bytes = (uint64_t)(f.prompt_cache_gib * 1073741824.0),
                         .keepalive_ms = (int)f.keepalive_ms};
    if (!(sched = muse_sched_create(&o, fwd, script ? NULL : &model.cfg, tok, srv, &e))) goto fail;
    h.sched = sched;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    muse_server_set_state(srv, MUSE_ENGINE_SERVING);
    atomic_store(&h.state, 1);
    fprintf(stderr,
            "muse-engine serve: serving %s on %s (%lld streams, context %lld, %s backend)\n",
            f.model_id, f.listen, f.streams, f.context, f.backend);
    muse_sched_run(sched, &stopping, (int)f.drain_ms);
    atomic_store(&h.state, 2);
    fprintf(stderr, "muse-engine serve: drained, shutting down\n");
    rc = 0;
fail:
    if (rc) fprintf(stderr, "muse-engine serve: %s\n", e.msg);
    atomic_store(&h.quit, 1);
    if (health_running) pthread_join(health_tid, NULL);
    if (srv) muse_server_set_state(srv, rc ? MUSE_ENGINE_FATAL : MUSE_ENGINE_DOWN);
    muse_server_stop(srv);
    muse_sched_destroy(sched);
    muse_forward_destroy(fwd);
    muse_backend_destroy(be);
    if (model.st) muse_model_free(&model);
    muse_tokenizer_free(tok);
    for (size_t i = 0; i < n_script; i++) free(script_seqs[i]);
    free(script_seqs);
    free(script_lens);
    return rc ? 2 : 0;
}
