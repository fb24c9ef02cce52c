#!/usr/bin/env python3
"""kprof.py: sums an ncu CSV of gpu__time_duration (gpu_check.sh step kprof) by kernel over
the last forward round (a round begins at an embed kernel), then prints each kernel's launches,
total us and share, largest first; --seq K: also the round's first K kernels in launch order
(the embed and the first layers: which launch of a kernel is slow). Usage: kprof.py
FILE.csv[.gz] [--round N] (N from the end) [--seq K]."""
import csv
import gzip
import io
import re
import sys

UNIT = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}


def rows(path):
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    text = raw.read()
    start = text.find('"ID"')  # ncu writes its own lines before the table
    if start < 0:
        sys.exit(f"kprof.py: {path}: no ncu CSV table in it (was the step run?)")
    for r in csv.DictReader(io.StringIO(text[start:])):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = re.sub(r"^void ", "", r["Kernel Name"])
        name = re.sub(r"\(.*$", "", name)
        v = float(r["Metric Value"].replace(",", "")) * UNIT.get(r["Metric Unit"], 1.0)
        yield name, v, r["Grid Size"]


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    back = 1
    if "--round" in args:
        back = int(args[args.index("--round") + 1])
    ks = list(rows(args[0]))
    starts = [i for i, (n, _, _) in enumerate(ks) if n.startswith("k_embed")]
    if len(starts) < back:
        sys.exit(f"kprof.py: {len(starts)} rounds in {args[0]}, asked for the {back}th from the end")
    lo = starts[-back]
    hi = starts[-back + 1] if back > 1 else len(ks)
    tot, cnt, grid = {}, {}, {}
    for n, v, g in ks[lo:hi]:
        tot[n] = tot.get(n, 0.0) + v
        cnt[n] = cnt.get(n, 0) + 1
        grid.setdefault(n, g)
    if "--seq" in args:
        for i, (n, v, g) in enumerate(ks[lo:min(hi, lo + int(args[args.index("--seq") + 1]))]):
            print(f"{i:4d} {n[:60]:<60} {v:9.2f} us  grid {g}")
    s = sum(tot.values())
    print(f"round {back} from the end: {hi - lo} kernels, {s:.1f} us of kernel time")
    print(f"{'kernel':<44} {'launches':>8} {'total us':>10} {'mean us':>9} {'share':>6}  grid")
    for n in sorted(tot, key=lambda k: -tot[k]):
        print(f"{n[:44]:<44} {cnt[n]:>8} {tot[n]:>10.1f} {tot[n] / cnt[n]:>9.2f} "
              f"{100 * tot[n] / s:>5.1f}%  {grid[n]}")


if __name__ == "__main__":
    main()
