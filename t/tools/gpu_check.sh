#!/usr/bin/env bash
# One device call that checks the CUDA backend on a GPU machine (docs/gpu.md): kernel-check,
# parity with the CPU on the tiny packs (fp16; EXL3 at 2, 3, 4 bits in each codebook), the demo
# pack and the medium pack, the logits tests, the serving exactness tests through nginx on
# --backend cuda, two ranks on one GPU (--gpus 0,0), the sticky-fault test, and the first
# benchmark tables; the fast kernel path: exl3-fast-check (the tensor-core EXL3 product against
# the exact one, batch invariance, timings), kernel-check --kernels fast (ops.t), compare with
# --kernels-b fast and the kernels table of both paths on the one-GPU shape cut to 4 layers;
# the step `whole` (asked for by name): decode, stages and prompt benchmarks of that shape;
# attnlong (by name): the fast attention at contexts 4096, 32768, 131072 under its variants (old:
# build/gpu/old's bench);
# ncuattn (by name): its split kernel under ncu at GPU_CHECK_NCUATTN_CTX keys (131072), with the
# SASS page and its stall samples.
# Needs build/gpu from
# `make gpu-carry` (binaries built on Debian, its nginx and libcjson .debs). Writes
# $OUT/summary.txt and $OUT/logs.tar.gz; each step has its own time limit so the whole call
# ends inside the device tool's 10 minutes. GPU_CHECK_BACKEND=cpu runs the same steps on the
# CPU backend (to try the script where there is no GPU); GPU_CHECK_STEPS picks steps by name.
# Not in the default list: synth (--synthetic-weights filled on the GPU: synth-check's every
# byte against the host fill, logits against the CPU's, the whole one-GPU shape's start timed);
# run it as GPU_CHECK_STEPS="setup synth". Nor servedemo and servewhole (issue 21: the demo
# pack and the whole one-GPU shape served through nginx, t/tools/serve_measure.sh), nor
# wholevar (the whole shape's decode under each of GPU_CHECK_WHOLE_VARIANTS), promptvar (its
# prompt under them; old: build/gpu/old's bench), many (the product at many rows under each of
# GPU_CHECK_MANY_VARIANTS), ncuprodmany (the product at 256 rows under ncu), ncusmall (a decode
# round's small kernels under ncu), kprofprompt (each kernel of a prompt round),
# oldnew (this build's fast logits against an earlier build's carried as build/gpu/old), probe
# (wgmma against mma.sync: bits and rates),
# attnsplits (the fast attention's kernel-check under its split cap and switches), fastquick
# (exl3-fast-check's checks without its timings), sanitizeops (the memory checker on the fast
# kernel-check alone), abdecode (the whole shape's decode of build/gpu/old's bench and this
# one's, interleaved), trace (a decode round's kernels on a timeline, by CUPTI), targets (every
# target row of issues 19 and 20 in one call), ncusample (the sampler's kernels under ncu).
cd "$(dirname "$0")/../.." || exit 2
export NCCL_NVLS_ENABLE=0
B=${GPU_CHECK_BACKEND:-cuda}
STEPS=${GPU_CHECK_STEPS:-setup fastcheck ops logits compare fastcompare shapebench sanitize splits stages ranks medium serve fault bench}
DEADLINE=${GPU_CHECK_DEADLINE:-560} # seconds: every step ends before it
out=${OUT:-$(mktemp -d)}
mkdir -p "$out" || exit 2 # a call's OUT=$OUT/a: nothing comes back from a folder never made
logs=$(mktemp -d)
sum="$out/summary.txt"
: >"$sum"
note() { echo "$*" | tee -a "$sum"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
# variant V: one of a step's variants ("-": the defaults; "old": build/gpu/old's bench, an earlier
# build's, carried; else switches VAR=VALUE joined by commas): vv the switches, bin the bench,
# vname its name in the logs (default, old or V)
variant() {
    vv=() bin=build/muse-bench vname=$1
    case $1 in
    -) vname=default ;;
    old) bin=build/gpu/old/muse-bench ;;
    *) IFS=, read -ra vv <<<"$1" ;;
    esac
}
# step NAME LIMIT CMD...: runs CMD under a time limit into logs/NAME.txt, notes rc and seconds
step() {
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    ((limit > DEADLINE - SECONDS)) && limit=$((DEADLINE - SECONDS))
    if ((limit < 5)); then
        note "== $name: not run (the call's deadline of $DEADLINE s is reached)"
        return 124
    fi
    timeout "$limit" "$@" >"$logs/$name.txt" 2>&1
    rc=$?
    note "== $name: rc=$rc in $((SECONDS - t0)) s (limit $limit)"
    case $name in # tables come back whole; other steps their verdict lines
    fastcheck | targets-* | shape-* | whole-* | prompt-* | many-* | demo-decode-* | oldnew-diff | serveprompt-trace-*) grep -vE "^(ok|PASS) " "$logs/$name.txt" | head -150 | tee -a "$sum" ;;
    fastcheck-*) grep -vE "^(ok|PASS|FAIL) " "$logs/$name.txt" | head -80 | tee -a "$sum" ;;
    attn-*) grep -E "attention|copy bandwidth" "$logs/$name.txt" | head -8 | tee -a "$sum" ;;
    synth-decode-*) tail -40 "$logs/$name.txt" | tee -a "$sum" ;;
    synth-*) grep -E "synth-check|FAIL|filled on the GPU|error" "$logs/$name.txt" | head -40 |
        tee -a "$sum" ;;
    *) grep -E "^not ok|SUMMARY|rel L2 max|agreement|router margin|PASS|FAIL|^# |Result|copy" \
        "$logs/$name.txt" | head -40 | tee -a "$sum" ;;
    esac
    tar -czf "$out/logs.tar.gz" -C "$logs" . # each step's log comes back even if the call is cut
    return $rc
}

