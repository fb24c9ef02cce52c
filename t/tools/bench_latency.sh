#!/usr/bin/env bash
# Added latency (engine publish -> client receive) through real nginx + ngx_muse_module:
# starts nginx as `make run` does, puts `muse-bench stamp-engine` in the engine's place, and
# runs `muse-bench server --mode latency` RUNS times.
#   t/tools/bench_latency.sh [--same-cpu N] [--requests R] [--runs K] [--port P]
# --same-cpu N puts the stamp engine, the nginx worker and the client on CPU N (taskset), so
# every wake-up is a context switch on one CPU instead of a cross-CPU interrupt.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$here/build} pack=${MODEL:-$here/build/demo/pack}
cpu="" requests=200 runs=3 port=18300
while [ $# -gt 0 ]; do
    case "$1" in
    --same-cpu) cpu=${2:?--same-cpu needs a CPU number}; shift 2 ;;
    --requests) requests=${2:?}; shift 2 ;;
    --runs) runs=${2:?}; shift 2 ;;
    --port) port=${2:?}; shift 2 ;;
    *) echo "usage: $0 [--same-cpu N] [--requests R] [--runs K] [--port P]" >&2; exit 2 ;;
    esac
done
[ -f "$pack/tokenizer.json" ] || { echo "no pack at $pack: run 'make demo-pack' or set MODEL" >&2; exit 2; }
run=$(mktemp -d /tmp/muse-latency.XXXXXX)
pin=()
[ -n "$cpu" ] && pin=(taskset -c "$cpu")
cleanup() { "$here/t/tools/bench_serve.sh" stop "$run" >/dev/null 2>&1 || true; rm -rf "$run"; }
trap cleanup EXIT
# nginx exactly as `make run` configures it; its engine is swapped for the stamp engine
IDLE_TIMEOUT=60s "$here/t/tools/bench_serve.sh" start "$port" "$pack" "$run" "$build" \
    --streams 2 --queue 4 >/dev/null
kill "$(cat "$run/engine.pid")"
while kill -0 "$(cat "$run/engine.pid")" 2>/dev/null; do sleep 0.1; done
gid=$(stat -c %g "$run")
"${pin[@]}" "$build/muse-bench" stamp-engine --shm "/muse-run-$port" --socket "$run/engine.sock" \
    --gid "$gid" --tokens 64 --gap-us 1000 >"$run/logs/stamp.log" 2>&1 &
echo $! >"$run/engine.pid"
for _ in $(seq 1 100); do grep -q ready "$run/logs/stamp.log" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$run/logs/stamp.log" || { echo "stamp-engine did not start:" >&2; cat "$run/logs/stamp.log" >&2; exit 1; }
if [ -n "$cpu" ]; then
    for w in $(pgrep -P "$(cat "$run/nginx.pid")"); do taskset -pc "$cpu" "$w" >/dev/null; done
fi
sleep 1 # the health page and heartbeat of the new engine reach nginx
for _ in $(seq 1 "$runs"); do
    "${pin[@]}" "$build/muse-bench" server --url "http://127.0.0.1:$port" --mode latency \
        --requests "$requests"
done
