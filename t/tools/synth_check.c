/* synth-check: proves --synthetic-weights on the CUDA backend fills what the host fill does.
 * Makes the config's synthetic weights twice, once all on the host and once with the trellises
 * and scales left for the GPU, starts the CUDA backend on the second, reads every tensor back
 * from the GPU's copy and compares every byte with the first; the second's host pages of the
 * GPU's tensors must still be zero (never touched). `--load-only`: the GPU way alone, timed (a
 * shape too large to fill on the host). Last line: "synth-check: PASS ..." or "FAIL ...". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_internal.h"
#include "base/clock.h"
#include "base/flags.h"
#include "model/model.h"

typedef struct {
    const char *config, *codebook;
    long long seed, bits;
    bool load_only;
} check_flags;

static int fail(const char *what, const char *msg)
{
    printf("synth-check: FAIL %s: %s\n", what, msg);
    return 1;
}

/* Every tensor of d's GPU copy against h's host bytes; the GPU's host pages of d still zero. */
static int compare(const muse_model *h, const muse_model *d, cuda_backend *c)
{
    size_t n = muse_st_count(d->st), differ = 0, touched = 0, on_gpu = 0, bytes = 0, cap = 0;
    uint8_t *buf = NULL;
    const cuda_rank *rk = &c->rank[0];
    for (size_t i = 0; i < n; i++) {
        const muse_tensor *t = muse_st_at(d->st, i), *w = muse_st_find(h->st, t->name);
        if (!w || w->nbytes != t->nbytes) {
            printf("FAIL %s: missing or another size in the host fill\n", t->name);
            differ++;
            continue;
        }
        if (t->nbytes > cap) {
            free(buf);
            cap = t->nbytes;
            buf = MUSE_MALLOC(cap);
        }
        size_t at = c->tensors[tensor_at(c, t->data)].off;
        if (cudaMemcpy(buf, rk->wdev + at, t->nbytes, cudaMemcpyDeviceToHost) != cudaSuccess)
            return fail("cudaMemcpy", cudaGetErrorString(cudaGetLastError()));
        int gpu = muse_synth_devs_find(d->dev_fill, t->data) != NULL;
        on_gpu += gpu;
        bytes += t->nbytes;
        if (memcmp(buf, w->data, t->nbytes)) {
            size_t k = 0;
            while (buf[k] == ((const uint8_t *)w->data)[k]) k++;
            if (differ++ < 10)
                printf("FAIL %s (%s): byte %zu of %zu differs: %02x, the host's %02x\n", t->name,
                       gpu ? "GPU fill" : "copied", k, t->nbytes, buf[k],
                       ((const uint8_t *)w->data)[k]);
        }
        if (gpu) {
            const uint8_t *p = t->data;
            size_t z = 0;
            while (z < t->nbytes && !p[z]) z++;
            touched += z < t->nbytes;
        }
    }
    free(buf);
    int good = !differ && !touched && on_gpu > 0;
    printf("synth-check: %s %zu tensors, %zu filled on the GPU, %zu bytes: %zu differ from the "
           "host fill, %zu GPU-filled tensors touched on the host\n",
           good ? "PASS" : "FAIL", n, on_gpu, bytes, differ, touched);
    return !good;
}

int main(int argc, char **argv)
{
    check_flags f = {.seed = 3, .bits = 2};
    const muse_flag table[] = {
        MUSE_FLAG_S("config", &f.config, "FILE", "the shape (a config.json)", .required = true),
        MUSE_FLAG_L("seed", &f.seed, 0, INT64_MAX, "SEED", "the synthetic weights' seed"),
        MUSE_FLAG_L("bits", &f.bits, 1, MUSE_EXL3_MAX_BITS, "B", "EXL3 at B bits (the head at 6)"),
        MUSE_FLAG_S("codebook", &f.codebook, "C", "mul1, mcg or 3inst", .def = "mul1"),
        MUSE_FLAG_B("load-only", &f.load_only, "the GPU fill alone, timed (no host fill)"),
    };
    muse_flags set = {"synth-check",
                      NULL,
                      "The GPU's synthetic fill against the host's, every byte of every tensor.",
                      table,
                      sizeof table / sizeof *table,
                      NULL,
                      NULL};
    int rc = muse_flags_parse(&set, argc, argv);
    if (rc != MUSE_FLAGS_RUN) return rc;
    muse_err e = {{0}};
    muse_model h = {0}, d = {0};
    muse_synthetic hs = {f.config, (uint64_t)f.seed, (int)f.bits, f.codebook, 0, 0},
                   ds = {f.config, (uint64_t)f.seed, (int)f.bits, f.codebook, 1, 0};
    if (!f.load_only && muse_model_synthetic(&hs, &h, &e)) return fail("the host fill", e.msg);
    double t0 = muse_now_s();
    if (muse_model_synthetic(&ds, &d, &e)) return fail("the GPU fill's model", e.msg);
    double t1 = muse_now_s();
    printf("synth-check: %s at %lld bits: %.2f GiB, %zu tensors left for the GPU; the host's "
           "part in %.2f s\n",
           f.config, f.bits, (double)muse_st_total_bytes(d.st) / 1073741824.0,
           muse_synth_devs_count(d.dev_fill), t1 - t0);
    fflush(stdout);
    muse_backend_opts o = {.max_rows = 4, .max_seqs = 1, .context = 64};
    muse_backend *be = muse_backend_create("cuda", &d, &o, &e);
    if (!be) return fail("--backend cuda", e.msg);
    double t2 = muse_now_s();
    printf("synth-check: backend start (GPU fill and upload) %.2f s; ready in %.2f s\n", t2 - t1,
           t2 - t0);
    rc = f.load_only ? muse_synth_devs_count(d.dev_fill) == 0 : compare(&h, &d, (cuda_backend *)be);
    if (f.load_only)
        printf("synth-check: %s loaded\n", rc ? "FAIL nothing left for the GPU:" : "PASS");
    muse_backend_destroy(be);
    muse_model_free(&d);
    if (!f.load_only) muse_model_free(&h);
    return rc;
}
