/* What muse-bench kernels and decode share about a model on a backend: the pack or synthetic
 * weights named by flags, the bytes an operation or a whole forward step must move, and the
 * copy bandwidth those bytes are measured against. */
#ifndef MUSE_BENCH_OPS_H
#define MUSE_BENCH_OPS_H

#include "backend/backend.h"
#include "base/flags.h"
#include "bench_table.h"
#include "check/op_cases.h"

/* --model DIR, or --synthetic-weights SEED --config FILE [--bits B] [--codebook C]. */
typedef struct {
    const char *dir, *config, *codebook;
    long long synthetic, bits; /* synthetic -1: none */
} bench_weights;

/* The flags of the synthetic weights into a bench_weights w (--model is each command's own). */
#define BENCH_SYNTHETIC_FLAGS(w)                                                                   \
    MUSE_FLAG_L("synthetic-weights", &(w).synthetic, 0, INT64_MAX, "SEED",                         \
                "weights from a seed in memory, of --config's shape", .def = "none"),              \
        MUSE_FLAG_S("config", &(w).config, "FILE", "the shape --synthetic-weights fills"),         \
        MUSE_FLAG_L("bits", &(w).bits, 0, 8, "B",                                                  \
                    "--synthetic-weights: EXL3 at B bits (head at 6); 0: fp16"),                   \
        MUSE_FLAG_S("codebook", &(w).codebook, "mul1|mcg|3inst",                                   \
                    "--synthetic-weights: the EXL3 codebook", .def = "mul1")

/* Loads the weights for backend (on cuda the GPU fills the synthetic trellises and scales); 0,
 * or -1 with the reason (a bad flag combination included). */
int bench_weights_load(const bench_weights *w, const char *backend, muse_model *m, muse_err *e);

/* Bytes op k must move at R rows (one rank's shard: weights read, activations in and out, KV
 * written and read at positions ctx .. ctx+R-1); experts: the expected distinct experts of R
 * uniformly routed rows. */
double bench_op_bytes(const muse_model *m, const muse_op_case *k, long R, int64_t ctx);
/* Bytes of one forward round of R rows at ctx: the sum of its operations' bytes. */
double bench_step_bytes(const muse_model *m, long R, int64_t ctx);

/* The stages of a decode step (muse-bench stages), in table order. */
typedef enum {
    BENCH_ST_EMBED,
    BENCH_ST_NORMS,
    BENCH_ST_ATTENTION,
    BENCH_ST_DENSE,
    BENCH_ST_ROUTER,
    BENCH_ST_ROUTED,
    BENCH_ST_SHARED,
    BENCH_ST_MOE, /* the moe op whole, where the backend does not split it */
    BENCH_ST_ALL_REDUCE,
    BENCH_ST_HEAD,
    BENCH_ST_SAMPLER,
    BENCH_ST_HOST,
    BENCH_ST_GAPS,
    BENCH_ST_N
} bench_stage;

/* Bytes each stage of one decode round of `streams` sequences, one row each at position ctx,
 * must move (as bench_step_bytes counts them; host and gaps 0); their sum is the round's. */
void bench_decode_stage_bytes(const muse_model *m, long streams, int64_t ctx,
                              double out[BENCH_ST_N]);

/* Measures be's copy bandwidth over copy_mib MiB (0: 1024 on cuda, 256 elsewhere) and adds the
 * head lines "device" and "copy bandwidth" to t; -1 with the reason. */
int bench_copy_head(muse_backend *be, long copy_mib, bench_table *t, double *bytes_per_s,
                    muse_err *e);

#endif
