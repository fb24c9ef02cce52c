/* muse-engine serve: the engine process. Loads the pack, creates the shared-memory segment
 * and doorbell socket (ring_server), runs the scheduler, and publishes /health. */
#include "cmd/cmd_serve.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/flags.h"
#include "base/keyfile.h"
#include "serve/health.h"
#include "serve/memory_plan.h"
#include "serve/prompt_cache.h"
#include "serve/scheduler.h"
#include "tp/follow.h"
#include "tp/rendezvous.h"

/* --max-rows not given on a GPU: the largest of these powers of two the plan fits. A lone
 * prompt is read faster in larger rounds (the one-GPU shape on the H200, a 4096-token prompt:
 * 1295 tok/s in rounds of 256, 2076 in rounds of 2048) for workspace the plan counts. */
#define AUTO_ROWS_LEAST 256
#define AUTO_ROWS_MOST  2048

typedef struct {
    const char *model, *tokenizer, *listen, *shm, *backend, *script, *model_id, *group;
    const char *worker_key;        /* --worker-key FILE */
    const char *config, *codebook; /* --synthetic-weights: the shape, the EXL3 codebook */
    const char *gpus;              /* --gpus LIST */
    const char *kernels_text;      /* --kernels */
    muse_kernels kernels;
    int devices[MUSE_MAX_RANKS]; /* each rank's GPU, from --gpus */
    long long synthetic, bits;   /* the seed (-1: none), EXL3 bits (0: fp16) */
    long long streams, queue, context, max_rows, busy_rows, threads, script_delay_ms, drain_ms;
    int auto_rows; /* --max-rows not given on --backend cuda in one process: size_plan picks it */
    long long ranks;
    long long fault_after_tokens, fault_stall_after_tokens, fault_oom_request;
    long long fault_sticky_after_tokens, kv_blocks, keepalive_ms, request_kib;
    bool fault_heap_overflow;
    double reserve_gib, prompt_cache_gib;
    double device_gib;            /* a rank's device memory; 0: no limit, no check */
    char device_src[192];         /* where device_gib came from, for the refusal */
    muse_device_kind device_kind; /* by backend: the reserve's default follows it */
    gid_t gid;                    /* of --group; -1: none */
    muse_tp_flags tp;             /* --tp-*: one rank of a world of processes */
} serve_flags;

static volatile sig_atomic_t stopping;
static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static const char *const backends[] = {"cpu", "script", "cuda", NULL};

