#!/usr/bin/env bash
# tests/cudaemu/check_ce.sh BUILD - the online cross-entropy statistics kernel (docs/cuda.md) against
# a float64 reference on the emulated GPU: for each train block of tests/cudaemu/ce_shapes.mbt (f32
# logits, and bf16 logits read through the widening cast), its kernels (mbtc --emit=cuda) built by
# tests/cudaemu/build.sh, and tests/cudaemu/ce_check.cc run on the statistics kernel, whose
# parameters and sizes it reads from mbtc --emit=kernels (the `ce_stats:` line) and whose block
# count from its CUDA header, which must say `ce_stats mode`. Prints PASS/FAIL lines and
# `N passed, M failed` (tests/run.sh's gpu-emu layer relays them).
set -u
if [ $# -ne 1 ]; then
    echo "usage: tests/cudaemu/check_ce.sh BUILD" >&2
    exit 2
fi
# shellcheck source=tests/cudaemu/check_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"
check_begin ce "$1"
for block in ce_f32 ce_bf16; do
    src=tests/cudaemu/ce_shapes.mbt
    check_block "$1" "$src" "$block" || continue
    rm -f "$dir/out"
    # kernel kN_NAME (launch ..), then `  ce_stats: rows R, V v, stride s, f32; logits pA + o (dt), out pB`
    line=$(awk '/^kernel k[0-9]+_/{k=$2} /^  ce_stats: /{print k "|" $0}' "$dir/$block.kernels")
    if [ -z "$line" ] || [ "$(echo "$line" | wc -l)" -ne 1 ]; then
        fail "$block" "not one kernel with a 'ce_stats:' line in mbtc --emit=kernels"
        continue
    fi
    k=${line%%|*}
    fn=$(grep -oE "^/\* kernel [a-z]+_${k}:" "$dir/$block.cu" | sed -E 's/^\/\* kernel ([a-z_0-9]+):$/\1/')
    hdr=$(grep -A1 "^/\* kernel $fn:" "$dir/$block.cu" | tail -n 1)
    if ! grep -q 'launch: ce_stats mode' <<<"$hdr"; then
        fail "$block/$k" "not written as the online statistics: $hdr"
        continue
    fi
    blocks=$(grep -oE "block 256, [0-9]+ blocks" <<<"$hdr" | grep -oE "[0-9]+ blocks" | grep -oE "[0-9]+")
    read -r ROWS V STRIDE IN IOFF IDT OUT < <(sed -E 's/[;,()+]/ /g' <<<"${line#*|}" |
        awk '{print $3, $5, $7, substr($10, 2), $11, $12, substr($14, 2)}')
    "$dir/ce_check" "$dir/$block.so" "$fn" "$IN" "$OUT" "$ROWS" "$V" "$STRIDE" "$IOFF" "$IDT" "$blocks" >"$dir/check.out" 2>&1
    check_count "$dir/check.out"
    grep -q '^[0-9]* passed, 0 failed$' "$dir/check.out" || grep -q '^FAIL ' "$dir/check.out" ||
        fail "$block/$k" "ce_check failed: $(tail -n 3 "$dir/check.out")"
done
check_done
