/* The kernel registry: every operation of the backend seam a device backend implements, with
 * the CPU reference operation it must equal, the shapes it is checked at and its tolerance.
 * Plain C (no CUDA): `muse-engine kernel-check` (engine/check/ops_check.c) expands each entry
 * into cases at the widths of a pack and runs them. */
#ifndef MUSE_KERNEL_REGISTRY_H
#define MUSE_KERNEL_REGISTRY_H

#include <stddef.h>

typedef enum {
    MUSE_K_EMBED,
    MUSE_K_NORM,
    MUSE_K_ADD_NORM,
    MUSE_K_LINEAR_DENSE,
    MUSE_K_LINEAR_EXL3,
    MUSE_K_LINEAR_EXL3_TILES,
    MUSE_K_QK_NORM_ROPE,
    MUSE_K_ATTN_SLIDING,
    MUSE_K_ATTN_FULL,
    MUSE_K_SWIGLU,
    MUSE_K_MOE,
    MUSE_K_HEAD,
    MUSE_K_SAMPLE,
    MUSE_K_ALL_REDUCE,
    MUSE_K_FORWARD,
    MUSE_K_COUNT
} muse_kernel_id;

typedef struct {
    muse_kernel_id id;
    const char *name;      /* "linear exl3" */
    const char *op;        /* the backend.h operation ("linear") */
    const char *cuda;      /* the CUDA kernel file(s) */
    const char *reference; /* the CPU operation it must equal */
    const char *widths;    /* the widths taken from the pack */
    double tol;            /* relative L2 bound against the reference; 0: bitwise */
} muse_kernel_entry;

/* The table, in check order; *n its length. */
const muse_kernel_entry *muse_kernel_registry(size_t *n);
const muse_kernel_entry *muse_kernel_entry_of(muse_kernel_id id);

/* The row counts every entry is checked at: 1, 16, 17 and max_rows (4 of them into rows). */
int muse_kernel_rows(long max_rows, long rows[4]);

#endif
