/* The seam between the forward plan and a device. One backend object spans every rank of the
 * process and is made by name (muse_backend_create). Everything is sized at start; a round is
 * begin_round (the batch into staging fixed at start), operations on opaque activation handles
 * the backend allocated, end_round (wait, hand back the drawn ids). A round allocates nothing
 * and passes no host pointer to an operation, so a device backend can capture it as a graph.
 * Shapes in comments: R rows of the round (padded up to a bucket), H hidden, Q = Hq*head_dim,
 * KV = Hkv*head_dim, N wanted rows (padded the same way). */
#ifndef MUSE_BACKEND_H
#define MUSE_BACKEND_H

#include "model/kv_pool.h"
#include "model/model.h"
#include "text/sampler.h"

typedef enum { MUSE_NORM_NONE, MUSE_NORM_PLUS1, MUSE_NORM_PLAIN } muse_norm_weight;
typedef struct muse_backend muse_backend;
/* An activation buffer [max_rows, width] fp32 that the backend allocated at start. */
typedef int32_t muse_act;

#include "backend/ops.h"

#define MUSE_MAX_RANKS   8
#define MUSE_MAX_BUCKETS 16

/* One round's batch. Rows of one sequence are consecutive positions, ascending; the caller has
 * reserved KV blocks for them (muse_kv_ensure on be->kv). Wanted rows are numbered in row
 * order; sampling[i] and draw_pos[i] belong to wanted row i. */
typedef struct {
    long rows;
    const int32_t *tokens;         /* [rows] */
    const int64_t *positions;      /* [rows] absolute position of each row */
    const int32_t *seqs;           /* [rows] KV slot of each row, 0 .. max_seqs-1 */
    const uint8_t *want_logits;    /* [rows] 1 where logits are wanted, or NULL for every row */
    const muse_sampling *sampling; /* [wanted] or NULL: no draw */
    const int64_t *draw_pos;       /* [wanted] absolute position of the token drawn */
    int return_logits;             /* end_round hands back the wanted rows' logits */
    /* [wanted] or NULL: per wanted row a token bitmap (vocab/8 bytes, bit t of byte t/8) or
     * NULL; sample draws only tokens whose bit is set (a masked logit is -inf), before
     * temperature, top_k, top_p and min_p. Host memory, valid until end_round. */
    const uint8_t *const *masks;
} muse_round;

/* What end_round hands back: only what the host needs. Valid until the next round. */
typedef struct {
    long wanted;
    const int32_t *tokens; /* [wanted] drawn ids, when the round had sampling */
    const float *logits;   /* [wanted, vocab_size], when the round asked for them */
} muse_round_out;

/* The kernel path of a device backend (kernels/CONTRACT.md): exact (equal to the CPU bit for
 * bit, the on-device reference) or fast (within a stated bound of exact, batch-invariant
 * bitwise; an operation without a fast kernel runs its exact one). DEFAULT: MUSE_CUDA_PATH,
 * else exact. The CPU backend is the reference: it has one path and takes either. */
typedef enum { MUSE_KERNELS_DEFAULT, MUSE_KERNELS_EXACT, MUSE_KERNELS_FAST } muse_kernels;

/* Sizes fixed at start: every workspace, staging buffer and the KV cache come from these. */
typedef struct {
    long max_rows; /* rows a round may carry */
    /* rows a round may want logits of (0: max_rows; a server's lanes, one a lane): the head's
     * and the sampler's buffers; start-up rounds it up to its row bucket */
    long max_wanted;
    int max_seqs;                /* KV slots */
    int64_t context;             /* positions per sequence */
    int64_t kv_blocks;           /* full-attention KV blocks in the pool; 0: max_seqs x context */
    int snapshot_slots;          /* sliding-window snapshots the prompt cache may hold */
    int ranks;                   /* tensor-parallel ranks in this process (0 or 1: one) */
    int devices[MUSE_MAX_RANKS]; /* device of each rank (GPU ordinal; ignored by cpu) */
    int threads;                 /* CPU threads (<= 0: all cores) */
    int exact_rows;              /* 1: no padding of rows to buckets (tests compare both) */
    muse_kernels kernels;        /* the kernel path (DEFAULT: MUSE_CUDA_PATH, else exact) */
    /* A world of several processes (engine/tp/): this process holds rank tp_rank of tp_world
     * (ranks must be 1) and sums and gathers across ranks through comm. 0, 0, NULL: one
     * process holds every rank. */
    int tp_rank, tp_world;
    struct muse_comm *comm;
} muse_backend_opts;

