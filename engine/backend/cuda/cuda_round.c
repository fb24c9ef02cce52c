/* The CUDA backend's rounds: activations (alloc, write, read), the batch staged to every rank,
 * the round's graph capture and replay, end_round with the fault hook, the per-op profile,
 * the sliding snapshots and the copy-bandwidth yardstick. */

#include <math.h>

#include "backend/cuda/cuda_internal.h"
#include "model/kv_addr.h"

#include "base/clock.h"
#include "kernels/fault.cuh"

void prof_begin(cuda_backend *c)
{
    if (c->prof && !c->failed) CHECK(c, cudaEventRecord(c->ev0, c->rank[0].st));
}

/* Rank 0's stream waits for every rank's (eager): an op's time is its slowest rank's. */
void prof_end(cuda_backend *c, int op)
{
    float ms = 0;
    if (!c->prof || c->failed) return;
    for (int r = 1; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        if (CHECK(c, cudaEventRecord(rk->ev_join, rk->st)) ||
            CHECK(c, cudaStreamWaitEvent(c->rank[0].st, rk->ev_join, 0)))
            return;
    }
    on(c, 0);
    if (CHECK(c, cudaEventRecord(c->ev1, c->rank[0].st)) ||
        CHECK(c, cudaEventSynchronize(c->ev1)) ||
        CHECK(c, cudaEventElapsedTime(&ms, c->ev0, c->ev1)))
        return;
    c->prof_ms[op] += ms;
    c->prof_n[op]++;
}

void prof_split(cuda_backend *c, int part)
{
    if (c->n_ranks > 1) return;
    prof_end(c, part);
    prof_begin(c);
}

void prof_host(cuda_backend *c, int op, int64_t since)
{
    if (!c->prof) return;
    c->prof_ms[op] += (double)(muse_now_ns() - since) / 1e6;
    c->prof_n[op]++;
}

muse_act cuda_alloc(muse_backend *be, long rows, long width)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(!c->in_round && width > 0 && rows > 0 && rows <= be->opts.max_rows);
    size_t bytes = (size_t)rows * (size_t)width * sizeof(float);
    c->acts = realloc(c->acts, (size_t)(c->n_acts + 1) * sizeof *c->acts);
    c->act_width = realloc(c->act_width, (size_t)(c->n_acts + 1) * sizeof *c->act_width);
    c->act_cols = realloc(c->act_cols, (size_t)(c->n_acts + 1) * sizeof *c->act_cols);
    MUSE_CHECK(c->acts && c->act_width && c->act_cols);
    memset(c->acts[c->n_acts], 0, sizeof c->acts[c->n_acts]);
    c->act_width[c->n_acts] = width;
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        float *p = dalloc(c, bytes, &be->ranks[r].workspace);
        c->acts[c->n_acts][r] = p;
        c->act_cols[c->n_acts][r] = width;
        /* on the rank's stream: a cudaMemset runs on the legacy stream, which the non-blocking
         * rank streams do not wait for, so it could land after the first round's writes */
        if (p) CHECK(c, cudaMemsetAsync(p, 0, bytes, rk->st));
    }
    if (c->failed) { /* kept, so destroy frees what this call got */
        c->n_acts++;
        return -1;
    }
    return c->n_acts++;
}

/* Writes the whole activation to every rank (a replicated value). */
void cuda_write(muse_backend *be, muse_act a, const float *src, long rows)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(rows >= 0 && rows <= be->opts.max_rows);
    size_t bytes = (size_t)rows * (size_t)c->act_width[a] * sizeof(float);
    for (int r = 0; r < c->n_ranks && !c->failed; r++) {
        cuda_rank *rk = on(c, r);
        /* on the rank's own stream, then waited for: a plain cudaMemcpy runs on the legacy
         * stream, which the non-blocking rank streams do not wait for, and from pageable memory
         * it may return before the last bytes land, so the next round's kernels could read
         * them early */
        if (!CHECK(c, cudaMemcpyAsync(act_r(c, a, r), src, bytes, cudaMemcpyHostToDevice, rk->st)))
            CHECK(c, cudaStreamSynchronize(rk->st));
        c->act_cols[a][r] = c->act_width[a];
    }
}

