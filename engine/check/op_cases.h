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
/* A case whose activations have two widths gives each its own slots, since the widths may be
 * equal (as many KV heads as query heads; a hidden size equal to the padded vocabulary) and one
 * (width, slot) is one buffer: attention's q, g, out at width Q in slots 0, 1, 2 and k, v at
 * width KV in these; the head's input at width H in slot 0 and its logits at width N in this. */
#define MUSE_OP_ATT_K       3
#define MUSE_OP_ATT_V       4
#define MUSE_OP_HEAD_LOGITS 1

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
 * one case a "hidden" entry written nowhere else (all_reduce; ops.h), head, sample. Returns the
 * count (at most MUSE_OP_MAX_CASES). */
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
/* Inputs of an op that reads a rank's slice of its input (an input-split linear, attention's
 * q and g) with several ranks: each row's columns [lo, lo + w) packed at stride w, which is how
 * the op reads rank 0's share of a replicated buffer (write gives every rank the whole rows), so
 * rank 0 computes its true partial and every row depends on that row alone. */
void muse_op_write_sliced(muse_op_acts *s, muse_act a, uint64_t seed, const int64_t *ids, long M,
                          long W, long lo, long w);
/* Rows [0, rows) of a set to a NaN: an output the op must overwrite. */
void muse_op_poison(muse_op_acts *s, muse_act a, long width, long rows);
/* Rows [0, M) of a, W values each, into out[M, W]. */
void muse_op_read(muse_op_acts *s, muse_act a, long M, long W, float *out);

/* How a case runs (op_run.c, a record a kernel: the list's last column names run_<name>),
 * shared by the checker (inputs, a round around call, output) and the bench (inputs once, call
 * inside its timed rounds). */
typedef struct {
    /* writes the case's inputs for rows ids (outside a round), poisons its outputs; every
     * activation the case uses is allocated here, none in call */
    void (*inputs)(muse_op_acts *s, const muse_op_case *k, const int64_t *ids, long M);
    /* the op calls only, inside a round */
    void (*call)(muse_op_acts *s, const muse_op_case *k);
    /* the case's output rows into out[M, out_width] (NULL: the checker reads its own) */
    void (*output)(muse_op_acts *s, const muse_op_case *k, long M, float *out);
    int round16;                              /* the output is fp16-rounded (the fast bound) */
    int (*round16_of)(const muse_op_case *k); /* ... where the case says (NULL: round16) */
    int reads, writes; /* fp32 rows of in_width read, of out_width written (0: 1), the bench's
                        * floor where it has no rule of its own */
} muse_op_run;

/* The record of a kernel; NULL where the list names none. */
const muse_op_run *muse_op_run_of(muse_kernel_id kid);
/* Whether case k's output is rounded to fp16. */
int muse_op_round16(const muse_op_case *k);
/* The generic bytes of case k at R rows: its fp32 rows in and out. */
double muse_op_io_bytes(const muse_op_case *k, long R);

#endif
