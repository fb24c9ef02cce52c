/* linear_fast_ws: the fast EXL3 product's step 2 on wgmma with the warps specialized (sm_90a), for
 * blocks of 64 or 128 rows: the bits of linear_fast_wg.cu's form (and so of the mma.sync form's),
 * without its block-wide barrier a k-tile. The grid is one persistent block an SM; block i takes
 * the items i, i + G, ... of the launch, an item being one block of k_fast_product's grid (a
 * linear, 64 * MH rows, a k split, 128 columns). A block is 384 threads: warpgroup 0 only
 * multiplies, the 8 warps of warpgroups 1 and 2 only load and decode, one trellis tile column
 * (16 columns) a warp. A stage is 4 k-tiles (64 k) of an item: its A rows and raw trellis come by
 * cp.async `ahead` stages before its decode, into a ring of WS_NS buffers that runs on across the
 * block's items; the decode warps write the stage's B as fp16 in shared memory and arrive on its
 * `full` mbarrier; the multiplying warpgroup waits on it, issues the stage's wgmma m64n128k16 (A
 * and B from shared memory, in the 128-byte swizzle of linear_fast.h) and, once the stage before
 * has been read, arrives on that one's `empty` mbarrier, which the loads of the buffer's next
 * stage wait on. A column's chain: its split's k-tiles in ascending order from zeroed
 * accumulators, as the other forms'; which block takes an item changes nothing in it. */
#include <cuda_fp16.h>
#include <stdlib.h>

#include "linear_fast_prod.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

#define WS_KC      4     /* k-tiles a stage: 64 k, one 128-byte row */
#define WS_NS      5     /* stage buffers in the ring */
#define WS_AHEAD   2     /* stages a buffer's loads run ahead of its decode (1 .. WS_NS - 2) */
#define WS_B_ST    16384 /* bytes of a stage's decoded B: 128 columns x 64 k */
#define WS_HALF    8192  /* bytes of 64 rows of a stage's A */
#define WS_THREADS 384   /* the multiplying warpgroup, then 8 decode warps */

/* a stage buffer: A (64 * mh rows), decoded B, then the raw trellis (warp w's 4 k-tiles of its
 * tile column at w * 4 * 32 * bits): each part a multiple of 1024 bytes, so every buffer and its
 * A and B start on the swizzle's 1024-byte atoms */
__host__ __device__ constexpr int ws_buf(int mh, int bits)
{
    return mh * WS_HALF + WS_B_ST + 8 * WS_KC * 32 * bits;
}
/* the launch's dynamic shared memory: the ring, the mbarriers, the alignment's slack */
static int ws_smem(int mh, int bits)
{
    return WS_NS * ws_buf(mh, bits) + 2 * WS_NS * 8 + 1024;
}

/* one item: its linear, rows, split and columns, and the trellis it reads */
typedef struct {
    const uint16_t *trellis;
    int64_t tiles_ld, tn0, kt0;
    long m0, rend;
    int li, sp, kt_n;
    bool aligned;
} ws_item;

/* item b's place (k_fast_product's block b at ROWS rows); false where it is a grouped item past
 * the round's n_groups (nothing to do) */
template <int ROWS>
__device__ __forceinline__ bool ws_take(const fast_prod &p, long b, int n_groups, ws_item &it)
{
    int li, mg, sp, nb;
    f_place(p, b, li, mg, sp, nb);
    const fast_lin &L = p.l[li];
    it.li = li;
    it.sp = sp;
    it.kt0 = f_split_at(L, sp);
    it.kt_n = (int)(f_split_at(L, sp + 1) - it.kt0);
    it.tn0 = (int64_t)nb * 8;
    it.m0 = (long)mg * ROWS;
    it.rend = p.R;
    it.trellis = L.trellis;
    it.tiles_ld = L.tiles_ld;
    it.aligned = L.aligned;
    if (L.descs) { /* grouped: this m-group's rows and its expert's trellis */
        if (mg >= n_groups) return false;
        int4 g = p.groups[mg];
        const muse_k_lin *d = L.descs + g.x;
        it.trellis = d->trellis;
        it.tiles_ld = d->tiles_ld ? d->tiles_ld : L.n / 16;
        it.aligned = (uintptr_t)d->trellis % 16 == 0;
        it.m0 = g.y;
        it.rend = (long)g.y + g.z;
    }
    if (it.rend > it.m0 + ROWS) it.rend = it.m0 + ROWS;
    return true;
}

/* step 2, warp-specialized: grid min(items, SMs), WS_THREADS; items: k_fast_product's grid;
 * ahead: the stages a buffer's loads run ahead of its decode, 1 .. WS_NS - 2 (with WS_NS - ahead
 * - 1 stages between a load and the release it waits for) */
