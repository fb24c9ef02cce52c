/* mma.cuh: the warp-level instructions the fast kernels' tensor-core loops share, as inline PTX
 * (sm_80 and up): a shared-memory address, the 16-byte cp.async with zero fill and its commit and
 * wait, ldmatrix x2 and x4 (x4 also transposed) and the m16n8k16 fp16 mma into fp32 sums. */
#ifndef MUSE_K_MMA_CUH
#define MUSE_K_MMA_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t k_smem(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, zero-filled where !valid (no global read then: src may be any
 * valid address) */
__device__ __forceinline__ void k_cp16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(k_smem(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void k_cp_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}
/* the thread's cp.async groups but the newest N landed (others' need a barrier after) */
template <int N> __device__ __forceinline__ void k_cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* four 8x8 b16 matrices, lanes 8 i .. 8 i + 7 giving matrix i's row addresses; r[i] its fragment */
__device__ __forceinline__ void k_ldsm4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(k_smem(p)));
}
/* two 8x8 b16 matrices, lanes 8 i .. 8 i + 7 giving matrix i's row addresses (lanes 16-31
 * unread, any shared address) */
__device__ __forceinline__ void k_ldsm2(uint32_t r[2], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(k_smem(p)));
}
/* four, each matrix transposed */
__device__ __forceinline__ void k_ldsm4t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(k_smem(p)));
}

/* c += a b: A 16x16 row-major fragment a, B 16x8 column-major fragment (b0, b1), fp32 c */
__device__ __forceinline__ void k_mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                           uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
