# shellcheck shell=bash
# tests/layers/cuda.sh - the cuda layer: every example's kernels through NVRTC without spills, and
# the executable's embedded CUDA images (sourced by tests/run.sh; BUILD, TMP and report.sh's
# pass/fail/skip are set).

# cuda_spilling FILE ALLOWED: the kernels of FILE's `# ptxas` lines (mbtc --cuda-info) whose spill
# stores, spill loads or stack frame are not 0 for some architecture, minus those whose name
# matches the extended regex ALLOWED ('' allows none). Prints one name a line.
cuda_spilling() {
    local allowed=${2:-'^$'}
    LC_ALL=C grep -a '^# ptxas ' "$1" | LC_ALL=C grep -aE '(^|[^0-9])[1-9][0-9]* B (spill stores|spill loads|stack)' \
        | LC_ALL=C sed 's/^# ptxas \([^:]*\):.*/\1/' | LC_ALL=C grep -avE "$allowed"
}

# Kernels allowed to spill, each with why: none. (The generated attention backward for k rows
# spilled ~100 B until attention became runtime/kernels/rt_attention.cuh's templates.)
CUDA_SPILL_OK=''

run_cuda() {
    local mbtc=$1 dir="$BUILD/tmp/cuda" f t name out err probe jobs=() names=() i rc bad n
    mkdir -p "$dir"
    probe="$dir/probe.err"
    if ! "$mbtc" --emit=ptx --cuda-arch=sm_80 tests/golden/mlp.mbt >/dev/null 2>"$probe"; then
        if grep -q 'needs NVRTC, which is not installed' "$probe"; then
            skip cuda "$(sed -n 's/.*not installed here: //p' "$probe" | head -n 1)"
        else
            fail cuda/probe "mbtc --emit=ptx failed" "$probe"
        fi
        return 1
    fi
    # two train blocks at a time (each mbtc runs NVRTC for sm_80 then sm_90)
    for f in examples/*.mbt; do
        for t in $(LC_ALL=C sed -n 's/^train[[:space:]]\{1,\}\([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' "$f"); do
            names+=("$(basename "$f" .mbt)-$t")
            { timeout 120 "$mbtc" --emit=kernels --cuda-info --cuda-arch=sm_80,sm_90 --train "$t" "$f" \
                >"$dir/$(basename "$f" .mbt)-$t.out" 2>"$dir/$(basename "$f" .mbt)-$t.err"; echo $? >"$dir/$(basename "$f" .mbt)-$t.rc"; } &
            jobs+=($!)
            if [ ${#jobs[@]} -ge 2 ]; then wait "${jobs[0]}"; jobs=("${jobs[@]:1}"); fi
        done
    done
    wait
    for name in "${names[@]}"; do
        out="$dir/$name.out"
        err="$dir/$name.err"
        rc=$(cat "$dir/$name.rc")
        n=$(LC_ALL=C grep -ac '^# ptxas ' "$out")
        bad=$(cuda_spilling "$out" "$CUDA_SPILL_OK" | tr '\n' ' ')
        if [ -n "$(describe_status "$rc")" ] || [ "$rc" != 0 ]; then
            fail "cuda/example/$name" "mbtc --emit=kernels --cuda-info exited with status $rc" "$err"
        elif [ -s "$err" ]; then
            fail "cuda/example/$name" "mbtc printed on stderr" "$err"
        elif [ "$n" = 0 ]; then
            fail "cuda/example/$name" "no '# ptxas' lines" "$out"
        elif [ -n "$bad" ]; then
            fail "cuda/example/$name" "ptxas reports spills in: $bad"
        else
            pass "cuda/example/$name ($n kernels, sm_80 and sm_90)"
        fi
    done
    # control: the check catches a kernel that spills or has a stack frame on one architecture only
    # (the lines as nvrtc_parse_ptxas's report prints them; test_cuda shows ptxas reporting spills)
    printf '%s\n' '# ptxas k_ok: sm_80 40 registers, 0 B spill stores, 0 B spill loads, 0 B stack, 0 B smem; sm_90 40 registers, 0 B spill stores, 0 B spill loads, 0 B stack, 0 B smem' \
        '# ptxas k_spill: sm_80 40 registers, 0 B spill stores, 0 B spill loads, 0 B stack, 0 B smem; sm_90 128 registers, 12 B spill stores, 16 B spill loads, 0 B stack, 0 B smem' \
        '# ptxas k_stack: sm_80 40 registers, 0 B spill stores, 0 B spill loads, 48 B stack, 0 B smem; sm_90 40 registers, 0 B spill stores, 0 B spill loads, 0 B stack, 0 B smem' >"$dir/control.out"
    if [ "$(cuda_spilling "$dir/control.out" '' | tr '\n' ' ')" = "k_spill k_stack " ] && [ -z "$(cuda_spilling "$dir/control.out" 'k_(spill|stack)$')" ]; then
        pass cuda/control-spill
    else
        fail cuda/control-spill "the spill check did not name exactly k_spill and k_stack" "$dir/control.out"
    fi
}

# Whether file $1 holds the bytes of file $2.
holds_bytes() {
    /usr/bin/python3 -c 'import sys; sys.exit(0 if open(sys.argv[2], "rb").read() in open(sys.argv[1], "rb").read() else 1)' "$1" "$2"
}

# -o embeds the CUDA program: the cubins of --dump-dir (the same translation unit, the same NVRTC)
# byte for byte, and the PTX of the highest architecture alone; --help says so. --cuda-arch=none
# embeds nothing. NVRTC's cache gives the cubins compiling gives. Without a GPU, --device cuda is an
# error naming why, and auto trains on the CPU saying why.
run_cuda_embed() {
    local mbtc=$1 dir="$BUILD/tmp/cuda/embed" out
    rm -rf "$dir"
    mkdir -p "$dir"
    out="$dir/out"
    if ! "$mbtc" examples/mlp.mbt --cuda-arch=sm_80,sm_90 -o "$dir/mlp" >"$out" 2>&1 || [ -s "$out" ] \
        || ! "$mbtc" --emit=cuda --cuda-arch=sm_80,sm_90 --dump-dir "$dir/dump" examples/mlp.mbt >/dev/null 2>"$out" \
        || ! MBT_CACHE_DIR=off "$mbtc" --emit=cuda --cuda-arch=sm_80,sm_90 --dump-dir "$dir/dump-nocache" examples/mlp.mbt >/dev/null 2>"$out"; then
        fail cuda/embed "mbtc -o or --dump-dir of examples/mlp.mbt failed (or printed)" "$out"
        return
    fi
    if holds_bytes "$dir/mlp" "$dir/dump/program.sm_80.cubin" && holds_bytes "$dir/mlp" "$dir/dump/program.sm_90.cubin" \
        && holds_bytes "$dir/mlp" "$dir/dump/program.sm_90.ptx"; then
        pass "cuda/embed/images (cubins sm_80, sm_90 and PTX compute_90 in the executable, byte for byte)"
    else
        fail cuda/embed/images "the executable lacks a cubin or the PTX that --dump-dir wrote"
    fi
    if holds_bytes "$dir/mlp" "$dir/dump/program.sm_80.ptx"; then
        fail cuda/embed/ptx-highest "the executable holds compute_80's PTX too (only the highest architecture's is embedded)"
    else
        pass cuda/embed/ptx-highest
    fi
    if cmp -s "$dir/dump/program.sm_90.cubin" "$dir/dump-nocache/program.sm_90.cubin" \
        && cmp -s "$dir/dump/program.sm_90.ptx" "$dir/dump-nocache/program.sm_90.ptx" \
        && [ -n "$(ls "$MBT_CACHE_DIR/nvrtc" 2>/dev/null)" ]; then
        pass cuda/embed/cache
    else
        fail cuda/embed/cache "the NVRTC cache is empty, or its cubin or PTX differs from a compilation without it"
    fi
    # a cache entry that is not a regular file is a miss (a FIFO there blocked fopen for good):
    # every entry of a private cache replaced by a FIFO, the same program compiles, in bounded time
    local cache="$dir/fifo-cache" f
    MBT_CACHE_DIR=$cache "$mbtc" --emit=ptx --cuda-arch=sm_80 examples/mlp.mbt >/dev/null 2>"$out"
    for f in "$cache"/nvrtc/*; do rm -f "$f" && mkfifo "$f"; done
    if [ -n "$(ls "$cache/nvrtc" 2>/dev/null)" ] \
        && MBT_CACHE_DIR=$cache timeout 120 "$mbtc" --emit=ptx --cuda-arch=sm_80 examples/mlp.mbt >/dev/null 2>"$out"; then
        pass cuda/embed/cache-fifo
    else
        fail cuda/embed/cache-fifo "with FIFOs for the cache's entries, mbtc --emit=ptx failed or hung (status $?)" "$out"
    fi
    "$dir/mlp" --help >"$out" 2>&1
    if grep -q '^For the GPU: [0-9]* kernels; cubins sm_80, sm_90; PTX compute_90 (compiled for other GPUs on first use)$' "$out"; then
        pass cuda/embed/help
    else
        fail cuda/embed/help "--help does not list the embedded images" "$out"
    fi
    if ! "$mbtc" examples/mlp.mbt --cuda-arch=none -o "$dir/mlp-cpu" >"$out" 2>&1 || [ -s "$out" ]; then
        fail cuda/embed/none "mbtc --cuda-arch=none -o failed (or printed)" "$out"
    elif holds_bytes "$dir/mlp-cpu" "$dir/dump/program.sm_90.cubin" \
        || ! grep -q '^Built for the CPU alone' <("$dir/mlp-cpu" --help 2>&1); then
        # (grep reads a process substitution: in a pipe under pipefail, grep -q's early exit could
        # kill --help with SIGPIPE and fail the check - seen once on a loaded machine)
        fail cuda/embed/none "--cuda-arch=none: the executable holds a cubin, or --help does not say it is for the CPU alone"
    else
        pass cuda/embed/none
    fi
}

# --dump-dir writes every stage --emit prints (each stage of `mbtc --emit=list` without a
# parenthesised "prints nothing" or "not yet printable") as DIR/NN-STAGE.txt, NN its line in the
# list, equal to `mbtc --emit=STAGE`; sass only where --emit=sass works (cuobjdump or nvdisasm).
# Uses the dump run_cuda_embed wrote of examples/mlp.mbt.
run_cuda_dump() {
    local mbtc=$1 dir="$BUILD/tmp/cuda/embed" line nn=0 stage file n=0 bad=""
    while IFS= read -r line; do
        nn=$((nn + 1))
        stage=${line%% *}
        case $line in *"(prints nothing"* | *"(not yet printable)"*) continue ;; esac
        file=$(printf '%s/dump/%02d-%s.txt' "$dir" "$nn" "$stage")
        if ! "$mbtc" --emit="$stage" --cuda-arch=sm_80,sm_90 examples/mlp.mbt >"$dir/emit.out" 2>"$dir/emit.err"; then
            if [ "$stage" = sass ] && grep -q 'needs cuobjdump or nvdisasm' "$dir/emit.err" && [ ! -e "$file" ]; then continue; fi
            bad="$bad $stage(--emit failed)"
        elif ! cmp -s "$dir/emit.out" "$file"; then
            bad="$bad $stage"
        fi
        n=$((n + 1))
    done < <("$mbtc" --emit=list)
    if [ "$n" -lt 11 ]; then
        fail cuda/dump-stages "only $n stages of --emit=list are printable here (11 or more expected)"
    elif [ -n "$bad" ]; then
        fail cuda/dump-stages "--dump-dir's file differs from --emit=STAGE's output (or is missing) for:$bad"
    else
        pass "cuda/dump-stages ($n stages, each equal to --emit=STAGE)"
    fi
}

layer_cuda() { run_cuda "$BUILD/mbtc" && run_cuda_embed "$BUILD/mbtc" && run_cuda_dump "$BUILD/mbtc"; }
