# shellcheck shell=bash
# tests/layers/pathological.sh - the pathological layer: tests/pathological.sh's hostile inputs,
# relayed (sourced by tests/run.sh; BUILD, TMP and report.sh's pass/fail/skip are set).

run_pathological() {
    local layer=$1 mbtc=$2 limit_ms=$3 timeout_s=$4 loops_mb=${5:-16} out rc
    if [ ! -x "$mbtc" ]; then
        fail "$layer" "$mbtc does not exist (run make)"
        return
    fi
    stdlib_env "$mbtc"
    out="$TMP/${layer//\//-}.out"
    bash tests/pathological.sh "$mbtc" "$BUILD/tmp/pathological" "$limit_ms" "$timeout_s" "$loops_mb" >"$out" 2>&1
    rc=$?
    relay "$layer" "$out"
    if [ $((RELAY_P + RELAY_F)) = 0 ] || { [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; }; then
        fail "$layer" "tests/pathological.sh exited with status $rc" "$out"
    fi
}
