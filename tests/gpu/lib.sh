# shellcheck shell=bash
# tests/gpu/lib.sh - sourced by tests/gpu/run.sh and tests/gpu/selftest.sh: the PASS/FAIL/SKIP
# lines tests/run.sh prints (a failure's captured output indented below it, which tests/run.sh's
# relay() passes on), and the closing `N passed, M failed` line (`, K skipped` when K > 0).
# (tests/run.sh cannot be sourced: it runs its layers when read.)

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

# show FILE: at most 40 lines of it (its end, where the reason is), indented, control bytes made visible.
show() {
    local n
    n=$(wc -l <"$1")
    if [ "$n" -gt 40 ]; then printf '    ... (%d lines before these in %s)\n' "$((n - 40))" "$1"; fi
    LC_ALL=C tail -n 40 "$1" | LC_ALL=C cut -c1-300 | LC_ALL=C tr '\000-\010\013-\037\177' '?' | sed 's/^/    /'
}

# summary: the closing line; the status is 1 when anything failed.
summary() {
    local s="$PASSED passed, $FAILED failed"
    if [ "$SKIPPED" -gt 0 ]; then s="$s, $SKIPPED skipped"; fi
    echo "$s"
    [ "$FAILED" = 0 ]
}
