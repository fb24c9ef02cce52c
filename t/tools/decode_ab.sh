#!/bin/bash
# Decode A/B on a GPU machine: the whole one-GPU shape's muse-bench decode under each of
# AB_VARIANTS ("default" or NAME=VALUE[,NAME=VALUE]: environment switches of one binary),
# interleaved, AB_REPS times (default 2), at AB_STREAMS (1,4) for AB_TOKENS (24) rounds; prints
# each run's copy bandwidth and table rows. Run after gpu_check.sh's setup step (its .debs).
cd "$(dirname "$0")/../.." || exit 2
export LD_LIBRARY_PATH=/tmp/muse-debs/usr/lib/x86_64-linux-gnu
cut=(--synthetic-weights 1 --config conf/packs/muse-spark-open-1gpu.json --bits 2 --codebook mcg
    --kernels fast --streams "${AB_STREAMS:-1,4}" --tokens "${AB_TOKENS:-24}" --prompt 64)
for rep in $(seq 1 "${AB_REPS:-2}"); do
    for v in ${AB_VARIANTS:-default}; do
        e=()
        [ "$v" != default ] && IFS=, read -ra e <<<"$v"
        echo "== $v rep $rep"
        env "${e[@]}" build/muse-bench decode --backend cuda "${cut[@]}" 2>&1 |
            grep -E '^synthetic|copy bandwidth' | sed 's/  */ /g'
    done
done
