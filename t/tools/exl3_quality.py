#!/usr/bin/python3
"""Quality of muse-quant's EXL3 packs on a small fp16 pack: for each codebook and bits value,
quantize with muse-quant, then measure with NumPy (t/ref/exl3_ref.py, t/ref/muse_ref.py):

- rel RMS: sqrt(sum (W_dequant - W)^2 / sum W^2) over every Linear at --bits (the head, at
  --head-bits, is reported apart);
- KL: the mean over positions of KL(p_fp16 || p_quant), p = softmax of the NumPy model's
  logits for the same tokens.

Prints a Markdown table (one row per codebook and bits) with muse-quant's wall and CPU time.

    t/tools/exl3_quality.py [--build build] [--config conf/packs/tiny.json] [--bits 2,3,4,6]
                            [--codebooks mul1,mcg,3inst] [--tokens 64] [--threads 0]
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
import exl3_ref  # noqa: E402
import muse_ref  # noqa: E402


def is_linear_weight(name):
    if not name.endswith(".weight"):
        return False
    key = name[: -len(".weight")]
    return key.endswith("_proj") or key == "lm_head" or key.endswith(".lm_head")


def weight_errors(src, dst):
    """(rel RMS over the body Linears, rel RMS of the head or None)."""
    a, b = muse_ref.SafeTensors(src), muse_ref.SafeTensors(dst)
    err2 = ref2 = 0.0
    head = None
    for name in a.entries:
        if not is_linear_weight(name):
            continue
        key = name[: -len(".weight")]
        w = a.get(name).astype(np.float64).T  # y = x W layout, k x n
        d = exl3_ref.dequantize(b.get, key).astype(np.float64)[:, : w.shape[1]]
        e2, r2 = float(((d - w) ** 2).sum()), float((w ** 2).sum())
        if key.endswith("lm_head"):
            head = np.sqrt(e2 / r2)
        else:
            err2, ref2 = err2 + e2, ref2 + r2
    return np.sqrt(err2 / ref2), head


def children_cpu():
    """User + system CPU seconds of finished child processes."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def mean_kl(ref_logits, q_logits):
    lp, lq = log_softmax(ref_logits.astype(np.float64)), log_softmax(q_logits.astype(np.float64))
    return float((np.exp(lp) * (lp - lq)).sum(axis=1).mean())


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--config", default="conf/packs/tiny.json")
    ap.add_argument("--bits", default="2,3,4,6")
    ap.add_argument("--head-bits", default="6")
    ap.add_argument("--codebooks", default="mul1,mcg,3inst")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", default="0")
    ap.add_argument("--seed", default="7", help="muse-pack seed of the fp16 pack")
    args = ap.parse_args(argv)
    pack_bin = os.path.join(ROOT, args.build, "muse-pack")
    quant_bin = os.path.join(ROOT, args.build, "muse-quant")
    with tempfile.TemporaryDirectory(prefix="muse-exl3-quality-") as tmp:
        src = os.path.join(tmp, "fp16")
        subprocess.run([pack_bin, "--config", args.config, "--out", src, "--seed", args.seed],
                       cwd=ROOT, check=True, capture_output=True)
        model = muse_ref.Model(src)
        vocab = model.cfg.vocab_size
        ids = [(i * 7919 + 13) % vocab for i in range(args.tokens)]
        ref_logits = model.forward(ids)
        print(f"fp16 pack: {args.config}, muse-pack --seed {args.seed}; {args.tokens} tokens; "
              f"head at {args.head_bits} bits")
        print()
        print("| codebook | bits | rel RMS weight err | head rel RMS err | mean KL(fp16 ‖ quant) | top-1 agree | muse-quant wall s | CPU s |")
        print("|---|---|---|---|---|---|---|---|")
        for cb in args.codebooks.split(","):
            for bits in args.bits.split(","):
                dst = os.path.join(tmp, f"{cb}{bits}")
                t0, cpu0 = time.monotonic(), children_cpu()
                subprocess.run([quant_bin, "--in", src, "--out", dst, "--bits", bits, "--codebook", cb,
                                "--head-bits", args.head_bits, "--threads", args.threads],
                               cwd=ROOT, check=True, capture_output=True)
                wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
                rel, head = weight_errors(src, dst)
                q_logits = muse_ref.Model(dst).forward(ids)
                kl = mean_kl(ref_logits, q_logits)
                agree = float((q_logits.argmax(1) == ref_logits.argmax(1)).mean())
                head_s = f"{head:.4f}" if head is not None else "tied"
                print(f"| {cb} | {bits} | {rel:.4f} | {head_s} | {kl:.2e} | {agree:.3f} | {wall:.1f} | {cpu:.1f} |", flush=True)
                subprocess.run(["rm", "-rf", dst])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
