#!/usr/bin/python3
"""Held-out perplexity of the trained demo model, fp16 and EXL3 at each bits value and codebook.

For the fp16 pack train_demo.py wrote, and for muse-quant of it at each --bits x --codebooks
(head at --head-bits), runs `muse-engine logits` on --windows windows of --len tokens of the
held-out addresses (demo_data.py's heldout_text.bin) and prints one Markdown row each:
perplexity, mean KL(fp16 || quant) and top-1 agreement with fp16, muse-quant's wall time.

    t/tools/demo_quality.py --fp16 build/demo-en/fp16 --data build/demo-en [--bits 2,3,4,6]
                            [--codebooks mul1,mcg,3inst] [--windows 4] [--len 256]
                            [--pack LABEL=DIR ...]   (also measure packs made already; --bits ""
                                                      quantizes nothing)
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log_softmax(z):
    z = z.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def logits(engine, pack, windows, vocab, tmp):
    out = []
    for w in windows:
        f = os.path.join(tmp, "w.logits")
        subprocess.run([engine, "logits", "--model", pack, "--tokens", ",".join(map(str, w[:-1])), "--out", f],
                       check=True, capture_output=True)
        out.append(np.fromfile(f, dtype="<f4").reshape(len(w) - 1, vocab))
    return out


def measure(lps, windows):
    nll = np.concatenate([-lp[np.arange(len(w) - 1), w[1:]] for lp, w in zip(lps, windows)])
    return float(np.exp(nll.mean()))


def row(label, q, ref, windows, wall):
    kl = float(np.mean(np.concatenate([(np.exp(r) * (r - s)).sum(1) for r, s in zip(ref, q)])))
    agree = float(np.mean(np.concatenate([r.argmax(1) == s.argmax(1) for r, s in zip(ref, q)])))
    print(f"| {label} | {measure(q, windows):.3f} | {kl:.3e} | {agree:.3f} | {wall} |", flush=True)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--fp16", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--bits", default="4,3,2,6")
    ap.add_argument("--codebooks", default="mul1,mcg,3inst")
    ap.add_argument("--head-bits", default="6")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--threads", default="0")
    ap.add_argument("--pack", action="append", default=[], help="LABEL=DIR of a pack made already")
    a = ap.parse_args(argv)
    engine = os.path.join(ROOT, a.build, "muse-engine")
    quant = os.path.join(ROOT, a.build, "muse-quant")
    held = np.fromfile(os.path.join(a.data, "heldout_text.bin"), dtype="<u2").astype(np.int64)
    step = (len(held) - a.len - 1) // a.windows
    windows = [held[i * step: i * step + a.len + 1] for i in range(a.windows)]
    import json

    vocab = json.load(open(os.path.join(a.fp16, "config.json")))["vocab_size"]
    with tempfile.TemporaryDirectory(prefix="muse-demo-quality-") as tmp:
        ref = [log_softmax(z) for z in logits(engine, a.fp16, windows, vocab, tmp)]
        print(f"held-out: {a.windows} windows of {a.len} tokens of the held-out addresses; head at "
              f"{a.head_bits} bits")
        print(flush=True)
        print("| weights | bits | held-out perplexity | mean KL(fp16 ‖ quant) | top-1 agree with fp16 | muse-quant wall s |")
        print("|---|---|---|---|---|---|")
        print(f"| fp16 | 16 | {measure(ref, windows):.3f} | 0 | 1.000 | - |", flush=True)
        for spec in a.pack:
            label, pack = spec.split("=", 1)
            q = [log_softmax(z) for z in logits(engine, pack, windows, vocab, tmp)]
            row(label, q, ref, windows, "-")
        for bits in filter(None, a.bits.split(",")):
            for cb in a.codebooks.split(","):
                dst = os.path.join(tmp, f"{cb}{bits}")
                t0 = time.monotonic()
                subprocess.run([quant, "--in", a.fp16, "--out", dst, "--bits", bits, "--codebook", cb,
                                "--head-bits", a.head_bits, "--threads", a.threads],
                               check=True, capture_output=True)
                wall = time.monotonic() - t0
                q = [log_softmax(z) for z in logits(engine, dst, windows, vocab, tmp)]
                row(f"EXL3 {cb} | {bits}", q, ref, windows, f"{wall:.0f}")
                shutil.rmtree(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
