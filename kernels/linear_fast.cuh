/* linear_fast: y = x W for EXL3 weights on tensor cores (mma.sync m16n8k16, fp16 in, fp32
 * accumulate), batch-invariant: a row's bits do not depend on the row count, its place in the
 * batch or the other rows. Within tolerance of the exact path (kernels/linear.cu), not equal. */
#ifndef MUSE_K_LINEAR_FAST_CUH
#define MUSE_K_LINEAR_FAST_CUH
#include <stddef.h>

#include "launch.h"

enum { MUSE_K_EPI_NONE = 0, MUSE_K_EPI_SWIGLU = 1 };
#define MUSE_K_FAST_MAX_LIN 4

/* Bytes of workspace muse_k_linear_fast needs for n_lin linears sharing one input at up to
 * max_rows rows (the a operand of each, the split partials). */
MUSE_K_API size_t muse_k_linear_fast_workspace(const muse_k_lin *shapes, int n_lin, long max_rows);

/* y_i[R, n_i] = x[R, k] W_i for i < n_lin (up to 4 linears with the same k, one launch a step
 * for all) over ctx's stream and rows R; shapes: the descriptors' host copies (their pointers
 * are the device's; the launches take them by value). Epilogue SWIGLU (n_lin 2, gate then up,
 * same n): gate and up are each rounded to fp16, y[0] = fp16(silu(gate) * up) as
 * kernels/swiglu.cu, y[1] unused. EXL3 only (dense: cudaErrorInvalidValue, the caller takes
 * the exact path); k, n multiples of 128. Returns the CUDA error code. */
MUSE_K_API int muse_k_linear_fast(const muse_k_ctx *ctx, const muse_k_lin *shapes, int n_lin,
                                  const float *x, long x_stride, int round16, float *const y[],
                                  const long y_stride[], int epilogue, void *ws, size_t ws_bytes);
/* The MoE's (row, slot) pairs through the same product, grouped by expert (kernels/moe_fast.cu
 * plans the groups on the device): ctx rows = P pairs; pair p reads row src[p] of x (src NULL:
 * row p) with linear i's descriptor descs[i][sel[p]] (device arrays of the experts' [E]);
 * perm [P]: the pairs in group order; groups [max_groups][4]: (expert, first place in perm,
 * count <= group_rows, 0), the first *n_groups of them used. y_i row p is pair p's. A pair's
 * bits depend on its own input row and expert only: the chain of muse_k_linear_fast with the
 * k split of split_target (0: the plain one), the caller's choice for its experts, fixed for a
 * model and never a function of the rows (the engine: MUSE_FAST_GROUP_TARGET / K, since a
 * token's K pairs share the GPU). */
typedef struct {
    const muse_k_lin *descs[MUSE_K_FAST_MAX_LIN];
    const int32_t *sel, *src, *perm, *groups, *n_groups;
    int max_groups, group_rows;
    int split_target;
    /* set (one linear, no epilogue: the experts' down): each output row's sum of squares in
     * double by 128-column block b, row_sq[p * (n / 128) + b] (the expert norms that follow) */
    double *row_sq;
} muse_k_fast_groups;
/* The rows a group holds at most for a round of rows rows, k_per_row of experts a row (the
 * product's m-tiles a block: linear_fast.h's muse_fast_group_rows, MUSE_FAST_MANY_MT read; 8
 * from 2 to 16 rows, the transposed form's, MUSE_FAST_TR_GROUPS read): 8, 16, 32, 64 or 128. */
MUSE_K_API int muse_k_linear_fast_group_rows(long rows, long k_per_row, long experts);
/* shapes: host copies of expert 0's descriptors (every expert's k, n, bits and codebook are
 * the same; the caller checks). Workspace: muse_k_linear_fast_workspace at P rows. */
MUSE_K_API int muse_k_linear_fast_grouped(const muse_k_ctx *ctx, const muse_k_lin *shapes,
                                          int n_lin, const muse_k_fast_groups *g, const float *x,
                                          long x_stride, int round16, float *const y[],
                                          const long y_stride[], int epilogue, void *ws,
                                          size_t ws_bytes);
/* Gate/up with the swiglu, then down (shapes: gate, up, down; the down's k the gate's n): mid
 * [R, I] = swiglu(x Wg, x Wu) as muse_k_linear_fast's SWIGLU, y [R, n] = mid Wd (round16 off),
 * the bits of those two calls; the gate/up's finish does the down's step 1 (one launch fewer;
 * MUSE_FAST_CHAIN=0 from the environment, tuning only: its own launch).
 * g NULL: plain rows; else grouped as muse_k_linear_fast_grouped with descs[0..2] the experts'
 * gate, up and down (the down reads row p of mid for pair p). Workspace:
 * muse_k_linear_fast_mlp_workspace (grouped: muse_k_linear_fast_grouped_mlp_workspace at P). */
