#!/usr/bin/env bash
# Runs every libFuzzer harness ($BUILD/fuzz/fuzz_*, built by `make fuzz`) for a bounded time
# from its seed corpus t/fuzz/corpus/<name>/ and reports TAP: ok when it ran without a crash.
cd "$(dirname "$0")/../.." || exit 2
build=${BUILD:-build}
seconds=${FUZZ_SECONDS:-20}
fuzzers=()
for f in "$build"/fuzz/fuzz_*; do
    [ -x "$f" ] && [ -f "$f" ] && fuzzers+=("$f")
done
if [ ${#fuzzers[@]} -eq 0 ]; then
    if [ -n "${CI:-}" ]; then echo "1..1"; echo "not ok 1 - no fuzzers built (CI must build them: make fuzz)"; exit 1; fi
    echo "1..0 # SKIP no fuzzers built"
    exit 0
fi
echo "1..${#fuzzers[@]}"
# UBSan only reports by default; halting makes undefined behaviour a crash libFuzzer catches.
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
n=0
failed=0
for f in "${fuzzers[@]}"; do
    n=$((n + 1))
    name=$(basename "$f")
    work=$(mktemp -d) || exit 2
    mkdir -p "$work/corpus" "$work/artifacts"
    for seeds in "t/fuzz/corpus/$name" "t/fuzz/corpus/${name#fuzz_}"; do
        [ -d "$seeds" ] && cp "$seeds"/* "$work/corpus/" 2>/dev/null
    done
    "$f" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1
    rc=$?
    runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$work/log" | tail -n 1)
    if [ $rc -eq 0 ] && [ -n "$runs" ]; then
        echo "ok $n - $name: no crash in $seconds s ($runs runs)"
    else
        failed=$((failed + 1))
        echo "not ok $n - $name: exit $rc"
        # from the first sanitizer or libFuzzer report on, else the end of the log
        report=$(awk '/runtime error|ERROR: |WARNING: |SUMMARY: /{p=1} p' "$work/log" | head -n 40)
        [ -n "$report" ] || report=$(tail -n 40 "$work/log")
        printf '%s\n' "$report" | sed 's/^/#   /'
        for a in "$work"/artifacts/*; do
            [ -f "$a" ] || continue
            echo "#   crash input ($(basename "$a")), hex:"
            od -An -tx1 -v "$a" | head -n 20 | sed 's/^/#   /'
        done
    fi
    rm -rf "$work"
done
[ $failed -eq 0 ]
