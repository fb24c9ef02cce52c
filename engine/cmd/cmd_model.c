/* muse-engine subcommands that run the model: logits, generate, inspect. */
#include "cmd/cmd_model.h"

#include <math.h>

#include <cjson/cJSON.h>

#include "text/chat.h"
#include "base/flags.h"
#include "serve/openai.h"
#include "text/reply.h"
#include "serve/request.h"
#include "model/forward.h"
#include "text/sampler.h"
#include "tp/follow.h"
#include "tp/rendezvous.h"

typedef struct {
    const char *model, *tokens, *out, *messages, *tokenizer, *config, *codebook, *backend, *gpus;
    const char *kernels_text;
    muse_kernels kernels;
    long long max_tokens, chunk, threads, seed, top_k, ranks, synthetic, bits, from;
    double temperature, top_p, min_p;
    int devices[MUSE_MAX_RANKS]; /* --gpus: each rank's GPU */
    muse_tp_flags tp;            /* --tp-*: one rank of a world of processes */
} run_flags;

static int bad(const char *cmd, const char *msg)
{
    char prog[64];
    snprintf(prog, sizeof prog, "muse-engine %s", cmd);
    return muse_flags_error(&(muse_flags){.prog = prog}, "%s", msg);
}

enum { LOGITS = 1, GENERATE = 2, INSPECT = 4, CHAT = 8, RUN = LOGITS | GENERATE | CHAT };

/* Parses the flags of logits, generate, inspect or chat (cmds picks the command's entries of
 * one table); returns -1 on success, else an exit code. */
