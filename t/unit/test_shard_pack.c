/* muse_shard_pack (model/shard.h): every rank's view of every linear of the tiny-tp pack (fp16
 * and EXL3, 2 and 4 ranks), packed compactly, computes bit for bit what the strided view does
 * through the CPU backend's linear (muse_exl3_linear, muse_dense_row): the CUDA backend uploads
 * these packed views to a GPU holding one rank, so this proves its layout without a GPU; and
 * muse_model_exl3_ws, the exact product's workspace of a round, against its config by hand. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/shard.h"
#include "tap.h"

#define ROWS 3

typedef struct {
    const muse_model *m;
    int rank, ranks;
    long checked, strided, differ;
    uint64_t packed_bytes;
} pack_job;

/* The view's weight rows against the packed one's (what the CPU backend dots with x). */
static int dense_same(const muse_linear *v, const muse_linear *p)
{
    float *a = malloc((size_t)v->k * sizeof *a), *b = malloc((size_t)v->k * sizeof *b);
    int same = a && b;
    for (int64_t r = 0; same && r < v->n; r++) {
        muse_dense_row(v, r, a);
        muse_dense_row(p, r, b);
        same = !memcmp(a, b, (size_t)v->k * sizeof *a);
    }
    free(a);
    free(b);
    return same;
}

/* y = x W through the view and through the packed view, bit for bit. */
static int exl3_same(const muse_linear *v, const muse_linear *p)
{
    size_t k = (size_t)v->exl3.k, n = (size_t)v->exl3.n;
    float *x = malloc(ROWS * k * sizeof *x), *ya = malloc(ROWS * n * sizeof *ya),
          *yb = malloc(ROWS * n * sizeof *yb);
    int same = x && ya && yb;
    for (size_t i = 0; same && i < ROWS * k; i++)
        x[i] = (float)((int)((i * 2654435761u) % 2001) - 1000) / 997.0f;
    if (same) {
        muse_exl3_linear(&v->exl3, x, ROWS, ya, NULL, NULL);
        muse_exl3_linear(&p->exl3, x, ROWS, yb, NULL, NULL);
        same = !memcmp(ya, yb, ROWS * n * sizeof *ya) &&
               p->exl3.tiles_ld == p->exl3.n / 16; /* compact: a tile row is the view's alone */
    }
    free(x);
    free(ya);
    free(yb);
    return same;
}

static void check_linear(void *ctx, const muse_linear *l)
{
    pack_job *j = ctx;
    int64_t lo, hi;
    muse_linear v, p;
    muse_err e = {{0}};
    muse_shard_range(j->m, l, j->rank, j->ranks, &lo, &hi);
    if (muse_shard_view(l, lo, hi, j->rank == 0, &v, &e)) {
        j->differ++;
        diag("%s: %s", l->key, e.msg);
        return;
    }
    size_t bytes = muse_shard_packed_bytes(&v);
    void *dst = NULL;
    if (posix_memalign(&dst, 256, bytes ? bytes : 1)) {
        j->differ++;
        return;
    }
    muse_tensor t;
    muse_shard_pack(&v, dst, &t, &p);
    int same = v.kind == MUSE_LIN_DENSE ? dense_same(&v, &p) : exl3_same(&v, &p);
    if (!same) {
        j->differ++;
        diag("%s rank %d of %d: the packed view differs", l->key, j->rank, j->ranks);
    }
    int strided = v.kind == MUSE_LIN_DENSE
                      ? v.k != (v.ld ? v.ld : v.k)
                      : v.exl3.tiles_ld != v.exl3.n / 16; /* a column band, tiles of a wider row */
    j->strided += strided;
    j->checked++;
    j->packed_bytes += bytes;
    free(dst);
}

