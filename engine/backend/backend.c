/* Makes a backend by name and holds what every backend shares: row buckets, the KV pool's
 * bookkeeping, the byte counts of one rank's KV, snapshots and staging, and the reading of the
 * rank flags (--gpus, --ranks) every command takes. */
#include "backend/backend.h"

#include <ctype.h>
#include <errno.h>

#include "tp/comm.h"

_Static_assert(MUSE_TP_MAX_WORLD == MUSE_MAX_RANKS, "a world fits the rank tables");

typedef muse_backend *(*create_fn)(const muse_model *m, const muse_backend_opts *o, muse_err *e);

static const struct {
    const char *name;
    create_fn create;
} backends[] = {
    {"cpu", muse_cpu_backend_create},
#ifdef MUSE_HAVE_CUDA
    {"cuda", muse_cuda_backend_create},
#endif
};

const char *muse_backend_names(void)
{
#ifdef MUSE_HAVE_CUDA
    return "cpu, cuda";
#else
    return "cpu";
#endif
}

const char *muse_backend_cuda_archs(void)
{
#ifdef MUSE_HAVE_CUDA
    return MUSE_CUDA_ARCHS;
#else
    return NULL;
#endif
}

/* The refusal of --backend cuda in a binary built without it (-1) */
static int muse_no_cuda(muse_err *e)
{
    return muse_fail(e, "--backend cuda: this binary was built without the CUDA backend; "
                        "use --backend cpu");
}

muse_backend *muse_backend_create(const char *name, const muse_model *m, const muse_backend_opts *o,
                                  muse_err *e)
{
    for (size_t i = 0; i < sizeof backends / sizeof *backends; i++) {
        if (strcmp(name, backends[i].name)) continue;
        if (strcmp(name, "cuda")) muse_model_host_weights(m); /* only a GPU fills its own */
        muse_backend *be = backends[i].create(m, o, e);
        /* every round operation of ops.h has its slot filled (a new one is added everywhere) */
#define MUSE_OP_FILLED(op, params, doc) MUSE_CHECK(!be || be->ops->op);
        MUSE_ROUND_OPS(MUSE_OP_FILLED)
#undef MUSE_OP_FILLED
        return be;
    }
    if (!strcmp(name, "cuda")) return muse_no_cuda(e), NULL;
    return muse_fail(e, "--backend %s: unknown backend; this binary has: %s", name,
                     muse_backend_names()),
           NULL;
}

int muse_backend_device_memory(const char *name, const int *devices, int ranks, uint64_t *bytes,
                               char *desc, size_t desc_len, muse_err *e)
{
    *bytes = 0;
    snprintf(desc, desc_len, "%s", name);
#ifdef MUSE_HAVE_CUDA
    if (!strcmp(name, "cuda"))
        return muse_cuda_device_memory(devices, ranks, bytes, desc, desc_len, e);
#else
    (void)devices;
    (void)ranks;
    if (!strcmp(name, "cuda")) return muse_no_cuda(e);
#endif
    (void)e;
    return 0; /* cpu and script: host memory, no limit unless --device-gib */
}

int muse_backend_plan_memory(const char *name, const muse_model *m, const muse_backend_opts *o,
                             const long act_floats[2], muse_rank_mem *widest, muse_err *e)
{
    memset(widest, 0, sizeof *widest);
#ifdef MUSE_HAVE_CUDA
    if (!strcmp(name, "cuda")) {
        muse_rank_mem mem[MUSE_MAX_RANKS] = {{0}};
        if (muse_cuda_plan_memory(m, o, act_floats, mem, e)) return -1;
        for (int r = 0; r < (o->ranks > 0 ? o->ranks : 1); r++) {
            uint64_t ws = mem[r].workspace + mem[r].staging;
            if (ws > widest->workspace) widest->workspace = ws;
            if (mem[r].weights > widest->weights) widest->weights = mem[r].weights;
        }
        return 1;
    }
#else
    (void)m;
    (void)o;
    (void)act_floats;
    if (!strcmp(name, "cuda")) return muse_no_cuda(e);
#endif
    (void)e;
    return 0; /* cpu: the plan's own estimate is how it sizes its buffers */
}

