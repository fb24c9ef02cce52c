/* Prometheus-style histograms of the scheduler's figures (TTFT, decode rate); health.c writes
 * them into /health and /metrics. */
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
