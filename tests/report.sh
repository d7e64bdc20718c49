# shellcheck shell=bash
# tests/report.sh - sourced by the test runners (tests/run.sh, tests/gpu/run.sh, tests/gpu/selftest.sh):
# the PASS/FAIL/SKIP lines (a failure's captured output indented below it, which tests/run.sh's
# relay() passes on), and the closing `N passed, M failed` line (`, K skipped` when K > 0).

PASSED=0
FAILED=0
SKIPPED=0

pass() {
    PASSED=$((PASSED + 1))
    printf 'PASS %s\n' "$1"
}

# fail NAME REASON [FILE]: the failure, and FILE (captured output) indented below it.
fail() {
    FAILED=$((FAILED + 1))
    printf 'FAIL %s: %s\n' "$1" "$2"
    if [ $# -ge 3 ] && [ -s "$3" ]; then show "$3"; fi
}

skip() {
    SKIPPED=$((SKIPPED + 1))
    printf 'SKIP %s: %s\n' "$1" "$2"
}

# show FILE: at most 60 lines of it, indented, control bytes made visible.
show() {
    local n
    n=$(wc -l <"$1")
    LC_ALL=C head -n 60 "$1" | LC_ALL=C cut -c1-300 | LC_ALL=C tr '\000-\010\013-\037\177' '?' | sed 's/^/    /'
    if [ "$n" -gt 60 ]; then printf '    ... (%d more lines in %s)\n' "$((n - 60))" "$1"; fi
}

# summary: the closing line; the status is 1 when anything failed.
summary() {
    local s="$PASSED passed, $FAILED failed"
    if [ "$SKIPPED" -gt 0 ]; then s="$s, $SKIPPED skipped"; fi
    echo "$s"
    [ "$FAILED" = 0 ]
}
