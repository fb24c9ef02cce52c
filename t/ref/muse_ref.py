#!/usr/bin/python3
"""Independent NumPy model of the muse_spark forward pass (design/MUSE_SPARK.md).

Written from the spec alone, to check the engine against: it reads a pack directory
(config.json + safetensors) and computes fp32 logits for every position of a token list,
rounding to fp16 exactly at the spec's rounding points. Usage:

    muse_ref.py logits --model DIR --tokens 1,2,3 --out FILE

FILE gets T x vocab_size fp32 little-endian values (the engine's `muse-engine logits` format).
"""
import argparse
import json
import os
import sys

import numpy as np

# ---------------------------------------------------------------- safetensors

_DTYPES = {
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to fp32 on read
    "F32": np.dtype("<f4"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
}


class SafeTensors:
    """Tensors of one pack directory: model.safetensors or the shards of its index."""

    def __init__(self, model_dir):
        self.entries = {}  # name -> (path, dtype string, shape, begin, end)
        self._maps = {}
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for name in files:
            self._read_header(os.path.join(model_dir, name))

    def _read_header(self, path):
        with open(path, "rb") as f:
            size_bytes = f.read(8)
            if len(size_bytes) != 8:
                raise ValueError(f"{path}: shorter than the 8-byte safetensors header length")
            header_len = int.from_bytes(size_bytes, "little")
            file_len = os.fstat(f.fileno()).st_size
            if header_len > file_len - 8:
                raise ValueError(f"{path}: header length {header_len} exceeds the file")
            header = json.loads(f.read(header_len))
        data_start = 8 + header_len
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = info["dtype"]
            if dtype not in _DTYPES:
                raise ValueError(f"{path}: tensor {name} has unsupported dtype {dtype}")
            begin, end = info["data_offsets"]
            shape = tuple(info["shape"])
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if end - begin != count * _DTYPES[dtype].itemsize or data_start + end > file_len:
                raise ValueError(f"{path}: tensor {name} offsets do not match its shape")
            self.entries[name] = (path, dtype, shape, data_start + begin, data_start + end)

    def _map(self, path):
        if path not in self._maps:
            self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        return self._maps[path]

    def has(self, name):
        return name in self.entries

    def get(self, name):
        """The tensor as a numpy array (BF16 widened to fp32), or None when absent."""
        if name not in self.entries:
            return None
        path, dtype, shape, begin, end = self.entries[name]
        raw = self._map(path)[begin:end]
        arr = np.frombuffer(raw, dtype=_DTYPES[dtype]).reshape(shape)
        if dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr


# ---------------------------------------------------------------- config

_REQUIRED = object()


class Config:
    """config.json fields with the spec's defaults; text_config wins over top level."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            raw = json.load(f)
        fields = dict(raw)
        fields.update(raw.get("text_config") or {})
        self.raw = fields

        def field(name, default=_REQUIRED):
            if name in fields and fields[name] is not None:
                return fields[name]
            if default is _REQUIRED:
                raise ValueError(f"config.json: missing required field {name}")
            return default

        if field("model_type") != "muse_spark":
            raise ValueError("config.json: model_type must be muse_spark")
        self.vocab_size = int(field("vocab_size"))
        self.hidden = int(field("hidden_size"))
        self.layers = int(field("num_hidden_layers"))
        self.heads_q = int(field("num_attention_heads"))
        self.heads_kv = int(field("num_key_value_heads"))
        self.head_dim = int(field("head_dim", self.hidden // self.heads_q))
        self.layer_types = list(field("layer_types"))
        self.sliding_window = fields.get("sliding_window")
        if "sliding_attention" in self.layer_types:
            self.sliding_window = int(field("sliding_window"))
        self.rope_theta = float(field("rope_theta", 500000.0))
        self.layer_rope_theta = [float(t) for t in field("layer_rope_theta", [self.rope_theta] * self.layers)]
        self.rms_norm_eps = float(field("rms_norm_eps", 1e-5))
        self.post_norm_eps = float(field("post_norm_eps", self.rms_norm_eps))
        self.qk_scale_factor = float(field("qk_scale_factor", 1.0))
        self.mlp_layer_types = list(field("mlp_layer_types", ["moe"] * self.layers))
        if "dense" in self.mlp_layer_types:
            self.intermediate_size = int(field("intermediate_size"))
        self.num_experts = int(field("num_experts"))
        self.top_k = int(field("num_experts_per_tok", 8))
        self.moe_intermediate_size = int(field("moe_intermediate_size"))
        self.num_shared_experts = int(field("num_shared_experts", 0))
        self.routed_scaling_factor = float(field("routed_scaling_factor", 1.0))
        self.norm_topk_prob = bool(field("norm_topk_prob", True))
        self.expert_output_norm = bool(field("expert_output_norm", False))
        self.softcap = float(field("final_logit_softcapping", 0.0))
        self.output_multiplier = float(field("output_multiplier", 1.0))
        self.tie_word_embeddings = bool(field("tie_word_embeddings", False))
        for name in ("layer_types", "layer_rope_theta", "mlp_layer_types"):
            if len(getattr(self, name)) != self.layers:
                raise ValueError(f"config.json: {name} needs num_hidden_layers entries")
        if self.heads_q % self.heads_kv:
            raise ValueError("config.json: num_attention_heads must be a multiple of num_key_value_heads")


# ---------------------------------------------------------------- math helpers


def f16(x):
    """Round to fp16 and back: one rounding point of the precision contract."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def rms(x, eps):
    """x * rsqrt(mean(x^2) + eps) over the last axis (fp64 inside, fp32 out)."""
    x64 = np.asarray(x, dtype=np.float64)
    scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return (x64 * scale).astype(np.float32)


def sigmoid(x):
    return (1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))).astype(np.float32)


