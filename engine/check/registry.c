/* The kernel registry's table (check/registry.h): one entry a seam operation. */
#include "check/registry.h"

static const muse_kernel_entry table[] = {
    {MUSE_K_EMBED, "embed", "embed", "kernels/embed.cu", "cpu embed: rms(embed[tokens]), fp32",
     "hidden", 1e-6},
    {MUSE_K_NORM, "norm", "norm", "kernels/norm.cu",
     "cpu norm: rms(x) * (1 | 1+w | w), fp32 or fp16 out", "hidden, each weight mode, fp32/fp16",
     1e-6},
    {MUSE_K_ADD_NORM, "add_norm", "add_norm", "kernels/norm.cu", "cpu add_norm: h += (1+w) rms(y)",
     "hidden", 1e-6},
    {MUSE_K_LINEAR_DENSE, "linear dense", "linear", "kernels/linear.cu",
     "cpu linear, fp16/bf16 weights: fp32 sums in the CPU order",
     "q, k, o, dense gate/down, expert up/down of the pack", 1e-6},
    {MUSE_K_LINEAR_EXL3, "linear exl3", "linear", "kernels/linear.cu",
     "cpu linear, EXL3 trellis weights decoded the CPU's way",
     "q, k, o, dense gate/down, expert up/down of the pack", 1e-6},
    {MUSE_K_LINEAR_EXL3_TILES, "linear exl3 tiles path", "linear",
     "kernels/linear.cu (k_exl3_product_tiles)",
     "the small-M path bitwise (MUSE_EXL3_PATH=tiles vs small); each within the cpu's bound",
     "the EXL3 linears and the moe experts of the pack", 0},
    {MUSE_K_QK_NORM_ROPE, "qk_norm_rope", "qk_norm_rope", "kernels/qk_rope.cu",
     "cpu qk_norm_rope: per-head rms, RoPE NEOX (theta 0: none), fp16",
     "Q and KV widths, a RoPE and a NoPE layer", 1e-6},
    {MUSE_K_ATTN_SLIDING, "kv write + attention sliding", "attention", "kernels/attention.cu",
     "cpu attention: cache write, causal softmax within the window, sigmoid gate",
     "Q, KV of the first sliding layer; prompt and decode", 1e-6},
    {MUSE_K_ATTN_FULL, "kv write + attention full", "attention", "kernels/attention.cu",
     "cpu attention: paged cache write, causal softmax, sigmoid gate",
     "Q, KV of the first full layer; prompt and decode", 1e-6},
    {MUSE_K_SWIGLU, "swiglu", "swiglu", "kernels/swiglu.cu", "cpu swiglu: fp16(silu(g) * u)",
     "dense and expert widths", 1e-6},
    {MUSE_K_MOE, "moe + router", "moe", "kernels/moe.cu",
     "cpu moe: router, top-k (ties to the lower expert), weights, experts, shared experts",
     "hidden of the first moe layer", 1e-6},
    {MUSE_K_HEAD, "head", "head", "kernels/head.cu",
     "cpu head: lm_head, output multiplier, softcap", "hidden x vocab", 1e-6},
    {MUSE_K_SAMPLE, "sample", "sample", "kernels/sample.cu",
     "cpu sample = the host muse_sample (ties to the lower id, NaN never, +inf wins)", "vocab", 0},
    {MUSE_K_ALL_REDUCE, "all_reduce", "all_reduce", "kernels/all_reduce.cu",
     "cpu all_reduce: ranks summed in rank order", "hidden", 0},
    {MUSE_K_FORWARD, "forward plan", "begin_round..end_round", "(every kernel)",
     "the same backend unpadded (exact_rows) and, with graphs, eager launches", "vocab logits", 0},
};

const muse_kernel_entry *muse_kernel_registry(size_t *n)
{
    *n = sizeof table / sizeof *table;
    return table;
}

const muse_kernel_entry *muse_kernel_entry_of(muse_kernel_id id)
{
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (table[i].id == id) return &table[i];
    return NULL;
}

int muse_kernel_rows(long max_rows, long rows[4])
{
    rows[0] = 1;
    rows[1] = 16;
    rows[2] = 17;
    rows[3] = max_rows;
    return 4;
}