if want setup; then
    note "== setup $(date -u +%FT%TZ) backend $B"
    if [ -d build/gpu ]; then
        # a gzipped carry (make gpu-carry-small) unpacked in place: then the carry is what the
        # call tests, over whatever an earlier call left in build/
        cpu=-u
        for f in build/gpu/muse-*.gz build/gpu/t/*.gz build/gpu/old/*.gz; do
            [ -e "$f" ] || continue
            case $f in *libcupti*) continue ;; esac
            gunzip -f "$f" && chmod +x "${f%.gz}" && cpu=
        done
        # -u: a carried binary replaces an older one only (where build/ is newer, as on the
        # machine that built them, its own binaries are the ones to test)
        mkdir -p build/t build/nginx
        mkdir -p build/obj/kernels
        cp $cpu build/gpu/muse-engine build/gpu/muse-pack build/gpu/muse-bench build/
        cp $cpu build/gpu/t/* build/t/ && cp $cpu build/gpu/nginx/ngx_muse_module.so build/nginx/
        cp -u build/gpu/obj/*.o build/obj/kernels/ 2>/dev/null
        deb=/tmp/muse-debs
        for f in build/gpu/debs/*.deb; do dpkg -x "$f" "$deb"; done
        export LD_LIBRARY_PATH="$deb/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export PYTHONPATH="$deb/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
        /usr/bin/python3 -c 'import jsonschema; print("jsonschema", jsonschema.__version__)' 2>&1 |
            tail -1 | tee -a "$sum"
        export MUSE_NGINX="$deb/usr/sbin/nginx"
    fi
    command -v nvidia-smi >/dev/null &&
        nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv | tee -a "$sum"
    build/muse-engine version | tee -a "$sum"
    [ -n "${MUSE_NGINX:-}" ] && "$MUSE_NGINX" -v 2>&1 | tee -a "$sum"
fi

# ids under the tiny vocab (1024); 400 positions so a 99.5% top-1 agreement means something
ids() { awk -v n="$1" -v m="$2" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", (5 + i * 37) % m }'; }
tokens=$(ids 400 1000)
packs=$(mktemp -d)
build/muse-pack --config conf/packs/tiny.json --out "$packs/fp16" --seed 3 >/dev/null 2>&1
for bits in 2 3 4; do
    for cb in mcg mul1 3inst; do
        build/muse-pack --config conf/packs/tiny.json --out "$packs/q$bits-$cb" --seed 3 \
            --exl3-random "$bits" --codebook "$cb" >/dev/null 2>&1 || note "muse-pack q$bits-$cb failed"
    done
done

# --synthetic-weights on the GPU: every byte of every tensor of the tiny shape against the host
# fill (each codebook), the logits of the GPU-filled weights against the CPU's (exact path:
# equal bits), then the whole one-GPU shape at 2 bits: its start alone, then a short decode
# (the target: ready within 60 s of start; each step's seconds are its whole command's)
if want synth && [ "$B" = cuda ]; then
    for bc in 2:mcg 3:3inst 4:mul1 6:mcg; do
        step "synth-check-${bc%%:*}-${bc##*:}" 60 build/t/synth-check --config conf/packs/tiny.json \
            --seed 3 --bits "${bc%%:*}" --codebook "${bc##*:}"
    done
    syn=(--synthetic-weights 3 --config conf/packs/tiny.json --bits 2 --codebook mcg --tokens "$tokens")
    build/muse-engine logits "${syn[@]}" --out "$logs/synth-logits-cpu.f32" >"$logs/synth-logits-cpu.txt" 2>&1
    MUSE_CUDA_PATH=exact build/muse-engine logits "${syn[@]}" --backend cuda \
        --out "$logs/synth-logits-cuda.f32" >"$logs/synth-logits-cuda.txt" 2>&1
    cmp -s "$logs/synth-logits-cpu.f32" "$logs/synth-logits-cuda.f32" &&
        note "== synth logits: GPU-filled weights on cuda (exact) equal the host-filled ones on cpu" ||
        note "== synth logits: DIFFER (logs synth-logits-*.txt)"
    whole=(--synthetic-weights 1 --config conf/packs/muse-spark-open-1gpu.json --bits 2 --codebook mcg)
    step synth-load-1gpu 90 build/t/synth-check "${whole[@]:2}" --seed 1 --load-only
    step synth-decode-1gpu 150 build/muse-bench decode --backend cuda "${whole[@]}" --kernels fast \
        --streams 1,4 --tokens 8 --prompt 64 --json "$logs/synth-decode-1gpu.json"
fi

# the fast EXL3 product alone: decode bit-identical, within bound of the exact path, batch
# invariance at 1..256 rows, then its timings beside the exact path's (and its SASS)
# (fastquick, by name: the checks alone, no timings)
if (want fastcheck || want fastquick) && [ "$B" = cuda ]; then
    step fastcheck-quick 60 build/t/exl3-fast-check --quick
    want fastcheck && step fastcheck 240 build/t/exl3-fast-check
    command -v cuobjdump >/dev/null && [ -f build/obj/kernels/linear_fast.o ] &&
        cuobjdump --dump-sass build/obj/kernels/linear_fast.o >"$logs/linear_fast.sass" 2>&1
fi
# wgmma against mma.sync on this GPU: equal bits or not, and each one's rate (t/tools/mma_probe.cu)
if want probe && [ "$B" = cuda ] && [ -x build/t/mma-probe ]; then
    step probe 60 build/t/mma-probe
    cat "$logs/probe.txt" >>"$sum"
fi
# every kernel of a decode round by its own device time (ncu, one metric, each kernel node of the
# round's graphs, caches left warm as in a served round): the demo pack, the 4-layer cut, the
# whole one-GPU shape, without the fill kernels (k_synth_fill left out by name); the CSVs come
# back in $OUT, summed by t/tools/kprof.py (GPU_CHECK_KPROF_SHAPES: a subset)
if want kprof && [ "$B" = cuda ] && command -v ncu >/dev/null; then
    for shape in ${GPU_CHECK_KPROF_SHAPES:-demo 1gpu-4l 1gpu}; do
        w=(--synthetic-weights 1 --config "conf/packs/muse-spark-open-$shape.json" --bits 2 --codebook mcg)
        [ $shape = demo ] && w=(--model conf/packs/demo-en)
        step "kprof-$shape" 150 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
            -k 'regex:k_([a-rt-z]|s[^y])' --log-file "$logs/kprof-$shape.csv" build/muse-bench decode \
            --backend cuda "${w[@]}" --kernels fast --streams 1 --tokens 2 --prompt 64
        gzip -c "$logs/kprof-$shape.csv" >"$out/kprof-$shape.csv.gz"
        python3 t/tools/kprof.py "$logs/kprof-$shape.csv" 2>&1 | head -40 | tee -a "$sum"
    done
fi
# the fast product under ncu's full set (occupancy, pipes, stalls, the hottest SASS lines):
# 6144x4096 and 8192x28672 at M = 1, 2 bits mcg, then the grouped experts at one row
# (exl3-fast-check --prof)
if want ncuprod && [ "$B" = cuda ] && command -v ncu >/dev/null; then
    step ncuprod 120 ncu --clock-control none --set full --import-source no -k regex:k_fast_product \
        -c 12 -o "$logs/prod" build/t/exl3-fast-check --prof
    ncu --import "$logs/prod.ncu-rep" >"$out/ncuprod.txt" 2>&1
    ncu --import "$logs/prod.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip >"$out/prod-sass.csv.gz"
    rm -f "$logs/prod.ncu-rep"
fi
# every kernel of a prompt round the same way: the whole one-GPU shape, a prompt of
# GPU_CHECK_KPROF_PROMPT tokens (1024) in rounds of GPU_CHECK_KPROF_ROWS rows (256), summed over
# its last round
if want kprofprompt && [ "$B" = cuda ] && command -v ncu >/dev/null; then
    step kprof-prompt 150 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        -k 'regex:k_([a-rt-z]|s[^y])' --log-file "$logs/kprof-prompt.csv" build/muse-bench prompt \
        --backend cuda --synthetic-weights 1 --config conf/packs/muse-spark-open-1gpu.json --bits 2 \
        --codebook mcg --kernels fast --lengths "${GPU_CHECK_KPROF_PROMPT:-1024}" --rows "${GPU_CHECK_KPROF_ROWS:-256}"
    gzip -c "$logs/kprof-prompt.csv" >"$out/kprof-prompt.csv.gz"
    python3 t/tools/kprof.py "$logs/kprof-prompt.csv" 2>&1 | head -40 | tee -a "$sum"
fi
# the product at GPU_CHECK_NCUPROD_ROWS rows (256; 6144x4096, 8192x28672, the routed experts 8 of
# 96) under ncu, and the SASS page with its counts and stall samples (prodmany-sass.csv.gz: at
# 2048 rows the register form's loop, whose issue slots were 34% busy on 2026-12-03)
if want ncuprodmany && [ "$B" = cuda ] && command -v ncu >/dev/null; then
    step ncuprodmany 150 ncu --clock-control none --set full --import-source no -k regex:k_fast_product \
        -c "${GPU_CHECK_NCUPROD_COUNT:-12}" -o "$logs/prodmany" build/t/exl3-fast-check --prof "${GPU_CHECK_NCUPROD_ROWS:-256}"
    ncu --import "$logs/prodmany.ncu-rep" >"$out/ncuprodmany.txt" 2>&1
    ncu --import "$logs/prodmany.ncu-rep" --page source --print-source sass --csv 2>&1 |
        gzip >"$out/prodmany-sass.csv.gz"
    rm -f "$logs/prodmany.ncu-rep"
fi
# the small kernels of a decode round (the 4-layer cut: norms, prepare and finish, router,
# selection, the attention's three, the MoE combine) under ncu's full set: each launch's
# duration, warp states and instruction mix ($OUT/ncusmall.txt) and the SASS page with its
# counts and stall samples ($OUT/small-sass.csv.gz; a few samples a launch of a few us).
# GPU_CHECK_NCUSMALL_SKIP launches (130: the prompt round's and the first decode round's) are
# left out, then GPU_CHECK_NCUSMALL_COUNT (60: a decode round's) profiled
if want ncusmall && [ "$B" = cuda ] && command -v ncu >/dev/null; then
    # GPU_CHECK_NCUSMALL_ARGS: more ncu options (split on spaces)
    step ncusmall 240 ncu --clock-control none --set full --import-source no ${GPU_CHECK_NCUSMALL_ARGS:-} \
        -k 'regex:k_(add_norm_fast|add_norm_lean|select_group_fast|moe_combine_norm_fast|moe_combine_norm_early|router_vec|fast_finish|fast_prepare|attn_in_fast|attn_split_ring|attn_combine)' \
        --launch-skip "${GPU_CHECK_NCUSMALL_SKIP:-130}" -c "${GPU_CHECK_NCUSMALL_COUNT:-60}" \
        -o "$logs/small" build/muse-bench decode --backend cuda --synthetic-weights 1 \
        --config conf/packs/muse-spark-open-1gpu-4l.json --bits 2 --codebook mcg --kernels fast \
        --streams 1 --tokens 3 --prompt 64
    ncu --import "$logs/small.ncu-rep" >"$out/ncusmall.txt" 2>&1
    ncu --import "$logs/small.ncu-rep" --page source --print-source sass --csv 2>&1 |
        gzip >"$out/small-sass.csv.gz"
    rm -f "$logs/small.ncu-rep"
fi
# ncusample (by name): the fast sampler's kernels (kernels/sample_fast.cu) under ncu's full set,
# one row at vocab 202048 drawing with T 0.7, top-k 40, top-p 0.9 (muse-bench kernels' sample op
# on the 2-layer cut; issue 20's 20 us target): each launch's duration, warp states and
# instruction mix ($OUT/ncusample.txt)
if want ncusample && [ "$B" = cuda ] && command -v ncu >/dev/null; then
    step ncusample 180 ncu --clock-control none --set full --import-source no -k 'regex:k_sf_' \
        -c "${GPU_CHECK_NCUSAMPLE_COUNT:-8}" -o "$logs/sample" build/muse-bench kernels --backend cuda \
        --synthetic-weights 1 --config conf/packs/muse-spark-open-1gpu-2l.json --bits 2 \
        --codebook mcg --rows 1 --context 4096 --min-ms 1 --kernels fast
    ncu --import "$logs/sample.ncu-rep" >"$out/ncusample.txt" 2>&1
    rm -f "$logs/sample.ncu-rep"
fi
# the product at many rows under each block shape (GPU_CHECK_MANY_VARIANTS: VAR=VALUE,...; "-"
# the defaults)
if want many && [ "$B" = cuda ]; then
    for v in ${GPU_CHECK_MANY_VARIANTS:-- MUSE_FAST_MANY_MT=8 MUSE_FAST_MANY_MT=4 MUSE_FAST_MANY_MT=2}; do
        e=()
        [ "$v" = - ] && v=default || IFS=, read -ra e <<<"$v"
        step "many-$v" 90 env "${e[@]}" build/t/exl3-fast-check --many
    done
fi
# the fast attention's split kernel under ncu (speed of light, warp states, memory, occupancy)
# at one row and context 131072 on the 4-layer cut: every k_attn_split launch of the kernels
# table's attention ops (the sliding layer's, then the full layer's, whose grid is (128, 8, 1))
if want ncuattn && [ "$B" = cuda ] && command -v ncu >/dev/null; then
    # GPU_CHECK_NCUATTN_SKIP launches left out (4: the sliding layer's), then
    # GPU_CHECK_NCUATTN_COUNT profiled with the full set; the SASS page with its stall samples
    step ncuattn 150 ncu --clock-control none --set full --import-source no -k regex:k_attn_split \
        --launch-skip "${GPU_CHECK_NCUATTN_SKIP:-0}" -c "${GPU_CHECK_NCUATTN_COUNT:-40}" -o "$logs/attn" \
        build/muse-bench kernels --backend cuda --synthetic-weights 1 \
        --config conf/packs/muse-spark-open-1gpu-4l.json --bits 2 --codebook mcg --rows 1 \
        --context "${GPU_CHECK_NCUATTN_CTX:-131072}" --min-ms 0.001 --kernels fast
    ncu --import "$logs/attn.ncu-rep" >"$out/ncuattn.txt" 2>&1
    ncu --import "$logs/attn.ncu-rep" --page source --print-source sass --csv 2>&1 |
        gzip >"$out/attn-sass.csv.gz"
    rm -f "$logs/attn.ncu-rep"
fi
want ops && MUSE_OPS_BACKEND=$B step ops 150 prove -v t/ops/ops.t
if want logits && [ "$B" = cuda ]; then
    step logits 60 prove -v t/ops/cuda_logits.t
    # the whole model on each EXL3 path alone (auto picks tiles from 32 rows, never for the MoE)
    MUSE_EXL3_PATH=tiles step logits-tiles 60 prove -v t/ops/cuda_logits.t
    MUSE_EXL3_PATH=small step logits-small 60 prove -v t/ops/cuda_logits.t
    # every round captured anew (the default launches a bucket's stored graph for its key)
    MUSE_CUDA_REPLAY=0 step logits-noreplay 60 prove -v t/ops/cuda_logits.t
fi

# oldnew (by name): the fast path's logits of an earlier build carried as build/gpu/old/muse-engine
# and of this one, bit for bit (a change meant to keep every bit), on the 4-layer cut and the
# tiny shape (2 bits mcg, synthetic weights), the prompt whole and a row a round; this build's
# under each of GPU_CHECK_OLDNEW_VARIANTS ("NAME=VALUE"), its bits against the earlier build's.
# GPU_CHECK_OLDNEW_TOKENS: the tokens, one run of each count (48; from 65 the prompt whole takes
# the product's wgmma form; 320 on the 4-layer cut: the MoE's groups of 192);
# GPU_CHECK_OLDNEW_SHAPES: the shapes (tiny alone with 4000 tokens: a row a round reaches 63
# splits a row in its full layers, the combine's batch of 64; the cut's logits would be GBs);
# GPU_CHECK_OLDNEW_FROM=P: only positions P.. written (logits --from, both builds: the cut at
# 4112 tokens from 4096, 16 rows of 65 splits, in MBs)
if want oldnew && [ "$B" = cuda ] && [ -x build/gpu/old/muse-engine ]; then
    from=()
    [ "${GPU_CHECK_OLDNEW_FROM:-0}" = 0 ] || from=(--from "$GPU_CHECK_OLDNEW_FROM")
    for ntok in ${GPU_CHECK_OLDNEW_TOKENS:-48}; do
        ids=$(awk -v n="$ntok" 'BEGIN { for (i = 1; i <= n; i++) printf "%s%d", (i > 1 ? "," : ""), 1 + (i - 1) % 1000 }')
        for shape in ${GPU_CHECK_OLDNEW_SHAPES:-muse-spark-open-1gpu-4l tiny}; do
            for chunk in "$ntok" 1; do
                for bin in build/gpu/old/muse-engine build/muse-engine; do
                    tag=$shape-t$ntok-$chunk-$([ "$bin" = build/muse-engine ] && echo new || echo old)
                    step "oldnew-$tag" 90 "$bin" logits --synthetic-weights 3 --config "conf/packs/$shape.json" \
                        --bits 2 --codebook mcg --backend cuda --kernels fast --tokens "$ids" --chunk "$chunk" \
                        "${from[@]}" --out "$logs/$tag.f32"
                done
                for v in ${GPU_CHECK_OLDNEW_VARIANTS:-}; do
                    env "$v" build/muse-engine logits --synthetic-weights 3 --config "conf/packs/$shape.json" \
                        --bits 2 --codebook mcg --backend cuda --kernels fast --tokens "$ids" --chunk "$chunk" \
                        "${from[@]}" --out "$logs/$shape-t$ntok-$chunk-$v.f32" >/dev/null 2>&1
                done
            done
        done
    done
    step oldnew-diff 30 /usr/bin/python3 - "$logs" <<'PY'
import array, glob, math, os, sys
d = sys.argv[1]
def load(f):
    a = array.array("f")
    with open(f, "rb") as fh:
        a.frombytes(fh.read())
    return a
for old in sorted(glob.glob(os.path.join(d, "*-old.f32"))):
    a = load(old)
    for f in [old[:-8] + "-new.f32"] + sorted(glob.glob(old[:-8] + "-*=*.f32")):
        if not os.path.exists(f):
            print(f"FAIL {os.path.basename(f)}: missing")
            continue
        b = load(f)
        if len(a) != len(b):
            print(f"FAIL {os.path.basename(f)}: {len(b)} logits, the old {len(a)}")
            continue
        if a.tobytes() == b.tobytes():
            print(f"SAME {os.path.basename(f)} vs old: {len(a)} logits, 0 differ")
            continue
        diff, num, den = 0, 0.0, 0.0
        for x, y in zip(a, b):
            diff += x != y
            num += (x - y) * (x - y)
            den += x * x
        print(f"DIFF {os.path.basename(f)} vs old: {len(a)} logits, {diff} differ, "
              f"rel L2 {math.sqrt(num) / (math.sqrt(den) or 1.0):.3g}")
PY
    rm -f "$logs"/*.f32 # 39 MB a run of the cut: the logs must come back
fi

if want compare; then
    for p in "$packs"/* conf/packs/demo-en; do
        step "compare-$(basename "$p")" 40 build/muse-engine compare --model "$p" --tokens "$tokens" \
            --a cpu --b "$B"
    done
fi

# the fast path against the CPU: the model's bound (rel L2 2e-3, top-1 99.5%, compare's defaults)
# (and the demo pack's under each of GPU_CHECK_FASTCOMPARE_VARIANTS, "NAME=VALUE,...")
if want fastcompare; then
    for p in "$packs"/q* conf/packs/demo-en; do
        step "fastcompare-$(basename "$p")" 40 build/muse-engine compare --model "$p" --tokens "$tokens" \
            --a cpu --b "$B" --kernels-b fast
    done
    for v in ${GPU_CHECK_FASTCOMPARE_VARIANTS:-}; do
        IFS=, read -ra vv <<<"$v"
        step "fastcompare-demo-en-$v" 40 env "${vv[@]}" build/muse-engine compare --model conf/packs/demo-en \
            --tokens "$tokens" --a cpu --b "$B" --kernels-b fast
    done
fi

# the kernels table of both paths on the one-GPU shape cut to 4 layers and 16 experts (2 bits
# mcg), the exact path the baseline of the fast one; copy bandwidth in the same runs
if want shapebench; then
    cut=(--synthetic-weights 1 --config conf/packs/muse-spark-open-1gpu-4l.json --bits 2 --codebook mcg
        --rows 1,16,256 --context 4096 --min-ms 20)
    # GPU_CHECK_SHAPE_EXACT=0: the fast table alone (the exact one is minutes at 256 rows), with
    # GPU_CHECK_SHAPE_BASE (an earlier run's shape-exact.json) as its baseline if given
    base=()
    [ -n "${GPU_CHECK_SHAPE_BASE:-}" ] && base=(--baseline "$GPU_CHECK_SHAPE_BASE")
    if [ "${GPU_CHECK_SHAPE_EXACT:-1}" = 1 ]; then
        step shape-exact 150 build/muse-bench kernels --backend "$B" "${cut[@]}" --kernels exact \
            --json "$logs/shape-exact.json" && base=(--baseline "$logs/shape-exact.json")
    fi
    step shape-fast 150 build/muse-bench kernels --backend "$B" "${cut[@]}" --kernels fast \
        "${base[@]}" --json "$logs/shape-fast.json"
    # one decode row at longer contexts (attention's splits), GPU_CHECK_CONTEXTS
    for ctx in ${GPU_CHECK_CONTEXTS:-}; do
        step "shape-fast-ctx$ctx" 90 build/muse-bench kernels --backend "$B" "${cut[@]:0:8}" \
            --rows 1 --context "$ctx" --min-ms 20 --kernels fast --json "$logs/shape-fast-ctx$ctx.json"
    done
fi

# targets (by name): every target row of issues 19 and 20 measured in one call on the code as it
# is: exl3-fast-check's timings (the product at each codebook, 2-4 bits, 1 to 4096 rows; issue
# 19), then muse-bench kernels on the one-GPU shape cut to 2 layers with all 96 experts and its
# vocabulary of 202048 (the MoE with the router and the shared experts, the attention, the small
# operations, the head, the sampler and the empty round; issue 20) at rows 1, 4 and 256 and
# context 4096, the exact path at 1 and 4 rows its baseline, then one row at 32768 and 131072
# keys, and the empty round through a graph (targets-graphs). The JSON comes back in $OUT.
# GPU_CHECK_TARGETS_CONFIG: another shape (conf/packs/tiny.json to try the step on the CPU)
if want targets; then
    cut=(--synthetic-weights 1 --config "${GPU_CHECK_TARGETS_CONFIG:-conf/packs/muse-spark-open-1gpu-2l.json}"
        --bits 2 --codebook mcg --min-ms 20)
    [ "$B" = cuda ] && step targets-product 240 build/t/exl3-fast-check
    base=()
    step targets-exact 120 build/muse-bench kernels --backend "$B" "${cut[@]}" --rows 1,4 \
        --context 4096 --kernels exact --json "$logs/targets-exact.json" &&
        base=(--baseline "$logs/targets-exact.json")
    step targets-fast 120 build/muse-bench kernels --backend "$B" "${cut[@]}" --rows 1,4,256 \
        --context 4096 --kernels fast "${base[@]}" --json "$logs/targets-fast.json"
    for ctx in 32768 131072; do
        step "targets-ctx$ctx" 90 build/muse-bench kernels --backend "$B" "${cut[@]}" --rows 1 \
            --context "$ctx" --kernels fast --json "$logs/targets-ctx$ctx.json"
    done
    # the empty round as the engine runs a round, through a graph (its capture, launch and sync;
    # a forward's replay skips the capture): the table's head line; its ops' times are the host's
    [ "$B" = cuda ] && step targets-graphs 90 env MUSE_CUDA_GRAPHS=1 build/muse-bench kernels \
        --backend "$B" "${cut[@]}" --rows 1 --context 4096 --kernels fast \
        --json "$logs/targets-graphs.json"
    for f in "$logs"/targets-*.json; do [ -s "$f" ] && cp "$f" "$out/"; done
fi

# the fast product's k split: the table again at other split targets (variants of one binary)
if want splits && [ "$B" = cuda ]; then
    for t in ${GPU_CHECK_SPLITS:-528 768 1056}; do
        MUSE_FAST_SPLITS=$t step "fastcheck-target$t" 60 build/t/exl3-fast-check
    done
fi

# the product's variants of one binary (tuning switches): the same digests, their timings
if want variants && [ "$B" = cuda ]; then
    for v in ${GPU_CHECK_VARIANTS:-MUSE_FAST_SPLITS=264}; do
        step "fastcheck-$v" 90 env "$v" build/t/exl3-fast-check
        if cmp -s <(grep '^# digest' "$logs/fastcheck.txt") <(grep '^# digest' "$logs/fastcheck-$v.txt"); then
            note "== $v: every digest equal to the default's"
        else
            note "== $v: DIGESTS DIFFER from the default's (or fastcheck did not run)"
        fi
    done
fi

# each step's share of a fast call: the table with steps left out (MUSE_FAST_SKIP: 1 prepare,
# 2 product, 4 finish; the checks then fail by design, the timings are what counts)
if want stages && [ "$B" = cuda ]; then
    for k in 1 4 5 6; do
        MUSE_FAST_SKIP=$k step "fastcheck-skip$k" 60 build/t/exl3-fast-check
    done
fi

# the fast kernel under the memory checker (where the machine's runtime lets it run)
# (sanitizeops, by name: the second alone, seconds where the first takes past its 120)
if (want sanitize || want sanitizeops) && [ "$B" = cuda ] && command -v compute-sanitizer >/dev/null; then
    want sanitize &&
        step sanitize 120 compute-sanitizer --tool memcheck --error-exitcode 9 build/t/exl3-fast-check --quick
    # every fast kernel of the round (attention, MoE, norms, sampler) under the memory checker;
    # GPU_CHECK_SANITIZE_KERNELS=exact: the exact path's (slower: GPU_CHECK_SANITIZE_ROWS fewer rows)
    step sanitize-ops 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 build/muse-engine \
        kernel-check --model "$packs/q2-mcg" --backend cuda --kernels "${GPU_CHECK_SANITIZE_KERNELS:-fast}" \
        --sample-rows "${GPU_CHECK_SANITIZE_ROWS:-300}"
fi

# two ranks on one GPU (--gpus 0,0) against the CPU backend at --ranks 2, bitwise, on tiny-tp
if want ranks; then
    G=(--backend "$B") GB=()
    [ "$B" = cuda ] && G+=(--gpus 0,0) GB=(--gpus-b 0,0)
    for p in tp16 tp4; do
        extra=()
        [ $p = tp4 ] && extra=(--exl3-random 4 --codebook mul1)
        build/muse-pack --config conf/packs/tiny-tp.json --out "$packs/$p" --seed 7 "${extra[@]}" >/dev/null 2>&1
        step "kernel-check-2-$p" 120 build/muse-engine kernel-check --model "$packs/$p" "${G[@]}" --ranks 2
        step "kernel-check-2-$p-fast" 120 build/muse-engine kernel-check --model "$packs/$p" "${G[@]}" \
            --ranks 2 --kernels fast
        for g in 1 0; do
            MUSE_CUDA_GRAPHS=$g step "compare-2-$p-graphs$g" 60 build/muse-engine compare --model "$packs/$p" \
                --tokens "$(ids 64 1000)" --a cpu --ranks-a 2 --b "$B" --ranks-b 2 \
                "${GB[@]}" --min-agree 100 --max-rel-l2 0
        done
        gen=(build/muse-engine generate --model "$packs/$p" --tokens 5,6,7 --max-tokens 24 --temperature 0.8 --seed 3)
        "${gen[@]}" "${G[@]}" --ranks 2 >"$logs/gen2-$p-a.txt" 2>&1
        "${gen[@]}" "${G[@]}" --ranks 2 >"$logs/gen2-$p-b.txt" 2>&1
        "${gen[@]}" --ranks 2 >"$logs/gen2-$p-cpu.txt" 2>&1
        cmp -s "$logs/gen2-$p-a.txt" "$logs/gen2-$p-b.txt" && cmp -s "$logs/gen2-$p-a.txt" "$logs/gen2-$p-cpu.txt" &&
            note "== generate 2 ranks $p: twice the same, equal to cpu --ranks 2" ||
            note "== generate 2 ranks $p: DIFFERS (logs gen2-$p-*.txt)"
    done
    MUSE_TEST_BACKEND=$B step serve-ranks 180 prove -v t/stack/serve_ranks.t
fi

# the medium pack: hidden 2048, 16 layers, 64 experts, 4 bits; 256 positions teacher-forced
if want medium; then
    step medium-pack 150 build/muse-pack --config conf/packs/medium-moe.json --out "$packs/medium" \
        --seed 5 --exl3-random 4 --codebook mul1
    step medium-fastcompare 150 build/muse-engine compare --model "$packs/medium" \
        --tokens "$(ids 256 32000)" --a cpu --b "$B" --kernels-b fast
    step medium-compare 150 build/muse-engine compare --model "$packs/medium" \
        --tokens "$(ids 256 32000)" --a cpu --b "$B"
fi

# attnsplits (by name): the fast attention's kernel-check (prompt rows == decode rows bitwise,
# the exact path's bound) where splits span several tiles and paired rows differ in chunk size
# (MUSE_ATTN_SPLITS=1 and 2), on tiny (group 2, window 8) and on a group-8 cut of it (16 query
# heads, 2 KV heads, window 100); a warp a decode row (MUSE_ATTN_COOP=0), the CUDA-core split
# (MUSE_ATTN_TC=0), chunks of at least 4 tiles (MUSE_ATTN_CHUNK=256), and prompt rounds by the
# split and the combine (MUSE_ATTN_FLASH=0) or k_attn_flash with a warp's own tiles
# (MUSE_ATTN_FLASH=1) beside them; the decode form's ring of 2 tiles (MUSE_ATTN_RING=2, alone,
# with one split a row: many tiles a block, and with chunks of 4 tiles), its tiles all staged
# after the wait (MUSE_ATTN_EARLY=0), and the rotations made after it (MUSE_ROPE_EARLY=0).
# GPU_CHECK_ATTNSPLITS_VARIANTS: another list (VAR=VALUE,...; "-" the defaults).
if want attnsplits && [ "$B" = cuda ]; then
    /usr/bin/python3 -c 'import json,sys; c=json.load(open("conf/packs/tiny.json"));
c.update(num_attention_heads=16, num_key_value_heads=2, sliding_window=100); json.dump(c, open(sys.argv[1], "w"))' "$logs/g8.json"
    step attn-g8-pack 90 build/muse-pack --config "$logs/g8.json" --out "$packs/g8" --seed 4 --exl3-random 2 --codebook mcg
    for pk in q2-mcg g8; do
        for v in ${GPU_CHECK_ATTNSPLITS_VARIANTS:-MUSE_ATTN_SPLITS=1 MUSE_ATTN_SPLITS=2 MUSE_ATTN_COOP=0 \
            MUSE_ATTN_TC=0 MUSE_ATTN_CHUNK=256 MUSE_ATTN_FLASH=0 MUSE_ATTN_FLASH=1 MUSE_ATTN_RING=2 \
            MUSE_ATTN_RING=2,MUSE_ATTN_SPLITS=1 MUSE_ATTN_RING=2,MUSE_ATTN_CHUNK=256 \
            MUSE_ATTN_EARLY=0 MUSE_ROPE_EARLY=0 -}; do
            e=()
            [ "$v" = - ] && v=MUSE_ATTN_DEFAULT=1
            IFS=, read -ra e <<<"$v"
            step "attnsplits-$pk-$(tr -d '=_,' <<<"${v//MUSE_ATTN_/}")" 120 env "${e[@]}" \
                build/muse-engine kernel-check --model "$packs/$pk" --backend cuda --kernels fast --max-rows 256
        done
    done
fi

# serving exactness through nginx on each kernel path (the engine reads MUSE_CUDA_PATH), the fast
# one also with every round captured anew (MUSE_CUDA_REPLAY=0; the stored graphs replay by default)
if want serve; then
    MUSE_CUDA_PATH=fast MUSE_TEST_BACKEND=$B step serve-fast 240 prove -v t/stack/serve_exactness.t
    MUSE_CUDA_REPLAY=0 MUSE_CUDA_PATH=fast MUSE_TEST_BACKEND=$B step serve-fast-noreplay 240 prove -v \
        t/stack/serve_exactness.t
    MUSE_CUDA_PATH=exact MUSE_TEST_BACKEND=$B step serve 240 prove -v t/stack/serve_exactness.t
    # the rows of a round (the exact path: its long stream's tokens are the CPU's, run to length)
    MUSE_CUDA_PATH=exact MUSE_TEST_BACKEND=$B step serve-rounds 120 prove -v t/stack/serve_rounds.t
    # structured outputs: the round's token masks through the CUDA sample kernels
    MUSE_CUDA_PATH=fast MUSE_TEST_BACKEND=$B step serve-grammar-fast 240 prove -v t/stack/serve_grammar.t
    MUSE_CUDA_PATH=exact MUSE_TEST_BACKEND=$B step serve-grammar 240 prove -v t/stack/serve_grammar.t
    MUSE_CUDA_PATH=fast MUSE_TEST_BACKEND=$B step serve-grammar-chat 240 prove -v t/stack/serve_grammar_chat.t
fi
want fault && step fault 60 prove -v t/stack/serve_gpu_fault.t

# issue 21 item 4: the demo pack through nginx, one stream and eight, beside the engine's own
# decode of the same pack (the difference is the serving path's cost a token)
# (each with MUSE_CUDA_REPLAY 0 and 1: the round captured anew, or its stored graph launched)
if want servedemo; then
    for v in ${GPU_CHECK_REPLAY:-0 1}; do
        MUSE_CUDA_REPLAY=$v step "demo-decode-replay$v" 90 build/muse-bench decode --backend "$B" \
            --model conf/packs/demo-en --kernels fast --streams 1,8 --tokens 256 --prompt 64 \
            --json "$logs/demo-decode-replay$v.json"
        MUSE_CUDA_REPLAY=$v STREAMS=1,8 TOKENS=256 REPS=3 ID_RANGE=8000 step "serve-demo-replay$v" 150 \
            t/tools/serve_measure.sh "$logs/serve-demo-replay$v" 18890 conf/packs/demo-en --backend "$B" \
            --kernels fast --streams 8 --queue 16
        cat "$logs/serve-demo-replay$v/verdict.txt" "$logs/serve-demo-replay$v/concurrent.txt" 2>/dev/null |
            tee -a "$sum"
    done
fi

# issue 21 item 3: the whole one-GPU shape (synthetic weights on the GPU, the o200k tokenizer
# make gpu-carry brings) behind nginx: 1, 4 and 16 streams, /health's memory beside the
# device's, context 131072 with a pool of 65536 blocks (1M positions), requests past it refused;
# prompts of GPU_CHECK_SERVE_PROMPT (64) tokens, under each of GPU_CHECK_SERVE_VARIANTS (engine
# flags, comma-separated, e.g. --max-rows,256; "-": the defaults)
if want servewhole && [ -f build/gpu/o200k-tokenizer.json.gz ]; then
    zcat build/gpu/o200k-tokenizer.json.gz >"$packs/o200k-tokenizer.json"
    for v in ${GPU_CHECK_SERVE_VARIANTS:--}; do
        vv=()
        [ "$v" = - ] && v=default || IFS=, read -ra vv <<<"$v"
        d="$logs/serve-whole-${v//[^a-z0-9]/}"
        STREAMS=${GPU_CHECK_SERVE_STREAMS:-1,4,16} TOKENS=32 REPS=1 PROMPT=${GPU_CHECK_SERVE_PROMPT:-64} \
            step "serve-whole-${v//[^a-z0-9]/}" 300 t/tools/serve_measure.sh "$d" 18891 - --backend "$B" \
            --kernels fast --synthetic-weights 1 --config conf/packs/muse-spark-open-1gpu.json --bits 2 \
            --codebook mcg --tokenizer "$packs/o200k-tokenizer.json" --streams 16 --queue 32 \
            --context 131072 --kv-blocks 65536 "${vv[@]}"
        cat "$d/verdict.txt" "$d/concurrent.txt" 2>/dev/null | tee -a "$sum"
    done
fi

# serveprompt (by name): the whole one-GPU shape behind nginx, a lone prompt of
# GPU_CHECK_SERVE_PROMPT (4096) tokens timed through HTTP (muse-bench prompt --url: TTFT cold and
# from the prompt cache) under each of GPU_CHECK_SERVE_VARIANTS (engine flags, comma-separated;
# "-": the defaults); with GPU_CHECK_SERVE_TRACE=1 each engine under the kernel tracer, then
# its rounds listed (t/tools/trace_rounds.py: each round's span, busy time and the gap before it)
if want serveprompt && [ -f build/gpu/o200k-tokenizer.json.gz ]; then
    zcat build/gpu/o200k-tokenizer.json.gz >"$packs/o200k-tokenizer.json"
    for v in ${GPU_CHECK_SERVE_VARIANTS:--}; do
        vv=()
        [ "$v" = - ] && v=default || IFS=, read -ra vv <<<"$v"
        n=${v//[^a-z0-9]/}
        tr=()
        if [ "${GPU_CHECK_SERVE_TRACE:-0}" = 1 ] && [ -f build/t/libkernel-trace.so ]; then
            [ -f build/t/libcupti.so.13 ] || gunzip -kf build/t/libcupti.so.13.gz
            tr=(CUDA_INJECTION64_PATH="$PWD/build/t/libkernel-trace.so" MUSE_TRACE_OUT="$logs/sp-$n.csv")
        fi
        rd=$(mktemp -d) # under /tmp: nginx's workers (www-data) reach its socket, not under $logs (0700)
        step "serveprompt-start-$n" 120 env "${tr[@]}" NGINX_BIN="${MUSE_NGINX:-nginx}" t/tools/bench_serve.sh start 18892 - "$rd" build \
            --backend "$B" --kernels fast --synthetic-weights 1 --config conf/packs/muse-spark-open-1gpu.json \
            --bits 2 --codebook mcg --tokenizer "$packs/o200k-tokenizer.json" "${vv[@]}"
        step "prompt-serve-$n" 200 build/muse-bench prompt --url http://127.0.0.1:18892 \
            --lengths "${GPU_CHECK_SERVE_PROMPT:-4096}" --reps 2
        curl -fs http://127.0.0.1:18892/health >"$logs/sp-$n-health.json"
        step "serveprompt-stop-$n" 30 t/tools/bench_serve.sh stop "$rd"
        cp -r "$rd/logs" "$logs/sp-$n-logs" 2>/dev/null
        rm -rf "$rd"
        if [ -f "$logs/sp-$n.csv" ]; then
            step "serveprompt-trace-$n" 60 python3 t/tools/trace_rounds.py "$logs/sp-$n.csv"
            gzip -c "$logs/sp-$n.csv" >"$out/sp-$n.csv.gz" && rm -f "$logs/sp-$n.csv"
        fi
    done
fi

# the first tables, with the copy bandwidth of the same run; their JSON comes back in the logs
if want bench; then
    step bench-kernels 90 build/muse-bench kernels --backend "$B" --model "$packs/q4-mul1" \
        --json "$logs/kernels-tiny.json"
    if [ -d "$packs/medium" ]; then
        step bench-medium 90 build/muse-bench kernels --backend "$B" --model "$packs/medium" \
            --rows 1,16,256 --context 4096 --json "$logs/kernels-medium.json"
        step bench-decode 90 build/muse-bench decode --backend "$B" --model "$packs/medium" \
            --json "$logs/decode-medium.json"
    fi
fi
# decode on the one-GPU shape cut to 4 layers, each path (graphs as the engine runs them)
if want decode; then
    cut=(--synthetic-weights 1 --config conf/packs/muse-spark-open-1gpu-4l.json --bits 2 --codebook mcg
        --tokens 32 --prompt 64)
    dbase=${GPU_CHECK_DECODE_BASE:-$logs/decode-exact.json} # given: an earlier exact run's
    [ -n "${GPU_CHECK_DECODE_BASE:-}" ] ||
        step decode-exact 150 build/muse-bench decode --backend "$B" "${cut[@]}" --kernels exact \
            --json "$logs/decode-exact.json"
    step decode-fast 150 build/muse-bench decode --backend "$B" "${cut[@]}" --kernels fast \
        --baseline "$dbase" --json "$logs/decode-fast.json"
fi

# the benchmarks of the whole shape (issue 21 items 2 and 5) on the one-GPU shape cut to 4
# layers, fast kernels: decode at 1, 4, 16 and 64 streams, the stages of a decode round, prompt
# at 512, 4096 and 32768 tokens; the JSON in the logs (whole-*.json), plotted by
# t/tools/plots.sh where this machine has gnuplot, else afterwards from those files. Not in the
# default steps: GPU_CHECK_STEPS="setup whole" (about 3 minutes, most of it the synthetic fills).
if want whole; then
    # GPU_CHECK_WHOLE_CONFIG: another shape (conf/packs/tiny.json to try the step on the CPU, the
    # whole conf/packs/muse-spark-open-1gpu.json on the H200); _STREAMS, _LENGTHS: the rows
    cut=(--synthetic-weights 1 --config "${GPU_CHECK_WHOLE_CONFIG:-conf/packs/muse-spark-open-1gpu-4l.json}"
        --bits 2 --codebook mcg --kernels fast)
    step whole-decode 120 build/muse-bench decode --backend "$B" "${cut[@]}" --streams "${GPU_CHECK_WHOLE_STREAMS:-1,4,16,64}" \
        --tokens 16 --prompt 64 --json "$logs/whole-decode.json"
    step whole-stages 120 build/muse-bench stages --backend "$B" "${cut[@]}" --context 4096 \
        --tokens 16 --json "$logs/whole-stages.json"
    step whole-prompt 120 build/muse-bench prompt --backend "$B" "${cut[@]}" \
        --lengths "${GPU_CHECK_WHOLE_LENGTHS:-512,4096,32768}" --rows 256 --json "$logs/whole-prompt.json"
    plots=()
    for f in decode stages prompt; do
        [ -s "$logs/whole-$f.json" ] && cp "$logs/whole-$f.json" "$out/" &&
            plots+=("--$f" "$logs/whole-$f.json")
    done
    if command -v gnuplot >/dev/null && ((${#plots[@]})); then
        step whole-plots 30 t/tools/plots.sh "${plots[@]}" --out "$out"
    fi
fi

# the fast attention of one decode row at long contexts (the 4-layer cut's kernels table) under
# each of GPU_CHECK_ATTN_VARIANTS: comma-separated VAR=VALUE of the engine's tuning switches
# (MUSE_ATTN_SPLITS=N, the split cap), "-" the defaults
if want attnlong && [ "$B" = cuda ]; then
    for v in ${GPU_CHECK_ATTN_VARIANTS:--}; do
        variant "$v"
        for ctx in 4096 32768 131072; do
            step "attn-$vname-$ctx" 90 env "${vv[@]}" "$bin" kernels --backend "$B" --synthetic-weights 1 \
                --config conf/packs/muse-spark-open-1gpu-4l.json --bits 2 --codebook mcg --rows 1 \
                --context $ctx --min-ms 20 --kernels fast --json "$logs/attn-$vname-$ctx.json"
        done
    done
fi

# the whole shape's decode under the engine's tuning switches (variants of one binary, e.g.
# MUSE_CUDA_SIDE=0, MUSE_PDL=0; "-": the defaults), at 1 and 4 streams, after a prompt of
# GPU_CHECK_WHOLE_PROMPT (64) tokens
if want wholevar; then
    cut=(--synthetic-weights 1 --config "${GPU_CHECK_WHOLE_CONFIG:-conf/packs/muse-spark-open-1gpu.json}"
        --bits 2 --codebook mcg --kernels fast --streams "${GPU_CHECK_WHOLE_STREAMS:-1,4}" --tokens 16
        --prompt "${GPU_CHECK_WHOLE_PROMPT:-64}")
    for v in ${GPU_CHECK_WHOLE_VARIANTS:--}; do
        vv=()
        [ "$v" = - ] && v=default || IFS=, read -ra vv <<<"$v"
        step "whole-decode-$v" 90 env "${vv[@]}" build/muse-bench decode --backend "$B" "${cut[@]}" \
            --json "$logs/whole-decode-$v.json"
    done
fi
# abdecode (by name): the whole shape's decode by an earlier build's bench carried as
# build/gpu/old/muse-bench and by this one, taking turns GPU_CHECK_AB_REPS (2) times at
# GPU_CHECK_AB_STREAMS (1,4,16) after a prompt of GPU_CHECK_AB_PROMPT (64) tokens, this one's
# also under each of GPU_CHECK_WHOLE_VARIANTS: a change's speed against the same GPU's noise in
# one call
if want abdecode && [ -x build/gpu/old/muse-bench ]; then
    cut=(--synthetic-weights 1 --config "${GPU_CHECK_WHOLE_CONFIG:-conf/packs/muse-spark-open-1gpu.json}"
        --bits 2 --codebook mcg --kernels fast --streams "${GPU_CHECK_AB_STREAMS:-1,4,16}" --tokens 32
        --prompt "${GPU_CHECK_AB_PROMPT:-64}")
    for i in $(seq 1 "${GPU_CHECK_AB_REPS:-2}"); do
        step "whole-ab-old-$i" 90 build/gpu/old/muse-bench decode --backend "$B" "${cut[@]}"
        for v in ${GPU_CHECK_WHOLE_VARIANTS:--}; do
            vv=()
            [ "$v" = - ] && v=default || IFS=, read -ra vv <<<"$v"
            step "whole-ab-$v-$i" 90 env "${vv[@]}" build/muse-bench decode --backend "$B" "${cut[@]}"
        done
    done
fi
# trace (by name): the whole shape's decode at each of GPU_CHECK_TRACE_STREAMS (1 4) after a
# prompt of GPU_CHECK_TRACE_PROMPT (64) tokens under the CUPTI kernel tracer
# (t/tools/kernel_trace.c, carried by make gpu-carry): every kernel's device start and end, then
# t/tools/trace_round.py's timeline of a round and of GPU_CHECK_TRACE_LAYER (10), once for each
# of GPU_CHECK_TRACE_VARIANTS (-: the defaults; old: build/gpu/old's bench; else switches
# joined by commas), so a kernel's end increment shows against the earlier build's in one call;
# the traces come back gzipped
if want trace && [ -f build/t/libkernel-trace.so ]; then
    [ -f build/t/libcupti.so.13 ] || gunzip -kf build/t/libcupti.so.13.gz
    for v in ${GPU_CHECK_TRACE_VARIANTS:--}; do
        variant "$v"
        tag=
        [ "$vname" = default ] || tag=-$(printf '%s' "$vname" | tr -c 'A-Za-z0-9=_' '_')
        for s in ${GPU_CHECK_TRACE_STREAMS:-1 4}; do
            step "trace-run$tag-$s" 120 env "${vv[@]}" \
                CUDA_INJECTION64_PATH="$PWD/build/t/libkernel-trace.so" \
                MUSE_TRACE_OUT="$logs/trace$tag-$s.csv" "$bin" decode --backend "$B" \
                --synthetic-weights 1 --config "${GPU_CHECK_WHOLE_CONFIG:-conf/packs/muse-spark-open-1gpu.json}" \
                --bits 2 --codebook mcg --kernels fast --streams "$s" --tokens 8 \
                --prompt "${GPU_CHECK_TRACE_PROMPT:-64}"
            step "whole-trace$tag-$s" 60 python3 t/tools/trace_round.py "$logs/trace$tag-$s.csv" \
                --rounds 3 --layer "${GPU_CHECK_TRACE_LAYER:-10}"
            gzip -c "$logs/trace$tag-$s.csv" >"$out/trace$tag-$s.csv.gz" &&
                rm -f "$logs/trace$tag-$s.csv"
        done
    done
fi
# the whole shape's prompt under the same variants: GPU_CHECK_WHOLE_LENGTHS (4096) in rounds of
# each of GPU_CHECK_PROMPT_ROWS (256; a space-separated list)
if want promptvar; then
    cut=(--synthetic-weights 1 --config "${GPU_CHECK_WHOLE_CONFIG:-conf/packs/muse-spark-open-1gpu.json}"
        --bits 2 --codebook mcg --kernels fast --lengths "${GPU_CHECK_WHOLE_LENGTHS:-4096}")
    for v in ${GPU_CHECK_WHOLE_VARIANTS:--}; do
        variant "$v"
        for rows in ${GPU_CHECK_PROMPT_ROWS:-256}; do
            step "prompt-$vname-$rows" 120 env "${vv[@]}" "$bin" prompt --backend "$B" "${cut[@]}" \
                --rows "$rows" --json "$logs/prompt-$vname-$rows.json"
        done
    done
fi

rm -rf "$packs"
note "== done $(date -u +%FT%TZ); logs in logs.tar.gz"
