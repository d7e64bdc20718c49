#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD SECONDS [TARGET] - runs a fuzzer (BUILD/fuzz/fuzz_TARGET, built by
# `make fuzz-build`) from the repository root. TARGET is `frontend` (the default: the front end and
# checker), `safetensors` (the runtime's safetensors reader), or one of the executable's inputs:
# `data` (the token-shard reader), `state` (a checkpoint's state.json), `cli` (the command line)
# and `verify_step` (mbtc --verify-step's step-dump reader). Two steps:
#   1. replay: every file of the corpus once (frontend: tests/fuzz/corpus, examples, stdlib,
#      tests/diag, tests/golden; safetensors: tests/fuzz/corpus_st; the others:
#      tests/fuzz/corpus_TARGET);
#   2. fuzz for SECONDS (0 = until stopped with Ctrl-C) on a temporary copy of that corpus, so the
#      stored corpus is never changed by a run.
# Prints `PASS fuzz/<step>` or `FAIL fuzz/<step>: ...` for each step (step names are prefixed
# `st-` for the safetensors target, `TARGET-` for the others) (what tests/run.sh counts),
# with the path of the input that crashed or hung (kept in BUILD/fuzz/artifacts/) and the end of
# libFuzzer's log. Exit status 1 when a step failed.
#
# Replay a finding with the compiler's own messages shown:
#     MBT_FUZZ_VERBOSE=1 BUILD/fuzz/fuzz_frontend BUILD/fuzz/artifacts/crash-...
set -u

if [ $# -lt 2 ]; then
    echo "usage: tests/fuzz/run.sh BUILD SECONDS [frontend|safetensors|data|state|cli|verify_step]" >&2
    exit 2
fi
TARGET=${3:-frontend}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if ! BUILD=$(cd "$1" 2>/dev/null && pwd); then
    echo "FAIL fuzz/setup: build directory '$1' does not exist"
    exit 1
fi
SECONDS_TO_RUN=$2
case "$SECONDS_TO_RUN" in '' | *[!0-9]*) echo "tests/fuzz/run.sh: SECONDS must be a number" >&2; exit 2 ;; esac
cd "$ROOT" || exit 2

case "$TARGET" in
frontend) P="" MAX_LEN=4096 ;;
safetensors) P="st-" MAX_LEN=2048 ;;
data | verify_step) P="$TARGET-" MAX_LEN=2048 ;;
state) P="state-" MAX_LEN=4096 ;;
cli) P="cli-" MAX_LEN=512 ;;
*) echo "tests/fuzz/run.sh: TARGET must be frontend, safetensors, data, state, cli or verify_step, not '$TARGET'" >&2; exit 2 ;;
esac
FUZZER="$BUILD/fuzz/fuzz_$TARGET"
if [ ! -x "$FUZZER" ]; then
    echo "FAIL fuzz/${P}setup: $FUZZER does not exist (run make fuzz-build)"
    exit 1
fi
ART="$BUILD/fuzz/artifacts"
mkdir -p "$ART" "$BUILD/tmp" || exit 2
# The targets that write files (data: the shard; state: a checkpoint) make them under TMPDIR: a
# directory of this run's, removed at the end even when a finding killed the fuzzer.
SCRATCH=$(mktemp -d "$BUILD/tmp/fuzz-scratch.XXXXXX") || exit 2
export TMPDIR="$SCRATCH"
trap 'rm -rf "$SCRATCH"' EXIT
CORPUS_DIRS=()
case "$TARGET" in
frontend) SOURCES=(tests/fuzz/corpus examples stdlib tests/diag tests/golden) ;;
safetensors) SOURCES=(tests/fuzz/corpus_st) ;;
*) SOURCES=("tests/fuzz/corpus_$TARGET") ;;
esac
for d in "${SOURCES[@]}"; do
    [ -d "$d" ] && CORPUS_DIRS+=("$d")
done

# Leaks are findings too; the sanitizers' exit status is libFuzzer's business here.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

failed=0

# The target's artifacts there are now, one per line (to tell which ones a step wrote). Each
# target's start with its step prefix (-artifact_prefix="$ART/$P": st-crash-..., cli-leak-...; the
# front end's have none), so that targets fuzzed at the same time (tests/layers/fuzz.sh runs two)
# never count each other's findings.
list_artifacts() {
    if [ -n "$P" ]; then
        find "$ART" -maxdepth 1 -type f -name "$P*" 2>/dev/null | sort
    else
        find "$ART" -maxdepth 1 -type f 2>/dev/null | grep -vE '/(st|data|state|cli|verify_step)-[^/]*$' | sort
    fi
}