template <int CB, int BITS, int MH>
__global__ void __launch_bounds__(WS_THREADS, 1)
    k_fast_product_ws(fast_prod p, long items, int ahead)
{
#ifdef WG_ON
    constexpr int ROWS = 64 * MH, A_ST = MH * WS_HALF, BUF = ws_buf(MH, BITS);
    extern __shared__ __align__(128) unsigned char w_raw[];
    unsigned char *const w_sm = w_raw + ((1024 - k_smem(w_raw) % 1024) % 1024);
    uint64_t *const full = (uint64_t *)(w_sm + WS_NS * BUF), *const empty = full + WS_NS;
    K_PDL_NEXT();
    const int th = threadIdx.x, warp = th / 32, lane = th % 32;
    const long G = gridDim.x;
    const bool grouped = p.l[0].descs != NULL; /* a launch's linears are all grouped or none */
    if (th == 0)
        for (int i = 0; i < WS_NS; i++) {
            wg_bar_init(full + i, WS_THREADS - 128); /* every decode thread */
            wg_bar_init(empty + i, 128);             /* every multiplying thread */
        }
    __syncthreads();
    int n_groups = 0;
    if (grouped) { /* the groups come from the selection before */
        K_PDL_WAIT();
        n_groups = *p.n_groups;
    }
    /* the first item from b on with work (its place in it), or items where none is left */
    auto next = [&](long b, ws_item &it) {
        for (; b < items; b += G)
            if (ws_take<ROWS>(p, b, n_groups, it)) break;
        return b;
    };

    /* the warpgroup, broadcast from lane 0 so ptxas sees the branch below uniform (else it
     * serializes every wgmma, C7520) */
    if (__shfl_sync(0xFFFFFFFFu, th / 128, 0) == 0) { /* the multiplying warpgroup */
        K_PDL_WAIT();                                 /* before the partials are written */
        const uint32_t sm0 = k_smem(w_sm);
        unsigned g = 0;   /* the block's stages so far: the ring's place and phase */
        int pending = -1; /* the buffer whose wgmma are issued but not yet released */
        ws_item it;
        for (long b = next(blockIdx.x, it); b < items; b = next(b + G, it)) {
            float acc[MH][64];
#pragma unroll
            for (int h = 0; h < MH; h++)
#pragma unroll
                for (int i = 0; i < 64; i++) acc[h][i] = 0.0f;
            const int nst = (it.kt_n + WS_KC - 1) / WS_KC;
            for (int s = 0; s < nst; s++, g++) {
                const int buf = (int)(g % WS_NS);
                wg_bar_wait(full + buf, (g / WS_NS) & 1);
                wg_fence();
                const uint32_t a_at = sm0 + buf * BUF, b_at = a_at + A_ST;
                if (WS_KC * (s + 1) <= it.kt_n) {
#pragma unroll
                    for (int kk = 0; kk < WS_KC; kk++)
#pragma unroll
                        for (int h = 0; h < MH; h++)
                            wg_mma(acc[h], wg_desc(a_at + WS_HALF * h + 32 * kk),
                                   wg_desc(b_at + 32 * kk));
                } else { /* the split's last k-tiles: never a k-tile past them, so no zero added */
                    for (int kk = 0; kk < it.kt_n - WS_KC * s; kk++)
#pragma unroll
                        for (int h = 0; h < MH; h++)
                            wg_mma(acc[h], wg_desc(a_at + WS_HALF * h + 32 * kk),
                                   wg_desc(b_at + 32 * kk));
                }
                wg_commit();
                wg_wait<1>(); /* the stage before done: its buffer may be loaded again */
                if (pending >= 0) wg_bar_arrive(empty + pending);
                pending = buf;
            }
            wg_wait<0>();
            wg_bar_arrive(empty + pending);
            pending = -1;

            /* d[4 i + j]: column 8 i + 2 (lane % 4) + (j & 1) of row 16 warp + lane / 4 +
             * 8 (j >> 1) */
            const fast_lin &L = p.l[it.li];
            const int64_t ntiles = L.n / 16;
#pragma unroll
            for (int h = 0; h < MH; h++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    long row = it.m0 + 64 * h + 16 * warp + lane / 4 + 8 * half;
                    if (row >= it.rend) continue;
                    float *prow =
                        L.part + ((long)it.sp * p.R + row) * L.n + it.tn0 * 16 + 2 * (lane % 4);
#pragma unroll
                    for (int i = 0; i < 16; i++) {
                        if (it.tn0 + i / 2 >= ntiles) continue;
                        *(float2 *)(prow + 8 * i) =
                            make_float2(acc[h][4 * i + 2 * half], acc[h][4 * i + 2 * half + 1]);
                    }
                }
        }
        return;
    }

    /* a decode warp: pw's tile column (columns 16 pw ..) of every k-tile */
    const int pt = th - 128, pw = warp - 4;
    /* A: thread pt stages chunk pt % 8 (k 8 (pt % 8) ..) of rows pt / 8 + 32 i (row % 8 the same
     * for every i); trellis: the warp's 4 tiles of a stage, 2 * BITS 16-byte chunks each, chunk
     * lane + 32 j */
    constexpr int A_PER = ROWS / 32, T_CH = WS_KC * 2 * BITS, T_PER = (T_CH + 31) / 32;
    const int a_ch = pt % 8, a_row = pt / 8;
    const int a_dst = muse_fast_wg_off(a_row, a_ch);
    const int t_dst = A_ST + WS_B_ST + pw * WS_KC * 32 * BITS; /* the warp's raw tiles */

    /* the load cursor: item il at its stage sl, and this thread's sources and limits there (a
     * chunk loads at stage s iff s * WS_KC < its limit) */
    ws_item il;
    long bl = next(blockIdx.x, il);
    int sl = 0, a_klim = 0, t_lim[T_PER];
    unsigned a_ok = 0;
    const uint16_t *a_src = NULL, *t_src[T_PER];
    int64_t t_step = 0;
    auto place = [&]() {
        const fast_lin &L = p.l[il.li];
        a_src = L.a + (il.m0 + a_row) * L.k + il.kt0 * 16 + a_ch * 8;
        a_ok = 0;
#pragma unroll
        for (int i = 0; i < A_PER; i++) a_ok |= (unsigned)(il.m0 + a_row + 32 * i < il.rend) << i;
        a_klim = il.kt_n - a_ch / 2;
        const bool col_ok = il.tn0 + pw < L.n / 16;
#pragma unroll
        for (int j = 0; j < T_PER; j++) {
            int c = lane + 32 * j, kk = c / (2 * BITS), ch = c % (2 * BITS);
            t_src[j] = il.trellis + ((il.kt0 + kk) * il.tiles_ld + il.tn0 + pw) * 16 * BITS +
                       (int64_t)ch * 8;
            t_lim[j] = col_ok && (T_CH % 32 == 0 || c < T_CH) ? il.kt_n - kk : 0;
        }
        t_step = (int64_t)WS_KC * il.tiles_ld * 16 * BITS;
    };
    if (bl < items) place();
    unsigned gl = 0; /* stages loaded so far: the ring's place */
    /* the cursor's stage into buffer gl % WS_NS (once the wgmma of its last stage are done), the
     * cursor on; one commit group a call, empty where nothing is left */
    auto issue = [&]() {
        if (bl < items) {
            if (gl >= WS_NS) wg_bar_wait(empty + gl % WS_NS, (gl / WS_NS - 1) & 1);
            const fast_lin &L = p.l[il.li];
            unsigned char *base = w_sm + (gl % WS_NS) * BUF;
            const bool a_k_ok = sl * WS_KC < a_klim;
#pragma unroll
            for (int i = 0; i < A_PER; i++) {
                bool ok = (a_ok >> i & 1) && a_k_ok;
                const uint16_t *src = a_src + (int64_t)sl * WS_KC * 16 + (int64_t)32 * i * L.k;
                k_cp16(base + a_dst + 32 * 128 * i, ok ? src : L.a, ok);
            }
#pragma unroll
            for (int j = 0; j < T_PER; j++) {
                int c = lane + 32 * j;
                if (T_CH % 32 != 0 && c >= T_CH) break;
                bool ok = sl * WS_KC < t_lim[j];
                const uint16_t *src = t_src[j] + (int64_t)sl * t_step;
                unsigned char *dst = base + t_dst + c * 16;
                if (il.aligned) {
                    k_cp16(dst, ok ? src : il.trellis, ok);
                } else { /* a 2-byte aligned trellis: plain loads, seen after the warp's sync */
                    for (int q = 0; q < 4; q++)
                        ((uint32_t *)dst)[q] =
                            ok ? (uint32_t)src[2 * q] | (uint32_t)src[2 * q + 1] << 16 : 0;
                }
            }
            gl++;
            if (++sl * WS_KC >= il.kt_n) { /* the item's last stage: on to the next item */
                sl = 0;
                bl = next(bl + G, il);
                if (bl < items) place();
            }
        }
        k_cp_commit();
    };

    /* the lane's word places in a tile and its decoded words at k-tile 0 (k-tile kk at chunk
     * ^ 2 kk: row % 8 the same) */
    int l_widx[3], l_sh, s_off[4];
    muse_fast_lane_words(BITS, muse_fast_nwords(BITS), lane, l_widx, &l_sh);
#pragma unroll
    for (int q = 0; q < 4; q++) s_off[q] = muse_fast_wg_b_off(pw, q, lane, 0);

    /* a plain product's first trellis stages toward L2 before the wait (weights: no kernel
     * writes them); then stages 0 .. ahead - 1: global stage g lands with commit group g */
    if (!grouped && bl < items)
        for (int s = 0; s < ahead; s++)
#pragma unroll
            for (int j = 0; j < T_PER; j++)
                if (s * WS_KC < t_lim[j])
                    asm volatile(
                        "prefetch.global.L2 [%0];\n" ::"l"(t_src[j] + (int64_t)s * t_step));
    if (!grouped) K_PDL_WAIT();
    for (int s = 0; s < ahead; s++) issue();
    /* the decode cursor: item id at its stage sd, the block's stage gd */
    ws_item id;
    unsigned gd = 0;
    int sd = 0;
    for (long bd = next(blockIdx.x, id); bd < items; gd++) {
        issue();
        /* this thread's loads of stage gd landed */
        if (ahead == 1)
            k_cp_wait<1>();
        else if (ahead == 2)
            k_cp_wait<2>();
        else
            k_cp_wait<3>();
        __syncwarp(); /* and the warp's: its raw tiles */
        const int buf = (int)(gd % WS_NS);
        const uint32_t *ts = (const uint32_t *)(w_sm + buf * BUF + t_dst);
        unsigned char *bd_sm = w_sm + buf * BUF + A_ST;
        /* all 4 k-tiles, so their decodes interleave (one past the split's last, zeros loaded,
         * is decoded and never read); every word of the 4 read first, so one wait covers the
         * shared-memory latency (ncu: the decode warps stalled on each tile's reads) */
        const int NW = muse_fast_nwords(BITS);
        uint32_t wv[WS_KC][3];
#pragma unroll
        for (int kk = 0; kk < WS_KC; kk++)
#pragma unroll
            for (int i = 0; i < 3; i++) wv[kk][i] = i < NW ? ts[kk * 8 * BITS + l_widx[i]] : 0;
        const int w012[3] = {0, 1, 2};
#pragma unroll
        for (int kk = 0; kk < WS_KC; kk++) {
            uint32_t bf[4];
            f_tile_frag_at<CB, BITS>(wv[kk], w012, l_sh, bf);
#pragma unroll
            for (int q = 0; q < 4; q++) *(uint32_t *)(bd_sm + (s_off[q] ^ (32 * kk))) = bf[q];
        }
        wg_fence_smem(); /* the stage's A (landed) and this thread's B, for the wgmma */
        wg_bar_arrive(full + buf);
        if (++sd * WS_KC >= id.kt_n) {
            sd = 0;
            bd = next(bd + G, id);
        }
    }
    k_cp_wait<0>();
#endif
}

