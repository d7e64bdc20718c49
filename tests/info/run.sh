#!/usr/bin/env bash
# tests/info/run.sh BUILD - `./prog info` against `mbtc --emit=plan` (tests/run.sh's info layer).
# Every train block of every example is built with `mbtc -o` (for the CPU alone); the `plan:`
# lines its executable prints back from its descriptor must equal the summary lines of the
# compiler's memory plan, word for word and number for number (the arena of each phase and the
# largest, the regions, kernels and GEMMs per call and per step), and the arena the executable
# allocates (`allocated: arena N bytes`) must be the plan's largest. A control holds an
# executable's info against the plan of another train block of its file, which must differ.
# Prints `PASS info/NAME` or `FAIL info/NAME: why` with details indented below; exit status 1 when
# anything failed.
set -u
if [ $# -lt 1 ]; then
    echo "usage: tests/info/run.sh BUILD" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "$1" && pwd) || exit 2
cd "$ROOT" || exit 2
DIR="$BUILD/tmp/info"
rm -rf "$DIR"
mkdir -p "$DIR" || exit 2
MBTC="$BUILD/mbtc"
export MBT_CUDA_ARCH=none
if [ -d "$BUILD/../stdlib" ]; then unset MBT_PATH; else export MBT_PATH="$ROOT/stdlib"; fi
failed=0
pass() { echo "PASS info/$1"; }
fail() {
    echo "FAIL info/$1: $2"
    [ $# -ge 3 ] && [ -f "$3" ] && tail -n 15 "$3" | sed 's/^/    /'
    failed=1
}

# plan_lines FILE TRAIN OUT: the `plan:` summary of mbtc --emit=plan into OUT
plan_lines() {
    "$MBTC" --emit=plan --train "$2" "$1" >"$3.full" 2>"$3.err" && grep '^plan: ' "$3.full" >"$3"
}

# info_lines PROG OUT: `PROG info`'s `plan:` lines into OUT (the whole output in OUT.full)
info_lines() {
    "$1" info >"$2.full" 2>&1 && grep '^plan: ' "$2.full" >"$2"
}

# check_block FILE TRAIN: one train block's check (its PASS or FAIL line)
check_block() {
    local f=$1 t=$2 name prog largest allocated
    name="$(basename "$f" .mbt)-$t"
    prog="$DIR/$name"
    if ! "$MBTC" --train "$t" "$f" -o "$prog" >"$prog.build" 2>&1; then
        fail "$name" "mbtc -o failed" "$prog.build"
        return
    fi
    if ! plan_lines "$f" "$t" "$prog.plan"; then
        fail "$name" "mbtc --emit=plan printed no summary" "$prog.plan.err"
        return
    fi
    if ! info_lines "$prog" "$prog.info"; then
        fail "$name" "./prog info failed or printed no plan lines" "$prog.info.full"
        return
    fi
    if ! diff -u --label "mbtc --emit=plan" --label "./prog info" "$prog.plan" "$prog.info" >"$prog.diff"; then
        fail "$name" "./prog info differs from mbtc --emit=plan" "$prog.diff"
        return
    fi
    largest=$(sed -n 's/^plan: arena \([0-9]*\) bytes, the largest$/\1/p' "$prog.plan")
    allocated=$(sed -n 's/^allocated: arena \([0-9]*\) bytes,.*/\1/p' "$prog.info.full")
    if [ -z "$largest" ] || [ "$largest" != "$allocated" ]; then
        fail "$name" "the executable allocates an arena of '$allocated' bytes, the plan's largest phase is '$largest'" \
            "$prog.info.full"
        return
    fi
    pass "$name ($(wc -l <"$prog.info") lines equal; arena $largest bytes allocated)"
}

# The blocks two at a time (mbtc -o is one thread; CI has 2 cores), each one's lines in
# DIR/NAME.result, printed in order once all are done.
JOBS=${MBT_INFO_JOBS:-2}
first_file="" first_prog="" other_train="" names=() running=0
for f in examples/*.mbt; do
    [ -f "$f" ] || continue
    trains=$(LC_ALL=C sed -n 's/^train[[:space:]]\{1,\}\([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' "$f")
    for t in $trains; do
        name="$(basename "$f" .mbt)-$t"
        names+=("$name")
        if [ "$running" -ge "$JOBS" ]; then
            wait -n
            running=$((running - 1))
        fi
        check_block "$f" "$t" </dev/null >"$DIR/$name.result" 2>&1 &
        running=$((running + 1))
        # the control: the first file with a second train block, its first block's executable
        if [ -z "$first_file" ]; then
            set -- $trains
            if [ $# -ge 2 ] && [ "$t" = "$1" ]; then first_file=$f first_prog="$DIR/$name" other_train=$2; fi
        fi
    done
done
wait
for name in "${names[@]}"; do
    cat "$DIR/$name.result"
    grep -q '^PASS ' "$DIR/$name.result" || failed=1
done
first_ok=0
[ -n "$first_prog" ] && grep -q '^PASS ' "$DIR/$(basename "$first_prog").result" && first_ok=1

if [ -z "$first_file" ]; then
    fail control-other-block "no example has two train blocks to compare"
elif [ "$first_ok" = 0 ]; then
    fail control-other-block "$(basename "$first_prog") failed above: no info to compare"
elif ! plan_lines "$first_file" "$other_train" "$DIR/control.plan"; then
    fail control-other-block "mbtc --emit=plan --train $other_train failed" "$DIR/control.plan.err"
elif cmp -s "$DIR/control.plan" "$first_prog.info"; then
    fail control-other-block "$(basename "$first_prog")'s info equals the plan of train block $other_train"
else
    n=$(diff "$DIR/control.plan" "$first_prog.info" | grep -c '^<')
    pass "control-other-block ($(basename "$first_prog")'s info differs from the plan of $other_train in $n lines)"
fi
exit $failed
