/* The CUDA backend's devices and peers: the first CUDA failure kept, the current GPU, device
 * and pinned allocations, the arch and device checks, the memory plan's device memory, peer
 * access and NCCL, each rank's start and buffers, the backend's creation and its destroy. */

#include "backend/cuda/cuda_internal.h"
#include "kernels/linear_fast.cuh"
#include "kernels/sample_fast.cuh"

static const char *const prof_names[PROF_OPS] = {"begin_round (host)",
                                                 "end_round (host)",
#define MUSE_PROF_NAME(id, name, ...) name,
                                                 MUSE_KERNELS(MUSE_PROF_NAME)
#undef MUSE_PROF_NAME
                                                     "moe router + selection",
                                                 "moe routed experts",
                                                 "moe shared experts",
                                                 "moe expert norms + combine"};

/* The profile's entries so far (names stay valid while the backend lives). */
int cuda_profile(muse_backend *be, muse_prof_entry *out, int max)
{
    cuda_backend *c = cu(be);
    if (!c->prof) return 0;
    int n = 0;
    for (int i = 0; i < PROF_OPS && n < max; i++)
        out[n++] = (muse_prof_entry){prof_names[i], c->prof_ms[i], c->prof_n[i],
                                     i == PROF_BEGIN || i == PROF_END};
    return n;
}

/* Keeps the first failure with its rank and where it happened; returns -1 on failure. */
int cuda_ok(cuda_backend *c, int rc, const char *what, const char *file, int line)
{
    if (rc == 0) return 0;
    if (!c->failed) {
        snprintf(c->err, sizeof c->err, "%s:%d: %s: %s", file, line, what,
                 cudaGetErrorString((cudaError_t)rc));
        c->failed_rank = c->at;
    }
    c->failed = 1;
    return -1;
}

/* The sticky failure as end_round and begin_round report it. */
int device_error(cuda_backend *c, muse_err *e)
{
    return muse_fail(e,
                     "device error on rank %d (cuda, GPU %d): %s; the context cannot be used "
                     "again",
                     c->failed_rank, c->rank[c->failed_rank].device, c->err);
}

/* Makes rank r's GPU current (not inside a capture: graphs are one GPU's, set at begin). */
cuda_rank *on(cuda_backend *c, int r)
{
    c->at = r;
    if (!c->sizing && (!c->capturing || c->multi_dev)) CHECK(c, cudaSetDevice(c->rank[r].device));
    return &c->rank[r];
}

/* On the current GPU (the caller made rank's current); sizing: counted only, NULL. */
void *dalloc(cuda_backend *c, size_t bytes, uint64_t *account)
{
    void *p = NULL;
    if (c->failed) return NULL;
    if (c->sizing) {
        if (account) *account += bytes;
        return NULL;
    }
    if (CHECK(c, cudaMalloc(&p, bytes ? bytes : 1))) return NULL;
    if (account) *account += bytes;
    return p;
}

int cuda_device_memory(muse_backend *be, int rank, uint64_t *free_bytes, uint64_t *total_bytes)
{
    cuda_backend *c = cu(be);
    size_t f = 0, t = 0;
    *free_bytes = *total_bytes = 0;
    if (c->in_round || rank < 0 || rank >= c->n_ranks) return -1;
    /* informational: a failure here is not the backend's sticky error */
    int ok =
        cudaSetDevice(c->rank[rank].device) == cudaSuccess && cudaMemGetInfo(&f, &t) == cudaSuccess;
    cudaSetDevice(c->rank[c->at].device); /* the rank being driven stays current */
    if (!ok) return -1;
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

/* Pinned host memory every GPU of the process may copy from (portable). */
static void *halloc(cuda_backend *c, size_t bytes)
{
    void *p = NULL;
    if (c->failed) return NULL;
    if (CHECK(c, cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable))) return NULL;
    return p;
}

