/* Deterministic random numbers for packs: a counter-based hash of (seed, tensor name, index),
 * so a tensor's values do not depend on the order or shard it is written in. The integer mix
 * and the unit draw are MUSE_HD (one copy for the host and the synthetic fill's kernels); the
 * normal draw is host only (the device's log/cos are not the host's bit for bit). */
#ifndef MUSE_PACK_RANDOM_H
#define MUSE_PACK_RANDOM_H

#include <math.h>
#include <stdint.h>

#include "base/host_device.h"

MUSE_HD uint64_t muse_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

static inline uint64_t muse_hash_name(const char *s, uint64_t seed)
{
    uint64_t h = 0xCBF29CE484222325ull ^ seed;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
    return muse_mix64(h);
}

/* Uniform in (0, 1) from a key and a counter. */
MUSE_HD double muse_unit(uint64_t key, uint64_t i)
{
    uint64_t x = muse_mix64(key + 0x9E3779B97F4A7C15ull * (i + 1));
    return ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller over two counters). */
static inline double muse_normal(uint64_t key, uint64_t i)
{
    double u1 = muse_unit(key, 2 * i), u2 = muse_unit(key, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
