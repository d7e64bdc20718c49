# shellcheck shell=bash
# tests/layers/check.sh - the check layer: stdlib/*.mbt, examples/*.mbt and the README's program
# check clean (sourced by tests/run.sh; BUILD, TMP and report.sh's pass/fail/skip are set).

run_check() {
    local layer=$1 mbtc=$2 f name err rc why
    if [ ! -x "$mbtc" ]; then
        fail "$layer" "$mbtc does not exist (run make)"
        return
    fi
    stdlib_env "$mbtc"
    local found=0
    # The program shown in the README is checked too, so the README cannot drift from the language.
    local readme="$TMP/README-program.mbt"
    awk '/^```/{if (inblock) exit; inblock=1; next} inblock' README.md >"$readme"
    for f in stdlib/*.mbt examples/*.mbt "$readme"; do
        [ -f "$f" ] || continue
        found=1
        name=${f%.mbt}
        [ "$f" = "$readme" ] && name=README
        err="$TMP/${layer//\//-}-${name//\//-}.err"
        { timeout 60 "$mbtc" --check "$f" >/dev/null 2>"$err"; } 2>>"$err"
        rc=$?
        why=$(describe_status "$rc")
        if [ -n "$why" ]; then
            fail "$layer/$name" "$why" "$err"
        elif san_report "$err"; then
            fail "$layer/$name" "sanitizer report" "$err"
        elif [ "$rc" != 0 ]; then
            fail "$layer/$name" "mbtc --check exited with status $rc" "$err"
        elif [ -s "$err" ]; then
            fail "$layer/$name" "mbtc --check printed on stderr" "$err"
        else
            pass "$layer/$name"
        fi
    done
    if [ $found = 0 ]; then fail "$layer" "no stdlib/*.mbt or examples/*.mbt files"; fi
}
