/* The config-only weights estimate (plan_weights.h): every Linear's share of a rank by
 * muse_shard_range_cfg, plus the replicated tensors, in the bytes the pack stores. */
#include "model/plan_weights.h"

#include "model/shard.h"

typedef struct {
    const muse_config *c;
    double bits; /* 0: fp16 */
    int rank, ranks;
    double bytes;
} plan_job;

/* One Linear k -> n of role: the part rank holds, in stored bytes. */
static void add_linear(plan_job *j, muse_lin_role role, int64_t k, int64_t n, double bits)
{
    muse_linear_kind kind = bits > 0 ? MUSE_LIN_EXL3 : MUSE_LIN_DENSE;
    if (kind == MUSE_LIN_EXL3) n = (n + 127) / 128 * 128; /* EXL3 pads n to 128 (synthetic.c) */
    int input = role == MUSE_ROLE_O || role == MUSE_ROLE_MLP_OUT;
    int64_t lo, hi;
    muse_shard_range_cfg(j->c, role, kind, input ? k : n, j->rank, j->ranks, &lo, &hi);
    if (input)
        k = hi - lo;
    else
        n = hi - lo;
    if (kind == MUSE_LIN_DENSE)
        j->bytes += (double)k * (double)n * 2.0;
    else /* trellis at bits a weight, fp16 suh [k] and svh [n] */
        j->bytes += (double)k * (double)n * bits / 8.0 + 2.0 * (double)(k + n);
}

static void add_mlp(plan_job *j, int64_t H, int64_t I)
{
    add_linear(j, MUSE_ROLE_MLP_IN, H, I, j->bits);
    add_linear(j, MUSE_ROLE_MLP_IN, H, I, j->bits);
    add_linear(j, MUSE_ROLE_MLP_OUT, I, H, j->bits);
}

uint64_t muse_plan_weights_rank(const muse_config *c, double bits, double head_bits, int rank,
                                int ranks)
{
    plan_job j = {c, bits, rank, ranks > 1 ? ranks : 1, 0};
    int64_t H = c->hidden_size, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    double h = (double)H;
    j.bytes += (double)c->vocab_size * h * 2.0 + h * 2.0; /* embeddings, final norm */
    for (int64_t i = 0; i < c->num_layers; i++) {
        j.bytes += 4.0 * h * 2.0; /* the four block norms */
        add_linear(&j, MUSE_ROLE_Q, H, Q, bits);
        add_linear(&j, MUSE_ROLE_K, H, KV, bits);
        add_linear(&j, MUSE_ROLE_V, H, KV, bits);
        add_linear(&j, MUSE_ROLE_GATE, H, Q, bits);
        add_linear(&j, MUSE_ROLE_O, Q, H, bits);
        if (c->mlp_kind[i] == MUSE_MLP_DENSE) {
            add_mlp(&j, H, c->intermediate_size);
            continue;
        }
        double E = (double)c->num_experts;
        j.bytes += E * h * 2.0 + E * 4.0; /* router [E, H] fp16 and its fp32 bias */
        if (c->expert_output_norm) j.bytes += E * h * 2.0;
        for (int64_t x = 0; x < c->num_experts; x++) add_mlp(&j, H, c->moe_intermediate_size);
        if (c->num_shared_experts > 0)
            add_mlp(&j, H, c->num_shared_experts * c->moe_intermediate_size);
    }
    /* a tied head is a view of the embeddings, already counted */
    if (!c->tie_word_embeddings)
        add_linear(&j, MUSE_ROLE_HEAD, H, c->vocab_size, bits > 0 ? head_bits : 0);
    return (uint64_t)j.bytes;
}