static int parse_run_flags(const char *cmd, unsigned cmds, int argc, char **argv, run_flags *f,
                           const char *about)
{
    *f = (run_flags){.max_tokens = 16,
                     .temperature = 0,
                     .top_p = 1,
                     .seed = 0,
                     .ranks = 0, /* not given: 1, or the count of --gpus */
                     .synthetic = -1,
                     .tp = {.rank = -1},
                     .backend = "cpu"};
    const struct {
        unsigned cmds;
        muse_flag flag;
    } all[] = {
        {INSPECT, MUSE_FLAG_S("model", &f->model, "DIR", "the pack", .required = true)},
        {RUN, MUSE_FLAG_S("model", &f->model, "DIR", "the pack (or --synthetic-weights)")},
        {RUN, MUSE_FLAG_L("synthetic-weights", &f->synthetic, 0, INT64_MAX, "SEED",
                          "weights filled from SEED in memory, no pack: the tensors\n"
                          "muse-pack --seed SEED writes for --config",
                          .def = "off")},
        {RUN, MUSE_FLAG_S("config", &f->config, "FILE", "the shape --synthetic-weights fills")},
        {RUN, MUSE_FLAG_L("bits", &f->bits, 0, 8, "B",
                          "--synthetic-weights: EXL3 at B bits (head at 6); 0: fp16")},
        {RUN, MUSE_FLAG_S("codebook", &f->codebook, "mul1|mcg|3inst",
                          "--synthetic-weights: the EXL3 codebook", .def = "mul1")},
        {RUN,
         MUSE_FLAG_S("backend", &f->backend, "cpu|cuda",
                     "where the model runs (cuda: in binaries built with nvcc)", .def = "cpu")},
        {RUN, MUSE_KERNELS_FLAG(&f->kernels_text)},
        {RUN, MUSE_FLAG_L("ranks", &f->ranks, 1, MUSE_MAX_RANKS, "N",
                          "tensor-parallel ranks in this process (sums in rank order);\n"
                          "the config must allow it (heads divisible, splits of 128)",
                          .def = "1, or the count of --gpus")},
        {RUN, MUSE_FLAG_S("gpus", &f->gpus, "LIST",
                          "--backend cuda: the GPU of each rank, comma-separated (0, 0,0, 0,1);\n"
                          "sets --ranks to the count",
                          .def = "every rank on GPU 0")},
        {LOGITS | GENERATE,
         MUSE_FLAG_S("tokens", &f->tokens, "1,2,3", "the prompt's token ids", .required = true)},
        {LOGITS, MUSE_FLAG_S("out", &f->out, "FILE", "where the logits go", .required = true)},
        {LOGITS, MUSE_FLAG_L("from", &f->from, 0, INT64_MAX, "P",
                             "write the rows of positions P.. only (a long prompt's tail;\n"
                             "every position still runs)",
                             .def = "0")},
        {CHAT, MUSE_FLAG_S("messages", &f->messages, "FILE.json",
                           "a messages array, or an object with messages, tools and\n"
                           "reasoning_effort",
                           .required = true)},
        {CHAT, MUSE_FLAG_S("tokenizer", &f->tokenizer, "FILE", "the tokenizer",
                           .def = "DIR/tokenizer.json")},
        {GENERATE | CHAT,
         MUSE_FLAG_L("max-tokens", &f->max_tokens, 0, 1 << 24, "N", "tokens to generate at most")},
        {GENERATE | CHAT,
         MUSE_FLAG_D("temperature", &f->temperature, 0, 2, "T", "0 is greedy; above, sampled")},
        {GENERATE | CHAT,
         MUSE_FLAG_L("top-k", &f->top_k, 0, 1 << 30, "K", "draw among the K likeliest; 0: all")},
        {GENERATE | CHAT, MUSE_FLAG_D("top-p", &f->top_p, 1e-9, 1, "P",
                                      "draw among the likeliest holding probability P")},
        {GENERATE | CHAT, MUSE_FLAG_D("min-p", &f->min_p, 0, 1, "P",
                                      "drop tokens below P times the likeliest's probability")},
        {GENERATE | CHAT,
         MUSE_FLAG_L("seed", &f->seed, 0, INT64_MAX, "S", "the same seed gives the same tokens")},
        {RUN, MUSE_FLAG_L("chunk", &f->chunk, 1, 1 << 20, "N",
                          "rows a forward (the result is bit-identical for every N)",
                          .def = "the whole prompt, at most 4096")},
        {RUN, MUSE_FLAG_L("threads", &f->threads, 0, 1024, "N", "threads for matrix products",
                          .def = "0: one per core")},
    };
    const muse_flag tp[] = {MUSE_TP_FLAG_ENTRIES(&f->tp)}; /* logits and generate */
    muse_flag table[sizeof all / sizeof *all + sizeof tp / sizeof *tp];
    size_t n = 0;
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i].cmds & cmds) table[n++] = all[i].flag;
    for (size_t i = 0; i < sizeof tp / sizeof *tp && (cmds & (LOGITS | GENERATE)); i++)
        table[n++] = tp[i];
    char prog[64];
    snprintf(prog, sizeof prog, "muse-engine %s", cmd);
    const muse_flags set = {.prog = prog, .about = about, .flags = table, .n = n};
    int rc = muse_flags_parse(&set, argc, argv);
    if (rc != MUSE_FLAGS_RUN || !(cmds & RUN)) return rc;
    muse_err we = {{0}};
    if (muse_model_flags_check(f->model, f->synthetic, f->config, f->bits, f->codebook, &we))
        return bad(cmd, we.msg);
    muse_err e = {{0}};
    if (muse_tp_check_flags(&f->tp, f->ranks, &e)) return bad(cmd, e.msg);
    if (muse_tp_on(&f->tp) && strcmp(f->backend, "cpu"))
        return bad(cmd, "--tp-world goes with --backend cpu for now (on CUDA NCCL will carry the "
                        "sums: not built yet)");
    muse_backend_opts o = {0};
    const muse_rank_flags names = {"--gpus", "--ranks", "--backend"};
    if (muse_backend_ranks(&names, f->backend, f->gpus, f->ranks, &o, &e)) return bad(cmd, e.msg);
    if (muse_kernels_parse("--kernels", f->kernels_text, &f->kernels, &e)) return bad(cmd, e.msg);
    f->ranks = o.ranks;
    memcpy(f->devices, o.devices, sizeof f->devices);
    return rc;
}

