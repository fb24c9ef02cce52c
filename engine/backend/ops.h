/* The one list of the seam: the round operations (the slots of muse_backend_ops, backend.h)
 * and the kernels that implement them (the registry's rows, engine/check/, the profile names
 * of a device backend, the check and bench dispatch and kernels/CONTRACT.md's table). A new or
 * fused operation is a line in each list here, its wrapper in each backend and its case record
 * in engine/check/op_run.c (docs/gpu.md, "Adding a kernel"). Included by backend.h only. */
#ifndef MUSE_BACKEND_OPS_H
#define MUSE_BACKEND_OPS_H

/* The most linears that share one input in one `linears` call (q, k, v, gate of a layer). */
#define MUSE_MAX_FUSED 4

/* X(name, parameters, what it computes). Shapes: R rows of the round, H hidden, Q, KV, I. */
#define MUSE_ROUND_OPS(X)                                                                          \
    X(embed, (muse_backend * be, muse_act out),                                                    \
      "out[R,H] = rms(embed[tokens], eps), fp32 (the residual stream)")                            \
    X(norm,                                                                                        \
      (muse_backend * be, muse_act x, long width, const muse_vec *w, muse_norm_weight mode,        \
       float eps, int round16, muse_act out),                                                      \
      "out[R,W] = rms(x, eps) * (w | 1+w | 1), rounded to fp16 when round16")                      \
    X(add_norm,                                                                                    \
      (muse_backend * be, muse_act h, muse_act y, long width, const muse_vec *w, float eps),       \
      "h[R,H] += (1 + w) * rms(y, eps)")                                                           \
    X(add_norm_norm,                                                                               \
      (muse_backend * be, muse_act h, muse_act y, long width, const muse_vec *w, float eps,        \
       const muse_vec *next_w, muse_norm_weight next_mode, float next_eps, muse_act out),          \
      "add_norm, then out[R,H] = fp16(rms(h, next_eps) * (next_w | 1+next_w | 1)): the norm "      \
      "that follows, fused")                                                                       \
    X(linear, (muse_backend * be, const muse_linear *l, muse_act x, int round16, muse_act y),      \
      "y[R,n] = x[R,k] W, fp32 sums; rounded to fp16 when round16. A rank's shard of W")           \
    X(linears,                                                                                     \
      (muse_backend * be, int n, const muse_linear *const *ls, muse_act x, int round16,            \
       const muse_act *ys),                                                                        \
      "ys[i][R,n_i] = x[R,k] W_i for i < n <= MUSE_MAX_FUSED linears of one input (q, k, v, "      \
      "gate), each as linear computes it")                                                         \
    X(swiglu_linear,                                                                               \
      (muse_backend * be, const muse_linear *gate, const muse_linear *up, muse_act x, muse_act g,  \
       muse_act u, muse_act out),                                                                  \
      "out[R,I] = fp16(silu(fp16(x Wg)) * fp16(x Wu)): gate and up with swiglu as their "          \
      "epilogue; g, u [R,I] are scratch a backend may use")                                        \
    X(qk_norm_rope,                                                                                \
      (muse_backend * be, muse_act x, long heads, long head_dim, double theta, float eps),         \
      "per head: unweighted rms (eps), RoPE NEOX at each row's position (theta 0: none), fp16")    \
    X(attention,                                                                                   \
      (muse_backend * be, int layer, muse_act q, muse_act k, muse_act v, muse_act g, muse_act o),  \
      "q, k as qk_norm_rope (the layer's theta), writes k, v [R,KV] to the layer's cache, then "   \
      "o[R,Q] = softmax(q k^T * scale) v, causal, sliding when window > 0, then o = fp16(o * "     \
      "sigmoid(g)); padding rows skip the write and get zeros")                                    \
    X(swiglu, (muse_backend * be, muse_act gate, muse_act up, long width, muse_act out),           \
      "out[R,W] = fp16(silu(gate) * up)")                                                          \
    X(moe, (muse_backend * be, const muse_layer *ly, muse_act b, muse_act y),                      \
      "y[R,H] = routed experts (router, selection, weights, outputs) + shared experts")            \
    X(all_reduce, (muse_backend * be, muse_act x, long width),                                     \
      "x[R,W] = the sum over ranks of every rank's x, in rank order (one rank: nothing)")          \
    X(head, (muse_backend * be, muse_act x, muse_act logits),                                      \
      "logits[N,V] of the wanted rows of x[R,H] (already normed): head, multiplier, softcap")      \
    X(sample, (muse_backend * be, muse_act logits),                                                \
      "draws wanted row i's token from logits row i with the round's sampling[i]")

