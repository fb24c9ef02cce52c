#!/bin/sh
# Encode speed of muse's tokenizer on English text, one core (run by hand).
# Usage: t/tools/tokenizer_bench.sh [TOKENIZER_JSON [TEXT_FILE]]
# Defaults: o200k_base + Muse control tokens (converted from js-tiktoken), and ~3 MB of English
# built from the license texts in /usr/share/common-licenses. Needs `make` (build/t/test_tokenizer).
set -eu
cd "$(dirname "$0")/../.."
build=${MUSE_BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tokenizer=${1:-}
if [ -z "$tokenizer" ]; then
    [ -d t/node/node_modules/js-tiktoken ] || npm ci --prefix t/node --no-audit --no-fund >&2
    tokenizer=$tmp/o200k_muse.json
    node t/tools/tiktoken_to_tokenizer_json.mjs "$tokenizer"
fi
text=${2:-}
if [ -z "$text" ]; then
    text=$tmp/english.txt
    for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
        cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/LGPL-3 \
            /usr/share/common-licenses/Apache-2.0 /usr/share/common-licenses/GPL-2 \
            /usr/share/common-licenses/Artistic /usr/share/common-licenses/MPL-2.0 \
            /usr/share/common-licenses/GFDL-1.3 /usr/share/common-licenses/LGPL-2.1
    done >"$text"
fi
taskset -c 0 "$build/t/test_tokenizer" --bench "$tokenizer" "$text" 2>/dev/null ||
    "$build/t/test_tokenizer" --bench "$tokenizer" "$text"