/* Returns -1 when the flags are complete, else the exit code. */
static int parse_flags(int argc, char **argv, serve_flags *f)
{
    *f = (serve_flags){.shm = "/muse-engine",
                       .gid = (gid_t)-1,
                       .streams = 4,
                       .ranks = 0, /* not given: 1, or the count of --gpus */
                       .synthetic = -1,
                       .queue = 16,
                       .max_rows = 0,  /* not given: auto_rows, then size_plan */
                       .busy_rows = 0, /* not given: min(256, --max-rows) */
                       .drain_ms = 30000,
                       .request_kib = 4100,
                       .prompt_cache_gib = 1,
                       .reserve_gib = -1,
                       .tp = {.rank = -1}};
    int backend = 0;
    const muse_flag table[] = {
        MUSE_FLAG_S("model", &f->model, "DIR", "the pack (not with --backend script)"),
        MUSE_FLAG_S("listen", &f->listen, "SOCKET",
                    "the doorbell socket nginx connects to (required; not on --tp-rank > 0)"),
        MUSE_FLAG_S("shm", &f->shm, "NAME", "the shared-memory segment"),
        MUSE_FLAG_L("streams", &f->streams, 1, 4096, "N", "streams decoded together (lanes)"),
        MUSE_FLAG_L("queue", &f->queue, 0, 4096, "N",
                    "requests waiting behind them (more get 503 with Retry-After)"),
        MUSE_FLAG_L("context", &f->context, 1, 1 << 30, "N", "positions a stream may hold",
                    .def = "min(max_position_embeddings, 4096)"),
        MUSE_FLAG_L("max-rows", &f->max_rows, 1, 4096, "N",
                    "rows a round (prompt chunks + decode tokens); sizes the workspace",
                    .def = "--backend cuda in one process: the most of 2048, 1024, 512 and 256\n"
                           "that the memory plan fits; else 256"),
        MUSE_FLAG_L("busy-rows", &f->busy_rows, 1, 4096, "N",
                    "rows a round while streams decode, their tokens among them (a\n"
                    "stream's gap between tokens is one such round; prompts get at least\n"
                    "half); at most --max-rows",
                    .def = "min(256, --max-rows)"),
        MUSE_FLAG_L("ranks", &f->ranks, 1, MUSE_MAX_RANKS, "N",
                    "tensor-parallel ranks in this process (sums in rank order); the config\n"
                    "must allow it (heads divisible, split widths multiples of 128)",
                    .def = "1, or the count of --gpus"),
        MUSE_KERNELS_FLAG(&f->kernels_text),
        MUSE_FLAG_S("gpus", &f->gpus, "LIST",
                    "--backend cuda: the GPU of each rank, comma-separated (0, 0,0, 0,1);\n"
                    "sets --ranks to the count",
                    .def = "every rank on GPU 0"),
        MUSE_FLAG_L("synthetic-weights", &f->synthetic, 0, INT64_MAX, "SEED",
                    "weights filled from SEED in memory for the shape of --config (no pack;\n"
                    "the tensors muse-pack --seed SEED writes); needs --tokenizer",
                    .def = "off"),
        MUSE_FLAG_S("config", &f->config, "FILE", "the shape --synthetic-weights fills"),
        MUSE_FLAG_L("bits", &f->bits, 0, 8, "B",
                    "--synthetic-weights: EXL3 at B bits (the head at 6); 0: fp16"),
        MUSE_FLAG_S("codebook", &f->codebook, "mul1|mcg|3inst",
                    "--synthetic-weights: the EXL3 codebook", .def = "mul1"),
        MUSE_FLAG_L("threads", &f->threads, 0, 1024, "N",
                    "threads for matrix products and for drawing the streams' tokens of a\n"
                    "round",
                    .def = "0: one per core"),
        MUSE_FLAG_S("model-id", &f->model_id, "ID",
                    "the model name in answers (letters, digits and - _ . : /)",
                    .def = "muse-spark"),
        MUSE_FLAG_S("group", &f->group, "GROUP",
                    "the group (the nginx workers') the segment and socket are 0660 for"),
        MUSE_FLAG_S("worker-key", &f->worker_key, "FILE",
                    "a key file (this user's, mode 0600) nginx's master reads too: only a peer\n"
                    "that answers the socket's challenge with its HMAC gets the segment"),
        MUSE_FLAG_G("reserve-gib", &f->reserve_gib, 1 << 20,
                    "memory kept back on each rank's device, counted in the plan and shown in\n"
                    "/health",
                    .def = MUSE_RESERVE_ENV
                    ", else by device: 0 on the CPU backend, max(1 GiB,\n"
                    "1/32) on a discrete GPU, max(4 GiB, 1/10) on a unified one"),
        MUSE_FLAG_G("device-gib", &f->device_gib, 1 << 20,
                    "memory of each rank's device: the plan must fit it or the engine refuses\n"
                    "to start (exit 2) naming every term; 0: no limit, no check. On the CPU\n"
                    "backend the ranks share the machine: give each rank's share. On --backend\n"
                    "cuda: the GPU's memory (split evenly among ranks on one GPU), or this\n"
                    "where smaller",
                    .def = "0 (cuda: the GPU's)"),
        MUSE_FLAG_L("drain-ms", &f->drain_ms, 0, 3600000, "N",
                    "on SIGTERM, how long running streams may finish"),
        MUSE_FLAG_G("prompt-cache-gib", &f->prompt_cache_gib, 1 << 20,
                    "prompt cache budget (KV blocks + sliding state); 0: off"),
        MUSE_FLAG_L("keepalive-ms", &f->keepalive_ms, 10, 3600000, "N",
                    "a stream silent this long (a long prompt, a long non-streaming answer)\n"
                    "sends a keepalive (keep it under nginx's muse_idle_timeout)",
                    .def = "5000"),
        MUSE_FLAG_L("request-kib", &f->request_kib, 1, 65536, "N",
                    "largest request (scope + compact JSON body) a slot holds (4 MiB + 4 KiB:\n"
                    "a prompt of the whole context fits); nginx answers larger ones 413\n"
                    "request_too_large. Keep client_max_body_size at or below it"),
        MUSE_FLAG_L("kv-blocks", &f->kv_blocks, 1, INT32_MAX, "N",
                    "full-attention KV blocks of 16 positions in the pool",
                    .def = "enough for every stream's whole context plus the prompt cache"),
        MUSE_FLAG_E("backend", &backend, backends,
                    "cuda runs the model on the GPU (binaries built with nvcc);\n"
                    "script replays token ids from --script FILE (a JSON array of id arrays)\n"
                    "instead of running the model; request i gets list seed % count. For tests"),
        MUSE_FLAG_S("tokenizer", &f->tokenizer, "FILE", "the tokenizer",
                    .def = "DIR/tokenizer.json"),
        MUSE_FLAG_S("script", &f->script, "FILE", "the token ids --backend script replays"),
        MUSE_TP_FLAG_ENTRIES(&f->tp),
        MUSE_FLAG_L("script-delay-ms", &f->script_delay_ms, 0, 10000, "N",
                    "--backend script: a pause before each token"),
#ifdef MUSE_TEST_HOOKS
        MUSE_FLAG_L("fault-after-tokens", &f->fault_after_tokens, 1, 1 << 30, "N",
                    "test builds: a round fails after N tokens"),
        MUSE_FLAG_L("fault-stall-after-tokens", &f->fault_stall_after_tokens, 1, 1 << 30, "N",
                    "test builds: the scheduler stalls after N tokens"),
        MUSE_FLAG_L("fault-oom-request", &f->fault_oom_request, 1, 1 << 30, "N",
                    "test builds: request N finds no memory"),
        MUSE_FLAG_L("fault-sticky-after-tokens", &f->fault_sticky_after_tokens, 1, 1 << 30, "N",
                    "test builds: a sticky device error after N tokens"),
        MUSE_FLAG_B("fault-heap-overflow", &f->fault_heap_overflow,
                    "test builds: read past a heap block (the sanitizer build reports it)"),
#endif
    };
    const muse_flags set = {.prog = "muse-engine serve",
                            .usage = "--model DIR --listen SOCKET [flags]",
                            .about = "Serves a pack to ngx_muse_module through a shared-memory "
                                     "segment (--shm) and a unix\nsocket (--listen), both 0660 "
                                     "for --group (the nginx workers' group).\n",
                            .flags = table,
                            .n = sizeof table / sizeof *table};
    int rc = muse_flags_parse(&set, argc, argv);
    if (rc != MUSE_FLAGS_RUN) return rc;
    f->backend = backends[backend];
    muse_err ge = {{0}};
    if (muse_tp_check_flags(&f->tp, f->ranks, &ge)) return muse_flags_error(&set, "%s", ge.msg);
    if (muse_tp_on(&f->tp) && backend != 0)
        return muse_flags_error(&set, "--tp-world goes with --backend cpu for now (on CUDA NCCL "
                                      "will carry the sums: not built yet)");
    bool follower = muse_tp_on(&f->tp) && f->tp.rank > 0;
    if (follower && f->listen)
        return muse_flags_error(&set,
                                "--listen goes with rank 0, which serves; rank %lld follows "
                                "it (leave out --listen)",
                                f->tp.rank);
    if (!follower && !f->listen) return muse_flags_error(&set, "--listen SOCKET is required");
    f->auto_rows = !f->max_rows && backend == 2 && !muse_tp_on(&f->tp);
    if (!f->max_rows) /* 256; where auto the floor, for the first plan and --busy-rows' check */
        f->max_rows =
            f->auto_rows && f->busy_rows > AUTO_ROWS_LEAST ? f->busy_rows : AUTO_ROWS_LEAST;
    if (f->busy_rows > f->max_rows)
        return muse_flags_error(&set,
                                "--busy-rows %lld is more than --max-rows %lld (the rows a round "
                                "may hold): lower --busy-rows or raise --max-rows",
                                f->busy_rows, f->max_rows);
    if (!f->busy_rows) f->busy_rows = f->max_rows < 256 ? f->max_rows : 256;
    if (f->max_rows >= AUTO_ROWS_MOST) f->auto_rows = 0; /* --busy-rows 2048 or more: that */
    if (muse_tp_on(&f->tp)) f->ranks = f->tp.world;      /* the plan is of the world's ranks */
    muse_backend_opts go = {0};
    const muse_rank_flags names = {"--gpus", "--ranks", "--backend"};
    if (muse_backend_ranks(&names, f->backend, f->gpus, muse_tp_on(&f->tp) ? 1 : f->ranks, &go,
                           &ge))
        return muse_flags_error(&set, "%s", ge.msg);
    if (muse_kernels_parse("--kernels", f->kernels_text, &f->kernels, &ge))
        return muse_flags_error(&set, "%s", ge.msg);
    f->ranks = muse_tp_on(&f->tp) ? f->tp.world : go.ranks;
    memcpy(f->devices, go.devices, sizeof f->devices);
    f->device_kind = backend == 2 ? MUSE_DEVICE_DISCRETE : MUSE_DEVICE_CPU;
    snprintf(f->device_src, sizeof f->device_src, "--device-gib %g", f->device_gib);
    if (backend == 2) { /* the GPUs' memory, or --device-gib where it names a smaller share */
        uint64_t bytes = 0;
        char name[128];
        muse_err de = {{0}};
        if (muse_backend_device_memory(f->backend, f->devices, (int)f->ranks, &bytes, name,
                                       sizeof name, &de))
            return muse_flags_error(&set, "%s", de.msg);
        double gib = (double)bytes / (double)(1ull << 30);
        if (!f->device_gib || f->device_gib > gib) {
            f->device_gib = gib;
            snprintf(f->device_src, sizeof f->device_src, "%s, %.2f GiB a rank", name, gib);
        }
    }
    muse_err re = {{0}};
    if (muse_reserve_resolve(f->reserve_gib, f->device_kind, muse_gib_bytes(f->device_gib),
                             &f->reserve_gib, &re))
        return muse_flags_error(&set, "%s", re.msg);
    for (const char *p = f->model_id; p && *p; p++) /* it goes into JSON and headers as is */
        if (!(isalnum((unsigned char)*p) || strchr("-_.:/", *p)))
            return muse_flags_error(&set, "--model-id may hold letters, digits and - _ . : / only");
    bool script = backend == 1;
    if (script && !f->script) return muse_flags_error(&set, "--backend script needs --script FILE");
    if (f->synthetic >= 0 && f->model)
        return muse_flags_error(&set, "--model and --synthetic-weights name the weights twice: "
                                      "give one");
    if (f->synthetic >= 0 && (!f->config || !f->tokenizer))
        return muse_flags_error(&set, "--synthetic-weights SEED needs --config FILE and "
                                      "--tokenizer FILE");
    if (f->synthetic < 0 && (f->config || f->bits || f->codebook))
        return muse_flags_error(&set, "--config, --bits and --codebook go with "
                                      "--synthetic-weights SEED");
    if (!script && !f->model && f->synthetic < 0)
        return muse_flags_error(&set, "--model DIR (or --synthetic-weights SEED --config FILE) "
                                      "is required");
    if (script && !f->model && !f->tokenizer)
        return muse_flags_error(&set, "--backend script needs --tokenizer FILE or --model DIR");
    if (f->group) {
        const struct group *g = getgrnam(f->group);
        if (!g) return muse_flags_error(&set, "--group names no group on this machine");
        f->gid = g->gr_gid;
    }
    return MUSE_FLAGS_RUN;
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
    const muse_memory_plan *plan;
    const muse_comm *comm; /* --tp-world: the links to the other ranks, watched */
    uint64_t dev_total[MUSE_PLAN_MAX_RANKS], dev_free[MUSE_PLAN_MAX_RANKS]; /* GPUs, started */
    double started;
    /* 0 starting, 1 ok, 2 down. The pointers above are set before state becomes 1 (release)
     * and read only after it is seen (acquire). */
    _Atomic int state;
    _Atomic int quit;
} health_ctx;

