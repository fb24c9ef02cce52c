#!/usr/bin/python3
"""Engine logits against the independent NumPy model t/ref/muse_ref.py, on the tiny packs.

For each pack config: muse-pack makes a sharded pack, muse-engine and the reference compute the
logits of the same ~40 tokens (longer than the pack's sliding window), and every position must
agree to relative L2 error < 2e-3 with the same top-1 token. Missing binaries fail, not skip.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
import muse_ref  # noqa: E402
from tap import diag, ok  # noqa: E402
import tap  # noqa: E402

PACKS = os.environ.get("MUSE_REF_PACKS", "conf/packs/tiny.json,conf/packs/tiny-flip.json").split(",")
REL_L2_BOUND = 2e-3
N_TOKENS = 41
TIMEOUT_S = 300

def run(cmd):
    """Run a command; (True, '') on exit 0, else (False, why)."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, str(err)
    if proc.returncode != 0:
        return False, f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"
    return True, ""


def token_list(vocab):
    """Deterministic ids spread over [0, vocab), with a repeat so attention sees equal keys."""
    ids = [(i * 7919 + 13) % vocab for i in range(N_TOKENS)]
    ids[N_TOKENS // 2] = ids[3]
    return ids


def compare(label, eng, ref):
    ok(bool(np.all(np.isfinite(eng))), f"{label}: engine logits finite")
    ok(bool(np.all(np.isfinite(ref))), f"{label}: reference logits finite")
    ok(bool(np.all(ref.std(axis=1) > 0)) and float(np.ptp(ref[:, 0])) > 0,
       f"{label}: reference logits vary over vocabulary and positions")
    rel = np.linalg.norm(eng.astype(np.float64) - ref, axis=1) / np.linalg.norm(ref.astype(np.float64), axis=1)
    worst = int(np.argmax(rel))
    diag(f"{label}: max rel L2 err {rel[worst]:.3e} at position {worst} (mean {rel.mean():.3e})")
    ok(bool(np.all(rel < REL_L2_BOUND)), f"{label}: rel L2 error < {REL_L2_BOUND} at every position")
    top_eng, top_ref = eng.argmax(axis=1), ref.argmax(axis=1)
    same = top_eng == top_ref
    if not same.all():
        for p in np.nonzero(~same)[0][:5]:
            two = np.sort(ref[p])[-2:]
            diag(f"{label}: position {p}: engine top-1 {top_eng[p]}, reference {top_ref[p]} "
                 f"(reference top-2 gap {two[1] - two[0]:.3e})")
    ok(bool(same.all()), f"{label}: same top-1 token at every position")


def check_pack(build, conf, tmp):
    label = os.path.basename(conf)
    pack_bin, engine_bin = os.path.join(build, "muse-pack"), os.path.join(build, "muse-engine")
    have = os.access(os.path.join(ROOT, pack_bin), os.X_OK) and os.access(os.path.join(ROOT, engine_bin), os.X_OK)
    if not ok(have, f"{label}: {pack_bin} and {engine_bin} exist (make them first)"):
        return
    pack = os.path.join(tmp, os.path.splitext(label)[0])
    made, why = run([pack_bin, "--config", conf, "--out", pack, "--seed", "7", "--shards", "3"])
    if not ok(made, f"{label}: muse-pack makes the pack"):
        diag(why)
        return
    model = muse_ref.Model(pack)
    cfg = model.cfg
    tokens = token_list(cfg.vocab_size)
    if "sliding_attention" in cfg.layer_types:
        ok(len(tokens) > cfg.sliding_window, f"{label}: {len(tokens)} tokens exceed sliding window {cfg.sliding_window}")
    out = os.path.join(tmp, label + ".logits")
    ran, why = run([engine_bin, "logits", "--model", pack, "--tokens", ",".join(map(str, tokens)), "--out", out])
    if not ok(ran, f"{label}: muse-engine logits runs"):
        diag(why)
        return
    eng = np.fromfile(out, dtype="<f4")
    if not ok(eng.size == len(tokens) * cfg.vocab_size, f"{label}: engine wrote {len(tokens)} x {cfg.vocab_size} floats"):
        diag(f"got {eng.size} floats")
        return
    ref = model.forward(tokens)
    compare(label, eng.reshape(len(tokens), cfg.vocab_size), ref)
    # The reference against itself with fp32 sums: fp16 rounding flips alone cause this much.
    ref32 = muse_ref.Model(pack, accumulate=np.float32).forward(tokens)
    floor = np.linalg.norm(ref32 - ref, axis=1) / np.linalg.norm(ref, axis=1)
    diag(f"{label}: noise floor (reference fp32 vs fp64 sums) max rel L2 {floor.max():.3e}")


def main():
    build = os.environ.get("BUILD", "build")
    with tempfile.TemporaryDirectory(prefix="muse-ref-logits-") as tmp:
        for conf in PACKS:
            if ok(os.path.exists(os.path.join(ROOT, conf)), f"{conf} exists"):
                check_pack(build, conf, tmp)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
