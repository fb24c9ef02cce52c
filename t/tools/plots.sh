#!/bin/sh
# Plots of muse-bench JSON by gnuplot into SVG and PNG files: decode tokens/s against streams beside
# llama.cpp's measured points and the targets (issue 21), prompt tokens/s against length, and
# one decode round stage by stage. Any of the three inputs may be left out.
#   t/tools/plots.sh [--decode FILE] [--prompt FILE] [--stages FILE] [--out DIR (docs)]
# Writes DIR/bench-decode, bench-prompt and bench-stages (.svg and .png) for the inputs given.
set -eu
decode= prompt= stages= out=docs
while [ $# -gt 0 ]; do
    case "$1" in
    --decode) decode=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "plots.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
    esac
done
[ -n "$decode$prompt$stages" ] || { echo "plots.sh: give --decode, --prompt or --stages FILE" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "plots.sh: gnuplot not found (Debian: apt-get install gnuplot-nox)" >&2; exit 3; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The rows of a muse-bench JSON file as tab-separated columns (python3: JSON in the standard
# library); the first line "# title" names the run. A missing or non-numeric cell is "-".
extract() { # bench file col...
    python3 - "$@" <<'PY'
import json, sys
bench, path, cols = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    j = json.load(open(path))
except (OSError, ValueError) as e:
    sys.exit("plots.sh: %s: %s" % (path, e))
if j.get("bench") != bench:
    sys.exit("plots.sh: %s is muse-bench %s JSON, not %s" % (path, j.get("bench"), bench))
print("# %s, %s, %s" % (j.get("backend", "?"), j.get("device", "?"), j.get("date", "?")))
for r in j.get("rows", []):
    cells = []
    for c in cols:
        v = r.get(c, "-")
        cells.append(str(v).replace("\t", " ") if v is not None else "-")
    print("\t".join(cells))
PY
}

svg='set terminal svg size 800,480 dynamic font "sans,12" background "white"'
png() { # the same plot again as NAME.png
    printf 'set terminal png size 800,480 background "#ffffff"\nset output "%s/%s.png"\nreplot\n' "$out" "$1"
}

if [ -n "$decode" ]; then
    extract decode "$decode" streams "decode tok/s" "tok/s per stream" > "$tmp/decode.dat"
    run=$(head -1 "$tmp/decode.dat" | cut -c3-)
    printf '1\t57.1\n4\t105.5\n' > "$tmp/llama.dat"
    printf '1\t100\n4\t200\n16\t500\n' > "$tmp/target.dat"
    gnuplot <<GP
$svg
set output "$out/bench-decode.svg"
set title "muse decode tokens/s against streams\n($run)" noenhanced
set xlabel "streams decoding together"
set ylabel "tokens/s"
set logscale x 2
set key left top
set grid
set datafile separator "\t"
plot "$tmp/decode.dat" using 1:2 with linespoints lw 2 pt 7 title "muse, aggregate", \
     "$tmp/decode.dat" using 1:3 with linespoints lw 1 pt 6 title "muse, per stream", \
     "$tmp/llama.dat" using 1:2 with points pt 5 ps 1.5 title "llama.cpp, same H200 (issue 21)", \
     "$tmp/target.dat" using 1:2 with points pt 2 ps 1.5 title "targets (issue 21)"
$(png bench-decode)
GP
fi

if [ -n "$prompt" ]; then
    extract prompt "$prompt" "prompt tokens" "prompt tok/s" > "$tmp/prompt.dat"
    run=$(head -1 "$tmp/prompt.dat" | cut -c3-)
    printf '4096\t1662\n' > "$tmp/llama.dat"
    printf '4096\t4000\n' > "$tmp/target.dat"
    gnuplot <<GP
$svg
set output "$out/bench-prompt.svg"
set title "muse prompt tokens/s against prompt length\n($run)" noenhanced
set xlabel "prompt tokens"
set ylabel "prompt tokens/s (tokens / TTFT)"
set logscale x 2
set key right bottom
set grid
set datafile separator "\t"
set datafile missing "-"
plot "$tmp/prompt.dat" using 1:2 with linespoints lw 2 pt 7 title "muse", \
     "$tmp/llama.dat" using 1:2 with points pt 5 ps 1.5 title "llama.cpp, same H200 (issue 21)", \
     "$tmp/target.dat" using 1:2 with points pt 2 ps 1.5 title "target (issue 21)"
$(png bench-prompt)
GP
fi

if [ -n "$stages" ]; then
    extract stages "$stages" stage "ms a step" "% of step" > "$tmp/stages.raw"
    run=$(head -1 "$tmp/stages.raw" | cut -c3-)
    # the stages that were timed (not "-"), as "stage<TAB>ms<TAB>share"
    tail -n +2 "$tmp/stages.raw" | awk -F'\t' '$2 != "-"' > "$tmp/stages.dat"
    gnuplot <<GP
$svg
set output "$out/bench-stages.svg"
set title "one decode round, stage by stage\n($run)" noenhanced
set ylabel "ms a round"
set style fill solid 0.7 border -1
set boxwidth 0.7
set xtics rotate by -35 noenhanced
set yrange [0:*]
set grid y
set datafile separator "\t"
plot "$tmp/stages.dat" using 0:(\$2 > 0 ? \$2 : 0):xtic(1) with boxes notitle, \
     "" using 0:(\$2 > 0 ? \$2 : 0):(sprintf("%.1f%%", \$3)) with labels offset 0,0.7 notitle
$(png bench-stages)
GP
fi
