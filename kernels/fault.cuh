/* fault: a deliberate device fault for the test hooks (--fault-sticky-after-tokens on the
 * CUDA backend): a store through an invalid address, so the next synchronize returns a real
 * cudaErrorIllegalAddress and the context is broken as a real fault breaks it. */
#ifndef MUSE_K_FAULT_CUH
#define MUSE_K_FAULT_CUH
#include "launch.h"
/* Launches the faulting kernel on ctx's st; returns the launch's error code (0: the fault comes
 * at the next synchronize). Never called outside the test hooks. */
MUSE_K_API int muse_k_fault_illegal_address(const muse_k_ctx *ctx);
#endif