/* Rank r's staging, workspaces, KV and snapshots on its GPU, all sized from the options. */
static int allocate_rank(cuda_backend *c, int r)
{
    muse_backend *be = &c->base;
    const muse_backend_opts *o = &be->opts;
    const muse_model *m = be->model;
    const muse_config *cfg = &m->cfg;
    muse_rank_mem *mem = &be->ranks[r];
    cuda_rank *rk = on(c, r);
    size_t R = (size_t)o->max_rows, H = (size_t)cfg->hidden_size, E = (size_t)cfg->num_experts;
    size_t K = (size_t)cfg->num_experts_per_tok, V = (size_t)cfg->vocab_size;
    size_t N = (size_t)m->head.n, L = (size_t)cfg->num_layers;
    size_t P = R * (K > 0 ? K : 1);   /* (row, slot) pairs */
    size_t W = (size_t)o->max_wanted; /* the head's and the sampler's rows */
    size_t I = (size_t)cfg->moe_intermediate_size;
    size_t Ish = (size_t)(cfg->num_shared_experts * cfg->moe_intermediate_size);
    size_t mlp = P * I > R * Ish ? P * I : R * Ish;
    size_t head_w = r ? (size_t)rk->lin[m->head.id].n : N; /* rank 0 lays out every slice */
    /* the exact product's a and t: the experts' linears at P rows, the head at W (its 202048
     * columns at P rows were 3.3 GB where R = 256, K = 8), the rest at R */
    size_t ws_floats, ws_doubles;
    muse_model_exl3_ws(m, (long)R, (long)P, (long)W, &ws_floats, &ws_doubles);
    rk->ws_a = dalloc(c, ws_floats * sizeof(float), &mem->workspace);
    rk->ws_t = dalloc(c, ws_doubles * sizeof(double), &mem->workspace);
    if (be->kernels == MUSE_KERNELS_FAST) cuda_fast_moe_prepare(c, rk);
    if (be->kernels == MUSE_KERNELS_FAST && !c->sizing) CHECK(c, muse_k_linear_fast_init());
    if (be->kernels == MUSE_KERNELS_FAST &&
        (rk->ws_fast_bytes = cuda_fast_workspace(c, rk, (long)R)))
        rk->ws_fast = dalloc(c, rk->ws_fast_bytes, &mem->workspace);
    /* one rank, unless timing op by op: the shared experts run beside the routed ones
     * (cuda_moe), in their own space */
    if (be->kernels == MUSE_KERNELS_FAST && c->n_ranks == 1 && c->side_on && !c->prof &&
        (rk->ws_side_bytes = cuda_fast_side_workspace(c, rk, (long)R)))
        rk->ws_side = dalloc(c, rk->ws_side_bytes, &mem->workspace);
    size_t plan = be->kernels == MUSE_KERNELS_FAST ? cuda_fast_plan_ints(c, (long)R) : 0;
    if (plan) rk->moe_plan = dalloc(c, plan * sizeof(int32_t), &mem->workspace);
    if (be->kernels == MUSE_KERNELS_FAST &&
        (rk->ws_attn_bytes = cuda_attn_workspace(c, rk, (long)R)))
        rk->ws_attn = dalloc(c, rk->ws_attn_bytes, &mem->workspace);
    rk->router_logits = dalloc(c, R * E * sizeof(float), &mem->workspace);
    rk->sel = dalloc(c, P * sizeof(int32_t), &mem->workspace);
    rk->sel_w = dalloc(c, P * sizeof(float), &mem->workspace);
    rk->pair_src = dalloc(c, P * sizeof(int32_t), &mem->workspace);
    rk->eg = dalloc(c, mlp * sizeof(float), &mem->workspace);
    rk->eu = dalloc(c, mlp * sizeof(float), &mem->workspace);
    rk->ea = dalloc(c, mlp * sizeof(float), &mem->workspace);
    rk->zg = dalloc(c, P * H * sizeof(float), &mem->workspace);
    if (be->kernels == MUSE_KERNELS_FAST && c->n_ranks == 1 && cfg->expert_output_norm && H >= 128)
        rk->zsq = dalloc(c, P * (H / 128) * sizeof(double), &mem->workspace);
    rk->zs = dalloc(c, R * H * sizeof(float), &mem->workspace);
    rk->xsel = dalloc(c, W * H * sizeof(float), &mem->workspace);
    rk->raw = dalloc(c, W * head_w * sizeof(float), &mem->workspace);
    size_t sample_ws = W * V * sizeof(float); /* the fast sampler's keys and histograms: more */
    if (be->kernels == MUSE_KERNELS_FAST && muse_k_sample_fast_bytes((long)W, (long)V) > sample_ws)
        sample_ws = muse_k_sample_fast_bytes((long)W, (long)V);
    if (r == 0) rk->weights = dalloc(c, sample_ws, &mem->workspace);
    if (r == 0) rk->d_masks = dalloc(c, W * c->mask_bytes, &mem->workspace); /* the sampler's */
    if (c->n_ranks > 1) rk->red = dalloc(c, c->red_floats * sizeof(float), &mem->workspace);
    if (c->nccl || (c->sizing && c->multi_dev)) /* NCCL is set up where ranks span GPUs */
        rk->gather = dalloc(c, (size_t)c->n_ranks * c->red_floats * sizeof(float), &mem->workspace);
    if (rk->pair_src && K > 0) {
        int32_t *src = MUSE_MALLOC(P * sizeof *src);
        for (size_t p = 0; p < P; p++) src[p] = (int32_t)(p / K);
        CHECK(c, cudaMemcpy(rk->pair_src, src, P * sizeof *src, cudaMemcpyHostToDevice));
        free(src);
    }
    rk->d_drawn = dalloc(c, R * 4, &mem->staging);
    rk->d_pack = dalloc(c, c->pack_cap, &mem->staging); /* its arrays placed by begin_round */
    if (c->failed) return -1;
    if (rk->d_pack) cuda_place_pack(c, r, R, R); /* (sizing: nothing to place) */
    /* KV: sliding layers a ring per sequence, full layers the paged pool's blocks */
    rk->k_cache = MUSE_CALLOC(L, sizeof *rk->k_cache);
    rk->v_cache = MUSE_CALLOC(L, sizeof *rk->v_cache);
    for (size_t i = 0; i < L && !c->failed; i++) {
        size_t rows = c->kv_cap[i] ? (size_t)o->max_seqs * (size_t)c->kv_cap[i]
                                   : (size_t)be->kv.n_blocks * MUSE_KV_BLOCK;
        size_t bytes = rows * (size_t)rk->kv_width * sizeof(uint16_t);
        uint64_t *acct = c->kv_cap[i] ? &mem->sliding : &mem->kv;
        rk->k_cache[i] = dalloc(c, bytes, acct);
        rk->v_cache[i] = dalloc(c, bytes, acct);
        if (rk->v_cache[i]) { /* on the rank's stream, before its first kv_write (cuda_alloc) */
            CHECK(c, cudaMemsetAsync(rk->k_cache[i], 0, bytes, rk->st));
            CHECK(c, cudaMemsetAsync(rk->v_cache[i], 0, bytes, rk->st));
        }
    }
    size_t snap = (size_t)o->snapshot_slots * be->snapshot_bytes;
    rk->snapshots = dalloc(c, snap, &mem->snapshots);
    return c->failed ? -1 : 0;
}

