#!/usr/bin/env bash
# Starts muse-engine and nginx (with ngx_muse_module) on 127.0.0.1:$PORT as background
# processes, waits for /health, and (unless DEMO=0) streams one chat reply. Called by
# `make run`, and by t/tools/bench_serve.sh for benchmarks. mk/stop.sh stops both by pid.
# Optional: ENGINE_ARGS (serve flags; default --streams 4 --queue 16), IDLE_TIMEOUT (nginx's
# muse_idle_timeout), KEEPALIVE_REQUESTS (nginx's keepalive_requests), NGINX_BIN (the nginx binary;
# default nginx on PATH). MODEL=- passes no --model (ENGINE_ARGS names the weights, e.g.
# --synthetic-weights SEED --config FILE --tokenizer FILE).
set -euo pipefail
: "${PORT:?}" "${MODEL:?}" "${RUN_DIR:?}" "${BUILD:?}"
mkdir -p "$RUN_DIR"/logs "$RUN_DIR"/conf "$RUN_DIR"/tmp
if [ -f "$RUN_DIR/engine.pid" ] && kill -0 "$(cat "$RUN_DIR/engine.pid")" 2>/dev/null; then
    echo "muse is already running (pids in $RUN_DIR); run 'make stop' first" >&2
    exit 1
fi
user=www-data
id "$user" >/dev/null 2>&1 || user=nobody
group=$(id -gn "$user")
chgrp "$group" "$RUN_DIR" && chmod 0750 "$RUN_DIR"
sock="$RUN_DIR/engine.sock"
model=(--model "$MODEL")
[ "$MODEL" = - ] && model=()
shm="/muse-run-$PORT"

# shellcheck disable=SC2086 # ENGINE_ARGS is a list of flags
"$BUILD/muse-engine" serve "${model[@]}" --listen "$sock" --shm "$shm" --group "$group" \
    --model-id muse-spark ${ENGINE_ARGS:---streams 4 --queue 16} >"$RUN_DIR/logs/engine.log" 2>&1 &
echo $! >"$RUN_DIR/engine.pid"

cat >"$RUN_DIR/conf/nginx.conf" <<CONF
load_module $BUILD/nginx/ngx_muse_module.so;
user $user;
worker_processes 1;
pid $RUN_DIR/nginx.pid;
error_log $RUN_DIR/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log $RUN_DIR/logs/access.log;
    client_body_temp_path $RUN_DIR/tmp/body;
    proxy_temp_path $RUN_DIR/tmp/proxy;
    fastcgi_temp_path $RUN_DIR/tmp/fastcgi;
    uwsgi_temp_path $RUN_DIR/tmp/uwsgi;
    scgi_temp_path $RUN_DIR/tmp/scgi;
    client_max_body_size 8m;
    ${KEEPALIVE_REQUESTS:+keepalive_requests $KEEPALIVE_REQUESTS;}
    muse_engine $sock $(id -un);
    muse_model_id muse-spark;
    ${IDLE_TIMEOUT:+muse_idle_timeout $IDLE_TIMEOUT;}
    server {
        listen 127.0.0.1:$PORT;
        location = /v1/chat/completions { muse_serve chat; }
        location = /v1/completions      { muse_serve completions; }
        location = /v1/models           { muse_serve models; }
        location = /health              { muse_serve health; }
        location = /metrics             { muse_serve metrics; }
    }
}
CONF
"${NGINX_BIN:-nginx}" -p "$RUN_DIR" -c "$RUN_DIR/conf/nginx.conf" -g "daemon on;" >/dev/null

url="http://127.0.0.1:$PORT"
for _ in $(seq 1 600); do
    if curl -fs "$url/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$(cat "$RUN_DIR/engine.pid")" 2>/dev/null; then
        echo "muse-engine exited; its log:" >&2; tail -20 "$RUN_DIR/logs/engine.log" >&2
        RUN_DIR=$RUN_DIR "$(dirname "$0")/stop.sh" >/dev/null; exit 1
    fi
    sleep 0.2
done
curl -fs "$url/health" >/dev/null || { echo "no healthy /health after 120 s; see $RUN_DIR/logs" >&2; exit 1; }

if [ "${DEMO:-1}" = 0 ]; then
    echo "muse up on $url (engine pid $(cat "$RUN_DIR/engine.pid"), nginx pid $(cat "$RUN_DIR/nginx.pid"))"
    exit 0
fi
echo "muse is up on $url (model pack: $MODEL). One streamed chat reply:"
echo
curl -sN "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model":"muse-spark","stream":true,"max_tokens":96,"temperature":0,"messages":[{"role":"user","content":"Tell me about the economy."}]}' |
    tee "$RUN_DIR/reply.sse"
# the deltas put together, so the reply reads as text
python3 -c 'import json, sys
parts = [json.loads(l[6:])["choices"][0]["delta"].get("content") or "" for l in sys.stdin
         if l.startswith("data: {")]
print("The reply, put together: " + "".join(parts).strip())' <"$RUN_DIR/reply.sse"
cat <<MSG

Call it like any OpenAI endpoint, for example:
  curl -sN $url/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"stream":true,"messages":[{"role":"user","content":"Hi"}]}'
  curl -s $url/health
Logs and pids: $RUN_DIR (engine.log, error.log, access.log). Stop both with: make stop
MSG
