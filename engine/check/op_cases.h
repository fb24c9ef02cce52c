/* The operations of the backend seam expanded to a pack's widths, and the deterministic inputs
 * they run on: one list shared by the kernel checker (ops_check.c) and `muse-bench kernels`
 * (engine/bench/bench_ops.c), so both exercise the same cases. */
#ifndef MUSE_OP_CASES_H
#define MUSE_OP_CASES_H

#include "backend/backend.h"
#include "check/registry.h"

#define MUSE_OP_MAX_CASES 64
#define MUSE_OP_MAX_W     12 /* distinct widths */
#define MUSE_OP_SLOTS     5  /* activations a width */

/* One operation at one shape. param: norm mode (muse_norm_weight) + 3 when rounded to fp16;
 * linear: round16; qk_norm_rope and attention: the layer. */
typedef struct {
    char name[96];
    muse_kernel_id kid;
    long in_width, out_width;
    const void *arg; /* the muse_linear, the muse_vec (norms) or the muse_layer (moe) */
    long param;
} muse_op_case;

/* Every case of m in registry order of first use: embed, six norm modes, add_norm, every
 * distinct linear shape of a layer (q, k, v, g, o, dense and expert gate/up/down, shared
 * experts), qk_norm_rope and attention of the first full and first sliding layer, swiglu, moe,
 * all_reduce, head, sample. Returns the count (at most MUSE_OP_MAX_CASES). */
int muse_op_cases(const muse_model *m, muse_op_case *cs);

/* A backend's activations by width, MUSE_OP_SLOTS a width, allocated on first use. */
typedef struct {
    muse_backend *be;
    long widths[MUSE_OP_MAX_W];
    muse_act acts[MUSE_OP_MAX_W][MUSE_OP_SLOTS];
    int n_widths;
} muse_op_acts;

muse_act muse_op_act(muse_op_acts *s, long width, int slot);

/* A 64-bit mix (splitmix64's finalizer): ids -> tokens and values. */
uint64_t muse_op_mix(uint64_t x);
/* Row id's width values in [-2, 2), never near zero; fp16-rounded when round16. */
void muse_op_fill_row(uint64_t seed, int64_t id, long width, int round16, float *dst);
/* Writes rows ids[0..M) of muse_op_fill_row into activation a (outside a round). */
void muse_op_write_inputs(muse_op_acts *s, muse_act a, uint64_t seed, const int64_t *ids, long M,
                          long W, int round16);

#endif