/* Reads rank 0's buffer; a value split by columns across ranks is gathered in rank order. */
void cuda_read(muse_backend *be, muse_act a, float *dst, long rows)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(rows >= 0 && rows <= be->opts.max_rows);
    long W = c->act_width[a], at = 0;
    size_t bytes = (size_t)rows * (size_t)W * sizeof(float);
    if (c->n_ranks == 1 || c->act_cols[a][0] == W) {
        on(c, 0);
        if (c->failed || CHECK(c, cudaMemcpy(dst, act_r(c, a, 0), bytes, cudaMemcpyDeviceToHost)))
            for (size_t i = 0; i < bytes / sizeof(float); i++) dst[i] = NAN; /* never stale */
        return;
    }
    for (int r = 0; r < c->n_ranks && !c->failed && rows > 0; r++) {
        long w = c->act_cols[a][r];
        on(c, r);
        CHECK(c, cudaMemcpy2D(dst + at, (size_t)W * sizeof(float), act_r(c, a, r),
                              (size_t)w * sizeof(float), (size_t)w * sizeof(float), (size_t)rows,
                              cudaMemcpyDeviceToHost));
        at += w;
    }
    if (c->failed)
        for (size_t i = 0; i < bytes / sizeof(float); i++) dst[i] = NAN;
}

muse_stage_pack cuda_place_pack(cuda_backend *c, int r, size_t rows, size_t wanted)
{
    const muse_backend *be = &c->base;
    size_t tables = (size_t)be->opts.max_seqs * (size_t)be->kv.blocks_per_seq;
    muse_stage_pack p = muse_stage_pack_layout(rows, wanted, sizeof *c->h_sampling, tables);
    cuda_rank *rk = &c->rank[r];
    MUSE_CHECK(p.bytes <= c->pack_cap);
    rk->d_positions = (int64_t *)(rk->d_pack + p.positions);
    rk->d_draw_pos = (int64_t *)(rk->d_pack + p.draw_pos);
    rk->d_sampling = (muse_k_sampling *)(rk->d_pack + p.sampling);
    rk->d_tokens = (int32_t *)(rk->d_pack + p.tokens);
    rk->d_seqs = (int32_t *)(rk->d_pack + p.seqs);
    rk->d_want = (int32_t *)(rk->d_pack + p.want);
    rk->d_tables = (int32_t *)(rk->d_pack + p.tables);
    return p;
}

/* The staged batch to rank r's GPU, on its stream: the pack (filled by begin_round) in one
 * copy of `copy` bytes, then rank 0's masks. */
static void stage_rank(cuda_backend *c, int r, size_t copy)
{
    cuda_rank *rk = on(c, r);
    cudaStream_t st = rk->st;
    (void)cuda_place_pack(c, r, (size_t)c->rows, (size_t)c->wanted);
    CHECK(c, cudaMemcpyAsync(rk->d_pack, c->h_pack, copy, cudaMemcpyHostToDevice, st));
    /* the masked rows' bitmaps to rank 0 (it draws), a copy a run of consecutive ones; a free
     * row or a round without masks copies nothing */
    size_t mb = c->mask_bytes;
    for (size_t i = 0, n = (size_t)c->real_wanted; r == 0 && i < n;) {
        size_t j = i;
        while (j < n && c->h_sampling[j].masked) j++;
        if (j > i)
            CHECK(c, cudaMemcpyAsync(rk->d_masks + i * mb, c->h_masks + i * mb, (j - i) * mb,
                                     cudaMemcpyHostToDevice, st));
        i = j + 1; /* row j is free (or the end) */
    }
}

/* Rank 0's stream waits for every other rank's work so far (eager, outside the graph): their
 * staging copies before a graph launched on it, their round before the copies back; rank 0's
 * GPU current again. */
static void wait_staging(cuda_backend *c)
{
    for (int r = 1; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        CHECK(c, cudaEventRecord(rk->ev_join, rk->st));
        CHECK(c, cudaStreamWaitEvent(c->rank[0].st, rk->ev_join, 0));
    }
    on(c, 0);
}

