# shellcheck shell=bash
# tests/layers/unit.sh - the unit layer: every BUILD/tests/test_* binary, its PASS/FAIL lines
# relayed and its summary checked (sourced by tests/run.sh; BUILD, TMP and report.sh's
# pass/fail/skip are set).

# The binaries run two at a time (MBT_UNIT_JOBS, default 2), test_cpu (the longest by far: 13 s
# plain, 25 s under ASan, the others together 5 and 10 s) started first; they hold no check to a
# time and make their files with mkstemp/mkdtemp. Their lines are relayed in name order once all
# are done.
UNIT_FIRST=test_cpu

# unit_bin BIN OUT: BIN's output in OUT, its exit status in OUT.rc
unit_bin() {
    # (the braces catch the shell's own "Segmentation fault" line in the log)
    { timeout 300 "$1" </dev/null >"$2" 2>&1; } 2>>"$2"
    echo $? >"$2.rc"
}

run_unit() {
    local layer=$1 dir=$2 bin name out rc summary why bins=() order=() running=0 jobs=${MBT_UNIT_JOBS:-2}
    case "$jobs" in '' | *[!0-9]* | 0) jobs=1 ;; esac
    for bin in "$dir"/test_*; do
        [ -f "$bin" ] && [ -x "$bin" ] || continue
        bins+=("$bin")
        [ "$(basename "$bin")" = "$UNIT_FIRST" ] && order=("$bin" ${order[@]+"${order[@]}"})
        [ "$(basename "$bin")" = "$UNIT_FIRST" ] || order+=("$bin")
    done
    if [ ${#bins[@]} = 0 ]; then
        fail "$layer" "no unit test binaries in $dir (run make unit)"
        return
    fi
    for bin in "${order[@]}"; do
        if [ "$running" -ge "$jobs" ]; then
            wait -n
            running=$((running - 1))
        fi
        unit_bin "$bin" "$TMP/${layer//\//-}-$(basename "$bin").out" &
        running=$((running + 1))
    done
    wait
    for bin in "${bins[@]}"; do
        name=$(basename "$bin")
        out="$TMP/${layer//\//-}-$name.out"
        rc=$(cat "$out.rc" 2>/dev/null || echo 125)
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
}
