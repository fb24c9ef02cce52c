/* moe_order.h: the order the MoE's combine adds a row's slots in (ascending expert index, each
 * expert once at its lowest slot, negative indices left out: cpu_backend.c's loop), as MUSE_HD
 * helpers, so t/unit/test_moe_order.c checks on the CPU that the combine kernel's parallel
 * form (kernels/moe.cu: a thread a slot) gives the serial walk's order. */
#ifndef MUSE_K_MOE_ORDER_H
#define MUSE_K_MOE_ORDER_H

#include <stdint.h>

#include "base/host_device.h"

/* The serial walk: the next expert index up, the lowest slot at a tie. Writes the slots in
 * order to at and returns how many. */
MUSE_HD int muse_moe_order_walk(const int32_t *sel, long K, int32_t *at)
{
    int32_t last = -1;
    int n = 0;
    for (long m = 0; m < K; m++) {
        long a = -1;
        for (long i = 0; i < K; i++)
            if (sel[i] > last && (a < 0 || sel[i] < sel[a])) a = i;
        if (a < 0) break;
        last = sel[a];
        at[n++] = (int32_t)a;
    }
    return n;
}

/* Whether slot t leads its expert (a valid index not in a lower slot). */
MUSE_HD int muse_moe_order_leads(const int32_t *sel, int t)
{
    int32_t v = sel[t];
    if (v < 0) return 0;
    for (int j = 0; j < t; j++)
        if (sel[j] == v) return 0;
    return 1;
}

/* The place in the walk of a leader of expert v: the leaders with a lower expert index (lead:
 * each slot's muse_moe_order_leads). */
MUSE_HD int muse_moe_order_place_of(const int32_t *sel, const int32_t *lead, long K, int32_t v)
{
    int below = 0;
    for (long i = 0; i < K; i++) below += lead[i] && sel[i] < v;
    return below;
}

/* A leading slot t's place in the walk: muse_moe_order_place_of its expert (kept apart: the
 * exact combine's machine code as it ran). */
MUSE_HD int muse_moe_order_place(const int32_t *sel, const int32_t *lead, long K, int t)
{
    int below = 0;
    for (long i = 0; i < K; i++) below += lead[i] && sel[i] < sel[t];
    return below;
}

#endif