def silu(x):
    x64 = np.asarray(x, dtype=np.float64)
    return (x64 / (1.0 + np.exp(-x64))).astype(np.float32)


# ---------------------------------------------------------------- model


class Model:
    def __init__(self, model_dir, accumulate=np.float64):
        # accumulate=np.float32 changes only the dense matmul sums: the gap between the two
        # modes shows how far fp16 rounding flips alone move the logits (the noise floor).
        self.accumulate = accumulate
        self.cfg = Config(model_dir)
        self.st = SafeTensors(model_dir)
        if self.st.has("model.language_model.embed_tokens.weight"):
            self.prefix = "model.language_model."
        else:
            self.prefix = "model."
        self._cache = {}

    def get(self, name):
        """Any tensor by full name, as numpy (the `get` handed to exl3_ref)."""
        return self.st.get(name)

    def weight(self, name):
        """A small tensor under the model prefix as fp32 (cached)."""
        full = self.prefix + name
        if full not in self._cache:
            arr = self.st.get(full)
            if arr is None:
                raise KeyError(f"missing tensor {full}")
            self._cache[full] = np.asarray(arr, dtype=np.float32)
        return self._cache[full]

    def linear(self, key, x):
        """y = x W for Linear `key` (full name): EXL3 when key.trellis exists, else dense HF."""
        if self.st.has(key + ".trellis"):
            _ref_dir = os.path.dirname(os.path.abspath(__file__))
            if _ref_dir not in sys.path:
                sys.path.insert(0, _ref_dir)
            import exl3_ref  # noqa: E402  (lazy: only EXL3 packs need it)

            return np.asarray(exl3_ref.exl3_linear(self.get, key, np.asarray(x, np.float32)), np.float32)
        w = self.st.get(key + ".weight")
        if w is None:
            raise KeyError(f"missing tensor {key}.weight (nor {key}.trellis)")
        w = np.asarray(w, dtype=self.accumulate)
        if w.ndim != 2 or w.shape[1] != x.shape[-1]:
            raise ValueError(f"{key}.weight shape {w.shape} does not take {x.shape[-1]} inputs")
        return (np.asarray(x, self.accumulate) @ w.T).astype(np.float32)

    def head_key(self):
        for key in ("lm_head", self.prefix + "lm_head"):
            if self.st.has(key + ".weight") or self.st.has(key + ".trellis"):
                return key
        if self.cfg.tie_word_embeddings:
            return self.prefix + "embed_tokens"
        raise KeyError("missing tensor lm_head.weight and tie_word_embeddings is false")

    # ------------------------------------------------------------ blocks

    def mlp(self, key, b):
        """(silu(b Wg) * (b Wu)) Wd; gate, up and their product rounded to fp16."""
        gate = f16(self.linear(key + ".gate_proj", b))
        up = f16(self.linear(key + ".up_proj", b))
        return self.linear(key + ".down_proj", f16(silu(gate) * up))

    def attention(self, i, a, trace):
        cfg = self.cfg
        T = a.shape[0]
        D, Hq, Hkv = cfg.head_dim, cfg.heads_q, cfg.heads_kv
        key = f"{self.prefix}layers.{i}.self_attn."
        q = f16(self.linear(key + "q_proj", a)).reshape(T, Hq, D)
        k = f16(self.linear(key + "k_proj", a)).reshape(T, Hkv, D)
        v = f16(self.linear(key + "v_proj", a)).reshape(T, Hkv, D)
        g = f16(self.linear(key + "gate_proj", a))
        q = rms(q, cfg.rms_norm_eps)
        k = rms(k, cfg.rms_norm_eps)
        theta = cfg.layer_rope_theta[i]
        if theta != 0.0:
            q = rope_neox(q, theta)
            k = rope_neox(k, theta)
        q, k = f16(q), f16(k)
        if trace is not None:
            trace[f"layer{i}.q"], trace[f"layer{i}.k"], trace[f"layer{i}.v"] = q, k, v
        kv_of_q = np.arange(Hq) // (Hq // Hkv)
        kh, vh = k[:, kv_of_q, :], v[:, kv_of_q, :]  # [T, Hq, D]
        scale = cfg.qk_scale_factor / np.sqrt(D)
        scores = np.einsum("ihd,jhd->hij", q.astype(np.float64), kh.astype(np.float64)) * scale
        pos = np.arange(T)
        visible = pos[None, :] <= pos[:, None]
        if cfg.layer_types[i] == "sliding_attention":
            visible &= pos[None, :] >= pos[:, None] - cfg.sliding_window + 1
        elif cfg.layer_types[i] != "full_attention":
            raise ValueError(f"config.json: layer_types[{i}] {cfg.layer_types[i]!r} unknown")
        scores = np.where(visible[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", p, vh.astype(np.float64)).reshape(T, Hq * D).astype(np.float32)
        o = f16(o * sigmoid(g))
        return self.linear(key + "o_proj", o)

    def route(self, i, b):
        """Selected experts [T, k] and their weights [T, k] (fp32 router on the fp16 b)."""
        cfg = self.cfg
        router = self.weight(f"layers.{i}.mlp.router.weight")
        r = (b.astype(np.float64) @ router.T.astype(np.float64)).astype(np.float32)
        s = sigmoid(r)
        bias_name = f"{self.prefix}layers.{i}.mlp.router.e_score_correction_bias"
        bias = self.st.get(bias_name)
        select_key = s if bias is None else (s + np.asarray(bias, np.float32)).astype(np.float32)
        order = np.argsort(-select_key, axis=-1, kind="stable")  # ties: lower index first
        chosen = order[:, : cfg.top_k]
        w = np.take_along_axis(s, chosen, axis=-1).astype(np.float32)
        if cfg.norm_topk_prob:
            w = (w / w.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float32)
        w = (w * np.float32(cfg.routed_scaling_factor)).astype(np.float32)
        return chosen, w

    def moe(self, i, b, trace):
        cfg = self.cfg
        chosen, w = self.route(i, b)
        if trace is not None:
            trace[f"layer{i}.experts"], trace[f"layer{i}.routing_weights"] = chosen, w
        y = np.zeros(b.shape, dtype=np.float32)
        for e in range(cfg.num_experts):  # ascending expert index: the fixed sum order
            rows, slot = np.nonzero(chosen == e)
            if rows.size == 0:
                continue
            key = f"{self.prefix}layers.{i}.mlp.experts.{e}"
            z = self.mlp(key, b[rows])
            if cfg.expert_output_norm:
                z = rms(z, cfg.rms_norm_eps) * (1.0 + self.weight(f"layers.{i}.mlp.experts.{e}.output_norm.weight"))
            y[rows] = (y[rows] + w[rows, slot][:, None] * z.astype(np.float32)).astype(np.float32)
        if cfg.num_shared_experts > 0:
            y = (y + self.mlp(f"{self.prefix}layers.{i}.mlp.shared_experts", b)).astype(np.float32)
        return y

    # ------------------------------------------------------------ forward

    def forward(self, tokens, trace=None):
        """Logits [T, vocab_size] fp32 for every position; `trace` (dict) gets intermediates."""
        cfg = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0 or tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
            raise ValueError(f"tokens must be a non-empty list of ids in [0, {cfg.vocab_size})")
        embed = self.st.get(self.prefix + "embed_tokens.weight")
        h = rms(np.asarray(embed[tokens], dtype=np.float32), cfg.rms_norm_eps)
        for i in range(cfg.layers):
            pre = f"layers.{i}."
            a = f16(rms(h, cfg.rms_norm_eps) * (1.0 + self.weight(pre + "input_layernorm.weight")))
            attn = self.attention(i, a, trace)
            h = (h + rms(attn, cfg.post_norm_eps) * (1.0 + self.weight(pre + "post_attention_layernorm.weight"))).astype(np.float32)
            b = f16(rms(h, cfg.rms_norm_eps) * (1.0 + self.weight(pre + "pre_feedforward_layernorm.weight")))
            if cfg.mlp_layer_types[i] == "dense":
                y = self.mlp(f"{self.prefix}layers.{i}.mlp", b)
            elif cfg.mlp_layer_types[i] == "moe":
                y = self.moe(i, b, trace)
            else:
                raise ValueError(f"config.json: mlp_layer_types[{i}] {cfg.mlp_layer_types[i]!r} unknown")
            h = (h + rms(y, cfg.post_norm_eps) * (1.0 + self.weight(pre + "post_feedforward_layernorm.weight"))).astype(np.float32)
            if trace is not None:
                trace[f"layer{i}.attn"], trace[f"layer{i}.mlp"], trace[f"layer{i}.h"] = attn, y, h
        x = f16(rms(h, cfg.rms_norm_eps) * self.weight("norm.weight"))
        z = self.linear(self.head_key(), x)[:, : cfg.vocab_size].astype(np.float64)
        z = z * cfg.output_multiplier
        if cfg.softcap > 0:
            z = cfg.softcap * np.tanh(z / cfg.softcap)
        return z.astype(np.float32)


def rope_neox(x, theta):
    """NEOX rotary on [T, heads, D]: dimension d pairs with d + D/2, angle = p * theta^(-2j/D)."""
    T, _, D = x.shape
    half = D // 2
    inv_freq = theta ** (-2.0 * np.arange(half, dtype=np.float64) / D)
    angle = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, half]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    x1, x2 = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


# ---------------------------------------------------------------- CLI


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    logits = sub.add_parser("logits", help="write fp32 logits T x vocab_size for a token list")
    logits.add_argument("--model", required=True, help="pack directory (config.json + safetensors)")
    logits.add_argument("--tokens", required=True, help="comma-separated token ids")
    logits.add_argument("--out", required=True, help="output file, fp32 little-endian")
    args = parser.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    out = Model(args.model).forward(tokens)
    out.astype("<f4").tofile(args.out)
    return 0


if __name__ == "__main__":
    sys.dont_write_bytecode = True  # the lazy exl3_ref import leaves no __pycache__ in t/ref
    sys.exit(main(sys.argv[1:]))
