/* mma-probe: two facts about the GPU's tensor cores that the fast product's prompt path rests
 * on, measured rather than assumed (sm_90a only; run on the device, docs/gpu.md):
 *  1. bits: does wgmma (m64n64k16, fp16 in, fp32 accumulate, B from shared memory) give the
 *     bits of mma.sync m16n8k16 over the same k chain from the same accumulators? If it does,
 *     prompt rows on wgmma can equal decode rows on mma.sync (batch invariance); if not, both
 *     must run the same instruction.
 *  2. rate: the TFLOP/s each instruction reaches alone (operands in registers / shared memory,
 *     no loads), the ceiling a product built on it can approach.
 * Usage: mma-probe [trials]. Prints a table; exit status 1 if the wgmma result is not the
 * product at all (its shared-memory layout wrong), 0 otherwise (unequal bits are an answer). */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/wgmma.cuh" /* the m64n64k16 register-A wgmma the kernels run */

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#define PM 64 /* rows of the probe's tile */
#define PN 64 /* columns */

__device__ __forceinline__ uint32_t pk(const __half *p0, const __half *p1)
{
    return (uint32_t)__half_as_ushort(*p0) | (uint32_t)__half_as_ushort(*p1) << 16;
}

/* lane's A fragment of rows r0.. (16) at k-step ks (mma m16n8k16 layout, which wgmma's register
 * A repeats a warp a 16 rows) */
__device__ __forceinline__ void a_frag(const __half *A, int K, int r0, int ks, int lane,
                                       uint32_t a[4])
{
    int g = lane / 4, t = lane % 4, k0 = ks * 16 + 2 * t;
    const __half *p = A + (long)(r0 + g) * K + k0, *q = p + 8L * K;
    a[0] = pk(p, p + 1);
    a[1] = pk(q, q + 1);
    a[2] = pk(p + 8, p + 9);
    a[3] = pk(q + 8, q + 9);
}

/* D[64][64] = C0 + A[64][K] B: B given n-major, Bt[n][K]; 4 warps, warp w rows 16 w */
__global__ void k_sync(const __half *A, const __half *Bt, const float *C0, float *D, int K)
{
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    float acc[8][4];
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++)
            acc[j][q] = C0[(16 * w + g + 8 * (q / 2)) * PN + 8 * j + 2 * t + (q & 1)];
    for (int ks = 0; ks < K / 16; ks++) {
        uint32_t a[4];
        a_frag(A, K, 16 * w, ks, lane, a);
        for (int j = 0; j < 8; j++) {
            const __half *b = Bt + (long)(8 * j + g) * K + ks * 16 + 2 * t;
            uint32_t b0 = pk(b, b + 1), b1 = pk(b + 8, b + 9);
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
        }
    }
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++)
            D[(16 * w + g + 8 * (q / 2)) * PN + 8 * j + 2 * t + (q & 1)] = acc[j][q];
}

/* the shared-memory matrix descriptor, no swizzle: start, leading and stride byte offsets (the
 * probe's own: which offset is which is what it finds; the kernels' is wgmma.cuh's wg_desc) */
__device__ __forceinline__ uint64_t probe_desc(const void *smem, uint32_t lbo, uint32_t sbo)
{
    uint64_t a = (uint64_t)__cvta_generic_to_shared(smem);
    return ((a & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
}

/* the same product by wgmma, one warpgroup: the k-step's B (64 n x 16 k) staged as core
 * matrices (8 n x 8 k, 16-byte rows), core (nc, kc) at (nc * 2 + kc) * 128 bytes; lbo, sbo:
 * the descriptor's offsets (which of 128 and 256 is which is what the run finds) */
__global__ void k_wg(const __half *A, const __half *Bt, const float *C0, float *D, int K,
                     uint32_t lbo, uint32_t sbo)
{
    __shared__ __align__(128) __half bs[PN * 16];
    int th = threadIdx.x, lane = th % 32, w = th / 32, g = lane / 4, t = lane % 4;
    float d[32];
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++)
            d[4 * j + q] = C0[(16 * w + g + 8 * (q / 2)) * PN + 8 * j + 2 * t + (q & 1)];
    for (int ks = 0; ks < K / 16; ks++) {
        __syncthreads();
        for (int i = th; i < PN * 16; i += 128) {
            int n = i / 16, k = i % 16, nc = n / 8, r = n % 8, kc = k / 8;
            bs[(nc * 2 + kc) * 64 + r * 8 + k % 8] = Bt[(long)n * K + ks * 16 + k];
        }
        wg_fence_smem();
        __syncthreads();
        uint32_t a[4];
        a_frag(A, K, 16 * w, ks, lane, a);
        wg_fence();
        wg_mma_rs64(d, a, probe_desc(bs, lbo, sbo));
        wg_commit();
        wg_wait<0>();
    }
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++)
            D[(16 * w + g + 8 * (q / 2)) * PN + 8 * j + 2 * t + (q & 1)] = d[4 * j + q];
}

