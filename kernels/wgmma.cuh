/* wgmma.cuh: the warpgroup-level instructions (sm_90a) the fast product's wgmma forms share, as
 * inline PTX: the shared-memory descriptor, the m64n128k16 fp16 mma into fp32 accumulators (A
 * from shared memory or from registers; m64n64k16 with A from registers), its fences, commit and
 * wait, the async-proxy fence, and the mbarriers that hand stages between the warp-specialized
 * form's decode warps and its multiplying warpgroup. Where the GPU code is not
 * sm_90a (WG_ON unset) each is empty: the launches refuse before any such kernel runs. */
#ifndef MUSE_K_WGMMA_CUH
#define MUSE_K_WGMMA_CUH

#include <stdint.h>

#include "mma.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ON 1
#endif

/* the descriptor of K-major rows in the 128-byte swizzle: 8-row groups 1024 bytes apart (the
 * leading offset unused: 1); saddr may step by 32 bytes a k-tile inside the 1024-aligned atoms */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

#define WG_D64(d)                                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])

/* d += A B, m64n128k16, A and B from shared memory by descriptor, fp32 accumulators */
__device__ __forceinline__ void wg_mma(float d[64], uint64_t da, uint64_t db)
{
#ifdef WG_ON
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"
                 "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,"
                 "%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,"
                 "%62,%63}, %64, %65, 1, 1, 1, 0, 0;\n"
                 : WG_D64(d)
                 : "l"(da), "l"(db));
#endif
}

#define WG_D32(d)                                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

/* d += A B, m64n128k16, A from registers (the m16n8k16 A fragment of the warp's 16 rows), B from
 * shared memory by descriptor: the form whose A is decoded in registers (linear_fast_wr.cu) */
__device__ __forceinline__ void wg_mma_rs(float d[64], const uint32_t a[4], uint64_t db)
{
#ifdef WG_ON
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"
                 "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,"
                 "%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,"
                 "%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 0;\n"
                 : WG_D64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#endif
}
/* the same at m64n64k16 */
__device__ __forceinline__ void wg_mma_rs64(float d[32], const uint32_t a[4], uint64_t db)
{
#ifdef WG_ON
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"
                 "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"
                 : WG_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#endif
}

__device__ __forceinline__ void wg_fence(void)
{
#ifdef WG_ON
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit(void)
{
#ifdef WG_ON
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wg_wait(void)
{
#ifdef WG_ON
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* this thread's shared-memory writes (plain and cp.async, landed) seen by the async proxy */
__device__ __forceinline__ void wg_fence_smem(void)
{
#ifdef WG_ON
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* an mbarrier of count arrivals a phase (one thread initializes; a block barrier after) */
__device__ __forceinline__ void wg_bar_init(uint64_t *bar, unsigned count)
{
#ifdef WG_ON
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(k_smem(bar)), "r"(count)
                 : "memory");
#endif
}
/* this thread's arrival, releasing its earlier writes to whoever waits on the phase */
__device__ __forceinline__ void wg_bar_arrive(uint64_t *bar)
{
#ifdef WG_ON
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(k_smem(bar)) : "memory");
#endif
}
/* whether the phase of parity `parity` has completed (acquiring the arrivals' writes); a try
 * may suspend the warp up to the time hint (CUTLASS's 0x989680) before it answers no */
__device__ __forceinline__ bool wg_bar_try(uint64_t *bar, unsigned parity)
{
    uint32_t done = 1;
#ifdef WG_ON
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, 0x989680;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(k_smem(bar)), "r"(parity)
                 : "memory");
#endif
    return done != 0;
}
/* until that phase has completed */
__device__ __forceinline__ void wg_bar_wait(uint64_t *bar, unsigned parity)
{
    while (!wg_bar_try(bar, parity)) {
    }
}

#endif
