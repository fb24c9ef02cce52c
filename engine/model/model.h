/* A loaded muse_spark pack: config + mmap'd tensors, checked against the config and grouped
 * per layer. The forward plan (forward.h) reads this; backends never parse files. */
#ifndef MUSE_MODEL_H
#define MUSE_MODEL_H

#include "pack/config.h"
#include "pack/exl3.h"
#include "pack/safetensors.h"
#include "pack/synthetic.h"

typedef enum { MUSE_LIN_DENSE, MUSE_LIN_EXL3 } muse_linear_kind;

/* How tensor parallelism splits a weight across ranks (MUSE_SPARK.md), set by the loader. */
typedef enum {
    MUSE_SHARD_REPLICATED, /* every rank holds all of it */
    MUSE_SHARD_OUTPUT,     /* split by output (heads, intermediate, vocabulary) */
    MUSE_SHARD_INPUT       /* split by input; partial outputs are summed across ranks */
} muse_shard;

/* What a linear is in the block: its split across ranks follows from it. */
typedef enum {
    MUSE_ROLE_Q,
    MUSE_ROLE_K,
    MUSE_ROLE_V,
    MUSE_ROLE_GATE,
    MUSE_ROLE_O,
    MUSE_ROLE_MLP_IN,  /* gate_proj, up_proj of a dense MLP, an expert or the shared experts */
    MUSE_ROLE_MLP_OUT, /* their down_proj */
    MUSE_ROLE_HEAD
} muse_lin_role;

/* y[rows x n] = x[rows x k] W. A dense weight is stored as HF writes it: [n, k]. */
typedef struct {
    muse_linear_kind kind;
    char key[256]; /* e.g. "model.layers.3.self_attn.q_proj" */
    int64_t k, n;  /* n may exceed the logical width for a padded EXL3 head */
    const muse_tensor *w;
    muse_exl3_weight exl3;
    muse_shard shard;
    muse_lin_role role;
    int32_t id; /* 0 .. n_linears-1: a device backend finds its copy by this */
    /* a dense view: weight row r is tensor row row0 + r, columns col0 .. col0 + k of rows ld
     * long (a rank's shard; the whole tensor has row0 = col0 = 0, ld = k) */
    int64_t row0, col0, ld;
} muse_linear;

/* A weight vector (norms, router bias) as an fp32 copy, checked finite at load. */
typedef struct {
    float *v; /* [n], NULL when absent */
    int64_t n;
    int32_t id; /* 0 .. n_vecs-1 */
} muse_vec;

typedef struct {
    muse_linear gate, up, down;
} muse_mlp;

typedef struct {
    muse_vec input_norm, post_attn_norm, pre_ff_norm, post_ff_norm; /* [H] */
    muse_linear q, k, v, gate, o;
    muse_mlp dense;            /* dense layers */
    const muse_tensor *router; /* [E, H], MoE layers */
    muse_vec router_bias;      /* [E], v NULL when absent */
    muse_mlp *experts;         /* [E] */
    muse_vec *expert_norm;     /* [E] x [H] when expert_output_norm */
    muse_mlp shared;           /* when num_shared_experts > 0: intermediate = n_shared * moe_I */
} muse_layer;

typedef struct {
    muse_config cfg;
    char dir[1024];
    muse_st *st;
    const muse_tensor *embed; /* [V, H] */
    muse_vec final_norm;      /* [H] */
    muse_linear head;         /* k = H, n = V (or padded) */
    muse_layer *layers;
    uint64_t params_total, params_active; /* logical parameters */
    int32_t n_linears, n_vecs;            /* ids handed out at load */
    /* synthetic weights with on_device: the tensors a CUDA upload fills in GPU memory (their
     * host pages untouched until muse_model_host_weights); NULL otherwise */
    muse_synth_devs *dev_fill;
    int shapes_only; /* muse_synthetic's: no weight is filled, none may be read */
} muse_model;

/* Loads and checks a pack. Prints progress on stderr when reading takes over a second. */
int muse_model_load(const char *dir, muse_model *m, muse_err *e);

/* Weights from a seed, no files: every tensor of the config file's shape filled in memory
 * (synthetic.h), fp16 (bits 0) or EXL3 at bits (1..8; the head at 6) with codebook. */
typedef struct {
    const char *config; /* a config.json */
    uint64_t seed;
    int bits;
    const char *codebook; /* "mul1" (default), "mcg", "3inst" */
    int on_device;        /* the trellises and scales left for the GPU to fill (--backend cuda) */
    int shapes_only;      /* nothing filled: the tensors' shapes for a memory plan */
} muse_synthetic;
int muse_model_synthetic(const muse_synthetic *o, muse_model *m, muse_err *e);
/* Makes every weight readable on the host: fills what was left for a GPU there (once). For
 * host readers of the weights: any backend but cuda, a GPU's packed shard. */
void muse_model_host_weights(const muse_model *m);
/* The weight flags of a command: --model DIR, or --synthetic-weights SEED (< 0: none) with
 * --config and optional --bits and --codebook; -1 naming what is missing or given twice. */
int muse_model_flags_check(const char *dir, long long synthetic, const char *config, long long bits,
                           const char *codebook, muse_err *e);
void muse_model_free(muse_model *m);

/* Reads one embedding row as fp32. */
void muse_model_embed_row(const muse_model *m, int64_t token, float *out);
/* Converts a dense weight's row r (length k) to fp32. */
void muse_dense_row(const muse_linear *l, int64_t r, float *out);

#endif