/* The sliding layers' ring lengths, a token mask's bytes and the staging pack's: what the
 * buffers are sized by. */
static void size_rings(cuda_backend *c)
{
    const muse_backend_opts *o = &c->base.opts;
    const muse_config *cfg = &c->base.model->cfg;
    size_t L = (size_t)cfg->num_layers;
    c->mask_bytes = ((size_t)cfg->vocab_size + 7) / 8;
    size_t R = (size_t)o->max_rows,
           tables = (size_t)o->max_seqs * (size_t)c->base.kv.blocks_per_seq;
    c->pack_cap = muse_stage_pack_layout(R, R, sizeof(muse_k_sampling), tables).bytes;
    c->kv_cap = MUSE_CALLOC(L ? L : 1, sizeof *c->kv_cap);
    for (size_t i = 0; i < L; i++)
        if (cfg->attn_kind[i] == MUSE_ATTN_SLIDING) {
            int64_t cap = o->context;
            /* a ring: a chunk never overwrites keys it reads */
            if (cfg->sliding_window + o->max_rows - 1 < cap)
                cap = cfg->sliding_window + o->max_rows - 1;
            c->kv_cap[i] = cap;
        }
}

/* The host staging (once) and every rank's buffers. */
static int allocate(cuda_backend *c)
{
    muse_backend *be = &c->base;
    size_t R = (size_t)be->opts.max_rows, V = (size_t)be->model->cfg.vocab_size;
    on(c, 0);
    size_rings(c);
    void *stage = halloc(c, muse_round_stage_bytes(be)); /* every table entry -1 once placed */
    c->h_pack = halloc(c, c->pack_cap);
    c->h_drawn = halloc(c, R * 4);
    c->h_sampling = halloc(c, R * sizeof *c->h_sampling);
    size_t W = (size_t)be->opts.max_wanted;
    c->h_logits = halloc(c, W * V * sizeof(float));
    c->h_masks = halloc(c, W * c->mask_bytes);
    if (stage) muse_round_stage_place(&c->stage, be, stage);
    if (c->failed) return -1;
    for (int r = 0; r < c->n_ranks; r++)
        if (allocate_rank(c, r)) return -1;
    return 0;
}

