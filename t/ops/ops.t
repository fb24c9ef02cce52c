#!/usr/bin/env bash
# muse-engine kernel-check (engine/check/ops_check.c, the registry in engine/check/registry.c) on
# every tiny pack shape: fp16 (tiny), bf16 with a tied head and other widths (tiny-flip), and
# EXL3 at 2 and 4 bits with two codebooks, tiny-mha (as many KV heads as query heads and
# the vocabulary as wide as the hidden size: a case's activations of two widths of one size),
# and tiny-wide (hidden 8192: the row kernels' blocks of 1024 threads, past hidden 6144's 768).
# Each run checks every kernel of the backend seam against the CPU reference and its planted
# controls; its failing TAP lines and SUMMARY are passed through under a prefix, one ok line a
# run here. MUSE_OPS_BACKEND=cuda checks the CUDA backend the same way (a skip line where there
# is no GPU).
cd "$(dirname "$0")/../.." || exit 2
engine=build/muse-engine pack=build/muse-pack
backend=${MUSE_OPS_BACKEND:-cpu}
if [ ! -x "$engine" ] || [ ! -x "$pack" ]; then
    [ -n "$CI" ] && { echo "Bail out! $engine or $pack not built"; exit 1; }
    echo "1..0 # SKIP $engine not built (make)"; exit 0
fi
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
runs=("tiny.json fp16" "tiny-flip.json bf16-tied" "tiny.json exl3-2-mcg --exl3-random 2 --codebook mcg"
      "tiny.json exl3-4-3inst --exl3-random 4 --codebook 3inst" "tiny-mha.json mha"
      "tiny-wide.json wide")
# the fast path (against the exact path of the same backend, rows up to 256) on packs made
# above: kernel-check flags after the tag
fast_runs=("exl3-2-mcg" "exl3-4-3inst" "fp16" "wide")
echo "1..$((${#runs[@]} + ${#fast_runs[@]} + 3))"
n=0
for r in "${runs[@]}"; do
    set -- $r; cfg=$1 tag=$2; shift 2
    n=$((n + 1))
    if ! "$pack" --config "conf/packs/$cfg" --out "$dir/$tag" --seed 3 "$@" >"$dir/$tag.log" 2>&1; then
        echo "not ok $n - $tag: muse-pack failed"; sed 's/^/# /' "$dir/$tag.log"; continue
    fi
    out=$("$engine" kernel-check --model "$dir/$tag" --backend "$backend" 2>&1); rc=$?
    # a GPU backend where this machine has no GPU (CI) or the binary has no such backend: a
    # visible skip, never a failure
    if [ $rc -eq 2 ] && echo "$out" | grep -qE 'no usable CUDA device|built without the CUDA backend'; then
        why=$(echo "$out" | grep -qE 'built without' && echo "built without CUDA" || echo "no CUDA device")
        echo "ok $n - $tag: backend $backend # skip $why"; continue
    fi
    echo "$out" | grep -E '^not ok|SUMMARY' | sed "s/^/# $tag: /"
    if [ $rc -eq 0 ] && echo "$out" | grep -qE '^# SUMMARY .*: kernels checked [1-9][0-9]*, passed [0-9]+, failed 0; controls red as planted ([0-9]+) of \1, missed 0$'; then
        echo "ok $n - $tag: every kernel equals the reference, batch-invariant and repeatable; every control red"
    else
        echo "not ok $n - $tag: kernel-check exit $rc"
    fi
done
for tag in "${fast_runs[@]}"; do
    n=$((n + 1))
    out=$("$engine" kernel-check --model "$dir/$tag" --backend "$backend" --kernels fast --max-rows 256 2>&1); rc=$?
    if [ $rc -eq 2 ] && echo "$out" | grep -qE 'no usable CUDA device|built without the CUDA backend'; then
        echo "ok $n - $tag --kernels fast: backend $backend # skip no CUDA"; continue
    fi
    echo "$out" | grep -E '^not ok|SUMMARY' | sed "s/^/# $tag fast: /"
    if [ $rc -eq 0 ] && echo "$out" | grep -q "^# backend $backend, kernels fast (against $backend exact)" &&
        echo "$out" | grep -q 'rows 1, 4, 16, 17, 64, 256;' &&
        echo "$out" | grep -qE '^# SUMMARY .*: kernels checked [1-9][0-9]*, passed [0-9]+, failed 0; controls red as planted ([0-9]+) of \1, missed 0$'; then
        echo "ok $n - $tag --kernels fast: within the bound of the exact path, batch-invariant at 1..256 rows; every control red"
    else
        echo "not ok $n - $tag --kernels fast: kernel-check exit $rc"
    fi
done
# kernels/CONTRACT.md's registry table is the one the list makes
n=$((n + 1))
if "$engine" kernel-check --contract >"$dir/contract.md" && [ -s "$dir/contract.md" ] &&
    diff <(grep '^|' kernels/CONTRACT.md) "$dir/contract.md" >"$dir/contract.diff"; then
    echo "ok $n - kernels/CONTRACT.md's table equals muse-engine kernel-check --contract"
else
    echo "not ok $n - kernels/CONTRACT.md's table differs from kernel-check --contract (paste its output):"
    sed 's/^/# /' "$dir/contract.diff"
fi
# a kernel path that is not one: exit 2 naming the flag or the variable
n=$((n + 1))
out1=$("$engine" kernel-check --model "$dir/fp16" --kernels quick 2>&1); rc1=$?
out2=$(MUSE_CUDA_PATH=quick "$engine" kernel-check --model "$dir/fp16" 2>&1); rc2=$?
if [ $rc1 -eq 2 ] && echo "$out1" | grep -q -- '--kernels quick: the kernel path is exact' &&
    [ $rc2 -eq 2 ] && echo "$out2" | grep -q 'MUSE_CUDA_PATH quick: the kernel path is exact'; then
    echo "ok $n - --kernels quick and MUSE_CUDA_PATH=quick: exit 2 naming them and the choices"
else
    echo "not ok $n - bad kernel path: exit $rc1 ($out1), $rc2 ($out2)"
fi
# bad input: exit 2 naming the flag, before any pack is read
n=$((n + 1))
out1=$("$engine" kernel-check --max-rows 64 2>&1); rc1=$?
out2=$("$engine" kernel-check --model "$dir/fp16" --max-rows 5 2>&1); rc2=$?
if [ $rc1 -eq 2 ] && echo "$out1" | grep -q -- '--model DIR is required' && [ $rc2 -eq 2 ] &&
    echo "$out2" | grep -q -- '--max-rows 5'; then
    echo "ok $n - kernel-check without --model or with --max-rows 5: exit 2 naming the flag"
else
    echo "not ok $n - kernel-check bad input: exit $rc1 ($out1), $rc2 ($out2)"
fi
