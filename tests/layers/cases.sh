# shellcheck shell=bash
# tests/layers/cases.sh - the case files of the exec, verify, accum and torch layers: one case a
# file in tests/LAYER/, its header lines run in order (sourced by tests/run.sh; the vocabulary is
# in tests/README.md, "A case file"):
#   # data: ARGS              mbt-gendata ARGS into the case's folder: $DATA, $VAL
#   # run: COMMAND            a step that must exit 0, or the case fails and stops there
#   # test [NAME]: COMMAND    a check, PASS or FAIL LAYER/NAME (the case's name without NAME),
#                             held to the expect lines that follow it:
#   # expect-exit: N          its exit status (0 when not given)
#   # expect: REGEX           some line of its output (stdout and stderr) matches (grep -E)
#   # expect-line: TEXT       some line is exactly TEXT
#   # expect-output: TEXT     the whole output is TEXT (nothing at all when TEXT is empty)
#   # expect-count: N REGEX   exactly N lines match
#   # tests: HELPER ARGS      a helper of tests/layers/*.sh that prints its own PASS/FAIL lines
# COMMAND is words split at blanks ('' is an empty word, `> FILE` at the end sends stdout to FILE):
# mbtc (CASE_MBTC when set: the asan layer's BUILD/asan/mbtc), mbt-gendata, st_compare and python name BUILD's programs and /usr/bin/python3; a helper
# function of tests/layers/*.sh; or any program. $W (the case's folder under BUILD/tmp), $CASE
# (the case file), $DATA, $VAL and $CUDA_ARCHS are replaced in commands and expectations.

# How many cases of a layer run at once (MBT_CASE_JOBS overrides it for every layer), and the
# cases started first (the longest, so that the two lanes end together). The exec and verify
# layers' time is mostly mbtc -o (LLVM's optimiser and code generation, one thread) and
# --verify-step (the float64 reference, one thread): on CI's 2 cores two cases at a time take about
# half the time (exec: 265 s for 432 s, measured on a loaded machine), and their checks are the
# same: each case has its own folder ($W) and data, a data-parallel case its own random port, and
# no check of theirs measures time. The torch layer's PyTorch uses every core itself; the other
# layers have a case or two.
CASE_JOBS=' exec:2 verify:2 '
CASES_FIRST=' exec/examples exec/tiny exec/dp verify/moe verify/tiny_bf16 '

# run_cases LAYER: every case of tests/LAYER/: each .case file, and each .mbt file with a `# test` or
# `# tests` line (the other .mbt files there are programs the cases use), reported in name order.
run_cases() {
    local layer=$1 f found=0 files=() jobs
    stdlib_env "$BUILD/mbtc"
    for f in "tests/$layer"/*.mbt "tests/$layer"/*.case; do
        [ -f "$f" ] || continue
        if [ "${f##*.}" = case ] || LC_ALL=C grep -aqE '^# tests?( [^:]*)?: ' "$f"; then
            found=1
            files+=("$f")
        fi
    done
    [ $found = 1 ] || { fail "$layer" "no case files in tests/$layer"; return; }
    jobs=${MBT_CASE_JOBS:-1}
    if [ -z "${MBT_CASE_JOBS:-}" ] && [[ $CASE_JOBS == *" $layer:"* ]]; then
        jobs=${CASE_JOBS#* "$layer":}
        jobs=${jobs%% *}
    fi
    case "$jobs" in '' | *[!0-9]*) jobs=1 ;; esac
    if [ "$jobs" -le 1 ]; then
        for f in "${files[@]}"; do run_case "$layer" "$f"; done
    else
        run_cases_jobs "$layer" "$jobs" "${files[@]}"
    fi
}

# case_out LAYER FILE: where run_cases_jobs keeps a case's lines.
case_out() { local n=${2##*/}; printf '%s' "$TMP/cases-$1/${n%.*}.out"; }

