#!/usr/bin/env bash
# tests/pathological.sh MBTC OUTDIR [LIMIT_MS] [TIMEOUT_S] [LOOPS_MB] - hostile inputs for
# `mbtc --check`. LOOPS_MB (default 16) sizes the valid-NNmb-loops case: 16 MB takes the checker
# past its old step budget; the sanitizer build, ten times slower at evaluating, is given 2 (the
# same paths under the sanitizers, not the budget, which the plain build's run holds).
#
# Each case generates a file under OUTDIR and runs `MBTC --check` on it. It passes when mbtc
#   - finishes within LIMIT_MS (default 1000; the sanitizer build is given more by tests/run.sh)
#     plus 40 times a baseline measured in the same run (the slowest of three `--check`s of
#     stdlib/nn.mbt), so a loaded or slow machine moves the limit with it, and is killed after
#     TIMEOUT_S (default 5, plus the same allowance) so a hang is a failure, not a stuck run;
#   - exits with the status expected (1, or 0 for the files that are valid), never 2 (an
#     internal error) nor by a signal;
#   - reports a located `path:line:col: error: ...` (and the case's message, where it has one),
#     or `mbtc: error: cannot read ...` for a missing file or a directory;
#   - prints less than 64 KiB, and no sanitizer report.
# Prints `PASS name` or `FAIL name: why` with mbtc's output indented below (tests/run.sh relays
# these lines into its own count).
set -u

if [ $# -lt 2 ]; then
    echo "usage: tests/pathological.sh MBTC OUTDIR [LIMIT_MS] [TIMEOUT_S]" >&2
    exit 2
fi
MBTC=$1
OUT=$2
LIMIT_MS=${3:-1000}
TIMEOUT_S=${4:-5}
LOOPS_MB=${5:-16}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT" || exit 2
export LC_ALL=C

failures=0

# The baseline: this machine's speed now, as the slowest of three checks of a small valid file.
BASE_MS=0
for _ in 1 2 3; do
    t0=$(date +%s%N)
    "$MBTC" --check "$ROOT/stdlib/nn.mbt" >/dev/null 2>&1
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
    [ "$ms" -gt "$BASE_MS" ] && BASE_MS=$ms
done
LIMIT_MS=$((LIMIT_MS + 40 * BASE_MS))
TIMEOUT_S=$((TIMEOUT_S + (40 * BASE_MS + 999) / 1000))

# repeat N TEXT: TEXT written N times, no separator.
repeat() {
    if [ "${#2}" = 1 ]; then
        printf '%*s' "$1" '' | tr ' ' "$2"
    else
        printf '%*s' "$1" '' | sed "s/ /$(printf '%s' "$2" | sed 's/[\/&]/\\&/g')/g"
    fi
}

# check NAME FILE WANT_RC MESSAGE [EXTRA_MS]
#   WANT_RC 0: exit 0 and print nothing. WANT_RC 1: exit 1 with a located error about FILE whose
#   text contains MESSAGE (any error when MESSAGE is empty). MESSAGE starting with "mbtc: " is a
#   message without location (for files that cannot be read) and must begin a line. EXTRA_MS is
#   added to the limit and the timeout for a case that is meant to take long (from a baseline).
#   The time taken is left in OUT/NAME.ms.
check() {
    local name=$1 file=$2 want=$3 msg=$4 extra=${5:-0}
    local log="$OUT/$name.log" rc t0 t1 ms why="" size
    local LIMIT_MS=$((LIMIT_MS + extra)) TIMEOUT_S=$((TIMEOUT_S + (extra + 999) / 1000))
    t0=$(date +%s%N)
    { timeout "$TIMEOUT_S" "$MBTC" --check "$file" >"$log" 2>&1; } 2>>"$log"
    rc=$?
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
    echo "$ms" >"$OUT/$name.ms"
    size=$(wc -c <"$log")
    if [ "$rc" = 124 ]; then
        why="hung: killed after ${TIMEOUT_S} s"
    elif [ "$rc" -gt 128 ]; then
        why="killed by signal $((rc - 128))"
    elif [ "$rc" = 2 ]; then
        why="internal error (exit status 2)"
    elif grep -aqE '^==[0-9]+==ERROR: |runtime error: |^SUMMARY: (Address|Undefined|Leak)Sanitizer' "$log"; then
        why="sanitizer report (exit status $rc)"
    elif [ "$rc" != "$want" ]; then
        why="exit status $rc, expected $want"
    elif [ "$ms" -gt "$LIMIT_MS" ]; then
        why="took $ms ms (the limit is $LIMIT_MS ms)"
    elif [ "$size" -ge 65536 ]; then
        why="printed $size bytes (the limit is 64 KiB)"
    elif [ "$want" = 0 ] && [ "$size" != 0 ]; then
        why="printed messages for a valid file"
    elif [ "$want" != 0 ]; then
        case "$msg" in
        "mbtc: "*)
            if ! awk -v m="$msg" 'index($0, m) == 1 { found = 1 } END { exit !found }' "$log"; then
                why="no line starting '$msg'"
            fi
            ;;
        *)
            # A line `FILE:LINE:COL: error: ...` containing msg.
            if ! awk -v p="$file:" -v m="$msg" '
                index($0, p) == 1 {
                    rest = substr($0, length(p) + 1)
                    if (rest ~ /^[0-9]+:[0-9]+: error: / && index(rest, m) > 0) found = 1
                }
                END { exit !found }' "$log"; then
                if [ -n "$msg" ]; then why="no located error containing '$msg'"; else why="no located error"; fi
            fi
            ;;
        esac
    fi
    if [ -z "$why" ]; then
        echo "PASS $name"
    else
        failures=$((failures + 1))
        echo "FAIL $name: $why"
        if grep -aqE '^==[0-9]+==ERROR: |runtime error: ' "$log"; then
            # The sanitizer's report, not mbtc's messages before it.
            awk '/^==[0-9]+==ERROR: |runtime error: / { on = 1 } on' "$log" | head -n 30
        else
            head -n 20 "$log"
        fi | cut -c1-200 | tr '\000-\010\013-\037\177' '?' | sed 's/^/    /'
    fi
}