/* One line of a backend's per-op profile: its time summed over its calls so far; host: 1 when
 * the time is the host's (begin_round, end_round), 0 when it is the device's. */
typedef struct {
    const char *name;
    double ms;
    long calls;
    int host;
} muse_prof_entry;

/* Memory a rank holds, by term (bytes). */
typedef struct {
    int device;
    uint64_t weights, kv, sliding, snapshots, workspace, staging;
} muse_rank_mem;

typedef struct {
    const char *name;
    void (*destroy)(muse_backend *be);
    /* A [rows, width] buffer, rows at most max_rows; only at start. Returns -1 when out of
     * memory. */
    muse_act (*alloc)(muse_backend *be, long rows, long width);
    /* Outside a round only (tools and tests): host <-> activation rows [0, rows). */
    void (*write)(muse_backend *be, muse_act a, const float *src, long rows);
    void (*read)(muse_backend *be, muse_act a, float *dst, long rows);

    /* The round boundary. begin_round copies the batch (tokens, positions, sequences, the
     * want mask, the sequences' KV block tables, sampling) into staging and picks the bucket;
     * end_round waits and reports a device failure as -1 with the reason, never an abort. */
    int (*begin_round)(muse_backend *be, const muse_round *r, muse_err *e);
    int (*end_round)(muse_backend *be, muse_round_out *out, muse_err *e);

    /* The round operations, one slot each (ops.h says what each computes). */
#define MUSE_OP_SLOT(name, params, doc) void(*name) params;
    MUSE_ROUND_OPS(MUSE_OP_SLOT)
#undef MUSE_OP_SLOT

    /* Prompt cache: the sliding layers' K and V of the last W positions before end_pos, what a
     * sequence needs back to resume at end_pos, kept in snapshot slots 0 .. snapshot_slots-1
     * allocated at start. Outside a round. */
    void (*snapshot_save)(muse_backend *be, int seq, int64_t end_pos, int slot);
    void (*snapshot_load)(muse_backend *be, int seq, int64_t end_pos, int slot);

    /* Optional (NULL: not offered), outside a round, for benchmarks: the device memory's copy
     * bandwidth measured now, the yardstick of a kernel's bytes floor. Copies `bytes` from one
     * buffer of the device's memory to another (cpu: memcpy on the backend's threads; cuda: a
     * device-to-device cudaMemcpyAsync timed with events), best of several after a warm-up;
     * *bytes_per_s counts read + write (2 x bytes a copy). Names the device measured into
     * device. -1 with the reason on failure (a device error stays sticky, as in a round). */
    int (*copy_bandwidth)(muse_backend *be, size_t bytes, double *bytes_per_s, char *device,
                          size_t device_len, muse_err *e);
    /* Optional (NULL: not offered), for benchmarks: the per-op profile so far (cuda: with
     * MUSE_CUDA_PROFILE=1 at create, each op timed with events, eager): at most max entries
     * into out, the count; 0 when the profile is off. Names live as long as the backend. */
    int (*profile)(muse_backend *be, muse_prof_entry *out, int max);
    /* Optional (NULL: the ranks live in host memory), outside a round: rank r's device memory
     * now, free and total (cuda: cudaMemGetInfo on its GPU); -1 when the device cannot say. */
    int (*device_memory)(muse_backend *be, int rank, uint64_t *free_bytes, uint64_t *total_bytes);
} muse_backend_ops;

