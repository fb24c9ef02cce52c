/* exl3-fast-check: checks and times the fast EXL3 product (kernels/linear_fast.cu) against the
 * exact path (kernels/linear.cu) on one GPU, random weights. `--quick`: the small correctness
 * shapes only (compute-sanitizer friendly). Last line: "exl3-fast-check: N passed, N failed". */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "pack/exl3.h"
}
#include "kernels/common.cuh"
#include "kernels/linear.cuh"
#include "kernels/moe.cuh"
#include "kernels/linear_fast.cuh"
#include "kernels/linear_fast.h"
#include "kernels/moe_fast.cuh"
#include "kernels/swiglu.cuh"

static int n_pass, n_fail;
static void verdict(bool good, const char *what)
{
    (good ? n_pass : n_fail)++;
    printf("%s %s\n", good ? "ok  " : "FAIL", what);
}
#define CK(call)                                                                                   \
    do {                                                                                           \
        int e_ = (int)(call);                                                                      \
        if (e_) {                                                                                  \
            printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #call,                               \
                   cudaGetErrorString((cudaError_t)e_));                                           \
            printf("exl3-fast-check: %d passed, %d failed\n", n_pass, n_fail + 1);                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t rng_s = 12345;
static uint64_t rng64(void)
{
    uint64_t z = (rng_s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_unit(void) /* [-1, 1) */
{
    return (float)((double)(rng64() >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static const char *cb_name[3] = {"3inst", "mcg", "mul1"};
static float *d_table[3];

/* one random EXL3 linear on the device: desc (device), shape (host copy) */
typedef struct {
    muse_k_lin shape, *desc;
    std::vector<uint16_t> trellis;
    void *bufs[6];
} weight;

static void *upload(const void *h, size_t bytes)
{
    void *d;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void weight_make(weight *w, int64_t k, int64_t n, int bits, int cb, int legacy, int bias)
{
    memset(w->bufs, 0, sizeof w->bufs);
    size_t len = (size_t)(k / 16) * (size_t)(n / 16) * 16 * (size_t)bits;
    w->trellis.resize(len);
    for (size_t i = 0; i + 4 <= len; i += 4) {
        uint64_t r = rng64();
        memcpy(&w->trellis[i], &r, 8);
    }
    std::vector<uint16_t> suh(k), svh(n), su(k / 16), sv(n / 16), bs(n);
    for (auto &v : suh)
        v = muse_f32_to_f16(rng_unit() < 0 ? -0.9f - 0.2f * rng_unit() : 1.0f + 0.1f * rng_unit());
    for (auto &v : svh) v = muse_f32_to_f16(rng_unit() < 0 ? -1.0f : 1.0f + 0.1f * rng_unit());
    for (auto &v : su) v = (uint16_t)rng64();
    for (auto &v : sv) v = (uint16_t)rng64();
    for (auto &v : bs) v = muse_f32_to_f16(0.5f * rng_unit());
    muse_k_lin &s = w->shape;
    memset(&s, 0, sizeof s);
    s.kind = MUSE_K_EXL3;
    s.bits = bits;
    s.k = k;
    s.n = n;
    s.path = MUSE_K_EXL3_AUTO;
    s.codebook = cb;
    s.tiles_ld = n / 16;
    s.trellis = (const uint16_t *)(w->bufs[0] = upload(w->trellis.data(), len * 2));
    if (legacy) {
        s.su = (const uint16_t *)(w->bufs[1] = upload(su.data(), su.size() * 2));
        s.sv = (const uint16_t *)(w->bufs[2] = upload(sv.data(), sv.size() * 2));
    } else {
        s.suh = (const uint16_t *)(w->bufs[1] = upload(suh.data(), suh.size() * 2));
        s.svh = (const uint16_t *)(w->bufs[2] = upload(svh.data(), svh.size() * 2));
    }
    if (bias) s.bias = (const uint16_t *)(w->bufs[3] = upload(bs.data(), bs.size() * 2));
    s.table = d_table[cb];
    w->desc = (muse_k_lin *)(w->bufs[4] = upload(&s, sizeof s));
}
static void weight_set_cb(weight *w, int cb) /* the same trellis read with another codebook */
{
    w->shape.codebook = cb;
    w->shape.table = d_table[cb];
    CK(cudaMemcpy(w->desc, &w->shape, sizeof w->shape, cudaMemcpyHostToDevice));
}
static void weight_free(weight *w)
{
    for (void *b : w->bufs)
        if (b) CK(cudaFree(b));
    w->trellis.clear();
}

/* device scratch, grown on demand */
static void *d_ws, *d_wa, *d_wt;
static size_t ws_cap, wa_cap, wt_cap;
static void *grow(void **p, size_t *cap, size_t want)
{
    if (want > *cap) {
        if (*p) CK(cudaFree(*p));
        CK(cudaMalloc(p, want));
        *cap = want;
    }
    return *p;
}

static void run_exact(const weight *w, const float *x, long R, int round16, float *y, long ys)
{
    float *wa = (float *)grow(&d_wa, &wa_cap, (size_t)R * w->shape.k * 4);
    double *wt = (double *)grow(&d_wt, &wt_cap, (size_t)R * w->shape.n * 8);
    muse_k_ctx kc = {0};
    kc.rows = R;
    CK(muse_k_linear(&kc, w->desc, &w->shape, NULL, NULL, x, w->shape.k, round16, y, ys, wa, wt));
}

/* n_lin linears in one fast call (the launches take the host descriptors by value) */
static void run_fast(weight *const *ws, int n_lin, const float *x, long R, int round16,
                     float *const *y, const long *ys, int epi)
{
    muse_k_lin shapes[4];
    for (int i = 0; i < n_lin; i++) shapes[i] = ws[i]->shape;
    size_t need = muse_k_linear_fast_workspace(shapes, n_lin, R);
    void *wsp = grow(&d_ws, &ws_cap, need);
    muse_k_ctx kc = {0};
    kc.rows = R;
    CK(muse_k_linear_fast(&kc, shapes, n_lin, x, shapes[0].k, round16, y, ys, epi, wsp, need));
}

static std::vector<float> dl(const float *d, size_t n)
{
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}
/* bit for bit (a float == would pass -0 against +0) */
static bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * 4);
}
static double rel_l2(const std::vector<float> &a, const std::vector<float> &b)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static float *dalloc(size_t floats)
{
    float *p;
    CK(cudaMalloc(&p, floats * 4));
    return p;
}
static void poison(float *p, size_t floats)
{
    CK(cudaMemset(p, 0xFF, floats * 4)); /* NaN */
}
static float *rand_x(long R, int64_t k)
{
    std::vector<float> h((size_t)R * k);
    for (auto &v : h) v = rng_unit();
    return (float *)upload(h.data(), h.size() * 4);
}

/* how many of got's floats differ from ref's bit for bit */
static long n_differ(const std::vector<float> &got, const float *ref)
{
    long d = 0;
    for (size_t e = 0; e < got.size(); e++) d += memcmp(&got[e], &ref[e], 4) != 0;
    return d;
}

/* decoded weights bit for bit, y against the exact path, batch invariance */
static int wr_outer = -1; /* the register form's setting around a check_one call */
static void check_one(int64_t k, int64_t n, int bits, int cb, int legacy, int bias)
{
    char what[200];
    weight w;
    weight_make(&w, k, n, bits, cb, legacy, bias);
    const char *tag = legacy ? " legacy su/sv" : bias ? " bias" : "";
    /* 1: decode */
    uint16_t *d_w;
    CK(cudaMalloc(&d_w, (size_t)k * n * 2));
    CK(muse_k_linear_fast_decode(&w.shape, d_w, 0));
    std::vector<uint16_t> got((size_t)k * n);
    CK(cudaMemcpy(got.data(), d_w, got.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_w));
    long bad = 0;
    for (int64_t tk = 0; tk < k / 16; tk++)
        for (int64_t tn = 0; tn < n / 16; tn++) {
            float t[16][16];
            muse_exl3_decode_tile(&w.trellis[(size_t)(tk * (n / 16) + tn) * 16 * bits], bits,
                                  (muse_codebook)cb, t);
            for (int r = 0; r < 16; r++)
                for (int c = 0; c < 16; c++)
                    bad += muse_f16_to_f32(got[(size_t)(tk * 16 + r) * n + tn * 16 + c]) != t[r][c];
        }
    snprintf(what, sizeof what,
             "%lldx%lld %d bits %s%s: decoded weights bit-identical (%ld differ)", (long long)k,
             (long long)n, bits, cb_name[cb], tag, bad);
    verdict(bad == 0, what);
    /* 2: fast vs exact, fp32 and round16 outputs, at 256 rows */
    const long RB = 256;
    float *x = rand_x(RB, k), *ye = dalloc(RB * n), *yf = dalloc(RB * n);
    for (int r16 = 0; r16 < 2; r16++) {
        poison(ye, RB * n);
        poison(yf, RB * n);
        run_exact(&w, x, RB, r16, ye, n);
        long ys = n;
        weight *wp = &w;
        run_fast(&wp, 1, x, RB, r16, &yf, &ys, MUSE_K_EPI_NONE);
        double e = rel_l2(dl(yf, RB * n), dl(ye, RB * n));
        double tol = r16 ? 5e-4 : 2e-5;
        snprintf(what, sizeof what, "%lldx%lld %d bits %s%s %s: rel L2 fast vs exact %.3g (tol %g)",
                 (long long)k, (long long)n, bits, cb_name[cb], tag, r16 ? "round16" : "fp32", e,
                 tol);
        verdict(e <= tol, what);
    }
    /* 3: batch invariance: rows at R = 1..256 at two places, and with other rows changed (from 65
     * rows also the wgmma form where the GPU code has it: its bits against mma.sync's) */
    std::vector<float> ref = dl(yf, RB * n); /* round16 run at R = 256 */
    uint64_t h = 0xCBF29CE484222325ull; /* a digest of it: variants of one binary compare equal */
    for (float v : ref) {
        uint32_t b;
        memcpy(&b, &v, 4);
        h = (h ^ b) * 0x100000001B3ull;
    }
    printf("# digest %lldx%lld %d bits %s%s: %016llx\n", (long long)k, (long long)n, bits,
           cb_name[cb], tag, (unsigned long long)h);
    static const long Rs[] = {1, 4, 16, 17, 64, 100, 200, 256};
    float *xo = rand_x(RB, k);
    long diff = 0;
    for (long R : Rs)
        for (long place : {0L, RB - R}) {
            poison(yf, RB * n);
            long ys = n;
            weight *wp = &w;
            run_fast(&wp, 1, x + place * k, R, 1, &yf, &ys, MUSE_K_EPI_NONE);
            std::vector<float> got_y = dl(yf, R * n);
            diff += memcmp(got_y.data(), ref.data() + place * n, (size_t)R * n * 4) != 0;
            /* the 128- and the 64-column blocks of few rows alike (the default picks by size),
             * up to 8 rows transposed and not */
            for (long below : {0L, 1L << 40})
                for (int tr : {0, 1}) {
                    if (R > 16 || (tr && R > 8)) break;
                    muse_k_linear_fast_narrow(below);
                    muse_k_linear_fast_tr_force(tr);
                    poison(yf, RB * n);
                    run_fast(&wp, 1, x + place * k, R, 1, &yf, &ys, MUSE_K_EPI_NONE);
                    muse_k_linear_fast_narrow(-1);
                    muse_k_linear_fast_tr_force(-1);
                    long d = n_differ(dl(yf, R * n), ref.data() + place * n);
                    if (d)
                        printf("# R %ld at %ld, narrow %ld, transposed %d: %ld of %ld differ\n", R,
                               place, below, tr, d, R * n);
                    diff += d != 0;
                }
            /* the wgmma form where the GPU code has it (blocks of 64 and 128 rows; 256 from
             * the register form's default, mode 1), in its three kernels (one warpgroup; warps
             * specialized; the weights as the register operand) */
            /* kernel 3: the register form with its splits fused wherever it can */
            for (int mode : {64, 128, 1})
                for (int kern : {0, 1, 2, 3}) {
                    if (R <= 64 || !muse_k_linear_fast_wg()) break;
                    if (mode == 1 && kern < 2) continue;
                    muse_k_linear_fast_wg_force(mode);
                    muse_k_linear_fast_ws_force(kern == 1);
                    muse_k_linear_fast_wr_force(kern >= 2);
                    muse_k_linear_fast_fuse_force(kern == 3 ? 1 : 0);
                    poison(yf, RB * n);
                    run_fast(&wp, 1, x + place * k, R, 1, &yf, &ys, MUSE_K_EPI_NONE);
                    muse_k_linear_fast_wg_force(-1);
                    muse_k_linear_fast_ws_force(-1);
                    muse_k_linear_fast_fuse_force(-1);
                    muse_k_linear_fast_wr_force(wr_outer);
                    long d = n_differ(dl(yf, R * n), ref.data() + place * n);
                    if (d)
                        printf("# R %ld at %ld, wgmma mode %d kernel %d: %ld of %ld differ\n", R,
                               place, mode, kern, d, R * n);
                    diff += d != 0;
                }
            /* the same rows among other rows: a batch of 2R with R foreign rows first */
            if (2 * R <= RB) {
                CK(cudaMemcpy(xo + R * k, x + place * k, (size_t)R * k * 4,
                              cudaMemcpyDeviceToDevice));
                poison(yf, RB * n);
                run_fast(&wp, 1, xo, 2 * R, 1, &yf, &ys, MUSE_K_EPI_NONE);
                got_y = dl(yf, 2 * R * n);
                diff +=
                    memcmp(got_y.data() + R * n, ref.data() + place * n, (size_t)R * n * 4) != 0;
            }
        }
    snprintf(what, sizeof what,
             "%lldx%lld %d bits %s%s: batch invariant, R 1..256, block widths, wgmma (%ld differ)",
             (long long)k, (long long)n, bits, cb_name[cb], tag, diff);
    verdict(diff == 0, what);
    for (float *p : {x, ye, yf, xo}) CK(cudaFree(p));
    weight_free(&w);
}

/* q, k, v in one call (different n) and the SWIGLU epilogue, against separate exact calls */
static void check_multi(int cb, int bits)
{
    char what[200];
    const int64_t k = 256;
    const long R = 19;
    weight w[3];
    int64_t ns[3] = {384, 128, 256};
    for (int i = 0; i < 3; i++) weight_make(&w[i], k, ns[i], bits + (i == 2), cb, 0, i == 1);
    float *x = rand_x(R, k), *yf[3], *ye[3];
    long ys[3];
    for (int i = 0; i < 3; i++) {
        yf[i] = dalloc(R * ns[i]);
        ye[i] = dalloc(R * ns[i]);
        poison(yf[i], R * ns[i]);
        ys[i] = ns[i];
        run_exact(&w[i], x, R, 1, ye[i], ns[i]);
    }
    weight *wp[3] = {&w[0], &w[1], &w[2]};
    run_fast(wp, 3, x, R, 1, yf, ys, MUSE_K_EPI_NONE);
    double worst = 0;
    long same = 0;
    for (int i = 0; i < 3; i++) {
        std::vector<float> a = dl(yf[i], R * ns[i]);
        worst = std::max(worst, rel_l2(a, dl(ye[i], R * ns[i])));
        float *one = dalloc(R * ns[i]);
        poison(one, R * ns[i]);
        run_fast(&wp[i], 1, x, R, 1, &one, &ys[i], MUSE_K_EPI_NONE);
        same += dl(one, R * ns[i]) == a;
        CK(cudaFree(one));
    }
    snprintf(what, sizeof what,
             "%s %d bits: 3 linears in one call, rel L2 %.3g, equal to single calls %ld/3",
             cb_name[cb], bits, worst, same);
    verdict(worst <= 5e-4 && same == 3, what);
    /* SWIGLU: gate w[0], up a second 384-wide linear */
    weight up;
    weight_make(&up, k, 384, bits, cb, 0, 0);
    float *g = dalloc(R * 384), *u = dalloc(R * 384), *ref = dalloc(R * 384);
    run_exact(&w[0], x, R, 1, g, 384);
    run_exact(&up, x, R, 1, u, 384);
    muse_k_ctx kc = {0};
    kc.rows = R; /* rows x width elements */
    CK(muse_k_swiglu(&kc, g, u, 384, ref));
    weight *gu[2] = {&w[0], &up};
    float *outs[2] = {yf[0], NULL};
    long ys2[2] = {384, 384};
    poison(yf[0], R * 384);
    run_fast(gu, 2, x, R, 1, outs, ys2, MUSE_K_EPI_SWIGLU);
    double e = rel_l2(dl(yf[0], R * 384), dl(ref, R * 384));
    snprintf(what, sizeof what,
             "%s %d bits: SWIGLU epilogue vs exact gate, up, swiglu: rel L2 %.3g", cb_name[cb],
             bits, e);
    verdict(e <= 2e-3, what);
    /* gate/up then down in one call (muse_k_linear_fast_mlp, the down's prepare in the gate/up's
     * finish) against the two calls, bit for bit, at 3 and 19 rows; on its own random stream, so
     * the checks after it draw what they drew before it (their digests compare across builds) */
    uint64_t rng_before = rng_s;
    weight dn;
    weight_make(&dn, 384, k, bits, cb, 0, 1);
    long same_m = 0;
    for (long Rf : {3L, 19L}) {
        float *mid = dalloc(Rf * 384), *mid2 = dalloc(Rf * 384), *z = dalloc(Rf * k),
              *z2 = dalloc(Rf * k);
        for (float *q : {mid, mid2}) poison(q, Rf * 384);
        for (float *q : {z, z2}) poison(q, Rf * k);
        float *o2[2] = {mid2, NULL};
        run_fast(gu, 2, x, Rf, 1, o2, ys2, MUSE_K_EPI_SWIGLU);
        long zs = k;
        weight *dp = &dn;
        run_fast(&dp, 1, mid2, Rf, 0, &z2, &zs, MUSE_K_EPI_NONE);
        muse_k_lin sh[3] = {w[0].shape, up.shape, dn.shape};
        size_t need = muse_k_linear_fast_mlp_workspace(sh, Rf);
        void *wsp = grow(&d_ws, &ws_cap, need);
        muse_k_ctx mc = {0};
        mc.rows = Rf;
        CK(muse_k_linear_fast_mlp(&mc, sh, NULL, x, k, mid, 384, z, k, wsp, need));
        same_m += same_bits(dl(mid, Rf * 384), dl(mid2, Rf * 384)) +
                  same_bits(dl(z, Rf * k), dl(z2, Rf * k));
        for (float *q : {mid, mid2, z, z2}) CK(cudaFree(q));
    }
    snprintf(what, sizeof what, "%s %d bits: gate/up then down in one call == two calls %ld/4",
             cb_name[cb], bits, same_m);
    verdict(same_m == 4, what);
    rng_s = rng_before;
    weight_free(&dn);
    for (float *p : {g, u, ref, x}) CK(cudaFree(p));
    for (int i = 0; i < 3; i++) {
        CK(cudaFree(yf[i]));
        CK(cudaFree(ye[i]));
        weight_free(&w[i]);
    }
    weight_free(&up);
}

/* ---- the MoE's grouped product ---- */

/* E experts (gate, up: k x I; down: I x k) and the device table [3][E] of their descriptors */
typedef struct {
    std::vector<weight> w; /* gate 0..E-1, up E..2E-1, down 2E..3E-1 */
    muse_k_lin *table;
    long E;
} experts;

static void experts_make(experts *x, long E, int64_t H, int64_t I, int bits, int cb)
{
    x->E = E;
    x->w.resize(3 * E);
    std::vector<muse_k_lin> h(3 * E);
    for (long i = 0; i < 3 * E; i++) {
        bool down = i >= 2 * E;
        weight_make(&x->w[i], down ? I : H, down ? H : I, bits, cb, 0, 0);
        h[i] = x->w[i].shape;
    }
    x->table = (muse_k_lin *)upload(h.data(), h.size() * sizeof h[0]);
}
static void experts_free(experts *x)
{
    for (auto &w : x->w) weight_free(&w);
    CK(cudaFree(x->table));
}

/* the device plan of P pairs, as cuda_fast.c lays it out */
typedef struct {
    int32_t *sel, *src, *plan;
    int most, gr, mg;
} moe_plan;

static void plan_make(moe_plan *p, const std::vector<int32_t> &sel, long R, long K, long E)
{
    long P = R * K;
    std::vector<int32_t> src(P);
    for (long i = 0; i < P; i++) src[i] = (int32_t)(i / K);
    p->sel = (int32_t *)upload(sel.data(), P * 4);
    p->src = (int32_t *)upload(src.data(), P * 4);
    p->gr = muse_k_linear_fast_group_rows(R, K, E);
    p->mg = muse_k_moe_max_groups(P, E, p->gr);
    p->most = p->mg;
    CK(cudaMalloc(&p->plan, ((size_t)p->most * 4 + P + 4) * 4));
}
static void plan_free(moe_plan *p)
{
    for (int32_t *q : {p->sel, p->src, p->plan}) CK(cudaFree(q));
}

/* z [P, H] of every pair: plan, gate/up + swiglu into act [P, I], down into z; the experts
 * split as the engine splits them for 8 experts a token (MUSE_FAST_GROUP_TARGET / 8) */
static const int GROUP_TARGET = MUSE_FAST_GROUP_TARGET / 8;
static void run_grouped(const experts *x, const moe_plan *pl, const float *b, long R, long K,
                        float *act, float *z, bool chain = true, double *row_sq = nullptr)
{
    long P = R * K, E = x->E;
    int64_t H = x->w[0].shape.k, I = x->w[0].shape.n;
    int32_t *groups = pl->plan, *perm = groups + (size_t)pl->most * 4, *n_groups = perm + P;
    muse_k_ctx pc = {0};
    pc.rows = P;
    CK(muse_k_moe_group(&pc, pl->sel, E, pl->gr, pl->mg, perm, groups, n_groups));
    muse_k_lin shapes[3] = {x->w[0].shape, x->w[E].shape, x->w[2 * E].shape};
    if (chain) { /* one call, the down's prepare in the gate/up's finish (the engine's) */
        size_t need = muse_k_linear_fast_mlp_workspace(shapes, P);
        void *wsp = grow(&d_ws, &ws_cap, need);
        muse_k_fast_groups g = {{x->table, x->table + E, x->table + 2 * E},
                                pl->sel,
                                pl->src,
                                perm,
                                groups,
                                n_groups,
                                pl->mg,
                                pl->gr,
                                GROUP_TARGET,
                                row_sq};
        CK(muse_k_linear_fast_mlp(&pc, shapes, &g, b, H, act, I, z, H, wsp, need));
        return;
    }
    size_t need = std::max(muse_k_linear_fast_workspace(shapes, 2, P),
                           muse_k_linear_fast_workspace(shapes + 2, 1, P));
    void *wsp = grow(&d_ws, &ws_cap, need);
    muse_k_fast_groups g = {{x->table, x->table + E},
                            pl->sel,
                            pl->src,
                            perm,
                            groups,
                            n_groups,
                            pl->mg,
                            pl->gr,
                            GROUP_TARGET};
    float *y[2] = {act, NULL};
    long ys[2] = {(long)I, (long)I};
    CK(muse_k_linear_fast_grouped(&pc, shapes, 2, &g, b, H, 1, y, ys, MUSE_K_EPI_SWIGLU, wsp,
                                  need));
    muse_k_fast_groups gd = {{x->table + 2 * E}, pl->sel, NULL,   perm,         groups,
                             n_groups,           pl->mg,  pl->gr, GROUP_TARGET, row_sq};
    float *yd[1] = {z};
    long yds[1] = {(long)H};
    CK(muse_k_linear_fast_grouped(&pc, shapes + 2, 1, &gd, act, I, 0, yd, yds, MUSE_K_EPI_NONE, wsp,
                                  need));
}

/* K distinct experts a row, drawn at random */
static std::vector<int32_t> rand_sel(long R, long K, long E)
{
    std::vector<int32_t> sel(R * K);
    for (long r = 0; r < R; r++)
        for (long s = 0; s < K; s++) {
            int32_t e;
            bool again;
            do {
                e = (int32_t)(rng64() % (uint64_t)E);
                again = false;
                for (long q = 0; q < s; q++) again |= sel[r * K + q] == e;
            } while (again);
            sel[r * K + s] = e;
        }
    return sel;
}

/* The down's row sums of squares (muse_k_fast_groups.row_sq) as the finish forms them from the
 * values it writes: a lane's (((x0^2 + x1^2) + x2^2) + x3^2) in double, then the warp's
 * butterfly (lane l adds lane l ^ m's, m = 16 .. 1), lane 0's, for each 128-column block. */
static long row_sq_diff(const std::vector<float> &z, const std::vector<double> &sq, long P,
                        int64_t H)
{
    long nb = H / 128, bad = 0;
    for (long p = 0; p < P; p++)
        for (long b = 0; b < nb; b++) {
            double v[32], w[32];
            for (int l = 0; l < 32; l++) {
                const float *o = z.data() + p * H + b * 128 + 4 * l;
                v[l] = (((double)o[0] * o[0] + (double)o[1] * o[1]) + (double)o[2] * o[2]) +
                       (double)o[3] * o[3];
            }
            for (int m = 16; m > 0; m >>= 1) {
                for (int l = 0; l < 32; l++) w[l] = v[l] + v[l ^ m];
                memcpy(v, w, sizeof v);
            }
            bad += memcmp(&v[0], &sq[p * nb + b], sizeof(double)) != 0;
        }
    return bad;
}

/* every pair of the grouped call equal bit for bit to its row through its expert alone (a
 * grouped call of that one pair: gate/up + swiglu then down), at 1 row, a few, and past 16
 * rows; within tolerance of the exact path */
static void check_grouped(int cb, int bits)
{
    char what[300];
    const long E = 6, K = 3;
    const int64_t H = 256, I = 384;
    experts x;
    experts_make(&x, E, H, I, bits, cb);
    long diff = 0, pairs = 0, two_diff = 0, two_runs = 0, sq_diff = 0, sq_n = 0;
    double worst = 0;
    for (long R : {1L, 5L, 20L, 64L, 128L, 256L}) { /* blocks of 1, 1, 1, 2, 4, 8 m-tiles */
        long P = R * K, nb = (long)H / 128;
        std::vector<int32_t> sel = rand_sel(R, K, E);
        moe_plan pl;
        plan_make(&pl, sel, R, K, E);
        float *b = rand_x(R, H), *act = dalloc(P * I), *z = dalloc(P * H);
        double *sq;
        CK(cudaMalloc(&sq, (size_t)(P * nb) * sizeof(double)));
        CK(cudaMemset(sq, 0xff, (size_t)(P * nb) * sizeof(double))); /* NaN: poisoned */
        poison(act, P * I);
        poison(z, P * H);
        run_grouped(&x, &pl, b, R, K, act, z, true, sq);
        std::vector<float> got = dl(z, P * H), got_act = dl(act, P * I);
        std::vector<double> got_sq(P * nb);
        CK(cudaMemcpy(got_sq.data(), sq, got_sq.size() * sizeof(double), cudaMemcpyDeviceToHost));
        sq_diff += row_sq_diff(got, got_sq, P, H);
        sq_n += P * nb;
        /* the two grouped calls (the down's own prepare): the same bits, the same sums */
        poison(act, P * I);
        poison(z, P * H);
        CK(cudaMemset(sq, 0xff, (size_t)(P * nb) * sizeof(double)));
        run_grouped(&x, &pl, b, R, K, act, z, false, sq);
        two_diff += !same_bits(dl(z, P * H), got) + !same_bits(dl(act, P * I), got_act);
        CK(cudaMemcpy(got_sq.data(), sq, got_sq.size() * sizeof(double), cudaMemcpyDeviceToHost));
        sq_diff += row_sq_diff(got, got_sq, P, H);
        sq_n += P * nb;
        CK(cudaFree(sq));
        two_runs += 2;
        float *a1 = dalloc(I), *z1 = dalloc(H), *g1 = dalloc(I), *u1 = dalloc(I), *s1 = dalloc(I);
        for (long p = 0; p < P; p++) {
            long e = sel[p];
            weight *dn = &x.w[2 * E + e];
            std::vector<int32_t> one_sel = {(int32_t)e};
            moe_plan one_pl;
            plan_make(&one_pl, one_sel, 1, 1, E);
            poison(z1, H);
            run_grouped(&x, &one_pl, b + (p / K) * H, 1, 1, a1, z1);
            plan_free(&one_pl);
            std::vector<float> one = dl(z1, H);
            diff += memcmp(one.data(), got.data() + p * H, H * 4) != 0;
            pairs++;
            /* and within tolerance of the exact path's gate, up, swiglu, down */
            muse_k_ctx kc = {0};
            kc.rows = 1;
            run_exact(&x.w[e], b + (p / K) * H, 1, 1, g1, I);
            run_exact(&x.w[E + e], b + (p / K) * H, 1, 1, u1, I);
            CK(muse_k_swiglu(&kc, g1, u1, I, s1));
            run_exact(dn, s1, 1, 0, z1, H);
            worst = std::max(
                worst, rel_l2(std::vector<float>(got.begin() + p * H, got.begin() + (p + 1) * H),
                              dl(z1, H)));
        }
        for (float *q : {b, act, z, a1, z1, g1, u1, s1}) CK(cudaFree(q));
        plan_free(&pl);
    }
    snprintf(what, sizeof what,
             "%s %d bits: grouped experts == each pair alone %ld/%ld, rel L2 vs exact %.3g; one "
             "call == two calls %ld/%ld; row sums of squares == the host's tree %ld/%ld",
             cb_name[cb], bits, pairs - diff, pairs, worst, two_runs - two_diff, two_runs,
             sq_n - sq_diff, sq_n);
    verdict(diff == 0 && two_diff == 0 && sq_diff == 0 && worst <= 2e-3, what);
    experts_free(&x);
}

/* The fast selection (a warp a row: places by counting, or the sequential picks where a row
 * has a NaN key) against the exact kernel's sel and w, and the selection with the grouping in
 * one launch against both separate launches, bit for bit: E 96 and 12 (groups of 2 rows),
 * top 8, logits of few distinct values (many ties), with and without a selection bias; row 2
 * partly NaN (fast and fused alike; the exact kernel's own order among NaNs is not the fast
 * one's). */
/* The hardware's fp16 conversions (kernels/common.cuh) against base/f16.h: every fp16 to fp32,
 * every fp32 to fp16 and back; a NaN only as a NaN. bad[0..2]: the three's mismatches. */
__device__ void conv_check_one(uint32_t u, unsigned long long *bad)
{
    float f = muse_bits_to_f32(u);
    bool nan = f != f;
    uint16_t a = k_f32_to_f16_hw(f), b = muse_f32_to_f16(f);
    float ra = k_round_f16_hw(f), rb = muse_round_f16(f);
    if (nan ? (a & 0x7FFF) <= 0x7C00 : a != b) atomicAdd(bad + 1, 1ull);
    if (nan ? ra == ra : muse_f32_to_bits(ra) != muse_f32_to_bits(rb)) atomicAdd(bad + 2, 1ull);
    if (u < 65536) {
        uint16_t h = (uint16_t)u;
        float x = k_f16_to_f32_hw(h), y = muse_f16_to_f32(h);
        bool hn = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
        if (hn ? x == x : muse_f32_to_bits(x) != muse_f32_to_bits(y)) atomicAdd(bad, 1ull);
    }
}

/* 2^24 threads, 256 values each: every fp32 bit pattern once */
__global__ void k_conv_check(unsigned long long *bad)
{
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    for (uint32_t i = 0; i < 256; i++) conv_check_one(i << 24 | t, bad);
}

static void check_conversions(void)
{
    unsigned long long *bad, h[3];
    CK(cudaMalloc(&bad, sizeof h));
    CK(cudaMemset(bad, 0, sizeof h));
    k_conv_check<<<65536, 256>>>(bad);
    CK(cudaMemcpy(h, bad, sizeof h, cudaMemcpyDeviceToHost));
    CK(cudaFree(bad));
    char what[200];
    snprintf(what, sizeof what,
             "hardware fp16 conversions == base/f16.h: fp16->fp32 %llu of 65536 differ, "
             "fp32->fp16 %llu and round %llu of 2^32 (NaN as NaN)",
             h[0], h[1], h[2]);
    verdict(!h[0] && !h[1] && !h[2], what);
}

static void check_select(void)
{
    const long K = 8;
    long diff = 0, checked = 0;
    for (long E : {96L, 12L}) /* 12: experts repeat across rows, groups of 2 rows split */
        for (long R : {1L, 3L, 4L, 5L, 9L})
            for (int with_bias : {0, 1}) {
                std::vector<float> lg(R * E), bias(E);
                for (auto &v : lg) v = (float)(rng64() % 7) * 0.5f - 1.5f;
                for (auto &v : bias) v = (float)(rng64() % 3) * 0.25f;
                if (R >= 3)
                    for (long x = 0; x < E; x += 5) lg[2 * E + x] = NAN;
                float *d_lg = (float *)upload(lg.data(), lg.size() * 4);
                float *d_bias = with_bias ? (float *)upload(bias.data(), E * 4) : NULL;
                long P = R * K;
                int gr = E == 12 ? 2 : 16, mg = muse_k_moe_max_groups(P, E, gr);
                int32_t *sel[3], *plan[2];
                float *w[3];
                for (int i = 0; i < 3; i++) {
                    CK(cudaMalloc(&sel[i], P * 4));
                    CK(cudaMalloc(&w[i], P * 4));
                    CK(cudaMemset(sel[i], 0xFF, P * 4));
                    CK(cudaMemset(w[i], 0xFF, P * 4));
                }
                size_t plan_ints = (size_t)mg * 4 + P + 1;
                for (int i = 0; i < 2; i++) {
                    CK(cudaMalloc(&plan[i], plan_ints * 4));
                    CK(cudaMemset(plan[i], 0xFF, plan_ints * 4));
                }
                muse_k_ctx kc = {0}, pc = {0};
                kc.rows = R;
                pc.rows = P;
                CK(muse_k_select(&kc, d_lg, E, K, d_bias, 1, 2.5f, sel[0], w[0]));
                CK(muse_k_select_fast(&kc, d_lg, E, K, d_bias, 1, 2.5f, sel[1], w[1]));
                CK(muse_k_moe_group(&pc, sel[1], E, gr, mg, plan[0] + (size_t)mg * 4, plan[0],
                                    plan[0] + (size_t)mg * 4 + P));
                CK(muse_k_select_group_fast(&kc, d_lg, E, K, d_bias, 1, 2.5f, sel[2], w[2], gr, mg,
                                            plan[1] + (size_t)mg * 4, plan[1],
                                            plan[1] + (size_t)mg * 4 + P));
                std::vector<int32_t> s0(P), s1(P), g0(plan_ints), g1(plan_ints);
                std::vector<float> w0(P), w1(P);
                CK(cudaMemcpy(s0.data(), sel[0], P * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(w0.data(), w[0], P * 4, cudaMemcpyDeviceToHost));
                for (int i = 1; i < 3; i++) {
                    CK(cudaMemcpy(s1.data(), sel[i], P * 4, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(w1.data(), w[i], P * 4, cudaMemcpyDeviceToHost));
                    if (i ==
                        1) { /* the exact kernel's picks among NaN keys are its own: row 2 out */
                        for (long q = 0; q < P; q++)
                            diff += q / K != 2 && (s0[q] != s1[q] || memcmp(&w0[q], &w1[q], 4));
                        s0 = s1; /* the fused launch: equal to the fast one on every row */
                        w0 = w1;
                    } else {
                        diff += memcmp(s0.data(), s1.data(), P * 4) != 0;
                        diff += memcmp(w0.data(), w1.data(), P * 4) != 0;
                    }
                    checked += 2;
                }
                CK(cudaMemcpy(g0.data(), plan[0], plan_ints * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(g1.data(), plan[1], plan_ints * 4, cudaMemcpyDeviceToHost));
                int32_t ng = g0[(size_t)mg * 4 + P];
                diff += ng != g1[(size_t)mg * 4 + P] || ng < 1 ||
                        memcmp(g0.data(), g1.data(), (size_t)ng * 16) != 0 ||
                        memcmp(g0.data() + (size_t)mg * 4, g1.data() + (size_t)mg * 4, P * 4) != 0;
                checked++;
                for (int i = 0; i < 3; i++) {
                    CK(cudaFree(sel[i]));
                    CK(cudaFree(w[i]));
                }
                for (int i = 0; i < 2; i++) CK(cudaFree(plan[i]));
                CK(cudaFree(d_lg));
                if (d_bias) CK(cudaFree(d_bias));
            }
    char what[200];
    snprintf(what, sizeof what,
             "select: fast and fused with the groups equal to the exact kernel's sel and w, the "
             "groups to the separate launch's (%ld of %ld differ)",
             diff, checked);
    verdict(diff == 0, what);
}

/* The fast router (MUSE_FAST_ROUTER: the chunked one by default) at 9 rows equal bit for bit
 * to each row alone and within 1e-6 of the exact router's logits, bf16 and fp32 weights. */
/* The grouping (muse_k_moe_group) against a host counting sort walking the pairs in order:
 * perm, groups and their count at 1 to 8192 pairs of 96 experts (group rows 16, 32, 128, a
 * max_groups that cuts the list short), some pairs outside [0, E) (in no group) */
static void check_group(void)
{
    const long E = 96;
    long diff = 0, checked = 0;
    for (long P : {1L, 40L, 255L, 2048L, 8192L})
        for (int gr : {16, 32, 128})
            for (int cut : {0, 1}) {
                std::vector<int32_t> sel(P);
                for (auto &v : sel) v = (int32_t)(rng64() % (E + 2)) - 1; /* -1 and E: none */
                int mg = muse_k_moe_max_groups(P, E, gr);
                if (cut) mg = mg / 3 + 1;
                std::vector<int32_t> perm, cnt(E, 0);
                std::vector<int32_t> groups;
                for (long e = 0; e < E; e++)
                    for (long p = 0; p < P; p++)
                        if (sel[p] == e) perm.push_back((int32_t)p), cnt[e]++;
                int32_t at = 0, g = 0;
                for (long e = 0; e < E; e++) {
                    for (int32_t c0 = 0; c0 < cnt[e] && g < mg; c0 += gr, g++)
                        groups.insert(groups.end(),
                                      {(int32_t)e, at + c0, std::min(cnt[e] - c0, gr), 0});
                    at += cnt[e];
                }
                int32_t *d_sel = (int32_t *)upload(sel.data(), P * 4), *plan;
                size_t ints = (size_t)mg * 4 + P + 1;
                CK(cudaMalloc(&plan, ints * 4));
                CK(cudaMemset(plan, 0xFF, ints * 4));
                muse_k_ctx pc = {0};
                pc.rows = P;
                CK(muse_k_moe_group(&pc, d_sel, E, gr, mg, plan + (size_t)mg * 4, plan,
                                    plan + (size_t)mg * 4 + P));
                std::vector<int32_t> h(ints);
                CK(cudaMemcpy(h.data(), plan, ints * 4, cudaMemcpyDeviceToHost));
                diff += h[(size_t)mg * 4 + P] != g ||
                        memcmp(h.data(), groups.data(), groups.size() * 4) != 0 ||
                        memcmp(h.data() + (size_t)mg * 4, perm.data(), perm.size() * 4) != 0;
                checked++;
                CK(cudaFree(d_sel));
                CK(cudaFree(plan));
            }
    char what[160];
    snprintf(what, sizeof what,
             "group: perm, groups and count equal to the host's counting sort, %ld of %ld cases",
             checked - diff, checked);
    verdict(diff == 0, what);
}

static void check_router(void)
{
    const long H = 6144;
    long diff = 0;
    double worst = 0;
    for (long E : {96L, 13L})    /* 13: a block of k_router_rows with fewer experts than it holds */
        for (long R : {9L, 40L}) /* rows past 8: k_router_rows; each alone: k_router_vec */
            for (int dtype : {MUSE_K_BF16, MUSE_K_F32}) {
                std::vector<uint16_t> w16(E * H);
                std::vector<float> w32(E * H), x(R * H);
                for (long i = 0; i < E * H; i++) {
                    w32[i] = 0.05f * rng_unit();
                    w16[i] = muse_f32_to_bf16(w32[i]);
                }
                for (auto &v : x) v = rng_unit();
                void *d_w = dtype == MUSE_K_BF16 ? upload(w16.data(), w16.size() * 2)
                                                 : upload(w32.data(), w32.size() * 4);
                float *d_x = (float *)upload(x.data(), x.size() * 4), *lf = dalloc(R * E),
                      *le = dalloc(R * E), *l1 = dalloc(E);
                poison(lf, R * E);
                muse_k_ctx kc = {0};
                kc.rows = R;
                CK(muse_k_router_fast(&kc, d_x, H, d_w, dtype, E, lf));
                CK(muse_k_router(&kc, d_x, H, d_w, dtype, E, le));
                std::vector<float> all = dl(lf, R * E);
                worst = std::max(worst, rel_l2(all, dl(le, R * E)));
                kc.rows = 1;
                for (long r = 0; r < R; r++) {
                    poison(l1, E);
                    CK(muse_k_router_fast(&kc, d_x + r * H, H, d_w, dtype, E, l1));
                    diff += memcmp(dl(l1, E).data(), all.data() + r * E, E * 4) != 0;
                }
                for (void *p : {d_w, (void *)d_x, (void *)lf, (void *)le, (void *)l1})
                    CK(cudaFree(p));
            }
    char what[200];
    snprintf(what, sizeof what,
             "router: 9 and 40 rows of 96 and 13 experts equal to each row alone (%ld differ), "
             "rel L2 vs exact %.3g",
             diff, worst);
    verdict(diff == 0 && worst <= 1e-6, what);
}

/* ---- timing ---- */

static void *d_flush;
static const size_t FLUSH_BYTES = 256u << 20;
template <class F> static double median_us(F call, int reps, bool flush)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    call(); /* warm-up */
    CK(cudaDeviceSynchronize());
    std::vector<float> ts;
    for (int i = 0; i < reps; i++) {
        if (flush) CK(cudaMemsetAsync(d_flush, i & 0xFF, FLUSH_BYTES, 0));
        CK(cudaEventRecord(a, 0));
        call();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms * 1000.0f);
        if (i == 0 && ms > 50.0f) break; /* too slow to repeat */
    }
    std::sort(ts.begin(), ts.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ts[ts.size() / 2];
}

static double copy_bw; /* bytes/s, read + write of a 1 GiB device copy */

static void time_row(weight *const *ws, int n_lin, long M, bool exact, const char *label)
{
    int64_t k = ws[0]->shape.k, nsum = 0;
    double bytes = 0;
    for (int i = 0; i < n_lin; i++) {
        nsum += ws[i]->shape.n;
        bytes += (double)k * ws[i]->shape.n * ws[i]->shape.bits / 8;
    }
    float *x = rand_x(M, k), *y[4];
    long ys[4];
    for (int i = 0; i < n_lin; i++) {
        y[i] = dalloc((size_t)M * ws[i]->shape.n);
        ys[i] = ws[i]->shape.n;
    }
    double tf = median_us([&] { run_fast(ws, n_lin, x, M, 1, y, ys, MUSE_K_EPI_NONE); }, 20, true);
    double te = NAN;
    if (exact)
        te = median_us(
            [&] {
                for (int i = 0; i < n_lin; i++) run_exact(ws[i], x, M, 1, y[i], ys[i]);
            },
            20, true);
    double wps = (double)k * nsum / (tf * 1e-6);
    double pct = 100.0 * bytes / (tf * 1e-6) / copy_bw;
    char tfl[32] = "";
    if (M >= 256) snprintf(tfl, sizeof tfl, "%.1f", 2.0 * M * k * nsum / (tf * 1e-6) / 1e12);
    printf("%-24s %5ld %4d %-5s %10.1f %10.1f %8.3f %6.1f %8s\n", label, M, ws[0]->shape.bits,
           cb_name[ws[0]->shape.codebook], tf, te, wps / 1e12, pct, tfl);
    fflush(stdout);
    CK(cudaFree(x));
    for (int i = 0; i < n_lin; i++) CK(cudaFree(y[i]));
}

static void measure_copy(void)
{
    void *c0, *c1;
    size_t gib = 1u << 30;
    CK(cudaMalloc(&c0, gib));
    CK(cudaMalloc(&c1, gib));
    double us = median_us([&] { CK(cudaMemcpyAsync(c1, c0, gib, cudaMemcpyDeviceToDevice, 0)); },
                          20, false);
    copy_bw = 2.0 * gib / (us * 1e-6);
    CK(cudaFree(c0));
    CK(cudaFree(c1));
    CK(cudaMalloc(&d_flush, FLUSH_BYTES));
    printf("# copy bandwidth %.2f TB/s (1 GiB device copy, read + write); split target %d\n",
           copy_bw / 1e12, muse_k_linear_fast_split_target());
}

static void time_all(void)
{
    measure_copy();
    printf("%-24s %5s %4s %-5s %10s %10s %8s %6s %8s\n", "shape", "M", "bits", "cb", "fast_us",
           "exact_us", "Tw/s", "%bw", "TFLOP/s");
    char label[64];
    for (int bits : {2, 4}) {
        weight a, b, c, d, e;
        weight_make(&a, 6144, 4096, bits, 0, 0, 0);
        weight_make(&b, 6144, 3072, bits, 0, 0, 0);
        weight_make(&c, 3072, 6144, bits, 0, 0, 0);
        weight_make(&d, 6144, 512, bits, 0, 0, 0);
        weight_make(&e, 6144, 512, bits, 0, 0, 0);
        for (int cb = 0; cb < 3; cb++) {
            for (weight *w : {&a, &b, &c, &d, &e}) weight_set_cb(w, cb);
            weight *pa = &a, *pb = &b, *pc = &c, *pd = &d;
            for (long M : {1L, 16L, 256L, 4096L})
                time_row(&pa, 1, M, M <= 256 || bits == 4, "6144x4096");
            time_row(&pb, 1, 1, true, "6144x3072");
            time_row(&pc, 1, 1, true, "3072x6144");
            time_row(&pd, 1, 1, true, "6144x512");
            weight *qkv[3] = {&a, &d, &e};
            time_row(qkv, 3, 1, true, "qkv 6144x(4096+512+512)");
        }
        for (weight *w : {&a, &b, &c, &d, &e}) weight_free(w);
    }
    for (int bits : {2, 3, 4}) {
        weight w;
        weight_make(&w, 8192, 28672, bits, 0, 0, 0);
        for (int cb = 0; cb < 3; cb++) {
            weight_set_cb(&w, cb);
            weight *p = &w;
            time_row(&p, 1, 1, true, "8192x28672");
        }
        weight_free(&w);
    }
    { /* the head: 202048 columns padded to 128 (EXL3 pads every dimension to 128) */
        weight w;
        weight_make(&w, 6144, 202112, 6, 0, 0, 0);
        for (int cb = 0; cb < 3; cb++) {
            weight_set_cb(&w, cb);
            weight *p = &w;
            snprintf(label, sizeof label, "head 6144x202112");
            time_row(&p, 1, 1, true, label);
        }
        weight_free(&w);
    }
}

/* the experts of one MoE layer at the one-GPU shape: E experts 6144 -> 3072 -> 6144, top 8 */
/* The median us of the routed experts x (6144 -> 3072 -> 6144) at M rows of K random experts
 * (reps runs, caches flushed): *group the group rows the round takes, *weights the weights of
 * the experts chosen */
static double time_experts(const experts *x, long M, long K, int reps, int *group, double *weights)
{
    long P = M * K, E = x->E;
    std::vector<int32_t> sel = rand_sel(M, K, E);
    moe_plan pl;
    plan_make(&pl, sel, M, K, E);
    float *b = rand_x(M, 6144), *act = dalloc(P * 3072), *z = dalloc(P * 6144);
    double t = median_us([&] { run_grouped(x, &pl, b, M, K, act, z); }, reps, true);
    std::vector<bool> used(E);
    for (int32_t e : sel) used[e] = true;
    *weights = 0;
    for (long e = 0; e < E; e++) *weights += used[e] ? 3.0 * 6144 * 3072 : 0;
    *group = pl.gr;
    for (float *q : {b, act, z}) CK(cudaFree(q));
    plan_free(&pl);
    return t;
}

static void time_moe(void)
{
    const long E = 32, K = 8;
    printf("%-24s %5s %4s %-5s %10s %10s %8s %6s\n", "moe experts (top 8 of 32)", "M", "bits", "cb",
           "fast_us", "", "Tw/s", "%bw");
    for (int cb = 0; cb < 3; cb++) {
        experts x;
        experts_make(&x, E, 6144, 3072, 2, cb);
        for (long M : {1L, 4L, 16L, 256L}) {
            int gr;
            double w, t = time_experts(&x, M, K, 20, &gr, &w);
            printf("%-24s %5ld %4d %-5s %10.1f %10s %8.3f %6.1f\n", "moe experts", M, 2,
                   cb_name[cb], t, "", w / (t * 1e-6) / 1e12,
                   100.0 * (w * 2 / 8) / (t * 1e-6) / copy_bw);
            fflush(stdout);
        }
        experts_free(&x);
    }
}

/* --many: the product at many rows under the environment's MUSE_FAST_MANY_MT (1, 2, 4, 8 or
 * unset: the fewest m-tiles that hold a block's rows), 2 bits mcg: 6144x4096 and 6144x3072
 * at 32 to 1024 rows, then the routed experts of the one-GPU shape (8 of 96, 6144 -> 3072 ->
 * 6144) at 64 to 1024 rows, with the group rows each round takes */
static void time_many(void)
{
    measure_copy();
    const char *f = getenv("MUSE_FAST_MANY_MT"), *wg = getenv("MUSE_FAST_WG"),
               *ws = getenv("MUSE_FAST_WS"), *wr = getenv("MUSE_FAST_WR"),
               *wrr = getenv("MUSE_FAST_WR_ROWS");
    printf("# MUSE_FAST_MANY_MT=%s MUSE_FAST_WG=%s MUSE_FAST_WS=%s MUSE_FAST_WR=%s "
           "MUSE_FAST_WR_ROWS=%s (wgmma form loaded: %d)\n",
           f && *f ? f : "(unset)", wg && *wg ? wg : "(unset)", ws && *ws ? ws : "(unset)",
           wr && *wr ? wr : "(unset)", wrr && *wrr ? wrr : "(unset)", muse_k_linear_fast_wg());
    printf("%-24s %5s %4s %-5s %10s %10s %8s %6s %8s\n", "shape", "M", "bits", "cb", "fast_us", "",
           "Tw/s", "%bw", "TFLOP/s");
    weight a, b;
    weight_make(&a, 6144, 4096, 2, 1, 0, 0);
    weight_make(&b, 6144, 3072, 2, 1, 0, 0);
    weight *pa = &a, *pb = &b;
    for (long M : {32L, 64L, 128L, 256L, 1024L, 4096L}) time_row(&pa, 1, M, false, "6144x4096");
    for (long M : {32L, 64L, 256L}) time_row(&pb, 1, M, false, "6144x3072");
    weight_free(&a);
    weight_free(&b);
    const long E = 96, K = 8;
    experts x;
    experts_make(&x, E, 6144, 3072, 2, 1);
    printf("%-24s %5s %5s %10s %8s %8s\n", "moe experts (8 of 96)", "M", "group", "fast_us", "Tw/s",
           "TFLOP/s");
    for (long M : {64L, 256L, 1024L, 2048L}) {
        int gr;
        double w, t = time_experts(&x, M, K, 10, &gr, &w);
        printf("%-24s %5ld %5d %10.1f %8.3f %8.1f\n", "moe experts", M, gr, t,
               w / (t * 1e-6) / 1e12, 2.0 * M * K * 3.0 * 6144 * 3072 / (t * 1e-6) / 1e12);
        fflush(stdout);
    }
    experts_free(&x);
}

/* --prof [M]: a few products alone, for a profiler (ncu -k regex:k_fast_product): 6144x4096
 * and 8192x28672 at 2 bits mcg, M rows (1 unless given), then the grouped experts (top 8 of
 * 32 at one row; of 96, the one-GPU shape's, at more), three calls each, no checks */
static void prof_only(long M)
{
    for (int64_t kn : {6144L * 4096L, 8192L * 28672L}) {
        weight w;
        int64_t k = kn == 6144L * 4096L ? 6144 : 8192;
        weight_make(&w, k, kn / k, 2, 1, 0, 0);
        weight *p = &w;
        float *x = rand_x(M, k), *y = dalloc((size_t)M * (size_t)(kn / k));
        long ys = kn / k;
        for (int i = 0; i < 3; i++) run_fast(&p, 1, x, M, 1, &y, &ys, MUSE_K_EPI_NONE);
        CK(cudaDeviceSynchronize());
        CK(cudaFree(x));
        CK(cudaFree(y));
        weight_free(&w);
    }
    long E = M > 1 ? 96 : 32;
    experts x; /* the MoE's routed experts: gate/up then down */
    experts_make(&x, E, 6144, 3072, 2, 1);
    std::vector<int32_t> sel = rand_sel(M, 8, E);
    moe_plan pl;
    plan_make(&pl, sel, M, 8, E);
    float *b = rand_x(M, 6144), *act = dalloc(M * 8 * 3072), *z = dalloc(M * 8 * 6144);
    for (int i = 0; i < 3; i++) run_grouped(&x, &pl, b, M, 8, act, z);
    CK(cudaDeviceSynchronize());
    for (float *q : {b, act, z}) CK(cudaFree(q));
    plan_free(&pl);
    experts_free(&x);
    printf("exl3-fast-check: --prof done\n");
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    const char *skip = getenv("MUSE_FAST_SKIP"); /* timing a step's share: its checks then fail */
    if (skip && *skip) muse_k_linear_fast_skip(atoi(skip));
    for (int cb = 0; cb < 3; cb++)
        d_table[cb] = (float *)upload(muse_exl3_value_table((muse_codebook)cb), 65536 * 4);
    /* as the engine: the grouped checks' many pairs then take the finish's silu table, each pair
     * alone computes it (check_grouped holds the two bit for bit) */
    CK(muse_k_linear_fast_init());
    if (argc > 1 && !strcmp(argv[1], "--prof")) {
        long M = argc > 2 ? atol(argv[2]) : 1;
        prof_only(M >= 1 && M <= 4096 ? M : 1);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--many")) {
        time_many();
        return 0;
    }
    for (int cb = 0; cb < 3; cb++)
        for (int bits = 1; bits <= 8; bits++) check_one(256, 384, bits, cb, 0, 0);
    for (int cb = 0; cb < 3; cb++) {
        check_one(256, 384, 3, cb, 1, 0); /* legacy sign words */
        check_one(384, 256, 2, cb, 0, 1); /* bias */
        check_multi(cb, 2);
        check_grouped(cb, 2);
    }
    check_grouped(1, 3);
    check_one(2048, 4096, 2, 1, 0, 0); /* splits of 9 and 10 k-tiles: a stage with a tail */
    if (muse_k_linear_fast_wg()) /* its groups of 64 and 128 rows on wgmma, each pair alone not */
        for (int kern : {0, 1, 2, 3}) {
            static const char *name[4] = {"one warpgroup a block", "warps specialized",
                                          "the weights as the register operand",
                                          "the register operand, splits fused"};
            printf("# the grouped checks again with the wgmma form on (%s)\n", name[kern]);
            muse_k_linear_fast_wg_force(1);
            muse_k_linear_fast_ws_force(kern == 1);
            muse_k_linear_fast_wr_force(kern >= 2);
            muse_k_linear_fast_fuse_force(kern == 3 ? 1 : 0);
            for (int cb = 0; cb < 3; cb++) check_grouped(cb, 2);
            check_grouped(1, 3);
            muse_k_linear_fast_wg_force(-1);
            muse_k_linear_fast_ws_force(-1);
            muse_k_linear_fast_wr_force(-1);
            muse_k_linear_fast_fuse_force(-1);
        }
    /* the register form on a split with a part stage (9 and 10 k-tiles) and at 256-row blocks */
    if (muse_k_linear_fast_wg()) {
        muse_k_linear_fast_wr_force(wr_outer = 1);
        muse_k_linear_fast_fuse_force(0);
        check_one(2048, 4096, 2, 1, 0, 0);
        check_one(256, 384, 5, 2, 0, 1);
        muse_k_linear_fast_fuse_force(1); /* and its splits fused: 13 of 6144x4096 in 2 groups */
        check_one(2048, 4096, 2, 1, 0, 0);
        check_one(6144, 4096, 3, 0, 0, 0);
        muse_k_linear_fast_fuse_force(-1);
        muse_k_linear_fast_wr_force(wr_outer = -1);
    }
    check_conversions();
    check_select();
    check_group();
    check_router();
    if (!quick) {
        for (int bits : {2, 3, 4, 6}) check_one(6144, 4096, bits, 2, 0, 0);
        time_all();
        time_moe();
    }
    printf("exl3-fast-check: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
