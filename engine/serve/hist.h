/* Prometheus-style histograms: fixed bucket bounds set once, cumulative counts. */
#ifndef MUSE_HIST_H
#define MUSE_HIST_H

#include <stddef.h>
#include <stdint.h>

#define MUSE_HIST_MAX 16

/* A Prometheus-style histogram: counts[i] observations <= le[i] (cumulative), + the rest. */
typedef struct {
    int n;
    double le[MUSE_HIST_MAX];
    uint64_t counts[MUSE_HIST_MAX];
    uint64_t count;
    double sum;
} muse_hist;

void muse_hist_init(muse_hist *h, const double *le, int n);
void muse_hist_observe(muse_hist *h, double v);

#endif