/* The fast path's default bound for an entry: rel L2 against the exact path on the same device
 * of 5e-4 where the output is rounded to fp16, 2e-5 where it is fp32. */
#define MUSE_TOL_BY_OUTPUT (-1.0)

/* K(ID, name, op, kernel files, fast kernel files or NULL (the fast path runs the exact one),
 *   the CPU reference it must equal, the widths it is checked at, exact bound (rel L2 against
 *   the CPU; 0 bitwise), fast bound (rel L2 against the exact path; 0 bitwise;
 *   MUSE_TOL_BY_OUTPUT), its case record run_<name> in engine/check/op_run.c (NULL: a check of
 *   its own)). Widths exactly "hidden" and no case written in op_cases.c: one case at the
 *   hidden width, named as the entry, made from this line alone. */
#define MUSE_KERNELS(K)                                                                            \
    K(EMBED, "embed", "embed", "kernels/embed.cu", "kernels/embed_fast.cu",                        \
      "cpu embed: rms(embed[tokens]), fp32", "hidden", 1e-6, MUSE_TOL_BY_OUTPUT, embed)            \
    K(NORM, "norm", "norm", "kernels/norm.cu", "kernels/norm_fast.cu",                             \
      "cpu norm: rms(x) * (1 | 1+w | w), fp32 or fp16 out", "hidden, each weight mode, fp32/fp16", \
      1e-6, MUSE_TOL_BY_OUTPUT, norm)                                                              \
    K(ADD_NORM, "add_norm", "add_norm", "kernels/norm.cu", "kernels/norm_fast.cu",                 \
      "cpu add_norm: h += (1+w) rms(y)", "hidden", 1e-6, MUSE_TOL_BY_OUTPUT, add_norm)             \
    K(ADD_NORM_NORM, "add_norm + norm", "add_norm_norm", "kernels/norm.cu (add_norm, norm)",       \
      "kernels/norm_fast.cu (one launch)", "cpu add_norm then norm (1+w, fp16 out)", "hidden",     \
      1e-6, MUSE_TOL_BY_OUTPUT, add_norm_norm)                                                     \
    K(LINEAR_DENSE, "linear dense", "linear", "kernels/linear.cu", NULL,                           \
      "cpu linear, fp16/bf16 weights: fp32 sums in the CPU order",                                 \
      "q, k, o, dense gate/down, expert up/down of the pack", 1e-6, MUSE_TOL_BY_OUTPUT, linear)    \
    K(LINEAR_EXL3, "linear exl3", "linear", "kernels/linear.cu", "kernels/linear_fast.cu",         \
      "cpu linear, EXL3 trellis weights decoded the CPU's way",                                    \
      "q, k, o, dense gate/down, expert up/down of the pack", 1e-6, MUSE_TOL_BY_OUTPUT, linear)    \
    K(LINEAR_EXL3_TILES, "linear exl3 tiles path", "linear",                                       \
      "kernels/linear.cu (k_exl3_product_tiles)", NULL,                                            \
      "the small-M path bitwise (MUSE_EXL3_PATH=tiles vs small); each within the cpu's bound",     \
      "the EXL3 linears and the moe experts of the pack", 0, 0, NULL)                              \
    K(LINEARS, "linears of one input", "linears", "kernels/linear.cu (a linear each)",             \
      "kernels/linear_fast.cu", "cpu linear of each, in turn", "q, k, v, gate of layer 0", 1e-6,   \
      MUSE_TOL_BY_OUTPUT, linears)                                                                 \
    K(SWIGLU_LINEAR, "gate/up + swiglu", "swiglu_linear", "kernels/linear.cu, kernels/swiglu.cu",  \
      "kernels/linear_fast.cu", "cpu linear gate, linear up (fp16 out), swiglu",                   \
      "the first dense or expert MLP", 1e-6, MUSE_TOL_BY_OUTPUT, swiglu_linear)                    \
    K(QK_NORM_ROPE, "qk_norm_rope", "qk_norm_rope", "kernels/qk_rope.cu",                          \
      "kernels/qk_rope_fast.cu",                                                                   \
      "cpu qk_norm_rope: per-head rms, RoPE NEOX (theta 0: none), fp16",                           \
      "Q and KV widths, a RoPE and a NoPE layer", 1e-6, MUSE_TOL_BY_OUTPUT, qk)                    \
    K(ATTN_SLIDING, "kv write + attention sliding", "attention",                                   \
      "kernels/qk_rope.cu, kernels/attention.cu",                                                  \
      "kernels/qk_rope_fast.cu, kernels/attention_fast.cu",                                        \
      "cpu attention: q, k norm + rope, cache write, causal softmax in the window, sigmoid gate",  \
      "Q, KV of the first sliding layer; prompt and decode", 1e-6, MUSE_TOL_BY_OUTPUT, attention)  \
    K(ATTN_FULL, "kv write + attention full", "attention",                                         \
      "kernels/qk_rope.cu, kernels/attention.cu",                                                  \
      "kernels/qk_rope_fast.cu, kernels/attention_fast.cu",                                        \
      "cpu attention: q, k norm + rope, paged cache write, causal softmax, sigmoid gate",          \
      "Q, KV of the first full layer; prompt and decode", 1e-6, MUSE_TOL_BY_OUTPUT, attention)     \
    K(SWIGLU, "swiglu", "swiglu", "kernels/swiglu.cu", "kernels/swiglu_fast.cu",                   \
      "cpu swiglu: fp16(silu(g) * u)", "dense and expert widths", 1e-6, MUSE_TOL_BY_OUTPUT,        \
      swiglu)                                                                                      \
    K(MOE, "moe + router", "moe", "kernels/moe.cu",                                                \
      "kernels/moe_fast.cu, kernels/linear_fast.cu, kernels/moe_combine_fast.cu",                  \
      "cpu moe: router, top-k (ties to the lower expert), weights, experts, shared experts",       \
      "hidden of the first moe layer", 1e-6, 2e-4, moe)                                            \
    K(HEAD, "head", "head", "kernels/head.cu", NULL,                                               \
      "cpu head: lm_head, output multiplier, softcap", "hidden x vocab", 1e-6, MUSE_TOL_BY_OUTPUT, \
      head)                                                                                        \
    K(SAMPLE, "sample", "sample", "kernels/sample.cu", "kernels/sample_fast.cu",                   \
      "cpu sample = the host muse_sample_masked (ties to the lower id, NaN never, +inf wins, a "   \
      "masked token -inf)",                                                                        \
      "vocab", 0, 0, sample)                                                                       \
    K(ALL_REDUCE, "all_reduce", "all_reduce", "kernels/all_reduce.cu", NULL,                       \
      "cpu all_reduce: ranks summed in rank order", "hidden", 0, 0, all_reduce)                    \
    K(FORWARD, "forward plan", "begin_round..end_round", "(every kernel)", NULL,                   \
      "the same backend unpadded (exact_rows), chunked, and with graphs, eager launches",          \
      "vocab logits", 0, 0, NULL)

#endif
