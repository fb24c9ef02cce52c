/* muse-engine: the engine process and its tools, one subcommand each. */
#include "cmd/cmd_exl3.h"
#include "cmd/cmd_model.h"
#include "cmd/cmd_serve.h"
#include "cmd/cmd_tokenize.h"
#include "base/muse_common.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} subcommand;

static const subcommand subcommands[] = {
    {"dequant", muse_cmd_dequant, "fp32 effective weight of one EXL3 Linear"},
    {"serve", muse_cmd_serve, "serve a pack to ngx_muse_module (shared memory + socket)"},
    {"logits", muse_cmd_logits, "fp32 logits of every position of a prompt"},
    {"generate", muse_cmd_generate, "generate token ids from a prompt"},
    {"inspect", muse_cmd_inspect, "config, parameters, bytes and layers of a pack"},
    {"chat", muse_cmd_chat, "render messages, generate, print the parsed reply"},
    {"tokenize", muse_cmd_tokenize, "text to token ids with a pack's tokenizer.json"},
    {"detokenize", muse_cmd_detokenize, "token ids to text"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "muse-engine %s: serves and inspects muse_spark packs\n\nusage: muse-engine COMMAND "
            "[--help | flags]\n\ncommands:\n",
            MUSE_VERSION);
    for (size_t i = 0; i < sizeof subcommands / sizeof *subcommands; i++)
        fprintf(f, "  %-11s %s\n", subcommands[i].name, subcommands[i].what);
    fprintf(f, "\nEvery command documents its flags with --help. Bad input exits with code 2.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("muse-engine %s\n", MUSE_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof *subcommands; i++)
        if (strcmp(argv[1], subcommands[i].name) == 0)
            return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "muse-engine: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
