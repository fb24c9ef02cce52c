/* Tensor parallelism's rules (MUSE_SPARK.md): which ranks counts a config allows, each rank's
 * heads, and the view of a weight a rank holds (a slice of the mmap'd tensor, cut on tile and
 * 128-wide Hadamard boundaries for EXL3). Backends build their per-rank weights from these. */
#ifndef MUSE_SHARD_H
#define MUSE_SHARD_H

#include "model/model.h"

/* Admission before any large allocation: ranks must divide the query heads, divide the KV heads
 * or be a multiple of them, and keep every split width (q, dense, expert, shared) on a multiple
 * of 128. Errors name the setting, the value and what is accepted. */
int muse_shard_check(const muse_config *c, int ranks, muse_err *e);

/* Rank's share [lo, hi) of n split on align boundaries (the last ranks may get one block less). */
void muse_shard_split(int64_t n, int64_t align, int rank, int ranks, int64_t *lo, int64_t *hi);

/* A rank's attention heads: query heads [q0, q1), KV heads [kv0, kv1) it keeps in its cache.
 * When there are fewer KV heads than ranks, ranks share a KV head (each holds a copy). */
typedef struct {
    int64_t q0, q1, kv0, kv1;
} muse_rank_heads;
void muse_shard_heads(const muse_config *c, int rank, int ranks, muse_rank_heads *h);

/* The rank's view of linear l (whole when replicated): the output columns [lo, hi) of an output
 * split, the input rows [lo, hi) of an input split (bias kept on rank 0 alone). */
int muse_shard_view(const muse_linear *l, int64_t lo, int64_t hi, int keep_bias, muse_linear *v,
                    muse_err *e);
/* The range of l that rank holds under the model's rules (lo = 0, hi = width when whole). */
void muse_shard_range(const muse_model *m, const muse_linear *l, int rank, int ranks, int64_t *lo,
                      int64_t *hi);

/* The same from the config alone (the memory plan sizes weights before any pack exists): width
 * is the split dimension (n of an output split, k of an input split). */
void muse_shard_range_cfg(const muse_config *c, muse_lin_role role, muse_linear_kind kind,
                          int64_t width, int rank, int ranks, int64_t *lo, int64_t *hi);

/* A view packed compactly (a device backend uploads only its shard): dense rows exactly k long
 * (row0 = col0 = 0, ld = k), an EXL3 trellis of the view's tiles alone (tiles_ld = n/16) and its
 * scales and bias, each part at a 256-byte boundary of dst. The same weights at the same
 * indices, so every linear computes the same bits from it. */
size_t muse_shard_packed_bytes(const muse_linear *v);
/* Writes v's bytes into dst (muse_shard_packed_bytes(v) long; parts at 256-byte offsets from it)
 * and sets *p to v reading dst; a dense *p reads through *t (v's tensor, data = dst). */
void muse_shard_pack(const muse_linear *v, void *dst, muse_tensor *t, muse_linear *p);

/* Bytes of the weight data a view reads (trellis and scales, or fp16 rows). */
uint64_t muse_linear_bytes(const muse_linear *l);

/* The exact EXL3 product's workspace over a round's calls (kernels/linear.cu: rows x k floats
 * and rows x n doubles a call): the routed experts' linears at `pairs` rows (a (row, slot) pair
 * each), the head at `wanted` rows (the rows it runs on), every other EXL3 linear at `rows`;
 * whole linears, so every rank's view fits. */
void muse_model_exl3_ws(const muse_model *m, long rows, long pairs, long wanted, size_t *floats,
                        size_t *doubles);

/* Calls fn on every linear of the model (attention, MLPs, experts, shared experts, head). */
void muse_model_each_linear(const muse_model *m, void (*fn)(void *ctx, const muse_linear *l),
                            void *ctx);

#endif
