/* safetensors reading (one file or shards + model.safetensors.index.json, mmap'd) and writing.
 * Every offset, shape and dtype is checked against the file before a tensor is handed out. */
#ifndef MUSE_SAFETENSORS_H
#define MUSE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/muse_common.h"

typedef enum {
    MUSE_DT_F16,
    MUSE_DT_BF16,
    MUSE_DT_F32,
    MUSE_DT_I16,
    MUSE_DT_I32,
    MUSE_DT_COUNT
} muse_dtype;

#define MUSE_MAX_DIMS 4

typedef struct {
    const char *name; /* owned by the set */
    const char *file; /* path of the shard that holds it, owned by the set */
    muse_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[MUSE_MAX_DIMS];
    int64_t numel;    /* product of shape (1 for a scalar) */
    const void *data; /* into the mmap; valid until muse_st_close */
    size_t nbytes;    /* numel * muse_dtype_size(dtype) */
} muse_tensor;

typedef struct muse_st muse_st;

const char *muse_dtype_name(muse_dtype dt); /* "F16", "BF16", ... as safetensors spells them */
size_t muse_dtype_size(muse_dtype dt);
/* Looks up a dtype by its safetensors spelling ("F16", ...): 0, or -1 when unknown. */
int muse_dtype_parse(const char *s, muse_dtype *out);

/* Opens dir/model.safetensors.index.json when present (every shard it names), else
 * dir/model.safetensors, else the single *.safetensors file in dir. Errors name the file. */
int muse_st_open(const char *dir, muse_st **out, muse_err *e);
void muse_st_close(muse_st *st);
/* A set over tensors already in memory (synthetic weights): takes t[0..n) (names owned, data
 * inside block) and the anonymous mapping block of block_len bytes, freed at close. */
int muse_st_from_memory(muse_tensor *t, size_t n, void *block, size_t block_len, muse_st **out,
                        muse_err *e);

const muse_tensor *muse_st_find(const muse_st *st, const char *name); /* NULL when absent */
size_t muse_st_count(const muse_st *st);
const muse_tensor *muse_st_at(const muse_st *st, size_t i);
uint64_t muse_st_total_bytes(const muse_st *st); /* sum of tensor bytes */
/* Element i of a float tensor (F16, BF16 or F32) as fp32; unaligned data is fine. */
float muse_tensor_f32(const muse_tensor *t, int64_t i);

/* The parsers, exposed for tests and fuzzing. They never read outside [json, json+len). */
/* Parses a safetensors JSON header describing a data section of data_len bytes. On success
 * *out is an array of *n tensors (names malloc'd, data = data_base + offset) to free with
 * muse_st_free_tensors. file names the file in errors. */
int muse_st_parse_header(const char *json, size_t len, const uint8_t *data_base, uint64_t data_len,
                         const char *file, muse_tensor **out, size_t *n, muse_err *e);
void muse_st_free_tensors(muse_tensor *t, size_t n);
/* Parses model.safetensors.index.json: weight_map of tensor name -> shard file name.
 * Shard names must be plain file names (no '/', not "." or ".."). Arrays are malloc'd;
 * free with muse_st_free_index. */
int muse_st_parse_index(const char *json, size_t len, char ***names, char ***shards, size_t *n,
                        muse_err *e);
void muse_st_free_index(char **names, char **shards, size_t n);

/* Writing: entries go to one file in the order given, 8-byte aligned header. */
typedef struct {
    const char *name;
    muse_dtype dtype;
    int ndim;
    int64_t shape[MUSE_MAX_DIMS];
    const void *data; /* nbytes = numel * dtype size */
} muse_st_entry;
int muse_st_write(const char *path, const muse_st_entry *entries, size_t n, muse_err *e);
/* Writes model.safetensors.index.json mapping each name to its shard file name. */
int muse_st_write_index(const char *path, const char *const *names, const char *const *shards,
                        size_t n, uint64_t total_bytes, muse_err *e);

#endif