# run_cases_jobs LAYER JOBS FILE...: the cases, JOBS at a time (CASES_FIRST first, then name
# order), each in a subshell whose lines go to a file of its own; then each file printed in name
# order as it was written, its PASS, FAIL and SKIP lines counted as if run here.
run_cases_jobs() {
    local layer=$1 jobs=$2 f n running=0 order=() out
    shift 2
    mkdir -p "$TMP/cases-$layer" || return
    for f in "$@"; do
        n=${f##*/}
        [[ $CASES_FIRST == *" $layer/${n%.*} "* ]] && order+=("$f")
    done
    for f in "$@"; do
        n=${f##*/}
        [[ $CASES_FIRST == *" $layer/${n%.*} "* ]] || order+=("$f")
    done
    for f in "${order[@]}"; do
        if [ "$running" -ge "$jobs" ]; then
            wait -n
            running=$((running - 1))
        fi
        (run_case "$layer" "$f") </dev/null >"$(case_out "$layer" "$f")" 2>&1 &
        running=$((running + 1))
    done
    wait
    for f in "$@"; do
        out=$(case_out "$layer" "$f")
        if [ ! -s "$out" ]; then
            fail "$layer/$(basename "${f%.*}")" "the case printed nothing (it did not run?)"
            continue
        fi
        cat "$out"
        PASSED=$((PASSED + $(grep -c '^PASS ' "$out")))
        FAILED=$((FAILED + $(grep -c '^FAIL ' "$out")))
        SKIPPED=$((SKIPPED + $(grep -c '^SKIP ' "$out")))
    done
}

# case_subst TEXT: TEXT with the case's variables replaced (run_case's locals).
case_subst() {
    local s=$1
    s=${s//\$CUDA_ARCHS/$CUDA_ARCHS}
    s=${s//\$DATA/$DATA}
    s=${s//\$VAL/$VAL}
    s=${s//\$CASE/$CASE}
    printf '%s' "${s//\$W/$W}"
}

# case_exec OUT COMMAND: runs COMMAND (see the top), its output into OUT; its status in CASE_RC.
case_exec() {
    local out=$1 words=() i n stdout=""
    read -r -a words <<<"$(case_subst "$2")"
    for i in "${!words[@]}"; do [ "${words[i]}" = "''" ] && words[i]=""; done
    n=${#words[@]}
    if [ "$n" -ge 3 ] && [ "${words[n - 2]}" = ">" ]; then
        stdout=${words[n - 1]}
        unset 'words[n-1]' 'words[n-2]'
    fi
    case "${words[0]}" in
    mbtc) words[0]=${CASE_MBTC:-$BUILD/mbtc} ;;
    mbt-gendata) words[0]=$BUILD/mbt-gendata ;;
    st_compare) words[0]=$BUILD/tests/st_compare ;;
    python) words[0]=/usr/bin/python3 ;;
    esac
    # (a helper runs in this shell, without the time limit, and may count PASS/FAIL lines; the
    # braces catch the shell's own "Segmentation fault" line in the log)
    local run=(timeout 900)
    if declare -F "${words[0]}" >/dev/null; then run=(); fi
    if [ -n "$stdout" ]; then
        { ${run[@]+"${run[@]}"} "${words[@]}" </dev/null >"$stdout" 2>"$out"; } 2>>"$out"
    else
        { ${run[@]+"${run[@]}"} "${words[@]}" </dev/null >"$out" 2>&1; } 2>>"$out"
    fi
    CASE_RC=$?
}

# case_test TEST COMMAND EXPECT...: runs COMMAND and holds it to the EXPECT lines (`key: value`).
# A PASS line shows the first line the first `# expect:` matched, or a helper's last line.
case_test() {
    local test=$1 cmdline=$2 out="$W/${1##*/}.out" want=0 e key val detail="" c why
    shift 2
    : >"$out"
    for e in "$@"; do [[ $e == expect-exit:* ]] && want=$(case_subst "${e#expect-exit: }"); done
    case_exec "$out" "$cmdline"
    if [ "$CASE_RC" != "$want" ]; then
        why=$(describe_status "$CASE_RC")
        fail "$test" "${why:-exit status $CASE_RC}, expected $want: $(case_subst "$cmdline")" "$out"
        return
    fi
    if san_report "$out"; then fail "$test" "sanitizer report" "$out"; return; fi
    for e in "$@"; do
        key=${e%%:*}
        val=$(case_subst "${e#*:}")
        val=${val# }
        case "$key" in
        expect-exit) why="" ;;
        expect) LC_ALL=C grep -aqE -- "$val" "$out" && why="" || why="no line matches: $val" ;;
        expect-line) LC_ALL=C grep -aqxF -- "$val" "$out" && why="" || why="no line is exactly: $val" ;;
        expect-output) [ "$(cat "$out")" = "$val" ] && why="" || why="the output is not exactly: $val" ;;
        expect-count)
            c=$(LC_ALL=C grep -acE -- "${val#* }" "$out")
            [ "$c" = "${val%% *}" ] && why="" || why="$c lines match ${val#* }, expected ${val%% *}"
            ;;
        *) why="unknown expectation '# $key:'" ;;
        esac
        if [ -n "$why" ]; then fail "$test" "$why" "$out"; return; fi
        if [ "$key" = expect ] && [ -z "$detail" ]; then
            detail=$(LC_ALL=C grep -aE -m1 -- "$val" "$out" | cut -c1-160)
        fi
    done
    if [ -z "$detail" ] && declare -F "${cmdline%% *}" >/dev/null; then detail=$(tail -n 1 "$out"); fi
    pass "$test${detail:+ ($detail)}"
}