/* The kernels are SASS only (no PTX to JIT): a device runs them only when its compute
 * capability is one of the archs built (MUSE_CUDA_ARCHS, "sm_90a sm_90"). */
static int arch_check(int dev, muse_err *e)
{
    struct cudaDeviceProp p;
    cudaError_t rc = cudaGetDeviceProperties(&p, dev);
    if (rc != cudaSuccess)
        return muse_fail(e, "--backend cuda: device %d: %s; use --backend cpu", dev,
                         cudaGetErrorString(rc));
    int cc = p.major * 10 + p.minor;
    for (const char *a = MUSE_CUDA_ARCHS; (a = strstr(a, "sm_")) != NULL; a += 3)
        if (atoi(a + 3) == cc) return 0;
    return muse_fail(e,
                     "--backend cuda: device %d (%s) is sm_%d; this binary has kernels for %s "
                     "only; rebuild with CUDA_ARCHS naming %d, or use --backend cpu",
                     dev, p.name, cc, MUSE_CUDA_ARCHS, cc);
}

/* Every rank's GPU exists and runs these kernels. */
static int devices_check(const muse_backend_opts *o, int ranks, muse_err *e)
{
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0)
        return muse_fail(e, "--backend cuda: no usable CUDA device (%s); use --backend cpu",
                         rc != cudaSuccess ? cudaGetErrorString(rc) : "none found");
    for (int r = 0; r < ranks; r++) {
        int dev = o->devices[r];
        if (dev < 0 || dev >= count)
            return muse_fail(e,
                             "--backend cuda: device %d (rank %d) does not exist (%d found); use "
                             "0 .. %d in --gpus",
                             dev, r, count, count - 1);
        int seen = 0;
        for (int q = 0; q < r; q++) seen |= o->devices[q] == dev;
        if (!seen && arch_check(dev, e)) return -1;
    }
    return 0;
}

/* backend.h: each rank's share of its GPU's memory (a GPU's whole memory divided among the
 * ranks on it), the smallest over the ranks, from the device properties before any context
 * holds memory; the same refusals as start-up (no device, no driver, an arch not built). */
