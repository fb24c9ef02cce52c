/* moe_fast: the fast path's router and the grouping of a MoE's (row, slot) pairs by expert for
 * the grouped fast product (kernels/linear_fast.cuh muse_k_fast_groups). */
#ifndef MUSE_K_MOE_FAST_CUH
#define MUSE_K_MOE_FAST_CUH
#include "launch.h"
/* logits[R, E] = b[R, H] router^T as kernels/moe.cu's router, a block an expert and 8 rows: the
 * same double products summed in a fixed thread-then-tree order (a row's the same at any R), so
 * the float logits equal the exact path's unless a double sum falls within an ulp of a float
 * rounding boundary. The router row by 16-byte chunks, all of a thread's loaded before its
 * first product, where H is a multiple of 8 up to 8192 (MUSE_FAST_ROUTER=0 from the
 * environment: element by element, as before; another sum order). ctx: st, rows */
MUSE_K_API int muse_k_router_fast(const muse_k_ctx *ctx, const float *b, long H, const void *router,
                                  int dtype, long E, float *logits);
/* kernels/moe.cu muse_k_select's sel and w bit for bit, a warp a row. ctx: st, rows */
MUSE_K_API int muse_k_select_fast(const muse_k_ctx *ctx, const float *logits, long E, long K,
                                  const float *bias, int norm_topk, float scaling, int32_t *sel,
                                  float *w);
/* The groups of P = ctx rows pairs: perm [P] the pairs by ascending expert, each expert's in
 * ascending pair order; groups [max_groups][4] (expert, first place in perm, count <=
 * group_rows, 0) in that order; *n_groups their number. sel [P] in [0, E) (others skipped).
 * One block: the order is a function of sel alone. ctx: st, rows */
MUSE_K_API int muse_k_moe_group(const muse_k_ctx *ctx, const int32_t *sel, long E, int group_rows,
                                int max_groups, int32_t *perm, int32_t *groups, int32_t *n_groups);
/* muse_k_select_fast, then muse_k_moe_group of its R * K pairs (ctx rows R): one launch for up
 * to 4 rows and 128 pairs, the two launches past that; the same results either way. */
MUSE_K_API int muse_k_select_group_fast(const muse_k_ctx *ctx, const float *logits, long E, long K,
                                        const float *bias, int norm_topk, float scaling,
                                        int32_t *sel, float *w, int group_rows, int max_groups,
                                        int32_t *perm, int32_t *groups, int32_t *n_groups);
/* The most groups P pairs of top-k over E experts make at group_rows rows a group. */
MUSE_K_API int muse_k_moe_max_groups(long P, long E, int group_rows);
#endif