# run_case LAYER FILE: the case's header lines, in order (see the top of this file).
run_case() {
    local layer=$1 CASE=$2 name W DATA="" VAL="" start lines=() i=0 n line key val test expects
    name=$(basename "$CASE")
    name=${name%.*}
    W="$BUILD/tmp/$layer/$name"
    rm -rf "$W"
    mkdir -p "$W" || return
    start=$(now_ns)
    mapfile -t lines < <(LC_ALL=C grep -aE '^# (data|run|tests?|test [^ :]+|expect(-[a-z]+)?):( |$)' "$CASE")
    n=${#lines[@]}
    # (grep reads a process substitution, not a pipe: under pipefail grep -q's early exit could
    # kill printf with SIGPIPE and fail a case that has tests - seen on the fresh clone's CI)
    if ! grep -qE '^# tests?( [^ :]+)?:' < <(printf '%s\n' "${lines[@]}"); then
        fail "$layer/$name" "$CASE has no '# test' or '# tests' line"
        return
    fi
    while [ $i -lt "$n" ]; do
        line=${lines[i]#\# }
        i=$((i + 1))
        key=${line%%:*}
        val=${line#*:}
        val=${val# }
        case "$key" in
        data)
            DATA="$W/d/t_train.bin" VAL="$W/d/t_val.bin"
            case_exec "$W/data.txt" "mbt-gendata --out-dir $W/d --name t $val"
            [ "$CASE_RC" = 0 ] || { fail "$layer/$name" "mbt-gendata $val failed" "$W/data.txt"; return; }
            ;;
        run)
            case_exec "$W/run.out" "$val"
            if [ "$CASE_RC" != 0 ]; then
                fail "$layer/$name" "exit status $CASE_RC: $(case_subst "$val")" "$W/run.out"
                return
            fi
            ;;
        tests)
            if declare -F "${val%% *}" >/dev/null; then
                case_exec "$W/tests.out" "$val"
                cat "$W/tests.out"
            else fail "$layer/$name" "'# tests:' names no helper: $val"; fi
            ;;
        test*)
            test="$layer/$name"
            [ "$key" = test ] || test="$layer/${key#test }"
            expects=()
            while [ $i -lt "$n" ] && [[ ${lines[i]} == "# expect"* ]]; do
                expects+=("${lines[i]#\# }")
                i=$((i + 1))
            done
            case_test "$test" "$val" ${expects[@]+"${expects[@]}"}
            ;;
        *) fail "$layer/$name" "'# $key:' follows no '# test' line" ;;
        esac
    done
    printf '# case %s/%s: %s s\n' "$layer" "$name" "$(secs "$start")"
}
