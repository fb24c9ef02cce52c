/* Synthetic weights: the tensors of any muse_spark config (HF names, fp16/bf16 or EXL3 at
 * given bits with random valid trellis), each filled from (seed, name, index) and scaled so
 * activations stay O(1). muse-pack writes them to files; --synthetic-weights keeps them in
 * memory, so any shape runs without a pack. */
#ifndef MUSE_SYNTHETIC_H
#define MUSE_SYNTHETIC_H

#include "pack/config.h"
#include "pack/exl3.h"
#include "pack/safetensors.h"
#include "pack/synth_fill.h"

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
/* Its elements [begin, end) only: each element is a function of (seed, name, index) alone. */
void muse_synth_fill_range(const muse_synth_spec *s, uint64_t seed, void *data, size_t begin,
                           size_t end);
/* Whether a GPU can fill s itself (trellis, suh, svh: synth_fill.h), and how. */
int muse_synth_on_device(const muse_synth_spec *s);
muse_synth_elem muse_synth_elem_of(const muse_synth_spec *s, uint64_t seed);

/* A tensor of the set left for a GPU to fill: its pages in the set stay untouched. */
typedef struct {
    uint8_t *host; /* its bytes in the set's anonymous mapping */
    size_t bytes;
    muse_synth_elem el;
} muse_synth_dev;

/* The set's tensors left for a GPU, sorted by host. */
typedef struct muse_synth_devs muse_synth_devs;
/* The entry whose bytes start at host, or NULL (d may be NULL). */
const muse_synth_dev *muse_synth_devs_find(const muse_synth_devs *d, const void *host);
/* Fills them on the host after all (on all cores, once; thread safe), for a reader that needs
 * their bytes there: the CPU backend, a GPU's packed shard. */
void muse_synth_devs_to_host(muse_synth_devs *d);
size_t muse_synth_devs_count(const muse_synth_devs *d);
void muse_synth_devs_free(muse_synth_devs *d);

/* The whole set in anonymous memory (no files), ready for the model loader, filled on all
 * cores. devs NULL: every tensor filled; else the ones a GPU fills are left to it and listed
 * in *devs (NULL when there are none). */
int muse_synth_st(const muse_config *c, const muse_synth_list *l, uint64_t seed, muse_st **out,
                  muse_synth_devs **devs, muse_err *e);
/* The same tensors with nothing filled (their pages never touched): shapes for a memory plan. */
int muse_synth_st_shapes(const muse_config *c, const muse_synth_list *l, muse_st **out,
                         muse_err *e);

#endif