typedef struct {
    muse_model model;
    muse_backend *be;
    muse_forward *fwd;
    muse_comm *comm; /* --tp-world: the link to the other ranks */
    int32_t *ids;
    size_t n;
} session;

static void session_close(session *s)
{
    muse_forward_destroy(s->fwd);
    muse_backend_destroy(s->be);
    muse_tp_close(s->comm); /* rank 0: the other ranks stop too */
    if (s->model.st) muse_model_free(&s->model);
    free(s->ids);
}

/* Loads the pack, checks the prompt s->ids against it and sizes a one-sequence backend. */
static int session_start(const char *cmd, const run_flags *f, long long extra, session *s)
{
    muse_err e = {{0}};
    muse_synthetic syn = {f->config,   (uint64_t)f->synthetic,      (int)f->bits,
                          f->codebook, !strcmp(f->backend, "cuda"), 0};
    if (f->synthetic >= 0 ? muse_model_synthetic(&syn, &s->model, &e)
                          : muse_model_load(f->model, &s->model, &e)) {
        fprintf(stderr, "muse-engine %s: %s\n", cmd, e.msg);
        return 2;
    }
    const muse_config *c = &s->model.cfg;
    for (size_t i = 0; i < s->n; i++)
        if (s->ids[i] >= c->vocab_size) {
            fprintf(stderr,
                    "muse-engine %s: prompt token %zu (%d) is outside the vocabulary 0 .. %lld\n",
                    cmd, i + 1, s->ids[i], (long long)c->vocab_size - 1);
            return 2;
        }
    long long context = (long long)s->n + extra;
    if (context > c->max_position_embeddings) {
        fprintf(stderr,
                "muse-engine %s: %lld positions exceed max_position_embeddings %lld; shorten "
                "--tokens or --max-tokens\n",
                cmd, context, (long long)c->max_position_embeddings);
        return 2;
    }
    long chunk = f->chunk > 0 ? (long)f->chunk : (long)s->n;
    if (chunk > 4096) chunk = 4096; /* rows a forward; longer prompts go in several */
    muse_backend_opts o = {.max_rows = chunk > 0 ? chunk : 1,
                           .max_seqs = 1,
                           .context = context > 0 ? context : 1,
                           .ranks = (int)f->ranks,
                           .threads = (int)f->threads,
                           .kernels = f->kernels};
    memcpy(o.devices, f->devices, sizeof o.devices);
    if (muse_tp_join(&f->tp, &s->model, &o, &s->comm, &e)) {
        fprintf(stderr, "muse-engine %s: %s\n", cmd, e.msg);
        return 2;
    }
    s->be = muse_backend_create(f->backend, &s->model, &o, &e);
    if (!s->be) {
        fprintf(stderr, "muse-engine %s: %s\n", cmd, e.msg);
        return 2;
    }
    s->fwd = muse_forward_create(s->be);
    muse_tp_lead_forward(s->comm, s->fwd); /* rank 0 of a world: rounds go to the others first */
    return -1;
}

/* A rank other than 0 of a world of processes: replays rank 0's rounds until it stops. */
static int follow_rank0(const char *cmd, const run_flags *f, session *s)
{
    muse_err e = {{0}};
    int rc = muse_tp_follow(s->comm, s->fwd, &e) ? 1 : 0;
    if (rc) fprintf(stderr, "muse-engine %s: rank %lld: %s\n", cmd, f->tp.rank, e.msg);
    session_close(s);
    return rc;
}

static int is_follower(const run_flags *f)
{
    return muse_tp_on(&f->tp) && f->tp.rank > 0;
}

