# shellcheck shell=bash
# tests/layers/fuzz.sh - the fuzz layer: replay the corpora, then fuzz the front end 60 s, the
# safetensors reader 30 s, and the executable's inputs 15 s each: the token-shard reader, a
# checkpoint's state.json, the command line and --verify-step's dump reader (tests/fuzz/run.sh) (sourced by tests/run.sh; BUILD, TMP and report.sh's
# pass/fail/skip are set).

run_fuzz() {
    local out="$TMP/fuzz.out" rc target secs
    for target in frontend:60 safetensors:30 data:15 state:15 cli:15 verify_step:15; do
        secs=${target#*:}
        target=${target%:*}
        if [ ! -x "$BUILD/fuzz/fuzz_$target" ]; then
            skip "fuzz/$target" "no $BUILD/fuzz/fuzz_$target (make fuzz-build builds it)"
            continue
        fi
        bash tests/fuzz/run.sh "$BUILD" "$secs" "$target" >"$out" 2>&1
        rc=$?
        relay fuzz "$out"
        if [ $((RELAY_P + RELAY_F)) = 0 ] || { [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; }; then
            fail fuzz "tests/fuzz/run.sh ($target) exited with status $rc" "$out"
        fi
    done
}
