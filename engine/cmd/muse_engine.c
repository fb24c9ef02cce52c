/* muse-engine: the engine process and its tools, one subcommand each. */
#include "backend/backend.h"
#include "base/flags.h"
#include "cmd/cmd_check.h"
#include "cmd/cmd_exl3.h"
#include "cmd/cmd_model.h"
#include "cmd/cmd_plan.h"
#include "cmd/cmd_serve.h"
#include "cmd/cmd_tokenize.h"

/* What this binary is: its version, its backends and the CUDA archs its kernels were built for. */
static int cmd_version(int argc, char **argv)
{
    if (argc > 1) {
        bool help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        fprintf(help ? stdout : stderr, "%s%s",
                help ? "" : "muse-engine version: takes no flags or arguments\n",
                "usage: muse-engine version\nPrints the version, the backends and the CUDA archs "
                "built.\n");
        return help ? 0 : 2;
    }
    const char *archs = muse_backend_cuda_archs();
    printf("muse-engine %s\nbackends: %s\ncuda archs: %s\n", MUSE_VERSION, muse_backend_names(),
           archs ? archs : "none (built without nvcc)");
    return 0;
}

static const muse_subcommand subcommands[] = {
    {"version", cmd_version, "version, backends and the CUDA archs built"},
    {"dequant", muse_cmd_dequant, "fp32 effective weight of one EXL3 Linear"},
    {"serve", muse_cmd_serve, "serve a pack to ngx_muse_module (shared memory + socket)"},
    {"logits", muse_cmd_logits, "fp32 logits of every position of a prompt"},
    {"generate", muse_cmd_generate, "generate token ids from a prompt"},
    {"plan", muse_cmd_plan, "the memory plan per rank of a config, without weights"},
    {"inspect", muse_cmd_inspect, "config, parameters, bytes and layers of a pack"},
    {"chat", muse_cmd_chat, "render messages, generate, print the parsed reply"},
    {"kernel-check", muse_cmd_kernel_check, "every registry kernel of a backend against the CPU"},
    {"compare", muse_cmd_compare, "teacher-forced logits of two backends: rel L2, top-1 misses"},
    {"tokenize", muse_cmd_tokenize, "text to token ids with a pack's tokenizer.json"},
    {"detokenize", muse_cmd_detokenize, "token ids to text"},
};

int main(int argc, char **argv)
{
    return muse_subcommand_run(
        "muse-engine", "muse-engine " MUSE_VERSION ": serves and inspects muse_spark packs",
        MUSE_VERSION, subcommands, sizeof subcommands / sizeof *subcommands, argc, argv);
}