int muse_cuda_device_memory(const int *devices, int ranks, uint64_t *bytes, char *desc,
                            size_t desc_len, muse_err *e)
{
    muse_backend_opts o = {.ranks = ranks};
    /* the count first: the copy into o.devices (MUSE_MAX_RANKS entries) must not overrun */
    if (ranks < 1 || ranks > MUSE_MAX_RANKS)
        return muse_fail(e, "--ranks %d: must be 1 .. %d in one process", ranks, MUSE_MAX_RANKS);
    memcpy(o.devices, devices, (size_t)ranks * sizeof *devices);
    if (devices_check(&o, ranks, e)) return -1;
    *bytes = 0;
    for (int r = 0; r < ranks; r++) {
        struct cudaDeviceProp p;
        cudaError_t rc = cudaGetDeviceProperties(&p, devices[r]);
        if (rc != cudaSuccess)
            return muse_fail(e, "--backend cuda: device %d: %s; use --backend cpu", devices[r],
                             cudaGetErrorString(rc));
        int sharing = 1; /* rank r, and the others on its GPU */
        for (int q = 0; q < ranks; q++) sharing += q != r && devices[q] == devices[r];
        uint64_t share = (uint64_t)p.totalGlobalMem / (uint64_t)sharing;
        if (*bytes && share >= *bytes) continue;
        *bytes = share;
        snprintf(desc, desc_len, "%s (device %d%s)", p.name, devices[r],
                 sharing > 1 ? ", shared by ranks" : "");
    }
    return 0;
}

/* Peer access between every pair of distinct GPUs the ranks sit on, where the hardware has it
 * (NVLink or PCIe P2P); c->peers says whether every pair has it. */
static void enable_peers(cuda_backend *c)
{
    c->peers = 1;
    for (int a = 0; a < c->n_ranks; a++)
        for (int b = 0; b < c->n_ranks; b++) {
            int da = c->rank[a].device, db = c->rank[b].device, can = 0;
            if (da == db) continue;
            if (CHECK(c, cudaDeviceCanAccessPeer(&can, da, db))) return;
            if (!can) {
                c->peers = 0;
                continue;
            }
            on(c, a);
            cudaError_t rc = cudaDeviceEnablePeerAccess(db, 0);
            if (rc ==
                cudaErrorPeerAccessAlreadyEnabled) /* a pair seen before, or another backend */
                (void)cudaGetLastError();
            else
                CHECK(c, rc);
        }
}

/* Where ranks sit on distinct GPUs: NCCL, loaded and its communicators made, when the GPUs lack
 * peer access or MUSE_CUDA_REDUCE=nccl asks (a clear error without libnccl; then every sum goes
 * through it), and tried quietly for large messages otherwise (MUSE_CUDA_REDUCE=kernel: never). */
static int setup_nccl(cuda_backend *c, muse_err *e)
{
    int distinct = 1;
    for (int a = 0; a < c->n_ranks; a++)
        for (int b = 0; b < a; b++) distinct &= c->rank[a].device != c->rank[b].device;
    const char *mode = getenv("MUSE_CUDA_REDUCE");
    int want = mode && !strcmp(mode, "nccl"), never = mode && !strcmp(mode, "kernel");
    if (!c->peers && (!distinct || never))
        return muse_fail(e,
                         "--gpus: some GPUs of the ranks have no peer access, and %s; give GPUs "
                         "with peer access (nvidia-smi topo -m), or put the ranks on one GPU",
                         never ? "MUSE_CUDA_REDUCE=kernel rules out NCCL"
                               : "NCCL cannot hold two ranks of one GPU");
    if (never || !distinct) return 0;
    int needed = want || !c->peers; /* else NCCL only speeds up large messages */
    muse_err quiet = {{0}};
    const muse_nccl *lib = muse_nccl_load(needed ? e : &quiet);
    if (!lib) return needed ? -1 : 0;
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* no NVLink SHARP multicast: see KINDS.md */
    ncclComm_t comms[MUSE_MAX_RANKS];
    int devs[MUSE_MAX_RANKS];
    for (int r = 0; r < c->n_ranks; r++) devs[r] = c->rank[r].device;
    ncclResult_t nr = lib->CommInitAll(comms, c->n_ranks, devs);
    if (nr != ncclSuccess)
        return needed ? muse_fail(e, "--gpus: ncclCommInitAll over %d GPUs failed: %s", c->n_ranks,
                                  lib->GetErrorString(nr))
                      : 0;
    c->nccl = lib;
    c->nccl_always = want; /* docs/engine.md: =nccl forces NCCL, so a check covers that path */
    for (int r = 0; r < c->n_ranks; r++) c->rank[r].comm = comms[r];
    return 0;
}

