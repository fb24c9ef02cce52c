/* The CUDA backend's private header: the types its files share (a rank, the backend, an
 * uploaded tensor), the CHECK macro and the helpers called across files. The backend:
 * every operation of backend.h on one GPU or several ranks, each a kernel of
 * kernels/ that equals the CPU reference (cpu_backend.c) bit for bit where it can (the same
 * fixed-order double sums, no contraction) and within the harness's relative bounds
 * everywhere. Everything is allocated and uploaded at start (weights once a GPU, sized from
 * the options); a round copies its batch into pinned staging, launches kernels on each rank's
 * stream and allocates nothing; the first failing CUDA call is kept with its rank and
 * file:line and end_round reports it (sticky: the context is not used again). Each round is
 * captured as a CUDA graph and replayed through one executable graph a row bucket
 * (MUSE_CUDA_GRAPHS=0: eager launches; the bits are the same).
 * With --ranks N / --gpus LIST each rank holds its shard's descriptors (model/shard.h, the CPU
 * backend's rules), its activations, workspaces, KV heads and snapshot slots, and runs every
 * operation on its own stream. A GPU holding one rank of several uploads only what that rank
 * reads: the tensors it reads whole and its shard of each split linear, packed compactly
 * (muse_shard_pack); ranks sharing a GPU read one whole upload of the pack. Sums across ranks
 * go in rank order through kernels/all_reduce.cu, reading every rank's partial (one GPU, or
 * peers over NVLink), or after an NCCL all-gather where GPUs lack peer access.
 * Its files: cuda_upload.c (placement and upload), cuda_device.c (devices, peers, start-up,
 * destroy), cuda_round.c (staging, graphs, profiling, snapshots), cuda_ops.c (the operations
 * and the ops table), cuda_reduce.c (the rank-order sums), cuda_fast.c and cuda_attn.c (the
 * fast path's linears and attention). */

#ifndef MUSE_CUDA_INTERNAL_H
#define MUSE_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/stage_pack.h"
#include "backend/cuda/nccl_dl.h"
#include "kernels/launch.h"
#include "kernels/sample.cuh"
#include "model/shard.h"

/* What a round's profile counts: the host's begin and end, then each kernel of the list
 * (backend/ops.h), so a new kernel gets its line by being in the list; then the moe op's parts
 * on one rank (router + selection, routed experts, shared experts, the expert output norms and
 * the combine), which replace its one MOE entry there. */
enum {
    PROF_BEGIN,
    PROF_END,
#define MUSE_PROF_ID(id, ...) PROF_##id,
    MUSE_KERNELS(MUSE_PROF_ID)
#undef MUSE_PROF_ID
        PROF_MOE_ROUTER,
    PROF_MOE_ROUTED,
    PROF_MOE_SHARED,
    PROF_MOE_COMBINE,
    PROF_OPS
};

/* One uploaded tensor: its host bytes and where they are in a GPU's copy of the pack. */
typedef struct {
    const uint8_t *host;
    size_t bytes, off;
} dev_tensor;

/* The upload's progress line: bytes really sent to one GPU, of all it will get. */
typedef struct {
    double t0, shown;
    size_t sent, all;
    int device;
} upload_meter;

#define NOT_UP SIZE_MAX /* a tensor not on the rank's GPU, or a linear not packed for it */

