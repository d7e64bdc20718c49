#!/usr/bin/env bash
# tests/cudaemu/check_scatter.sh BUILD - the segmented scatter_add (the embedding backward of the
# CUDA back end, docs/cuda.md) bit for bit against its definition on the emulated GPU: for each train
# block of tests/cudaemu/scatter_shapes.mbt (f32 rows, and bf16 rows widened to f32), its kernels
# (mbtc --emit=cuda) built by tests/cudaemu/build.sh, and tests/cudaemu/scatter_check.cc run on each
# scatter kernel, whose parameters and sizes it reads from mbtc --emit=kernels (the `scatter_add:`
# line) and whose block count from the kernel's CUDA header. Every scatter kernel of the program
# must be in the segmented form (`launch: scatter mode`). Prints PASS/FAIL lines and
# `N passed, M failed` (tests/run.sh's gpu-emu layer relays them).
set -u
if [ $# -ne 1 ]; then
    echo "usage: tests/cudaemu/check_scatter.sh BUILD" >&2
    exit 2
fi
# shellcheck source=tests/cudaemu/check_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"
check_begin scatter "$1"
for block in scatter_f32 scatter_bf16; do
    src=tests/cudaemu/scatter_shapes.mbt
    check_block "$1" "$src" "$block" || continue
    # kernel NAME (launch N) ... then its `scatter_add: R r, W w, P p, dt; out pA, idx pB + o (i32), upd pC + o (dt)`
    kernels=$(awk '/^kernel k[0-9]+_scatter_add /{k=$2} /^  scatter_add: /{print k "|" $0}' "$dir/$block.kernels")
    total=$(grep -c '^kernel k[0-9]*_scatter_add ' "$dir/$block.kernels")
    if [ -z "$kernels" ] || [ "$(echo "$kernels" | wc -l)" -ne "$total" ]; then
        rm -f "$dir/out"
        fail "$block" "of $total scatter_add kernels, not all have resolved operands (mbtc --emit=kernels: no 'scatter_add:' line)"
        continue
    fi
    while IFS='|' read -r k line; do
        # the kernel's CUDA header: its launch line, and the function it runs (its own, or the same
        # code under another kernel's name)
        fn=$(grep -oE "^/\* kernel [a-z]+_${k}:" "$dir/$block.cu" | sed -E 's/^\/\* kernel ([a-z_0-9]+):$/\1/')
        hdr=$(grep -A1 "^/\* kernel $fn:" "$dir/$block.cu" | tail -n 1)
        same=$(sed -n "/^\/\* kernel $fn:/,/^ \*\//p" "$dir/$block.cu" | sed -n 's/.*launched as \([a-z_0-9]*\)$/\1/p')
        [ -n "$same" ] && fn=$same
        if ! grep -q 'launch: scatter mode' <<<"$hdr"; then
            rm -f "$dir/out"
            fail "$block/$k" "not written in the segmented form: $hdr"
            continue
        fi
        blocks=$(grep -oE "block 256, [0-9]+ blocks" <<<"$hdr" | grep -oE "[0-9]+ blocks" | grep -oE "[0-9]+")
        # R W P DT OUT IDX IDX_OFF UPD UPD_OFF UPD_DT, from the numbers and types of the line
        read -r R W P DT OUT IDX IOFF UPD UOFF UDT < <(sed -E 's/[;,()+]/ /g' <<<"$line" |
            awk '{print $3, $5, $7, $8, substr($10, 2), substr($12, 2), $13, substr($16, 2), $17, $18}')
        "$dir/scatter_check" "$dir/$block.so" "$fn" 3 "$OUT" "$IDX" "$UPD" "$R" "$W" "$P" "$DT" "$UDT" "$IOFF" "$UOFF" \
            "$blocks" >"$dir/check.out" 2>&1
        check_count "$dir/check.out"
        if ! grep -q '^[0-9]* passed, 0 failed$' "$dir/check.out"; then
            rm -f "$dir/out"
            grep -q '^FAIL ' "$dir/check.out" || fail "$block/$k" "scatter_check failed: $(tail -n 3 "$dir/check.out")"
        fi
    done <<<"$kernels"
done
check_done
