/* The cases of the backend seam at a pack's widths and their deterministic inputs (op_cases.h),
 * shared by the kernel checker and `muse-bench kernels`. */
#include "check/op_cases.h"

#include <math.h>

#include "base/muse_common.h"

muse_act muse_op_act(muse_op_acts *s, long width, int slot)
{
    for (int i = 0; i < s->n_widths; i++)
        if (s->widths[i] == width) return s->acts[i][slot];
    MUSE_CHECK(s->n_widths < MUSE_OP_MAX_W);
    s->widths[s->n_widths] = width;
    for (int k = 0; k < MUSE_OP_SLOTS; k++)
        s->acts[s->n_widths][k] = s->be->ops->alloc(s->be, s->be->opts.max_rows, width);
    return s->acts[s->n_widths++][slot];
}

uint64_t muse_op_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void muse_op_fill_row(uint64_t seed, int64_t id, long width, int round16, float *dst)
{
    for (long j = 0; j < width; j++) {
        uint64_t h = muse_op_mix(seed * 1000003u + (uint64_t)id * 65537u + (uint64_t)j);
        float v = (float)((double)(h >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        if (fabsf(v) < 0.05f) v = v < 0 ? -0.5f : 0.5f; /* never zero */
        dst[j] = round16 ? muse_round_f16(v) : v;
    }
}

void muse_op_write_inputs(muse_op_acts *s, muse_act a, uint64_t seed, const int64_t *ids, long M,
                          long W, int round16)
{
    float *x = MUSE_MALLOC((size_t)(M * W) * sizeof *x);
    for (long r = 0; r < M; r++) muse_op_fill_row(seed, ids[r], W, round16, x + r * W);
    s->be->ops->write(s->be, a, x, M);
    free(x);
}

static int add_case(muse_op_case *cs, int n, const char *name, muse_kernel_id kid, long in_w,
                    long out_w, const void *arg, long param)
{
    MUSE_CHECK(n < MUSE_OP_MAX_CASES);
    muse_op_case *k = &cs[n];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    k->kid = kid;
    k->in_width = in_w;
    k->out_width = out_w;
    k->arg = arg;
    k->param = param;
    return n + 1;
}

/* One case a linear shape: a linear with the kind, k, n, bits and rounding of an earlier case
 * runs the same kernel on the same bytes, so it adds nothing. */
static int linear_case(muse_op_case *cs, int n, const muse_linear *l, int round16)
{
    int exl3 = l->kind == MUSE_LIN_EXL3;
    for (int i = 0; i < n; i++) {
        const muse_linear *o = cs[i].arg;
        if ((cs[i].kid == MUSE_K_LINEAR_EXL3 || cs[i].kid == MUSE_K_LINEAR_DENSE) &&
            o->kind == l->kind && o->k == l->k && o->n == l->n && cs[i].param == round16 &&
            (!exl3 || o->exl3.bits == l->exl3.bits))
            return n;
    }
    char name[96];
    const char *tail = strrchr(l->key, '.');
    const char *shortkey = tail ? tail + 1 : l->key;
    snprintf(name, sizeof name, "linear %s %.24s %lldx%lld%s", exl3 ? "exl3" : "dense", shortkey,
             (long long)l->k, (long long)l->n, round16 ? " fp16 out" : "");
    return add_case(cs, n, name, exl3 ? MUSE_K_LINEAR_EXL3 : MUSE_K_LINEAR_DENSE, (long)l->k,
                    (long)l->n, l, round16);
}

/* gate and up (fp16 out), then down, of an MLP */
static int mlp_cases(muse_op_case *cs, int n, const muse_mlp *p)
{
    n = linear_case(cs, n, &p->gate, 1);
    n = linear_case(cs, n, &p->up, 1);
    return linear_case(cs, n, &p->down, 0);
}

/* qk_norm_rope of q and of k alone, then the attention (its own q, k rope, kv write) of layer i */
static int attention_cases(const muse_model *m, muse_op_case *cs, int n, int i)
{
    const muse_config *c = &m->cfg;
    long Q = (long)(c->n_heads * c->head_dim), KV = (long)(c->n_kv_heads * c->head_dim);
    int full = c->attn_kind[i] == MUSE_ATTN_FULL;
    char name[96];
    snprintf(name, sizeof name, "qk_norm_rope q layer %d (%s)", i,
             c->rope_theta_layer[i] ? "RoPE" : "NoPE");
    n = add_case(cs, n, name, MUSE_K_QK_NORM_ROPE, Q, Q, NULL, i);
    snprintf(name, sizeof name, "qk_norm_rope k layer %d", i);
    n = add_case(cs, n, name, MUSE_K_QK_NORM_ROPE, KV, KV, NULL, i);
    snprintf(name, sizeof name, "kv write + attention layer %d (%s)", i, full ? "full" : "sliding");
    return add_case(cs, n, name, full ? MUSE_K_ATTN_FULL : MUSE_K_ATTN_SLIDING, Q, Q, NULL, i);
}

/* The list's convention (ops.h): an entry whose widths are "hidden" and has no case above is
 * one case at the hidden width, named as the entry, so a simple op needs no line here. */
static int hidden_cases(muse_op_case *cs, int n, long H)
{
    size_t n_reg;
    const muse_kernel_entry *reg = muse_kernel_registry(&n_reg);
    for (size_t r = 0; r < n_reg; r++) {
        int have = !strcmp(reg[r].widths, "hidden") && muse_op_run_of(reg[r].id) ? 0 : 1;
        for (int i = 0; i < n && !have; i++) have = cs[i].kid == reg[r].id;
        if (!have) n = add_case(cs, n, reg[r].name, reg[r].id, H, H, NULL, 0);
    }
    return n;
}

int muse_op_cases(const muse_model *m, muse_op_case *cs)
{
    const muse_config *c = &m->cfg;
    long H = (long)c->hidden_size;
    int n = 0, moe_done = 0, dense_done = 0, full_done = 0, slide_done = 0;
    n = add_case(cs, n, "embed", MUSE_K_EMBED, H, H, NULL, 0);
    static const char *modes[] = {"none", "1+w", "w"};
    for (long mode = 0; mode < 6; mode++) {
        char name[96];
        snprintf(name, sizeof name, "norm %s%s width %ld", modes[mode % 3],
                 mode >= 3 ? " fp16" : "", H);
        n = add_case(cs, n, name, MUSE_K_NORM, H, H, &m->layers[0].input_norm, mode);
    }
    n = add_case(cs, n, "add_norm", MUSE_K_ADD_NORM, H, H, &m->layers[0].post_attn_norm, 0);
    n = add_case(cs, n, "add_norm + norm (1+w, fp16)", MUSE_K_ADD_NORM_NORM, H, 2 * H,
                 &m->layers[0].post_attn_norm, 0);
    const muse_layer *l0 = &m->layers[0];
    long qkvg = (long)(l0->q.n + l0->k.n + l0->v.n + l0->gate.n);
    n = add_case(cs, n, "linears q, k, v, gate of layer 0", MUSE_K_LINEARS, (long)l0->q.k, qkvg, l0,
                 0);
    const muse_mlp *first = NULL; /* the first dense MLP, else the first expert */
    for (int i = 0; i < (int)c->num_layers && !first; i++)
        if (c->mlp_kind[i] == MUSE_MLP_DENSE) first = &m->layers[i].dense;
    for (int i = 0; i < (int)c->num_layers && !first; i++)
        if (c->mlp_kind[i] == MUSE_MLP_MOE) first = &m->layers[i].experts[0];
    if (first) {
        char name[96];
        snprintf(name, sizeof name, "gate/up %lldx%lld + swiglu", (long long)first->gate.k,
                 (long long)first->gate.n);
        n = add_case(cs, n, name, MUSE_K_SWIGLU_LINEAR, (long)first->gate.k, (long)first->gate.n,
                     first, 0);
    }
    const muse_linear *attn[] = {&l0->q, &l0->k, &l0->v, &l0->gate};
    for (int i = 0; i < 4; i++) n = linear_case(cs, n, attn[i], 1);
    n = linear_case(cs, n, &l0->o, 0);
    for (int i = 0; i < (int)c->num_layers; i++) {
        const muse_layer *ly = &m->layers[i];
        char name[96];
        if (c->attn_kind[i] == MUSE_ATTN_FULL ? !full_done++ : !slide_done++)
            n = attention_cases(m, cs, n, i);
        if (c->mlp_kind[i] == MUSE_MLP_DENSE && !dense_done++) {
            n = mlp_cases(cs, n, &ly->dense);
            snprintf(name, sizeof name, "swiglu width %lld", (long long)c->intermediate_size);
            n = add_case(cs, n, name, MUSE_K_SWIGLU, (long)c->intermediate_size,
                         (long)c->intermediate_size, NULL, 0);
        }
        if (c->mlp_kind[i] == MUSE_MLP_MOE && !moe_done++) {
            n = mlp_cases(cs, n, &ly->experts[0]);
            if (c->num_shared_experts > 0) n = mlp_cases(cs, n, &ly->shared);
            snprintf(name, sizeof name, "swiglu width %lld", (long long)c->moe_intermediate_size);
            n = add_case(cs, n, name, MUSE_K_SWIGLU, (long)c->moe_intermediate_size,
                         (long)c->moe_intermediate_size, NULL, 0);
            snprintf(name, sizeof name, "moe + router layer %d (%lld experts, top %lld)", i,
                     (long long)c->num_experts, (long long)c->num_experts_per_tok);
            n = add_case(cs, n, name, MUSE_K_MOE, H, H, ly, 0);
        }
    }
    n = hidden_cases(cs, n, H);
    n = add_case(cs, n, "head", MUSE_K_HEAD, H, (long)c->vocab_size, &m->head, 0);
    n = add_case(cs, n, "sample", MUSE_K_SAMPLE, (long)c->vocab_size, 1, NULL, 0);
    return n;
}
