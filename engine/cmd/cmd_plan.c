/* muse-engine plan: the serve plan per rank (weights by the sharding rules, KV pool, rings,
 * snapshots, workspace, request areas, reserve) for a config and a device, with the context
 * that fits; --backend cuda counts the CUDA backend's own workspace (no GPU needed). Exit 0
 * when it fits, 3 when it does not (with the fix), 2 for bad input. */
#include "cmd/cmd_plan.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/flags.h"
#include "model/forward.h"
#include "model/shard.h"
#include "serve/memory_plan.h"

#define PLAN_MISFIT 3 /* the plan does not fit the device: documented in docs/operations.md */

static const char *const kinds[] = {"cpu", "discrete", "unified", NULL};
static const char *const backends[] = {"cpu", "cuda", NULL};

/* The CUDA backend sized from the config's shapes: a synthetic model with nothing filled. */
typedef struct {
    muse_model m;
    muse_backend_opts bo;
    muse_err *e;
    uint64_t weights_extra; /* the widest rank's, beside the tensors (the last call's) */
} cuda_job;

/* Its workspace and staging a rank (the widest) at rows a round; 0 with e set on failure. */
static uint64_t cuda_workspace(void *ctx, long rows)
{
    cuda_job *j = ctx;
    muse_rank_mem widest;
    long act[2];
    j->bo.max_rows = rows;
    muse_forward_act_floats(&j->m, act);
    muse_backend_plan_memory("cuda", &j->m, &j->bo, act, &widest, j->e);
    j->weights_extra = widest.weights;
    return widest.workspace;
}