struct muse_backend {
    const muse_backend_ops *ops;
    const muse_model *model;
    muse_backend_opts opts;
    muse_kv_pool kv;         /* block tables of the full-attention layers (shared by ranks) */
    uint64_t kv_block_bytes; /* one block on one rank: every full layer's K and V */
    uint64_t snapshot_bytes; /* one snapshot slot on one rank */
    int n_ranks;
    muse_rank_mem ranks[MUSE_MAX_RANKS];
    int n_buckets;
    long buckets[MUSE_MAX_BUCKETS]; /* row counts a round is padded up to, ascending */
    muse_kernels kernels;           /* the path resolved at start: EXACT or FAST */
    int fault_pending; /* test hooks only: the next end_round fails as a sticky device error */
    int masks;         /* 1 when sample applies muse_round.masks (constrained decoding) */
    /* The forward sets replay_ok around its rounds: the same operations for the same rows,
     * wanted rows and sampling flags. A backend that ran such a round whole in begin_round
     * (a stored graph) sets replayed, and the forward goes straight to end_round. */
    int replay_ok, replayed;
};

/* Makes the backend called name ("cpu"; "cuda" where built). Errors name the fix. */
muse_backend *muse_backend_create(const char *name, const muse_model *m, const muse_backend_opts *o,
                                  muse_err *e);
void muse_backend_destroy(muse_backend *be);
/* The names this binary can make, comma-separated. */
const char *muse_backend_names(void);
/* The CUDA archs the kernels were built for ("sm_90a sm_90"); NULL without CUDA. */
const char *muse_backend_cuda_archs(void);

/* The names a command's rank flags go by, for its errors ("--gpus", "--ranks", "--backend";
 * compare: "--gpus-b", "--ranks-b", "--b"). */
typedef struct {
    const char *gpus, *ranks, *backend;
} muse_rank_flags;

/* --gpus LIST (comma-separated GPU ordinals, e.g. 0, 0,0, 0,1; NULL: not given) with the
 * backend's name and --ranks N (0: not given) into o->ranks and o->devices: LIST names one
 * rank a GPU, in rank order. Without LIST, --ranks N ranks (1 when 0) all on GPU 0. Refuses a
 * malformed list, a negative ordinal, more than MUSE_MAX_RANKS entries, LIST with a backend
 * other than cuda and a LIST disagreeing with --ranks; errors name the flag, the value and
 * what is accepted. The config's rank rules (shard.h) are checked later by the backend. */
int muse_backend_ranks(const muse_rank_flags *names, const char *backend, const char *gpus,
                       long long ranks, muse_backend_opts *o, muse_err *e);

/* The --kernels entry of a command's flag table (base/flags.h), into a const char *. */
#define MUSE_KERNELS_FLAG(p)                                                                       \
    MUSE_FLAG_S("kernels", p, "exact|fast",                                                        \
                "the kernel path of --backend cuda: exact (equal to the CPU bit for bit)\n"        \
                "or fast (tensor cores, within kernels/CONTRACT.md's bound of exact)",             \
                .def = "MUSE_CUDA_PATH, else exact")

/* "exact", "fast" (DEFAULT: "default"). */
const char *muse_kernels_name(muse_kernels k);
/* --kernels TEXT (flag names the flag in errors): "exact" or "fast"; NULL: DEFAULT. */
int muse_kernels_parse(const char *flag, const char *text, muse_kernels *k, muse_err *e);
/* DEFAULT to MUSE_CUDA_PATH (exact | fast), else EXACT; a bad MUSE_CUDA_PATH is an error. */
int muse_kernels_resolve(muse_kernels want, muse_kernels *k, muse_err *e);

/* The fused operations built from the plain ones, bit for bit what the plan did before they
 * were fused: a backend without a fused kernel for one (cpu, the exact path) puts these in its
 * table. */
void muse_backend_linears_parts(muse_backend *be, int n, const muse_linear *const *ls, muse_act x,
                                int round16, const muse_act *ys);
void muse_backend_swiglu_linear_parts(muse_backend *be, const muse_linear *gate,
                                      const muse_linear *up, muse_act x, muse_act g, muse_act u,
                                      muse_act out);
void muse_backend_add_norm_norm_parts(muse_backend *be, muse_act h, muse_act y, long width,
                                      const muse_vec *w, float eps, const muse_vec *next_w,
                                      muse_norm_weight next_mode, float next_eps, muse_act out);

