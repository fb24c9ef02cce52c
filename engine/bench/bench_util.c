/* Helpers shared by the muse-bench subcommands: flags, usage errors, quantiles, lists. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "base/flags.h"
#include "base/muse_common.h"
#include "pack/pack_random.h"

const char *const bench_codebooks[] = {"3inst", "mcg", "mul1", NULL};

int bench_parse_flags(const char *cmd, const char *about, const muse_flag *flags, size_t n,
                      int argc, char **argv)
{
    char prog[64];
    snprintf(prog, sizeof prog, "muse-bench %s", cmd);
    const muse_flags set = {.prog = prog, .about = about, .flags = flags, .n = n};
    return muse_flags_parse(&set, argc, argv);
}

int bench_kernels_flag(const char *cmd, const char *text, muse_kernels *k)
{
    muse_err e = {{0}};
    if (muse_kernels_parse("--kernels", text, k, &e)) return bench_usage_error(cmd, e.msg);
    return 0;
}

int bench_usage_error(const char *cmd, const char *msg)
{
    char prog[64];
    snprintf(prog, sizeof prog, "muse-bench %s", cmd);
    return muse_flags_error(&(muse_flags){.prog = prog}, "%s", msg);
}

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
uint64_t bench_rng_next(void)
{
    rng_state += 0x9E3779B97F4A7C15ull;
    return muse_mix64(rng_state);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_quantile(double *v, size_t n, double q)
{
    if (!n) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)ceil(q * (double)n);
    return v[i ? i - 1 : 0];
}

int bench_split_list(const char *text, char out[][16], int max)
{
    int n = 0;
    const char *p = text;
    while (*p && n < max) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= 16) return -1;
        memcpy(out[n], p, len);
        out[n++][len] = 0;
        p += len;
        if (*p == ',') p++;
    }
    return *p ? -1 : n;
}

int bench_parse_int_list(const char *flag, const char *text, long long lo, long long hi,
                         long long *out, int max, char *why, size_t why_len)
{
    char items[64][16];
    int n = bench_split_list(text, items, max < 64 ? max : 64);
    if (n <= 0) {
        snprintf(why, why_len, "%s must be a list like 1,2,4 of at most %d numbers", flag, max);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        muse_err e = {{0}};
        if (muse_parse_int(flag, items[i], lo, hi, &out[i], &e)) {
            snprintf(why, why_len, "%s", e.msg);
            return -1;
        }
    }
    return n;
}

void bench_push_sample(double **v, size_t *n, size_t *cap, double x)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 4096;
        *v = realloc(*v, *cap * sizeof **v);
        MUSE_CHECK(*v);
    }
    (*v)[(*n)++] = x;
}