/* Starts the round's capture on rank 0's stream (after wait_staging) and forks every other
 * rank's stream from it. */
static void begin_capture(cuda_backend *c)
{
    cudaStream_t st0 = c->rank[0].st;
    wait_staging(c);
    if (c->failed || CHECK(c, cudaStreamBeginCapture(st0, cudaStreamCaptureModeThreadLocal)))
        return;
    c->capturing = 1;
    if (c->n_ranks > 1) CHECK(c, cudaEventRecord(c->rank[0].ev_join, st0));
    for (int r = 1; r < c->n_ranks; r++)
        CHECK(c, cudaStreamWaitEvent(c->rank[r].st, c->rank[0].ev_join, 0));
}

/* The graph slot of the round: its row count's bucket (the last for any other count), then
 * its kind (drawn, logits back). */
static int bucket_slot(const cuda_backend *c)
{
    int slot = MUSE_MAX_BUCKETS;
    for (int i = 0; i < c->base.n_buckets; i++)
        if (c->base.buckets[i] == c->rows) slot = i;
    return slot * 4 + (c->do_sample ? 1 : 0) + (c->return_logits ? 2 : 0);
}

/* A forward's round with its slot's key: that graph launched after the staging copies;
 * 0 when the round must be captured. */
static int launch_stored(cuda_backend *c)
{
    int slot = bucket_slot(c);
    if (!c->keyed || !c->execs[slot]) return 0;
    const cuda_exec_key *k = &c->exec_key[slot];
    if (!k->valid || k->rows != c->rows || k->wanted != c->wanted) return 0;
    wait_staging(c);
    c->logits = k->logits;
    CHECK(c, cudaGraphLaunch(c->execs[slot], c->rank[0].st));
    return 1;
}

/* The batch into staging as the CPU backend does it (backend.c muse_backend_stage), each
 * wanted row's sampling converted field by field to the kernel's record, then to every rank. */
int cuda_begin_round(muse_backend *be, const muse_round *r, muse_err *e)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(!c->in_round);
    if (c->failed) return device_error(c, e);
    int64_t t0 = muse_now_ns();
    muse_backend_stage(be, r, &c->stage);
    c->real_rows = c->stage.real_rows;
    c->rows = c->stage.rows;
    c->real_wanted = c->stage.real_wanted;
    c->wanted = c->stage.wanted;
    for (long i = 0; i < c->wanted; i++) { /* padding rows: the stage's all-zero record */
        const muse_sampling *q = &c->stage.sampling[i];
        const uint8_t *mask = c->stage.masks && i < c->real_wanted ? c->stage.masks[i] : NULL;
        c->h_sampling[i] =
            (muse_k_sampling){q->temperature, q->top_k, q->top_p, q->min_p, q->seed, mask != NULL};
        /* into pinned staging: the copy to the GPU is asynchronous */
        if (mask) memcpy(c->h_masks + (size_t)i * c->mask_bytes, mask, c->mask_bytes);
    }
    /* the pack, copied through the highest sequence's table row (stage_pack.h) */
    muse_stage_pack p = cuda_place_pack(c, 0, (size_t)c->rows, (size_t)c->wanted);
    size_t copy =
        muse_stage_pack_copy(&p, muse_stage_pack_max_seq(&c->stage), (size_t)be->kv.blocks_per_seq);
    MUSE_CHECK(copy <= p.bytes); /* the stage's sequences are below max_seqs */
    muse_stage_pack_fill(&p, c->h_pack, &c->stage, c->h_sampling, sizeof *c->h_sampling, copy);
    for (int k = 0; k < c->n_ranks; k++) stage_rank(c, k, copy);
    c->do_sample = r->sampling != NULL;
    c->return_logits = r->return_logits;
    c->logits = -1;
    c->in_round = 1;
    c->keyed = c->replay && be->replay_ok;
    if (c->graphs && !c->failed && launch_stored(c))
        be->replayed = 1;
    else if (c->graphs && !c->failed)
        begin_capture(c);
    prof_host(c, PROF_BEGIN, t0);
    if (c->failed) return device_error(c, e);
    return 0;
}

