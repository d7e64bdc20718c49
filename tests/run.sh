#!/usr/bin/env bash
# tests/run.sh BUILD_DIR - runs every test layer against the binaries in BUILD_DIR (what `make
# test` and `make test-quick` call, after building them).
# tests/run.sh --update-golden BUILD_DIR - rewrites the expected files of tests/golden (NAME.ir,
# NAME.plan, ... and *.err; a case without any gets NAME.ir) from what BUILD_DIR/mbtc prints now,
# and runs nothing else: review the diff before committing it.
#
# The layers are the table LAYERS below; each layer's logic is a function in tests/layers/*.sh,
# and the exec, verify, accum and torch layers run the case files of tests/LAYER/ (one case a
# file, its `# test` and `# expect` header lines interpreted by tests/layers/cases.sh; the
# vocabulary is in tests/README.md). Each check prints `PASS <layer>/<name>` or
# `FAIL <layer>/<name>: reason` (the captured output of a failure indented below it), each layer
# a `# layer NAME: 1.2 s` timing line, and a layer that cannot run here one `SKIP NAME: why`.
# MBT_QUICK=1 skips the layers marked full (asan and fuzz); MBT_ASAN_LEAKS=0 runs the asan layer
# without leak detection; MBT_LAYERS=exec,verify runs only the layers named (a comma-separated
# list). The last line is `N passed, M failed` (`, K skipped` when K > 0); the exit status is 1
# when anything failed. A skipped test never counts as passed.
set -u
set -o pipefail

# name          function            needs       runs
LAYERS='
unit            layer_unit          -           quick
format          layer_format        clang-format quick
diag            layer_diag          -           quick
check           layer_check         -           quick
golden          layer_golden        -           quick
cuda            layer_cuda          nvrtc       quick
pathological    layer_pathological  -           quick
exec            run_cases           -           quick
verify          run_cases           -           quick
accum           run_cases           -           quick
ckpt            layer_script        -           quick
comm            layer_script        -           quick
install         layer_script        -           quick
info            layer_script        script      quick
serve           layer_script        -           quick
gpu-selftest    layer_gpu_selftest  -           quick
gpu-emu         layer_gpu_emu       nvrtc       quick
torch           run_cases           torch       quick
asan            layer_asan          asan        full
fuzz            run_fuzz            fuzz        full
'
# name: what MBT_LAYERS selects and the `# layer` line names. function: called with the layer's
# name (tests/layers/*.sh). needs: what the layer cannot run without (see need()); a layer whose
# need is missing prints one SKIP line. runs: quick layers run always, full ones not under
# MBT_QUICK=1. What each layer checks: tests/README.md and docs/testing.md.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UPDATE_GOLDEN=0
if [ "${1:-}" = --update-golden ]; then
    UPDATE_GOLDEN=1
    shift
