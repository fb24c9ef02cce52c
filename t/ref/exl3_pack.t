#!/usr/bin/python3
"""EXL3 packs end to end, against the independent NumPy references t/ref/muse_ref.py and
t/ref/exl3_ref.py (design/EXL3.md):

(a) muse-pack --exl3-random packs of tiny.json (2 bits mul1 / head 6, 3 bits mcg / head 5,
    4 bits 3inst / head 6; 3 shards): muse-engine logits vs the NumPy model, rel L2 < 2e-3 and
    the same top-1 at every position;
(b) muse-engine dequant vs exl3_ref.dequantize (rel L2 < 1e-6), its key forms and its errors;
(c) muse-quant at 3 bits mul1 of an fp16 pack of tiny.json cut to 2 layers (dense, MoE) of width
    128 (QUANT_SHAPE, 29 Linears: the Viterbi search costs seconds per 10^5 weights on 2 cores):
    the pack's layout and config, untouched copies, logits vs the NumPy model on the quantized
    pack, weights close to the fp16 originals;
(d) corrupt EXL3 tensors refused with exit 2 by inspect and dequant, naming the tensor.
Missing binaries fail, not skip. BUILD (default build) names the build directory.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
import exl3_ref  # noqa: E402
import muse_ref  # noqa: E402
from tap import diag, ok  # noqa: E402
import tap  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
PACK_BIN, ENGINE_BIN, QUANT_BIN = (os.path.join(ROOT, BUILD, b) for b in ("muse-pack", "muse-engine", "muse-quant"))
# MUSE_ENGINE: another build of muse-engine (t/exl3_pack_asan.t: the ASan one)
ENGINE_BIN = os.environ.get("MUSE_ENGINE") or ENGINE_BIN
CONF = "conf/packs/tiny.json"
REL_L2_BOUND = 2e-3
DEQUANT_BOUND = 1e-6
# tiny.json cut down for (c): every kind of Linear, 540672 weights instead of 5963776
QUANT_SHAPE = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
               "layer_types": ["sliding_attention", "full_attention"], "layer_rope_theta": [10000, 0],
               "mlp_layer_types": ["dense", "moe"], "intermediate_size": 256, "num_experts": 4,
               "num_experts_per_tok": 2, "vocab_size": 256}
QUANT_LINEARS = 29
# muse-quant on that pack, 3 bits mul1 (no calibration): measured 0.1280 over all Linears,
# at most MAXONE for one 3-bit tensor, HEAD for the 6-bit head (tiny.json: docs/exl3.md).
QUANT_REL_RMS_ALL, QUANT_REL_RMS_ONE, QUANT_REL_RMS_HEAD = 0.14, 0.15, 0.03
N_TOKENS = 30
TIMEOUT_S = 600



def run(cmd):
    """(exit code, stderr) of a command run from the repo root."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        return -1, str(err)
    return proc.returncode, proc.stderr


