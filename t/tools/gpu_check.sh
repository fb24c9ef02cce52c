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