/* Rank r's stream, events and weights and its shard's descriptors. Alone on its GPU among
 * several ranks it uploads only what it reads; ranks sharing a GPU read one whole upload of the
 * pack, made by the first of them: the simplest rule that is right, since together they read
 * most of it (the union of their shards is not worked out). */
static int start_rank(cuda_backend *c, int r, muse_err *e)
{
    cuda_rank *rk = on(c, r);
    if (c->failed || CHECK(c, cudaStreamCreateWithFlags(&rk->st, cudaStreamNonBlocking)) ||
        CHECK(c, cudaEventCreateWithFlags(&rk->ev_ready, cudaEventDisableTiming)) ||
        CHECK(c, cudaEventCreateWithFlags(&rk->ev_done, cudaEventDisableTiming)) ||
        CHECK(c, cudaEventCreateWithFlags(&rk->ev_join, cudaEventDisableTiming)) ||
        CHECK(c, cudaStreamCreateWithFlags(&rk->side, cudaStreamNonBlocking)) ||
        CHECK(c, cudaEventCreateWithFlags(&rk->ev_fork, cudaEventDisableTiming)) ||
        CHECK(c, cudaEventCreateWithFlags(&rk->ev_side, cudaEventDisableTiming)))
        return -1;
    if (rk->owner == r) {
        int up = alone(c, r) ? upload_shard(c, r, e) : upload_weights(c, r);
        if (up || upload_vectors(c, r) || upload_codebooks(c, r)) return -1;
    } else {
        const cuda_rank *ow = &c->rank[rk->owner];
        rk->wdev = ow->wdev;
        rk->vec = ow->vec;
        rk->vec_block = ow->vec_block;
        rk->router_bias = ow->router_bias;
        rk->expert_norm = ow->expert_norm;
        memcpy(rk->cb_tables, ow->cb_tables, sizeof rk->cb_tables);
    }
    return upload_linears(c, r, e);
}

/* The backend's state before anything is on a GPU: the model's checks, the ranks' heads and
 * GPUs, the switches read from the environment; NULL with the reason. Sizing touches no GPU. */
static cuda_backend *begin(const muse_model *m, const muse_backend_opts *o, int sizing, muse_err *e)
{
    const muse_config *cfg = &m->cfg;
    int ranks = o->ranks > 0 ? o->ranks : 1;
    if (ranks > MUSE_MAX_RANKS)
        return muse_fail(e, "--ranks %d: at most %d ranks in one process", ranks, MUSE_MAX_RANKS),
               NULL;
    if (muse_shard_check(cfg, ranks, e)) return NULL;
    if (cfg->head_dim > 512 || cfg->head_dim % 2)
        return muse_fail(e, "config.json: head_dim %lld exceeds the CUDA backend's limit of 512",
                         (long long)cfg->head_dim),
               NULL;
    if (cfg->num_experts > 4096)
        return muse_fail(e, "config.json: num_experts %lld exceeds the CUDA backend's limit 4096",
                         (long long)cfg->num_experts),
               NULL;
    if (!sizing && devices_check(o, ranks, e)) return NULL;
    cuda_backend *c = MUSE_CALLOC(1, sizeof *c);
    c->base.ops = &cuda_ops;
    c->sizing = sizing;
    if (muse_backend_init_common(&c->base, m, o, e)) {
        free(c);
        return NULL;
    }
    c->base.masks = 1; /* the sample kernels apply the round's token masks */
    c->n_ranks = ranks;
    for (int r = 0; r < ranks; r++) {
        cuda_rank *rk = &c->rank[r];
        rk->device = o->devices[r];
        rk->owner = r;
        for (int q = r - 1; q >= 0; q--)
            if (c->rank[q].device == rk->device) rk->owner = c->rank[q].owner;
        c->multi_dev |= rk->device != c->rank[0].device;
        muse_shard_heads(cfg, r, ranks, &rk->heads);
        rk->kv_width = (long)((rk->heads.kv1 - rk->heads.kv0) * cfg->head_dim);
    }
    const char *graphs = getenv("MUSE_CUDA_GRAPHS"); /* 0: launch each kernel eagerly */
    c->graphs = !(graphs && !strcmp(graphs, "0")) && !c->multi_dev;
    const char *replay = getenv("MUSE_CUDA_REPLAY"); /* 0: every round captured anew */
    c->replay = !(replay && !strcmp(replay, "0"));
    const char *side = getenv("MUSE_CUDA_SIDE"); /* 0: the shared experts after the routed */
    c->side_on = !(side && !strcmp(side, "0"));
    const char *prof = getenv("MUSE_CUDA_PROFILE");
    c->prof = prof && !strcmp(prof, "1");
    if (c->prof) c->graphs = 0; /* each op synchronized on its own */
    int id_bits = 0;
    while (((int64_t)1 << id_bits) < cfg->vocab_size) id_bits++;
    c->weight_bits = 62 - id_bits;
    size_t R = (size_t)o->max_rows, K = (size_t)cfg->num_experts_per_tok;
    c->red_floats = R * (K > 1 ? K : 1) * (size_t)cfg->hidden_size; /* moe's pairs, or x */
    return c;
}

