/* pack/synth_fill.h (the MUSE_HD fill the GPU runs too) and the host fill of synthetic.c: the
 * mix against SplitMix64's published outputs, every element kind against the fill as it was
 * written before the split (copied here as the reference), the parallel set against it tensor
 * by tensor, the tensors left for a GPU untouched, listed, and filled on the host on ask, and
 * a model left so for a GPU given to the CPU backend: filled on the host first. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "pack/synthetic.h"
#include "tap.h"

/* ---- the reference: pack_random.h and muse_synth_fill before the MUSE_HD split ---- */

static uint64_t ref_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

static double ref_unit(uint64_t key, uint64_t i)
{
    uint64_t x = ref_mix64(key + 0x9E3779B97F4A7C15ull * (i + 1));
    return ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double ref_normal(uint64_t key, uint64_t i)
{
    double u1 = ref_unit(key, 2 * i), u2 = ref_unit(key, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void ref_store(muse_dtype dt, void *data, size_t i, double v)
{
    if (dt == MUSE_DT_F16)
        ((uint16_t *)data)[i] = muse_f32_to_f16((float)v);
    else if (dt == MUSE_DT_BF16)
        ((uint16_t *)data)[i] = muse_f32_to_bf16((float)v);
    else
        ((float *)data)[i] = (float)v;
}

static void ref_fill(const muse_synth_spec *s, uint64_t seed, void *data)
{
    uint64_t key = muse_hash_name(s->name, seed);
    size_t n = s->bytes / muse_dtype_size(s->dtype);
    for (size_t i = 0; i < n; i++) {
        double z = ref_normal(key, i), sign = ref_unit(key, i) < 0.5 ? -1.0 : 1.0;
        switch (s->fill) {
        case FILL_LINEAR:
        case FILL_ROUTER:
            ref_store(s->dtype, data, i, z * s->scale);
            break;
        case FILL_EMBED:
            ref_store(s->dtype, data, i, z);
            break;
        case FILL_NORM_OFFSET:
            ref_store(s->dtype, data, i, 0.1 * z);
            break;
        case FILL_NORM_PLAIN:
            ref_store(s->dtype, data, i, 1.0 + 0.1 * z);
            break;
        case FILL_BIAS:
            ref_store(s->dtype, data, i, 0.05 * z);
            break;
        case FILL_TRELLIS:
            ((uint16_t *)data)[i] = (uint16_t)(ref_mix64(key + i) >> 48);
            break;
        case FILL_SUH:
            ref_store(s->dtype, data, i, sign * s->scale * (0.8 + 0.4 * ref_unit(key, i + n)));
            break;
        case FILL_SVH:
            ref_store(s->dtype, data, i, sign * (0.8 + 0.4 * ref_unit(key, i + n)));
            break;
        case FILL_MARKER:
            ((int32_t *)data)[0] = 0;
            break;
        }
    }
}

/* ---- checks ---- */

static void mix_and_unit(void)
{
    /* SplitMix64 from state 0: its first outputs are mix64 of 1, 2, 3 golden-ratio steps */
    const uint64_t g = 0x9E3779B97F4A7C15ull,
                   want[3] = {0xE220A8397B1DCDAFull, 0x6E789E6AA1B965F4ull, 0x06C45D188009454Full};
    int same = 1;
    for (int k = 0; k < 3; k++) same &= muse_mix64(g * (uint64_t)(k + 1)) == want[k];
    ok(same, "muse_mix64 is SplitMix64's finalizer (its first three outputs from state 0)");
    long bad = 0, neg = 0;
    double lo = 1, hi = 0;
    for (uint64_t i = 0; i < 200000; i++) {
        uint64_t key = ref_mix64(i * 7919u + 3);
        double u = muse_unit(key, i);
        bad += memcmp(&u, &(double){ref_unit(key, i)}, sizeof u) != 0;
        bad += muse_synth_trellis_at(key, i) != (uint16_t)(ref_mix64(key + i) >> 48);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
        uint16_t h = muse_synth_scale_at(key, 1000, 0.0625, i % 1000);
        double sign = ref_unit(key, i % 1000) < 0.5 ? -1.0 : 1.0;
        bad += h != muse_f32_to_f16(
                        (float)(sign * 0.0625 * (0.8 + 0.4 * ref_unit(key, i % 1000 + 1000))));
        neg += (h & 0x8000u) != 0;
    }
    ok(bad == 0,
       "muse_unit, the trellis word and the scale: the reference's bits at 200000 points "
       "(%ld differ)",
       bad);
    ok(lo > 0 && lo < 1e-4 && hi < 1 && hi > 1 - 1e-4, "muse_unit spans (0, 1): %.3g .. 1-%.3g", lo,
       1 - hi);
    ok(neg > 90000 && neg < 110000, "the scales' signs are half negative (%ld of 200000)", neg);
    float mag = muse_f16_to_f32(muse_synth_scale_at(12345, 64, 0.125, 7));
    ok(fabsf(mag) >= 0.8f * 0.125f * 0.999f && fabsf(mag) <= 1.2f * 0.125f * 1.001f,
       "a suh element is scale times 0.8 .. 1.2 (%g at scale 0.125)", (double)mag);
}

static muse_config tiny(void)
{
    muse_config c;
    muse_err e = {{0}};
    if (muse_config_load_file("--config", "conf/packs/tiny.json", &c, &e)) {
        diag("conf/packs/tiny.json: %s", e.msg);
        exit(1);
    }
    return c;
}

/* Every tensor of the tiny config at bits: muse_synth_fill, its ranges and the set against the
 * reference; the device tensors left untouched, then filled on the host on ask. */
static void whole_config(int bits, muse_codebook cb)
{
    muse_config c = tiny();
    muse_synth_list l = {.dtype = MUSE_DT_F16,
                         .router_bias = 1,
                         .cb = cb,
                         .exl3_bits = bits,
                         .head_bits = bits ? 6 : 0};
    muse_synth_specs(&c, &l);
    const uint64_t seed = 3;
    long differ = 0, range_differ = 0, kinds[FILL_MARKER + 1] = {0}, on_dev = 0;
    size_t bytes = 0;
    for (size_t i = 0; i < l.n; i++) {
        const muse_synth_spec *s = &l.v[i];
        uint8_t *want = calloc(1, s->bytes + 1), *got = calloc(1, s->bytes + 1),
                *part = calloc(1, s->bytes + 1);
        ref_fill(s, seed, want);
        muse_synth_fill(s, seed, got);
        size_t n = s->bytes / muse_dtype_size(s->dtype), mid = n / 3;
        muse_synth_fill_range(s, seed, part, mid, n);
        muse_synth_fill_range(s, seed, part, 0, mid);
        differ += memcmp(want, got, s->bytes) != 0;
        range_differ += memcmp(want, part, s->bytes) != 0;
        kinds[s->fill]++;
        on_dev += muse_synth_on_device(s);
        bytes += s->bytes;
        free(want);
        free(got);
        free(part);
    }
    ok(differ == 0 && range_differ == 0,
       "%d bits: each of %zu tensors (%zu bytes) filled as the reference (%ld differ; in two "
       "ranges %ld)",
       bits, l.n, bytes, differ, range_differ);
    ok(bits == 0 ? on_dev == 0 && kinds[FILL_LINEAR] > 0
                 : on_dev == kinds[FILL_TRELLIS] + kinds[FILL_SUH] + kinds[FILL_SVH] &&
                       kinds[FILL_TRELLIS] > 0 && kinds[FILL_SUH] == kinds[FILL_TRELLIS],
       "%d bits: %ld tensors a GPU fills (trellis %ld, suh %ld, svh %ld)", bits, on_dev,
       kinds[FILL_TRELLIS], kinds[FILL_SUH], kinds[FILL_SVH]);

    /* the set: the host fill on all cores, then with the device's tensors left out */
    muse_err e = {{0}};
    muse_st *all = NULL, *some = NULL;
    muse_synth_devs *devs = NULL;
    int rc = muse_synth_st(&c, &l, seed, &all, NULL, &e) ||
             muse_synth_st(&c, &l, seed, &some, &devs, &e);
    ok(rc == 0, "%d bits: both sets made %s", bits, e.msg);
    if (rc) return;
    long set_differ = 0, untouched = 0, listed = 0, later = 0, nonzero = 0;
    for (size_t i = 0; i < l.n; i++) {
        const muse_synth_spec *s = &l.v[i];
        const muse_tensor *a = muse_st_find(all, s->name), *b = muse_st_find(some, s->name);
        uint8_t *want = calloc(1, s->bytes + 1);
        ref_fill(s, seed, want);
        set_differ += !a || !b || memcmp(a->data, want, s->bytes) != 0;
        if (b && muse_synth_on_device(s)) {
            const uint8_t *p = b->data;
            size_t z = 0;
            while (z < s->bytes && !p[z]) z++;
            untouched += z == s->bytes;
            const muse_synth_dev *d = muse_synth_devs_find(devs, b->data);
            listed += d && d->bytes == s->bytes && d->el.n == s->bytes / 2;
        } else if (b) {
            set_differ += memcmp(b->data, want, s->bytes) != 0;
            set_differ += muse_synth_devs_find(devs, b->data) != NULL;
        }
        for (size_t k = 0; k < s->bytes; k++) nonzero += want[k] != 0;
        free(want);
    }
    ok(set_differ == 0,
       "%d bits: the set on all cores is the reference, tensor by tensor (%ld "
       "differ)",
       bits, set_differ);
    ok(nonzero > (long)(bytes / 2), "%d bits: the reference is not zeros (%ld of %zu bytes)", bits,
       nonzero, bytes);
    ok(untouched == on_dev && listed == on_dev && (long)muse_synth_devs_count(devs) == on_dev,
       "%d bits: the %ld tensors a GPU fills are listed (%ld) and left zero pages (%ld)", bits,
       on_dev, listed, untouched);
    muse_synth_devs_to_host(devs);
    muse_synth_devs_to_host(devs); /* a second ask fills nothing again */
    for (size_t i = 0; i < l.n; i++) {
        const muse_synth_spec *s = &l.v[i];
        const muse_tensor *b = muse_st_find(some, s->name);
        uint8_t *want = calloc(1, s->bytes + 1);
        ref_fill(s, seed, want);
        later += !b || memcmp(b->data, want, s->bytes) != 0;
        free(want);
    }
    ok(later == 0, "%d bits: filled on the host on ask, every tensor is the reference (%ld differ)",
       bits, later);
    muse_synth_devs_free(devs);
    muse_st_close(all);
    muse_st_close(some);
    muse_synth_free(&l);
}

/* --synthetic-weights with on_device, then --backend cpu: every byte the host-filled model's. */
static void cpu_backend_fills_host(void)
{
    muse_synthetic hs = {"conf/packs/tiny.json", 3, 2, "mcg", 0, 0},
                   ds = {"conf/packs/tiny.json", 3, 2, "mcg", 1, 0};
    muse_model h, d;
    muse_err e = {{0}};
    int made = !muse_model_synthetic(&hs, &h, &e) && !muse_model_synthetic(&ds, &d, &e);
    ok(made, "both models made %s", e.msg);
    if (!made) return;
    const muse_tensor *t = muse_st_find(d.st, "model.layers.1.mlp.experts.3.up_proj.trellis");
    size_t z = 0;
    while (t && z < t->nbytes && !((const uint8_t *)t->data)[z]) z++;
    ok(t && z == t->nbytes && muse_synth_devs_count(d.dev_fill) > 0,
       "on_device: a trellis left untouched (%zu tensors for the GPU)",
       muse_synth_devs_count(d.dev_fill));
    muse_backend_opts o = {.max_rows = 4, .max_seqs = 1, .context = 64, .threads = 1};
    muse_backend *be = muse_backend_create("cpu", &d, &o, &e);
    ok(be != NULL, "the CPU backend starts on it %s", e.msg);
    if (!be) return;
    long differ = 0;
    for (size_t i = 0; i < muse_st_count(d.st); i++) {
        const muse_tensor *a = muse_st_at(d.st, i), *b = muse_st_find(h.st, a->name);
        differ += !b || b->nbytes != a->nbytes || memcmp(a->data, b->data, a->nbytes) != 0;
    }
    ok(differ == 0,
       "--backend cpu filled them on the host first: %zu tensors as the host fill's "
       "(%ld differ)",
       muse_st_count(d.st), differ);
    muse_backend_destroy(be);
    muse_model_free(&d);
    muse_model_free(&h);
}

int main(void)
{
    mix_and_unit();
    whole_config(0, MUSE_CB_MUL1);
    whole_config(2, MUSE_CB_MCG);
    whole_config(4, MUSE_CB_3INST);
    cpu_backend_fills_host();
    return done_testing();
}
