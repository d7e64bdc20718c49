# shellcheck shell=bash
# tests/layers/common.sh - what the layers share: the stdlib for a compiler, timing, the sanitizer
# settings, exit statuses, relaying a sub-runner's lines (sourced by tests/run.sh; BUILD, TMP and
# report.sh's pass/fail/skip are set).

# The tests do not depend on the caller's module path. A compiler finds the stdlib beside itself
# (<bindir>/../stdlib); one built elsewhere (the sanitizer build in BUILD/asan) is pointed at the
# repository's stdlib with MBT_PATH (see stdlib_env).
unset MBT_PATH
stdlib_env() {
    if [ -d "$(dirname "$1")/../stdlib" ]; then unset MBT_PATH; else export MBT_PATH="$ROOT/stdlib"; fi
}

now_ns() { date +%s%N; }

# secs START_NS: seconds since START_NS, one decimal.
secs() { local ms=$((($(now_ns) - $1) / 1000000)); printf '%d.%d' $((ms / 1000)) $(((ms % 1000) / 100)); }

# Sanitizer settings for the asan layer: any report fails the test (a distinct exit status, so
# a sanitizer abort is never mistaken for mbtc's own exit 1), and leaks are reported
# (MBT_ASAN_LEAKS=0 turns leak detection off).
SAN_EXIT=86
san_env() {
    export ASAN_OPTIONS="detect_leaks=${MBT_ASAN_LEAKS:-1}:halt_on_error=1:abort_on_error=0:exitcode=$SAN_EXIT:allocator_may_return_null=0:detect_stack_use_after_return=0"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=$SAN_EXIT"
    export LSAN_OPTIONS="exitcode=$SAN_EXIT"
}

# Does FILE hold a sanitizer report?
san_report() { LC_ALL=C grep -aqE '^==[0-9]+==ERROR: |runtime error: |^SUMMARY: (Address|Undefined|Leak)Sanitizer' "$1"; }

# describe_status RC: why a run ended badly, or nothing when RC is an ordinary exit status.
describe_status() {
    case "$1" in
    124) echo "timed out" ;;
    2) echo "internal error (exit status 2)" ;;
    "$SAN_EXIT") echo "sanitizer report (exit status $SAN_EXIT)" ;;
    *) if [ "$1" -gt 128 ]; then echo "killed by signal $(($1 - 128))"; fi ;;
    esac
}

# relay LAYER FILE: re-emits the PASS/FAIL (and SKIP) lines of a sub-runner's output (a unit binary,
# tests/pathological.sh, tests/fuzz/run.sh) as LAYER/NAME (NAME alone when it already starts with
# LAYER/), with the indented lines that follow a FAIL (its details); counts them into the totals
# and into RELAY_P / RELAY_F.
relay() {
    local layer=$1 file=$2 line name infail=0
    RELAY_P=0
    RELAY_F=0
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
        "PASS "* | "FAIL "*)
            name=${line:5}
            case "$name" in "$layer"/*) ;; *) name="$layer/$name" ;; esac
            if [ "${line:0:4}" = PASS ]; then
                infail=0
                RELAY_P=$((RELAY_P + 1))
                pass "$name"
            else
                infail=1
                RELAY_F=$((RELAY_F + 1))
                FAILED=$((FAILED + 1))
                printf 'FAIL %s\n' "$name"
            fi
            ;;
        "SKIP "*) # a part the script could not run: `SKIP layer/part: why` (a missing package)
            infail=0
            name=${line:5}
            name=${name%%: *}
            case "$name" in "$layer"/*) ;; *) name="$layer/$name" ;; esac
            skip "$name" "${line#*: }"
            ;;
        " "* | $'\t'*)
            if [ $infail = 1 ]; then printf '%s\n' "$line"; fi
            ;;
        *) infail=0 ;;
        esac
    done < <(LC_ALL=C tr '\000' '?' <"$file")
}

# run_relayed LAYER SCRIPT: a test script of its own (its PASS/FAIL lines relayed under LAYER).
run_relayed() {
    local layer=$1 script=$2 out="$TMP/$1.out" rc
    bash "$script" "$BUILD" >"$out" 2>&1
    rc=$?
    relay "$layer" "$out"
    if [ $((RELAY_P + RELAY_F)) = 0 ] || { [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; }; then
        fail "$layer" "$script exited with status $rc" "$out"
    fi
}

# run_lanes SPEC FUNCTION: SPEC's lanes ('|' between lanes, words within one) at the same time, each
# as `FUNCTION WORD...` in the background with no stdin; returns when every lane is done. Each
# lane's function keeps its own outputs (the fuzz and gpu-emu layers relay them in order after).
run_lanes() {
    local lane lanes pids=()
    IFS='|' read -r -a lanes <<<"$1"
    for lane in "${lanes[@]}"; do
        # shellcheck disable=SC2086
        "$2" $lane </dev/null &
        pids+=($!)
    done
    wait "${pids[@]}"
}

# jfield FILE N KEY: the value of KEY in the Nth line (a JSON object) of a --log file.
jfield() { sed -n "${2}p" "$1" | sed -n 's/.*"'"$3"'": \([^,}]*\).*/\1/p'; }

# peft_check NAME ok|FAILED ARGS: tests/exec/peft_adapter.py peft ARGS (PyTorch and peft load an
# adapter written by --save-adapter), held to print "peft adapter: ok" or "peft adapter: FAILED"
# (a control) as NAME. peft is not a Debian package: `tools/deps.sh test` pip-installs it into
# the venv MBT_PEFT_VENV (build/pyenv-peft), which sees Debian's torch; that venv's python runs
# the check, else /usr/bin/python3 when it has peft, else one SKIP line.
peft_check() {
    local name=$1 want=$2 out py=${MBT_PEFT_VENV:-build/pyenv-peft}/bin/python3
    shift 2
    if ! "$py" -c 'import peft' >/dev/null 2>&1; then py=/usr/bin/python3; fi
    if ! "$py" -c 'import peft' >/dev/null 2>&1; then
        skip "$name" "peft is not installed in ${MBT_PEFT_VENV:-build/pyenv-peft} nor for /usr/bin/python3 (tools/deps.sh test installs it from PyPI)"
        return
    fi
    out=$("$py" tests/exec/peft_adapter.py peft "$@" 2>&1)
    if [[ $out == *"peft adapter: $want"* ]]; then pass "$name ($(tail -n 1 <<<"$out"))"; else fail "$name" "expected 'peft adapter: $want': $out"; fi
}
