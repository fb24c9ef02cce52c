/* The kernel registry: every operation of the backend seam a device backend implements, with
 * the CPU reference operation it must equal, the shapes it is checked at and its tolerance.
 * Plain C (no CUDA): `muse-engine kernel-check` (engine/check/ops_check.c) expands each entry
 * into cases at the widths of a pack and runs them. */
#ifndef MUSE_KERNEL_REGISTRY_H
#define MUSE_KERNEL_REGISTRY_H

#include <stddef.h>
#include <stdio.h>

#include "backend/ops.h"

typedef enum {
#define MUSE_K_ID(id, ...) MUSE_K_##id,
    MUSE_KERNELS(MUSE_K_ID)
#undef MUSE_K_ID
        MUSE_K_COUNT
} muse_kernel_id;

typedef struct {
    muse_kernel_id id;
    const char *name;      /* "linear exl3" */
    const char *op;        /* the backend.h operation ("linear") */
    const char *cuda;      /* the CUDA kernel file(s) of the exact path */
    const char *fast;      /* the fast path's kernel file(s); NULL: the fast path runs cuda */
    const char *reference; /* the CPU operation it must equal */
    const char *widths;    /* the widths taken from the pack */
    double tol;            /* exact path: relative L2 bound against the reference; 0: bitwise */
    double tol_fast;       /* fast path: against the exact path; 0: bitwise; MUSE_TOL_BY_OUTPUT */
} muse_kernel_entry;

/* The table, in check order; *n its length. */
const muse_kernel_entry *muse_kernel_registry(size_t *n);
const muse_kernel_entry *muse_kernel_entry_of(muse_kernel_id id);

/* The fast path's bound of an entry for an output rounded to fp16 (round16) or not. */
double muse_kernel_tol_fast(const muse_kernel_entry *k, int round16);

#define MUSE_KERNEL_MAX_ROW_COUNTS 8
/* The row counts every entry is checked at, ascending and at most max_rows: exact path 1, 16,
 * 17 and max_rows; fast path (batch invariance) 1, 4, 16, 17, 64, 256 and max_rows. Returns
 * how many went into rows (at most MUSE_KERNEL_MAX_ROW_COUNTS). */
int muse_kernel_rows(long max_rows, int fast, long rows[MUSE_KERNEL_MAX_ROW_COUNTS]);

/* kernels/CONTRACT.md's registry table in markdown, made from the list (ops.h). */
void muse_kernel_contract_table(FILE *out);

#endif