MUSE_K_API int muse_k_linear_fast_mlp(const muse_k_ctx *ctx, const muse_k_lin shapes[3],
                                      const muse_k_fast_groups *g, const float *x, long x_stride,
                                      float *mid, long mid_stride, float *y, long y_stride,
                                      void *ws, size_t ws_bytes);
MUSE_K_API size_t muse_k_linear_fast_mlp_workspace(const muse_k_lin shapes[3], long max_rows);
/* The grouped call's workspace at max_pairs pairs split for split_target (its
 * muse_k_fast_groups'): the experts' splits, not the plain ones (at 2 bits on the one-GPU shape
 * 153 KB a pair against 669). */
MUSE_K_API size_t muse_k_linear_fast_grouped_mlp_workspace(const muse_k_lin shapes[3],
                                                           long max_pairs, int split_target);
/* Fills the current device's table of the finish's SWIGLU (kernels/linear_fast_ends.cu),
 * synchronously: call it outside a graph capture (the engine does at each rank's start). Without
 * it the finish computes the same bits. Returns the CUDA error code. */
MUSE_K_API int muse_k_linear_fast_init(void);
/* 1 where the loaded GPU code has the product's wgmma form (sm_90a: blocks of 64 rows and more
 * may take it, MUSE_FAST_WG; the same bits), asked of the device once a process: call it first
 * outside a graph capture (the engine does at its plan). */
MUSE_K_API int muse_k_linear_fast_wg(void);
/* Checks only (exl3-fast-check): the wgmma form off (0), on (1) or on with plain blocks of 64 or
 * 128 rows, in place of MUSE_FAST_WG (-1: back to it). The bits do not change. */
MUSE_K_API void muse_k_linear_fast_wg_force(int mode);
/* Checks only: the wgmma form's warp-specialized kernel (linear_fast_ws.cu) off (0) or on (1) in
 * place of MUSE_FAST_WS (-1: back to it). The bits do not change. */
MUSE_K_API void muse_k_linear_fast_ws_force(int on);
/* Checks only: the wgmma form with the weights as the register operand (linear_fast_wr.cu) off
 * (0) or on (1) in place of MUSE_FAST_WR (-1: back to it). The bits do not change. */
MUSE_K_API void muse_k_linear_fast_wr_force(int on);
/* Checks only: a decode step's transposed product (blocks of at most 8 rows, linear_fast.cu) off
 * (0) or on (1) in place of MUSE_FAST_TR (-1: back to it). The bits do not change. */
MUSE_K_API void muse_k_linear_fast_tr_force(int on);
/* Checks only: the register form's splits fused from launches of this many unsplit blocks on (0:
 * never) in place of MUSE_FAST_FUSE_MIN (-1: back to it). The bits do not change. */
MUSE_K_API void muse_k_linear_fast_fuse_force(long min_blocks);
/* Whether muse_k_linear_fast takes these linears (shapes, codebook, bits, epilogue). */
MUSE_K_API int muse_k_linear_fast_fits(const muse_k_lin *shapes, int n_lin, int epilogue);

/* Checks: the k x n fp16 bits of Wq (the decoded trellis, no scales, row-major) as the product
 * kernel's decode makes them, into w (device, k * n uint16). Returns the CUDA error code. */
MUSE_K_API int muse_k_linear_fast_decode(const muse_k_lin *shape, uint16_t *w, cudaStream_t st);

/* Timing only (exl3-fast-check's MUSE_FAST_SKIP): leave out steps, a bitmask of 1 prepare,
 * 2 product, 4 finish, 8 the register form's partial stores (linear_fast_wr.cu); the results
 * are then wrong. 0 (the default): every step. */
MUSE_K_API void muse_k_linear_fast_skip(int steps);

/* Checks only (exl3-fast-check): launches of fewer 128-column blocks than below take 64-column
 * blocks (0: never; -1: back to MUSE_FAST_NARROW or the default). The bits do not change. */
MUSE_K_API void muse_k_linear_fast_narrow(long below);

/* The split target in use: MUSE_FAST_SPLIT_TARGET, or MUSE_FAST_SPLITS=N from the environment
 * (tuning only; read once a process, so every call of the process splits alike). */
MUSE_K_API int muse_k_linear_fast_split_target(void);

#endif
