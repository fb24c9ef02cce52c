/* pdl.cuh: programmatic dependent launch (Hopper's griddepcontrol) for the kernels of a round.
 * A kernel launched through k_launch may start while the kernel before it on the stream still
 * runs: its blocks get resident and load what no kernel writes (weights) before that one ends,
 * which hides the launch and the ramp between the round's many short kernels. The rule that
 * keeps it safe: every block of a kernel launched so calls K_PDL_WAIT() before it reads or writes
 * anything an earlier kernel of the round reads or writes, and before any return, since a grid
 * that ends without waiting would let the next one pass its predecessor. K_PDL_NEXT() only lets
 * the next kernel be launched early. Neither changes a result: the same sums in the same order.
 * MUSE_PDL=0 from the environment launches every kernel plainly (read once a process). */
#ifndef MUSE_K_PDL_CUH
#define MUSE_K_PDL_CUH

#include <cuda_runtime.h>

#include "launch.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define K_PDL_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")
#define K_PDL_NEXT() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#else
#define K_PDL_WAIT() ((void)0)
#define K_PDL_NEXT() ((void)0)
#endif

/* 1 where kernels launch with the programmatic attribute (kernels/pdl.cu) */
MUSE_K_API int muse_k_pdl_on(void);

/* fn<<<grid, block, smem, st>>>(args...), with the attribute where muse_k_pdl_on(); the CUDA
 * error of the launch (the last error cleared, as the <<<>>> launchers do) */
template <typename... P, typename... A>
static inline int k_launch(void (*fn)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                           A... args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = muse_k_pdl_on() ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, fn, args...), last = cudaGetLastError();
    return (int)(e != cudaSuccess ? e : last);
}

#endif
