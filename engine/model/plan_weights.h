/* The weights a rank holds, from the config alone (no pack, no loading): what the memory plan
 * counts before any large allocation, and what `muse-engine plan` prints for any shape. The
 * split follows model/shard.c's rules, so the estimate and the backends cut the same way. */
#ifndef MUSE_PLAN_WEIGHTS_H
#define MUSE_PLAN_WEIGHTS_H

#include <stdint.h>

#include "pack/config.h"

/* Bytes of rank's weights out of ranks: EXL3 Linears at bits a weight (fractional allowed: k x n
 * costs k*n*bits/8 of trellis plus fp16 suh [k] and svh [n]), the head at head_bits; bits 0:
 * fp16/bf16 Linears. Embeddings, norms and the router are fp16 and the router bias fp32, as the
 * pack stores them, on every rank. */
uint64_t muse_plan_weights_rank(const muse_config *c, double bits, double head_bits, int rank,
                                int ranks);

#endif
