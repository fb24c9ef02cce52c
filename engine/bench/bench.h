/* muse-bench: the subcommands and the small helpers they share (flags, quantiles, lists). */
#ifndef MUSE_BENCH_H
#define MUSE_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/clock.h"
#include "backend/backend.h"
#include "base/flags.h"

/* The subcommands: each takes its own argv (argv[0] is the subcommand) and returns the exit
 * status (0 ok, 1 failed, 2 bad usage). */
int bench_cmd_exl3(int argc, char **argv);
int bench_cmd_quant(int argc, char **argv);
int bench_cmd_tokenizer(int argc, char **argv);
int bench_cmd_grammar(int argc, char **argv);
int bench_cmd_chat(int argc, char **argv);
int bench_cmd_decode(int argc, char **argv);
int bench_cmd_kernels(int argc, char **argv);
int bench_cmd_server(int argc, char **argv);
int bench_cmd_stamp_engine(int argc, char **argv);
int bench_cmd_concurrent(int argc, char **argv);
int bench_cmd_constrained(int argc, char **argv);
int bench_cmd_prompt(int argc, char **argv);
int bench_cmd_stages(int argc, char **argv);
/* muse-bench prompt without --url: on a backend (bench_prompt.c). */
int bench_prompt_backend(int argc, char **argv);

/* muse_flags_parse for "muse-bench CMD": -1 to run, else the exit code. */
int bench_parse_flags(const char *cmd, const char *about, const muse_flag *flags, size_t n,
                      int argc, char **argv);

/* Prints "muse-bench CMD: MSG (see muse-bench CMD --help)" and returns 2. */
int bench_usage_error(const char *cmd, const char *msg);
/* --kernels TEXT (NULL: not given: the backend's default) into *k for the backends the command
 * makes; 0, or the usage error's exit code. */
int bench_kernels_flag(const char *cmd, const char *text, muse_kernels *k);

/* The EXL3 codebooks' names in muse_codebook order, for an ENUM flag. */
extern const char *const bench_codebooks[];

/* A deterministic 64-bit stream (one per process) for random test data. */
uint64_t bench_rng_next(void);

/* q-quantile (0..1) of v[n], nearest rank; sorts v. NAN when n is 0. */
double bench_quantile(double *v, size_t n, double q);

/* Splits "a,b,c" into at most max entries of < 16 bytes; the count, or -1 on a bad entry. */
int bench_split_list(const char *text, char out[][16], int max);

/* Parses "a,b,c" into at most max integers in [lo, hi]; the count, or -1 (message in why). */
int bench_parse_int_list(const char *flag, const char *text, long long lo, long long hi,
                         long long *out, int max, char *why, size_t why_len);

/* Appends x to the growable array *v (n used, cap allocated). */
void bench_push_sample(double **v, size_t *n, size_t *cap, double x);

#endif
