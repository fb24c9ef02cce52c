#!/usr/bin/env bash
# muse-engine logits --backend cuda against --backend cpu on every tiny pack shape (fp16, bf16
# with a tied head, EXL3 at 2 and 4 bits with two codebooks): within 2e-3 relative L2 and the
# same top-1 at every position, whole prompt and in chunks of 5; then muse-engine generate
# (the GPU sampler through the whole plan, decode rounds replayed as CUDA graphs) must draw the
# same tokens as the CPU, greedy and sampled. Where there is no GPU (CI) or the binary has no
# CUDA backend, each run prints a visible skip line.
cd "$(dirname "$0")/../.." || exit 2
engine=build/muse-engine pack=build/muse-pack
if [ ! -x "$engine" ] || [ ! -x "$pack" ]; then
    [ -n "$CI" ] && { echo "Bail out! $engine or $pack not built"; exit 1; }
    echo "1..0 # SKIP $engine not built (make)"; exit 0
fi
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
runs=("tiny.json fp16" "tiny-flip.json bf16-tied" "tiny.json exl3-2-mcg --exl3-random 2 --codebook mcg"
      "tiny.json exl3-4-3inst --exl3-random 4 --codebook 3inst")
tokens=1,17,300,5,99,767,42,7,7,7,512,64,2,600,33,18,250,11,3,640,128,77,5
gen=("--max-tokens 40" "--max-tokens 40 --temperature 0.9 --top-k 40 --top-p 0.95 --min-p 0.02 --seed 11")
echo "1..$(((2 + ${#gen[@]}) * ${#runs[@]}))"
n=0
for r in "${runs[@]}"; do
    set -- $r; cfg=$1 tag=$2; shift 2
    if ! "$pack" --config "conf/packs/$cfg" --out "$dir/$tag" --seed 3 "$@" >"$dir/$tag.log" 2>&1; then
        n=$((n + 1)); echo "not ok $n - $tag: muse-pack failed"; sed 's/^/# /' "$dir/$tag.log"
        n=$((n + 1)); echo "not ok $n - $tag chunk 5: muse-pack failed"
        for g in "${gen[@]}"; do n=$((n + 1)); echo "not ok $n - $tag generate: muse-pack failed"; done
        continue
    fi
    "$engine" logits --model "$dir/$tag" --tokens $tokens --out "$dir/$tag.cpu" >/dev/null 2>&1
    for chunk in whole 5; do
        n=$((n + 1))
        extra=(); [ "$chunk" = whole ] || extra=(--chunk "$chunk")
        out=$("$engine" logits --backend cuda --model "$dir/$tag" --tokens $tokens "${extra[@]}" \
              --out "$dir/$tag.cuda" 2>&1); rc=$?
        if [ $rc -ne 0 ] && echo "$out" | grep -qE 'no usable CUDA device|built without the CUDA backend'; then
            why=$(echo "$out" | grep -qE 'built without' && echo "built without CUDA" || echo "no CUDA device")
            echo "ok $n - $tag chunk $chunk # skip $why"; continue
        fi
        if [ $rc -ne 0 ]; then
            echo "not ok $n - $tag chunk $chunk: muse-engine logits --backend cuda exit $rc"
            echo "$out" | sed 's/^/# /'; continue
        fi
        T=$(echo "$tokens" | tr ',' '\n' | wc -l) # rows of logits: one a prompt token
        if res=$(python3 - "$dir/$tag.cpu" "$dir/$tag.cuda" "$T" <<'PY'
import math, struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read(); T = int(sys.argv[3])
if len(a) != len(b) or not a or len(a) % (4 * T): print("sizes %d and %d" % (len(a), len(b))); sys.exit(1)
V = len(a) // 4 // T
x = struct.unpack("<%df" % (len(a) // 4), a); y = struct.unpack("<%df" % (len(b) // 4), b)
num = sum((p - q) ** 2 for p, q in zip(x, y)); den = sum(p * p for p in x)
rel = math.sqrt(num / den) if den else math.sqrt(num)
rows = len(x) // V
top = sum(max(range(V), key=lambda j: x[r * V + j]) == max(range(V), key=lambda j: y[r * V + j])
          for r in range(rows))
same = sum(p == q for p, q in zip(x, y))
print("relative L2 %.2e, top-1 equal %d of %d rows, %d of %d logits bitwise equal" % (rel, top, rows, same, len(x)))
sys.exit(0 if rel <= 2e-3 and top == rows and all(math.isfinite(v) for v in y) else 1)
PY
        ); then
            echo "ok $n - $tag chunk $chunk: cuda equals cpu ($res)"
        else
            echo "not ok $n - $tag chunk $chunk: $res"
        fi
    done
    for g in "${gen[@]}"; do
        n=$((n + 1))
        want=$("$engine" generate --model "$dir/$tag" --tokens $tokens $g 2>&1)
        got=$("$engine" generate --backend cuda --model "$dir/$tag" --tokens $tokens $g 2>&1); rc=$?
        if [ $rc -ne 0 ] && echo "$got" | grep -qE 'no usable CUDA device|built without the CUDA backend'; then
            why=$(echo "$got" | grep -qE 'built without' && echo "built without CUDA" || echo "no CUDA device")
            echo "ok $n - $tag generate $g # skip $why"; continue
        fi
        if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then
            echo "ok $n - $tag generate $g: the same $(echo "$got" | tr ',' '\n' | wc -l) tokens as cpu"
        else
            echo "not ok $n - $tag generate $g: cuda exit $rc"; echo "# cpu:  $want"; echo "# cuda: $got"
        fi
    done
done
