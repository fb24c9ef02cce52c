#!/usr/bin/env python3
"""trace_rounds.py: every round of a kernel trace (t/tools/kernel_trace.c's CSV, a round from one
embed kernel to the next) a line: its kernels, span (first start to last end), the time some
kernel ran, and the gap since the previous round's last end (host time between rounds: the
scheduler, staging, a graph's capture); rounds and gaps under 2 ms are counted, not listed.
Usage: trace_rounds.py FILE.csv[.gz]"""
import sys

from trace_round import busy_of, load


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ks = load(sys.argv[1])
    starts = [i for i, k in enumerate(ks) if "k_embed" in k[3]] + [len(ks)]
    rs = list(zip(starts, starts[1:]))  # the last round runs to the trace's end
    print("| round | kernels | span ms | busy ms | gap before ms |")
    print("|---|---|---|---|---|")
    prev_end, rows, total = None, [], [0, 0, 0]
    for r, (lo, hi) in enumerate(rs):
        rk = ks[lo:hi]
        end = max(k[1] for k in rk)
        span, busy = end - rk[0][0], busy_of(rk)
        gap = rk[0][0] - prev_end if prev_end is not None else 0
        prev_end = end
        rows.append((r, len(rk), span / 1e6, busy / 1e6, gap / 1e6))
        total = [total[0] + span, total[1] + busy, total[2] + gap]
    small = 0
    for row in rows:  # short rounds (decode steps) counted, not listed
        if row[2] < 2 and row[4] < 2:
            small += 1
            continue
        print("| %d | %d | %.3f | %.3f | %.3f |" % row)
    print("rounds under 2 ms with gaps under 2 ms, not listed: %d" % small)
    print("rounds %d: span %.1f ms, busy %.1f ms, gaps %.1f ms" %
          (len(rows), total[0] / 1e6, total[1] / 1e6, total[2] / 1e6))


if __name__ == "__main__":
    main()
