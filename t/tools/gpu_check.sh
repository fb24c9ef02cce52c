#!/usr/bin/env bash
# On the device machine, in a copy of the repo with build/muse-engine and build/muse-pack carried
# over (and libcjson on LD_LIBRARY_PATH): kernel-check on CUDA over the tiny pack shapes, then
# muse-engine compare cpu vs cuda on the demo pack and a 4-bit tiny pack. Writes under $OUT.
cd "$(dirname "$0")/../.." || exit 2
export NCCL_NVLS_ENABLE=0
out=${OUT:-$(mktemp -d)}
nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv | tee "$out/gpu.txt"
build/muse-engine version | tee "$out/version.txt"
MUSE_OPS_BACKEND=cuda timeout 100 bash t/ops/ops.t 2>&1 | tee "$out/ops.txt" | grep -E "^ok|^not ok|SUMMARY"
tokens=$(seq -s, 5 37 900 | cut -d, -f1-24)
tmp=$(mktemp -d)
build/muse-pack --config conf/packs/tiny.json --out "$tmp/p4" --seed 3 --exl3-random 4 --codebook mul1 >/dev/null
for p in conf/packs/demo-en "$tmp/p4"; do
    f="$out/compare-$(basename "$p").txt"
    timeout 40 build/muse-engine compare --model "$p" --tokens "$tokens" --a cpu --b cuda >"$f" 2>&1
    echo "compare $p rc=$?"
    grep -E "rel L2|agreement|router|PASS|FAIL" "$f" | head -5
done
# two ranks on one GPU (--gpus 0,0) against the CPU backend at --ranks 2, on the tiny-tp packs
build/muse-pack --config conf/packs/tiny-tp.json --out "$tmp/tp16" --seed 7 >/dev/null
build/muse-pack --config conf/packs/tiny-tp.json --out "$tmp/tp4" --seed 7 --exl3-random 4 --codebook mul1 >/dev/null
tp_tokens=$(seq -s, 7 41 900 | cut -d, -f1-20)
for p in "$tmp/tp16" "$tmp/tp4"; do
    n=$(basename "$p")
    timeout 120 build/muse-engine kernel-check --model "$p" --backend cuda --gpus 0,0 >"$out/kc2-$n.txt" 2>&1
    echo "kernel-check --gpus 0,0 $n rc=$?"; grep SUMMARY "$out/kc2-$n.txt"
    for g in 1 0; do
        MUSE_CUDA_GRAPHS=$g timeout 60 build/muse-engine compare --model "$p" --tokens "$tp_tokens" --a cpu \
            --ranks-a 2 --b cuda --gpus-b 0,0 --min-agree 100 --max-rel-l2 0 >"$out/cmp2-$n-g$g.txt" 2>&1
        echo "compare cpu x2 vs cuda --gpus 0,0 (graphs $g) $n rc=$?"; grep -E "rel L2 max|PASS|FAIL" "$out/cmp2-$n-g$g.txt"
    done
    for run in a b; do
        timeout 60 build/muse-engine generate --model "$p" --tokens 5,6,7 --max-tokens 24 --temperature 0.8 --seed 3 \
            --backend cuda --gpus 0,0 >"$out/gen2-$n-$run.txt" 2>&1
    done
    build/muse-engine generate --model "$p" --tokens 5,6,7 --max-tokens 24 --temperature 0.8 --seed 3 --ranks 2 >"$out/gen2-$n-cpu.txt" 2>&1
    cmp -s "$out/gen2-$n-a.txt" "$out/gen2-$n-b.txt" && cmp -s "$out/gen2-$n-a.txt" "$out/gen2-$n-cpu.txt" \
        && echo "generate --gpus 0,0 $n: twice the same, equal to cpu --ranks 2" || echo "generate --gpus 0,0 $n: DIFFERS"
done
