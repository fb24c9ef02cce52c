/* muse-bench: speed benchmarks that print tables (docs/benchmarks.md). Speed targets are checked
 * here, never by timed tests. Every loop is bounded by a count and a time limit; the HTTP
 * client talks only to 127.0.0.1. This file: the help text and the subcommand dispatch. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

static const char help[] =
    "usage: muse-bench COMMAND [options] [--json]\n"
    "  exl3      [--bits 2,3,4,6] [--codebook mul1,mcg,3inst] [--size N] [--min-s S]\n"
    "            EXL3 tile decode and muse_exl3_linear (1 and 8 rows), ns per weight, one thread\n"
    "  quant     --pack DIR --bits B [--head-bits H] [--codebook C] [--threads N]\n"
    "            muse_exl3_quantize over every Linear of a pack, weights/s on all cores\n"
    "  tokenizer --tokenizer FILE [--text FILE] [--chunk BYTES] [--min-s S]\n"
    "            encode MB/s and decode tokens/s on one core (default text: generated prose)\n"
    "  chat      --tokenizer FILE --model DIR [--model DIR] [--threads N]\n"
    "            rendering, reply parsing and sampling (V=202048) vs one decode step\n"
    "  decode    --model DIR [--model DIR] [--tokens N] [--prompt N] [--threads N]\n"
    "            CPU forward tokens/s: prompt in rows of 64, decode 1 row\n"
    "  server    --url http://127.0.0.1:PORT [--mode latency|sse|health|all] [--requests N]\n"
    "            [--concurrency C] [--max-tokens N] [--seconds S]\n"
    "            added latency (with stamp-engine), SSE events/s, /health req/s; raw sockets\n"
    "  stamp-engine --shm NAME --socket PATH [--slots N] [--tokens N] [--gap-us US] [--gid G]\n"
    "            an engine for nginx whose tokens carry their CLOCK_MONOTONIC publish time\n"
    "  concurrent --url http://127.0.0.1:PORT [--streams 1,2,4,8] [--tokens N] [--reps R]\n"
    "            [--prompt-tokens P] [--temperature T]\n"
    "            S streamed /v1/completions at once (distinct prompts of token ids, fixed seeds):\n"
    "            tokens/s per stream and in aggregate, TTFT, and whether each request's\n"
    "            muse.token_sha equals the one it gets alone (run again afterwards, alone)\n"
    "  prompt    --url http://127.0.0.1:PORT [--lengths 512,4096,16384] [--reps R]\n"
    "            prompt tokens/s and TTFT (max_tokens 1), cold and from the prompt cache;\n"
    "            lengths beyond /health context_length are reported as skipped\n"
    "  concurrent and prompt also take [--id-range N] (prompt ids in [0, N), default 100000;\n"
    "            below the pack's vocabulary), [--salt N] (names the prompts; default: the time,\n"
    "            so every run is cold) and [--timeout S] (per request batch, default 1800)\n";

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(help, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"exl3", bench_cmd_exl3},
                {"quant", bench_cmd_quant},
                {"tokenizer", bench_cmd_tokenizer},
                {"chat", bench_cmd_chat},
                {"decode", bench_cmd_decode},
                {"server", bench_cmd_server},
                {"stamp-engine", bench_cmd_stamp_engine},
                {"concurrent", bench_cmd_concurrent},
                {"prompt", bench_cmd_prompt}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (!strcmp(argv[1], cmds[i].name)) {
            optind = 1;
            opterr = 0;
            return cmds[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "muse-bench: unknown command '%s'\n%s", argv[1], help);
    return 2;
}
