# shellcheck shell=bash
# tests/layers/unit.sh - the unit layer: every BUILD/tests/test_* binary, its PASS/FAIL lines
# relayed and its summary checked (sourced by tests/run.sh; BUILD, TMP and report.sh's
# pass/fail/skip are set).

run_unit() {
    local layer=$1 dir=$2 bin name out rc summary why found=0
    for bin in "$dir"/test_*; do
        [ -f "$bin" ] && [ -x "$bin" ] || continue
        found=1
        name=$(basename "$bin")
        out="$TMP/${layer//\//-}-$name.out"
        # (the braces catch the shell's own "Segmentation fault" line in the log)
        { timeout 300 "$bin" >"$out" 2>&1; } 2>>"$out"
        rc=$?
        relay "$layer/$name" "$out"
        summary=$(LC_ALL=C grep -aE '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
        why=$(describe_status "$rc")
        if [ -n "$why" ]; then
            # A crash, a hang or a sanitizer report always counts, FAIL lines or not.
            fail "$layer/$name" "$why" "$out"
        elif [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; then
            fail "$layer/$name" "exited with status $rc without a FAIL line" "$out"
        elif [ -z "$summary" ]; then
            fail "$layer/$name" "no 'N passed, M failed' line at the end (did it stop early?)" "$out"
        elif [ "$summary" != "$RELAY_P passed, $RELAY_F failed" ]; then
            fail "$layer/$name" "its summary says '$summary' but it printed $RELAY_P PASS and $RELAY_F FAIL lines" "$out"
        elif [ "$rc" = 0 ] && [ "$RELAY_F" != 0 ]; then
            fail "$layer/$name" "exited with status 0 after FAIL lines" "$out"
        elif [ "$RELAY_F" = 0 ] && san_report "$out"; then
            fail "$layer/$name" "sanitizer report" "$out"
        fi
    done
    if [ $found = 0 ]; then
        fail "$layer" "no unit test binaries in $dir (run make unit)"
    fi
}
