#!/usr/bin/env bash
# sass.sh [-k REGEX] [-c | -l OPCODE] FILE.cu|FILE.cubin ...: the sm_90a machine code of kernels
# as the Makefile builds them, read here without a GPU: instruction counts a loop body are the
# decode's ceiling (docs/gpu.md), and this machine's CUDA has no disassembler. Debian's nvdisasm
# (package nvidia-cuda-toolkit 11.8, component non-free: fetched once by apt-get download into
# build/tools, the system's apt set-up untouched) reads nvcc 13's cubin once its ELF header is
# written in the layout of its own time (ABI version 7, e_flags SM90 | VIRTUAL_SM(SM90) | 0x500):
# the instruction words are the same. MUSE_NVDISASM=PATH takes another nvdisasm (a newer one
# reads the cubin as it is).
#   (none)       the disassembly, each kernel's name demangled
#   -k REGEX     only kernels whose demangled name matches (grep -E)
#   -c           each kernel's instructions, and by opcode (the part before the first '.')
#   -l OPCODE    each kernel's runs between consecutive OPCODEs (HMMA, HGMMA: a loop body a
#                tile): the lengths (N x COUNT for repeats) and the mean count by opcode
set -u
cd "$(dirname "$0")/../.." || exit 2
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
tools=build/tools
regex='' mode=dis anchor=''
while getopts 'k:cl:' o; do
    case $o in
    k) regex=$OPTARG ;;
    c) mode=count ;;
    l) mode=loop anchor=$OPTARG ;;
    *) mode=usage ;;
    esac
done
shift $((OPTIND - 1))
if [ $mode = usage ] || [ $# -eq 0 ]; then
    echo "usage: sass.sh [-k REGEX] [-c | -l OPCODE] FILE.cu|FILE.cubin ... (the options: its opening comment)" >&2
    exit 2
fi

# Debian's nvdisasm into build/tools, from the suite and mirror this machine's apt already uses
fetch_nvdisasm() {
    local d uri suite o
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    # shellcheck disable=SC1091
    suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    if [ -z "$uri" ] || [ -z "$suite" ]; then
        echo "sass.sh: no Debian mirror or suite in this machine's apt set-up; set MUSE_NVDISASM" >&2
        return 1
    fi
    d=$(mktemp -d) && mkdir -p "$d/lists/partial" "$d/cache/archives/partial" || return 1
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite non-free" \
        >"$d/sources.list"
    o=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache" -o APT::Sandbox::User=root)
    echo "sass.sh: fetching Debian's nvidia-cuda-toolkit (84 MB) for its nvdisasm" >&2
    if apt-get "${o[@]}" -qq update && (cd "$d" && apt-get "${o[@]}" -qq download nvidia-cuda-toolkit) &&
        dpkg-deb -x "$d"/nvidia-cuda-toolkit_*.deb "$d/x" && mkdir -p "$tools" &&
        cp "$d/x/usr/bin/nvdisasm" "$tools/nvdisasm"; then
        rm -rf "$d"
        return 0
    fi
    rm -rf "$d"
    echo "sass.sh: could not fetch nvidia-cuda-toolkit's nvdisasm (set MUSE_NVDISASM)" >&2
    return 1
}

dis=${MUSE_NVDISASM:-$tools/nvdisasm}
[ -x "$dis" ] || [ -n "${MUSE_NVDISASM:-}" ] || fetch_nvdisasm || exit 2
[ -x "$dis" ] || { echo "sass.sh: $dis is not an executable" >&2; exit 2; }
old_dis=0
"$dis" --version 2>/dev/null | grep -q 'release 11\.' && old_dis=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The header of nvcc 13's sm_90 cubin in the layout nvdisasm 11.8 reads: ABI version (byte 8)
# 7, and e_flags (bytes 48-51) 0x005a055a where nvcc 13 writes 0x..005a..: checked first.
old_header() { # CUBIN NAME
    local abi flags
    abi=$(od -An -tu1 -j8 -N1 "$1" | tr -d ' ')
    flags=$(od -An -tx4 -j48 -N4 "$1" | tr -d ' ')
    if [ "$abi" != 8 ] || [ "$(((16#$flags >> 8) & 0xff))" != 90 ]; then
        echo "sass.sh: $2 is not an sm_90 cubin of ABI 8 (ABI $abi, e_flags 0x$flags)" >&2
        return 1
    fi
    printf '\007' | dd of="$1" bs=1 seek=8 conv=notrunc status=none &&
        printf '\132\005\132\000' | dd of="$1" bs=1 seek=48 conv=notrunc status=none
}

# a file's disassembly, each kernel's section line followed by its demangled name
disassemble() {
    local f=$1 cubin=$tmp/k.cubin flags
    case $f in
    *.cubin) cp "$f" "$cubin" || return 1 ;;
    *.cu)
        flags=(-O2 -std=c++17 -arch=sm_90a -cubin)
        # the Makefile's -fmad=false, except where mk/fast.mk filters it out (as same_code.sh)
        grep -q "obj/$f:\|obj/${f%.cu}.o:" mk/fast.mk 2>/dev/null || flags+=(-fmad=false)
        "$NVCC" "${flags[@]}" -Iengine -I. "$f" -o "$cubin" || return 1
        ;;
    *) echo "sass.sh: $f is neither a .cu nor a .cubin" >&2; return 1 ;;
    esac
    [ $old_dis = 0 ] || old_header "$cubin" "$f" || return 1
    "$dis" -c "$cubin" | awk '
        /^\.text\./ { n = $1; sub(/^\.text\./, "", n); sub(/:$/, "", n)
                      cmd = "c++filt " n; cmd | getline d; close(cmd)
                      print "//== " d; next }
        { print }'
}

