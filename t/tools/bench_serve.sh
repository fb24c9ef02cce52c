#!/usr/bin/env bash
# Starts or stops muse-engine + nginx (ngx_muse_module) for muse-bench on 127.0.0.1:PORT, the
# way mk/run.sh does, with its own run directory, shm name and engine flags.
#   t/tools/bench_serve.sh start PORT PACK RUN_DIR BUILD [muse-engine serve flags...]
#   t/tools/bench_serve.sh stop RUN_DIR
# stop ends exactly the two processes start began, by the pids it wrote under RUN_DIR.
# IDLE_TIMEOUT (default 600s) is nginx's muse_idle_timeout: a long prompt on a CPU sends nothing
# between the role chunk and the first token for longer than the module's default 60 s.
set -euo pipefail
cmd=${1:?start or stop}
if [ "$cmd" = stop ]; then
    run=${2:?RUN_DIR}
    [ -f "$run/nginx.pid" ] && kill -QUIT "$(cat "$run/nginx.pid")" 2>/dev/null || true
    if [ -f "$run/engine.pid" ]; then
        pid=$(cat "$run/engine.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$run/nginx.pid" "$run/engine.pid"
    exit 0
fi
[ "$cmd" = start ] || { echo "usage: $0 start PORT PACK RUN_DIR BUILD [flags] | stop RUN_DIR" >&2; exit 2; }
port=${2:?PORT} pack=${3:?PACK} run=${4:?RUN_DIR} build=${5:?BUILD}
shift 5
pack=$(cd "$pack" && pwd) build=$(cd "$build" && pwd)
mkdir -p "$run"/logs "$run"/conf "$run"/tmp
run=$(cd "$run" && pwd)
user=www-data
id "$user" >/dev/null 2>&1 || user=nobody
group=$(id -gn "$user")
chgrp "$group" "$run" && chmod 0750 "$run"
sock="$run/engine.sock"
shm="/muse-bench-$port"

"$build/muse-engine" serve --model "$pack" --listen "$sock" --shm "$shm" --group "$group" \
    --model-id muse-spark "$@" >"$run/logs/engine.log" 2>&1 &
echo $! >"$run/engine.pid"

cat >"$run/conf/nginx.conf" <<CONF
load_module $build/nginx/ngx_muse_module.so;
user $user;
worker_processes 1;
pid $run/nginx.pid;
error_log $run/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log $run/logs/access.log;
    client_body_temp_path $run/tmp/body;
    proxy_temp_path $run/tmp/proxy;
    fastcgi_temp_path $run/tmp/fastcgi;
    uwsgi_temp_path $run/tmp/uwsgi;
    scgi_temp_path $run/tmp/scgi;
    client_max_body_size 8m;
    muse_engine $sock $shm;
    muse_model_id muse-spark;
    muse_idle_timeout ${IDLE_TIMEOUT:-600s};
    server {
        listen 127.0.0.1:$port;
        location = /v1/chat/completions { muse_serve chat; }
        location = /v1/completions      { muse_serve completions; }
        location = /health              { muse_serve health; }
        location = /metrics             { muse_serve metrics; }
    }
}
CONF
nginx -p "$run" -c "$run/conf/nginx.conf" -g "daemon on;" >/dev/null

for _ in $(seq 1 600); do
    if curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
        echo "muse up on http://127.0.0.1:$port (engine pid $(cat "$run/engine.pid"), nginx pid $(cat "$run/nginx.pid"))"
        exit 0
    fi
    if ! kill -0 "$(cat "$run/engine.pid")" 2>/dev/null; then
        echo "muse-engine exited; its log:" >&2; tail -20 "$run/logs/engine.log" >&2
        "$0" stop "$run"; exit 1
    fi
    sleep 0.2
done
echo "no healthy /health after 120 s; see $run/logs" >&2
exit 1
