# shellcheck shell=bash
# tests/layers/diag.sh - the diag layer: tests/diag/*.mbt, whose # expect: lines are exactly what
# mbtc --check prints (sourced by tests/run.sh; BUILD, TMP and report.sh's pass/fail/skip are set).

run_diag() {
    local layer=$1 mbtc=$2 f name out err exp act rc want args why
    if [ ! -x "$mbtc" ]; then
        fail "$layer" "$mbtc does not exist (run make)"
        return
    fi
    stdlib_env "$mbtc"
    local found=0
    for f in tests/diag/*.mbt; do
        [ -f "$f" ] || continue
        found=1
        name=${f#tests/diag/}
        name=${name%.mbt}
        local tag="$TMP/${layer//\//-}-$name"
        out="$tag.out"
        err="$tag.err"
        exp="$tag.expected"
        act="$tag.actual"
        LC_ALL=C grep -a '^# expect: ' "$f" | LC_ALL=C sed 's/^# expect: //' >"$exp"
        want=$(LC_ALL=C grep -a -m1 '^# expect-exit: ' "$f" | LC_ALL=C sed 's/^# expect-exit: //; s/[[:space:]]*$//')
        want=${want:-1}
        args=()
        local argline
        argline=$(LC_ALL=C grep -a -m1 '^# args: ' "$f" | LC_ALL=C sed 's/^# args: //')
        if [ -n "$argline" ]; then read -r -a args <<<"$argline"; fi
        { timeout 20 "$mbtc" --check ${args[@]+"${args[@]}"} "$f" >"$out" 2>"$err"; } 2>>"$err"
        rc=$?
        # The messages about this file (path prefix stripped) and the hints, in order.
        LC_ALL=C awk -v p="$f:" 'index($0, p) == 1 { print substr($0, length(p) + 1); next }
                                /^  hint: / { print substr($0, 3) }' "$err" >"$act"
        why=$(describe_status "$rc")
        if [ -n "$why" ]; then
            fail "$layer/$name" "$why" "$err"
        elif san_report "$err"; then
            fail "$layer/$name" "sanitizer report" "$err"
        elif [ ! -s "$exp" ] && [ "$want" != 0 ]; then
            fail "$layer/$name" "the file has no '# expect: ' lines"
        elif ! cmp -s "$exp" "$act"; then
            diff -u --label expected --label actual "$exp" "$act" >"$out.diff"
            fail "$layer/$name" "messages differ" "$out.diff"
        elif [ "$rc" != "$want" ]; then
            fail "$layer/$name" "exit status $rc, expected $want" "$err"
        else
            pass "$layer/$name"
        fi
    done
    if [ $found = 0 ]; then fail "$layer" "no tests/diag/*.mbt files"; fi
}