/* One rank: its GPU and stream, its shard, its buffers. */
typedef struct {
    int device;
    int owner; /* the rank whose upload it reads: the first rank on its GPU (itself if alone) */
    cudaStream_t st;
    cudaEvent_t ev_ready, ev_done, ev_join; /* the all-reduce's two barriers; graph fork/join */
    muse_rank_heads heads;
    long kv_width; /* (kv1 - kv0) * head_dim: what its cache holds a position */
    /* the replicated weights of its GPU (the owner's allocations) */
    uint8_t *wdev; /* the pack's tensors (alone: those it reads), found by host address */
    /* alone on its GPU among several ranks: wdev holds tensor i at toff[i] (NOT_UP: not there)
     * and linear id packed at pack_at + pack_off[id] (NOT_UP: read through toff); both NULL
     * where wdev is the whole pack at the shared offsets (one rank, or ranks sharing a GPU) */
    size_t *toff, *pack_off, pack_at;
    upload_meter up;
    float **vec;         /* [n_vecs] device copies of the fp32 weight vectors */
    float *vec_block;    /* their storage */
    float **router_bias; /* [layers] or NULL entries */
    float **expert_norm; /* [layers] [E, H] */
    float *cb_tables[3]; /* the codebooks' 65536 values */
    /* its shard: views of the linears (shard.h) and their device descriptors */
    muse_linear *views;  /* [n_linears] */
    muse_k_lin *lin;     /* [n_linears] host copies of the descriptors */
    muse_k_lin *lin_dev; /* [n_linears] on the device */
    muse_k_lin *experts; /* [layers][3][E] on the device: gate, up, down */
    /* round staging on its GPU: one pack (backend/stage_pack.h) the arrays point into, laid out
     * again each round for its rows; the drawn tokens apart */
    unsigned char *d_pack;
    int32_t *d_tokens, *d_seqs, *d_want, *d_tables, *d_drawn;
    int64_t *d_positions, *d_draw_pos;
    muse_k_sampling *d_sampling;
    uint8_t *d_masks; /* rank 0 (it draws): [max_rows][mask_bytes] the wanted rows' token masks */
    /* KV: per layer, fp16, its KV heads */
    uint16_t **k_cache, **v_cache;
    uint16_t *snapshots;
    /* workspaces */
    float *ws_a;
    double *ws_t;
    void *ws_fast; /* the fast path's workspace (cuda_fast.c), NULL on the exact path */
    size_t ws_fast_bytes;
    /* the shared experts beside the routed ones: their stream, its fork and join events and
     * their own fast workspace (NULL where they do not run beside: cuda_moe reads it so) */
    cudaStream_t side;
    cudaEvent_t ev_fork, ev_side;
    void *ws_side;
    size_t ws_side_bytes;
    void *ws_attn; /* the fast attention's split partials (kernels/attention_fast.cu), or NULL */
    size_t ws_attn_bytes;
    float *router_logits, *sel_w, *eg, *eu, *ea, *zg, *zs, *xsel, *raw, *weights;
    int32_t *sel, *pair_src;
    int32_t *moe_plan;     /* the fast MoE's groups, perm and count (cuda_fast.c), fast path only */
    double *zsq;           /* [P][H / 128] the down's row sums of squares (cuda_fast_norm_in) */
    unsigned char *moe_ok; /* [layers]: its experts take the grouped fast product (at start) */
    float *red;            /* [red_floats] a rank-order sum before it is copied back (ranks > 1) */
    float *gather;         /* [ranks][red_floats] NCCL's all-gather of the partials (NCCL only) */
    ncclComm_t comm;
} cuda_rank;

/* Executable graphs: one a row bucket (the last for any other count) and round kind (drawn
 * or not, logits back or not: their operations differ, so one exec would be made again each
 * time the kind changed). */
#define CUDA_GRAPH_SLOTS ((MUSE_MAX_BUCKETS + 1) * 4)

/* What a stored graph was captured for, besides its slot's kind: a round of the slot with the
 * same rows (the last slot holds any count) and wanted rows replays it (cuda_round.c). */
typedef struct {
    long rows, wanted;
    int valid;
    muse_act logits; /* what the head and sample operations set */
} cuda_exec_key;