def tokens(vocab, n=N_TOKENS):
    ids = [(i * 7919 + 13) % vocab for i in range(n)]
    ids[n // 2] = ids[3]
    return ids


def engine_logits(pack, ids, vocab, out):
    rc, err = run([ENGINE_BIN, "logits", "--model", pack, "--tokens", ",".join(map(str, ids)), "--out", out])
    if rc != 0:
        diag(err.strip()[-2000:])
        return None
    eng = np.fromfile(out, dtype="<f4")
    return eng.reshape(len(ids), vocab) if eng.size == len(ids) * vocab else None


def compare_logits(label, pack, tmp):
    """Engine vs NumPy model on one pack; returns the max rel L2 error (or None)."""
    model = muse_ref.Model(pack)
    vocab = model.cfg.vocab_size
    ids = tokens(vocab)
    ok(len(ids) > model.cfg.sliding_window, f"{label}: {len(ids)} tokens exceed the sliding window")
    eng = engine_logits(pack, ids, vocab, os.path.join(tmp, "logits.f32"))
    if not ok(eng is not None, f"{label}: muse-engine logits runs and writes {len(ids)} x {vocab} floats"):
        return None
    ref = model.forward(ids).astype(np.float64)
    ok(bool(np.all(np.isfinite(eng))) and bool(np.all(ref.std(axis=1) > 0)), f"{label}: logits finite and varied")
    rel = np.linalg.norm(eng - ref, axis=1) / np.linalg.norm(ref, axis=1)
    diag(f"{label}: max rel L2 err {rel.max():.3e} at position {int(rel.argmax())} (mean {rel.mean():.3e})")
    ok(bool(np.all(rel < REL_L2_BOUND)), f"{label}: rel L2 error < {REL_L2_BOUND} at every position")
    same = eng.argmax(axis=1) == ref.argmax(axis=1)
    for p in np.nonzero(~same)[0][:3]:
        diag(f"{label}: position {p}: engine top-1 {eng[p].argmax()}, reference {ref[p].argmax()}")
    ok(bool(same.all()), f"{label}: same top-1 token at every position")
    return float(rel.max())


def dequant(pack, key, out):
    rc, err = run([ENGINE_BIN, "dequant", "--model", pack, "--tensor", key, "--out", out])
    return rc, err, (np.fromfile(out, dtype="<f4") if rc == 0 else None)


def check_dequant(label, pack, keys, tmp):
    model = muse_ref.Model(pack)
    out = os.path.join(tmp, "w.f32")
    for key in keys:
        ref = exl3_ref.dequantize(model.get, key).astype(np.float64)
        rc, err, eng = dequant(pack, key, out)
        if not ok(rc == 0 and eng is not None and eng.size == ref.size, f"{label}: dequant {key} writes {ref.shape[0]} x {ref.shape[1]} floats"):
            diag(err.strip())
            continue
        rel = np.linalg.norm(eng.reshape(ref.shape) - ref) / np.linalg.norm(ref)
        diag(f"{label}: dequant {key}: rel L2 err {rel:.2e}")
        ok(rel < DEQUANT_BOUND and np.linalg.norm(ref) > 0, f"{label}: dequant {key} matches exl3_ref (rel L2 < {DEQUANT_BOUND})")


# ---------------------------------------------------------------- (a), (b)

RANDOM_PACKS = [(2, "mul1", 6), (3, "mcg", 5), (4, "3inst", 6)]
DEQUANT_KEYS = ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.experts.5.down_proj",
                "model.layers.4.mlp.up_proj", "lm_head"]


def random_packs(tmp):
    packs = {}
    for bits, cb, head in RANDOM_PACKS:
        label = f"exl3-random {bits} bits {cb} head {head}"
        pack = os.path.join(tmp, f"r{bits}")
        rc, err = run([PACK_BIN, "--config", CONF, "--out", pack, "--seed", "7", "--shards", "3",
                       "--exl3-random", str(bits), "--codebook", cb, "--head-bits", str(head)])
        if not ok(rc == 0, f"{label}: muse-pack makes the pack"):
            diag(err)
            continue
        st = muse_ref.SafeTensors(pack)
        q = st.get("model.layers.0.self_attn.q_proj.trellis")
        h = st.get("lm_head.trellis")
        ok(q is not None and q.shape[-1] == 16 * bits and h is not None and h.shape[-1] == 16 * head,
           f"{label}: trellis widths are 16*bits and 16*head_bits")
        packs[bits] = (label, pack)
        compare_logits(label, pack, tmp)
        check_dequant(label, pack, DEQUANT_KEYS, tmp)
    return packs


def dequant_cli(pack, tmp):
    out, out2 = os.path.join(tmp, "a.f32"), os.path.join(tmp, "b.f32")
    key = "model.layers.2.self_attn.o_proj"
    rc1, _, _ = dequant(pack, key, out)
    rc2, _, _ = dequant(pack, key + ".trellis", out2)
    ok(rc1 == 0 and rc2 == 0 and open(out, "rb").read() == open(out2, "rb").read(),
       "dequant: KEY and KEY.trellis give the same bytes")
    rc, err, _ = dequant(pack, "model.layers.0.self_attn.nope_proj", out)
    ok(rc == 2 and "model.layers.0.self_attn.nope_proj" in err, "dequant: unknown key exits 2 naming it")
    rc, err, _ = dequant(pack, "model.norm.weight", out)
    ok(rc == 2 and "model.norm.weight" in err and "not an EXL3" in err, "dequant: a norm is refused as not EXL3 (exit 2)")
    rc, err = run([ENGINE_BIN, "dequant", "--model", pack, "--tensor", key])
    ok(rc == 2 and "--out" in err, "dequant: missing --out exits 2")
    proc = subprocess.run([ENGINE_BIN, "dequant", "--help"], capture_output=True, text=True)
    ok(proc.returncode == 0 and "--tensor" in proc.stdout, "dequant --help exits 0 and documents --tensor")


