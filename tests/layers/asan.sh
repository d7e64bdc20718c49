# shellcheck shell=bash
# tests/layers/asan.sh - the asan layer: unit, diag, check, golden and pathological again with
# BUILD/asan's binaries, then executables built by BUILD/asan/mbtc (instrumented, as is the
# libmbtrt they link) trained under ASan + UBSan: the cases of tests/asan/ and the accum layer's
# (sourced by tests/run.sh; BUILD, TMP and report.sh's pass/fail/skip are set).

# The time limits are ten times the plain layers' (the sanitizers slow the compiler down).
layer_asan() {
    san_env
    run_unit asan/unit "$BUILD/asan/tests"
    run_diag asan/diag "$BUILD/asan/mbtc"
    run_check asan/check "$BUILD/asan/mbtc"
    run_golden asan/golden "$BUILD/asan/mbtc" 10000
    run_pathological asan/pathological "$BUILD/asan/mbtc" 10000 20 2 # 2 MB of loops: tests/pathological.sh
    run_asan_exec
    unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
}

# run_asan_exec: the executables' tests under the sanitizers (docs/testing.md says which and why):
# tests/asan/*.case (mlp and tiny trained a few steps and rerun identical, eval, generate),
# tests/accum/accum_4x4.mbt, the exec layer's gen_gpt.mbt and outputs.case, each `mbtc` of theirs
# BUILD/asan/mbtc, and tests/ckpt/run.sh and tests/serve/run.sh with BUILD/asan/mbtc. A sanitizer report fails the step or
# test it comes from (exit status SAN_EXIT, or the report in its output).
run_asan_exec() {
    local f
    stdlib_env "$BUILD/asan/mbtc"
    # shellcheck disable=SC2034 # (read by case_exec, tests/layers/cases.sh)
    CASE_MBTC=$BUILD/asan/mbtc
    for f in tests/asan/*.case; do run_case asan "$f"; done
    run_case asan/accum tests/accum/accum_4x4.mbt
    run_case asan/exec tests/exec/gen_gpt.mbt
    run_case asan/exec tests/exec/outputs.case
    unset CASE_MBTC
    # the ckpt layer's script whole: kill -9 and SIGTERM resumes, full disks, damaged checkpoints
    # (each step's exit status is checked: a sanitizer's, SAN_EXIT, is never the one expected)
    MBT_CKPT_MBTC=$BUILD/asan/mbtc run_relayed asan tests/ckpt/run.sh
    # the serve layer's script whole: its servers' exits are checked (exit 0, a clean stderr)
    MBT_SERVE_MBTC=$BUILD/asan/mbtc run_relayed asan tests/serve/run.sh
}
