#!/usr/bin/env bash
# tests/cudaemu/check_ce.sh BUILD - the online cross-entropy statistics kernel and the classifier
# kernel (docs/cuda.md) against a float64 reference on the emulated GPU: for each train block of
# tests/cudaemu/ce_shapes.mbt (f32 logits; bf16 logits read through the widening cast; both with a
# padded vocabulary, rows of 3008 for 3001; f32 with the loss scaled by 0.5, the classifier's seed),
# built as it is (the classifier kernel, writing the
# gradient over the logits) and with --no-ce-fusion (the statistics alone), its kernels (mbtc
# --emit=cuda) built by tests/cudaemu/build.sh, and tests/cudaemu/ce_check.cc run on that kernel,
# whose parameters and sizes it reads from mbtc --emit=kernels (the `ce_stats:` and `ce_grad:`
# lines) and whose block count from its CUDA header, which must say `ce_stats mode`. Prints
# PASS/FAIL lines and `N passed, M failed` (tests/run.sh's gpu-emu layer relays them).
set -u
if [ $# -ne 1 ]; then
    echo "usage: tests/cudaemu/check_ce.sh BUILD" >&2
    exit 2
fi
# shellcheck source=tests/cudaemu/check_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"
check_begin ce "$1"
for block in ce_f32 ce_bf16 ce_pad_f32 ce_pad_bf16 ce_half_f32 ce_f32:--no-ce-fusion ce_pad_bf16:--no-ce-fusion; do
    src=tests/cudaemu/ce_shapes.mbt
    flag=${block#*:}
    [ "$flag" = "$block" ] && flag=
    block=${block%%:*}
    tag=$block${flag:+-unfused}
    check_block "$1" "$src" "$block" "$tag" $flag || continue
    rm -f "$dir/out"
    # kernel kN_NAME (launch ..), then
    #   `  ce_stats: rows R, V v, stride s, f32; logits pA + o (dt), targets pT + to, out pB`
    #   `  ce_grad: pG (dt, rows of W, zero past v[, over the logits]), scale D / N` (the classifier)
    line=$(awk '/^kernel k[0-9]+_/{k=$2} /^  ce_stats: /{print k "|" $0}' "$dir/$tag.kernels")
    if [ -z "$line" ] || [ "$(echo "$line" | wc -l)" -ne 1 ]; then
        fail "$tag" "not one kernel with a 'ce_stats:' line in mbtc --emit=kernels"
        continue
    fi
    k=${line%%|*}
    grad=$(awk -v k="$k" '/^kernel k[0-9]+_/{cur=$2} /^  ce_grad: / && cur == k {print}' "$dir/$tag.kernels")
    if [ -z "$flag" ] && [ -z "$grad" ]; then
        fail "$tag/$k" "the classifier kernel has no 'ce_grad:' line"
        continue
    fi
    if [ -n "$flag" ] && [ -n "$grad" ]; then
        fail "$tag/$k" "--no-ce-fusion, yet a 'ce_grad:' line"
        continue
    fi
    fn=$(grep -oE "^/\* kernel [a-z]+_${k}:" "$dir/$tag.cu" | sed -E 's/^\/\* kernel ([a-z_0-9]+):$/\1/')
    hdr=$(grep -A1 "^/\* kernel $fn:" "$dir/$tag.cu" | tail -n 1)
    if ! grep -q 'launch: ce_stats mode' <<<"$hdr"; then
        fail "$tag/$k" "not written as the online statistics: $hdr"
        continue
    fi
    blocks=$(grep -oE "block 256, [0-9]+ blocks" <<<"$hdr" | grep -oE "[0-9]+ blocks" | grep -oE "[0-9]+")
    read -r ROWS V STRIDE IN IOFF IDT TGT TOFF OUT < <(sed -E 's/[;,()+]/ /g' <<<"${line#*|}" |
        awk '{print $3, $5, $7, substr($10, 2), $11, $12, substr($14, 2), $15, substr($17, 2)}')
    args=()
    if [ -n "$grad" ]; then
        read -r G GDT GW D N < <(sed -E 's/[;,()/]/ /g' <<<"$grad" | awk '{print substr($2, 2), $3, $6, $(NF - 1), $NF}')
        args=("$G" "$GW" "$GDT" "$D" "$N")
    fi
    "$dir/ce_check" "$dir/$tag.so" "$fn" "$IN" "$TGT" "$OUT" "$ROWS" "$V" "$STRIDE" "$IOFF" "$TOFF" "$IDT" "$blocks" "${args[@]}" \
        >"$dir/check.out" 2>&1
    check_count "$dir/check.out"
    grep -q '^[0-9]* passed, 0 failed$' "$dir/check.out" || grep -q '^FAIL ' "$dir/check.out" ||
        fail "$tag/$k" "ce_check failed: $(tail -n 3 "$dir/check.out")"
done
check_done