# ---------------------------------------------------------------- (c)

def is_linear_weight(name):
    key = name[: -len(".weight")] if name.endswith(".weight") else None
    return key is not None and (key.endswith("_proj") or key == "lm_head")


def check_quant(tmp):
    src, conf = os.path.join(tmp, "fp16"), os.path.join(tmp, "quant_shape.json")
    with open(os.path.join(ROOT, CONF)) as f:
        shape = json.load(f)
    shape.update(QUANT_SHAPE)
    with open(conf, "w") as f:
        json.dump(shape, f)
    rc, err = run([PACK_BIN, "--config", conf, "--out", src, "--seed", "7", "--shards", "3"])
    if not ok(rc == 0, "muse-pack makes the fp16 pack of the cut-down shape"):
        diag(err)
        return
    dst = os.path.join(tmp, "q3")
    t0 = time.monotonic()
    rc, err = run([QUANT_BIN, "--in", src, "--out", dst, "--bits", "3", "--codebook", "mul1"])
    diag(f"muse-quant 3 bits mul1: {time.monotonic() - t0:.1f} s wall; {err.strip().splitlines()[-1] if err.strip() else ''}")
    if not ok(rc == 0, "muse-quant quantizes the fp16 pack at 3 bits mul1"):
        diag(err.strip()[-2000:])
        return
    with open(os.path.join(dst, "config.json")) as f:
        qc = json.load(f).get("quantization_config", {})
    ok(qc.get("quant_method") == "exl3" and qc.get("bits") == 3 and qc.get("head_bits") == 6
       and qc.get("codebook") == "mul1" and qc.get("calibration") == "none" and "version" in qc,
       "config.json has quantization_config exl3, bits 3, head_bits 6, mul1, calibration none")
    ok(open(os.path.join(src, "generation_config.json"), "rb").read() == open(os.path.join(dst, "generation_config.json"), "rb").read(),
       "generation_config.json copied")
    shards = sorted(f for f in os.listdir(dst) if f.endswith(".safetensors"))
    ok(shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
       and os.path.exists(os.path.join(dst, "model.safetensors.index.json")), "sharded like the input: 3 shards and an index")
    a, b = muse_ref.SafeTensors(src), muse_ref.SafeTensors(dst)
    linears = [n[: -len(".weight")] for n in a.entries if is_linear_weight(n)]
    others = [n for n in a.entries if not is_linear_weight(n)]
    ok(len(linears) == QUANT_LINEARS and not any(is_linear_weight(n) for n in b.entries),
       f"all {QUANT_LINEARS} Linears quantized, none left fp16")
    ok(all(b.has(k + s) for k in linears for s in (".trellis", ".suh", ".svh", ".mul1")), "each Linear has trellis, suh, svh and the mul1 marker")
    same = all(b.has(n) and b.entries[n][1] == a.entries[n][1] and np.array_equal(a.get(n), b.get(n)) for n in others)
    ok(same and len(b.entries) == len(others) + 4 * len(linears), f"the {len(others)} other tensors (embedding, norms, router, bias) copied as is")
    compare_logits("muse-quant 3 bits mul1", dst, tmp)
    err2 = ref2 = 0.0
    worst, worst_key, head_rel = 0.0, "", None
    for key in linears:
        w = a.get(key + ".weight").astype(np.float64).T
        d = exl3_ref.dequantize(b.get, key).astype(np.float64)[:, : w.shape[1]]
        e2, r2 = float(((d - w) ** 2).sum()), float((w ** 2).sum())
        rel = np.sqrt(e2 / r2)
        if key == "lm_head":
            head_rel = rel
            continue
        err2, ref2 = err2 + e2, ref2 + r2
        if rel > worst:
            worst, worst_key = rel, key
    total = np.sqrt(err2 / ref2)
    diag(f"muse-quant 3 bits mul1: weight rel RMS err {total:.4f} over the 3-bit Linears, worst {worst:.4f} ({worst_key}), head (6 bits) {head_rel:.4f}")
    ok(0.01 < total < QUANT_REL_RMS_ALL, f"3-bit Linears: rel RMS error vs fp16 {total:.4f} < {QUANT_REL_RMS_ALL}")
    ok(worst < QUANT_REL_RMS_ONE, f"every 3-bit Linear: rel RMS error < {QUANT_REL_RMS_ONE}")
    ok(head_rel is not None and head_rel < QUANT_REL_RMS_HEAD, f"6-bit head: rel RMS error < {QUANT_REL_RMS_HEAD}")
    rc, err = run([QUANT_BIN, "--in", dst, "--out", os.path.join(tmp, "again"), "--bits", "3"])
    ok(rc == 2 and "quantization_config" in err, "muse-quant refuses an already quantized pack (exit 2)")


