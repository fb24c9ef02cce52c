#!/usr/bin/env bash
# Serves a pack (or a synthetic shape) behind nginx and measures it as a client sees it (issue
# 21 items 3 and 4): the engine's plan and context-that-fits lines, `muse-bench concurrent`
# (tok/s, TTFT, token_sha concurrent == solo), /health's per-rank memory beside the device's
# own figures read in the same run (nvidia-smi), and requests beyond the context refused with
# a clear error while other streams go on.
#   t/tools/serve_measure.sh OUT_DIR PORT PACK|- [muse-engine serve flags...]
# PACK - : the flags name the weights (--synthetic-weights SEED --config FILE --tokenizer FILE).
# Env: STREAMS (1,4,16), TOKENS (32), REPS (1), ID_RANGE (100000), PROMPT (64), NGINX_BIN (the nginx
# binary, default MUSE_NGINX, else nginx on PATH), BUILD (default build).
set -uo pipefail
out=${1:?OUT_DIR} port=${2:?PORT} pack=${3:?PACK}
shift 3
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$here/build}
run=$(mktemp -d)
url=http://127.0.0.1:$port
mkdir -p "$out"
# engine and nginx stop however this ends (a step's time limit included)
cleanup() {
    "$here/t/tools/bench_serve.sh" stop "$run" >/dev/null 2>&1
    cp "$run/logs/engine.log" "$run/logs/error.log" "$out/" 2>/dev/null
    rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
export NGINX_BIN=${NGINX_BIN:-${MUSE_NGINX:-nginx}} # (nginx itself reads $NGINX: inherited sockets)
say() { echo "$*" | tee -a "$out/verdict.txt"; }
gpu_mem() { # the device's own view: used and total MiB (absent without nvidia-smi)
    command -v nvidia-smi >/dev/null &&
        nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits
}

t0=$(date +%s.%N)
if ! "$here/t/tools/bench_serve.sh" start "$port" "$pack" "$run" "$build" "$@" >"$out/start.txt" 2>&1; then
    say "FAIL: the server did not start: $(tail -5 "$out/start.txt")"
    exit 1
fi
say "started in $(python3 -c "import time; print(round(time.time() - $t0, 2))") s (engine fill + plan + nginx)"
grep -E "context that fits|memory plan|serving" "$run/logs/engine.log" | tee -a "$out/verdict.txt"

# memory at rest: /health's terms and the device's, read back to back
curl -fs "$url/health" >"$out/health-rest.json"
gpu_mem >"$out/gpu-rest.csv"
python3 - "$out/health-rest.json" "$out/gpu-rest.csv" <<'PY' | tee -a "$out/verdict.txt"
import json, sys
h = json.load(open(sys.argv[1]))
gpu = [l.split(", ") for l in open(sys.argv[2]).read().split("\n") if l.strip()]
print("health: status %s, context_length %s, streams max %s" % (h["status"], h.get("context_length"), h["streams"]["max"]))
for r in h["ranks"]:
    m = r["memory"]
    gib = lambda k: "%.2f" % (m.get(k, 0) / 2**30)
    print("rank %s (%s): device %s GiB, planned %s, weights %s, kv %s, workspace %s, reserve %s, total %s, free %s, left for streams %s, peak %s"
          % (r["rank"], r.get("device"), gib("device_bytes"), gib("planned_bytes"), gib("weights_bytes"),
             gib("kv_bytes"), gib("workspace_bytes"), gib("reserve_bytes"), gib("total_bytes"), gib("free_bytes"),
             gib("left_for_streams_bytes"), gib("peak_bytes")))
for g in gpu:
    used, total = float(g[1]) / 1024, float(g[2]) / 1024
    print("device %s (nvidia-smi): used %.2f GiB of %.2f GiB, free %.2f GiB" % (g[0], used, total, total - used))
PY

"$build/muse-bench" concurrent --url "$url" --streams "${STREAMS:-1,4,16}" --tokens "${TOKENS:-32}" \
    --reps "${REPS:-1}" --id-range "${ID_RANGE:-100000}" --prompt-tokens "${PROMPT:-64}" \
    >"$out/concurrent.txt" 2>&1
say "concurrent: rc $?"
cat "$out/concurrent.txt"

# beyond the context: max_tokens past it, and a prompt longer than it, while four streams run
ctx=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["context_length"])' "$out/health-rest.json")
for i in 1 2 3 4; do
    curl -sN "$url/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\":[$((i * 7)),$((i * 11)),$((i * 13))],\"max_tokens\":48,\"temperature\":0,\"stream\":true}" \
        >"$out/bg-$i.sse" &
done
sleep 0.5
curl -s -o "$out/over-max.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":[5,6,7],\"max_tokens\":$((ctx + 1))}" >"$out/over-max.code"
python3 -c "import json; print(json.dumps({'prompt': [(5 + 37 * i) % 1000 for i in range($ctx + 1)], 'max_tokens': 4}))" \
    >"$run/long.json"
curl -s -o "$out/over-prompt.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
    --data-binary @"$run/long.json" >"$out/over-prompt.code"
gpu_mem >"$out/gpu-busy.csv"
curl -fs "$url/health" >"$out/health-busy.json"
wait
say "max_tokens $((ctx + 1)) past context $ctx: HTTP $(cat "$out/over-max.code"): $(head -c 300 "$out/over-max.json")"
say "a prompt of $((ctx + 1)) tokens: HTTP $(cat "$out/over-prompt.code"): $(head -c 300 "$out/over-prompt.json")"
done_ok=0
for i in 1 2 3 4; do
    grep -qE '"finish_reason":"(length|stop)"' "$out/bg-$i.sse" && grep -q '^data: \[DONE\]' "$out/bg-$i.sse" &&
        done_ok=$((done_ok + 1))
done
say "streams running meanwhile that finished whole: $done_ok of 4"
[ "$(cat "$out/over-max.code")" = 400 ] && [ "$(cat "$out/over-prompt.code")" = 400 ] && [ $done_ok = 4 ] &&
    say "PASS beyond the context: refused with 400, the others streamed on" ||
    say "FAIL beyond the context (see over-*.json, bg-*.sse)"

