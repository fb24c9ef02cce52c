#!/usr/bin/python3
"""muse-engine compare on the CPU backend. On the tiny-tp pack, one rank against two must
agree (top-1 100%, rel L2 within 2e-3, exit 0) and a chunked side must equal the whole prompt
exactly (rel L2 0); a tighter --max-rel-l2 than the two-rank error turns it into exit 1. Side
b on a pack of another seed misses top-1: every miss is listed with both sides' top 5 and
margins, and side a's top 5 and margin at the first miss are those of `muse-engine logits`
(NumPy over the written logits). The router's smallest margin (cpu side a) is the same in
chunks. Bad input exits 2 naming the flag.
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
from tap import diag, ok  # noqa: E402
import tap  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
ENGINE = os.environ.get("MUSE_ENGINE", os.path.join(BUILD, "muse-engine"))
PACK = os.path.join(BUILD, "muse-pack")
TOKENS = "1,17,300,5,99,767,42,7,7,7,512,64,2,600,33,18,250,11,3"


def run(cmd):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def compare(*args):
    return run([ENGINE, "compare", "--tokens", TOKENS, "--a", "cpu", "--b", "cpu", *args])


def field(out, pattern):
    m = re.search(pattern, out, re.M)
    return m.groups() if m else None


def main():
    if not ok(os.access(os.path.join(ROOT, ENGINE), os.X_OK) and os.access(os.path.join(ROOT, PACK), os.X_OK),
              f"{ENGINE} and {PACK} built"):
        return tap.done()
    with tempfile.TemporaryDirectory() as d:
        packs = {}
        for seed in (3, 4):
            packs[seed] = os.path.join(d, f"tp{seed}")
            rc, _, err = run([PACK, "--config", "conf/packs/tiny-tp.json", "--out", packs[seed], "--seed", str(seed)])
            if not ok(rc == 0, f"muse-pack makes the tiny-tp pack, seed {seed}"):
                diag(err)
                return tap.done()
        a = packs[3]
        n = len(TOKENS.split(","))

        rc, out, err = compare("--model", a, "--ranks-b", "2")
        rel = field(out, r"^rel L2 max (\S+) \(position (\d+)\), mean (\S+)$")
        agree = field(out, r"^top-1 agreement (\S+)% \((\d+) of (\d+)\)$")
        ok(rc == 0 and rel and 0 < float(rel[0]) <= 2e-3 and int(rel[1]) < n and agree == ("100.00", str(n), str(n))
           and "top-1 miss" not in out,
           "--ranks-b 2 agrees with one rank: 100% top-1, rel L2 in (0, 2e-3] at a position named, exit 0")
        if rc != 0:
            diag(out + err)
        rc2, out2, _ = compare("--model", a, "--ranks-b", "2", "--max-rel-l2", str(float(rel[0]) / 2) if rel else "0")
        ok(rc2 == 1 and out2.rstrip().endswith("rel L2 > " + f"{float(rel[0]) / 2:.1e}" if rel else False),
           "--max-rel-l2 below the two-rank error: exit 1, the bound named")

        margin = field(out, r"^router margin: min (\S+) at layer (\d+) position (\d+) ")
        ok(margin and 0 <= float(margin[0]) < 1 and int(margin[2]) < n,
           f"the router's smallest margin is reported on the cpu side a ({margin})")
        rc, out, _ = compare("--model", a, "--chunk", "5", "--ranks-a", "2", "--ranks-b", "2")
        ok(rc == 0 and field(out, r"^rel L2 max (\S+) ") == ("0.000e+00",),
           "chunks of 5 against the whole prompt (both at 2 ranks): rel L2 exactly 0")
        rc, out, _ = compare("--model", a, "--chunk", "5", "--ranks-b", "2")
        ok(rc == 0 and field(out, r"^router margin: min (\S+) at layer (\d+) position (\d+) ") == margin,
           "side a in chunks of 5: the same router margin, at the same layer and position")

        rc, out, err = compare("--model", a, "--model-b", packs[4])
        misses = re.findall(r"^# top-1 miss at position (\d+) \(token (\d+)\): a (\d+), b (\d+), rel L2 \S+\n"
                            r"#   a top5((?: \d+:\S+){5})  margin top1-top2 (\S+)\n"
                            r"#   b top5((?: \d+:\S+){5})  margin top1-top2 (\S+)$", out, re.M)
        agree = field(out, r"^top-1 agreement (\S+)% \((\d+) of (\d+)\)$")
        ok(rc == 1 and agree and len(misses) == n - int(agree[1]) and len(misses) > 0
           and "FAIL: agreement <" in out,
           f"another pack on side b: exit 1, each of the {n - int(agree[1]) if agree else '?'} misses listed with both top 5")
        good = bool(misses)
        for pos, tok, ta, tb, a5, am, b5, bm in misses:
            for top1, five, margin in ((ta, a5, am), (tb, b5, bm)):
                pairs = [(int(x.split(":")[0]), float(x.split(":")[1])) for x in five.split()]
                vals = [v for _, v in pairs]
                good &= pairs[0][0] == int(top1) and vals == sorted(vals, reverse=True)
                good &= abs(float(margin) - (vals[0] - vals[1])) <= 1e-3 * max(1.0, abs(vals[0]))
            good &= TOKENS.split(",")[int(pos)] == tok
        ok(good, "every miss: top-1 first of its top 5, descending, margin = top1 - top2, the right token")

        lf = os.path.join(d, "a.f32")
        rc, _, err = run([ENGINE, "logits", "--model", a, "--tokens", TOKENS, "--out", lf])
        if rc == 0 and misses:
            lg = np.fromfile(lf, dtype="<f4").reshape(n, -1)
            pos, _, _, _, a5, am, _, _ = misses[0]
            row = lg[int(pos)]
            want = [int(i) for i in np.argsort(-row, kind="stable")[:5]]
            got = [int(x.split(":")[0]) for x in a5.split()]
            ok(got == want and abs(float(am) - float(row[want[0]] - row[want[1]])) < 1e-3,
               f"position {pos}: side a's top 5 {got} and margin are those of muse-engine logits")
        else:
            ok(False, "muse-engine logits for the reference top 5")
            diag(err)

        bad = [
            (["--tokens", "1,x", "--model", a, "--b", "cpu"], "--tokens"),
            (["--tokens", "1,5000", "--model", a, "--b", "cpu"], "--tokens"),
            (["--tokens", "1,2", "--model", a, "--b", "cpu", "--ranks-b", "3"], "--ranks-b 3"),
            (["--tokens", "1,2", "--model", a, "--b", "nope"], "--b nope"),
            (["--tokens", "1,2", "--model", a, "--model-b", os.path.join(d, "none"), "--b", "cpu"], "--model-b"),
            (["--tokens", "1,2", "--model", a, "--min-agree", "101"], "--min-agree"),
            (["--tokens", "1,2"], "--model"),
        ]
        for args, want in bad:
            rc, _, err = run([ENGINE, "compare", *args])
            ok(rc == 2 and want in err, f"{' '.join(a if not a.startswith(d) else 'DIR' for a in args)}: exit 2 naming {want}")
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
