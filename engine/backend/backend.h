/* The operations a backend implements. The forward plan (forward.c) calls only these, on
 * buffers the backend allocated at start, so it never touches data and a decode round
 * allocates nothing (a CUDA backend can capture it as a graph). Shapes in comments:
 * R rows of the batch, H hidden, Q = Hq*head_dim, KV = Hkv*head_dim. */
#ifndef MUSE_BACKEND_H
#define MUSE_BACKEND_H

#include "model/kv_pool.h"
#include "model/model.h"

/* One forward's rows. Rows of one sequence are consecutive positions, ascending, and the
 * caller has reserved KV blocks for them (muse_kv_ensure on be->kv). */
typedef struct {
    long rows;
    const int32_t *tokens;      /* [R] */
    const int64_t *positions;   /* [R] absolute position of each row */
    const int32_t *seqs;        /* [R] KV slot of each row, 0 .. max_seqs-1 */
    const uint8_t *want_logits; /* [R] 1 where logits are wanted, or NULL for every row */
} muse_batch;

typedef enum { MUSE_NORM_NONE, MUSE_NORM_PLUS1, MUSE_NORM_PLAIN } muse_norm_weight;

typedef struct muse_backend muse_backend;

/* Sizes fixed at start: every workspace and the KV cache come from these. */
typedef struct {
    long max_rows;     /* rows a forward may carry */
    int max_seqs;      /* KV slots */
    int64_t context;   /* positions per sequence */
    int64_t kv_blocks; /* full-attention KV blocks in the pool; 0: max_seqs x context */
    int threads;       /* CPU threads (<= 0: all cores) */
} muse_backend_opts;

typedef struct {
    const char *name;
    /* Buffers for the plan's activations; only at start. */
    float *(*alloc)(muse_backend *be, size_t floats);
    /* out[R,H] = rms(embed[tokens], eps), fp32 (the residual stream) */
    void (*embed)(muse_backend *be, const muse_batch *b, float *out);
    /* out[R,W] = rms(x, eps) * (w | 1+w | 1), rounded to fp16 when round16 */
    void (*norm)(muse_backend *be, const float *x, long rows, long width, const float *w,
                 muse_norm_weight mode, float eps, int round16, float *out);
    /* h[R,H] += (1 + w) * rms(y, eps) */
    void (*add_norm)(muse_backend *be, float *h, const float *y, long rows, long width,
                     const float *w, float eps);
    /* y[R,n] = x[R,k] W, fp32 sums; rounded to fp16 when round16 */
    void (*linear)(muse_backend *be, const muse_linear *l, const float *x, long rows, int round16,
                   float *y);
    /* Per head: unweighted rms (eps), RoPE NEOX at each row's position (theta 0: none), fp16 */
    void (*qk_norm_rope)(muse_backend *be, float *x, const muse_batch *b, long heads, long head_dim,
                         double theta, float eps);
    /* Writes k, v [R,KV] of layer to the cache, then o[R,Q] = softmax(q k^T * scale) v,
     * causal, sliding when window > 0, then o = fp16(o * sigmoid(g)). */
    void (*attention)(muse_backend *be, int layer, const muse_batch *b, const float *q,
                      const float *k, const float *v, const float *g, float *o);
    /* out[R,I] = fp16(silu(gate) * up) */
    void (*swiglu)(muse_backend *be, const float *gate, const float *up, long n, float *out);
    /* y[R,H] = routed experts (router, selection, weights, outputs) + shared experts */
    void (*moe)(muse_backend *be, const muse_layer *ly, const float *b, long rows, float *y);
    /* logits[n_wanted, V] from x[R,H] (already normed): head, multiplier, softcap */
    void (*head)(muse_backend *be, const float *x, const muse_batch *b, float *logits);
    /* The sliding-window layers' K and V of the last W positions before end_pos: what a
     * sequence must get back to resume at end_pos (prompt cache). */
    size_t (*sliding_bytes)(muse_backend *be, int64_t end_pos);
    void (*sliding_save)(muse_backend *be, int seq, int64_t end_pos, void *dst);
    void (*sliding_load)(muse_backend *be, int seq, int64_t end_pos, const void *src);
} muse_backend_ops;

struct muse_backend {
    const muse_backend_ops *ops;
    const muse_model *model;
    muse_backend_opts opts;
    muse_kv_pool kv;         /* block tables of the full-attention layers */
    uint64_t kv_block_bytes; /* one block: every full layer's K and V for MUSE_KV_BLOCK positions */
    uint64_t kv_bytes;       /* KV cache held for all sequence slots */
    uint64_t workspace_bytes; /* activations and scratch sized at start */
};

/* The CPU reference backend. */
muse_backend *muse_cpu_backend_create(const muse_model *m, const muse_backend_opts *o, muse_err *e);
void muse_cpu_backend_destroy(muse_backend *be);
/* Bytes of KV cache per token of one sequence (all layers, fp16 K and V). */
uint64_t muse_kv_bytes_per_token(const muse_config *c);
/* The same for the full-attention layers only: what the paged pool holds a token. */
uint64_t muse_kv_full_bytes_per_token(const muse_config *c);

#endif
