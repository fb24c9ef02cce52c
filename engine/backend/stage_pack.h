/* A round's staging packed for one host-to-device copy (the CUDA backend's begin_round): the
 * arrays its kernels read, each as long as the round's rows (or wanted rows), back to back and
 * 16-byte aligned, the 8-byte ones first, the block tables last so that a round copies them
 * only through its highest sequence's row (no kernel reads another sequence's). One copy a
 * round where there were seven: each costs microseconds however small. */
#ifndef MUSE_STAGE_PACK_H
#define MUSE_STAGE_PACK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"

/* Byte offsets of each array in the pack, and the pack's whole length. */
typedef struct {
    size_t positions, draw_pos, sampling, tokens, seqs, want, tables, bytes;
} muse_stage_pack;

static inline size_t muse_stage_pack_up(size_t n)
{
    return (n + 15) / 16 * 16;
}

/* The layout for rows rows, wanted wanted rows (sampling_size bytes a record) and the tables'
 * table_entries int32 entries (every sequence's). */
static inline muse_stage_pack muse_stage_pack_layout(size_t rows, size_t wanted,
                                                     size_t sampling_size, size_t table_entries)
{
    muse_stage_pack p;
    size_t at = 0;
    p.positions = at, at += muse_stage_pack_up(rows * 8);
    p.draw_pos = at, at += muse_stage_pack_up(wanted * 8);
    p.sampling = at, at += muse_stage_pack_up(wanted * sampling_size);
    p.tokens = at, at += muse_stage_pack_up(rows * 4);
    p.seqs = at, at += muse_stage_pack_up(rows * 4);
    p.want = at, at += muse_stage_pack_up(wanted * 4);
    p.tables = at, at += table_entries * 4;
    p.bytes = at;
    return p;
}

/* The bytes a round copies: the pack through the table row of max_seq, its highest sequence
 * (-1: none, no table). */
static inline size_t muse_stage_pack_copy(const muse_stage_pack *p, long max_seq,
                                          size_t blocks_per_seq)
{
    return p->tables + (max_seq >= 0 ? (size_t)(max_seq + 1) * blocks_per_seq * 4 : 0);
}

/* The highest sequence of the stage's real rows (-1: none). */
static inline long muse_stage_pack_max_seq(const muse_round_stage *s)
{
    long m = -1;
    for (long i = 0; i < s->real_rows; i++)
        if (s->seqs[i] > m) m = s->seqs[i];
    return m;
}

/* The stage's arrays into dst at p's offsets (p laid out for s->rows and s->wanted), the
 * sampling records as the kernel's (sampling_size bytes each) and the tables through
 * copy - p->tables bytes; the bytes between arrays left as they are. */
static inline void muse_stage_pack_fill(const muse_stage_pack *p, unsigned char *dst,
                                        const muse_round_stage *s, const void *sampling,
                                        size_t sampling_size, size_t copy)
{
    size_t R = (size_t)s->rows, W = (size_t)s->wanted;
    memcpy(dst + p->positions, s->positions, R * 8);
    memcpy(dst + p->draw_pos, s->draw_pos, W * 8);
    memcpy(dst + p->sampling, sampling, W * sampling_size);
    memcpy(dst + p->tokens, s->tokens, R * 4);
    memcpy(dst + p->seqs, s->seqs, R * 4);
    memcpy(dst + p->want, s->want, W * 4);
    memcpy(dst + p->tables, s->tables, copy - p->tables);
}

#endif
