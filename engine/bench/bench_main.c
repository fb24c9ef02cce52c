/* muse-bench: speed benchmarks that print tables (docs/benchmarks.md). Speed targets are checked
 * here, never by timed tests. Every loop is bounded by a count and a time limit; the HTTP
 * client talks only to 127.0.0.1. This file: the list of subcommands and their dispatch. */
#include "bench.h"

static const muse_subcommand cmds[] = {
    {"exl3", bench_cmd_exl3, "EXL3 tile decode and muse_exl3_linear, ns per weight"},
    {"quant", bench_cmd_quant, "muse_exl3_quantize over every Linear of a pack, weights/s"},
    {"tokenizer", bench_cmd_tokenizer, "encode MB/s and decode tokens/s on one core"},
    {"grammar", bench_cmd_grammar, "token mask time over a corpus of schemas: p50, p99"},
    {"chat", bench_cmd_chat, "rendering, reply parsing and sampling vs one decode step"},
    {"decode", bench_cmd_decode,
     "forward tokens/s on a backend: prompt in rows of 64, decode 1 row"},
    {"kernels", bench_cmd_kernels, "every backend operation: time a call against its bytes floor"},
    {"server", bench_cmd_server, "added latency, SSE events/s, /health req/s (raw sockets)"},
    {"stamp-engine", bench_cmd_stamp_engine, "an engine whose tokens carry their publish time"},
    {"concurrent", bench_cmd_concurrent, "S streamed completions at once: tok/s, TTFT, token_sha"},
    {"constrained", bench_cmd_constrained, "streams held to a JSON Schema vs free: tok/s"},
    {"prompt", bench_cmd_prompt, "prompt tokens/s and TTFT: on a backend, or through a server"},
    {"stages", bench_cmd_stages, "one decode round stage by stage: time, share, bytes floor"},
};

int main(int argc, char **argv)
{
    return muse_subcommand_run("muse-bench", "muse-bench: speed benchmarks that print tables", NULL,
                               cmds, sizeof cmds / sizeof *cmds, argc, argv);
}
