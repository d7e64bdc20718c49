#!/usr/bin/env bash
# tests/cudaemu/check_kv.sh BUILD - the paged KV cache's attention template
# (runtime/kernels/rt_kv_attention.cuh) against a float64 reference on the emulated GPU
# (tests/cudaemu/kv_check.cc says what and how): the prelude and templates that mbtc puts before
# tests/cudaemu/kv_shapes.mbt's kernels (a bf16 pool: the half types are in), with kv_check.cc after
# them, built by tests/cudaemu/build.sh --exe and run. Prints its PASS/FAIL lines and
# `N passed, M failed` (tests/run.sh's gpu-emu layer relays them).
set -u
if [ $# -ne 1 ]; then
    echo "usage: tests/cudaemu/check_kv.sh BUILD" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
dir="$1/tmp/cudaemu-kv"
mkdir -p "$dir"
setup_failed() {
    echo "FAIL cudaemu/kv: $1"
    sed 's/^/    /' "$dir/out" | head -n 40
    echo "0 passed, 1 failed"
    exit 1
}
"$1/mbtc" --emit=cuda tests/cudaemu/kv_shapes.mbt >"$dir/prog.cu" 2>"$dir/out" || setup_failed "mbtc --emit=cuda failed"
sed '/^\/\* kernel /,$d' "$dir/prog.cu" >"$dir/check.cu" # the prelude and templates: all before the first kernel
grep -q 'mbt_kv_attn' "$dir/check.cu" || setup_failed "the prelude has no paged KV attention template"
grep -q 'kernel chunk_k[0-9]*_kv_attention: .*' "$dir/prog.cu" || setup_failed "the program has no chunk-phase kv_attention kernel"
cat tests/cudaemu/kv_check.cc >>"$dir/check.cu"
tests/cudaemu/build.sh --exe "$dir/check.cu" "$dir/check" >"$dir/out" 2>&1 || setup_failed "building kv_check.cc failed"
"$dir/check"