/* the SMs of the device (one persistent block each), asked once a process */
int muse_k_fast_ws_sms(void)
{
    static const int n = [] {
        int d = 0, v = 0;
        if (cudaGetDevice(&d) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, d) != cudaSuccess || v < 1)
            v = MUSE_FAST_SMS;
        return v;
    }();
    return n;
}

/* MUSE_FAST_WS_AHEAD=N from the environment (tuning only, read once a process): the stages a
 * buffer's loads run ahead of its decode, 1 .. 3; else WS_AHEAD */
static int ws_ahead(void)
{
    static const int ahead = [] {
        const char *v = getenv("MUSE_FAST_WS_AHEAD");
        int a = v && *v ? atoi(v) : WS_AHEAD;
        return a >= 1 && a <= 3 && a <= WS_NS - 2 ? a : WS_AHEAD;
    }();
    return ahead;
}

typedef void (*ws_fn)(fast_prod, long, int);
static const ws_fn ws_prod[2][3][8] = {F_WG_TABLE(k_fast_product_ws, 1),
                                       F_WG_TABLE(k_fast_product_ws, 2)};

int muse_k_fast_product_ws(const fast_prod *p, int mh, int cb, int bits, long blocks,
                           cudaStream_t st)
{
    int err = muse_k_fast_wg_check(mh, cb, bits);
    if (err) return err;
    ws_fn fn = ws_prod[mh - 1][cb][bits - 1];
    int smem = ws_smem(mh, bits);
    err = (int)cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem);
    if (err) return err;
    long grid = blocks < muse_k_fast_ws_sms() ? blocks : muse_k_fast_ws_sms();
    return k_launch(fn, (unsigned)grid, WS_THREADS, (size_t)smem, st, *p, blocks, ws_ahead());
}