static void check_pack(int bits, int ranks)
{
    muse_synthetic o = {.config = "conf/packs/tiny-tp.json", .seed = 7, .bits = bits};
    muse_model m;
    muse_err e = {{0}};
    if (muse_model_synthetic(&o, &m, &e)) {
        ok(0, "synthetic tiny-tp, bits %d: %s", bits, e.msg);
        return;
    }
    if (muse_shard_check(&m.cfg, ranks, &e)) {
        ok(0, "tiny-tp at %d ranks: %s", ranks, e.msg);
        muse_model_free(&m);
        return;
    }
    for (int r = 0; r < ranks; r++) {
        pack_job j = {&m, r, ranks, 0, 0, 0, 0};
        muse_model_each_linear(&m, check_linear, &j);
        ok(j.differ == 0 && j.checked == m.n_linears,
           "bits %d, rank %d of %d: %ld packed views compute the strided views' bits", bits, r,
           ranks, j.checked);
        ok(j.strided > 0, "bits %d, rank %d of %d: %ld of them were strided (a real repack)", bits,
           r, ranks, j.strided);
    }
    muse_model_free(&m);
}

/* A whole (replicated, ranks 1) linear packs to itself: same bytes, same descriptor shape. */
static void check_whole(void)
{
    muse_synthetic o = {.config = "conf/packs/tiny-tp.json", .seed = 3, .bits = 4};
    muse_model m;
    muse_err e = {{0}};
    if (muse_model_synthetic(&o, &m, &e)) {
        ok(0, "synthetic tiny-tp: %s", e.msg);
        return;
    }
    const muse_linear *q = &m.layers[0].q;
    size_t bytes = muse_shard_packed_bytes(q);
    void *dst = NULL;
    ok(!posix_memalign(&dst, 256, bytes), "a buffer for the whole q_proj");
    muse_tensor t;
    muse_linear p;
    muse_shard_pack(q, dst, &t, &p);
    size_t trellis = (size_t)(q->exl3.k / 16 * (q->exl3.n / 16) * 16 * q->exl3.bits) * 2;
    ok(!memcmp(p.exl3.trellis, q->exl3.trellis, trellis), "the whole trellis is copied as it is");
    ok(exl3_same(q, &p), "and computes the same bits");
    free(dst);
    muse_model_free(&m);
}

/* The exact product's workspace of a round of 10 rows and 20 pairs on tiny.json (hidden 256,
 * dense MLPs of 384, experts of 128, vocab 1024), from its config by hand: the floats of the
 * widest input, the dense down's 384 a row at 10 rows or an expert's 256 a pair at 20; the
 * doubles of the widest output, the head's 1024 at 10 wanted rows or an expert's 256 at 20. */
static void check_exl3_ws(void)
{
    muse_synthetic o = {.config = "conf/packs/tiny.json", .seed = 5, .bits = 2};
    muse_model m;
    muse_err e = {{0}};
    if (muse_model_synthetic(&o, &m, &e)) {
        ok(0, "synthetic tiny: %s", e.msg);
        return;
    }
    size_t f = 0, d = 0;
    muse_model_exl3_ws(&m, 10, 20, 10, &f, &d);
    is_int((long)f, 20 * 256, "10 rows, 20 pairs: the experts' inputs, 20 x 256 floats");
    is_int((long)d, 10 * 1024, "and the head's outputs at 10 wanted rows, 10 x 1024 doubles");
    muse_model_exl3_ws(&m, 10, 20, 2, &f, &d);
    is_int((long)d, 20 * 256, "2 wanted rows: the experts' down outputs, 20 x 256 doubles");
    muse_model_exl3_ws(&m, 10, 10, 10, &f, &d);
    is_int((long)f, 10 * 384, "10 rows, 10 pairs: the dense down's inputs, 10 x 384 floats");
    muse_model_exl3_ws(&m, 1, 8, 1, &f, &d);
    is_int((long)d, 8 * 256, "1 row, 8 pairs: the experts' down, 8 x 256 doubles");
    muse_model_free(&m);
}

int main(void)
{
    check_exl3_ws();
    check_whole();
    for (int bits = 0; bits <= 3; bits += 3) {
        check_pack(bits, 2);
        check_pack(bits, 4);
    }
    return done_testing();
}
