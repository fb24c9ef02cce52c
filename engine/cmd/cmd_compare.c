/* muse-engine compare: the teacher-forced logits of one prompt on two sides (backend, ranks,
 * pack), compared position by position: relative L2, top-1 agreement, and every top-1 miss
 * with both sides' top 5 and top1-top2 margins, so a miss can be told from a near-tie. */
#include <math.h>

#include "backend/backend.h"
#include "base/flags.h"
#include "cmd/cmd_check.h"
#include "model/forward.h"

#define PROG "muse-engine compare"

typedef struct {
    const char *model, *backend, *gpus, *kernels_text;
    muse_kernels kernels;                       /* --kernels-a / --kernels-b, else --kernels */
    long long ranks;                            /* 0 until resolved: not given */
    const char *flag, *ranks_flag, *model_flag; /* "--b", "--ranks-b", "--model-b": errors */
    const char *gpus_flag;                      /* "--gpus-b" */
    int devices[MUSE_MAX_RANKS];                /* each rank's GPU */
    int router_margin;                          /* measure it on this side (cpu) */
} side_spec;

/* The router's smallest margin over the prompt, measured on a cpu side a: its moe op wrapped
 * so each call first recomputes the selection keys (sigmoid(b . router row) + bias, in double)
 * of the round's real rows from its input (the CPU backend's read is a copy, valid mid-round);
 * the margin of a row is the gap between the k-th and (k+1)-th largest key. */
static struct {
    const muse_backend_ops *real;
    muse_backend_ops ops;
    long rows;
    int64_t pos0;
    double min;
    int layer;
    int64_t at;
    double *pos_min; /* [positions] the smallest gap of each position over the layers */
    int64_t n_pos;
} rm;

static int rm_begin(muse_backend *be, const muse_round *r, muse_err *e)
{
    rm.rows = r->rows;
    rm.pos0 = r->positions[0];
    return rm.real->begin_round(be, r, e);
}

static int desc(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? 1 : a > b ? -1 : 0;
}

static void rm_moe(muse_backend *be, const muse_layer *ly, muse_act b_a, muse_act y_a)
{
    const muse_config *c = &be->model->cfg;
    long H = (long)c->hidden_size, E = (long)c->num_experts, K = (long)c->num_experts_per_tok;
    if (E > K) {
        float *b = MUSE_MALLOC((size_t)(be->opts.max_rows * H) * sizeof *b);
        float *w = MUSE_MALLOC((size_t)H * sizeof *w);
        double *key = MUSE_MALLOC((size_t)(rm.rows * E) * sizeof *key);
        rm.real->read(be, b_a, b, rm.rows);
        muse_linear fake = {.kind = MUSE_LIN_DENSE, .k = H, .n = E, .w = ly->router, .ld = H};
        for (long x = 0; x < E; x++) {
            muse_dense_row(&fake, x, w);
            for (long r = 0; r < rm.rows; r++) {
                double d = 0;
                for (long j = 0; j < H; j++) d += (double)b[r * H + j] * w[j];
                key[r * E + x] =
                    1.0 / (1.0 + exp(-d)) + (ly->router_bias.v ? ly->router_bias.v[x] : 0);
            }
        }
        for (long r = 0; r < rm.rows; r++) {
            qsort(key + r * E, (size_t)E, sizeof *key, desc);
            double gap = key[r * E + K - 1] - key[r * E + K];
            int64_t pos = rm.pos0 + r;
            if (rm.pos_min && pos >= 0 && pos < rm.n_pos && gap < rm.pos_min[pos])
                rm.pos_min[pos] = gap;
            if (rm.layer < 0 || gap < rm.min) {
                rm.min = gap;
                rm.layer = (int)(ly - be->model->layers);
                rm.at = rm.pos0 + r;
            }
        }
        free(key);
        free(w);
        free(b);
    }
    rm.real->moe(be, ly, b_a, y_a);
}

/* Runs ids[0..n) through a fresh backend of the side in chunks; logits [n, V] into *out.
 * 0, or an exit code with the reason printed. */