F="$OUT"

# ---- strings, NUL bytes, UTF-8 -------------------------------------------------------------
printf 'fn f() {\n  x = "abc\n  return x\n}\n' >"$F/unterminated-string.mbt"
check unterminated-string "$F/unterminated-string.mbt" 1 "unterminated string"

printf 'fn f() {\n  x = "abc' >"$F/unterminated-string-eof.mbt"
check unterminated-string-eof "$F/unterminated-string-eof.mbt" 1 "unterminated string"

printf 'fn f() {\n  x = 1\000\000 + 2\n  s = "a\000b"\n  # c\000d\n  return x\n}\n' >"$F/nul-bytes.mbt"
check nul-bytes "$F/nul-bytes.mbt" 1 "NUL byte"

head -c 1048576 /dev/zero >"$F/nul-megabyte.mbt"
check nul-megabyte "$F/nul-megabyte.mbt" 1 "NUL byte"

printf 'fn f() {\n  x = 1 \xff\xfe + 2\n  return x\n}\n' >"$F/utf8-code.mbt"
check utf8-code "$F/utf8-code.mbt" 1 "invalid UTF-8"

printf '# caf\xe9 \xc0\x80\nfn f() {\n  return 1\n}\n' >"$F/utf8-comment.mbt"
check utf8-comment "$F/utf8-comment.mbt" 1 "invalid UTF-8"

printf 'fn f() {\n  s = "donn\xe9es \xed\xa0\x80"\n  return s\n}\n' >"$F/utf8-string.mbt"
check utf8-string "$F/utf8-string.mbt" 1 "invalid UTF-8"

# ---- size ------------------------------------------------------------------------------------
# 10 MB of valid declarations: copies of the stdlib's layers, each copy's models renamed.
if [ -f "$ROOT/stdlib/nn.mbt" ]; then
    names=$(sed -nE 's/^model ([A-Za-z0-9_]+).*/\1/p' "$ROOT/stdlib/nn.mbt" | paste -sd'|' -)
    sed -E "s/\\b($names)\\b/\\1_@N@/g" "$ROOT/stdlib/nn.mbt" >"$F/nn-template.mbt"
    awk -v target=10485760 'BEGIN { RS = "\001" } { t = t $0 }
        END { n = 0; k = 0; while (n < target) { s = t; gsub(/@N@/, k, s); printf "%s", s; n += length(s); k++ } }' \
        "$F/nn-template.mbt" >"$F/valid-10mb.mbt"
    check valid-10mb "$F/valid-10mb.mbt" 0 ""
