#!/usr/bin/python3
"""Trains the demo muse_spark model (PyTorch) and exports it as a Hugging Face fp16 pack.

The forward is design/MUSE_SPARK.md's with every feature on: sliding (RoPE) and full (NoPE)
layers, GQA, q/k norms, the attention output gate, sandwich (1+w) norms, a dense MLP layer and
MoE layers (sigmoid router, selection bias kept by aux-loss-free balancing, top-k, renormalised
and scaled weights, expert output norms, a shared expert), output multiplier and softcap.
`exact=True` adds the spec's fp16 rounding points (for the saved reference logits).

    train_demo.py train --data DIR --out PACK [--steps N] [--seed S] [--device cuda]
    train_demo.py logits --model PACK --ids parity.json --out FILE.npy

`train` reads t/tools/demo_data.py's DIR (train.bin, heldout.bin, tokenizer.json), writes PACK
(model.safetensors, config.json, generation_config.json, tokenizer.json) and PACK/train_log.json.
`logits` loads a pack (fp16, or EXL3 through t/ref/exl3_ref.py) into the same model and writes
the fp32 logits of the ids (exact mode) as .npy.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = {
    "architectures": ["MuseSparkForCausalLM"],
    "model_type": "muse_spark",
    "torch_dtype": "float16",
    "vocab_size": 8192,
    "hidden_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention", "sliding_attention", "full_attention"],
    "sliding_window": 64,
    "rope_theta": 10000,
    "layer_rope_theta": [10000, 10000, 0, 10000, 10000, 0],
    "rms_norm_eps": 1e-5,
    "post_norm_eps": 1e-5,
    "qk_scale_factor": 1.0,
    "mlp_layer_types": ["dense", "moe", "moe", "dense", "moe", "moe"],
    "intermediate_size": 512,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "num_shared_experts": 1,
    "routed_scaling_factor": 2.0,
    "norm_topk_prob": True,
    "expert_output_norm": True,
    "final_logit_softcapping": 30.0,
    "output_multiplier": 0.5,
    "tie_word_embeddings": False,
    "bos_token_id": 8186,
    "eos_token_id": [8187, 8189],
    "max_position_embeddings": 4096,
}


def r16(x, exact):
    """One fp16 rounding point of the precision contract (exact mode only)."""
    return x.half().float() if exact else x


def rms(x, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rope_neox(x, theta):
    """x [B, T, heads, D]: dimension d pairs with d + D/2, angle p * theta^(-2j/D)."""
    T, D = x.shape[1], x.shape[-1]
    half = D // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64, device=x.device) / D)
    ang = torch.arange(T, dtype=torch.float64, device=x.device)[:, None] * inv[None, :]
    cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class MuseSpark(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        H, V, D = c["hidden_size"], c["vocab_size"], c["head_dim"]
        Hq, Hkv, L = c["num_attention_heads"], c["num_key_value_heads"], c["num_hidden_layers"]
        E, I, Id = c["num_experts"], c["moe_intermediate_size"], c["intermediate_size"]
        P = torch.nn.Parameter
        self.embed = P(torch.randn(V, H) * 0.02)
        self.layers = torch.nn.ModuleList()
        for i in range(L):
            m = torch.nn.Module()
            for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                      "post_feedforward_layernorm"):
                setattr(m, n, P(torch.zeros(H)))
            m.q = P(torch.randn(Hq * D, H) * H ** -0.5)
            m.k = P(torch.randn(Hkv * D, H) * H ** -0.5)
            m.v = P(torch.randn(Hkv * D, H) * H ** -0.5)
            m.g = P(torch.randn(Hq * D, H) * H ** -0.5)
            m.o = P(torch.randn(H, Hq * D) * (Hq * D) ** -0.5 / math.sqrt(2 * L))
            if c["mlp_layer_types"][i] == "dense":
                m.wg = P(torch.randn(Id, H) * H ** -0.5)
                m.wu = P(torch.randn(Id, H) * H ** -0.5)
                m.wd = P(torch.randn(H, Id) * Id ** -0.5 / math.sqrt(2 * L))
            else:
                m.router = P(torch.randn(E, H) * H ** -0.5)
                m.register_buffer("bias", torch.zeros(E))
                m.eg = P(torch.randn(E, I, H) * H ** -0.5)
                m.eu = P(torch.randn(E, I, H) * H ** -0.5)
                m.ed = P(torch.randn(E, H, I) * I ** -0.5 / math.sqrt(2 * L))
                m.enorm = P(torch.zeros(E, H))
                S = I * c["num_shared_experts"]
                m.sg = P(torch.randn(S, H) * H ** -0.5)
                m.su = P(torch.randn(S, H) * H ** -0.5)
                m.sd = P(torch.randn(H, S) * S ** -0.5 / math.sqrt(2 * L))
            self.layers.append(m)
        self.norm = P(torch.ones(H))
        self.head = P(torch.randn(V, H) * H ** -0.5)

    def mlp(self, b, wg, wu, wd, exact):
        gate = r16(b @ wg.t(), exact)
        up = r16(b @ wu.t(), exact)
        return r16(F.silu(gate) * up, exact) @ wd.t()

    def attention(self, i, m, a, exact):
        c = self.c
        B, T, _ = a.shape
        D, Hq, Hkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        eps = c["rms_norm_eps"]
        q = rms(r16(a @ m.q.t(), exact).view(B, T, Hq, D), eps)
        k = rms(r16(a @ m.k.t(), exact).view(B, T, Hkv, D), eps)
        v = r16(a @ m.v.t(), exact).view(B, T, Hkv, D)
        g = r16(a @ m.g.t(), exact)
        theta = c["layer_rope_theta"][i]
        if theta:
            q, k = rope_neox(q, theta), rope_neox(k, theta)
        q, k = r16(q, exact), r16(k, exact)
        rep = Hq // Hkv
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        pos = torch.arange(T, device=a.device)
        mask = pos[None, :] <= pos[:, None]
        if c["layer_types"][i] == "sliding_attention":
            mask &= pos[None, :] > pos[:, None] - c["sliding_window"]
        scale = c["qk_scale_factor"] / math.sqrt(D)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        if exact or not hasattr(F, "scaled_dot_product_attention"):  # fp32, as the spec says
            s = (qh.float() @ kh.float().transpose(-1, -2)) * scale
            s = s.masked_fill(~mask, float("-inf"))
            o = torch.softmax(s, dim=-1) @ vh.float()
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh.to(qh.dtype), attn_mask=mask, scale=scale)
        o = o.transpose(1, 2).reshape(B, T, Hq * D)
        o = r16(o * torch.sigmoid(g), exact)
        return o @ m.o.t()

    def moe(self, m, b, exact, stats):
        c = self.c
        E, k = c["num_experts"], c["num_experts_per_tok"]
        with torch.autocast(b.device.type, enabled=False):  # fp32 router, also under autocast
            s = torch.sigmoid(b.float() @ m.router.float().t())
        key = s + m.bias
        sel = torch.topk(key, k, dim=-1).indices
        w = torch.gather(s, -1, sel)
        if c["norm_topk_prob"]:
            w = w / w.sum(-1, keepdim=True)
        w = w * c["routed_scaling_factor"]
        full = torch.zeros_like(s).scatter(-1, sel, w)  # [B, T, E], 0 for unselected
        if stats is not None:
            stats.append(torch.zeros_like(s).scatter(-1, sel, 1.0).flatten(0, -2).mean(0))
        gate = r16(torch.einsum("bth,eih->btei", b, m.eg), exact)
        up = r16(torch.einsum("bth,eih->btei", b, m.eu), exact)
        z = torch.einsum("btei,ehi->bteh", r16(F.silu(gate) * up, exact), m.ed)
        if c["expert_output_norm"]:
            z = rms(z, c["rms_norm_eps"]) * (1.0 + m.enorm)
        y = (full.unsqueeze(-1) * z.float()).sum(-2)
        if c["num_shared_experts"]:
            y = y + self.mlp(b, m.sg, m.su, m.sd, exact).float()
        return y

    def forward(self, ids, exact=False, stats=None, drop=0.0):
        c = self.c
        eps, peps = c["rms_norm_eps"], c["post_norm_eps"]
        h = rms(self.embed[ids], eps)
        for i, m in enumerate(self.layers):
            a = r16(rms(h, eps) * (1.0 + m.input_layernorm), exact)
            attn = self.attention(i, m, a, exact)
            h = h + F.dropout(rms(attn, peps) * (1.0 + m.post_attention_layernorm), drop, self.training)
            b = r16(rms(h, eps) * (1.0 + m.pre_feedforward_layernorm), exact)
            if c["mlp_layer_types"][i] == "dense":
                y = self.mlp(b, m.wg, m.wu, m.wd, exact)
            else:
                y = self.moe(m, b, exact, stats)
            h = h + F.dropout(rms(y, peps) * (1.0 + m.post_feedforward_layernorm), drop, self.training)
        x = r16(rms(h, eps) * self.norm, exact)
        z = (x @ self.head.t()).float() * c["output_multiplier"]
        T = c["final_logit_softcapping"]
        return T * torch.tanh(z / T) if T > 0 else z

    # ------------------------------------------------------------ HF names

    def hf_tensors(self):
        """{HF name: fp16/fp32 numpy array}, as muse-pack names them."""
        c, out = self.c, {}

        def put(name, t, dtype=np.float16):
            out[name] = t.detach().float().cpu().numpy().astype(dtype)

        put("model.embed_tokens.weight", self.embed)
        for i, m in enumerate(self.layers):
            p = f"model.layers.{i}."
            for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                      "post_feedforward_layernorm"):
                put(p + n + ".weight", getattr(m, n))
            for n, t in (("q", m.q), ("k", m.k), ("v", m.v), ("gate", m.g), ("o", m.o)):
                put(p + f"self_attn.{n}_proj.weight", t)
            if c["mlp_layer_types"][i] == "dense":
                for n, t in (("gate", m.wg), ("up", m.wu), ("down", m.wd)):
                    put(p + f"mlp.{n}_proj.weight", t)
                continue
            put(p + "mlp.router.weight", m.router)
            put(p + "mlp.router.e_score_correction_bias", m.bias, np.float32)
            for e in range(c["num_experts"]):
                for n, t in (("gate", m.eg[e]), ("up", m.eu[e]), ("down", m.ed[e])):
                    put(p + f"mlp.experts.{e}.{n}_proj.weight", t)
                put(p + f"mlp.experts.{e}.output_norm.weight", m.enorm[e])
            for n, t in (("gate", m.sg), ("up", m.su), ("down", m.sd)):
                put(p + f"mlp.shared_experts.{n}_proj.weight", t)
        put("model.norm.weight", self.norm)
        put("lm_head.weight", self.head)
        return out

    def load_hf(self, get):
        """Sets every parameter from get(HF name) -> fp32 array (the inverse of hf_tensors)."""
        c = self.c

        def set_(t, name):
            with torch.no_grad():
                t.copy_(torch.from_numpy(np.array(get(name), np.float32)).reshape(t.shape))

        set_(self.embed, "model.embed_tokens.weight")
        for i, m in enumerate(self.layers):
            p = f"model.layers.{i}."
            for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                      "post_feedforward_layernorm"):
                set_(getattr(m, n), p + n + ".weight")
            for n, t in (("q", m.q), ("k", m.k), ("v", m.v), ("gate", m.g), ("o", m.o)):
                set_(t, p + f"self_attn.{n}_proj.weight")
            if c["mlp_layer_types"][i] == "dense":
                for n, t in (("gate", m.wg), ("up", m.wu), ("down", m.wd)):
                    set_(t, p + f"mlp.{n}_proj.weight")
                continue
            set_(m.router, p + "mlp.router.weight")
            set_(m.bias, p + "mlp.router.e_score_correction_bias")
            for e in range(c["num_experts"]):
                for n, t in (("gate", m.eg[e]), ("up", m.eu[e]), ("down", m.ed[e])):
                    set_(t, p + f"mlp.experts.{e}.{n}_proj.weight")
                set_(m.enorm[e], p + f"mlp.experts.{e}.output_norm.weight")
            for n, t in (("gate", m.sg), ("up", m.su), ("down", m.sd)):
                set_(t, p + f"mlp.shared_experts.{n}_proj.weight")
        set_(self.norm, "model.norm.weight")
        set_(self.head, "lm_head.weight")


def write_safetensors(path, tensors):
    """A safetensors file (own writer: 8-byte header length, JSON header, data)."""
    names = sorted(tensors)
    header, off = {}, 0
    for n in names:
        a = tensors[n]
        dt = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}[a.dtype]
        header[n] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for n in names:
            f.write(np.ascontiguousarray(tensors[n]).astype(tensors[n].dtype.newbyteorder("<")).tobytes())


def write_shards(out, tensors, shards):
    """model.safetensors, or `shards` files by bytes with model.safetensors.index.json."""
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        return
    names = sorted(tensors)
    total = sum(tensors[n].nbytes for n in names)
    groups, acc = [[] for _ in range(shards)], 0
    for n in names:
        groups[min(shards - 1, acc * shards // total)].append(n)
        acc += tensors[n].nbytes
    weight_map = {}
    for i, g in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(out, fname), {n: tensors[n] for n in g})
        weight_map.update({n: fname for n in g})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def read_u16(path):
    return np.fromfile(path, dtype="<u2").astype(np.int64)


def batches(data, seq, batch, gen):
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq + 1)[None, :]
    return data[idx]


def evaluate(model, data, seq, device, windows=64):
    """Mean next-token loss over fixed, evenly spaced windows of held-out data."""
    model.eval()
    step = max(1, (len(data) - seq - 1) // windows)
    losses = []
    with torch.no_grad():
        for s in range(0, windows, 16):
            x = torch.stack([data[j * step: j * step + seq + 1] for j in range(s, min(windows, s + 16))]).to(device)
            with autocast(device):
                logits = model(x[:, :-1])
            losses.append(F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="sum").item())
    model.train()
    return sum(losses) / (windows * seq)


def autocast(device):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def cmd_train(a):
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    dev = a.device
    if dev.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    train = torch.from_numpy(read_u16(os.path.join(a.data, "train.bin")))
    held = torch.from_numpy(read_u16(os.path.join(a.data, "heldout.bin")))
    c = dict(CONFIG)
    model = MuseSpark(c).to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "enorm" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "enorm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    moe_layers = [m for i, m in enumerate(model.layers) if c["mlp_layer_types"][i] == "moe"]
    log, best, best_state = [], float("inf"), None
    t0 = time.time()
    print(f"params {sum(p.numel() for p in model.parameters())/1e6:.2f}M, train tokens {len(train)}, "
          f"heldout tokens {len(held)}", flush=True)
    for step in range(1, a.steps + 1):
        lr = a.lr * min(1.0, step / a.warmup)
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / a.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batches(train, a.seq, a.batch, gen).to(dev, non_blocking=True)
        stats = []
        with autocast(dev):
            logits = model(x[:, :-1], stats=stats, drop=a.dropout)
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # aux-loss-free balancing: raise the bias of under-used experts
            for m, load in zip(moe_layers, stats):
                m.bias += a.bias_rate * torch.sign(load.mean() - load)
        if step % a.log_every == 0 or step == a.steps:
            entry = {"step": step, "loss": round(loss.item(), 4), "lr": lr, "s": round(time.time() - t0, 1)}
            if step % a.eval_every == 0 or step == a.steps:
                entry["heldout"] = round(evaluate(model, held, a.seq, dev), 4)
                if entry["heldout"] < best:
                    best = entry["heldout"]
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                    entry["best"] = True
            log.append(entry)
            print(json.dumps(entry), flush=True)
        if a.time_limit and time.time() - t0 > a.time_limit:
            print(f"time limit {a.time_limit}s reached at step {step}", flush=True)
            break
    train_s = time.time() - t0
    if best_state is not None:
        model.load_state_dict(best_state)
    model = model.cpu().float()
    os.makedirs(a.out, exist_ok=True)
    tensors = model.hf_tensors()
    write_shards(a.out, tensors, a.shards)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": c["bos_token_id"], "eos_token_id": c["eos_token_id"]}, f, indent=2)
        f.write("\n")
    if not a.no_tokenizer_copy:
        with open(os.path.join(a.data, "tokenizer.json"), "rb") as src, \
                open(os.path.join(a.out, "tokenizer.json"), "wb") as dst:
            dst.write(src.read())
    # The saved model's own held-out loss, in fp32 with the fp16 weights (what the pack holds).
    model.load_hf(lambda n: tensors[n])
    held_loss = evaluate(model, held, a.seq, "cpu", windows=16)
    summary = {"seed": a.seed, "steps": a.steps, "batch": a.batch, "seq": a.seq, "lr": a.lr,
               "train_s": round(train_s, 1), "best_heldout": best, "final_train_loss": log[-1]["loss"],
               "fp16_heldout_16win": round(held_loss, 4), "torch": torch.__version__,
               "device": torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu",
               "log": log}
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "log"}), flush=True)
    return 0


def load_pack(path):
    """The model with a pack's weights (EXL3 Linears dequantized by t/ref/exl3_ref.py)."""
    sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
    sys.dont_write_bytecode = True
    import exl3_ref
    import muse_ref

    st = muse_ref.SafeTensors(path)
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)

    def get(name):
        if name.endswith(".weight") and st.has(name[: -len(".weight")] + ".trellis"):
            key = name[: -len(".weight")]
            w = exl3_ref.dequantize(st.get, key)  # k x n (y = x W), n maybe padded
            return np.asarray(w, np.float32).T[: (c["vocab_size"] if key == "lm_head" else None)]
        return np.asarray(st.get(name), np.float32)

    model = MuseSpark(c)
    model.load_hf(get)
    return model.eval()


def cmd_logits(a):
    with open(a.ids) as f:
        ids = json.load(f)["ids"]
    model = load_pack(a.model)
    with torch.no_grad():
        z = model(torch.tensor([ids]), exact=not a.plain)[0]
    np.save(a.out, z.float().numpy())
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=1600)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seq", type=int, default=512)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--wd", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=200)
    t.add_argument("--dropout", type=float, default=0.2)
    t.add_argument("--bias-rate", type=float, default=1e-3)
    t.add_argument("--seed", type=int, default=15)
    t.add_argument("--device", default="cuda")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--time-limit", type=float, default=450, help="stop after this many seconds")
    t.add_argument("--shards", type=int, default=2, help="safetensors files (2 keep each under 16 MB)")
    t.add_argument("--no-tokenizer-copy", action="store_true", help="leave tokenizer.json out of --out")
    lg = sub.add_parser("logits")
    lg.add_argument("--model", required=True)
    lg.add_argument("--ids", required=True, help="JSON with an \"ids\" list (demo_data.py's parity.json)")
    lg.add_argument("--out", required=True)
    lg.add_argument("--plain", action="store_true", help="no fp16 rounding points")
    a = ap.parse_args(argv)
    return cmd_train(a) if a.command == "train" else cmd_logits(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