/* session_start with the prompt of --tokens. */
static int session_open(const char *cmd, const run_flags *f, long long extra, session *s)
{
    muse_err e = {{0}};
    memset(s, 0, sizeof *s);
    if (muse_parse_ids("--tokens", f->tokens, &s->ids, &s->n, &e)) return bad(cmd, e.msg);
    return session_start(cmd, f, extra, s);
}

/* Feeds ids[0..n) at positions start.. in chunks of max_rows; calls back each chunk's logits
 * (all_logits) or, with sampling, stores the token drawn after the last id in *drawn. */
typedef int (*chunk_fn)(void *ctx, const float *logits, long rows);
static int feed(session *s, const int32_t *ids, size_t n, int64_t start, int all_logits,
                const muse_sampling *sampling, int32_t *drawn, chunk_fn fn, void *ctx, muse_err *e)
{
    long R = s->be->opts.max_rows;
    int64_t pos[4096];
    int32_t seq[4096] = {0};
    uint8_t want[4096];
    for (size_t at = 0; at < n;) {
        long rows = (long)(n - at) < R ? (long)(n - at) : R;
        if (rows > 4096) rows = 4096;
        for (long r = 0; r < rows; r++) {
            pos[r] = start + (int64_t)(at + (size_t)r);
            want[r] = all_logits || at + (size_t)r == n - 1;
            seq[r] = 0;
        }
        if (muse_kv_ensure(&s->be->kv, 0, pos[rows - 1] + 1))
            return muse_fail(e, "the KV pool has no room for position %lld",
                             (long long)pos[rows - 1]);
        bool last = at + (size_t)rows == n;
        int64_t draw_pos = start + (int64_t)n;
        muse_round b = {.rows = rows,
                        .tokens = ids + at,
                        .positions = pos,
                        .seqs = seq,
                        .want_logits = want,
                        .sampling = sampling && last ? sampling : NULL,
                        .draw_pos = sampling && last ? &draw_pos : NULL,
                        .return_logits = fn != NULL};
        muse_round_out out;
        if (muse_forward_run(s->fwd, &b, &out, e)) return -1;
        if (fn && fn(ctx, out.logits, out.wanted)) return -1;
        if (b.sampling && drawn) *drawn = out.tokens[0];
        at += (size_t)rows;
    }
    return 0;
}

/* logits' --out: the rows of positions from.. of each chunk as it comes */
typedef struct {
    FILE *f;
    size_t V;
    long long seen, from; /* rows passed so far; the first written */
} rows_out;

static int write_rows(void *ctx, const float *logits, long rows)
{
    rows_out *o = ctx;
    long long skip = o->from > o->seen ? o->from - o->seen : 0;
    o->seen += rows;
    if (skip >= rows) return 0;
    size_t n = (size_t)(rows - skip) * o->V;
    return fwrite(logits + (size_t)skip * o->V, sizeof(float), n, o->f) == n ? 0 : -1;
}

static const char logits_about[] =
    "Runs the prompt and writes fp32 little-endian logits: T rows of vocab_size, one per "
    "position.\n";

int muse_cmd_logits(int argc, char **argv)
{
    run_flags f;
    int rc = parse_run_flags("logits", LOGITS, argc, argv, &f, logits_about);
    if (rc >= 0) return rc;
    session s;
    rc = session_open("logits", &f, 0, &s);
    if (rc >= 0) {
        session_close(&s);
        return rc;
    }
    if (is_follower(&f)) return follow_rank0("logits", &f, &s); /* rank 0 writes --out */
    if ((size_t)f.from >= s.n) {
        char msg[128];
        snprintf(msg, sizeof msg, "--from %lld: the prompt has %zu tokens (positions 0..%zu)",
                 f.from, s.n, s.n - 1);
        session_close(&s);
        return bad("logits", msg);
    }
    FILE *out = fopen(f.out, "wb");
    muse_err e = {{0}};
    rows_out ctx = {.f = out, .V = (size_t)s.model.cfg.vocab_size, .from = f.from};
    if (!out) {
        rc = bad("logits", "--out: cannot create the file");
    } else if (feed(&s, s.ids, s.n, 0, 1, NULL, NULL, write_rows, &ctx, &e)) {
        fprintf(stderr, "muse-engine logits: %s\n", e.msg[0] ? e.msg : "write failed");
        rc = 1;
    } else {
        rc = 0;
    }
    if (out && fclose(out) != 0 && rc == 0) rc = bad("logits", "--out: write failed");
    session_close(&s);
    return rc;
}

