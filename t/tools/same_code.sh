#!/usr/bin/env bash
# same_code.sh BASE [FILE.cu ...]: whether each kernel of the given kernels/*.cu (default: those
# that differ from BASE) compiles to the same sm_90a machine code at BASE and in the working
# tree, with the Makefile's flags. A change that keeps a kernel's bytes keeps its bits: the
# no-GPU check that a refactor left the default path alone. Prints SAME (also under a new name,
# as a kernel made a template), DIFF (with its instructions before and after), NEW or GONE a
# kernel (its .text section's words, addresses left out); exits 1 where one differs or is gone.
set -u
base=${1:?usage: same_code.sh BASE [FILE.cu ...]}
shift
cd "$(dirname "$0")/../.." || exit 2
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
files=("$@")
[ ${#files[@]} -gt 0 ] || mapfile -t files < <(git diff --name-only "$base" -- 'kernels/*.cu')
[ ${#files[@]} -gt 0 ] || { echo "no kernels/*.cu differs from $base"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$base" kernels engine | tar -x -C "$tmp" || exit 2
# a kernel section's words without the dump's address column
words() { readelf -x "$1" "$2" 2>/dev/null | tail -n +3 | awk '{print $2, $3, $4, $5}' | md5sum; }
sections() { readelf -SW "$1" 2>/dev/null | grep -o '\.text\.[^ ]*' | sort -u; }
# a section's size in instructions (16 bytes each on sm_90a)
count() {
    local h
    h=$(readelf -SW "$1" 2>/dev/null | awk -v s="$2" '{for (i = 1; i < NF; i++) if ($i == s) print $(i + 4)}')
    echo $((16#${h:-0} / 16))
}
bad=0
for f in "${files[@]}"; do
    flags=(-O2 -std=c++17 -arch=sm_90a -cubin)
    # the Makefile's -fmad=false, except where mk/fast.mk filters it out
    grep -q "obj/$f:\|obj/${f%.cu}.o:" mk/fast.mk 2>/dev/null || flags+=(-fmad=false)
    if [ ! -f "$tmp/$f" ]; then
        echo "$f: new at the working tree"
        continue
    fi
    (cd "$tmp" && "$NVCC" "${flags[@]}" -Iengine -I. "$f" -o "$tmp/old.cubin") || exit 2
    "$NVCC" "${flags[@]}" -Iengine -I. "$f" -o "$tmp/new.cubin" || exit 2
    while read -r s; do
        if ! sections "$tmp/new.cubin" | grep -qxF "$s"; then
            # renamed (made a template, say): the same words under a new name
            w=$(words "$s" "$tmp/old.cubin") same=
            while read -r t; do
                [ "$(words "$t" "$tmp/new.cubin")" = "$w" ] && same=$t && break
            done < <(sections "$tmp/new.cubin")
            if [ -n "$same" ]; then
                echo "SAME $f ${s#.text.} as ${same#.text.}"
            else
                echo "GONE $f ${s#.text.}"
                bad=1
            fi
        elif [ "$(words "$s" "$tmp/old.cubin")" = "$(words "$s" "$tmp/new.cubin")" ]; then
            echo "SAME $f ${s#.text.}"
        else
            echo "DIFF $f ${s#.text.} ($(count "$tmp/old.cubin" "$s") -> $(count "$tmp/new.cubin" "$s") instructions)"
            bad=1
        fi
    done < <(sections "$tmp/old.cubin")
    sections "$tmp/new.cubin" | while read -r s; do
        sections "$tmp/old.cubin" | grep -qxF "$s" || echo "NEW  $f ${s#.text.}"
    done
done
exit $bad