static int side_logits(const side_spec *s, const int32_t *ids, size_t n, long chunk, int threads,
                       int64_t *vocab, float **out)
{
    muse_err e = {{0}};
    muse_model m;
    if (muse_model_load(s->model, &m, &e)) {
        fprintf(stderr, PROG ": %s %s: %s\n", s->model_flag, s->model, e.msg);
        return 2;
    }
    int64_t V = m.cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= V) {
            fprintf(stderr,
                    PROG ": --tokens: id %d (entry %zu) is outside %s's vocabulary 0 .. %lld\n",
                    ids[i], i + 1, s->model, (long long)V - 1);
            muse_model_free(&m);
            return 2;
        }
    if ((long long)n > m.cfg.max_position_embeddings) {
        fprintf(stderr, PROG ": --tokens: %zu positions exceed max_position_embeddings %lld\n", n,
                (long long)m.cfg.max_position_embeddings);
        muse_model_free(&m);
        return 2;
    }
    long R = chunk > 0 ? chunk : (long)n;
    if (R > 4096) R = 4096;
    muse_backend_opts o = {.max_rows = R,
                           .max_seqs = 1,
                           .context = (int64_t)n,
                           .ranks = (int)s->ranks,
                           .threads = threads,
                           .kernels = s->kernels};
    memcpy(o.devices, s->devices, sizeof o.devices);
    muse_backend *be = muse_backend_create(s->backend, &m, &o, &e);
    if (!be) {
        fprintf(stderr, PROG ": %s %s %s %lld: %s\n", s->flag, s->backend, s->ranks_flag, s->ranks,
                e.msg);
        muse_model_free(&m);
        return 2;
    }
    if (s->router_margin) {
        rm.real = be->ops;
        rm.ops = *be->ops;
        rm.ops.begin_round = rm_begin;
        rm.ops.moe = rm_moe;
        rm.layer = -1;
        be->ops = &rm.ops;
    }
    muse_forward *f = muse_forward_create(be);
    float *lg = MUSE_MALLOC(n * (size_t)V * sizeof *lg);
    int64_t pos[4096];
    int32_t seq[4096] = {0};
    int rc = 0;
    for (size_t at = 0; at < n && !rc;) {
        long rows = (long)(n - at) < R ? (long)(n - at) : R;
        for (long r = 0; r < rows; r++) pos[r] = (int64_t)at + r;
        muse_round rd = {
            .rows = rows, .tokens = ids + at, .positions = pos, .seqs = seq, .return_logits = 1};
        muse_round_out ro;
        if (muse_kv_ensure(&be->kv, 0, pos[rows - 1] + 1) || muse_forward_run(f, &rd, &ro, &e)) {
            fprintf(stderr, PROG ": %s (--%s side)\n", e.msg[0] ? e.msg : "no KV room", s->backend);
            rc = 1;
            break;
        }
        memcpy(lg + at * (size_t)V, ro.logits, (size_t)rows * (size_t)V * sizeof *lg);
        at += (size_t)rows;
    }
    muse_forward_destroy(f);
    if (s->router_margin) be->ops = rm.real;
    muse_backend_destroy(be);
    muse_model_free(&m);
    if (rc) {
        free(lg);
        return rc;
    }
    *vocab = V;
    *out = lg;
    return 0;
}

/* The K largest of row (ties: the lower id first, NaN last). */
static void top_k(const float *row, int64_t V, int K, int64_t *id)
{
    for (int k = 0; k < K; k++) id[k] = -1;
    for (int64_t j = 0; j < V; j++) {
        float v = row[j];
        if (isnan(v)) continue;
        int at = K;
        while (at > 0 && (id[at - 1] < 0 || v > row[id[at - 1]])) at--;
        if (at >= K) continue;
        for (int k = K - 1; k > at; k--) id[k] = id[k - 1];
        id[at] = j;
    }
}

static void print_top(const char *label, const float *row, const int64_t *id, int K)
{
    printf("#   %s top5", label);
    for (int k = 0; k < K; k++)
        if (id[k] >= 0) printf(" %lld:%.6g", (long long)id[k], row[id[k]]);
    printf("  margin top1-top2 %.3g\n", id[1] >= 0 ? (double)row[id[0]] - row[id[1]] : 0.0);
}

static const char about[] =
    "Runs the prompt on side a and side b (backend, ranks, optionally another pack) and\n"
    "compares the teacher-forced logits of every position: relative L2 (max, mean), top-1\n"
    "agreement, and each top-1 miss with both sides' top 5 (id:logit) and top1-top2 margins.\n"
    "Exit 0 when agreement >= --min-agree and the max relative L2 <= --max-rel-l2, else 1;\n"
    "2 bad input.\n";