static bool is_stop(const muse_config *c, int32_t id)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return true;
    return false;
}

/* Reads the prompt, then draws up to --max-tokens tokens one round each; the backend draws
 * where the logits are, keyed by (seed, position of the token drawn). on_token returns 1 to
 * stop. 0, or -1 with e filled. */
static int decode(session *s, const run_flags *f, int (*on_token)(void *ctx, int32_t tok),
                  void *ctx, muse_err *e)
{
    muse_sampling params = {(float)f->temperature, (int)f->top_k, (float)f->top_p, (float)f->min_p,
                            (uint64_t)f->seed};
    int64_t position = (int64_t)s->n;
    int32_t next = 0;
    if (f->max_tokens <= 0) return 0;
    if (feed(s, s->ids, s->n, 0, 0, &params, &next, NULL, NULL, e)) return -1;
    for (long long i = 0; i < f->max_tokens; i++) {
        if (on_token(ctx, next) || i + 1 == f->max_tokens) return 0;
        int32_t tok = next;
        if (feed(s, &tok, 1, position++, 0, &params, &next, NULL, NULL, e)) return -1;
    }
    return 0;
}

typedef struct {
    const muse_config *cfg;
    long long printed;
} gen_print;

/* generate: each id comma-separated as it comes; an eos id ends the run */
static int print_token(void *ctx, int32_t tok)
{
    gen_print *g = ctx;
    printf("%s%d", g->printed++ ? "," : "", tok);
    fflush(stdout);
    return is_stop(g->cfg, tok);
}

/* chat: into the reply parser, which says when the turn has ended */
static int reply_token(void *ctx, int32_t tok)
{
    return muse_reply_push(ctx, tok) != 0;
}

static const char generate_about[] =
    "Prints the generated token ids, comma-separated; stops at an eos id or after N tokens.\n"
    "Temperature 0 (the default) is greedy. The same seed gives the same tokens.\n";

int muse_cmd_generate(int argc, char **argv)
{
    run_flags f;
    int rc = parse_run_flags("generate", GENERATE, argc, argv, &f, generate_about);
    if (rc >= 0) return rc;
    session s;
    rc = session_open("generate", &f, f.max_tokens, &s);
    if (rc >= 0) {
        session_close(&s);
        return rc;
    }
    if (is_follower(&f)) return follow_rank0("generate", &f, &s); /* rank 0 prints */
    muse_err e = {{0}};
    /* the backend draws where the logits are: keyed by (seed, position of the token drawn) */
    gen_print gp = {&s.model.cfg, 0};
    rc = decode(&s, &f, print_token, &gp, &e) ? 1 : 0;
    printf("\n");
    if (rc) fprintf(stderr, "muse-engine generate: %s\n", e.msg);
    session_close(&s);
    return rc;
}

static const char inspect_about[] =
    "Prints the config, parameters (total and active per token), bytes by dtype, KV bytes per\n"
    "token and each layer's kind.\n";

