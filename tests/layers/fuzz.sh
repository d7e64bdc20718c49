# shellcheck shell=bash
# tests/layers/fuzz.sh - the fuzz layer: replay the corpora, then fuzz the front end 60 s, the
# safetensors reader 30 s, and the executable's inputs 15 s each: the token-shard reader, a
# checkpoint's state.json, the command line and --verify-step's dump reader (tests/fuzz/run.sh)
# (sourced by tests/run.sh; BUILD, TMP and report.sh's pass/fail/skip are set).
#
# The targets run in two lanes at once, 75 s of time boxes each (frontend and cli; safetensors,
# data, state and verify_step): libFuzzer is one process on one core, so on CI's 2 cores each
# target still gets a core of its own for its whole box, as when they ran one after another, and
# the layer takes half the time. Each target writes its findings under its own name
# (tests/fuzz/run.sh's -artifact_prefix), so a lane never reports the other's. The lines are
# relayed, lane after lane, once both lanes are done.
FUZZ_LANES='frontend:60 cli:15|safetensors:30 data:15 state:15 verify_step:15'

# fuzz_lane TARGET:SECONDS...: each target's tests/fuzz/run.sh, one after another, its output in
# $TMP/fuzz-TARGET.out and its exit status in $TMP/fuzz-TARGET.rc.
fuzz_lane() {
    local target secs
    for target in "$@"; do
        secs=${target#*:}
        target=${target%:*}
        [ -x "$BUILD/fuzz/fuzz_$target" ] || continue
        bash tests/fuzz/run.sh "$BUILD" "$secs" "$target" >"$TMP/fuzz-$target.out" 2>&1
        echo $? >"$TMP/fuzz-$target.rc"
    done
}

run_fuzz() {
    local target out rc
    run_lanes "$FUZZ_LANES" fuzz_lane
    for target in ${FUZZ_LANES//|/ }; do
        target=${target%:*}
        if [ ! -x "$BUILD/fuzz/fuzz_$target" ]; then
            skip "fuzz/$target" "no $BUILD/fuzz/fuzz_$target (make fuzz-build builds it)"
            continue
        fi
        out="$TMP/fuzz-$target.out"
        rc=$(cat "$TMP/fuzz-$target.rc" 2>/dev/null || echo "none (it did not finish)")
        relay fuzz "$out"
        if [ $((RELAY_P + RELAY_F)) = 0 ] || { [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; }; then
            fail fuzz "tests/fuzz/run.sh ($target) exited with status $rc" "$out"
        fi
    done
}
