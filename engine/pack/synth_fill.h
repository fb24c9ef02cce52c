/* The synthetic fill of the tensors a GPU fills in its own memory (EXL3 trellises and their
 * fp16 scales): one element as a function of (key, i), MUSE_HD, so synthetic.c on the host and
 * kernels/synth_fill.cu on the device run this one copy and write the same bytes. Only integer
 * ops and IEEE double mul/add/convert, each rounded on its own (kernels build -fmad=false). */
#ifndef MUSE_SYNTH_FILL_H
#define MUSE_SYNTH_FILL_H

#include <stdint.h>

#include "base/f16.h"
#include "base/host_device.h"
#include "pack/pack_random.h"

enum {
    MUSE_SYNTH_TRELLIS = 0, /* uint16 words: the top 16 bits of mix64(key + i) */
    MUSE_SYNTH_SCALE = 1    /* fp16: +-scale * (0.8 + 0.4 u), the sign from a second draw */
};

/* One device-filled tensor: n uint16 elements, its name's key, its mode and scale. */
typedef struct {
    uint64_t key, n;
    double scale; /* MUSE_SYNTH_SCALE: suh's 1/sqrt(k); svh's 1.0 (times 1.0 is exact) */
    int mode;
} muse_synth_elem;

MUSE_HD uint16_t muse_synth_trellis_at(uint64_t key, uint64_t i)
{
    return (uint16_t)(muse_mix64(key + i) >> 48);
}

/* Element i of a scale vector of n: the sign from draw i, the size from draw i + n. */
MUSE_HD uint16_t muse_synth_scale_at(uint64_t key, uint64_t n, double scale, uint64_t i)
{
    double sign = muse_unit(key, i) < 0.5 ? -1.0 : 1.0;
    double v = sign * scale * (0.8 + 0.4 * muse_unit(key, i + n));
    return muse_f32_to_f16((float)v);
}

MUSE_HD uint16_t muse_synth_at(const muse_synth_elem *s, uint64_t i)
{
    return s->mode == MUSE_SYNTH_TRELLIS ? muse_synth_trellis_at(s->key, i)
                                         : muse_synth_scale_at(s->key, s->n, s->scale, i);
}

#endif
