#!/usr/bin/env bash
# Stops what `make run` started, by the pids under $RUN_DIR.
set -u
: "${RUN_DIR:?}"
stopped=0
if [ -f "$RUN_DIR/nginx.pid" ]; then
    kill -QUIT "$(cat "$RUN_DIR/nginx.pid")" 2>/dev/null && stopped=1
    rm -f "$RUN_DIR/nginx.pid"
fi
if [ -f "$RUN_DIR/engine.pid" ]; then
    pid=$(cat "$RUN_DIR/engine.pid")
    if kill -TERM "$pid" 2>/dev/null; then
        stopped=1
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$RUN_DIR/engine.pid"
fi
[ "$stopped" = 1 ] && echo "muse stopped" || echo "muse was not running"
