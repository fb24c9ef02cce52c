/* The kernel checker behind `muse-engine kernel-check`: every entry of the kernel registry
 * (check/registry.h) on a backend against the CPU reference, with planted controls. */
#ifndef MUSE_OPS_CHECK_H
#define MUSE_OPS_CHECK_H

#include <stdio.h>

#include "backend/backend.h"

typedef struct {
    const char *model;           /* the pack */
    const char *backend;         /* "cpu", "cuda" */
    long max_rows;               /* 17 .. 4096 */
    long sample_rows;            /* random rows the sampler is checked on (0: 10000) */
    int ranks;                   /* tensor-parallel ranks of both sides (0 or 1: one) */
    muse_kernels kernels;        /* EXACT: held to the cpu; FAST: to the exact path */
    int devices[MUSE_MAX_RANKS]; /* each rank's GPU (cuda) */
    FILE *out;                   /* the TAP lines and the SUMMARY line */
} muse_ops_check_opts;

/* Runs every check; 0 all passed and every control red, 1 a failure or a missed control, 2
 * the pack or the backend could not be made (the reason on stderr, prefixed by prog). */
int muse_ops_check(const char *prog, const muse_ops_check_opts *o);

#endif
