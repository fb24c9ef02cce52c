/* MUSE_HD: a helper compiled for the host (C11) and, included from a .cu file, for the device
 * too, so the two sides run one copy of code whose bits must agree. */
#ifndef MUSE_HOST_DEVICE_H
#define MUSE_HOST_DEVICE_H

#ifdef __CUDACC__
#define MUSE_HD static __host__ __device__ __forceinline__
#else
#define MUSE_HD static inline
#endif

#endif