/* Ends the round's capture (every rank's stream joined into rank 0's) and launches it through
 * the bucket's executable graph: updated in place from the new capture (same topology: only
 * parameters changed), else made again. */
static void replay(cuda_backend *c)
{
    cudaGraph_t g = NULL;
    cudaStream_t st0 = c->rank[0].st;
    for (int r = 1; r < c->n_ranks; r++) {
        CHECK(c, cudaEventRecord(c->rank[r].ev_join, c->rank[r].st));
        CHECK(c, cudaStreamWaitEvent(st0, c->rank[r].ev_join, 0));
    }
    c->at = 0; /* no cudaSetDevice inside the capture: begin_round made rank 0's GPU current */
    int ended = CHECK(c, cudaStreamEndCapture(st0, &g));
    c->capturing = 0;
    if (ended || c->failed) {
        if (g) cudaGraphDestroy(g);
        return;
    }
    int slot = bucket_slot(c);
    cudaGraphExec_t *x = &c->execs[slot];
    c->exec_key[slot].valid = 0;
    if (*x) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(*x, g, &info) != cudaSuccess) {
            (void)cudaGetLastError(); /* not sticky: a different topology, made again below */
            cudaGraphExecDestroy(*x);
            *x = NULL;
        }
    }
    if (!*x) CHECK(c, cudaGraphInstantiate(x, g, 0));
    if (*x) CHECK(c, cudaGraphLaunch(*x, st0));
    cudaGraphDestroy(g);
    if (*x && !c->failed && c->keyed) /* a forward's round: the next of its key replays it */
        c->exec_key[slot] = (cuda_exec_key){c->rows, c->wanted, 1, c->logits};
}

int cuda_end_round(muse_backend *be, muse_round_out *out, muse_err *e)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(c->in_round);
    c->in_round = 0;
    memset(out, 0, sizeof *out);
    int64_t t0 = muse_now_ns();
    if (c->capturing) replay(c);
    if (be->fault_pending) { /* test hooks: a real illegal address, caught by the syncs below */
        be->fault_pending = 0;
        muse_k_ctx kc = kctx(on(c, 0), c->rows);
        CHECK(c, muse_k_fault_illegal_address(&kc));
    }
    /* the drawn tokens and the logits back into pinned memory on rank 0's stream, behind every
     * rank's work, then each stream synchronised once: one wait a round where a blocking copy
     * after the waits made two */
    wait_staging(c); /* rank 0's stream behind every other rank's */
    long V = (long)be->model->cfg.vocab_size;
    cuda_rank *r0 = &c->rank[0];
    if (!c->failed && c->do_sample && c->real_wanted)
        CHECK(c, cudaMemcpyAsync(c->h_drawn, r0->d_drawn, (size_t)c->real_wanted * 4,
                                 cudaMemcpyDeviceToHost, r0->st));
    if (!c->failed && c->return_logits && c->logits >= 0 && c->real_wanted)
        CHECK(c, cudaMemcpyAsync(c->h_logits, act_r(c, c->logits, 0),
                                 (size_t)c->real_wanted * (size_t)V * sizeof(float),
                                 cudaMemcpyDeviceToHost, r0->st));
    for (int r = 0; r < c->n_ranks; r++) CHECK(c, cudaStreamSynchronize(on(c, r)->st));
    on(c, 0);
    if (c->failed) return device_error(c, e);
    prof_host(c, PROF_END, t0);
    out->wanted = c->real_wanted;
    out->tokens = c->do_sample ? c->h_drawn : NULL;
    out->logits = c->return_logits && c->logits >= 0 ? c->h_logits : NULL;
    return 0;
}

/* K then V of each sliding layer, positions ascending, between the rings and a slot; each
 * rank its KV heads in its own slot. A layer's window is at most two runs of its ring (a copy
 * a position took 2.4 s for 4096 positions of the one-GPU shape's 48 sliding layers). */