/* For backends: fills be's common fields (buckets, KV pool, byte counts of one rank). */
int muse_backend_init_common(muse_backend *be, const muse_model *m, const muse_backend_opts *o,
                             muse_err *e);
/* The smallest bucket holding rows (rows itself when exact_rows). */
long muse_backend_bucket(const muse_backend *be, long rows);

/* A round's batch on the host as every backend stages it (muse_backend_stage): the rows padded
 * to their bucket, the wanted rows padded the same way, each wanted row's sampling and draw
 * position, and the block tables of the round's sequences. Arrays sized at start from the
 * options, laid out in one block the backend allocates (the CUDA backend's is pinned). */
typedef struct {
    long rows, real_rows;          /* the bucket R the batch is padded to; the batch's rows */
    long wanted, real_wanted;      /* the wanted rows' bucket N (0: none); the real ones */
    int32_t *tokens, *seqs, *want; /* [max_rows]; want: the wanted rows' indices */
    int64_t *positions, *draw_pos; /* [max_rows] */
    muse_sampling *sampling;       /* [max_rows] */
    int32_t *tables;               /* [max_seqs][blocks_per_seq]; -1: no block */
    const uint8_t *const *masks;   /* the round's masks as given ([real_wanted]) or NULL */
    void *block;                   /* what the arrays are carved from (the backend frees it) */
} muse_round_stage;

/* The bytes of the block a stage is laid out in, for be's options. */
size_t muse_round_stage_bytes(const muse_backend *be);
/* Lays the stage's arrays out in block (muse_round_stage_bytes long); every table entry -1. */
void muse_round_stage_place(muse_round_stage *s, const muse_backend *be, void *block);
/* r into s: padding rows carry token 0 at position 0 of no sequence (seq -1: no KV write, no
 * attention), padding wanted rows repeat the last wanted row and draw greedily at position 0,
 * the round's sequences' block tables copied as they are now; the counts set. */
void muse_backend_stage(const muse_backend *be, const muse_round *r, muse_round_stage *s);

/* Before any allocation, for the memory plan: the memory of the ranks' devices (the smallest,
 * bytes; 0 for cpu: no limit) and which they are ("NVIDIA H200 (device 0)"). -1 with the reason
 * and the fix where there is no such device, no driver or no CUDA in this binary. */
int muse_backend_device_memory(const char *name, const int *devices, int ranks, uint64_t *bytes,
                               char *desc, size_t desc_len, muse_err *e);
/* The CUDA backend's part of it (MUSE_HAVE_CUDA). */
int muse_cuda_device_memory(const int *devices, int ranks, uint64_t *bytes, char *desc,
                            size_t desc_len, muse_err *e);

/* Before the weights go anywhere, for the memory plan: what backend name would hold on its
 * widest rank for m and o, worked out without a GPU: *widest's workspace is workspace and
 * staging together (muse_forward_create's activations among them: act_floats[0] a row of
 * max_rows, [1] a row of max_wanted, muse_forward_act_floats), its weights what the backend
 * holds beside the pack's tensors (alignment, fp32 vectors, tables, descriptors), each the
 * largest over the ranks. 1 with *widest set; 0 where the plan's estimate is the backend's own
 * sizing (cpu); -1 with the reason. */
int muse_backend_plan_memory(const char *name, const muse_model *m, const muse_backend_opts *o,
                             const long act_floats[2], muse_rank_mem *widest, muse_err *e);
/* The CUDA backend's part of it (MUSE_HAVE_CUDA): allocate_rank's own arithmetic, counted. */
int muse_cuda_plan_memory(const muse_model *m, const muse_backend_opts *o, const long act_floats[2],
                          muse_rank_mem out[], muse_err *e);

/* The CPU reference backend. */
muse_backend *muse_cpu_backend_create(const muse_model *m, const muse_backend_opts *o, muse_err *e);
/* The CUDA backend (engine/backend/cuda/), in binaries built with nvcc (MUSE_HAVE_CUDA). */
muse_backend *muse_cuda_backend_create(const muse_model *m, const muse_backend_opts *o,
                                       muse_err *e);

#endif