muse_backend *muse_cuda_backend_create(const muse_model *m, const muse_backend_opts *o, muse_err *e)
{
    cuda_backend *c = begin(m, o, 0, e);
    if (!c) return NULL;
    lay_out_tensors(c);
    muse_err why = {{0}};
    int bad = 0;
    for (int r = 0; r < c->n_ranks && !bad; r++) bad = start_rank(c, r, &why);
    if (!bad && !c->failed && c->multi_dev) {
        enable_peers(c);
        bad = !c->failed && setup_nccl(c, &why);
    }
    on(c, 0);
    if (c->prof && !c->failed && !CHECK(c, cudaEventCreate(&c->ev0)))
        CHECK(c, cudaEventCreate(&c->ev1));
    if (bad || c->failed || allocate(c)) {
        if (why.msg[0])
            muse_fail(e, "--backend cuda: %s", why.msg);
        else
            muse_fail(e,
                      "--backend cuda: start-up on GPU %d (rank %d) failed: %s; use --backend cpu",
                      c->rank[c->failed_rank].device, c->failed_rank, c->err);
        cuda_destroy(&c->base);
        return NULL;
    }
    return &c->base;
}

int muse_cuda_plan_memory(const muse_model *m, const muse_backend_opts *o, const long act_floats[2],
                          muse_rank_mem out[], muse_err *e)
{
    cuda_backend *c = begin(m, o, 1, e);
    if (!c) return -1;
    int rc = 0;
    lay_out_tensors(c); /* a GPU's whole copy of the pack: its tensors 256-byte aligned */
    uint64_t aligned = c->pack_bytes - muse_st_total_bytes(m->st);
    for (int r = 0; r < c->n_ranks; r++)
        if (c->rank[r].owner == r && !alone(c, r)) c->base.ranks[r].weights += aligned;
    for (int r = 0; r < c->n_ranks && !rc; r++) /* beside the pack's tensors; shapes alone */
        rc = (c->rank[r].owner == r && (upload_vectors(c, r) || upload_codebooks(c, r))) ||
             upload_linears(c, r, e);
    if (!rc) size_rings(c);
    for (int r = 0; r < c->n_ranks && !rc; r++) {
        rc = allocate_rank(c, r);
        /* muse_forward_create's activations: every rank holds each whole (cuda_alloc) */
        c->base.ranks[r].workspace +=
            ((uint64_t)c->base.opts.max_rows * (uint64_t)act_floats[0] +
             (uint64_t)c->base.opts.max_wanted * (uint64_t)act_floats[1]) *
            sizeof(float);
        out[r] = c->base.ranks[r]; /* weights: alignment, fp32 vectors, tables, descriptors */
    }
    if (rc && !e->msg[0]) muse_fail(e, "--backend cuda: sizing rank %d failed: %s", c->at, c->err);
    cuda_destroy(&c->base);
    return rc ? -1 : 0;
}