# the instructions of the kernels regex keeps, as "KERNEL<TAB>OPCODE<TAB>text"
instructions() {
    awk -v re="$regex" '
        /^\/\/== / { k = substr($0, 5); keep = re == "" || k ~ re; next }
        keep && /^ *\/\*[0-9a-f]+\*\/ / {
            t = $0; sub(/^ *\/\*[0-9a-f]+\*\/ */, "", t); sub(/ *;.*$/, "", t)
            split(t, w, /[ \t]+/); i = 1
            if (w[1] ~ /^@/) i = 2
            op = w[i]; sub(/\..*$/, "", op)
            print k "\t" op "\t" t
        }'
}

for f in "$@"; do
    disassemble "$f" >"$tmp/dis" || exit 1
    case $mode in
    dis)
        if [ -z "$regex" ]; then
            cat "$tmp/dis"
        else
            awk -v re="$regex" '/^\/\/== / { keep = substr($0, 5) ~ re } keep' "$tmp/dis"
        fi
        ;;
    count)
        instructions <"$tmp/dis" | awk -F '\t' '
            { n[$1]++; c[$1 "\t" $2]++; if (!($1 in seen)) { seen[$1] = 1; order[++nk] = $1 } }
            END {
                for (i = 1; i <= nk; i++) {
                    k = order[i]; line = ""
                    for (kc in c) { split(kc, p, "\t"); if (p[1] == k) line = line " " p[2] "=" c[kc] }
                    printf "%s\t%d\t%s\n", k, n[k], line
                }
            }' | while IFS=$'\t' read -r k n ops; do
            echo "$k: $n instructions"
            echo "$ops" | tr ' ' '\n' | grep . | sort -t= -k2 -rn | tr '\n' ' ' | fold -s -w 100 |
                sed 's/^/    /'
            echo
        done
        ;;
    loop)
        instructions <"$tmp/dis" | awk -F '\t' -v a="$anchor" '
            function flush(   i, s, r, line, o, nr) {
                if (k == "") return
                if (nrun == 0) { printf "%s: no %s\n", k, a; return }
                line = ""; r = 1
                for (i = 2; i <= nrun + 1; i++) {
                    if (i <= nrun && len[i] == len[i - 1]) { r++; continue }
                    line = line " " len[i - 1] (r > 1 ? "x" r : ""); r = 1
                }
                printf "%s: %d runs between %ss, lengths%s\n", k, nrun, a, line
                s = ""
                for (o in oc) s = s sprintf(" %s=%.2f", o, oc[o] / nrun)
                printf "    a run, by opcode:%s\n", s
            }
            $1 != k { flush(); k = $1; nrun = 0; cur = -1; delete oc; delete len; delete pend }
            {
                if ($2 == a) {
                    if (cur >= 0) { len[++nrun] = cur; for (o in pend) oc[o] += pend[o] }
                    cur = 0; delete pend
                }
                if (cur >= 0) { cur++; pend[$2]++ }
            }
            END { flush() }'
        ;;
    esac
done
