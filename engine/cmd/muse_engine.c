/* muse-engine: the engine process and its tools, one subcommand each. */
#include "base/flags.h"
#include "cmd/cmd_exl3.h"
#include "cmd/cmd_model.h"
#include "cmd/cmd_plan.h"
#include "cmd/cmd_serve.h"
#include "cmd/cmd_tokenize.h"

static const muse_subcommand subcommands[] = {
    {"dequant", muse_cmd_dequant, "fp32 effective weight of one EXL3 Linear"},
    {"serve", muse_cmd_serve, "serve a pack to ngx_muse_module (shared memory + socket)"},
    {"logits", muse_cmd_logits, "fp32 logits of every position of a prompt"},
    {"generate", muse_cmd_generate, "generate token ids from a prompt"},
    {"plan", muse_cmd_plan, "the memory plan per rank of a config, without weights"},
    {"inspect", muse_cmd_inspect, "config, parameters, bytes and layers of a pack"},
    {"chat", muse_cmd_chat, "render messages, generate, print the parsed reply"},
    {"tokenize", muse_cmd_tokenize, "text to token ids with a pack's tokenizer.json"},
    {"detokenize", muse_cmd_detokenize, "token ids to text"},
};

int main(int argc, char **argv)
{
    return muse_subcommand_run(
        "muse-engine", "muse-engine " MUSE_VERSION ": serves and inspects muse_spark packs",
        MUSE_VERSION, subcommands, sizeof subcommands / sizeof *subcommands, argc, argv);
}