static void publish_health(health_ctx *h)
{
    int state = atomic_load(&h->state);
    bool up = state != 0; /* the model, backend and scheduler exist */
    muse_sched_stats st = {0};
    if (up) muse_sched_stats_get(h->sched, &st);
    const serve_flags *f = h->f;
    int busy = h->srv ? muse_server_busy_slots(h->srv) : 0;
    static struct utsname un; /* the machine's arch, read once */
    if (!un.machine[0]) uname(&un);
    muse_health hl = {
        .model_id = f->model_id,
        .device = strcmp(f->backend, "cuda") == 0 ? "cuda" : "cpu",
        .arch = un.machine,
        .backend = f->backend,
        .pid = (int)getpid(),
        .uptime_s = muse_now_s() - h->started,
        .queued = busy > st.running ? busy - st.running : 0,
        .context_length = up ? f->context : 0,
        .prompt_cache_gib = f->prompt_cache_gib,
        .st = &st,
        .plan = up ? h->plan : NULL,
        .total_bytes = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE),
        .weights_bytes = up && h->model && h->model->st ? muse_st_total_bytes(h->model->st) : 0,
        .reserve_bytes = muse_gib_bytes(f->reserve_gib),
        .free_bytes = muse_proc_kb("/proc/meminfo", "MemAvailable:"),
        .peak_bytes = muse_proc_kb("/proc/self/status", "VmHWM:")};
    if (up) {
        memcpy(hl.rank_total, h->dev_total, sizeof hl.rank_total);
        memcpy(hl.rank_free, h->dev_free, sizeof hl.rank_free);
    }
    hl.status = muse_health_status(state, hl.free_bytes, hl.reserve_bytes);
    char *json = muse_health_json(&hl);
    muse_server_set_health(h->srv, json, strlen(json));
    free(json);
}

