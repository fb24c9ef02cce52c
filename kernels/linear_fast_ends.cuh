/* The fast EXL3 product's first and last steps (kernels/linear_fast_ends.cu, compiled with
 * -fmad=false like the exact path): their arguments and launchers, for kernels/linear_fast.cu. */
#ifndef MUSE_K_LINEAR_FAST_ENDS_CUH
#define MUSE_K_LINEAR_FAST_ENDS_CUH
#include "launch.h"
#include "linear_fast.cuh"

/* step 1 for n_lin linears of one k: a_i[R, k] = fp16 bits of the exact path's prepare */
typedef struct {
    muse_k_lin d[MUSE_K_FAST_MAX_LIN]; /* host copies (their pointers are the device's) */
    uint16_t *a[MUSE_K_FAST_MAX_LIN];
    int64_t k;
    int n_lin;
    int grouped; /* g: pair row q of a_i is perm[q]'s, with its expert's descriptor */
    muse_k_fast_groups g;
} muse_fast_prep;

/* step 3: y_i = blockHad(sum of the splits' partials in split order) * svh + bias */
typedef struct {
    muse_k_lin d[MUSE_K_FAST_MAX_LIN];      /* host copies (their pointers are the device's) */
    const float *part[MUSE_K_FAST_MAX_LIN]; /* [splits][R][n] */
    /* set: the partials already summed in the finish's order (linear_fast_wr.cu's fused splits,
     * [R][n] double), splits then 1 */
    const double *dsum[MUSE_K_FAST_MAX_LIN];
    int splits[MUSE_K_FAST_MAX_LIN];
    int64_t n[MUSE_K_FAST_MAX_LIN];
    float *y[MUSE_K_FAST_MAX_LIN];
    long y_stride[MUSE_K_FAST_MAX_LIN];
    long blk0[MUSE_K_FAST_MAX_LIN + 1]; /* first 128-column block of each linear */
    long cta0[MUSE_K_FAST_MAX_LIN + 1]; /* first CTA of each linear: muse_k_fast_finish sets it */
    int n_lin, round16, epilogue;
    int grouped; /* g: partial row q is pair perm[q]'s, finished with its expert's scales */
    muse_k_fast_groups g;
    /* na set: the next linear's step 1 too (y[0]'s columns its k = nk): row q of na from the
     * same values, with nd (grouped: nd_descs[its expert]); one launch fewer */
    uint16_t *na;
    int64_t nk;
    muse_k_lin nd;
    const muse_k_lin *nd_descs;
    /* set (one linear, no epilogue): each output row's sum of squares by 128-column block b:
     * sq[out_row * blk0[1] + b] = the warp's tree of its lanes' (((x0^2 + x1^2) + x2^2) + x3^2) */
    double *sq;
    const float *silu; /* the launch sets it: SWIGLU's silu by the gate's fp16 bits, or NULL */
} muse_fast_fin;

MUSE_K_API int muse_k_fast_prepare(const muse_fast_prep *p, const float *x, long x_stride,
                                   long rows, cudaStream_t st);
MUSE_K_API int muse_k_fast_finish(const muse_fast_fin *f, long rows, cudaStream_t st);
#endif