static void print_config(const muse_config *c)
{
    printf("model_type          muse_spark\n");
    printf("vocab_size          %lld\n", (long long)c->vocab_size);
    printf("hidden_size         %lld\n", (long long)c->hidden_size);
    printf("layers              %lld\n", (long long)c->num_layers);
    printf("heads q/kv/dim      %lld / %lld / %lld\n", (long long)c->n_heads,
           (long long)c->n_kv_heads, (long long)c->head_dim);
    printf("sliding_window      %lld\n", (long long)c->sliding_window);
    printf("experts             %lld, %lld a token, width %lld, shared %lld\n",
           (long long)c->num_experts, (long long)c->num_experts_per_tok,
           (long long)c->moe_intermediate_size, (long long)c->num_shared_experts);
    printf("dense width         %lld\n", (long long)c->intermediate_size);
    printf("routing             scale %g, norm_topk_prob %s, expert_output_norm %s\n",
           c->routed_scaling_factor, c->norm_topk_prob ? "true" : "false",
           c->expert_output_norm ? "true" : "false");
    printf("eps                 rms %g, post %g\n", c->rms_norm_eps, c->post_norm_eps);
    printf("qk_scale_factor     %g\n", c->qk_scale_factor);
    printf("head                softcap %g, multiplier %g, tied %s\n", c->final_logit_softcapping,
           c->output_multiplier, c->tie_word_embeddings ? "true" : "false");
    printf("context             %lld\n", (long long)c->max_position_embeddings);
    printf("eos                ");
    for (int i = 0; i < c->n_eos; i++) printf(" %lld", (long long)c->eos_ids[i]);
    printf("\n");
    if (c->quantized)
        printf("quantization        exl3, %g bits, head %g bits, codebook %s\n", c->quant_bits,
               c->quant_head_bits, c->quant_codebook);
}

/* What the backend really allocates: full layers in pool blocks, sliding layers in rings. */
static void print_kv_pool(const muse_model *m)
{
    const muse_config *c = &m->cfg;
    muse_err e = {{0}};
    muse_backend_opts o = {
        .max_rows = 1, .max_seqs = 1, .context = MUSE_KV_BLOCK, .threads = 1, .kv_blocks = 1};
    muse_backend *be = muse_backend_create("cpu", m, &o, &e);
    if (!be) return;
    uint64_t theory_full = muse_kv_full_bytes_per_token(c);
    printf("kv pool a token     %llu (full-attention layers, paged in blocks of %d); theory %llu\n",
           (unsigned long long)(be->kv_block_bytes / MUSE_KV_BLOCK), MUSE_KV_BLOCK,
           (unsigned long long)theory_full);
    printf("kv sliding a stream %llu (sliding layers: a ring of sliding_window + rows a round - 1\n"
           "                    positions; this figure is for 1 row a round)\n",
           (unsigned long long)((muse_kv_bytes_per_token(c) - theory_full) *
                                (uint64_t)c->sliding_window));
    muse_backend_destroy(be);
}