/* The heartbeat and /health page, four times a second, whatever the scheduler is doing. */
static void *health_main(void *p)
{
    health_ctx *h = p;
    while (!atomic_load(&h->quit)) {
        muse_err e = {{0}};
        /* a rank lost while no round runs: the same end as a round that meets it */
        if (atomic_load(&h->state) == 1 && h->comm && muse_comm_watch(h->comm, &e)) {
            fprintf(stderr,
                    "muse-engine serve: %s; marking the segment FATAL and exiting (nothing is "
                    "served from a half world)\n",
                    e.msg);
            muse_server_set_state(h->srv, MUSE_ENGINE_FATAL);
            _exit(MUSE_EXIT_DEVICE_FATAL);
        }
        publish_health(h);
        struct timespec ts = {0, 250000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* What the memory plan of these flags for cfg (NULL: the script backend) is made from, with a
 * backend's own counts where given (sized: its workspace with staging, and what it holds beside
 * the tensors as weights; NULL: the estimate). */
static muse_memory_opts plan_opts(const serve_flags *f, const muse_config *cfg, double bits,
                                  double head_bits, const muse_rank_mem *sized)
{
    return (muse_memory_opts){
        .streams = (int)f->streams,
        .queue = (int)f->queue,
        .context = f->context,
        .kv_blocks = f->kv_blocks,
        .prompt_cache_gib = f->prompt_cache_gib,
        .reserve_gib = f->reserve_gib,
        .request_bytes = (uint64_t)f->request_kib * 1024,
        .ranks = (int)f->ranks,
        .device_kind = f->device_kind,
        .device_bytes = muse_gib_bytes(f->device_gib),
        .cfg = cfg,
        .bits = bits,
        .head_bits = head_bits,
        .max_rows = (long)f->max_rows,
        .workspace_bytes = sized ? sized->workspace : 0,
        .weights_extra = sized ? sized->weights : 0,
        .threads = (int)(f->threads > 0 ? f->threads : sysconf(_SC_NPROCESSORS_ONLN))};
}

/* The plan before any large allocation; -1 with the refusal (every term, the fix) when it does
 * not fit the device. say: print the context that fits (the last plan before the weights go
 * to the backend). */
static int make_plan(const serve_flags *f, const muse_config *cfg, double bits, double head_bits,
                     const muse_rank_mem *sized, int say, muse_memory_plan *plan, muse_err *e)
{
    muse_memory_opts mo = plan_opts(f, cfg, bits, head_bits, sized);
    muse_memory_plan_make(&mo, plan);
    if (muse_memory_plan_misfit(plan) < 0) {
        if (!say) return 0;
        if (cfg && mo.device_bytes)
            fprintf(stderr,
                    "muse-engine serve: context that fits: 1 x %lld tokens, 4 x %lld tokens\n",
                    (long long)muse_memory_plan_context_fits(&mo, 1),
                    (long long)muse_memory_plan_context_fits(&mo, 4));
        else if (cfg)
            fprintf(stderr,
                    "muse-engine serve: context that fits: no device limit "
                    "(--device-gib 0), max_position_embeddings %lld\n",
                    (long long)cfg->max_position_embeddings);
        return 0;
    }
    char text[4096];
    muse_memory_plan_refusal(plan, text, sizeof text);
    return muse_fail(e, "%s: %s", f->device_src, text);
}

/* Whether the plan is made again from the backend's own sizes (muse_backend_plan_memory). */
static int sized_by_backend(const serve_flags *f)
{
    return strcmp(f->backend, "cuda") == 0;
}

/* The backend's own counts at bo (muse_backend_plan_memory's widest rank); zeros where the
 * plan's estimate is the backend's sizing, with e clear; zeros with e set on failure. */
static muse_rank_mem backend_sizes(const serve_flags *f, const muse_model *m,
                                   const muse_backend_opts *bo, muse_err *e)
{
    muse_rank_mem most;
    long act[2];
    muse_forward_act_floats(m, act);
    muse_backend_plan_memory(f->backend, m, bo, act, &most, e);
    return most;
}

typedef struct {
    const serve_flags *f;
    const muse_model *m;
    muse_backend_opts bo;
    muse_err *e;
} rows_job;

static uint64_t workspace_at(void *ctx, long rows)
{
    rows_job *j = ctx;
    j->bo.max_rows = rows;
    return backend_sizes(j->f, j->m, &j->bo, j->e).workspace;
}

/* The plan again with the backend's own count of its workspace, worked out before any weight
 * goes to it: a start that cannot fit is refused here, naming the flags that fix it, not by an
 * allocation after the upload. With auto_rows, --max-rows becomes the most rows a round (2048
 * down to the floor already in f) that fits, and bo follows. */
static int size_plan(serve_flags *f, const muse_config *cfg, double bits, double head_bits,
                     const muse_model *m, muse_backend_opts *bo, muse_memory_plan *plan,
                     muse_err *e)
{
    if (!sized_by_backend(f)) return 0;
    muse_rank_mem sized = backend_sizes(f, m, bo, e);
    if (e->msg[0]) return -1;
    if (f->auto_rows) {
        muse_memory_opts mo = plan_opts(f, cfg, bits, head_bits, &sized);
        rows_job j = {f, m, *bo, e};
        long rows = muse_memory_plan_most_rows(&mo, AUTO_ROWS_MOST, workspace_at, &j);
        if (e->msg[0]) return -1;
        fprintf(stderr,
                "muse-engine serve: --max-rows %ld (the most rows a round the plan fits, up to "
                "%d; give --max-rows to choose)\n",
                rows, AUTO_ROWS_MOST);
        if (rows != bo->max_rows) { /* else the first count stands */
            f->max_rows = rows;
            bo->max_rows = rows;
            sized = backend_sizes(f, m, bo, e);
            if (e->msg[0]) return -1;
        }
    }
    return make_plan(f, cfg, bits, head_bits, &sized, 1, plan, e);
}

/* The config alone (no weights): what the plan is made from before loading. */
static int load_config(const serve_flags *f, muse_config *cfg, muse_err *e)
{
    return f->model ? muse_config_load(f->model, cfg, e)
                    : muse_config_load_file("--config", f->config, cfg, e);
}

/* A rank other than 0 of a world of processes: the same plan and model as rank 0, no segment
 * or socket; replays rank 0's rounds until it stops (0) or is lost (1, with a line naming it). */
static int serve_follower(serve_flags *f)
{
    muse_err e = {{0}};
    static muse_config cfg;
    muse_memory_plan plan = {0};
    muse_model model = {0};
    muse_backend *be = NULL;
    muse_forward *fwd = NULL;
    muse_comm *comm = NULL;
    int rc = 2;
    if (load_config(f, &cfg, &e) || muse_config_context(&cfg, &f->context, &e)) goto out;
    double bits = f->synthetic >= 0 ? (double)f->bits : cfg.quantized ? cfg.quant_bits : 0;
    double head_bits = f->synthetic >= 0 || cfg.quant_head_bits <= 0 ? 6 : cfg.quant_head_bits;
    if (make_plan(f, &cfg, bits, head_bits, NULL, !sized_by_backend(f), &plan, &e)) goto out;
    muse_synthetic syn = {f->config,   (uint64_t)f->synthetic,      (int)f->bits,
                          f->codebook, !strcmp(f->backend, "cuda"), 0};
    if (f->synthetic >= 0 ? muse_model_synthetic(&syn, &model, &e)
                          : muse_model_load(f->model, &model, &e))
        goto out;
    muse_backend_opts bo = {.max_rows = (long)f->max_rows,
                            .max_wanted = (long)f->streams, /* a lane wants one row a round */
                            .max_seqs = (int)f->streams,
                            .context = f->context,
                            .threads = (int)f->threads,
                            .ranks = 1,
                            .kernels = f->kernels,
                            .kv_blocks = plan.ranks[0].kv_blocks,
                            .snapshot_slots = plan.ranks[0].snapshot_slots};
    if (muse_tp_join(&f->tp, &model, &bo, &comm, &e) ||
        size_plan(f, &cfg, bits, head_bits, &model, &bo, &plan, &e))
        goto out;
    if (!(be = muse_backend_create(f->backend, &model, &bo, &e))) goto out;
    fwd = muse_forward_create(be);
    fprintf(stderr, "muse-engine serve: rank %lld of %lld following rank 0 at %s\n", f->tp.rank,
            f->tp.world, f->tp.master);
    rc = muse_tp_follow(comm, fwd, &e) ? 1 : 0;
    if (!rc) fprintf(stderr, "muse-engine serve: rank 0 stopped the world; shutting down\n");
out:
    if (rc) fprintf(stderr, "muse-engine serve: rank %lld: %s\n", f->tp.rank, e.msg);
    muse_forward_destroy(fwd);
    muse_backend_destroy(be);
    muse_tp_close(comm);
    if (model.st) muse_model_free(&model);
    return rc;
}

int muse_cmd_serve(int argc, char **argv)
{
    serve_flags f;
    int rc = parse_flags(argc, argv, &f);
    if (rc >= 0) return rc;
    if (muse_tp_on(&f.tp) && f.tp.rank > 0) return serve_follower(&f);
    bool script = strcmp(f.backend, "script") == 0;
    muse_err e = {{0}};
    char tokpath[4096];
    if (!f.tokenizer) {
        snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", f.model);
        f.tokenizer = tokpath;
    }
    if (!f.model_id) f.model_id = "muse-spark";
    muse_model model = {0};
    muse_memory_plan plan = {0};
    muse_backend *be = NULL;
    muse_forward *fwd = NULL;
    muse_comm *comm = NULL;
    muse_tokenizer *tok = NULL;
    muse_server *srv = NULL;
    muse_sched *sched = NULL;
    int32_t **script_seqs = NULL;
    size_t *script_lens = NULL, n_script = 0;
    pthread_t health_tid;
    health_ctx h = {.f = &f, .started = muse_now_s()};
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

    /* the plan from the config alone, checked before any large allocation (the segment too) */
    static muse_config cfg; /* large (per-layer arrays); one serve a process */
    double bits = 0, head_bits = 0;
    if (script) {
        if (!f.context) f.context = 4096;
        if (make_plan(&f, NULL, 0, 0, NULL, 1, &plan, &e)) goto fail;
    } else {
        if (load_config(&f, &cfg, &e) || muse_config_context(&cfg, &f.context, &e)) goto fail;
        bits = f.synthetic >= 0 ? (double)f.bits : cfg.quantized ? cfg.quant_bits : 0;
        /* a pack without quantization_config.head_bits: EXL3.md's default head of 6 bits */
        head_bits = f.synthetic >= 0 || cfg.quant_head_bits <= 0 ? 6 : cfg.quant_head_bits;
        if (make_plan(&f, &cfg, bits, head_bits, NULL, !sized_by_backend(&f), &plan, &e)) goto fail;
    }
    muse_server_opts so = {.shm_name = f.shm,
                           .socket_path = f.listen,
                           .slots = (int)(f.streams + f.queue),
                           .request_bytes = (size_t)f.request_kib * 1024,
                           .socket_gid = (int)f.gid};
    uint8_t worker_key[MUSE_KEY_MAX_BYTES];
    if (f.worker_key) {
        char kerr[sizeof e.msg];
        if (muse_key_file_read(f.worker_key, geteuid(), worker_key, &so.worker_key_len, kerr,
                               sizeof kerr)) {
            muse_fail(&e, "--worker-key: %s", kerr);
            goto fail;
        }
        so.worker_key = worker_key;
    } else {
        fprintf(stderr, "muse-engine: no --worker-key: any process the socket's mode lets in "
                        "(its group) gets the segment; docs/operations.md says how to set one\n");
    }
    if (muse_server_start(&so, &srv, &e)) goto fail;
    explicit_bzero(worker_key, sizeof worker_key);
    h.srv = srv;
    publish_health(&h);
    if (pthread_create(&health_tid, NULL, health_main, &h) == 0) health_running = true;
    if (muse_tokenizer_load(f.tokenizer, &tok, &e)) goto fail;
    if (script) {
        if (load_script(f.script, &script_seqs, &script_lens, &n_script, &e)) goto fail;
    } else {
        muse_synthetic syn = {f.config,   (uint64_t)f.synthetic,      (int)f.bits,
                              f.codebook, !strcmp(f.backend, "cuda"), 0};
        if (f.synthetic >= 0 ? muse_model_synthetic(&syn, &model, &e)
                             : muse_model_load(f.model, &model, &e))
            goto fail;
        h.model = &model;
        muse_backend_opts bo = {.max_rows = (long)f.max_rows,
                                .max_wanted = (long)f.streams, /* a lane wants one a round */
                                .max_seqs = (int)f.streams,
                                .context = f.context,
                                .threads = (int)f.threads,
                                .ranks = (int)f.ranks,
                                .kernels = f.kernels,
                                .kv_blocks = plan.ranks[0].kv_blocks,
                                .snapshot_slots = plan.ranks[0].snapshot_slots};
        memcpy(bo.devices, f.devices, sizeof bo.devices);
        if (muse_tp_on(&f.tp)) bo.ranks = 1; /* this process holds rank 0 of the world */
        if (muse_tp_join(&f.tp, &model, &bo, &comm, &e) ||
            size_plan(&f, &cfg, bits, head_bits, &model, &bo, &plan, &e))
            goto fail;
        if (!(be = muse_backend_create(f.backend, &model, &bo, &e))) goto fail;
        fwd = muse_forward_create(be);
        muse_tp_lead_forward(comm, fwd); /* rank 0 of a world: rounds go to the others first */
        /* each GPU's memory with every buffer in place: /health's figures beside the plan */
        for (int r = 0; r < be->n_ranks && r < MUSE_PLAN_MAX_RANKS && be->ops->device_memory; r++)
            if (be->ops->device_memory(be, r, &h.dev_free[r], &h.dev_total[r]))
                h.dev_free[r] = h.dev_total[r] = 0;
        for (int r = 0; r < be->n_ranks; r++) { /* what each rank really holds (here) */
            const muse_rank_mem *m = &be->ranks[r];
            if (sized_by_backend(&f) && m->workspace + m->staging > plan.ranks[r].workspace_bytes)
                fprintf(stderr, /* the sizing is the allocation's own arithmetic: a bug if not */
                        "muse-engine serve: rank %d: workspace %llu bytes allocated, more than "
                        "the plan counted (%llu)\n",
                        r, (unsigned long long)(m->workspace + m->staging),
                        (unsigned long long)plan.ranks[r].workspace_bytes);
            muse_memory_plan_measured(&plan, r, m->weights, m->kv + m->sliding, m->kv,
                                      m->workspace + m->staging, m->snapshots);
        }
    }
    muse_sched_opts o = {.streams = (int)f.streams,
                         .max_rows = (long)f.max_rows,
                         .busy_rows = (long)f.busy_rows,
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
                         .prompt_cache_bytes = plan.ranks[0].prompt_cache_bytes,
                         .keepalive_ms = (int)f.keepalive_ms};
    if (!(sched = muse_sched_create(&o, fwd, script ? NULL : &model.cfg, tok, srv, &e))) goto fail;
    h.sched = sched;
    h.plan = &plan;
    h.comm = comm;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    muse_server_set_state(srv, MUSE_ENGINE_SERVING);
    atomic_store(&h.state, 1);
    fprintf(stderr,
            "muse-engine serve: serving %s on %s (%lld streams, context %lld, %s backend)\n",
            f.model_id, f.listen, f.streams, f.context, f.backend);
    char plan_text[4096];
    muse_memory_plan_text(&plan, plan_text, sizeof plan_text);
    fprintf(stderr, "muse-engine serve: memory plan: %s\n", plan_text);
    fprintf(stderr, "muse-engine serve: weights bytes:"); /* measured, exact: tests compare */
    for (int r = 0; r < plan.n_ranks; r++)
        fprintf(stderr, " rank %d %llu", r, (unsigned long long)plan.ranks[r].weights_bytes);
    fprintf(stderr, "\n");
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
    muse_tp_close(comm); /* the other ranks stop with rank 0 */
    if (model.st) muse_model_free(&model);
    muse_tokenizer_free(tok);
    for (size_t i = 0; i < n_script; i++) free(script_seqs[i]);
    free(script_seqs);
    free(script_lens);
    return rc ? 2 : 0;
}
