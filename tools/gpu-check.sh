#!/usr/bin/env bash
# tools/gpu-check.sh DIST.tar.gz RESULTS [SECONDS] - mbt's GPU checks and benchmarks on a GPU machine
# that has CUDA, PyTorch and nvcc but no LLVM (docs/install.md, "Carrying mbt to a GPU machine").
#
# DIST.tar.gz is `make dist LLVM_STATIC=1`'s tarball (mbtc with LLVM inside, the runtime library and
# the static archives executables link), built where LLVM is; this script runs in a checkout of the
# same commit (the tests, benchmarks and examples are read from it). It unpacks the tarball, makes
# a build directory of it (BUILD: mbtc, mbt-gendata, tests/st_compare when carried beside the
# tarball), then runs, in this order, each part under what is left of SECONDS (default 540):
#   attention   bench/attention: mbt's attention kernels against a float64 reference, timed against
#               torch's scaled_dot_product_attention (issue 14)
#   bench       bench/gpu.py: GPT-2 124M at micro-batch $MBT_GPU_BATCH (default 12) x 1024, mbt bf16
#               against torch.compile bf16 in the same run, and mbt's MBT_DEBUG kernel table
#   memory      bench/memory.py --gpu: GPT-2 124M bf16 at micro $MBT_GPU_MEMORY_BATCH (default 64) x 1024 with
#               none, recompute [gelu], recompute [all], activations to host, the optimizer to host: the
#               device's peak and the step time of each (issue 18); the JSON is RESULTS/memory.json
#   serve       bench/serve_gpu.py (make bench-gpu's serving part): GPT-2 124M and the Llama-style model
#               served by `PROG serve --device cuda`, decode tokens/s at batches 1 to 128 against the
#               HBM bound (the bandwidth measured by a copy), TTFT and TPOT against transformers'
#               generate in $PY (skipped with a line when it is not installed); MBT_GPU_SERVE_ARGS
#               adds options (e.g. "--models gpt2 --batches 1,64"); the JSON is RESULTS/serve.json
#   test        tests/gpu/run.sh (make test-gpu): the device's step against the CPU's, 8 blocks at a
#               time (MBT_GPU_TEST_JOBS) and 3 sections at a time (MBT_GPU_TEST_LANES): the whole suite
#               took 108 s so on a lent H100 (docs/testing.md)
#   ncu         (only when named) Nsight Compute's speed of light, occupancy and warp stalls of the
#               FA2 forward and backward kernels at GPT-2's shape (after the attention part)
# MBT_GPU_PARTS=attention,bench,memory,serve,test chooses parts (default: all but memory and ncu); MBT_GPU_ATTN_ARGS adds bench/attention options; MBT_GPU_BENCH_MODES the benchmark's modes.
# Each part's output goes to RESULTS/PART.txt as it runs, so a part cut off by the deadline leaves
# what it printed. The last lines are a table: part, status, seconds.
set -u
DIST=${1:?usage: tools/gpu-check.sh DIST.tar.gz RESULTS [SECONDS]}
RES=${2:?usage: tools/gpu-check.sh DIST.tar.gz RESULTS [SECONDS]}
BUDGET=${3:-540}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
START=$(date +%s)
PY=${MBT_PYTHON:-python3} # the python with CUDA torch and numpy
mkdir -p "$RES" || exit 2

left() { echo $((BUDGET - ($(date +%s) - START))); }

# The build directory: the tarball's installed tree (mbtc finds its runtime relative to itself).
WORK=$(mktemp -d /tmp/mbt-gpu.XXXXXX)
tar -C "$WORK" -xzf "$DIST" || { echo "cannot unpack $DIST"; exit 2; }
TREE=$(ls -d "$WORK"/mbt-*/ | head -n 1)
BUILD="$WORK/build"
mkdir -p "$BUILD/tests"
ln -s "$TREE/bin/mbtc" "$BUILD/mbtc"
ln -s "$TREE/bin/mbt-gendata" "$BUILD/mbt-gendata"
[ -x "$(dirname "$DIST")/st_compare" ] && cp "$(dirname "$DIST")/st_compare" "$BUILD/tests/"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
        --format=csv
    "$BUILD/mbtc" --version
    "$PY" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
    nvcc --version | tail -n 2
} 2>&1 | tee "$RES/machine.txt"

SUMMARY=()
part() { # NAME CAP COMMAND...: run COMMAND under min(CAP, time left), output to RES/NAME.txt
    local name=$1 cap=$2 t0 rc lim
    shift 2
    lim=$(left)
    [ "$cap" -lt "$lim" ] && lim=$cap
    if [ "$lim" -lt 20 ]; then
        SUMMARY+=("$name skipped (no time left) 0")
        return
    fi
    echo "==== $name (at most ${lim}s)"
    t0=$(date +%s)
    (cd "$ROOT" && PYTHONUNBUFFERED=1 timeout -k 5 "$lim" "$@") 2>&1 | tee "$RES/$name.txt"
    rc=${PIPESTATUS[0]}
    SUMMARY+=("$name $([ "$rc" = 124 ] && echo "cut-off" || echo "status-$rc") $(($(date +%s) - t0))")
}

PARTS=",${MBT_GPU_PARTS:-attention,bench,serve,test},"
if [[ $PARTS == *,attention,* ]]; then
    part attention 180 bash -c "'$PY' bench/attention --build '$BUILD' --prepare >/dev/null && \
        '$PY' bench/attention --build '$BUILD' --repeat 20 ${MBT_GPU_ATTN_ARGS:-}"
fi
if [[ $PARTS == *,ncu,* ]]; then # needs the attention part's prelude
    part ncu 120 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --kernel-name-base mangled --kernel-id "::regex:bench_(fwd|bwd_q|bwd_kv)ILi0E:2" \
        "$PY" bench/attention --build "$BUILD" --shapes gpt2 --fa2-only --repeat 1
fi
if [[ $PARTS == *,bench,* ]]; then
    part bench 240 "$PY" bench/gpu.py --build "$BUILD" --seq 1024 --batch "${MBT_GPU_BATCH:-12}" --rounds 1 \
        --steps 20 --warmup 6 --modes "${MBT_GPU_BENCH_MODES:-mbt-bf16,torch-bf16-compile}" --python "$PY" \
        --out "$RES/bench.json"
fi
if [[ $PARTS == *,memory,* ]]; then
    part memory 240 "$PY" bench/memory.py --gpu --build "$BUILD" --batch "${MBT_GPU_MEMORY_BATCH:-64}" --steps 8 \
        --warmup 3 --out "$RES/memory.json"
fi
if [[ $PARTS == *,serve,* ]]; then
    # shellcheck disable=SC2086 # MBT_GPU_SERVE_ARGS is a list of options
    part serve 200 "$PY" bench/serve_gpu.py --build "$BUILD" --python "$PY" --json "$RES/serve.json" \
        ${MBT_GPU_SERVE_ARGS:-}
fi
if [[ $PARTS == *,test,* ]]; then
    part test 600 env MBT_PYTHON="$PY" MBT_GPU_TEST_JOBS="${MBT_GPU_TEST_JOBS:-8}" \
        MBT_GPU_TEST_LANES="${MBT_GPU_TEST_LANES:-3}" tests/gpu/run.sh "$BUILD"
fi
echo "==== summary (part, status, seconds; $(($(date +%s) - START))s in all)"
printf "%s\n" "${SUMMARY[@]}"
