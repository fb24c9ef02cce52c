/* The /health page: the JSON nginx serves for GET /health (status, streams, prompt cache, each
 * rank's memory, counters, histograms), built with cJSON from what the engine measures. */
#ifndef MUSE_HEALTH_H
#define MUSE_HEALTH_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "serve/memory_plan.h"
#include "serve/scheduler.h"

typedef struct {
    const char *status; /* muse_health_status() */
    const char *model_id, *backend;
    const char *device, *arch; /* of every rank: "cpu" and uname's machine on the CPU backend */
    int pid;
    double uptime_s;
    int queued;                   /* busy slots beyond the running streams */
    long long context_length;     /* 0 while starting */
    double prompt_cache_gib;      /* the budget as given; shown when the cache has one */
    const muse_sched_stats *st;   /* zeroed while starting */
    const muse_memory_plan *plan; /* NULL while starting */
    uint64_t total_bytes;         /* the machine's memory */
    uint64_t weights_bytes;       /* the pack's tensors */
    uint64_t reserve_bytes;       /* kept for the rest of the machine */
    uint64_t free_bytes;          /* MemAvailable */
    uint64_t peak_bytes;          /* VmHWM */
    /* a GPU rank's device memory once started (backend device_memory); 0: the machine's above */
    uint64_t rank_total[MUSE_PLAN_MAX_RANKS], rank_free[MUSE_PLAN_MAX_RANKS];
} muse_health;

/* "starting" (state 0), "down" (2), else "degraded" when less than the reserve is free, "ok". */
const char *muse_health_status(int state, uint64_t free_bytes, uint64_t reserve_bytes);

/* The /health JSON, compact, malloc'd (free it). */
char *muse_health_json(const muse_health *h);

/* A histogram as {"le":[..],"counts":[..],"sum":x,"count":n}. */
cJSON *muse_hist_json(const muse_hist *h);

/* The kB figure of a /proc file's line ("MemAvailable:", "VmHWM:"), in bytes; 0 when absent. */
uint64_t muse_proc_kb(const char *path, const char *key);

#endif
