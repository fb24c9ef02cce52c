/* Prometheus-style histograms of the scheduler's figures (TTFT, decode rate) for /health
 * and /metrics. */
#include "serve/hist.h"

#include <stdio.h>
#include <string.h>

void muse_hist_init(muse_hist *h, const double *le, int n)
{
    h->n = n;
    memcpy(h->le, le, (size_t)n * sizeof *le);
}

void muse_hist_observe(muse_hist *h, double v)
{
    for (int i = 0; i < h->n; i++)
        if (v <= h->le[i]) h->counts[i]++;
    h->count++;
    h->sum += v;
}

int muse_hist_json(const muse_hist *h, const char *name, char *buf, size_t cap)
{
    size_t at = 0;
    int w = snprintf(buf, cap, "\"%s\":{\"le\":[", name);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < h->n && w >= 0 && (at += (size_t)w) < cap; i++)
            w = pass ? snprintf(buf + at, cap - at, "%s%llu", i ? "," : "",
                                (unsigned long long)h->counts[i])
                     : snprintf(buf + at, cap - at, "%s%g", i ? "," : "", h->le[i]);
        if (w < 0 || (at += (size_t)w) >= cap) return -1;
        w = snprintf(buf + at, cap - at, pass ? "]," : "],\"counts\":[");
    }
    if (w < 0 || (at += (size_t)w) >= cap) return -1;
    w = snprintf(buf + at, cap - at, "\"sum\":%.6f,\"count\":%llu}", h->sum,
                 (unsigned long long)h->count);
    return w < 0 || at + (size_t)w >= cap ? -1 : (int)(at + (size_t)w);
}
