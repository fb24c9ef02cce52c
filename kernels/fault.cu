/* fault: one thread stores through an address no allocation holds (the null page), for the
 * test hooks' sticky device error (kernels/fault.cuh). The address comes in as an argument so
 * the compiler cannot see it and turn the store into a trap: the MMU faults it at run time. */
#include "fault.cuh"

__global__ void k_fault_store(volatile int *where)
{
    *where = 0x6d757365; /* "muse" */
}

MUSE_K_API int muse_k_fault_illegal_address(const muse_k_ctx *ctx)
{
    cudaStream_t st = ctx->st;
    volatile int *bad = (volatile int *)(uintptr_t)0x10; /* inside the unmapped null page */
    k_fault_store<<<1, 1, 0, st>>>(bad);
    return (int)cudaGetLastError();
}