else
    echo "FAIL valid-10mb: $ROOT/stdlib/nn.mbt not found"
    failures=$((failures + 1))
fi

# The checker's evaluation budget grows with the source (docs/cli.md, Limits): 16 MB of small
# models, each calling a function with a 16-step loop, take about 22 million evaluation steps,
# beyond the 20 million a whole program was allowed before (a valid 200 MB source was refused
# late by that limit). The time allowed grows by ten times valid-10mb's, measured in this run.
valid10_ms=$(cat "$OUT/valid-10mb.ms" 2>/dev/null || echo 1000)
printf '%s\n' 'fn widths_@N@(d) -> i64 {' '  t = 0' '  for i in 0..16 {' '    t = t + d * i' '  }' '  return t' '}' \
    'model Stack_@N@(d = 8) {' '  k = widths_@N@(d)' '  w = param f32[d, d]' '}' >"$F/loops-template.mbt"
awk -v target=$((LOOPS_MB << 20)) 'BEGIN { RS = "\001" } { t = t $0 }
    END { n = 0; k = 0; while (n < target) { s = t; gsub(/@N@/, k, s); printf "%s", s; n += length(s); k++ } }' \
    "$F/loops-template.mbt" >"$F/valid-${LOOPS_MB}mb-loops.mbt"
check "valid-${LOOPS_MB}mb-loops" "$F/valid-${LOOPS_MB}mb-loops.mbt" 0 "" $((10 * valid10_ms))

# A loop of loops in a few lines is refused where the checker's memory for it passes 1 GiB, with
# a located message, in time bounded by that memory (it used to run 20 million steps in 7.5 GB).
printf '%s\n' 'fn f() -> i64 {' '  x = 0' '  for i in 0..4096 {' '    for j in 0..4096 {' '      x = x + 1' '    }' '  }' \
    '  return x' '}' 'model M(d = f()) {' '  w = param f32[d, 4]' '}' >"$F/loop-of-loops.mbt"
check loop-of-loops "$F/loop-of-loops.mbt" 1 "evaluating it needs more than 1024 MiB" $((10 * valid10_ms))

# 10 MB of garbage: 64 KiB of pseudo-random bytes (fixed seed), repeated.
awk 'BEGIN { srand(20240607); for (i = 0; i < 65536; i++) printf "%c", int(rand() * 256) }' >"$F/garbage-64k.bin"
for _ in $(seq 160); do cat "$F/garbage-64k.bin"; done >"$F/garbage-10mb.mbt"
check garbage-10mb "$F/garbage-10mb.mbt" 1 ""

# 10 MB of printable junk: random ASCII punctuation, names and numbers.
awk 'BEGIN { srand(7); s = "abcxyz_019 .,;:()[]{}+-*/%^@=<>!~\"#\n";
             for (i = 0; i < 65536; i++) printf "%s", substr(s, int(rand() * length(s)) + 1, 1) }' >"$F/junk-64k.txt"
for _ in $(seq 160); do cat "$F/junk-64k.txt"; done >"$F/junk-10mb.mbt"
check junk-10mb "$F/junk-10mb.mbt" 1 ""

# 100,000 lines with an error each: the output stays bounded.
yes '  x = $' | head -n 100000 >"$F/many-errors.mbt"
check many-errors "$F/many-errors.mbt" 1 ""

# ---- depth -----------------------------------------------------------------------------------
{ printf 'fn f() {\n  x = '; repeat 100000 '('; printf '1'; repeat 100000 ')'; printf '\n  return x\n}\n'; } >"$F/nested-parens.mbt"
check nested-parens "$F/nested-parens.mbt" 1 "nested"

{ printf 'fn f() {\n  x = '; repeat 100000 '['; printf '1'; repeat 100000 ']'; printf '\n  return x\n}\n'; } >"$F/nested-brackets.mbt"
check nested-brackets "$F/nested-brackets.mbt" 1 "nested"

{ printf 'fn f() {\n  x = '; repeat 100000 '-'; printf '1\n  return x\n}\n'; } >"$F/nested-minus.mbt"
check nested-minus "$F/nested-minus.mbt" 1 ""

