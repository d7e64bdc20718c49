# shellcheck shell=bash
# tests/layers/golden.sh - the golden layer: tests/golden/NAME.mbt at each stage it has a file for,
# and every example's train blocks verify at ir, plan and kernels (sourced by tests/run.sh; BUILD,
# TMP and report.sh's pass/fail/skip are set).

# golden_stages NAME: the stages tests/golden/NAME.mbt is compared at - each STAGE (--emit=list's names, and list)
# with an expected NAME.STAGE (stdout) or NAME.STAGE.err (stderr, exit 1); NAME.err is the old
# spelling of NAME.ir.err. Prints them, space-separated.
golden_stages() {
    local st out=""
    for st in tokens ast ir grad update schedule plan fused kernels cuda list; do
        if [ -f "tests/golden/$1.$st" ] || [ -f "tests/golden/$1.$st.err" ] || { [ "$st" = ir ] && [ -f "tests/golden/$1.err" ]; }; then
            out="$out $st"
        fi
    done
    echo "$out"
}

# run_golden LAYER MBTC LIMIT_MS: the golden stages, then every example's train blocks.
run_golden() {
    local layer=$1 mbtc=$2 limit_ms=$3 f name out err exp_out exp_err rc why want args argline stage stages tname
    if [ ! -x "$mbtc" ]; then
        fail "$layer" "$mbtc does not exist (run make)"
        return
    fi
    stdlib_env "$mbtc"
    local found=0
    for f in tests/golden/*.mbt; do
        [ -f "$f" ] || continue
        found=1
        name=${f#tests/golden/}
        name=${name%.mbt}
        stages=$(golden_stages "$name")
        if [ -z "$stages" ]; then
            if [ "$UPDATE_GOLDEN" = 1 ]; then
                stages=ir # a new case: its graph
            else
                fail "$layer/$name" "no tests/golden/$name.ir, .grad, .plan or .err (tests/run.sh --update-golden $BUILD writes $name.ir)"
                continue
            fi
        fi
        args=()
        argline=$(LC_ALL=C grep -a -m1 '^# args: ' "$f" | LC_ALL=C sed 's/^# args: //')
        if [ -n "$argline" ]; then read -r -a args <<<"$argline"; fi
        for stage in $stages; do
            # the ir stage keeps the case's plain name (golden/mlp); the others are golden/mlp.plan
            tname=$name
            [ "$stage" = ir ] || tname="$name.$stage"
            out="$TMP/${layer//\//-}-$tname.out"
            err="$TMP/${layer//\//-}-$tname.err"
            exp_out="tests/golden/$name.$stage"
            exp_err="tests/golden/$name.$stage.err"
            if [ "$stage" = ir ] && [ ! -f "$exp_err" ]; then exp_err="tests/golden/$name.err"; fi
            { timeout 20 "$mbtc" --emit="$stage" ${args[@]+"${args[@]}"} "$f" >"$out" 2>"$err"; } 2>>"$err"
            rc=$?
            why=$(describe_status "$rc")
            if [ "$UPDATE_GOLDEN" = 1 ]; then
                if [ -n "$why" ]; then
                    fail "$layer/$tname" "$why (nothing written)" "$err"
                elif [ "$rc" = 0 ]; then
                    cp "$out" "$exp_out" && rm -f "$exp_err" && pass "$layer/$tname (wrote $exp_out)"
                else
                    cp "$err" "$exp_err" && rm -f "$exp_out" && pass "$layer/$tname (wrote $exp_err)"
                fi
                continue
            fi
            want=0
            [ -f "$exp_err" ] && want=1
            if [ -n "$why" ]; then
                fail "$layer/$tname" "$why" "$err"
            elif san_report "$err"; then
                fail "$layer/$tname" "sanitizer report" "$err"
            elif [ "$rc" != "$want" ]; then
                fail "$layer/$tname" "exit status $rc, expected $want" "$err"
            elif [ "$want" = 0 ] && [ -s "$err" ]; then
                fail "$layer/$tname" "mbtc printed on stderr" "$err"
            elif [ "$want" = 0 ] && ! cmp -s "$exp_out" "$out"; then
                diff -u --label "$exp_out" --label actual "$exp_out" "$out" >"$out.diff"
                fail "$layer/$tname" "the $stage output differs (tests/run.sh --update-golden $BUILD rewrites it)" "$out.diff"
            elif [ "$want" = 1 ] && ! cmp -s "$exp_err" "$err"; then
                diff -u --label "$exp_err" --label actual "$exp_err" "$err" >"$out.diff"
                fail "$layer/$tname" "the messages differ (tests/run.sh --update-golden $BUILD rewrites them)" "$out.diff"
            else
                pass "$layer/$tname"
            fi
        done
    done
    if [ $found = 0 ]; then fail "$layer" "no tests/golden/*.mbt files"; fi
    [ "$UPDATE_GOLDEN" = 1 ] && return
    # Every train block of every example: its graph (--emit=ir), plan and kernels build and verify
    # (mbtc checks each before printing; a failure is exit 2), each output starts with its header,
    # and each takes at most limit_ms. Tests: golden/example/NAME, example-plan/, example-kernels/.
    local t start ms stage head test
    for f in examples/*.mbt; do
        [ -f "$f" ] || continue
        for t in $(LC_ALL=C sed -n 's/^train[[:space:]]\{1,\}\([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' "$f"); do
            name="$(basename "$f" .mbt)-$t"
            for stage in ir plan kernels; do
                case $stage in
                ir) head=graph test="$layer/example/$name" ;;
                *) head=$stage test="$layer/example-$stage/$name" ;;
                esac
                out="$TMP/${layer//\//-}-example-$stage-$name.out"
                err="$TMP/${layer//\//-}-example-$stage-$name.err"
                start=$(now_ns)
                { timeout 20 "$mbtc" --emit=$stage --train "$t" "$f" >"$out" 2>"$err"; } 2>>"$err"
                rc=$?
                ms=$((($(now_ns) - start) / 1000000))
                why=$(describe_status "$rc")
                if [ -n "$why" ]; then
                    fail "$test" "$why" "$err"
                elif san_report "$err"; then
                    fail "$test" "sanitizer report" "$err"
                elif [ "$rc" != 0 ] || [ -s "$err" ]; then
                    fail "$test" "mbtc --emit=$stage exited with status $rc" "$err"
                elif ! LC_ALL=C grep -q "^# $head train $t: " < <(head -n 1 "$out"); then
                    fail "$test" "no '# $head train $t: ...' header" "$out"
                elif [ "$ms" -gt "$limit_ms" ]; then
                    fail "$test" "took $ms ms (limit $limit_ms ms)"
                else
                    pass "$test"
                fi
            done
        done
    done
}
