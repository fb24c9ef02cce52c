/* moe_order.cuh: the combine's slot order found once a block (moe_order.h's walk, a thread a
 * slot), for the exact combine (kernels/moe.cu) and the fast one with the expert norms
 * (kernels/moe_combine_fast.cu). Included by .cu only. */
#ifndef MUSE_K_MOE_ORDER_CUH
#define MUSE_K_MOE_ORDER_CUH

#include <stdint.h>

#include "moe_order.h"

/* The slots a combine block reads, up to MC_MAX_K of them in shared memory (more: each thread
 * walks sel itself, the same order) */
#define MC_MAX_K 64

/* Row r's slots in the walk's order (moe_order.h), a thread a slot: whether slot t leads its
 * expert, then a leader's place. Returns the count; s_at [count] the slots. */
static __device__ int d_combine_order(const int32_t *sr, long K, int32_t *s_sel, int32_t *s_lead,
                               int32_t *s_at, int *s_n)
{
    int t = threadIdx.x;
    if (t < K) s_sel[t] = sr[t];
    __syncthreads();
    if (t < K) s_lead[t] = muse_moe_order_leads(s_sel, t);
    __syncthreads();
    if (t < K && s_lead[t]) s_at[muse_moe_order_place(s_sel, s_lead, K, t)] = t;
    if (t == 0) {
        int leaders = 0;
        for (long i = 0; i < K; i++) leaders += s_lead[i];
        *s_n = leaders;
    }
    __syncthreads();
    return *s_n;
}

#endif
