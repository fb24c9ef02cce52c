/* synth_fill: a synthetic tensor's uint16 elements (trellis words or fp16 scales) written in
 * GPU memory, bit for bit synthetic.c's host fill (pack/synth_fill.h, the one copy both run). */
#ifndef MUSE_K_SYNTH_FILL_CUH
#define MUSE_K_SYNTH_FILL_CUH
#include "launch.h"
#include "pack/synth_fill.h"
/* out: [el.n] uint16, 8-byte aligned (cudaErrorInvalidValue otherwise); async on st */
MUSE_K_API int muse_k_synth_fill(cudaStream_t st, muse_synth_elem el, uint16_t *out);
#endif
