/* The one monotonic clock every part of the engine and its tools reads. */
#ifndef MUSE_CLOCK_H
#define MUSE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline int64_t muse_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The same clock in whole milliseconds: deadlines of socket waits. */
static inline int64_t muse_now_ms_int(void)
{
    return muse_now_ns() / 1000000;
}

/* The same clock in milliseconds and in seconds. */
static inline double muse_now_ms(void)
{
    return (double)muse_now_ns() / 1e6;
}

static inline double muse_now_s(void)
{
    return (double)muse_now_ns() / 1e9;
}

/* CLOCK_REALTIME in nanoseconds: for stamps other processes compare, never for intervals. */
static inline int64_t muse_unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