# ---------------------------------------------------------------- (d)

_ST_DTYPES = {np.dtype("<f2"): "F16", np.dtype("<f4"): "F32", np.dtype("<i2"): "I16", np.dtype("<i4"): "I32"}


def write_single_file_pack(src, dst, tensors):
    """config.json of src plus one model.safetensors holding `tensors` (name -> array)."""
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    header, blobs, at = {}, [], 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)  # not ascontiguousarray: it makes a 0-dim marker 1-dim
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _ST_DTYPES[arr.dtype.newbyteorder("<")], "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def check_corrupt(pack, tmp):
    st = muse_ref.SafeTensors(pack)
    base = {n: np.array(st.get(n)) for n in st.entries}
    key = "model.layers.0.self_attn.q_proj"
    tr, suh, svh = base[key + ".trellis"], base[key + ".suh"], base[key + ".svh"]
    bits = tr.shape[-1] // 16
    assert bits == 2, "the corrupt cases below assume the 2-bit pack"
    cases = [
        ("trellis last dim 24 is not 16*bits", {".trellis": tr[..., :24]}, ".trellis"),
        ("bits 0 (trellis last dim 0)", {".trellis": tr[..., :0]}, ".trellis"),
        ("bits 9 (trellis last dim 144)", {".trellis": np.concatenate([tr] * (9 // bits + 1), axis=-1)[..., :144]}, ".trellis"),
        ("suh of the wrong length", {".suh": suh[:-16]}, ".suh"),
        ("k not a multiple of 128", {".trellis": tr[:12], ".suh": suh[:192]}, ".trellis"),
        ("n not a multiple of 128", {".trellis": tr[:, :12], ".svh": svh[:192]}, ".trellis"),
        ("marker of the wrong dtype", {".mul1": np.array(0, dtype="<f4")}, ".mul1"),
    ]
    for i, (what, change, named) in enumerate(cases):
        bad = dict(base)
        for suffix, arr in change.items():
            bad[key + suffix] = arr
        dst = os.path.join(tmp, f"corrupt{i}")
        write_single_file_pack(pack, dst, bad)
        rc, err = run([ENGINE_BIN, "inspect", "--model", dst])
        ok(rc == 2 and key + named in err, f"corrupt pack, {what}: inspect exits 2 naming {key}{named}")
        if rc != 2 or key + named not in err:
            diag(f"exit {rc}: {err.strip()[-500:]}")
        rc, err, _ = dequant(dst, key, os.path.join(tmp, "c.f32"))
        ok(rc == 2 and key + named in err, f"corrupt pack, {what}: dequant exits 2 naming {key}{named}")


def main():
    for b in (PACK_BIN, ENGINE_BIN, QUANT_BIN):
        ok(os.access(b, os.X_OK), f"{os.path.relpath(b, ROOT)} exists (make it first)")
    if tap.failed:
        print(f"1..{tap.count}")
        return 1
    with tempfile.TemporaryDirectory(prefix="muse-exl3-pack-") as tmp:
        packs = random_packs(tmp)
        if 2 in packs:
            dequant_cli(packs[2][1], tmp)
            check_corrupt(packs[2][1], tmp)
        check_quant(tmp)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
