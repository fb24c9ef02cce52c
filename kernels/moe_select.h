/* moe_select.h: the fast selection's place count (kernels/moe_fast.cu k_select_group_fast) as
 * MUSE_HD helpers: how many threads share a key's count, and one thread's part of it, so
 * t/unit/test_moe_select.c checks on the CPU that the parts add up to the whole count (the
 * expert's place in its row: keys descending, the lower expert first at a tie). */
#ifndef MUSE_K_MOE_SELECT_H
#define MUSE_K_MOE_SELECT_H

#include "base/host_device.h"

/* Threads a key for keys keys in one block of at most 1024: a power of two up to 32 (lanes
 * of one warp, whose counts shuffles add), 1 from 513 keys on. */
MUSE_HD int muse_select_split(long keys)
{
    int s = 1;
    while (s < 32 && keys * s * 2 <= 1024) s *= 2;
    return s;
}

/* The keys of row kr (E of them) before expert x's among experts [part E / S, (part + 1) E /
 * S): the part-th of S shares of x's place. */
MUSE_HD int muse_select_place_part(const float *kr, int E, int x, int part, int S)
{
    float kx = kr[x];
    int place = 0, y1 = (part + 1) * E / S;
    for (int y = part * E / S; y < y1; y++) {
        float ky = kr[y];
        place += ky > kx || (ky == kx && y < x);
    }
    return place;
}

#endif
