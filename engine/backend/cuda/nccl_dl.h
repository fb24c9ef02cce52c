/* NCCL loaded at run time (dlopen of libnccl.so.2), so the binary starts on machines without
 * NCCL: only a backend whose ranks sit on different GPUs without peer access needs it. The
 * types come from nccl.h where the toolkit has it, else from the few stable ABI values below. */
#ifndef MUSE_NCCL_DL_H
#define MUSE_NCCL_DL_H

#include <cuda_runtime_api.h>

#include "base/muse_common.h"

#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
#define MUSE_HAVE_NCCL_H 1
#endif
#endif
#ifndef MUSE_HAVE_NCCL_H
typedef struct ncclComm *ncclComm_t;
typedef enum { ncclSuccess = 0 } ncclResult_t;
typedef enum { ncclFloat = 7 } ncclDataType_t; /* ncclFloat32 in every NCCL 2.x */
#endif

/* The entry points muse uses, resolved by name. */
typedef struct {
    const char *(*GetErrorString)(ncclResult_t r);
    ncclResult_t (*CommInitAll)(ncclComm_t *comms, int ndev, const int *devlist);
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*AllGather)(const void *send, void *recv, size_t count, ncclDataType_t type,
                              ncclComm_t comm, cudaStream_t st);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
} muse_nccl;

/* The library, loaded once a process; NULL with the reason (dlerror, what to install). */
const muse_nccl *muse_nccl_load(muse_err *e);

#endif
