/* synth_fill: four elements a thread, one 8-byte store, grid-stride over [n/4]; the last n % 4
 * by the first threads. Integer mixes and IEEE double ops only (-fmad=false: no contraction),
 * so each element is the host's. */
#include "synth_fill.cuh"

__global__ void k_synth_fill(muse_synth_elem el, uint16_t *out)
{
    uint64_t quads = el.n / 4, stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t t0 = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (uint64_t t = t0; t < quads; t += stride) {
        uint64_t i = 4 * t;
        ushort4 v = make_ushort4(muse_synth_at(&el, i), muse_synth_at(&el, i + 1),
                                 muse_synth_at(&el, i + 2), muse_synth_at(&el, i + 3));
        ((ushort4 *)out)[t] = v;
    }
    if (t0 < el.n % 4) out[4 * quads + t0] = muse_synth_at(&el, 4 * quads + t0);
}

MUSE_K_API int muse_k_synth_fill(cudaStream_t st, muse_synth_elem el, uint16_t *out)
{
    if (el.n == 0) return 0;
    if ((uintptr_t)out % 8) return (int)cudaErrorInvalidValue;
    uint64_t quads = el.n / 4 + 1, blocks = (quads + 255) / 256;
    if (blocks > 4096) blocks = 4096; /* enough to fill any GPU; the loop covers the rest */
    k_synth_fill<<<(unsigned)blocks, 256, 0, st>>>(el, out);
    return (int)cudaGetLastError();
}