int muse_cmd_compare(int argc, char **argv)
{
    side_spec a = {.backend = "cpu",
                   .flag = "--a",
                   .ranks_flag = "--ranks-a",
                   .gpus_flag = "--gpus-a",
                   .model_flag = "--model"};
    side_spec b = {.backend = "cuda",
                   .flag = "--b",
                   .ranks_flag = "--ranks-b",
                   .gpus_flag = "--gpus-b",
                   .model_flag = "--model-b"};
    const char *tokens = NULL, *kernels = NULL;
    long long chunk = 0, threads = 0;
    double min_agree = 99.5, max_rel = 2e-3;
    const muse_flag table[] = {
        MUSE_FLAG_S("model", &a.model, "DIR", "the pack (both sides)", .required = true),
        MUSE_FLAG_S("model-b", &b.model, "DIR", "side b's pack instead", .def = "--model"),
        MUSE_FLAG_S("tokens", &tokens, "1,2,3", "the prompt's token ids", .required = true),
        MUSE_FLAG_S("a", &a.backend, "cpu|cuda", "side a's backend"),
        MUSE_FLAG_S("b", &b.backend, "cpu|cuda", "side b's backend"),
        MUSE_KERNELS_FLAG(&kernels),
        MUSE_FLAG_S("kernels-a", &a.kernels_text, "exact|fast", "side a's kernel path",
                    .def = "--kernels"),
        MUSE_FLAG_S("kernels-b", &b.kernels_text, "exact|fast", "side b's kernel path",
                    .def = "--kernels"),
        MUSE_FLAG_L("ranks-a", &a.ranks, 1, MUSE_MAX_RANKS, "N", "side a's tensor-parallel ranks",
                    .def = "1, or the count of --gpus-a"),
        MUSE_FLAG_L("ranks-b", &b.ranks, 1, MUSE_MAX_RANKS, "N", "side b's tensor-parallel ranks",
                    .def = "1, or the count of --gpus-b"),
        MUSE_FLAG_S("gpus-a", &a.gpus, "LIST", "side a's GPU of each rank (cuda), e.g. 0,0",
                    .def = "every rank on GPU 0"),
        MUSE_FLAG_S("gpus-b", &b.gpus, "LIST", "side b's GPU of each rank (cuda), e.g. 0,0",
                    .def = "every rank on GPU 0"),
        MUSE_FLAG_L("chunk", &chunk, 1, 4096, "N", "rows a forward, both sides",
                    .def = "the whole prompt"),
        MUSE_FLAG_L("threads", &threads, 0, 1024, "N", "CPU threads", .def = "0: one per core"),
        MUSE_FLAG_D("min-agree", &min_agree, 0, 100, "PCT", "top-1 agreement needed, percent"),
        MUSE_FLAG_D("max-rel-l2", &max_rel, 0, 1e9, "X", "largest relative L2 of a position"),
    };
    const muse_flags set = {
        .prog = PROG, .about = about, .flags = table, .n = sizeof table / sizeof *table};
    int rc = muse_flags_parse(&set, argc, argv);
    if (rc != MUSE_FLAGS_RUN) return rc;
    if (!b.model) b.model = a.model;
    muse_err e = {{0}};
    side_spec *sides[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        side_spec *sd = sides[i];
        muse_backend_opts o = {0};
        const muse_rank_flags names = {sd->gpus_flag, sd->ranks_flag, sd->flag};
        if (muse_backend_ranks(&names, sd->backend, sd->gpus, sd->ranks, &o, &e))
            return muse_flags_error(&set, "%s", e.msg);
        sd->ranks = o.ranks;
        memcpy(sd->devices, o.devices, sizeof sd->devices);
        const char *kt = sd->kernels_text ? sd->kernels_text : kernels;
        if (muse_kernels_parse(i ? "--kernels-b" : "--kernels-a", kt, &sd->kernels, &e) ||
            muse_kernels_resolve(sd->kernels, &sd->kernels, &e))
            return muse_flags_error(&set, "%s", e.msg);
    }
    a.router_margin = !strcmp(a.backend, "cpu");
    rm.layer = -1;
    int32_t *ids = NULL;
    size_t n = 0;
    if (muse_parse_ids("--tokens", tokens, &ids, &n, &e))
        return muse_flags_error(&set, "%s", e.msg);
    float *la = NULL, *lb = NULL;
    int64_t Va = 0, Vb = 0;
    rm.n_pos = (int64_t)n;
    rm.pos_min = MUSE_MALLOC((n ? n : 1) * sizeof *rm.pos_min);
    for (size_t p = 0; p < n; p++) rm.pos_min[p] = INFINITY;
    rc = side_logits(&a, ids, n, (long)chunk, (int)threads, &Va, &la);
    if (!rc) rc = side_logits(&b, ids, n, (long)chunk, (int)threads, &Vb, &lb);
    if (!rc && Va != Vb) {
        fprintf(stderr, PROG ": --model-b: vocab_size %lld differs from --model's %lld\n",
                (long long)Vb, (long long)Va);
        rc = 2;
    }
    if (rc) {
        free(la);
        free(lb);
        free(ids);
        free(rm.pos_min);
        return rc;
    }
    printf("# a: %s %s ranks %lld%s%s %s; b: %s %s ranks %lld%s%s %s; %zu positions, vocab %lld\n",
           a.backend, muse_kernels_name(a.kernels), a.ranks, a.gpus ? " gpus " : "",
           a.gpus ? a.gpus : "", a.model, b.backend, muse_kernels_name(b.kernels), b.ranks,
           b.gpus ? " gpus " : "", b.gpus ? b.gpus : "", b.model, n, (long long)Va);
    double rel_max = 0, rel_sum = 0;
    size_t agree = 0, at_max = 0;
    for (size_t p = 0; p < n; p++) {
        const float *ra = la + p * (size_t)Va, *rb = lb + p * (size_t)Va;
        double num = 0, den = 0;
        for (int64_t j = 0; j < Va; j++) {
            double d = (double)ra[j] - rb[j];
            num += d * d;
            den += (double)ra[j] * ra[j];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (!(rel <= rel_max)) { /* NaN sticks */
            rel_max = rel;
            at_max = p;
        }
        rel_sum += rel;
        int64_t ta[5], tb[5];
        top_k(ra, Va, 5, ta);
        top_k(rb, Va, 5, tb);
        if (ta[0] == tb[0]) {
            agree++;
            continue;
        }
        printf("# top-1 miss at position %zu (token %d): a %lld, b %lld, rel L2 %.3e\n", p, ids[p],
               (long long)ta[0], (long long)tb[0], rel);
        print_top("a", ra, ta, 5);
        print_top("b", rb, tb, 5);
    }
    double pct = n ? 100.0 * (double)agree / (double)n : 100.0;
    printf("rel L2 max %.3e (position %zu), mean %.3e\n", rel_max, at_max,
           n ? rel_sum / (double)n : 0.0);
    printf("top-1 agreement %.2f%% (%zu of %zu)\n", pct, agree, n);
    if (!a.router_margin)
        printf("router margin: not measured (side a is not cpu)\n");
    else if (rm.layer < 0)
        printf("router margin: none (no moe layer)\n");
    else {
        printf("router margin: min %.3e at layer %d position %lld (gap between the k-th and "
               "(k+1)-th selection keys, side a)\n",
               rm.min, rm.layer, (long long)rm.at);
        size_t near = 0; /* where a fast path may pick another expert within its bound */
        for (size_t p = 0; p < n; p++) near += rm.pos_min[p] < 1e-3;
        printf("router margin under 1e-3: %zu positions", near);
        size_t shown = 0;
        for (size_t p = 0; p < n && shown < 64; p++)
            if (rm.pos_min[p] < 1e-3) printf("%s%zu", shown++ ? "," : " (", p);
        printf("%s\n", near > shown ? ", ...)" : shown ? ")" : "");
    }
    int ok = pct >= min_agree && rel_max <= max_rel;
    printf("%s: agreement %s %.2f%%, rel L2 %s %.1e\n", ok ? "PASS" : "FAIL",
           pct >= min_agree ? ">=" : "<", min_agree, rel_max <= max_rel ? "<=" : ">", max_rel);
    free(la);
    free(lb);
    free(ids);
    free(rm.pos_min);
    return ok ? 0 : 1;
}