typedef struct {
    muse_backend base;
    int n_ranks;
    cuda_rank rank[MUSE_MAX_RANKS];
    int multi_dev; /* ranks on more than one GPU: cudaSetDevice before each rank's work */
    int sizing;    /* muse_cuda_plan_memory: dalloc counts and returns NULL, no CUDA call is made */
    int peers;     /* every pair of distinct GPUs reads the other's memory (peer access) */
    const muse_nccl *nccl; /* loaded where ranks sit on distinct GPUs (NULL: peer reads only) */
    int nccl_always;       /* MUSE_CUDA_REDUCE=nccl: every sum through NCCL, not only large ones */
    size_t red_floats;
    int failed, failed_rank, at; /* at: the rank being driven, for the error's text */
    char err[400];
    /* the host side of the pack's upload: shared by every GPU's copy (same offsets) */
    dev_tensor *tensors;
    size_t n_tensors, pack_bytes;
    /* activations: a buffer a rank, and the columns each rank's holds now (its shard) */
    float *(*acts)[MUSE_MAX_RANKS];
    long *act_width;
    long (*act_cols)[MUSE_MAX_RANKS];
    int n_acts;
    /* round staging: host (pinned), copied to every rank's GPU */
    muse_round_stage stage; /* backend.h: the batch as both backends stage it, in pinned memory */
    long rows, real_rows, wanted, real_wanted; /* stage's, copied at begin_round */
    muse_k_sampling *h_sampling;               /* [max_rows] stage's sampling as the kernel's */
    unsigned char *h_pack; /* pinned: the round's pack, copied to every rank's d_pack at once */
    size_t pack_cap;       /* the pack's bytes at max_rows rows and wanted rows */
    uint8_t *h_masks;      /* [max_rows][mask_bytes] pinned: the masked rows' bitmaps this round */
    size_t mask_bytes;     /* (vocab_size + 7) / 8, a row's token mask */
    int32_t *h_drawn;
    float *h_logits;
    int do_sample, return_logits, in_round;
    muse_act logits;
    int64_t *kv_cap; /* per layer: ring positions of a sliding layer, 0 for a full one */
    /* CUDA graphs: each round is captured (every rank's stream, forked from and joined into
     * rank 0's) and replayed through one executable graph a row bucket and round kind
     * (updated in place when the next capture of the slot differs). Ranks on several GPUs launch
     * eagerly: one graph spanning devices is not relied on. */
    int graphs, capturing;
    cudaGraphExec_t execs[CUDA_GRAPH_SLOTS]; /* a row bucket's (or any other count's) x 4 kinds */
    /* replay (on unless MUSE_CUDA_REPLAY=0): a forward's round whose key equals its bucket's last
     * capture launches that graph in begin_round without running the operations again: every launch
     * parameter is a function of the key (rows, wanted rows, sampling flags; the batch itself is
     * read from the staged buffers), so the capture would be the same graph */
    int replay, keyed; /* keyed: this round's capture may be replayed (a forward's round) */
    int side_on; /* rank 0 gets a side workspace for the shared experts (MUSE_CUDA_SIDE=0: not) */
    cuda_exec_key exec_key[CUDA_GRAPH_SLOTS];
    /* MUSE_CUDA_PROFILE=1: each op timed with events on rank 0's stream (eager, synchronized),
     * printed at exit */
    int prof;
    cudaEvent_t ev0, ev1;
    double prof_ms[PROF_OPS];
    long prof_n[PROF_OPS];
    int weight_bits;
} cuda_backend;

static inline cuda_backend *cu(muse_backend *be)
{
    return (cuda_backend *)be;
}

/* cuda_device.c: the first failing CUDA call kept (rank, file:line), the sticky error's text,
 * the current GPU, device allocations */
int cuda_ok(cuda_backend *c, int rc, const char *what, const char *file, int line);
#define CHECK(c, call) cuda_ok((c), (int)(call), #call, __FILE__, __LINE__)
int device_error(cuda_backend *c, muse_err *e);
cuda_rank *on(cuda_backend *c, int r);
void *dalloc(cuda_backend *c, size_t bytes, uint64_t *account);
/* Rank r's staging arrays placed in its d_pack for rows rows and wanted wanted rows, as the
 * host's pack is laid out (cuda_round.c); the layout. */
muse_stage_pack cuda_place_pack(cuda_backend *c, int r, size_t rows, size_t wanted);
void cuda_destroy(muse_backend *be);
int cuda_device_memory(muse_backend *be, int rank, uint64_t *free_bytes, uint64_t *total_bytes);

static inline int kdtype(muse_dtype dt)
{
    return dt == MUSE_DT_F16 ? MUSE_K_F16 : dt == MUSE_DT_BF16 ? MUSE_K_BF16 : MUSE_K_F32;
}

static inline float *act_r(cuda_backend *c, muse_act a, int r)
{
    MUSE_CHECK(a >= 0 && a < c->n_acts && r >= 0 && r < c->n_ranks);
    return c->acts[a][r];
}

/* Rank rk's launch context (kernels/launch.h) for a launch over rows rows: its stream and the
 * round's staged arrays on its GPU. */
static inline muse_k_ctx kctx(const cuda_rank *rk, long rows)
{
    muse_k_ctx k = {rk->st,     rows,           rk->d_tokens,   rk->d_seqs, rk->d_positions,
                    rk->d_want, rk->d_sampling, rk->d_draw_pos, rk->d_masks};
    return k;
}

/* cuda_upload.c: placement and upload */
size_t tensor_at(const cuda_backend *c, const uint8_t *h);
const void *dev_ptr(const cuda_backend *c, const cuda_rank *rk, const void *host);
void lay_out_tensors(cuda_backend *c);
int alone(const cuda_backend *c, int r);
int upload_weights(cuda_backend *c, int r);
int upload_shard(cuda_backend *c, int r, muse_err *e);
int upload_vectors(cuda_backend *c, int r);
int upload_codebooks(cuda_backend *c, int r);
/* rank r's views and descriptors (sizing: their shapes alone, nothing uploaded) */
int upload_linears(cuda_backend *c, int r, muse_err *e);

/* cuda_round.c: profiling, activations, the round, snapshots, copy bandwidth */
void prof_begin(cuda_backend *c);
void prof_end(cuda_backend *c, int op);
/* One rank: ends the op's part so far as `part` and begins the next; several ranks: nothing
 * (their launches interleave, so the op is timed whole). */
