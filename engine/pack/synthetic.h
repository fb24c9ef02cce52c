/* Synthetic weights: the tensors of any muse_spark config (HF names, fp16/bf16 or EXL3 at
 * given bits with random valid trellis), each filled from (seed, name, index) and scaled so
 * activations stay O(1). muse-pack writes them to files; --synthetic-weights keeps them in
 * memory, so any shape runs without a pack. */
#ifndef MUSE_SYNTHETIC_H
#define MUSE_SYNTHETIC_H

#include "pack/config.h"
#include "pack/exl3.h"
#include "pack/safetensors.h"

typedef enum {
    FILL_LINEAR,
    FILL_EMBED,
    FILL_NORM_OFFSET,
    FILL_NORM_PLAIN,
    FILL_ROUTER,
    FILL_BIAS,
    FILL_TRELLIS,
    FILL_SUH,
    FILL_SVH,
    FILL_MARKER
} muse_fill_kind;

/* One tensor to make. */
typedef struct {
    char name[256];
    muse_dtype dtype;
    int ndim;
    int64_t shape[3];
    muse_fill_kind fill;
    double scale; /* std of a linear; 1/sqrt(k) */
    size_t bytes;
} muse_synth_spec;

typedef struct {
    muse_synth_spec *v;
    size_t n, cap;
    muse_dtype dtype;         /* fp16 or bf16 weights */
    int exl3_bits, head_bits; /* 0: not EXL3 */
    int router_bias;
    muse_codebook cb;
} muse_synth_list;

/* Every tensor of config c, with l's dtype, bits, codebook and router bias already set. */
void muse_synth_specs(const muse_config *c, muse_synth_list *l);
void muse_synth_free(muse_synth_list *l);
/* Fills one tensor's bytes from the seed. */
void muse_synth_fill(const muse_synth_spec *s, uint64_t seed, void *data);
/* The whole set in anonymous memory (no files), ready for the model loader. */
int muse_synth_st(const muse_config *c, const muse_synth_list *l, uint64_t seed, muse_st **out,
                  muse_err *e);

#endif