# report STEP RC LOG BEFORE: BEFORE is list_artifacts' output from before the step.
report() {
    local step=$1 rc=$2 log=$3 before=$4 arts
    arts=$(comm -13 <(printf '%s\n' "$before") <(list_artifacts) | sed '/^$/d')
    if [ "$rc" = 0 ] && [ -z "$arts" ]; then
        echo "PASS fuzz/$step"
        return
    fi
    failed=1
    local what="libFuzzer exited with status $rc"
    if grep -aq 'ERROR: libFuzzer: timeout' "$log"; then what="an input hung (over 5 s)"
    elif grep -aq 'ERROR: libFuzzer: fuzz target exited' "$log"; then what="the compiler exited (an internal error, status 2?)"
    elif grep -aq 'ERROR: libFuzzer: out-of-memory' "$log"; then what="an input used over 2 GB"
    elif grep -aq 'ERROR: LeakSanitizer' "$log"; then what="a memory leak"
    elif grep -aqE '==ERROR: AddressSanitizer|runtime error:' "$log"; then what="a sanitizer report"
    elif grep -aq 'deadly signal' "$log"; then what="a crash"
    fi
    echo "FAIL fuzz/$step: $what"
    local a
    while IFS= read -r a; do
        [ -n "$a" ] || continue
        echo "    reproducer: $a"
        echo "    replay it:  MBT_FUZZ_VERBOSE=1 '$FUZZER' '$a'"
    done <<<"$arts"
    # The report: from the first error line on, the interesting lines.
    awk '/ERROR: |runtime error: |deadly signal/ { on = 1 } on' "$log" |
        grep -aE 'ERROR:|SUMMARY:|runtime error|^ *#[0-9]+ 0x|Test unit written|deadly signal' |
        head -n 40 | cut -c1-200 | sed 's/^/    /'
    echo "    (the whole log: $log)"
}

# ---- 1. replay ---------------------------------------------------------------------------------
BEFORE=$(list_artifacts)
LOG="$BUILD/fuzz/${P}replay.log"
"$FUZZER" -runs=0 -timeout=5 -rss_limit_mb=2048 -artifact_prefix="$ART/$P" "${CORPUS_DIRS[@]}" >"$LOG" 2>&1
report "${P}replay" $? "$LOG" "$BEFORE"

# ---- 2. fuzz -----------------------------------------------------------------------------------
WORK=$(mktemp -d "$BUILD/tmp/fuzz-corpus.XXXXXX") || exit 2
trap 'rm -rf "$WORK" "$SCRATCH"' EXIT
for d in "${CORPUS_DIRS[@]}"; do
    for f in "$d"/*; do
        [ -f "$f" ] && cp "$f" "$WORK/$(echo "$d" | tr '/' '_')__$(basename "$f")"
    done
done
BEFORE=$(list_artifacts)
LOG="$BUILD/fuzz/${P}fuzz.log"
ARGS=(-max_len="$MAX_LEN" -timeout=5 -rss_limit_mb=2048 -artifact_prefix="$ART/$P" -print_final_stats=1)
if [ "$SECONDS_TO_RUN" = 0 ]; then
    echo "fuzzing until stopped (Ctrl-C); new inputs go to $WORK, findings to $ART/"
    "$FUZZER" "${ARGS[@]}" "$WORK" 2>&1 | tee "$LOG"
    rc=${PIPESTATUS[0]}
    # Stopped by the user (SIGINT: libFuzzer exits 0 or 130): not a finding by itself.
    if [ "$rc" = 130 ]; then rc=0; fi
    report "${P}fuzz" $rc "$LOG" "$BEFORE"
else
    "$FUZZER" "${ARGS[@]}" -max_total_time="$SECONDS_TO_RUN" "$WORK" >"$LOG" 2>&1
    rc=$?
    report "${P}fuzz-${SECONDS_TO_RUN}s" $rc "$LOG" "$BEFORE"
    grep -aE '^stat::number_of_executed_units|^stat::average_exec_per_sec|^stat::peak_rss_mb' "$LOG" | sed "s/^/# ${P}/"
fi

[ "$failed" = 0 ]