void prof_split(cuda_backend *c, int part);
void prof_host(cuda_backend *c, int op, int64_t since);
muse_act cuda_alloc(muse_backend *be, long rows, long width);
void cuda_write(muse_backend *be, muse_act a, const float *src, long rows);
void cuda_read(muse_backend *be, muse_act a, float *dst, long rows);
int cuda_begin_round(muse_backend *be, const muse_round *r, muse_err *e);
int cuda_end_round(muse_backend *be, muse_round_out *out, muse_err *e);
void cuda_snapshot_save(muse_backend *be, int seq, int64_t end_pos, int slot);
void cuda_snapshot_load(muse_backend *be, int seq, int64_t end_pos, int slot);
int cuda_profile(muse_backend *be, muse_prof_entry *out, int max);
int cuda_copy_bandwidth(muse_backend *be, size_t bytes, double *bytes_per_s, char *device,
                        size_t device_len, muse_err *e);

/* cuda_reduce.c: the rank-order sums */
void reduce(cuda_backend *c, float *const parts[], long n);
void cuda_all_reduce(muse_backend *be, muse_act x, long width);

/* cuda_fast.c: the fast kernel path. The workspace rank rk's fast calls need at rows rows;
 * whether the fast kernel takes rank views of ls on every rank (fast path, shapes: else the
 * exact path runs); one call on rank rk (ys[i] rows at strides[i]; side: on its side stream
 * in its side workspace, else on its stream). */
size_t cuda_fast_workspace(const cuda_backend *c, const cuda_rank *rk, long rows);
int cuda_fast_fits(const cuda_backend *c, const muse_linear *const *ls, int n, int epilogue);
/* The fast MoE: the plan's ints at rows rows (0: no MoE), whether layer ly's experts take the
 * grouped product on every rank, rank rk's selection of the round's rows from its router
 * logits (grouped: with the plan of their pairs for the grouped product), and its experts of
 * the round's pairs into z. */
size_t cuda_fast_plan_ints(const cuda_backend *c, long rows);
void cuda_fast_moe_prepare(const cuda_backend *c, cuda_rank *rk);
int cuda_fast_moe_fits(const cuda_backend *c, const muse_layer *ly);
void cuda_fast_select(cuda_backend *c, cuda_rank *rk, const muse_layer *ly, long rows, int grouped);
/* Whether the routed experts' down writes its rows' sums of squares (rk->zsq) and the combine
 * takes the expert norms in (kernels/moe_combine_fast.cu): one rank, the fast grouped experts,
 * expert output norms; MUSE_FAST_NORM_IN=0 from the environment: the norm's own launch. */
int cuda_fast_norm_in(const cuda_backend *c, const cuda_rank *rk);
/* 0 where the environment sets name to "0" (a tuning switch; callers read it once a process) */
int cuda_env_on(const char *name);
void cuda_fast_experts(cuda_backend *c, cuda_rank *rk, const muse_layer *ly, const float *b,
                       long x_stride, long rows, float *z);
void cuda_fast_run(cuda_backend *c, cuda_rank *rk, int side, const muse_linear *const *ls, int n,
                   const float *x, long x_stride, long rows, int round16, float *const ys[],
                   const long strides[], int epilogue);
/* An MLP (gate/up with the swiglu, then down) in one fast call (muse_k_linear_fast_mlp):
 * whether every rank takes it; on rank rk, x's rows through it into y, the swiglu rows into mid
 * ([rows, I]); side as cuda_fast_run. */
int cuda_fast_mlp_fits(const cuda_backend *c, const muse_mlp *s);
void cuda_fast_mlp(cuda_backend *c, cuda_rank *rk, int side, const muse_mlp *s, const float *x,
                   long x_stride, long rows, float *mid, float *y, long y_stride);
/* The side workspace rank rk needs at rows rows for the shared experts beside the routed ones
 * (0: the model has none that the fast path takes); cuda_fast_run's side 1 runs there. */
size_t cuda_fast_side_workspace(const cuda_backend *c, const cuda_rank *rk, long rows);

/* cuda_attn.c: the fast attention's workspace on rank rk at rows rows (0: the exact kernel
 * runs, by shape), and the longest key range a row of layer reads */
size_t cuda_attn_workspace(const cuda_backend *c, const cuda_rank *rk, long rows);
int64_t cuda_attn_max_len(const cuda_backend *c, int layer);

/* cuda_ops.c: the operations' table */
extern const muse_backend_ops cuda_ops;

#endif
