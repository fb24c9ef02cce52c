/* EXL3 trellis-coded weights on the CPU (design/EXL3.md): codebooks, the tail-biting bit
 * stream of a 16x16 tile, validation of a Linear's tensors, dequantization and y = x W. */
#ifndef MUSE_EXL3_H
#define MUSE_EXL3_H

#include <stddef.h>
#include <stdint.h>

#include "base/muse_common.h"
#include "pack/exl3_tile.h" /* muse_codebook, the tile's states and decode (host and device) */
#include "pack/safetensors.h"
#include "base/threadpool.h"

#define MUSE_EXL3_HAD 128 /* Hadamard block (and padding unit) */

const char *muse_codebook_name(muse_codebook cb);          /* "3inst", "mcg", "mul1" */
int muse_codebook_parse(const char *s, muse_codebook *cb); /* 0 ok, -1 unknown */

/* fp16 bits of the weight a 16-bit trellis state decodes to. */
uint16_t muse_exl3_state_value(uint32_t state, muse_codebook cb);
/* The decoded values of all 65536 states as fp32 (exact), built once per codebook. */
const float *muse_exl3_value_table(muse_codebook cb);
/* RMS over all 65536 decoded values of the codebook. */
double muse_exl3_codebook_rms(muse_codebook cb);

/* The 256 states of one tile (16*bits stored uint16), in position order p. */
void muse_exl3_tile_states(const uint16_t *tile, int bits, uint16_t states[256]);
/* Row r, column c (within the tile) of position p. */
void muse_exl3_position_element(int p, int *r, int *c);
/* w[row][col] within the 16x16 tile. */
void muse_exl3_decode_tile(const uint16_t *tile, int bits, muse_codebook cb, float w[16][16]);

typedef struct {
    const char *key; /* e.g. "model.layers.0.self_attn.q_proj" */
    int64_t k, n;    /* in_features (rows), out_features (cols); y = x W */
    int bits;        /* 1..8, from the trellis shape */
    muse_codebook cb;
    const uint16_t *trellis;   /* (k/16, n/16, 16*bits) */
    int64_t tiles_ld;          /* tiles a trellis row holds: n/16 (or 0), more in a column slice */
    const uint16_t *suh, *svh; /* fp16 (k), (n); NULL when the legacy su/sv signs are used */
    const uint16_t *su, *sv;   /* legacy packed signs int16 (k/16), (n/16): bit set = -1 */
    const uint16_t *bias;      /* fp16 (n) or NULL */
} muse_exl3_weight;

/* Validates and fills *w from the tensors of one Linear (any pointer but trellis may be NULL).
 * Errors name the offending tensor. suh/svh win over su/sv when both are present. */
int muse_exl3_from_tensors(const char *key, const muse_tensor *trellis, const muse_tensor *suh,
                           const muse_tensor *svh, const muse_tensor *su, const muse_tensor *sv,
                           const muse_tensor *mcg, const muse_tensor *mul1, const muse_tensor *bias,
                           muse_exl3_weight *w, muse_err *e);

/* Input-side scale of row i and output-side scale of column j (suh/svh or legacy signs). */
float muse_exl3_in_scale(const muse_exl3_weight *w, int64_t i);
float muse_exl3_out_scale(const muse_exl3_weight *w, int64_t j);

/* In place: each consecutive 128-element chunk of v (len a multiple of 128) becomes H v,
 * H the orthonormal Sylvester Hadamard matrix; a fixed butterfly order, fp32. */
void muse_exl3_block_hadamard(float *v, int64_t len);
/* The same down every column of a 128-row block of width n (row-major): Hk applied to it. */
void muse_exl3_hadamard_columns(float *m, int64_t n);

/* out: k x n fp32, the effective W = diag(suh) Hk Wq Hn diag(svh) (bias not included). */
void muse_exl3_dequant(const muse_exl3_weight *w, float *out, muse_pool *pool);

/* Bytes of workspace muse_exl3_linear needs for up to max_rows rows. */
size_t muse_exl3_workspace_bytes(const muse_exl3_weight *w, long max_rows);
/* y[rows x n] = x[rows x k] W + bias in the five steps of EXL3.md. Each output row depends only
 * on its own input row (fixed summation order, any batch size or thread count). workspace:
 * muse_exl3_workspace_bytes(w, rows) bytes, or NULL to allocate one for this call. */
void muse_exl3_linear(const muse_exl3_weight *w, const float *x, long rows, float *y,
                      void *workspace, muse_pool *pool);

#endif