/* rates: each warp 8 independent m16n8k16 chains, iters steps */
__global__ void k_sync_rate(float *sink, int iters)
{
    uint32_t a[4], b[2];
    for (int i = 0; i < 4; i++) a[i] = 0x3C003C00u ^ (threadIdx.x * 2654435761u & 0x03FF03FFu);
    b[0] = a[1];
    b[1] = a[2];
    float acc[8][4] = {};
    for (int it = 0; it < iters; it++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    float s = 0;
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++) s += acc[j][q];
    if (s == 12345.f) sink[0] = s;
}

/* each warpgroup: four m64n64k16 a group into four accumulator sets (four B tiles in shared
 * memory), iters groups; 2 warpgroups a block */
__global__ void k_wg_rate(float *sink, int iters)
{
    __shared__ __align__(128) __half bs[4][PN * 16];
    for (int i = threadIdx.x; i < 4 * PN * 16; i += blockDim.x)
        (&bs[0][0])[i] = __float2half(0.001f * (float)(i % 97));
    wg_fence_smem();
    __syncthreads();
    uint32_t a[4];
    for (int i = 0; i < 4; i++) a[i] = 0x3C003C00u ^ (threadIdx.x * 2654435761u & 0x03FF03FFu);
    float d0[32] = {}, d1[32] = {}, d2[32] = {}, d3[32] = {};
    uint64_t ds[4];
    for (int i = 0; i < 4; i++) ds[i] = probe_desc(bs[i], 128, 256);
    for (int it = 0; it < iters; it++) {
        wg_fence();
        wg_mma_rs64(d0, a, ds[0]);
        wg_mma_rs64(d1, a, ds[1]);
        wg_mma_rs64(d2, a, ds[2]);
        wg_mma_rs64(d3, a, ds[3]);
        wg_commit();
        wg_wait<0>();
    }
    float s = 0;
    for (int i = 0; i < 32; i++) s += d0[i] + d1[i] + d2[i] + d3[i];
    if (s == 12345.f) sink[0] = s;
}

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f;
}

/* fp16 values: Gaussian-like (wide 0: exponents near 0), or spread over 2^-12 .. 2^4 (wide 1) */
static __half hval(uint64_t *s, int wide)
{
    float u = frand(s) * 2 - 1;
    float v = wide ? u * ldexpf(1.0f, (int)(frand(s) * 16) - 12) : (u + frand(s) - 0.5f);
    return __float2half(v);
}

typedef struct {
    long differ, total;
    int max_ulp;
    double err_sync, err_wg; /* worst |x - ref| / (sum |a b| + |c|) */
} cmp_t;

static void trial(int K, int wide, int cinit, uint64_t seed, uint32_t lbo, uint32_t sbo, cmp_t *c)
{
    size_t na = (size_t)PM * K, nb = (size_t)PN * K;
    __half *hA = (__half *)malloc(na * 2), *hB = (__half *)malloc(nb * 2);
    float *hC = (float *)malloc(PM * PN * 4), *hs = (float *)malloc(PM * PN * 4),
          *hw = (float *)malloc(PM * PN * 4);
    uint64_t s = seed;
    for (size_t i = 0; i < na; i++) hA[i] = hval(&s, wide);
    for (size_t i = 0; i < nb; i++) hB[i] = hval(&s, wide);
    for (int i = 0; i < PM * PN; i++) hC[i] = cinit ? (frand(&s) * 2 - 1) * 4 : 0;
    __half *dA, *dB;
    float *dC, *dS, *dW;
    CK(cudaMalloc(&dA, na * 2));
    CK(cudaMalloc(&dB, nb * 2));
    CK(cudaMalloc(&dC, PM * PN * 4));
    CK(cudaMalloc(&dS, PM * PN * 4));
    CK(cudaMalloc(&dW, PM * PN * 4));
    CK(cudaMemcpy(dA, hA, na * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hB, nb * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC, hC, PM * PN * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dS, 0xFF, PM * PN * 4)); /* poisoned: a value not written reads NaN */
    CK(cudaMemset(dW, 0xFF, PM * PN * 4));
    k_sync<<<1, 128>>>(dA, dB, dC, dS, K);
    k_wg<<<1, 128>>>(dA, dB, dC, dW, K, lbo, sbo);
    CK(cudaGetLastError());
    CK(cudaMemcpy(hs, dS, PM * PN * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hw, dW, PM * PN * 4, cudaMemcpyDeviceToHost));
    for (int m = 0; m < PM; m++)
        for (int n = 0; n < PN; n++) {
            double ref = hC[m * PN + n], mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                double p = (double)__half2float(hA[(size_t)m * K + k]) *
                           (double)__half2float(hB[(size_t)n * K + k]);
                ref += p;
                mag += fabs(p);
            }
            float a = hs[m * PN + n], b = hw[m * PN + n];
            double es = fabs(a - ref) / (mag > 0 ? mag : 1),
                   ew = fabs(b - ref) / (mag > 0 ? mag : 1);
            if (!(es <= c->err_sync))
                c->err_sync = isnan(es) ? INFINITY : es > c->err_sync ? es : c->err_sync;
            if (!(ew <= c->err_wg))
                c->err_wg = isnan(ew) ? INFINITY : ew > c->err_wg ? ew : c->err_wg;
            int32_t ia, ib;
            memcpy(&ia, &a, 4);
            memcpy(&ib, &b, 4);
            c->total++;
            if (ia != ib) {
                c->differ++;
                int u = abs(ia - ib);
                if (u > c->max_ulp) c->max_ulp = u;
            }
        }
    free(hA), free(hB), free(hC), free(hs), free(hw);
    for (void *q : {(void *)dA, (void *)dB, (void *)dC, (void *)dS, (void *)dW}) CK(cudaFree(q));
}