static void free_rank(cuda_backend *c, int r)
{
    cuda_rank *rk = &c->rank[r];
    if (c->sizing) { /* nothing was allocated on a GPU */
        free(rk->vec);
        free(rk->router_bias);
        free(rk->expert_norm);
        free(rk->k_cache);
        free(rk->v_cache);
        free(rk->views);
        free(rk->lin);
        free(rk->moe_ok);
        return;
    }
    cudaSetDevice(rk->device);
    void *dev[] = {
        rk->ws_fast, rk->lin_dev, rk->experts, rk->ws_a,      rk->ws_t,     rk->router_logits,
        rk->sel_w,   rk->eg,      rk->eu,      rk->ea,        rk->zg,       rk->zs,
        rk->xsel,    rk->raw,     rk->weights, rk->sel,       rk->pair_src, rk->red,
        rk->gather,  rk->d_pack,  rk->d_drawn, rk->snapshots, rk->moe_plan, rk->ws_attn,
        rk->d_masks, rk->ws_side, rk->zsq};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    for (int i = 0; i < c->n_acts; i++) cudaFree(c->acts[i][r]);
    if (rk->k_cache)
        for (int64_t i = 0; i < c->base.model->cfg.num_layers; i++) {
            cudaFree(rk->k_cache[i]);
            cudaFree(rk->v_cache[i]);
        }
    if (rk->comm && c->nccl) c->nccl->CommDestroy(rk->comm);
    if (rk->owner == r) { /* the GPU's copy of the pack */
        cudaFree(rk->wdev);
        cudaFree(rk->vec_block);
        for (int cb = 0; cb < 3; cb++) cudaFree(rk->cb_tables[cb]);
        free(rk->vec);
        free(rk->router_bias);
        free(rk->expert_norm);
    }
    if (rk->ev_ready) cudaEventDestroy(rk->ev_ready);
    if (rk->ev_done) cudaEventDestroy(rk->ev_done);
    if (rk->ev_join) cudaEventDestroy(rk->ev_join);
    if (rk->ev_fork) cudaEventDestroy(rk->ev_fork);
    if (rk->ev_side) cudaEventDestroy(rk->ev_side);
    if (rk->side) cudaStreamDestroy(rk->side);
    if (rk->st) cudaStreamDestroy(rk->st);
    free(rk->k_cache);
    free(rk->v_cache);
    free(rk->views);
    free(rk->lin);
    free(rk->moe_ok);
    free(rk->toff);
    free(rk->pack_off);
}

void cuda_destroy(muse_backend *be)
{
    cuda_backend *c = cu(be);
    if (c->prof && !c->sizing) {
        fprintf(stderr, "cuda profile (ms total, calls, us a call):\n");
        for (int i = 0; i < PROF_OPS; i++)
            if (c->prof_n[i])
                fprintf(stderr, "  %-20s %10.3f %8ld %10.1f\n", prof_names[i], c->prof_ms[i],
                        c->prof_n[i], 1000.0 * c->prof_ms[i] / (double)c->prof_n[i]);
        cudaEventDestroy(c->ev0);
        cudaEventDestroy(c->ev1);
    }
    void *host[] = {c->stage.block, c->h_drawn, c->h_sampling, c->h_logits, c->h_masks, c->h_pack};
    for (size_t i = 0; i < sizeof host / sizeof *host && !c->sizing; i++) cudaFreeHost(host[i]);
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++)
        if (c->execs[i]) cudaGraphExecDestroy(c->execs[i]);
    for (int r = c->n_ranks - 1; r >= 0; r--) free_rank(c, r); /* owners last */
    free(c->acts);
    free(c->act_width);
    free(c->act_cols);
    free(c->kv_cap);
    free(c->tensors);
    muse_kv_pool_destroy(&be->kv);
    free(c);
}
