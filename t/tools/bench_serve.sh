#!/usr/bin/env bash
# Starts or stops muse-engine + nginx for muse-bench on 127.0.0.1:PORT, through mk/run.sh and
# mk/stop.sh, with its own run directory and engine flags.
#   t/tools/bench_serve.sh start PORT PACK RUN_DIR BUILD [muse-engine serve flags...]
#   t/tools/bench_serve.sh stop RUN_DIR
# PACK - : no --model (the flags name the weights: --synthetic-weights SEED --config FILE ...).
# IDLE_TIMEOUT (default 600s) is nginx's muse_idle_timeout; keepalive_requests is raised so a
# keep-alive benchmark is not cut at nginx's default 1000 requests a connection.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
case "${1:-}" in
stop) RUN_DIR=${2:?RUN_DIR} exec "$here/mk/stop.sh" ;;
start)
    port=${2:?PORT} pack=${3:?PACK} run=${4:?RUN_DIR} build=${5:?BUILD}
    shift 5
    mkdir -p "$run"
    [ "$pack" = - ] || pack=$(cd "$pack" && pwd)
    PORT=$port MODEL=$pack RUN_DIR=$(cd "$run" && pwd) BUILD=$(cd "$build" && pwd) \
        ENGINE_ARGS="$*" IDLE_TIMEOUT=${IDLE_TIMEOUT:-600s} KEEPALIVE_REQUESTS=1000000 DEMO=0 \
        exec "$here/mk/run.sh" ;;
*) echo "usage: $0 start PORT PACK RUN_DIR BUILD [flags] | stop RUN_DIR" >&2; exit 2 ;;
esac
