#!/usr/bin/python3
"""`muse-engine plan` and serve's fit check: the Muse Spark Open shape fits two 141 GiB GPUs at
1.8 bits with every term and the reserve printed, its one-GPU cut (96 experts) one at 2 bits; a plan that does not fit exits 3 naming the
terms and the fix; bad flags exit 2 naming the flag; the config-only weights of tiny-tp (fp16
and EXL3 packs, --ranks 2) are within 1% of what serve measures; serve with --device-gib too
small refuses to start (exit 2) with the terms; --backend cuda counts the CUDA backend's own
workspace from the config's shapes, as the H200 allocated it, and refuses what would not fit.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
from tap import diag, ok  # noqa: E402
import tap  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
ENGINE = os.environ.get("MUSE_ENGINE", os.path.join(BUILD, "muse-engine"))
PACK = os.path.join(BUILD, "muse-pack")
SPARK = "conf/packs/muse-spark-open.json"
SPARK1 = "conf/packs/muse-spark-open-1gpu.json"  # issue 12's one-GPU shape: 96 routed experts
TERMS = ("weights", "kv pool", "sliding rings", "snapshots", "workspace", "requests", "reserve", "total")


def run(cmd, env=None):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def plan(*args):
    return run([ENGINE, "plan", "--config", SPARK] + list(args))


def row(out, term):
    m = re.search(r"^%s\s+([-\d.]+)\s+([-\d.]+)\s*$" % re.escape(term), out, re.M)
    return (float(m.group(1)), float(m.group(2))) if m else None


def row1(out, term):
    m = re.search(r"^%s\s+([-\d.]+)\s*$" % re.escape(term), out, re.M)
    return float(m.group(1)) if m else -1


def weights_bytes(text):
    m = re.search(r"weights bytes: rank 0 (\d+) rank 1 (\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def weights_bytes1(text):
    m = re.search(r"weights bytes: rank 0 (\d+)", text)
    return int(m.group(1)) if m else None


def serve_weights(pack, tmp, extra=()):
    """Starts serve on pack with --ranks 2, returns (rc or None while running, stderr)."""
    sock = os.path.join(tmp, "engine.sock")
    cmd = [ENGINE, "serve", "--model", pack, "--tokenizer", os.path.join(tmp, "tokenizer.json"),
           "--listen", sock, "--shm", "/muse-plan-t-%d" % os.getpid(), "--ranks", "2",
           "--streams", "2", "--queue", "2", "--context", "160"] + list(extra)
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    err = ""
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        err += line
        if "weights bytes:" in line:
            proc.terminate()
            break
    proc.wait(timeout=60)
    err += proc.stderr.read()
    return proc.returncode, err


def main():
    if not ok(os.access(os.path.join(ROOT, ENGINE), os.X_OK), f"{ENGINE} exists (make it first)"):
        return tap.done()
    env = dict(os.environ)
    env.pop("MUSE_MEMORY_RESERVE_GIB", None)
    rc, out, err = run([ENGINE, "plan", "--config", SPARK, "--ranks", "2", "--device-gib", "141", "--bits", "1.8",
                        "--streams", "4", "--context", "131072"], env=env)
    diag(out.strip())
    ok(rc == 0 and out.strip().endswith("fits"), "Muse Spark Open shape: fits two 141 GiB devices at 1.8 bits")
    ok(all(row(out, t) for t in TERMS), "every term is printed for both ranks")
    w = row(out, "weights")
    ok(w is not None and 80 < w[0] < 100 and w[0] == w[1], f"about 93 GB of weights a rank ({w})")
    ok(row(out, "reserve") == (4.41, 4.41) and "default" in out,
       "the reserve shown: max(1 GiB, 141/32) = 4.41 GiB on a discrete GPU")
    ok(re.search(r"context that fits: 1 x \d+ tokens, 4 x \d+ tokens", out) is not None, "context that fits at 1 and 4")
    one = [ENGINE, "plan", "--config", SPARK1, "--device-gib", "139", "--bits", "2", "--streams", "4",
           "--context", "131072"]
    rc, out, err = run(one, env=env)
    ok(rc == 0 and out.strip().endswith("fits") and 80 < row1(out, "weights") < 95,
       f"the one-GPU shape (96 experts): fits one 139 GiB H200 at 2 bits, 4 x 128k ({row1(out, 'weights')} GiB weights)")
    rc, out, err = run([ENGINE, "plan", "--config", SPARK] + one[4:], env=env)
    ok(rc == 3, "the full shape (224 experts) does not fit one H200 at 2 bits")
    rc, out, err = plan("--ranks", "2", "--device-gib", "141", "--bits", "1.8", "--reserve-gib", "2")
    ok(rc == 0 and row(out, "reserve") == (2.0, 2.0), "--reserve-gib 2 is the reserve")
    env["MUSE_MEMORY_RESERVE_GIB"] = "3"
    rc, out, err = run([ENGINE, "plan", "--config", SPARK, "--ranks", "2", "--device-gib", "141", "--bits", "1.8"], env=env)
    ok(rc == 0 and row(out, "reserve") == (3.0, 3.0), "MUSE_MEMORY_RESERVE_GIB=3 is the reserve")
    rc, out, err = plan("--ranks", "2", "--device-gib", "141", "--bits", "1.8", "--device-kind", "unified")
    ok(rc == 0 and row(out, "reserve") == (14.1, 14.1), "unified 141 GiB: reserve 1/10 = 14.1 GiB")
    rc, out, err = plan("--ranks", "2", "--device-gib", "141", "--bits", "1.8", "--device-kind", "cpu")
    ok(rc == 0 and row(out, "reserve") == (0.0, 0.0), "cpu: no reserve unless given")

    for args, why in ((["--device-gib", "80", "--ranks", "2", "--bits", "1.8"], "80 GiB a rank"),
                      (["--device-gib", "141", "--ranks", "2", "--bits", "1.8", "--context", "524288",
                        "--streams", "8"], "8 streams x 524288")):
        rc, out, err = plan(*args)
        good = rc == 3 and "does not fit" in out and all(
            s in err for s in ("weights", "kv pool", "reserve", "--streams", "--context", "--prompt-cache-gib",
                               "--reserve-gib", "GiB"))
        ok(good, f"{why}: exit 3, every term and the fix named")
        if not good:
            diag(f"exit {rc}: {out} {err}")
    # --backend cuda: the CUDA backend's own workspace, worked out on this machine (no GPU)
    serve8k = [ENGINE, "plan", "--config", SPARK1, "--bits", "2", "--codebook", "mcg", "--kernels", "fast",
               "--device-gib", "139.8", "--streams", "4", "--context", "8192", "--max-rows", "256"]
    rc, out, err = run(serve8k + ["--backend", "cuda"], env=env)
    if "built without the CUDA backend" in err:
        diag("this muse-engine has no CUDA backend: its plan is not checked")
    else:
        ws = row1(out, "workspace")
        ok(rc == 0 and "cuda workspace" in out and ws == 0.9,
           f"the one-GPU shape at 256 rows: the CUDA workspace is 0.90 GiB ({ws}): the routed experts' "
           "partials at their own split (1.88 GiB, as the H200 allocated on 2026-12-04, while they were "
           "sized at the plain split; 2.95 while the head's buffers took 256 rows)")
        got = weights_bytes1(out)
        ok(got is not None and abs(got - 94179974280) < 100000,
           f"its weights ({got} bytes) within 100 kB of what the H200 allocated, 94179974280 (the tensors "
           "256-byte aligned, the fp32 vectors, codebook tables and descriptors besides)")
        rc, cpu_out, _ = run(serve8k, env=env)
        ok(rc == 0 and row1(cpu_out, "workspace") < ws,
           f"the CPU backend's estimate ({row1(cpu_out, 'workspace')} GiB) is not the CUDA backend's")
        big = serve8k[:-6] + ["--streams", "16", "--context", "131072", "--kv-blocks", "65536"]
        rc, out, err = run(big + ["--max-rows", "512", "--backend", "cuda"], env=env)
        ok(rc == 0 and 1.5 < row1(out, "workspace") < 2,
           f"16 x 131072 with 65536 KV blocks at 512 rows a round fits ({row1(out, 'workspace')} GiB of workspace)")
        rc, out, err = run(big + ["--backend", "cuda"], env=env)
        ok(rc == 0 and "2048 rows a round" in out,
           "without --max-rows: 2048 rows a round, the most of 2048, 1024, 512 that fits (serve's choice; "
           "1024 while the routed experts' partials were sized at the plain split)")
        rc, out, err = run(big[:-2] + ["--kv-blocks", "69632", "--backend", "cuda"], env=env)
        ok(rc == 0 and "1024 rows a round" in out, "with 69632 KV blocks: 1024 rows a round")
        rc, out, err = run(serve8k[:-2] + ["--backend", "cuda"], env=env)
        ok(rc == 0 and "2048 rows a round" in out, "4 x 8192: 2048 rows a round")
        rc, out, err = run(big[:-2] + ["--kv-blocks", "69632", "--max-rows", "2048", "--backend", "cuda"], env=env)
        good = rc == 3 and 6 < row1(out, "workspace") < 6.5 and all(s in err for s in ("--max-rows", "--kv-blocks"))
        ok(good, "with 69632 KV blocks at 2048 rows a round it does not: exit 3 naming --max-rows and --kv-blocks")
        if not good:
            diag(f"exit {rc}: {out} {err}")
        rc, out, err = run(serve8k + ["--backend", "cuda", "--bits", "2.5"], env=env)
        ok(rc == 2 and "--bits 2.5" in err, "--backend cuda with --bits 2.5: exit 2 naming it")
    for args, flag in ((["--bits", "9"], "--bits"), (["--bits", "0.5"], "--bits 0.5"), (["--ranks", "3"], "--ranks 3"), (["--ranks", "0"], "--ranks"),
                       (["--device-kind", "gpu"], "--device-kind"), (["--device-gib", "-1"], "--device-gib"),
                       (["--context", "999999999"], "--context"), (["--streams", "0"], "--streams"),
                       (["--config", "/nonexistent.json"], "/nonexistent.json")):
        rc, out, err = plan(*args)
        ok(rc == 2 and flag in err, f"{' '.join(args)}: exit 2 naming {flag}")
        if not (rc == 2 and flag in err):
            diag(f"exit {rc}: {err.strip()}")

    if not ok(os.access(os.path.join(ROOT, PACK), os.X_OK), f"{PACK} exists"):
        return tap.done()
    with tempfile.TemporaryDirectory(prefix="muse-plan-") as tmp:
        subprocess.run(["/usr/bin/python3", "t/tools/make_tiny_tokenizer.py", os.path.join(tmp, "tokenizer.json")],
                       cwd=ROOT, check=True)
        for kind, extra, bits in (("fp16", [], "0"), ("exl3-4", ["--exl3-random", "4", "--codebook", "mul1"], "4")):
            pack = os.path.join(tmp, kind)
            rc, _, err = run([PACK, "--config", "conf/packs/tiny-tp.json", "--out", pack, "--seed", "7"] + extra)
            if not ok(rc == 0, f"{kind}: muse-pack makes the tiny-tp pack"):
                diag(err)
                continue
            rc, out, _ = run([ENGINE, "plan", "--config", "conf/packs/tiny-tp.json", "--ranks", "2", "--bits", bits,
                              "--head-bits", "6" if bits != "0" else "6"])
            est = weights_bytes(out)
            rc, err = serve_weights(pack, tmp)
            got = weights_bytes(err)
            good = est and got and all(abs(e - g) <= 0.01 * g for e, g in zip(est, got))
            ok(good, f"{kind} --ranks 2: the config-only weights {est} within 1% of serve's measured {got}")
            if not good:
                diag(err[-800:])
        rc, err = serve_weights(os.path.join(tmp, "fp16"), tmp, ["--device-gib", "0.001"])
        good = rc == 2 and all(s in err for s in ("weights", "kv pool", "reserve", "--streams", "--context")) \
            and "weights bytes:" not in err
        ok(good, "serve --device-gib 0.001: refuses to start (exit 2) with the terms and the fix")
        if not good:
            diag(f"exit {rc}: {err[-800:]}")
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
