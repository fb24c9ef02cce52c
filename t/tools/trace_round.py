#!/usr/bin/env python3
"""trace_round.py: one decode round of a kernel trace (t/tools/kernel_trace.c's CSV) as a
timeline: the round's span, the time no kernel ran, and by kernel each one's launches, device
time (start to end: a kernel launched early by programmatic dependent launch starts before the
one it waits for ends) and end increments (the time from the latest end before its own to its
end, idle time before its start included: a serial chain's increments are its critical path;
where a side stream's kernel ends inside another's run the increment goes to whichever ends
first, so read the side stream's work from --layer's listing). --layer L lists layer L's kernels
in start order with their increments. A round begins at an embed kernel; rounds are taken from
the end. Usage: trace_round.py FILE.csv[.gz] [--round N] [--rounds K] [--layer L] [--layers 64]"""
import csv
import gzip
import re
import sys


def short(name, grid):
    """the kernel's identifier and its template's integers (k_fast_product<1,2,1,2,16,...>)"""
    m = re.match(r"_Z(\d+)", name)
    if not m:
        return name[:60]
    n = int(m.group(1))
    ident = name[len(m.group(0)):len(m.group(0)) + n]
    rest = name[len(m.group(0)) + n:]
    ints = re.findall(r"Li(-?\d+)E", rest[:200]) if rest.startswith("I") else []
    return ident + ("<" + ",".join(ints) + ">" if ints else "") + f"[{grid}]"


def load(path):
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    ks = []
    for r in csv.DictReader(raw):
        ks.append((int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), r["name"], int(r["grid"])))
    ks.sort()
    return ks


def rounds_of(ks):
    starts = [i for i, k in enumerate(ks) if "k_embed" in k[3]]
    return [(starts[i], starts[i + 1]) for i in range(len(starts) - 1)]


def busy_of(rk):
    """the time some kernel of rk (sorted by start) ran: the union of their intervals"""
    busy, cur_s, cur_e = 0, None, None
    for s, e, *_ in rk:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + (cur_e - cur_s if cur_e is not None else 0)


def analyse(ks, lo, hi):
    rk = ks[lo:hi]
    t0 = rk[0][0]
    span = max(k[1] for k in rk) - t0
    busy = busy_of(rk)
    by_end = sorted(rk, key=lambda k: k[1])
    inc = {}
    prev = t0
    for s, e, st, name, grid in by_end:
        key = short(name, grid)
        d = inc.setdefault(key, [0, 0, 0])
        d[0] += 1
        d[1] += e - s
        d[2] += e - prev if e > prev else 0
        prev = max(prev, e)
    return span, busy, inc, rk


def main():
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    opt = lambda k, d: int(a[a.index(k) + 1]) if k in a else d
    back, nr, layer, layers = opt("--round", 2), opt("--rounds", 1), opt("--layer", -1), opt("--layers", 64)
    ks = load(a[0])
    rs = rounds_of(ks)
    if len(rs) < back + nr - 1:
        sys.exit(f"trace_round.py: {len(rs)} whole rounds in {a[0]}; --round {back} --rounds {nr}"
                 f" needs {back + nr - 1}")
    total = {}
    spans = []
    for j in range(nr):
        lo, hi = rs[len(rs) - back - j]
        span, busy, inc, rk = analyse(ks, lo, hi)
        spans.append((span, busy, hi - lo))
        for key, d in inc.items():
            t = total.setdefault(key, [0, 0, 0])
            for i in range(3):
                t[i] += d[i]
    for span, busy, n in spans:
        print(f"round: {n} kernels, span {span / 1e3:.1f} us, some kernel running {busy / 1e3:.1f} us,"
              f" none {(span - busy) / 1e3:.1f} us")
    sp = sum(s for s, _, _ in spans)
    print("| kernel [grid] | launches | device us | end increments us | share |")
    print("|---|---|---|---|---|")
    for key, (c, dev, inc) in sorted(total.items(), key=lambda kv: -kv[1][2]):
        print(f"| {key} | {c // nr} | {dev / 1e3 / nr:.1f} | {inc / 1e3 / nr:.1f} | {100 * inc / sp:.1f}% |")
    if layer >= 0:
        lo, hi = rs[len(rs) - back]
        rk = ks[lo:hi]
        per = (hi - lo - 4) // layers  # embed, norm first; head, sampler last (about)
        seg = rk[1 + layer * per: 1 + (layer + 1) * per + per // 2]
        t0 = seg[0][0]
        prev_end = seg[0][0]
        print(f"\nlayer {layer} (about {per} kernels a layer), us from its first kernel's start:")
        print("| kernel [grid] | stream | start | end | device | end increment |")
        print("|---|---|---|---|---|---|")
        for s, e, st, name, grid in seg:
            print(f"| {short(name, grid)} | {st} | {(s - t0) / 1e3:.1f} | {(e - t0) / 1e3:.1f} |"
                  f" {(e - s) / 1e3:.1f} | {max(0, e - max(prev_end, s)) / 1e3:.1f} |")
            prev_end = max(prev_end, e)


if __name__ == "__main__":
    main()