int main(int argc, char **argv)
{
    int trials = argc > 1 ? atoi(argv[1]) : 20;
    if (trials < 1 || trials > 10000) trials = 20;
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    printf("mma-probe on %s (sm_%d%d, %d SMs)\n", pr.name, pr.major, pr.minor,
           pr.multiProcessorCount);
    /* which of the descriptor's two offsets is the k step: the layout that gives the product */
    uint32_t lbo = 128, sbo = 256;
    cmp_t c0 = {0, 0, 0, 0, 0}, c1 = {0, 0, 0, 0, 0};
    trial(64, 0, 1, 1, 128, 256, &c0);
    trial(64, 0, 1, 1, 256, 128, &c1);
    printf("layout: lbo 128 sbo 256: wgmma worst rel err %.3g; lbo 256 sbo 128: %.3g\n", c0.err_wg,
           c1.err_wg);
    if (c1.err_wg < c0.err_wg) lbo = 256, sbo = 128;
    if (!(fmin(c0.err_wg, c1.err_wg) < 1e-5)) {
        printf("mma-probe: FAIL: neither layout gives the product\n");
        return 1;
    }
    printf("%-8s %-6s %-6s %10s %10s %8s %12s %12s\n", "k", "values", "c", "elements", "differ",
           "max ulp", "err mma.sync", "err wgmma");
    for (int K : {16, 64, 512, 6144})
        for (int wide = 0; wide < 2; wide++)
            for (int cinit = 0; cinit < 2; cinit++) {
                cmp_t c = {0, 0, 0, 0, 0};
                int n = K >= 6144 ? (trials + 3) / 4 : trials;
                for (int i = 0; i < n; i++)
                    trial(K, wide, cinit,
                          1000003ull * (uint64_t)(i + 1) + (uint64_t)K * 7 + wide * 3 + cinit, lbo,
                          sbo, &c);
                printf("%-8d %-6s %-6s %10ld %10ld %8d %12.3g %12.3g\n", K,
                       wide ? "wide" : "normal", cinit ? "random" : "zero", c.total, c.differ,
                       c.max_ulp, c.err_sync, c.err_wg);
            }

    float *sink;
    CK(cudaMalloc(&sink, 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int sms = pr.multiProcessorCount, iters = 4096;
    printf("%-36s %8s %10s\n", "rate (operands in registers/smem)", "ms", "TFLOP/s");
    for (int wpb : {4, 8}) /* mma.sync: warps a block, 4 blocks an SM */
        for (int rep = 0; rep < 2; rep++) {
            int blocks = sms * 4;
            k_sync_rate<<<blocks, 32 * wpb>>>(sink, 16);
            CK(cudaEventRecord(e0));
            k_sync_rate<<<blocks, 32 * wpb>>>(sink, iters);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            double fl = (double)blocks * wpb * iters * 8 * 4096.0;
            if (rep)
                printf("mma.sync m16n8k16, %2d warps x 4 a SM   %8.3f %10.1f\n", wpb, ms,
                       fl / ms / 1e9);
        }
    for (int wgs : {1, 2}) /* wgmma: warpgroups a block, 2 blocks an SM */
        for (int rep = 0; rep < 2; rep++) {
            int blocks = sms * 2;
            k_wg_rate<<<blocks, 128 * wgs>>>(sink, 16);
            CK(cudaEventRecord(e0));
            k_wg_rate<<<blocks, 128 * wgs>>>(sink, iters);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            double fl = (double)blocks * wgs * iters * 4 * 64.0 * 64 * 16 * 2;
            if (rep)
                printf("wgmma m64n64k16 x4, %d wg x 2 a SM       %8.3f %10.1f\n", wgs, ms,
                       fl / ms / 1e9);
        }
    CK(cudaGetLastError());
    printf("mma-probe: done\n");
    return 0;
}