{ printf 'fn f(y) {\n  x = '; repeat 100000 'not '; printf 'y\n  return x\n}\n'; } >"$F/nested-not.mbt"
check nested-not "$F/nested-not.mbt" 1 ""

{ printf 'fn f(y) {\n  x = y'; repeat 100000 '^y'; printf '\n  return x\n}\n'; } >"$F/power-chain.mbt"
check power-chain "$F/power-chain.mbt" 1 ""

{ printf 'fn f(y) {\n'; yes '  if y {' | head -n 100000; yes '  }' | head -n 100000; printf '  return y\n}\n'; } >"$F/nested-blocks.mbt"
check nested-blocks "$F/nested-blocks.mbt" 1 ""

{ printf 'fn f() {\n  x = 1'; repeat 99999 '+1'; printf '\n  return x\n}\n'; } >"$F/sum-100k.mbt"
check sum-100k "$F/sum-100k.mbt" 1 "nested"

# A list nested 262,144 deep (`x = [x]` in a loop) described in a message: the description looks
# 4 levels in (it recursed all the way down and overflowed the C stack).
printf '%s\n' 'fn f() -> i64 {' '  x = [1]' '  for i in 0..4096 {' '    for j in 0..64 {' '      x = [x]' '    }' '  }' \
    '  y = not x' '  return 1' '}' 'model M(d = f()) {' '  w = param f32[d, 4]' '}' >"$F/deep-list.mbt"
check deep-list "$F/deep-list.mbt" 1 "'not' needs a bool, got list of 1 list of 1 list of 1 list of 1 list of 1 items"

# ---- literals --------------------------------------------------------------------------------
printf 'model M(n = 99999999999999999999999, d = 8) {\n  w = param f32[n, d]\n}\n' >"$F/int-too-large.mbt"
check int-too-large "$F/int-too-large.mbt" 1 "integer literal too large"

{ printf 'fn f() {\n  x = '; repeat 1048576 'a'; printf '\n  return x\n}\n'; } >"$F/identifier-1mb.mbt"
check identifier-1mb "$F/identifier-1mb.mbt" 1 "identifier is 1048576 bytes long"

{ printf 'fn f() {\n  x = 1'; repeat 1048576 '0'; printf '\n  return x\n}\n'; } >"$F/number-1mb.mbt"
check number-1mb "$F/number-1mb.mbt" 1 ""

# A 1 MB string is fine; the syntax error on the next line shows the lexer got past it.
{ printf 'fn f() {\n  x = "'; repeat 1048576 's'; printf '"\n  y = = 1\n}\n'; } >"$F/string-1mb.mbt"
check string-1mb "$F/string-1mb.mbt" 1 "expected an expression"

# ---- files -----------------------------------------------------------------------------------
rm -f "$F/does-not-exist.mbt"
check missing-file "$F/does-not-exist.mbt" 1 "mbtc: error: cannot read"

mkdir -p "$F/a-directory.mbt"
check directory "$F/a-directory.mbt" 1 "mbtc: error: cannot read"

: >"$F/empty.mbt"
check empty "$F/empty.mbt" 0 ""

printf '# only comments\n#\n   # indented\n\n# no newline at the end' >"$F/comments-only.mbt"
check comments-only "$F/comments-only.mbt" 0 ""

printf 'fn scale(x, k = 2.0) -> f32 {\r\n  if x > 0 {\r\n    return x * k\r\n  }\r\n  return 0.0\r\n}\r\n' >"$F/crlf.mbt"
check crlf "$F/crlf.mbt" 0 ""

# ---- the error cap ---------------------------------------------------------------------------

# 30 mistakes: 20 are printed, then one line counts the rest.
for i in $(seq 1 30); do printf 'fn f%d() {\n  return undefined_name_%d\n}\n' "$i" "$i"; done >"$F/thirty-errors.mbt"
check error-cap "$F/thirty-errors.mbt" 1 "unknown name 'undefined_name_1'"
printed=$(grep -c ': error: ' "$OUT/error-cap.log")
summary=$(tail -n 1 "$OUT/error-cap.log")
if [ "$printed" = 20 ] && [ "$summary" = "mbtc: 10 more errors not shown (30 in all)" ]; then
    echo "PASS error-cap-count"
else
    failures=$((failures + 1))
    echo "FAIL error-cap-count: $printed errors printed (want 20), last line '$summary'"
fi

[ "$failures" = 0 ]
