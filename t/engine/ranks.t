#!/usr/bin/python3
"""Tensor parallelism on the CPU backend (`--ranks N`, MUSE_SPARK.md's sharding): on the
tiny-tp packs (fp16 and EXL3 4 bits, shapes that every split allows) the logits at N = 1, 2
and 4 agree with the independent NumPy model and with N = 1 to relative L2 < 2e-3 with the
same top-1 token; the same N twice is bit-identical; a prompt read in chunks of 7 equals token
by token at N = 2. A rank count the config does not allow is refused by name before any large
allocation. --gpus LIST (the CUDA backend's rank placement) is refused by name when malformed,
negative, too long, given to another backend or disagreeing with --ranks, in every command that
takes it; kernel-check --ranks 2 on the CPU backend is all green.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
import muse_ref  # noqa: E402
from tap import diag, ok  # noqa: E402
import tap  # noqa: E402

BOUND = 2e-3
BUILD = os.environ.get("BUILD", "build")
ENGINE = os.environ.get("MUSE_ENGINE", os.path.join(BUILD, "muse-engine"))
PACK = os.path.join(BUILD, "muse-pack")


def run(cmd):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr


def logits(pack, tokens, out, ranks, chunk=None):
    cmd = [ENGINE, "logits", "--model", pack, "--tokens", ",".join(map(str, tokens)), "--out", out,
           "--ranks", str(ranks)]
    if chunk:
        cmd += ["--chunk", str(chunk)]
    rc, err = run(cmd)
    if rc != 0:
        diag(err.strip()[-500:])
        return None
    return np.fromfile(out, dtype="<f4").reshape(len(tokens), -1)


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


def close(label, got, want):
    rel = rel_l2(got, want)
    same = got.argmax(axis=1) == want.argmax(axis=1)
    diag(f"{label}: max rel L2 {rel.max():.3e}, top-1 equal at {same.mean() * 100:.1f}% of positions")
    ok(bool(np.all(rel < BOUND)) and bool(same.all()), f"{label}: rel L2 < {BOUND}, same top-1")


def main():
    if not ok(os.access(os.path.join(ROOT, ENGINE), os.X_OK) and os.access(os.path.join(ROOT, PACK), os.X_OK),
              f"{ENGINE} and {PACK} exist (make them first)"):
        return tap.done()
    with tempfile.TemporaryDirectory(prefix="muse-ranks-") as tmp:
        tokens = [(i * 7919 + 13) % 1000 for i in range(41)]
        for kind, extra in (("fp16", []), ("exl3-4", ["--exl3-random", "4", "--codebook", "mul1"])):
            pack = os.path.join(tmp, kind)
            rc, err = run([PACK, "--config", "conf/packs/tiny-tp.json", "--out", pack, "--seed", "7"] + extra)
            if not ok(rc == 0, f"{kind}: muse-pack makes the tiny-tp pack"):
                diag(err)
                continue
            ref = muse_ref.Model(pack).forward(tokens)
            one = logits(pack, tokens, os.path.join(tmp, f"{kind}.1"), 1)
            ok(one is not None, f"{kind}: --ranks 1 runs")
            for n in (2, 4):
                got = logits(pack, tokens, os.path.join(tmp, f"{kind}.{n}"), n)
                if not ok(got is not None and np.all(np.isfinite(got)), f"{kind}: --ranks {n} runs, finite logits"):
                    continue
                close(f"{kind} --ranks {n} vs NumPy", got, ref)
                if one is not None:
                    close(f"{kind} --ranks {n} vs --ranks 1", got, one)
                    ok(not np.array_equal(got, one) or n == 1,
                       f"{kind} --ranks {n}: really summed across ranks (bits differ from one rank)")
                again = logits(pack, tokens, os.path.join(tmp, f"{kind}.{n}b"), n)
                ok(again is not None and np.array_equal(got, again), f"{kind} --ranks {n}: twice, bit-identical")
            # weights from a seed, no files: the same tensors as muse-pack's, so the same bits
            syn = os.path.join(tmp, f"{kind}.syn")
            cmd = [ENGINE, "logits", "--synthetic-weights", "7", "--config", "conf/packs/tiny-tp.json",
                   "--tokens", ",".join(map(str, tokens)), "--out", syn, "--ranks", "2"]
            if extra:
                cmd += ["--bits", "4", "--codebook", "mul1"]
            rc, err = run(cmd)
            pk = os.path.join(tmp, f"{kind}.2")
            ok(rc == 0 and os.path.exists(pk) and open(syn, "rb").read() == open(pk, "rb").read(),
               f"{kind} --synthetic-weights 7 --ranks 2: the logits of the seed-7 pack, bit for bit")
            if rc:
                diag(err)
            chunked = logits(pack, tokens, os.path.join(tmp, f"{kind}.c7"), 2, chunk=7)
            single = logits(pack, tokens, os.path.join(tmp, f"{kind}.c1"), 2, chunk=1)
            ok(chunked is not None and single is not None and np.array_equal(chunked, single),
               f"{kind} --ranks 2: chunks of 7 equal token by token, bitwise")
        # admission: by name, before any large allocation
        tiny = os.path.join(tmp, "tiny")
        run([PACK, "--config", "conf/packs/tiny.json", "--out", tiny, "--seed", "1"])
        cases = [
            ("2", tiny, "splits intermediate_size (384) into parts of 192, not a multiple of 128"),
            ("3", os.path.join(tmp, "fp16"), "does not divide num_attention_heads 8"),
            ("0", os.path.join(tmp, "fp16"), "--ranks"),
            ("two", os.path.join(tmp, "fp16"), "--ranks"),
        ]
        for args, want in ((["--synthetic-weights", "1"], "needs --config FILE"),
                           (["--synthetic-weights", "1", "--config", "conf/packs/tiny.json", "--bits", "9"], "--bits"),
                           (["--synthetic-weights", "1", "--config", "conf/packs/tiny.json", "--codebook", "x"],
                            "--codebook x: unknown; use mul1, mcg or 3inst"),
                           (["--synthetic-weights", "1", "--config", "/nonexistent.json"], "/nonexistent.json")):
            rc, err = run([ENGINE, "logits", "--tokens", "1,2", "--out", os.path.join(tmp, "x")] + args)
            ok(rc == 2 and want in err, f"{' '.join(args)}: refused with exit 2 ('{want}')")
            if not (rc == 2 and want in err):
                diag(f"exit {rc}: {err.strip()}")
        for value, pack, want in cases:
            rc, err = run([ENGINE, "logits", "--model", pack, "--tokens", "1,2,3", "--out",
                           os.path.join(tmp, "x"), "--ranks", value])
            ok(rc == 2 and want in err, f"--ranks {value}: refused with exit 2, naming it ('{want}')")
            if not (rc == 2 and want in err):
                diag(f"exit {rc}: {err.strip()}")
        gpus_checks(tmp, os.path.join(tmp, "fp16"))
    return tap.done()


def gpus_checks(tmp, pack):
    """--gpus: every refusal names the flag and the value, exit 2, before any backend."""
    out = os.path.join(tmp, "x")
    logits_cmd = [ENGINE, "logits", "--model", pack, "--tokens", "1,2,3", "--out", out]
    cases = [
        (["--gpus", "0,0"], "--gpus 0,0 goes with --backend cuda, not --backend cpu"),
        (["--backend", "cuda", "--gpus", "0,,1"], "--gpus 0,,1: entry 2 is empty"),
        (["--backend", "cuda", "--gpus", ""], "--gpus : entry 1 is empty"),
        (["--backend", "cuda", "--gpus", "0,x"], "--gpus 0,x: entry 2 (x) is not an integer"),
        (["--backend", "cuda", "--gpus", "1.5"], "--gpus 1.5: entry 1 (1.5) is not an integer"),
        (["--backend", "cuda", "--gpus=0,-1"], "--gpus 0,-1: entry 2 (-1) is a negative device ordinal"),
        (["--backend", "cuda", "--gpus", ",".join(["0"] * 9)], "more than 8 GPUs; at most 8 ranks"),
        (["--backend", "cuda", "--gpus", "0,0", "--ranks", "4"], "--gpus 0,0 names 2 ranks but --ranks 4"),
    ]
    for args, want in cases:
        rc, err = run(logits_cmd + args)
        ok(rc == 2 and want in err, f"logits {' '.join(args)}: refused with exit 2 ('{want}')")
        if not (rc == 2 and want in err):
            diag(f"exit {rc}: {err.strip()}")
    others = [
        ([ENGINE, "generate", "--model", pack, "--tokens", "1,2", "--gpus", "0"], "--gpus 0 goes with --backend cuda"),
        ([ENGINE, "chat", "--model", pack, "--messages", out, "--gpus", "0,1"], "--gpus 0,1 goes with --backend cuda"),
        ([ENGINE, "serve", "--model", pack, "--listen", os.path.join(tmp, "sock"), "--gpus", "0,0"],
         "--gpus 0,0 goes with --backend cuda, not --backend cpu"),
        ([ENGINE, "serve", "--model", pack, "--listen", os.path.join(tmp, "sock"), "--backend", "script",
          "--script", out, "--gpus", "0"], "--gpus 0 goes with --backend cuda, not --backend script"),
        ([ENGINE, "compare", "--model", pack, "--tokens", "1,2", "--gpus-a", "0,0"],
         "--gpus-a 0,0 goes with --a cuda, not --a cpu"),
        ([ENGINE, "compare", "--model", pack, "--tokens", "1,2", "--gpus-b", "0,0", "--ranks-b", "1"],
         "--gpus-b 0,0 names 2 ranks but --ranks-b 1"),
        ([ENGINE, "kernel-check", "--model", pack, "--gpus", "0,0"], "--gpus 0,0 goes with --backend cuda"),
        ([ENGINE, "kernel-check", "--model", pack, "--backend", "cuda", "--gpus", "0;1"],
         "--gpus 0;1: entry 1 (0;1) is not an integer"),
    ]
    for cmd, want in others:
        rc, err = run(cmd)
        ok(rc == 2 and want in err, f"{cmd[1]} {' '.join(cmd[4:])}: refused with exit 2 ('{want}')")
        if not (rc == 2 and want in err):
            diag(f"exit {rc}: {err.strip()}")
    # the kernel checker at 2 ranks (both sides cpu): every case reads rank 0's share
    proc = subprocess.run([ENGINE, "kernel-check", "--model", pack, "--ranks", "2", "--max-rows", "32"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("# SUMMARY")]
    good = proc.returncode == 0 and summary and " failed 0;" in summary[0] and "missed 0" in summary[0]
    ok(good and "# ranks 2 on both sides" in proc.stdout, "kernel-check --ranks 2 (cpu): all green, controls red")
    if not good:
        diag((summary[0] if summary else proc.stdout[-800:]) + proc.stderr[-400:])


if __name__ == "__main__":
    sys.exit(main())
