#!/usr/bin/env bash
# tests/gpu/check_bench_gpu.sh BUILD - `make bench-gpu`'s script (bench/gpu.py) in its dry mode on
# the CPU (--device-for-testing cpu, the tiny case), for machines without a GPU (the gpu-emu layer
# relays its PASS/FAIL lines). Times are never judged here; what is checked:
#   bench-gpu/self-test   bench/gpu.py --self-test: its doctests (the MFU arithmetic, the parsers of
#                         the timing table, of --batch and of the executable's `GPU: peak` line, the
#                         eval rewrite and the corpus size) and the --emit=cuda parser
#   bench-gpu/max         --batch max with candidates 64,8 picks 64: at micro 64 (global 256) the
#                         held-out tail was 20 global batches, more than the corpus held, and the
#                         probe refused 64 for data, not memory (the H100 run's "cannot hold out 1280
#                         windows"); the programs now hold out one global batch and the corpus counts it
#   bench-gpu/sweep       --batch 4,8: one run a micro-batch and the sweep's table, a row for each
#                         micro-batch and mode, PyTorch's eager mode among them (run, or saying why not)
#   bench-gpu/serve-dry   bench/serve_gpu.py --dry (make bench-gpu's serving part, on the CPU: the toy GPT-2
#                         and Llama, batches 1,4,16): a table row for each model and batch with a measured
#                         decode rate, and in the JSON every row's bound equal to B x the bandwidth /
#                         (weights + B x mean context x KV bytes a token), each number labelled measured or
#                         computed, the peer's rows or the line saying why it was skipped
set -u
if [ $# -ne 1 ]; then
    echo "usage: tests/gpu/check_bench_gpu.sh BUILD" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=tests/report.sh
. tests/report.sh
BUILD=$1
DIR="$BUILD/tmp/bench-gpu"
rm -rf "$DIR"
mkdir -p "$DIR" || exit 2
PY=/usr/bin/python3
COMMON=(--build "$BUILD" --device-for-testing cpu --case tiny --steps 2 --warmup 1 --rounds 1 --no-copy --no-check)

if "$PY" bench/gpu.py --build "$BUILD" --self-test >"$DIR/self.out" 2>&1; then
    pass "bench-gpu/self-test ($(sed -n 's/^doctests: //p' "$DIR/self.out"))"
else
    fail bench-gpu/self-test "bench/gpu.py --self-test failed" "$DIR/self.out"
fi

if ! "$PY" bench/gpu.py "${COMMON[@]}" --modes mbt --batch max --batch-candidates 64,8 --out "$DIR/max.json" \
    >"$DIR/max.out" 2>&1; then
    fail bench-gpu/max "bench/gpu.py --batch max failed" "$DIR/max.out"
elif ! grep -q "^  --batch max: micro-batch 64 x 64 trains a step" "$DIR/max.out"; then
    fail bench-gpu/max "--batch max did not pick the largest candidate, 64" "$DIR/max.out"
elif ! grep -q "^mbt --device cpu " "$DIR/max.out"; then
    fail bench-gpu/max "no mbt row in the table" "$DIR/max.out"
else
    pass "bench-gpu/max (micro-batch 64 of 64,8: not refused for held-out data)"
fi

if ! "$PY" bench/gpu.py "${COMMON[@]}" --modes mbt,torch-f32 --batch 4,8 --out "$DIR/sweep.json" >"$DIR/sweep.out" 2>&1; then
    fail bench-gpu/sweep "bench/gpu.py --batch 4,8 failed" "$DIR/sweep.out"
elif ! [ -s "$DIR/sweep-b4.json" ] || ! [ -s "$DIR/sweep-b8.json" ]; then
    fail bench-gpu/sweep "no JSON file for each micro-batch (sweep-b4.json, sweep-b8.json)" "$DIR/sweep.out"
else
    table=$(sed -n '/the sweep over micro-batches 4,8/,$p' "$DIR/sweep.out")
    rows=$(grep -cE '^ +(4|8) (mbt --device cpu|torch eager) ' <<<"$table")
    if [ "$rows" != 4 ]; then
        fail bench-gpu/sweep "the sweep's table has $rows of the 4 rows (micro-batches 4 and 8, mbt and torch eager)" "$DIR/sweep.out"
    else
        pass "bench-gpu/sweep (micro-batches 4 and 8, mbt and torch eager: 4 rows)"
    fi
fi

# the dry run's JSON, judged by tests/gpu/serve_gpu_json.py (bounds recomputed, labels)
if ! "$PY" bench/serve_gpu.py --build "$BUILD" --dry --json "$DIR/serve.json" >"$DIR/serve.out" 2>&1; then
    fail bench-gpu/serve-dry "bench/serve_gpu.py --dry failed" "$DIR/serve.out"
elif [ "$(grep -cE '^ +(1|4|16) +[0-9]+\.[0-9] +[0-9]+\.[0-9] +[0-9.]+% ' "$DIR/serve.out")" != 6 ]; then
    fail bench-gpu/serve-dry "the tables have not 6 rows (gpt2 and llama, batches 1, 4 and 16) with a decode rate" \
        "$DIR/serve.out"
elif ! why=$("$PY" tests/gpu/serve_gpu_json.py "$DIR/serve.json" 2>&1); then
    fail bench-gpu/serve-dry "the JSON's rows do not hold: $(tail -n 1 <<<"$why")" "$DIR/serve.out"
else
    pass "bench-gpu/serve-dry (gpt2 and llama at batches 1, 4, 16: a decode rate each, bounds recomputed)"
fi
summary