static void sliding_copy(cuda_backend *c, int seq, int64_t end_pos, int slot, int save)
{
    MUSE_CHECK(!c->in_round && slot >= 0 && slot < c->base.opts.snapshot_slots);
    if (c->failed) return;
    const muse_config *cfg = &c->base.model->cfg;
    int64_t first = end_pos > cfg->sliding_window ? end_pos - cfg->sliding_window : 0;
    for (int r = 0; r < c->n_ranks; r++) {
        cuda_rank *rk = on(c, r);
        uint16_t *buf = rk->snapshots + (size_t)slot * (c->base.snapshot_bytes / sizeof *buf);
        long KV = rk->kv_width;
        size_t row = (size_t)KV * sizeof *buf;
        for (int i = 0; i < (int)cfg->num_layers; i++) {
            if (cfg->attn_kind[i] != MUSE_ATTN_SLIDING) continue;
            int64_t cap = c->kv_cap[i], at[2], n[2];
            MUSE_CHECK(end_pos - first <= cap);
            int runs = muse_kv_ring_runs(seq, first, end_pos, cap, at, n);
            for (int kv = 0; kv < 2; kv++) {
                uint16_t *cache = kv ? rk->v_cache[i] : rk->k_cache[i];
                for (int u = 0; u < runs; buf += n[u] * KV, u++) {
                    uint16_t *ring = cache + at[u] * KV;
                    CHECK(c, cudaMemcpyAsync(save ? buf : ring, save ? ring : buf,
                                             (size_t)n[u] * row, cudaMemcpyDeviceToDevice, rk->st));
                }
            }
        }
    }
    for (int r = 0; r < c->n_ranks; r++) CHECK(c, cudaStreamSynchronize(on(c, r)->st));
}

void cuda_snapshot_save(muse_backend *be, int seq, int64_t end_pos, int slot)
{
    sliding_copy(cu(be), seq, end_pos, slot, 1);
}

void cuda_snapshot_load(muse_backend *be, int seq, int64_t end_pos, int slot)
{
    sliding_copy(cu(be), seq, end_pos, slot, 0);
}

/* The bytes floor's yardstick (backend.h): a device-to-device copy of `bytes` on rank 0's stream,
 * timed with events, best of 5 after a warm-up; read + write counted. Self-contained: its
 * buffers and events live only here. */
int cuda_copy_bandwidth(muse_backend *be, size_t bytes, double *bytes_per_s, char *device,
                        size_t device_len, muse_err *e)
{
    cuda_backend *c = cu(be);
    MUSE_CHECK(!c->in_round);
    const int dev = c->rank[0].device; /* rank 0's GPU: every rank's is the same kind */
    const cudaStream_t st = c->rank[0].st;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    struct cudaDeviceProp p;
    float best = 0;
    if (!c->failed && !CHECK(c, cudaSetDevice(dev)) && !CHECK(c, cudaGetDeviceProperties(&p, dev)))
        snprintf(device, device_len, "%s (device %d)", p.name, dev);
    if (!c->failed && !CHECK(c, cudaMalloc(&a, bytes)) && !CHECK(c, cudaMalloc(&b, bytes)) &&
        !CHECK(c, cudaMemsetAsync(a, 1, bytes, st)) && !CHECK(c, cudaEventCreate(&e0)) &&
        !CHECK(c, cudaEventCreate(&e1)))
        for (int i = 0; i < 6; i++) {
            float ms = 0;
            if (CHECK(c, cudaEventRecord(e0, st)) ||
                CHECK(c, cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st)) ||
                CHECK(c, cudaEventRecord(e1, st)) || CHECK(c, cudaEventSynchronize(e1)) ||
                CHECK(c, cudaEventElapsedTime(&ms, e0, e1)))
                break;
            if (i > 0 && (best == 0 || ms < best)) best = ms;
        }
    if (e0) CHECK(c, cudaEventDestroy(e0));
    if (e1) CHECK(c, cudaEventDestroy(e1));
    if (a) CHECK(c, cudaFree(a));
    if (b) CHECK(c, cudaFree(b));
    if (c->failed) return muse_fail(e, "copy bandwidth on device %d (cuda): %s", dev, c->err);
    *bytes_per_s = best > 0 ? 2.0 * (double)bytes / ((double)best * 1e-3) : 0;
    return 0;
}
