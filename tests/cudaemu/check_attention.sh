#!/usr/bin/env bash
# tests/cudaemu/check_attention.sh BUILD - the attention templates against a float64 reference on
# the emulated GPU (tests/cudaemu/attention_check.cc says what and how): the prelude and templates
# that mbtc puts before a program's kernels (those of tests/gpu/attn_shapes_bf16.mbt, whose prelude
# has all three template files), with attention_check.cc after them, built by tests/cudaemu/build.sh --exe
# and run. Prints its PASS/FAIL lines and `N passed, M failed` (tests/run.sh's gpu-emu layer
# relays them).
set -u
if [ $# -ne 1 ]; then
    echo "usage: tests/cudaemu/check_attention.sh BUILD" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
dir="$1/tmp/cudaemu"
mkdir -p "$dir"
setup_failed() {
    echo "FAIL cudaemu/attention: $1"
    sed 's/^/    /' "$dir/out" | head -n 40
    echo "0 passed, 1 failed"
    exit 1
}
"$1/mbtc" --emit=cuda tests/gpu/attn_shapes_bf16.mbt >"$dir/prog.cu" 2>"$dir/out" || setup_failed "mbtc --emit=cuda failed"
sed '/^\/\* kernel /,$d' "$dir/prog.cu" >"$dir/check.cu" # the prelude and templates: all before the first kernel
grep -q 'mbt_attn_forward_tc' "$dir/check.cu" || setup_failed "the prelude has no tensor-core template"
grep -q 'mbt_attn_fa2_forward' "$dir/check.cu" || setup_failed "the prelude has no flash-attention-2 template"
cat tests/cudaemu/attention_check.cc >>"$dir/check.cu"
tests/cudaemu/build.sh --exe "$dir/check.cu" "$dir/check" >"$dir/out" 2>&1 || setup_failed "building attention_check.cc failed"
"$dir/check"