int muse_cmd_inspect(int argc, char **argv)
{
    run_flags f;
    int rc = parse_run_flags("inspect", INSPECT, argc, argv, &f, inspect_about);
    if (rc >= 0) return rc;
    muse_err e = {{0}};
    muse_model m;
    if (muse_model_load(f.model, &m, &e)) {
        fprintf(stderr, "muse-engine inspect: %s\n", e.msg);
        return 2;
    }
    const muse_config *c = &m.cfg;
    print_config(c);
    printf("parameters          %llu total, %llu active a token\n",
           (unsigned long long)m.params_total, (unsigned long long)m.params_active);
    uint64_t by[MUSE_DT_COUNT] = {0};
    for (size_t i = 0; i < muse_st_count(m.st); i++)
        by[muse_st_at(m.st, i)->dtype] += muse_st_at(m.st, i)->nbytes;
    printf("bytes by dtype     ");
    for (int d = 0; d < MUSE_DT_COUNT; d++)
        if (by[d]) printf(" %s %llu", muse_dtype_name((muse_dtype)d), (unsigned long long)by[d]);
    printf("\n");
    printf("kv bytes a token    %llu (fp16 K and V, all layers, in theory)\n",
           (unsigned long long)muse_kv_bytes_per_token(c));
    print_kv_pool(&m);
    for (int64_t i = 0; i < c->num_layers; i++) {
        const muse_layer *ly = &m.layers[i];
        printf("layer %-4lld         %s%s, %s, %s", (long long)i,
               c->attn_kind[i] == MUSE_ATTN_FULL ? "full" : "sliding",
               c->rope_theta_layer[i] == 0 ? " NoPE" : " RoPE",
               c->mlp_kind[i] == MUSE_MLP_DENSE ? "dense" : "moe",
               ly->q.kind == MUSE_LIN_EXL3 ? "exl3" : "fp");
        if (ly->q.kind == MUSE_LIN_EXL3) printf(" %d bits", ly->q.exl3.bits);
        printf("\n");
    }
    printf("lm_head             %s",
           m.head.kind == MUSE_LIN_EXL3 ? "exl3" : (m.head.w == m.embed ? "tied" : "fp"));
    if (m.head.kind == MUSE_LIN_EXL3)
        printf(" %d bits, %lld rows", m.head.exl3.bits, (long long)m.head.n);
    printf("\n");
    muse_model_free(&m);
    return 0;
}

/* ---- chat: render, generate, parse ---- */

typedef struct {
    cJSON *msg; /* the OpenAI message being built */
    muse_buf content, reasoning;
    cJSON *calls;
    const char *finish;
} chat_out;

static void chat_event(void *ctx, const muse_reply_ev *ev)
{
    chat_out *o = ctx;
    switch (ev->kind) {
    case MUSE_EV_REASONING:
        muse_buf_add(&o->reasoning, ev->text, ev->len);
        break;
    case MUSE_EV_CONTENT:
        if (ev->unsplit) o->reasoning.len = 0; /* the whole turn is content */
        muse_buf_add(&o->content, ev->text, ev->len);
        break;
    case MUSE_EV_TOOL_CALL:
        if (!o->calls) o->calls = cJSON_CreateArray();
        cJSON_AddItemToArray(o->calls, muse_oa_tool_call(ev->call_id, ev->name, ev->arguments));
        break;
    case MUSE_EV_FINISH:
        o->finish = ev->finish_reason;
        break;
    }
}

static const char chat_about[] =
    "Renders the messages in the Muse chat format, generates until a stop id (or N tokens, "
    "default\n"
    "16), and prints the parsed reply as an OpenAI assistant message (content, reasoning_content,\n"
    "tool_calls) with finish_reason. FILE.json is a messages array, or an object with messages,\n"
    "tools and reasoning_effort. The tokenizer defaults to DIR/tokenizer.json.\n";

/* Reads --messages into the renderer's ids; 0 or an exit code. */
static int chat_prompt(const run_flags *f, const muse_tokenizer *tok, session *s, char ***fn,
                       size_t *nfn)
{
    muse_err e = {{0}};
    char *text;
    size_t len;
    if (muse_read_file(f->messages, 64 << 20, &text, &len, &e)) return bad("chat", e.msg);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *messages =
        cJSON_IsArray(root) ? root : cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *tools =
        cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "tools") : NULL;
    const char *effort =
        cJSON_IsObject(root)
            ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort"))
            : NULL;
    if (!cJSON_IsArray(messages)) {
        cJSON_Delete(root);
        return bad("chat",
                   "--messages: the file must hold a JSON messages array or an object with one");
    }
    muse_chat_ids ids;
    muse_chat_render r = {0};
    int rc = muse_chat_ids_from_tokenizer(tok, &ids, &e) ||
             muse_chat_render_messages(messages, tools, effort, &ids, &r, &e) ||
             muse_chat_render_tokens(&r, tok, &s->ids, &s->n, &e);
    if (!rc && r.nfn) {
        *fn = MUSE_CALLOC(r.nfn, sizeof **fn);
        for (size_t i = 0; i < r.nfn; i++) (*fn)[i] = strdup(r.fn_names[i]);
        *nfn = r.nfn;
    }
    muse_chat_render_free(&r);
    cJSON_Delete(root);
    if (rc) {
        fprintf(stderr, "muse-engine chat: --messages: %s\n", e.msg);
        return 2;
    }
    return 0;
}