int muse_cmd_plan(int argc, char **argv)
{
    const char *config = NULL;
    long long ranks = 1, streams = 4, context = 0, max_rows = 0, queue = 16, request_kib = 4100;
    long long threads = 1;
    long long kv_blocks = 0;
    double device_gib = 0, bits = 0, head_bits = 6, prompt_cache_gib = 1, reserve_gib = -1;
    int kind = -1, backend = 0;
    const char *codebook = NULL, *kernels = NULL;
    const muse_flag table[] = {
        MUSE_FLAG_S("config", &config, "FILE", "the config.json to plan for", .required = true),
        MUSE_FLAG_L("ranks", &ranks, 1, MUSE_PLAN_MAX_RANKS, "N", "tensor-parallel ranks"),
        MUSE_FLAG_G("device-gib", &device_gib, 1 << 20,
                    "memory of each rank's device; 0: no limit (every term, no check)"),
        MUSE_FLAG_E("device-kind", &kind, kinds,
                    "where the ranks' memory lives (the reserve's\n"
                    "default follows it)",
                    .def = "discrete with --device-gib, else cpu"),
        MUSE_FLAG_D("bits", &bits, 0, 8, "B", "EXL3 bits a weight (fractional allowed); 0: fp16"),
        MUSE_FLAG_D("head-bits", &head_bits, 1, 8, "B", "EXL3 bits of the head"),
        MUSE_FLAG_L("streams", &streams, 1, 4096, "N", "streams decoded together (lanes)"),
        MUSE_FLAG_L("context", &context, 1, 1 << 30, "N", "positions a stream may hold",
                    .def = "min(max_position_embeddings, 4096)"),
        MUSE_FLAG_G("prompt-cache-gib", &prompt_cache_gib, 1 << 20,
                    "prompt cache budget (KV blocks + sliding state); 0: off"),
        MUSE_FLAG_G("reserve-gib", &reserve_gib, 1 << 20, "memory kept back on each device",
                    .def = MUSE_RESERVE_ENV ", else by --device-kind (serve's rule)"),
        MUSE_FLAG_L("max-rows", &max_rows, 1, 4096, "N", "rows a round",
                    .def = "--backend cuda: serve's choice (the most of 2048 .. 256 that fits);\n"
                           "else 256"),
        MUSE_FLAG_L("queue", &queue, 0, 4096, "N", "requests waiting behind the streams"),
        MUSE_FLAG_L("request-kib", &request_kib, 1, 65536, "N", "one slot's request area"),
        MUSE_FLAG_L("threads", &threads, 1, 1024, "N", "the CPU backend's threads (scratch)"),
        MUSE_FLAG_L("kv-blocks", &kv_blocks, 1, INT32_MAX, "N",
                    "full-attention KV blocks of 16 positions in the pool",
                    .def = "every stream's whole context plus the prompt cache"),
        MUSE_FLAG_E("backend", &backend, backends,
                    "cuda: the workspace as the CUDA backend allocates it, worked\n"
                    "out from the config's shapes (no GPU needed; whole --bits)",
                    .def = "cpu"),
        MUSE_KERNELS_FLAG(&kernels),
        MUSE_FLAG_S("codebook", &codebook, "mul1|mcg|3inst", "--backend cuda: the EXL3 codebook",
                    .def = "mul1"),
    };
    const muse_flags set = {.prog = "muse-engine plan",
                            .usage = "--config FILE [flags]",
                            .about = "Prints the memory plan of `muse-engine serve` per rank for "
                                     "a config, without weights,\nand the context that fits at "
                                     "1 and 4 streams. Exit 0: it fits; 3: it does not; 2: bad "
                                     "input.\n",
                            .flags = table,
                            .n = sizeof table / sizeof *table};
    int rc = muse_flags_parse(&set, argc, argv);
    if (rc != MUSE_FLAGS_RUN) return rc;
    if (!config) return muse_flags_error(&set, "--config FILE is required"); /* for cppcheck */
    if (bits > 0 && bits < 1)
        return muse_flags_error(&set, "--bits %g: give 0 (fp16) or 1 .. 8 (EXL3)", bits);
    if (backend == 1 && bits != (double)(int)bits)
        return muse_flags_error(&set, "--bits %g: --backend cuda plans whole bits (0 .. 8)", bits);
    if (kind < 0) kind = device_gib > 0 || backend == 1 ? MUSE_DEVICE_DISCRETE : MUSE_DEVICE_CPU;
    int auto_rows = !max_rows && backend == 1;
    if (!max_rows) max_rows = 256;
    muse_err e = {{0}};
    static muse_config cfg; /* large (per-layer arrays) */
    if (muse_config_load_file("--config", config, &cfg, &e) ||
        muse_shard_check(&cfg, (int)ranks, &e) || muse_config_context(&cfg, &context, &e))
        return muse_flags_error(&set, "%s", e.msg);
    double reserve;
    if (muse_reserve_resolve(reserve_gib, (muse_device_kind)kind, muse_gib_bytes(device_gib),
                             &reserve, &e))
        return muse_flags_error(&set, "%s", e.msg);
    muse_memory_opts mo = {.streams = (int)streams,
                           .queue = (int)queue,
                           .context = context,
                           .prompt_cache_gib = prompt_cache_gib,
                           .reserve_gib = reserve,
                           .request_bytes = (uint64_t)request_kib * 1024,
                           .ranks = (int)ranks,
                           .device_kind = (muse_device_kind)kind,
                           .device_bytes = muse_gib_bytes(device_gib),
                           .cfg = &cfg,
                           .bits = bits,
                           .head_bits = head_bits,
                           .max_rows = (long)max_rows,
                           .kv_blocks = kv_blocks,
                           .threads = (int)threads};
    muse_memory_plan p;
    muse_memory_plan_make(&mo, &p);
    if (backend == 1) { /* a model of the config's shapes, nothing filled, nothing on a GPU */
        cuda_job j = {.bo = {.max_rows = (long)max_rows,
                             .max_wanted = (long)streams, /* as serve: a lane's row */
                             .max_seqs = (int)streams,
                             .context = context,
                             .ranks = (int)ranks,
                             .kv_blocks = p.ranks[0].kv_blocks,
                             .snapshot_slots = p.ranks[0].snapshot_slots},
                      .e = &e};
        for (int r = 0; r < (int)ranks; r++) j.bo.devices[r] = r;
        muse_synthetic syn = {config, 1, (int)bits, codebook, 1, 1};
        if (muse_kernels_parse("--kernels", kernels, &j.bo.kernels, &e) ||
            muse_model_synthetic(&syn, &j.m, &e))
            return muse_flags_error(&set, "--backend cuda: %s", e.msg);
        uint64_t ws = cuda_workspace(&j, mo.max_rows);
        mo.weights_extra = j.weights_extra; /* what it holds beside the tensors */
        long rows = mo.max_rows;
        if (auto_rows && ws) rows = muse_memory_plan_most_rows(&mo, 2048, cuda_workspace, &j);
        if (rows != mo.max_rows && !e.msg[0]) ws = cuda_workspace(&j, rows); /* else it stands */
        max_rows = mo.max_rows = rows;
        mo.workspace_bytes = e.msg[0] ? 0 : ws;
        muse_model_free(&j.m);
        if (!mo.workspace_bytes) return muse_flags_error(&set, "--backend cuda: %s", e.msg);
        muse_memory_plan_make(&mo, &p);
    }
    printf("plan: %s, %lld rank%s, %s, %lld streams x %lld tokens, %lld rows a round, %s "
           "workspace, prompt cache %g GiB, reserve %.2f GiB (%s device%s)\n",
           config, ranks, ranks > 1 ? "s" : "", bits > 0 ? "EXL3" : "fp16", streams, context,
           max_rows, backends[backend], prompt_cache_gib, reserve,
           muse_device_kind_name((muse_device_kind)kind),
           reserve_gib >= 0           ? ", --reserve-gib"
           : getenv(MUSE_RESERVE_ENV) ? ", " MUSE_RESERVE_ENV
                                      : ", default");
    if (bits > 0) printf("bits: %g a weight, head %g\n", bits, head_bits);
    static char text[8192];
    muse_memory_plan_table(&p, text, sizeof text);
    fputs(text, stdout);
    printf("weights bytes:");
    for (int i = 0; i < p.n_ranks; i++)
        printf(" rank %d %llu", i, (unsigned long long)p.ranks[i].weights_bytes);
    printf("\n");
    if (device_gib > 0)
        printf("context that fits: 1 x %lld tokens, 4 x %lld tokens (max_position_embeddings "
               "%lld)\n",
               (long long)muse_memory_plan_context_fits(&mo, 1),
               (long long)muse_memory_plan_context_fits(&mo, 4),
               (long long)cfg.max_position_embeddings);
    else
        printf("context that fits: no device limit (--device-gib 0)\n");
    if (muse_memory_plan_misfit(&p) < 0) {
        printf("fits\n");
        return 0;
    }
    muse_memory_plan_refusal(&p, text, sizeof text);
    printf("does not fit\n");
    fprintf(stderr, "muse-engine plan: %s\n", text);
    return PLAN_MISFIT;
}