fi
if [ $# -lt 1 ]; then
    echo "usage: tests/run.sh [--update-golden] BUILD_DIR" >&2
    exit 2
fi
if ! BUILD=$(cd "$1" 2>/dev/null && pwd); then
    echo "FAIL setup: build directory '$1' does not exist (run make first)"
    echo "0 passed, 1 failed"
    exit 1
fi
cd "$ROOT" || exit 2
QUICK=${MBT_QUICK:-0}
[ "$QUICK" = 0 ] || [ "$QUICK" = 1 ] || QUICK=1

TMP="$BUILD/tmp/run"
rm -rf "$TMP"
mkdir -p "$TMP" || exit 2
# NVRTC's output cache (compiler/backend/cuda/nvrtc.c), fresh for each run: every distinct CUDA
# program the tests build is compiled by NVRTC once a run, and the cache itself is tested
# (run_cuda_embed).
export MBT_CACHE_DIR="$BUILD/tmp/cache"
rm -rf "$MBT_CACHE_DIR"
# Executables are built for the CPU alone (MBT_CUDA_ARCH=none: no NVRTC, which keeps the layers
# that build many executables fast) except where a test gives --cuda-arch: exec/example (every
# example's CUDA side, CUDA_ARCHS), cuda/embed and exec/emit-program. Where NVRTC is missing,
# CUDA_ARCHS is none too (then mbtc would warn that it builds for the CPU alone).
export MBT_CUDA_ARCH=none
CUDA_ARCHS=sm_80,sm_90
NVRTC_PROBE="$TMP/nvrtc-probe.err"
"$BUILD/mbtc" --emit=ptx --cuda-arch=sm_80 tests/golden/mlp.mbt >/dev/null 2>"$NVRTC_PROBE" || CUDA_ARCHS=none

# shellcheck source=tests/report.sh
. tests/report.sh
for f in tests/layers/*.sh; do
    # shellcheck disable=SC1090
    . "$f"
done

# need WHAT LAYER: nothing when the layer can run here, else why not (the SKIP line's reason).
need() {
    case "$1" in
    -) ;;
    nvrtc)
        if grep -q 'needs NVRTC, which is not installed' "$NVRTC_PROBE"; then
            sed -n 's/.*not installed here: //p' "$NVRTC_PROBE" | head -n 1
        fi
        ;;
    torch)
        /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 \
            || echo "no PyTorch for /usr/bin/python3 (tools/deps.sh test installs python3-torch as root)"
        ;;
    script) [ -f "tests/$2/run.sh" ] || echo "no tests/$2/run.sh" ;;
    clang-format) command -v clang-format-19 >/dev/null 2>&1 || echo "no clang-format-19 (tools/deps.sh test installs it as root)" ;;
    asan) [ -x "$BUILD/asan/mbtc" ] || echo "no $BUILD/asan/mbtc (make asan builds it)" ;;
    fuzz)
        [ -x "$BUILD/fuzz/fuzz_frontend" ] || [ -x "$BUILD/fuzz/fuzz_safetensors" ] \
            || echo "no $BUILD/fuzz/fuzz_frontend nor fuzz_safetensors (make fuzz-build builds them)"
        ;;
    *) echo "the layer table names an unknown need '$1'" ;;
    esac
}

# The layers whose logic is a call or two (the others are in tests/layers/NAME.sh).
layer_unit() { run_unit unit "$BUILD/tests"; }
layer_diag() { run_diag diag "$BUILD/mbtc"; }
layer_check() { run_check check "$BUILD/mbtc"; }
layer_golden() { run_golden golden "$BUILD/mbtc" 1000; }
layer_pathological() { run_pathological pathological "$BUILD/mbtc" 1000 5; }
# a layer that is a script of its own, tests/LAYER/run.sh BUILD, its PASS/FAIL lines relayed
layer_script() { run_relayed "$1" "tests/$1/run.sh"; }
# the C sources in the house style (.clang-format): tools/format.sh --check
layer_format() {
    local out
    if out=$(tools/format.sh --check 2>&1); then pass "format/clang-format ($out)"; else fail format/clang-format "$out"; fi
}
# make test-gpu's comparison (tests/gpu/cmpdump.py) passes on equal steps and PyTorch's, fails on
# perturbed ones
layer_gpu_selftest() { run_relayed gpu-selftest tests/gpu/selftest.sh; }

if [ "$UPDATE_GOLDEN" = 1 ]; then
    run_golden golden "$BUILD/mbtc" 0
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" = 0 ]
    exit
fi

# run_layer NAME FUNCTION NEEDS RUNS: the layer, timed, unless MBT_LAYERS leaves it out.
run_layer() {
    local name=$1 fn=$2 needs=$3 runs=$4 why start ms
    if [ -n "${MBT_LAYERS:-}" ] && [[ ",$MBT_LAYERS," != *",$name,"* ]]; then return; fi
    start=$(now_ns)
    why=$(need "$needs" "$name")
    if [ "$runs" = full ] && [ "$QUICK" = 1 ]; then
        skip "$name" "MBT_QUICK=1"
    elif [ -n "$why" ]; then
        skip "$name" "$why"
    else
        "$fn" "$name"
    fi
    ms=$((($(now_ns) - start) / 1000000))
    printf '# layer %s: %d.%d s\n' "$name" $((ms / 1000)) $(((ms % 1000) / 100))
}

# (an array, not a `while read` loop: the tests' commands must not read the table as their stdin)
mapfile -t rows <<<"$LAYERS"
for row in "${rows[@]}"; do
    read -r name fn needs runs <<<"$row"
    [ -n "${name:-}" ] && run_layer "$name" "$fn" "$needs" "$runs"
done

summary