int muse_cmd_chat(int argc, char **argv)
{
    run_flags f;
    int rc = parse_run_flags("chat", CHAT, argc, argv, &f, chat_about);
    if (rc >= 0) return rc;
    char tokpath[4096];
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", f.model);
    muse_err e = {{0}};
    muse_tokenizer *tok = NULL;
    if (muse_tokenizer_load(f.tokenizer ? f.tokenizer : tokpath, &tok, &e)) {
        fprintf(stderr, "muse-engine chat: %s\n", e.msg);
        return 2;
    }
    session s;
    memset(&s, 0, sizeof s);
    char **fn = NULL;
    size_t nfn = 0;
    rc = chat_prompt(&f, tok, &s, &fn, &nfn);
    /* the tokenizer must fit the model: its ids go straight into the embedding */
    int64_t tok_vocab = muse_tokenizer_vocab_size(tok);
    if (rc == 0) rc = session_start("chat", &f, f.max_tokens, &s);
    if (rc < 0 && tok_vocab > s.model.cfg.vocab_size) {
        fprintf(stderr,
                "muse-engine chat: the tokenizer has %lld ids but config.json's vocab_size is "
                "%lld; use the pack's own tokenizer.json\n",
                (long long)tok_vocab, (long long)s.model.cfg.vocab_size);
        rc = 2;
    }
    if (rc >= 0) goto out;
    chat_out o = {0};
    muse_reply_config rcfg = {.function_names = (const char *const *)fn,
                              .nfunction_names = nfn,
                              .parallel_tool_calls = 1,
                              .call_id_seed = (uint64_t)f.seed,
                              .token_bytes = muse_tokenizer_text_bytes,
                              .token_ctx = tok,
                              .emit = chat_event,
                              .emit_ctx = &o};
    int32_t eos[MUSE_MAX_EOS];
    for (int i = 0; i < s.model.cfg.n_eos; i++) eos[i] = (int32_t)s.model.cfg.eos_ids[i];
    rcfg.stop_ids = eos;
    rcfg.nstop_ids = (size_t)s.model.cfg.n_eos;
    muse_reply *reply = NULL;
    if (muse_chat_ids_from_tokenizer(tok, &rcfg.ids, &e) || muse_reply_create(&rcfg, &reply, &e)) {
        fprintf(stderr, "muse-engine chat: %s\n", e.msg);
        rc = 2;
        goto out;
    }
    rc = decode(&s, &f, reply_token, reply, &e) ? 1 : 0;
    muse_reply_finish(reply, "length");
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "role", "assistant");
    muse_buf_add(&o.content, "", 0);
    cJSON_AddStringToObject(msg, "content", o.content.p);
    if (o.reasoning.len) cJSON_AddStringToObject(msg, "reasoning_content", o.reasoning.p);
    if (o.calls) cJSON_AddItemToObject(msg, "tool_calls", o.calls);
    cJSON_AddStringToObject(msg, "finish_reason", o.finish ? o.finish : "length");
    char *json = cJSON_Print(msg);
    puts(json);
    free(json);
    cJSON_Delete(msg);
    free(o.content.p);
    free(o.reasoning.p);
    muse_reply_destroy(reply);
    if (rc) fprintf(stderr, "muse-engine chat: %s\n", e.msg);
out:
    for (size_t i = 0; i < nfn; i++) free(fn[i]);
    free(fn);
    session_close(&s);
    muse_tokenizer_free(tok);
    return rc;
}
