# shellcheck shell=bash
# tests/layers/asan.sh - the asan layer: unit, diag, check, golden and pathological again with
# BUILD/asan's binaries (sourced by tests/run.sh; BUILD, TMP and report.sh's pass/fail/skip are
# set).

# The time limits are ten times the plain layers' (the sanitizers slow the compiler down).
layer_asan() {
    san_env
    run_unit asan/unit "$BUILD/asan/tests"
    run_diag asan/diag "$BUILD/asan/mbtc"
    run_check asan/check "$BUILD/asan/mbtc"
    run_golden asan/golden "$BUILD/asan/mbtc" 10000
    run_pathological asan/pathological "$BUILD/asan/mbtc" 10000 20
    unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
}