void muse_backend_destroy(muse_backend *be)
{
    if (be) be->ops->destroy(be);
}

/* Entry i (0-based) of a --gpus list: a non-negative ordinal, the whole text. */
static int gpu_entry(const muse_rank_flags *nm, const char *list, const char *text, size_t len,
                     int i, int *dev, muse_err *e)
{
    char buf[32];
    const char *accepted = "give GPU ordinals separated by commas, e.g. 0, 0,0 or 0,1";
    if (!len) return muse_fail(e, "%s %s: entry %d is empty; %s", nm->gpus, list, i + 1, accepted);
    if (len >= sizeof buf)
        return muse_fail(e, "%s %s: entry %d is too long; %s", nm->gpus, list, i + 1, accepted);
    memcpy(buf, text, len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    long v = isdigit((unsigned char)buf[0]) || buf[0] == '-' ? strtol(buf, &end, 10) : 0;
    if (!end || *end || errno || end == buf || (buf[0] == '-' && !isdigit((unsigned char)buf[1])))
        return muse_fail(e, "%s %s: entry %d (%s) is not an integer; %s", nm->gpus, list, i + 1,
                         buf, accepted);
    if (v < 0)
        return muse_fail(e,
                         "%s %s: entry %d (%ld) is a negative device ordinal; GPUs are numbered "
                         "from 0 (as nvidia-smi lists them)",
                         nm->gpus, list, i + 1, v);
    if (v > 1023)
        return muse_fail(e, "%s %s: entry %d (%ld) is past the largest device ordinal 1023",
                         nm->gpus, list, i + 1, v);
    *dev = (int)v;
    return 0;
}

int muse_backend_ranks(const muse_rank_flags *nm, const char *backend, const char *gpus,
                       long long ranks, muse_backend_opts *o, muse_err *e)
{
    memset(o->devices, 0, sizeof o->devices);
    if (!gpus) {
        o->ranks = ranks > 0 ? (int)ranks : 1;
        return 0;
    }
    if (strcmp(backend, "cuda"))
        return muse_fail(e,
                         "%s %s goes with %s cuda, not %s %s (it names GPUs); for ranks on the "
                         "CPU use %s N",
                         nm->gpus, gpus, nm->backend, nm->backend, backend, nm->ranks);
    int n = 0;
    for (const char *at = gpus;; n++) {
        const char *comma = strchr(at, ',');
        size_t len = comma ? (size_t)(comma - at) : strlen(at);
        if (n >= MUSE_MAX_RANKS)
            return muse_fail(e, "%s %s: more than %d GPUs; at most %d ranks in one process",
                             nm->gpus, gpus, MUSE_MAX_RANKS, MUSE_MAX_RANKS);
        if (gpu_entry(nm, gpus, at, len, n, &o->devices[n], e)) return -1;
        if (!comma) break;
        at = comma + 1;
    }
    n++;
    if (ranks > 0 && ranks != n)
        return muse_fail(e,
                         "%s %s names %d rank%s but %s %lld asks for %lld; give one of them, or "
                         "make them agree",
                         nm->gpus, gpus, n, n == 1 ? "" : "s", nm->ranks, ranks, ranks);
    o->ranks = n;
    return 0;
}

/* Powers of two up to max_rows, then max_rows: few enough that a graph a bucket is cheap. */
static void make_buckets(muse_backend *be)
{
    long max = be->opts.max_rows;
    be->n_buckets = 0;
    for (long b = 1; b < max && be->n_buckets < MUSE_MAX_BUCKETS - 1; b *= 2)
        be->buckets[be->n_buckets++] = b;
    be->buckets[be->n_buckets++] = max;
}

long muse_backend_bucket(const muse_backend *be, long rows)
{
    if (be->opts.exact_rows) return rows;
    for (int i = 0; i < be->n_buckets; i++)
        if (be->buckets[i] >= rows) return be->buckets[i];
    return be->opts.max_rows;
}

/* The stage's arrays in block order, each starting on a 64-byte boundary (s NULL: the size). */
static size_t stage_layout(muse_round_stage *s, const muse_backend *be, uint8_t *block)
{
    size_t R = (size_t)be->opts.max_rows;
    size_t tables = (size_t)be->opts.max_seqs * (size_t)be->kv.blocks_per_seq, at = 0;
    size_t bytes[7] = {R * 4, R * 4, R * 4, R * 8, R * 8, R * sizeof(muse_sampling), tables * 4};
    void *parts[7];
    for (int i = 0; i < 7; i++) {
        parts[i] = block ? block + at : NULL;
        at += (bytes[i] + 63) / 64 * 64;
    }
    if (!s) return at;
    s->tokens = parts[0];
    s->seqs = parts[1];
    s->want = parts[2];
    s->positions = parts[3];
    s->draw_pos = parts[4];
    s->sampling = parts[5];
    s->tables = parts[6];
    for (size_t i = 0; i < tables; i++) s->tables[i] = -1;
    return at;
}

size_t muse_round_stage_bytes(const muse_backend *be)
{
    return stage_layout(NULL, be, NULL);
}

void muse_round_stage_place(muse_round_stage *s, const muse_backend *be, void *block)
{
    memset(s, 0, sizeof *s);
    s->block = block;
    stage_layout(s, be, block);
}

/* What cpu_begin_round and cuda_begin_round both did, line for line. Their only differences
 * stay with CUDA: the sticky error refused first, the host time profiled, and the sampling
 * records converted to the kernel's muse_k_sampling (the same fields; zero for padding rows). */
void muse_backend_stage(const muse_backend *be, const muse_round *r, muse_round_stage *s)
{
    long R = muse_backend_bucket(be, r->rows), n = 0;
    for (long i = 0; i < r->rows; i++) {
        s->tokens[i] = r->tokens[i];
        s->positions[i] = r->positions[i];
        s->seqs[i] = r->seqs[i];
        if (!r->want_logits || r->want_logits[i]) s->want[n++] = (int32_t)i;
    }
    for (long i = r->rows; i < R; i++) {
        s->tokens[i] = 0;
        s->positions[i] = 0;
        s->seqs[i] = -1;
    }
    s->real_rows = r->rows;
    s->rows = R;
    s->real_wanted = n;
    s->wanted = n ? muse_backend_bucket(be, n) : 0;
    s->masks = r->masks; /* padding wanted rows (i >= real_wanted) draw unmasked */
    muse_sampling greedy = {0};
    for (long i = 0; i < s->wanted; i++) {
        if (i >= n) s->want[i] = s->want[n - 1];
        s->sampling[i] = r->sampling && i < n ? r->sampling[i] : greedy;
        s->draw_pos[i] = r->sampling && r->draw_pos && i < n ? r->draw_pos[i] : 0;
    }
    /* the block tables of the round's sequences, as they are now */
    int64_t bps = be->kv.blocks_per_seq;
    for (long i = 0; i < r->rows; i++) {
        int seq = r->seqs[i];
        if (i && seq == r->seqs[i - 1]) continue;
        memcpy(s->tables + (int64_t)seq * bps, muse_kv_table(&be->kv, seq),
               (size_t)bps * sizeof *s->tables);
    }
}

int muse_backend_init_common(muse_backend *be, const muse_model *m, const muse_backend_opts *o,
                             muse_err *e)
{
    if (o->max_rows <= 0 || o->max_seqs <= 0 || o->context <= 0)
        return muse_fail(e, "backend: max rows, sequences and context must be positive");
    if (o->snapshot_slots < 0) return muse_fail(e, "backend: snapshot slots must be 0 or more");
    int ranks = o->ranks > 0 ? o->ranks : 1;
    if (ranks > MUSE_MAX_RANKS)
        return muse_fail(e, "--ranks %d: at most %d ranks in one process", ranks, MUSE_MAX_RANKS);
    if (o->tp_world > 1 && (ranks != 1 || !o->comm || o->tp_rank < 0 || o->tp_rank >= o->tp_world))
        return muse_fail(e,
                         "backend: rank %d of a world of %d needs one rank a process and a "
                         "communicator",
                         o->tp_rank, o->tp_world);
    int world = o->tp_world > 1 ? o->tp_world : ranks; /* the shares are of the whole world */
    if (muse_kernels_resolve(o->kernels, &be->kernels, e)) return -1;
    be->model = m;
    be->opts = *o;
    be->opts.ranks = ranks;
    be->n_ranks = ranks;
    make_buckets(be);
    long want = o->max_wanted > 0 && o->max_wanted < o->max_rows ? o->max_wanted : o->max_rows;
    be->opts.max_wanted = muse_backend_bucket(be, want); /* a round's wanted rows are padded so */
    const muse_config *cfg = &m->cfg;
    int64_t blocks_per_seq = (o->context + MUSE_KV_BLOCK - 1) / MUSE_KV_BLOCK;
    int64_t n_blocks = o->kv_blocks > 0 ? o->kv_blocks : o->max_seqs * blocks_per_seq;
    if (n_blocks > INT32_MAX)
        return muse_fail(e, "--kv-blocks %lld: at most %d", (long long)n_blocks, INT32_MAX);
    muse_kv_pool_init(&be->kv, (int32_t)n_blocks, o->max_seqs, o->context);
    /* a rank holds its KV heads; when there are fewer heads than ranks each rank holds one */
    be->kv_block_bytes =
        muse_kv_rank_bytes(cfg, muse_kv_full_bytes_per_token(cfg), world) * MUSE_KV_BLOCK;
    be->snapshot_bytes = muse_kv_rank_bytes(cfg, muse_kv_snapshot_bytes(cfg), world);
    for (int r = 0; r < ranks; r++) be->ranks[r].device = o->devices[r];
    return 0;
}

const char *muse_kernels_name(muse_kernels k)
{
    return k == MUSE_KERNELS_FAST ? "fast" : k == MUSE_KERNELS_EXACT ? "exact" : "default";
}

int muse_kernels_parse(const char *flag, const char *text, muse_kernels *k, muse_err *e)
{
    *k = MUSE_KERNELS_DEFAULT;
    if (!text) return 0;
    if (!strcmp(text, "exact"))
        *k = MUSE_KERNELS_EXACT;
    else if (!strcmp(text, "fast"))
        *k = MUSE_KERNELS_FAST;
    else
        return muse_fail(e,
                         "%s %s: the kernel path is exact (equal to the CPU bit for bit) or fast "
                         "(tensor cores, within the contract's bound of exact)",
                         flag, text);
    return 0;
}

int muse_kernels_resolve(muse_kernels want, muse_kernels *k, muse_err *e)
{
    *k = want;
    if (want != MUSE_KERNELS_DEFAULT) return 0;
    const char *env = getenv("MUSE_CUDA_PATH");
    if (env && *env) {
        if (muse_kernels_parse("MUSE_CUDA_PATH", env, k, e)) return -1;
        return 0;
    }
    *k = MUSE_KERNELS_EXACT; /* the default until the fast kernels have run on the GPU */
    return 0;
}

void muse_backend_linears_parts(muse_backend *be, int n, const muse_linear *const *ls, muse_act x,
                                int round16, const muse_act *ys)
{
    for (int i = 0; i < n; i++) be->ops->linear(be, ls[i], x, round16, ys[i]);
}

void muse_backend_swiglu_linear_parts(muse_backend *be, const muse_linear *gate,
                                      const muse_linear *up, muse_act x, muse_act g, muse_act u,
                                      muse_act out)
{
    be->ops->linear(be, gate, x, 1, g);
    be->ops->linear(be, up, x, 1, u);
    be->ops->swiglu(be, g, u, (long)gate->n, out);
}

void muse_backend_add_norm_norm_parts(muse_backend *be, muse_act h, muse_act y, long width,
                                      const muse_vec *w, float eps, const muse_vec *next_w,
                                      muse_norm_weight next_mode, float next_eps, muse_act out)
{
    be->ops->add_norm(be, h, y, width, w, eps);
    be->ops->norm(be, h, width, next_w, next_mode, next_eps, 1, out);
}
