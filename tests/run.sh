#!/usr/bin/env bash
# tests/run.sh BUILD_DIR - runs every test layer against the binaries in BUILD_DIR (what `make
# test` and `make test-quick` call, after building them).
# tests/run.sh --update-golden BUILD_DIR - rewrites the expected files of tests/golden (NAME.ir,
# NAME.plan, ... and *.err; a case without any gets NAME.ir) from what BUILD_DIR/mbtc prints now,
# and runs nothing else: review the diff before committing it.
#
# Layers, each printing `PASS <layer>/<name>` or `FAIL <layer>/<name>: reason` (with the captured
# output of a failure indented below it) and a `# layer NAME: 1.2 s` timing line:
#   unit          every BUILD/tests/test_* (each prints its own PASS/FAIL lines; they are counted)
#   diag          tests/diag/*.mbt: `mbtc --check` must print exactly the `# expect:` lines
#   check         stdlib/*.mbt and examples/*.mbt check clean (exit 0, nothing on stderr)
#   golden        tests/golden/NAME.mbt, at each stage it names: `mbtc --emit=STAGE` prints exactly
#                 NAME.STAGE (STAGE ir, grad, plan or kernels), or with NAME.STAGE.err exactly that
#                 on stderr and exit 1 (NAME.err is NAME.ir.err); and every train block of every
#                 example builds a graph that passes graph_verify, a plan that passes plan_verify
#                 and kernels that pass fuse_verify, each within the time limit
#   cuda          every train block of every example: all its kernels compile with NVRTC for sm_80
#                 and sm_90 (`mbtc --emit=kernels --cuda-info`), ptxas reports no spills nor stack
#                 but for the kernels named in run_cuda; a control shows the check catching both.
#                 SKIP without libnvrtc. (Golden CUDA source is the golden layer's `cuda` stage.)
#                 And the executable's CUDA side (run_cuda_embed): -o embeds NVRTC's cubins and PTX
#                 byte for byte, --help lists them, --cuda-arch=none embeds none, the NVRTC cache
#                 gives what compiling gives.
#   pathological  tests/pathological.sh: hostile inputs finish fast, with a located error
#   exec          executables from `mbtc -o` run on mbt-gendata data: mlp's loss falls and
#                 reruns are bit-identical; every example's train blocks build and its CPU-size
#                 ones train 3 steps; tests/exec/ramp.mbt's batch-size ramp and data ranks;
#                 tests/exec/gen_*.mbt generate (see run_exec_generate)
#   ckpt          tests/ckpt/run.sh: killed and resumed runs equal an uninterrupted one; bad checkpoints
#   info          tests/info/run.sh: every example's `./prog info` equals `mbtc --emit=plan`'s summary
#   gpu-selftest  tests/gpu/selftest.sh: make test-gpu's comparison (tests/gpu/cmpdump.py) passes on
#                 equal steps and on PyTorch's, fails on perturbed ones
#   gpu-emu       the emulated GPU (tests/cudaemu/cudaemu.h runs CUDA C on the CPU): the attention
#                 templates against a float64 reference (tests/cudaemu/check_attention.sh), then
#                 tests/gpu/run.sh with MBT_GPU_TEST_DEVICE=emu: make test-gpu with the executables'
#                 --device cuda path against tests/cudaemu/fake_cuda.c, each CPU-size example's step
#                 (and attention's odd shapes, in f32 and bf16) held to the CPU's. SKIP without NVRTC
#   asan          the unit, diag, check, golden and pathological layers again with BUILD/asan's binaries
#   fuzz          replay the fuzz corpus, then fuzz the front end for 60 s and the safetensors
#                 reader for 30 s (tests/fuzz/run.sh)
# MBT_QUICK=1 skips asan and fuzz; MBT_ASAN_LEAKS=0 runs the asan layer without leak detection;
# MBT_LAYERS=exec,verify runs only the layers named (a comma-separated list).
# The last line is `N passed, M failed` (`, K skipped` when K > 0); the exit status is 1 when
# anything failed. A skipped test never counts as passed.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UPDATE_GOLDEN=0
if [ "${1:-}" = --update-golden ]; then
    UPDATE_GOLDEN=1
    shift
fi
if [ $# -lt 1 ]; then
    echo "usage: tests/run.sh [--update-golden] BUILD_DIR" >&2
    exit 2
fi
if ! BUILD=$(cd "$1" 2>/dev/null && pwd); then
    echo "FAIL setup: build directory '$1' does not exist (run make first)"
    echo "0 passed, 1 failed"
    exit 1
fi
cd "$ROOT" || exit 2
QUICK=${MBT_QUICK:-0}
[ "$QUICK" = 0 ] || [ "$QUICK" = 1 ] || QUICK=1

# The tests do not depend on the caller's module path. A compiler finds the stdlib beside itself
# (<bindir>/../stdlib); one built elsewhere (the sanitizer build in BUILD/asan) is pointed at the
# repository's stdlib with MBT_PATH (see stdlib_env).
unset MBT_PATH
stdlib_env() {
    if [ -d "$(dirname "$1")/../stdlib" ]; then unset MBT_PATH; else export MBT_PATH="$ROOT/stdlib"; fi
}

TMP="$BUILD/tmp/run"
rm -rf "$TMP"
mkdir -p "$TMP" || exit 2
# NVRTC's output cache (compiler/nvrtc.c), fresh for each run: every distinct CUDA program the
# tests build is compiled by NVRTC once a run, and the cache itself is tested (run_cuda_embed).
export MBT_CACHE_DIR="$BUILD/tmp/cache"
rm -rf "$MBT_CACHE_DIR"
# Executables are built for the CPU alone (MBT_CUDA_ARCH=none: no NVRTC, which keeps the layers
# that build many executables fast) except where a test gives --cuda-arch: exec/example (every
# example's CUDA side, CUDA_ARCHS), cuda/embed and exec/emit-program. Where NVRTC is missing,
# CUDA_ARCHS is none too (then mbtc would warn that it builds for the CPU alone).
export MBT_CUDA_ARCH=none
CUDA_ARCHS=sm_80,sm_90
"$BUILD/mbtc" --emit=ptx --cuda-arch=sm_80 tests/golden/mlp.mbt >/dev/null 2>&1 || CUDA_ARCHS=none

# shellcheck source=tests/report.sh
. tests/report.sh

now_ns() { date +%s%N; }

LAYER_START=0
layer_begin() { LAYER_START=$(now_ns); }
layer_end() {
    local ms=$((($(now_ns) - LAYER_START) / 1000000))
    printf '# layer %s: %d.%d s\n' "$1" $((ms / 1000)) $(((ms % 1000) / 100))
}

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

# ---- unit ------------------------------------------------------------------------------------

# relay LAYER FILE: re-emits the PASS/FAIL lines of a sub-runner's output (a unit binary,
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
        " "* | $'\t'*)
            if [ $infail = 1 ]; then printf '%s\n' "$line"; fi
            ;;
        *) infail=0 ;;
        esac
    done < <(LC_ALL=C tr '\000' '?' <"$file")
}

run_unit() {
    local layer=$1 dir=$2 bin name out rc summary why found=0
    for bin in "$dir"/test_*; do
        [ -f "$bin" ] && [ -x "$bin" ] || continue
        found=1
        name=$(basename "$bin")
        out="$TMP/${layer//\//-}-$name.out"
        # (the braces catch the shell's own "Segmentation fault" line in the log)
        { timeout 300 "$bin" >"$out" 2>&1; } 2>>"$out"
        rc=$?
        relay "$layer/$name" "$out"
        summary=$(LC_ALL=C grep -aE '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
        why=$(describe_status "$rc")
        if [ -n "$why" ]; then
            # A crash, a hang or a sanitizer report always counts, FAIL lines or not.
            fail "$layer/$name" "$why" "$out"
        elif [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; then
            fail "$layer/$name" "exited with status $rc without a FAIL line" "$out"
        elif [ -z "$summary" ]; then
            fail "$layer/$name" "no 'N passed, M failed' line at the end (did it stop early?)" "$out"
        elif [ "$summary" != "$RELAY_P passed, $RELAY_F failed" ]; then
            fail "$layer/$name" "its summary says '$summary' but it printed $RELAY_P PASS and $RELAY_F FAIL lines" "$out"
        elif [ "$rc" = 0 ] && [ "$RELAY_F" != 0 ]; then
            fail "$layer/$name" "exited with status 0 after FAIL lines" "$out"
        elif [ "$RELAY_F" = 0 ] && san_report "$out"; then
            fail "$layer/$name" "sanitizer report" "$out"
        fi
    done
    if [ $found = 0 ]; then
        fail "$layer" "no unit test binaries in $dir (run make unit)"
    fi
}

# ---- diag ------------------------------------------------------------------------------------

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

# ---- check -----------------------------------------------------------------------------------

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

# ---- golden ----------------------------------------------------------------------------------

# golden_stages NAME: the stages tests/golden/NAME.mbt is compared at - each STAGE (ir, grad, plan, kernels)
# with an expected NAME.STAGE (stdout) or NAME.STAGE.err (stderr, exit 1); NAME.err is the old
# spelling of NAME.ir.err. Prints them, space-separated.
golden_stages() {
    local st out=""
    for st in ir grad plan kernels cuda; do
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
                elif ! LC_ALL=C head -n 1 "$out" | grep -q "^# $head train $t: "; then
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

# ---- pathological ----------------------------------------------------------------------------

run_pathological() {
    local layer=$1 mbtc=$2 limit_ms=$3 timeout_s=$4 out rc
    if [ ! -x "$mbtc" ]; then
        fail "$layer" "$mbtc does not exist (run make)"
        return
    fi
    stdlib_env "$mbtc"
    out="$TMP/${layer//\//-}.out"
    bash tests/pathological.sh "$mbtc" "$BUILD/tmp/pathological" "$limit_ms" "$timeout_s" >"$out" 2>&1
    rc=$?
    relay "$layer" "$out"
    if [ $((RELAY_P + RELAY_F)) = 0 ] || { [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; }; then
        fail "$layer" "tests/pathological.sh exited with status $rc" "$out"
    fi
}

# ---- fuzz ------------------------------------------------------------------------------------

run_fuzz() {
    local out="$TMP/fuzz.out" rc target secs
    for target in frontend:60 safetensors:30; do
        secs=${target#*:}
        target=${target%:*}
        if [ ! -x "$BUILD/fuzz/fuzz_$target" ]; then
            skip "fuzz/$target" "no $BUILD/fuzz/fuzz_$target (make fuzz-build builds it)"
            continue
        fi
        bash tests/fuzz/run.sh "$BUILD" "$secs" "$target" >"$out" 2>&1
        rc=$?
        relay fuzz "$out"
        if [ $((RELAY_P + RELAY_F)) = 0 ] || { [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; }; then
            fail fuzz "tests/fuzz/run.sh ($target) exited with status $rc" "$out"
        fi
    done
}

# ckpt: tests/ckpt/run.sh - kill -9 at random moments and during a write, SIGTERM, then resume:
# bit-identical to an uninterrupted run; full disks, other programs' and damaged checkpoints
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

# held_out_below TEST PROG DATADIR LIMIT WHAT [TRAIN ARGS...]: PROG trains on DATADIR/t_train.bin
# (with TRAIN ARGS), then its held-out loss on DATADIR/t_val.bin must be below LIMIT (an awk
# expression); WHAT says what the limit is.
held_out_below() {
    local name=$1 prog=$2 data=$3 limit=$4 what=$5 out="$BUILD/tmp/exec/held_out.txt" loss
    shift 5
    if "$prog" train --data "$data/t_train.bin" --save-weights "$out.safetensors" "$@" >"$out" 2>&1 \
        && "$prog" eval --weights "$out.safetensors" --data "$data/t_val.bin" >"$out" 2>&1; then
        loss=$(sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p' "$out")
        if [ -n "$loss" ] && awk -v l="$loss" "BEGIN { exit !(l < $limit) }"; then pass "$name (held-out $loss, $what)"
        else fail "$name" "held-out loss '$loss', not $what" "$out"; fi
    else fail "$name" "training or evaluating $prog failed" "$out"; fi
}

# exec: `mbtc -o` builds examples/mlp.mbt; trained 30 steps on mbt-gendata's corpus, its loss falls
# by at least 0.003 nats (first step's loss minus the last's), two runs save bit-identical weights,
# and --threads 1 and 2 agree bit for bit; mlp and tiny train to stated held-out losses (below).
run_exec() {
    local mbtc=$1 dir="$BUILD/tmp/exec" out
    mkdir -p "$dir"
    out="$dir/out.txt"
    if ! "$mbtc" examples/mlp.mbt -o "$dir/mlp" >"$out" 2>&1; then fail exec/build "mbtc -o failed" "$out"; return; fi
    pass exec/build
    "$BUILD/mbt-gendata" --out-dir "$dir/d" --name t --tokens 200000 --val-tokens 20000 >"$dir/gendata.txt" 2>&1 || { fail exec/gendata "mbt-gendata failed" "$dir/gendata.txt"; return; }
    local a
    for a in 1 2; do
        "$dir/mlp" train --steps 30 --data "$dir/d/t_train.bin" --threads $a --log "$dir/log$a.jsonl" --save-weights "$dir/w$a.safetensors" >"$out" 2>&1 \
            || { fail exec/train "train --threads $a failed" "$out"; return; }
    done
    "$dir/mlp" train --steps 30 --data "$dir/d/t_train.bin" --threads 2 --save-weights "$dir/w3.safetensors" >"$out" 2>&1 || { fail exec/train "train failed" "$out"; return; }
    local first last
    first=$(head -1 "$dir/log2.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
    last=$(tail -1 "$dir/log2.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
    if awk -v f="$first" -v l="$last" 'BEGIN { exit !(f - l >= 0.003) }'; then pass "exec/loss-falls ($first -> $last)"
    else fail exec/loss-falls "loss $first -> $last: fell by less than 0.003"; fi
    if cmp -s "$dir/w2.safetensors" "$dir/w3.safetensors"; then pass exec/deterministic; else fail exec/deterministic "two runs differ"; fi
    if cmp -s "$dir/w1.safetensors" "$dir/w2.safetensors"; then pass exec/threads; else fail exec/threads "--threads 1 and 2 differ"; fi
    # trained to a stated loss, on the held-out file: mlp (a bigram model) its whole 300 steps to
    # within 0.05 nats of the best any bigram model can do; tiny 150 steps to below that bound,
    # which only a model using more than the last token reaches
    local bigram
    bigram=$(sed -n 's/^best with less context: bigram H(x_t | x_t-1) = \([0-9.]*\) .*/\1/p' "$dir/gendata.txt")
    held_out_below exec/mlp-reaches-bigram-bound "$dir/mlp" "$dir/d" "$bigram + 0.05" "within 0.05 of the bigram bound $bigram"
    if "$mbtc" examples/tiny.mbt -o "$dir/tiny" >"$out" 2>&1; then
        held_out_below exec/tiny-beats-bigram-bound "$dir/tiny" "$dir/d" "$bigram" "below the bigram bound $bigram" --steps 150
    else fail exec/tiny-beats-bigram-bound "mbtc -o examples/tiny.mbt failed" "$out"; fi

    # --emit=program prints what -o compiles: the step functions for the CPU and the GPU, each
    # launch annotated with its op and source line (mlp's first GEMM is fc1's matmul with its bias
    # added as it stores, nn.mbt's Linear; its first kernel is launched by forward_backward and forward_loss on each device)
    if "$mbtc" examples/mlp.mbt --emit=program --cuda-arch=sm_80,sm_90 >"$dir/program.ll" 2>"$out" \
        && grep -q '^define internal i32 @forward_backward' "$dir/program.ll" \
        && grep -q '^define internal i32 @forward_logits' "$dir/program.ll" \
        && grep -q '^define internal i32 @gpu.forward_backward' "$dir/program.ll" \
        && grep -q '^  %step_k0_gather. = call i32 @rt_gpu_launch(ptr %gpu, i32 0, ' "$dir/program.ll" \
        && grep -q '^@mbt_program = .* ptr @mbt.gpu, %RtPlanInfo { .* } }$' "$dir/program.ll" \
        && grep -q '^  ; GEMM 2048x256x64 + bias param fc1.bias into %[0-9]* add nn.mbt:[0-9]*:[0-9]*$' "$dir/program.ll" \
        && [ "$(grep -c '^  ; kernel step_k0_gather: %[0-9]* gather nn.mbt' "$dir/program.ll")" = 4 ]; then
        pass exec/emit-program
    else fail exec/emit-program "--emit=program lacks the step functions, the descriptor or a launch's annotation" "$out"; fi
}

# verify: each CPU-sized example built with `mbtc -o` dumps its first step (`train --steps 1
# --dump-step`), and `mbtc --verify-step` holds the compiled loss, gradients and optimizer update
# against the reference evaluator in double precision (loss 1e-5, gradients and updates 1e-4,
# relative). Then the checks that it can fail: mlp's step against tests/verify/mlp_gelu.mbt (same
# parameters, gelu for relu) must be FAILED with status 1, and a dump of another shape or a file
# that is not a dump must be refused with a message, not a crash.
run_verify() {
    local mbtc=$1 dir="$BUILD/tmp/verify" out ex
    mkdir -p "$dir"
    out="$dir/out.txt"
    "$BUILD/mbt-gendata" --out-dir "$dir/d" --name t --tokens 100000 --val-tokens 20000 >"$out" 2>&1 || { fail verify/gendata "mbt-gendata failed" "$out"; return; }
    for ex in mlp tiny moe; do
        if ! "$mbtc" "examples/$ex.mbt" -o "$dir/$ex" >"$out" 2>&1 \
            || ! "$dir/$ex" train --steps 1 --data "$dir/d/t_train.bin" --dump-step "$dir/$ex.safetensors" >"$out" 2>&1; then
            fail "verify/$ex" "building or dumping the first step failed" "$out"
            continue
        fi
        if "$mbtc" "examples/$ex.mbt" --verify-step "$dir/$ex.safetensors" >"$out" 2>&1 && grep -q '^verify-step: ok' "$out"; then
            pass "verify/$ex ($(sed -n 's/^verify-step: ok (\(.*\);.*/\1/p' "$out"))"
        else
            fail "verify/$ex" "the compiled step differs from the reference" "$out"
        fi
    done
    # precision = bf16 (tests/verify/*_bf16.mbt): held to bf16's tolerances; the bf16 step held
    # against the f32 program must fail, so the bf16 build really rounds
    for ex in tiny mlp; do
        if ! "$mbtc" -I examples "tests/verify/${ex}_bf16.mbt" -o "$dir/${ex}_bf16" >"$out" 2>&1 \
            || ! "$dir/${ex}_bf16" train --steps 1 --data "$dir/d/t_train.bin" --dump-step "$dir/${ex}_bf16.safetensors" >"$out" 2>&1; then
            fail "verify/${ex}_bf16" "building or dumping the first step failed" "$out"
            continue
        fi
        if "$mbtc" -I examples "tests/verify/${ex}_bf16.mbt" --verify-step "$dir/${ex}_bf16.safetensors" >"$out" 2>&1 \
            && grep -q '^verify-step: ok' "$out"; then
            pass "verify/${ex}_bf16 ($(sed -n 's/^verify-step: ok (\(.*\);.*/\1/p' "$out"))"
        else
            fail "verify/${ex}_bf16" "the compiled bf16 step differs from the reference beyond bf16's tolerances" "$out"
        fi
        "$mbtc" "examples/$ex.mbt" --verify-step "$dir/${ex}_bf16.safetensors" >"$out" 2>&1
        if [ "$?" = 1 ] && grep -q '^verify-step: FAILED' "$out"; then pass "verify/${ex}_bf16-is-not-f32"
        else fail "verify/${ex}_bf16-is-not-f32" "the bf16 step passed as the f32 program's" "$out"; fi
    done
    local rc
    "$mbtc" tests/verify/mlp_gelu.mbt --verify-step "$dir/mlp.safetensors" >"$out" 2>&1
    rc=$?
    if [ "$rc" = 1 ] && grep -q '^verify-step: FAILED' "$out"; then pass verify/detects-wrong-math
    else fail verify/detects-wrong-math "relu's step held against gelu's program: status $rc, no FAILED" "$out"; fi
    "$mbtc" examples/mlp.mbt --verify-step "$dir/tiny.safetensors" >"$out" 2>&1
    rc=$?
    if [ "$rc" = 1 ] && grep -q "error: step dump .* holds micro-batches of 8 x 64 tokens, but this train block's are 32 x 64" "$out"; then
        pass verify/wrong-shape
    else fail verify/wrong-shape "status $rc" "$out"; fi
    "$mbtc" examples/mlp.mbt --verify-step "$dir/d/t_train.bin" >"$out" 2>&1
    rc=$?
    if [ "$rc" = 1 ] && grep -q "error: safetensors file" "$out"; then pass verify/not-a-dump
    else fail verify/not-a-dump "status $rc" "$out"; fi
}

# accum: gradient accumulation is exact. tests/accum/accum_4x4.mbt (micro 4, accumulation 4) and
# accum_16x1.mbt (micro 16, none) train tiny's model 5 steps with SGD on the same data: every
# step's loss agrees to 1e-6 relative, step 1's gradients and the weights after 5 steps to 1e-6
# norm-wise (||a - b|| / ||b||; f32 sums in another order differ in the last bits, and a per-entry
# measure would hold entries near zero to that). SGD rather than Adam: Adam divides each entry by
# its own running scale, so last-bit noise in a gradient that is zero in exact arithmetic (the
# attention key bias) becomes a full-size step and the weights part. A control: the trained
# weights against the initial ones must fail the same comparison.
run_accum() {
    local mbtc=$1 dir="$BUILD/tmp/accum" out c
    mkdir -p "$dir"
    out="$dir/out.txt"
    "$BUILD/mbt-gendata" --out-dir "$dir/d" --name t --tokens 100000 --val-tokens 20000 >"$out" 2>&1 || { fail accum/gendata "mbt-gendata failed" "$out"; return; }
    for c in 4x4 16x1; do
        if ! "$mbtc" -I examples "tests/accum/accum_$c.mbt" -o "$dir/accum_$c" >"$out" 2>&1 \
            || ! "$dir/accum_$c" train --data "$dir/d/t_train.bin" --log "$dir/$c.jsonl" --dump-step "$dir/step_$c.st" \
                --save-weights "$dir/w_$c.st" >"$out" 2>&1; then
            fail "accum/$c" "building or training accum_$c failed" "$out"
            return
        fi
    done
    local losses
    losses=$(paste -d' ' <(sed 's/.*"loss": \([0-9.e+-]*\).*/\1/' "$dir/4x4.jsonl") <(sed 's/.*"loss": \([0-9.e+-]*\).*/\1/' "$dir/16x1.jsonl"))
    if [ "$(echo "$losses" | wc -l)" = 5 ] && echo "$losses" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (!(d <= 1e-6 * $2)) bad = 1 } END { exit bad }'; then
        pass "accum/losses (5 steps within 1e-6)"
    else
        fail accum/losses "micro 4 x 4 and 16 x 1 losses differ by more than 1e-6: $(echo $losses)"
    fi
    if "$BUILD/tests/st_compare" "$dir/step_4x4.st" "$dir/step_16x1.st" grad: 1e-6 norm >"$out" 2>&1; then
        pass "accum/gradients ($(sed -n 's/.*, \(norm-wise [^;]*\);.*/\1/p' "$out"))"
    else fail accum/gradients "step 1's gradients differ" "$out"; fi
    if "$BUILD/tests/st_compare" "$dir/w_4x4.st" "$dir/w_16x1.st" "" 1e-6 norm >"$out" 2>&1; then
        pass "accum/weights ($(sed -n 's/.*, \(norm-wise [^;]*\);.*/\1/p' "$out"))"
    else fail accum/weights "the weights after 5 steps differ" "$out"; fi
    if ! "$BUILD/tests/st_compare" "$dir/w_4x4.st" "$dir/step_4x4.st" "" 1e-6 norm >"$out" 2>&1; then pass accum/control
    else fail accum/control "trained and initial weights compare equal: the comparison cannot fail" "$out"; fi
}

# torch: the PyTorch oracle (tests/torch/oracle.py, on bench/torch_gpt.py's model). PyTorch draws
# weights for examples/tiny.mbt's GPT-2 (tools/deps.sh test installs Debian's python3-torch), the
# compiled program starts from them (--init-weights) and dumps its first step (4 micro-batches),
# and PyTorch computes the same step in f32: loss to 1e-5, gradients to 1e-4 relative, and
# torch.optim.AdamW fed the same gradients to the update. Two controls must fail: the exact GELU
# for the tanh one (gradients), and weight decay 0 for 0.1 (the update).
run_torch() {
    local mbtc=$1 dir="$BUILD/tmp/torch" out py=/usr/bin/python3 rc
    if ! "$py" -c 'import torch' >/dev/null 2>&1; then
        skip torch "no PyTorch for /usr/bin/python3 (tools/deps.sh test installs python3-torch as root)"
        return
    fi
    mkdir -p "$dir"
    out="$dir/out.txt"
    "$BUILD/mbt-gendata" --out-dir "$dir/d" --name t --tokens 50000 --val-tokens 10000 >"$out" 2>&1 || { fail torch/gendata "mbt-gendata failed" "$out"; return; }
    if ! "$py" tests/torch/oracle.py init "$dir/w.safetensors" >"$out" 2>&1; then fail torch/init "oracle.py init failed" "$out"; return; fi
    if ! "$mbtc" examples/tiny.mbt -o "$dir/tiny" >"$out" 2>&1 \
        || ! "$dir/tiny" train --steps 1 --data "$dir/d/t_train.bin" --init-weights "$dir/w.safetensors" \
            --dump-step "$dir/step.safetensors" >"$out" 2>&1; then
        fail torch/dump "building tiny or dumping its first step failed" "$out"
        return
    fi
    if "$py" tests/torch/oracle.py check "$dir/step.safetensors" >"$out" 2>&1 && grep -q '^torch oracle: ok' "$out"; then
        pass "torch/tiny ($(sed -n 's/^torch oracle: ok (\(.*\);.*/\1/p' "$out"))"
    else
        fail torch/tiny "the compiled step differs from PyTorch's" "$out"
    fi
    "$py" tests/torch/oracle.py check "$dir/step.safetensors" --control-erf-gelu >"$out" 2>&1
    rc=$?
    if [ "$rc" = 1 ] && grep -q '^torch oracle: FAILED' "$out"; then pass torch/control-gelu
    else fail torch/control-gelu "a model with the exact GELU passed (status $rc)" "$out"; fi
    "$py" tests/torch/oracle.py check "$dir/step.safetensors" --weight-decay 0 >"$out" 2>&1
    rc=$?
    if [ "$rc" = 1 ] && grep -q '^torch oracle: FAILED' "$out"; then pass torch/control-decay
    else fail torch/control-decay "AdamW without weight decay passed (status $rc)" "$out"; fi
    run_hf_weights "$mbtc" "$dir/hf"
}

# Hugging Face weights as they are (tests/torch/hf_weights.py): examples/gpt2.mbt's and llama.mbt's
# parameter tables are HF's names and shapes; their models at a tiny size (tests/torch/hf_*.mbt)
# read HF-layout state dicts in F32, F16 and BF16 and print PyTorch's logits within 1e-4 relative,
# with controls that must fail (a transposed weight, a perturbed one, a wrong layout in the reference).
run_hf_weights() {
    local mbtc=$1 dir=$2 py=/usr/bin/python3 out m errs
    mkdir -p "$dir"
    out="$dir/out.txt"
    for m in gpt2 llama; do
        if "$mbtc" "examples/$m.mbt" --train "${m}_cpu" --emit=plan >"$dir/${m}_plan.txt" 2>"$out" \
            && "$py" tests/torch/hf_weights.py names "$m" "$dir/${m}_plan.txt" >"$out" 2>&1 && grep -q '^hf names: ok' "$out"; then
            pass "torch/hf-names-$m ($(sed -n '1s/, [0-9]* in HF.*//p' "$out") named and shaped as HF's)"
        else fail "torch/hf-names-$m" "examples/$m.mbt's parameters are not HF's" "$out"; fi
        if ! "$mbtc" -I examples "tests/torch/hf_$m.mbt" -o "$dir/hf_$m" >"$out" 2>&1; then
            fail "torch/hf-$m" "building tests/torch/hf_$m.mbt failed" "$out"
            continue
        fi
        if "$py" tests/torch/hf_weights.py check "$m" "$dir/hf_$m" "$dir" >"$out" 2>&1 && grep -q '^hf weights: ok' "$out"; then
            errs=$(sed -n 's/^ok *[a-z0-9]* \([A-Z0-9]*\): .*max error \([^ ]*\) .*/\1 \2/p' "$out" | paste -sd, - | sed 's/,/, /g')
            pass "torch/hf-$m (logit errors $errs; $(grep -c '^ok     control' "$out") controls fail as they must)"
        else fail "torch/hf-$m" "HF $m weights do not give PyTorch's logits" "$out"; fi
    done
    # a checkpoint mbt wrote, read by PyTorch: 2 steps of hf_gpt2 from the F32 weights
    "$BUILD/mbt-gendata" --vocab 96 --tokens 20000 --val-tokens 0 --out-dir "$dir/ckd" --name t >"$out" 2>&1
    rm -rf "$dir/ck"
    if "$dir/hf_gpt2" train --data "$dir/ckd/t_train.bin" --steps 2 --ckpt-every 2 --ckpt-dir "$dir/ck" \
        --init-weights "$dir/gpt2_f32.safetensors" >"$out" 2>&1 \
        && "$py" tests/torch/hf_weights.py ckpt gpt2 "$dir/hf_gpt2" "$dir/ck" "$dir/gpt2_f32.safetensors" >"$out" 2>&1 \
        && grep -q '^ckpt: ok' "$out"; then
        pass "torch/ckpt-to-pytorch ($(sed -n 's/.*match mbt.s: \(max error [^ ]*\).*/\1/p' "$out"); AdamW takes m and v)"
    else fail torch/ckpt-to-pytorch "PyTorch does not read mbt's checkpoint to the same numbers" "$out"; fi
}

# jfield FILE N KEY: the value of KEY in the Nth line (a JSON object) of a --log file.
jfield() { sed -n "${2}p" "$1" | sed -n 's/.*"'"$3"'": \([^,}]*\).*/\1/p'; }

# secs START_NS: seconds since START_NS, one decimal.
secs() { local ms=$((($(now_ns) - $1) / 1000000)); printf '%d.%d' $((ms / 1000)) $(((ms % 1000) / 100)); }

# exec/example: every train block of every example builds with `mbtc FILE --train NAME -o` (a
# full-size block, too big to train here, proves it compiles) into an executable whose --help
# names the block (the runtime checks the descriptor first), and every block that reads the
# README's tiny data (tokens("data/tiny_train.bin", ...): the CPU-size ones) trains 3 steps on
# mbt-gendata's corpus (DATA) with 3 finite losses in its --log. llama_cpu's log shows its
# ramp: 4 x 64 tokens at steps 1 and 2, twice that at step 3 (ramp = [(2, 8)]).
run_exec_examples() {
    local mbtc=$1 data=$2 dir="$BUILD/tmp/exec/examples" f ex t kind out log start bt rt n k l bad
    mkdir -p "$dir"
    if [ ! -f "$data" ]; then fail exec/example "no data file $data (exec/gendata failed)"; return; fi
    for f in examples/*.mbt; do
        [ -f "$f" ] || continue
        ex=$(basename "$f" .mbt)
        local runnable=0
        # each train block's name, and whether its body reads data/tiny_train.bin
        while read -r t kind; do
            out="$dir/$ex-$t.out"
            start=$(now_ns)
            if ! { timeout 300 "$mbtc" "$f" --train "$t" --cuda-arch="$CUDA_ARCHS" -o "$dir/$ex-$t" </dev/null >"$out" 2>&1; } 2>>"$out"; then
                fail "exec/example/$ex-$t" "mbtc $f --train $t -o failed" "$out"
                continue
            fi
            bt=$(secs "$start")
            # --help runs after the descriptor check (a bad descriptor is exit 2) and names the block
            if ! "$dir/$ex-$t" --help </dev/null >"$out" 2>&1 || ! grep -q "train block '$t'" "$out" \
                || { [ "$CUDA_ARCHS" != none ] && ! grep -q '^For the GPU: [0-9]* kernels; cubins sm_80, sm_90; PTX compute_90' "$out"; }; then
                fail "exec/example/$ex-$t" "the executable's --help fails, does not name train block '$t' or lists no GPU images" "$out"
                rm -f "$dir/$ex-$t"
                continue
            fi
            if [ "$kind" != run ]; then
                pass "exec/example/$ex-$t (builds: $bt s, its descriptor passes the runtime's check; not run: its data are not the tiny corpus)"
                rm -f "$dir/$ex-$t"
                continue
            fi
            runnable=1
            log="$dir/$ex-$t.jsonl"
            start=$(now_ns)
            if ! { timeout 600 "$dir/$ex-$t" train --steps 3 --data "$data" --log "$log" </dev/null >"$out" 2>&1; } 2>>"$out"; then
                fail "exec/example/$ex-$t" "train --steps 3 failed" "$out"
                continue
            fi
            rt=$(secs "$start")
            n=$(grep -c '"loss"' "$log")
            bad=""
            for k in 1 2 3; do
                l=$(jfield "$log" "$k" loss)
                if ! awk -v l="$l" 'BEGIN { exit !(l ~ /^-?[0-9][0-9.e+-]*$/ && l + 0 == l + 0) }'; then bad="$bad step $k: loss '$l';"; fi
            done
            if [ "$n" != 3 ]; then
                fail "exec/example/$ex-$t" "$n step records in the log, expected 3" "$log"
            elif [ -n "$bad" ]; then
                fail "exec/example/$ex-$t" "a loss that is not a finite number:$bad" "$log"
            else
                pass "exec/example/$ex-$t (builds: $bt s; 3 steps: $rt s; losses $(jfield "$log" 1 loss) $(jfield "$log" 2 loss) $(jfield "$log" 3 loss))"
            fi
            if [ "$ex-$t" = llama-llama_cpu ]; then
                local t1 t2 t3
                t1=$(jfield "$log" 1 tokens) t2=$(jfield "$log" 2 tokens) t3=$(jfield "$log" 3 tokens)
                if [ "$t1" = 256 ] && [ "$t2" = 256 ] && [ "$t3" = 512 ] && grep -q '^batch ramp: from step 3, 8 sequences a step (accumulation 2)$' "$out"; then
                    pass "exec/example/llama_cpu-ramp (tokens per step $t1, $t2, $t3)"
                else
                    fail exec/example/llama_cpu-ramp "tokens per step $t1, $t2, $t3, expected 256, 256, 512 (ramp = [(2, 8)]), or no 'batch ramp' line" "$out"
                fi
            fi
            rm -f "$dir/$ex-$t"
        done < <(LC_ALL=C awk '/^train[[:space:]]+[A-Za-z_][A-Za-z0-9_]*/ { t = $2; sub(/[^A-Za-z0-9_].*/, "", t); run = 0; next }
                              t != "" && /tokens\("data\/tiny_train\.bin"/ { run = 1 }
                              t != "" && /^}/ { print t, (run ? "run" : "build"); t = "" }' "$f")
        if [ $runnable = 0 ]; then fail "exec/example/$ex" "no train block of $f reads data/tiny_train.bin, so none runs here"; fi
    done
}

# exec/ramp: the blocks of tests/exec/ramp.mbt (see its header), each built with -o --train NAME,
# on DATA in file order (T = 16). ramp logs 64, 128 and 256 tokens a step. For k = 1, 2: ramp
# re-run from its own weights after k steps, on the shard from the window it had reached (a raw
# copy of the tokens from there), must log exactly - every printed digit of loss and gradient
# norm - what its step k + 1 logged, and that must be flat8's (k = 1) / flat16's (k = 2) first
# step from the same weights and window; ramp's base stage alone from there (`--steps 1`, i.e.
# without the ramp) must give another gradient norm, which shows the comparison can fail. dp2
# (micro 4 x 2 data ranks, run in one process) must log exactly flat8's losses and norms.
run_exec_ramp() {
    local mbtc=$1 data=$2 dir="$BUILD/tmp/exec/ramp" out t k start
    mkdir -p "$dir"
    out="$dir/out.txt"
    if [ ! -f "$data" ]; then fail exec/ramp "no data file $data (exec/gendata failed)"; return; fi
    start=$(now_ns)
    for t in ramp flat8 flat16 dp2; do
        "$mbtc" tests/exec/ramp.mbt --train "$t" -o "$dir/$t" >"$out" 2>&1 || { fail exec/ramp-build "mbtc tests/exec/ramp.mbt --train $t -o failed" "$out"; return; }
    done
    if "$mbtc" tests/exec/ramp.mbt --train nope -o "$dir/nope" >"$out" 2>&1; then
        fail exec/ramp-train-name "mbtc --train nope -o succeeded"
    elif grep -q "has no train block named 'nope'" "$out" && grep -q "its train blocks are: ramp, flat8, flat16, dp2" "$out" && [ ! -e "$dir/nope" ]; then
        pass exec/ramp-train-name
    else
        fail exec/ramp-train-name "mbtc --train nope -o: not the expected message" "$out"
    fi
    "$dir/ramp" --help | grep -q "train block 'ramp'" && "$dir/flat16" --help | grep -q "train block 'flat16'" \
        && pass exec/ramp-build || fail exec/ramp-build "an executable is not of the train block --train named"
    "$dir/ramp" train --data "$data" --log "$dir/ramp.jsonl" >"$out" 2>&1 || { fail exec/ramp "ramp train failed" "$out"; return; }
    local toks
    toks="$(jfield "$dir/ramp.jsonl" 1 tokens) $(jfield "$dir/ramp.jsonl" 2 tokens) $(jfield "$dir/ramp.jsonl" 3 tokens)"
    if [ "$toks" = "64 128 256" ]; then pass "exec/ramp-tokens ($toks)"; else fail exec/ramp-tokens "tokens per step '$toks', expected '64 128 256'" "$dir/ramp.jsonl"; fi
    for k in 1 2; do
        local win flat=flat8 want got base ok=1
        [ $k = 1 ] && win=4 || { win=12; flat=flat16; }
        "$dir/ramp" train --steps $k --data "$data" --save-weights "$dir/w$k.safetensors" >"$out" 2>&1 || { fail exec/ramp "ramp --steps $k failed" "$out"; return; }
        tail -c +$((1024 + win * 16 * 2 + 1)) "$data" >"$dir/from$win.bin"
        "$dir/$flat" train --steps 1 --data "$dir/from$win.bin" --init-weights "$dir/w$k.safetensors" --log "$dir/$flat.jsonl" >"$out" 2>&1 \
            || { fail exec/ramp "$flat from ramp's weights failed" "$out"; return; }
        "$dir/ramp" train --steps 1 --data "$dir/from$win.bin" --init-weights "$dir/w$k.safetensors" --log "$dir/base$k.jsonl" >"$out" 2>&1 \
            || { fail exec/ramp "ramp's base stage from its weights failed" "$out"; return; }
        want="$(jfield "$dir/ramp.jsonl" $((k + 1)) loss) $(jfield "$dir/ramp.jsonl" $((k + 1)) grad_norm)"
        got="$(jfield "$dir/$flat.jsonl" 1 loss) $(jfield "$dir/$flat.jsonl" 1 grad_norm)"
        base="$(jfield "$dir/base$k.jsonl" 1 loss) $(jfield "$dir/base$k.jsonl" 1 grad_norm)"
        [ "$want" = "$got" ] || ok=0
        [ "$(jfield "$dir/base$k.jsonl" 1 grad_norm)" != "$(jfield "$dir/$flat.jsonl" 1 grad_norm)" ] || ok=2
        if [ $ok = 1 ]; then pass "exec/ramp-step$((k + 1)) (ramp step $((k + 1)) = $flat step 1: loss, norm $got; without the ramp: $base)"
        elif [ $ok = 2 ]; then fail "exec/ramp-step$((k + 1))" "the base stage gives the same gradient norm as $flat ($base): the test cannot tell a ramp from none"
        else fail "exec/ramp-step$((k + 1))" "ramp's step $((k + 1)) logged loss, norm '$want' but $flat's first step from the same weights and window '$got'"; fi
    done
    "$dir/flat8" train --data "$data" --log "$dir/flat8-3.jsonl" >"$out" 2>&1 || { fail exec/ramp "flat8 failed" "$out"; return; }
    "$dir/dp2" train --data "$data" --log "$dir/dp2.jsonl" >"$out" 2>&1 || { fail exec/ramp "dp2 failed" "$out"; return; }
    local a b
    a=$(sed 's/"ms": [^,]*, //; s/, "tokens_per_s": [^}]*//' "$dir/flat8-3.jsonl")
    b=$(sed 's/"ms": [^,]*, //; s/, "tokens_per_s": [^}]*//' "$dir/dp2.jsonl")
    if [ "$a" = "$b" ] && [ "$(wc -l <"$dir/dp2.jsonl")" = 3 ] && grep -q "^data-parallel: the program's 2 data ranks run in this one process" "$out"; then
        pass "exec/ramp-data2 (dp2 = flat8 over 3 steps)"
    else
        fail exec/ramp-data2 "dp2's log differs from flat8's, or it has no 'data-parallel:' line" "$out"
    fi
    printf '# exec/ramp: %s s\n' "$(secs "$start")"
}

# exec, generation (after run_exec, whose data, mlp executable and weights it uses):
# tests/exec/gen_gpt.mbt, a small causal GPT, compiles without a warning and trains 30 steps; then
#   - greedy tokens are identical over two runs and --threads 1 and 2; sampled ones (temperature,
#     top-k) for one seed too, and another seed gives others; every id is below the vocabulary;
#   - the logits forward agrees with the training forward: --print-logits gives the logits after
#     each prefix of the 8 held-out windows one eval step reads, whose mean cross-entropy against
#     the next tokens must equal the loss `eval` computes on those windows (micro-batches of 4,
#     whole windows) to 1e-5 relative - which needs the right row, the right parameters and a
#     causal model;
#   - a prompt longer than the context slides: the logits after 40 tokens are those after their
#     last 32; generating after it works;
#   - gen_dropout.mbt (mlp.mbt's model with dropout 0.9) is refused by -o with a located error
#     (dropout's mask would repeat every step);
#   - gen_bidir.mbt (non-causal attention) and gen_nologits.mbt (no cross_entropy) compile with a
#     warning saying why they cannot generate, and gen_bidir's generate says so (exit 1);
#   - generate without --weights, with another model's weights, a file that is not safetensors and
#     a missing file each fail with exit 1 and their one-line message.
run_exec_generate() {
    local mbtc=$1 dir="$BUILD/tmp/exec" out d w prog
    out="$dir/gen-out.txt"
    d="$dir/d"
    w="$dir/gpt.safetensors"
    prog="$dir/gpt"
    if [ ! -f "$d/t_val.bin" ] || [ ! -x "$dir/mlp" ] || [ ! -f "$dir/w1.safetensors" ]; then
        fail exec/gen "no data, mlp executable or weights from the exec tests before it"
        return
    fi
    if ! "$mbtc" tests/exec/gen_gpt.mbt -o "$prog" >"$out" 2>&1; then fail exec/gen-build "mbtc -o failed" "$out"; return; fi
    if [ -s "$out" ]; then fail exec/gen-build "mbtc -o printed something (a warning?)" "$out"; return; fi
    pass exec/gen-build
    "$prog" train --data "$d/t_train.bin" --save-weights "$w" >"$out" 2>&1 || { fail exec/gen-train "train failed" "$out"; return; }

    # greedy and sampled tokens: repeatable, independent of the thread count, in the vocabulary
    local g1 g2 g3 s1 s2 s3 ok=1
    g1=$("$prog" generate --weights "$w" --prompt-tokens 1,2,3 --max-tokens 40 --temperature 0 --threads 1 2>"$out") || ok=0
    g2=$("$prog" generate --weights "$w" --prompt-tokens 1,2,3 --max-tokens 40 --temperature 0 --threads 2 2>>"$out") || ok=0
    g3=$("$prog" generate --weights "$w" --prompt-tokens 1,2,3 --max-tokens 40 --temperature 0 --threads 2 2>>"$out") || ok=0
    s1=$("$prog" generate --weights "$w" --max-tokens 60 --temperature 0.8 --top-k 10 --seed 7 --threads 1 2>>"$out") || ok=0
    s2=$("$prog" generate --weights "$w" --max-tokens 60 --temperature 0.8 --top-k 10 --seed 7 --threads 2 2>>"$out") || ok=0
    s3=$("$prog" generate --weights "$w" --max-tokens 60 --temperature 0.8 --top-k 10 --seed 8 --threads 2 2>>"$out") || ok=0
    if [ "$ok" = 0 ]; then fail exec/gen-generate "generate failed" "$out"; return; fi
    if [ "$g1" = "$g2" ] && [ "$g2" = "$g3" ]; then pass exec/gen-greedy-deterministic
    else fail exec/gen-greedy-deterministic "greedy tokens differ: '$g1' (1 thread), '$g2', '$g3' (2 threads)"; fi
    if [ "$s1" = "$s2" ] && [ "$s1" != "$s3" ]; then pass exec/gen-sampling-seeded
    else fail exec/gen-sampling-seeded "seed 7 on 1 and 2 threads: '$s1' / '$s2'; seed 8: '$s3'"; fi
    if printf '%s\n%s\n' "$g1" "$s1" | awk -v v=64 'NR == 1 && NF != 40 { exit 1 } NR == 2 && NF != 60 { exit 1 }
            { for (i = 1; i <= NF; i++) if ($i !~ /^[0-9]+$/ || $i + 0 >= v) exit 1 }'; then pass exec/gen-ids-in-vocab
    else fail exec/gen-ids-in-vocab "expected 40 and 60 ids below 64: '$g1' / '$s1'"; fi

    # the logits forward against the training forward: the held-out windows of 32 + 1 tokens one
    # eval step reads (M = its batches x micro-batch: 2 x 4)
    local T=32 M k prompt toks ce loss evalout
    evalout=$("$prog" eval --weights "$w" --data "$d/t_val.bin" --steps 1 2>"$out")
    loss=$(echo "$evalout" | sed -n 's/^eval small: loss \([0-9.]*\) .*/\1/p')
    M=$(echo "$evalout" | sed -n 's/.* on \([0-9]*\) batches of \([0-9]*\) x 32 tokens .*/\1 \2/p' | awk '{ print $1 * $2 }')
    if [ -z "$loss" ] || [ -z "$M" ] || [ "$M" = 0 ]; then fail exec/gen-logits "eval printed no loss or batch count: $evalout" "$out"; return; fi
    toks=($(od -An -v -tu2 -j1024 -N$(( (M * T + 1) * 2 )) "$d/t_val.bin"))
    : >"$dir/gen-logits.txt"
    : >"$dir/gen-next.txt"
    for ((k = 0; k < M; k++)); do
        prompt=$(IFS=,; echo "${toks[*]:k*T:T}")
        "$prog" generate --weights "$w" --prompt-tokens "$prompt" --print-logits >>"$dir/gen-logits.txt" 2>"$out" \
            || { fail exec/gen-logits "generate --print-logits failed" "$out"; return; }
        printf '%s\n' "${toks[@]:k*T+1:T}" >>"$dir/gen-next.txt"
    done
    ce=$(awk 'NR == FNR { y[FNR] = $1; next }
              NF != 64 { print "line " FNR " has " NF " logits"; exit }
              { m = $1; for (i = 2; i <= NF; i++) if ($i > m) m = $i
                s = 0; for (i = 1; i <= NF; i++) s += exp($i - m)
                ce += m + log(s) - $(y[FNR] + 1); n++ }
              END { if (n) printf "%.9f %d", ce / n, n }' "$dir/gen-next.txt" "$dir/gen-logits.txt")
    if [ "${ce#* }" != $((M * T)) ]; then fail exec/gen-logits "--print-logits: $ce (expected $((M * T)) rows)"
    elif awk -v a="${ce% *}" -v b="$loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }'; then
        pass "exec/gen-logits-match-training ($M windows: cross-entropy from the logits ${ce% *}, eval $loss)"
    else fail exec/gen-logits-match-training "cross-entropy from --print-logits ${ce% *} but eval's loss $loss"; fi

    # a prompt longer than the context: the last 32 of 40 tokens
    local long tail a b
    long=$(IFS=,; echo "${toks[*]:0:40}")
    tail=$(IFS=,; echo "${toks[*]:8:32}")
    a=$("$prog" generate --weights "$w" --prompt-tokens "$long" --print-logits 2>"$out" | tail -1)
    b=$("$prog" generate --weights "$w" --prompt-tokens "$tail" --print-logits 2>>"$out" | tail -1)
    g1=$("$prog" generate --weights "$w" --prompt-tokens "$long" --max-tokens 5 --temperature 0 2>>"$out")
    g2=$("$prog" generate --weights "$w" --prompt-tokens "$tail" --max-tokens 5 --temperature 0 2>>"$out")
    if [ -n "$a" ] && [ "$a" = "$b" ] && [ -n "$g1" ] && [ "$g1" = "$g2" ]; then pass exec/gen-long-prompt-slides
    else fail exec/gen-long-prompt-slides "40-token prompt vs its last 32: logits equal? $([ "$a" = "$b" ] && echo yes || echo no); tokens '$g1' vs '$g2'" "$out"; fi

    # dropout is refused by -o (its mask would repeat every step), with the source location
    if ! "$mbtc" tests/exec/gen_dropout.mbt -o "$dir/gen_dropout" >"$out" 2>&1 \
        && grep -q "gen_dropout.mbt:14:.*: error: dropout is not compiled into executables yet" "$out"; then
        pass exec/dropout-refused
    else fail exec/dropout-refused "mbtc -o built a program with dropout, or said something else" "$out"; fi

    # programs that cannot generate
    local want
    "$mbtc" tests/exec/gen_bidir.mbt -o "$dir/gen_bidir" >"$out" 2>&1
    want="tests/exec/gen_bidir.mbt:13:9: warning: train block 'bidir' compiles without generation: its attention is not causal, so a position's logits depend on the tokens after it"
    if [ -x "$dir/gen_bidir" ] && grep -qxF "$want" "$out"; then pass exec/gen-refuse-noncausal
    else fail exec/gen-refuse-noncausal "expected an executable and the warning: $want" "$out"; fi
    "$mbtc" tests/exec/gen_nologits.mbt -o "$dir/gen_nologits" >"$out" 2>&1
    want="mbtc: warning: train block 'regress' compiles without generation: its loss has no cross_entropy, so the model's output is not known to be logits of the next token"
    if [ -x "$dir/gen_nologits" ] && grep -qxF "$want" "$out"; then pass exec/gen-refuse-nologits
    else fail exec/gen-refuse-nologits "expected an executable and the warning: $want" "$out"; fi

    # run-time refusals: one line, exit 1
    echo "not safetensors" >"$dir/junk.safetensors"
    gen_error 0 "gen_bidir: this program cannot generate: it was compiled without a logits forward (mbtc warned why)" \
        "$dir/gen_bidir" generate --weights "$w"
    gen_error 1 "gpt: generate needs --weights F.safetensors (the program names no weights file)" "$prog" generate
    # another model's weights: every problem in one line, the first 20 listed
    local blk="" b
    for b in 0 1; do
        blk="$blk; missing 'h.$b.ln_1.weight' [32]; missing 'h.$b.ln_1.bias' [32]; missing 'h.$b.attn.c_attn.weight' [32, 96]"
        blk="$blk; missing 'h.$b.attn.c_attn.bias' [96]; missing 'h.$b.attn.c_proj.weight' [32, 32]; missing 'h.$b.attn.c_proj.bias' [32]"
        [ $b = 0 ] && blk="$blk; missing 'h.0.ln_2.weight' [32]; missing 'h.0.ln_2.bias' [32]; missing 'h.0.mlp.c_fc.weight' [32, 128]; missing 'h.0.mlp.c_fc.bias' [128]; missing 'h.0.mlp.c_proj.weight' [128, 32]; missing 'h.0.mlp.c_proj.bias' [32]"
    done
    gen_error 2 "gpt: weights file '$dir/w1.safetensors' does not fit the program (28 problems): missing 'wte' [64, 32]; missing 'wpe' [32, 32]$blk; and 8 more" \
        "$prog" generate --weights "$dir/w1.safetensors"
    gen_error 3 "gpt: safetensors file '$dir/junk.safetensors': header length 7306634592548843374 exceeds the limit of 100000000 bytes" "$prog" generate --weights "$dir/junk.safetensors"
    gen_error 4 "gpt: cannot open safetensors file '$dir/none.safetensors': No such file or directory" \
        "$prog" generate --weights "$dir/none.safetensors"
}

# gen_error N MESSAGE COMMAND...: COMMAND exits 1 having printed exactly MESSAGE (one line).
gen_error() {
    local n=$1 msg=$2 out="$BUILD/tmp/exec/gen-error.txt" rc
    shift 2
    "$@" >"$out" 2>&1
    rc=$?
    if [ "$rc" = 1 ] && [ "$(cat "$out")" = "$msg" ]; then pass "exec/gen-error-$n"
    else fail "exec/gen-error-$n" "'$*': exit $rc, expected 1 and: $msg" "$out"; fi
}

# ---- the layers ------------------------------------------------------------------------------

if [ "$UPDATE_GOLDEN" = 1 ]; then
    run_golden golden "$BUILD/mbtc" 0
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" = 0 ]
    exit
fi

# run_layer NAME COMMANDS...: the layer, timed, unless MBT_LAYERS leaves it out.
run_layer() {
    local name=$1
    shift
    if [ -n "${MBT_LAYERS:-}" ] && [[ ",$MBT_LAYERS," != *",$name,"* ]]; then return; fi
    layer_begin
    "$@"
    layer_end "$name"
}

layer_unit() { run_unit unit "$BUILD/tests"; }
# the GPU tests (tests/gpu/run.sh) on the emulated GPU: needs NVRTC (the executables' CUDA side)
layer_gpu_emu() {
    local probe="$BUILD/tmp/gpu-emu-probe.err"
    if ! "$BUILD/mbtc" --emit=ptx --cuda-arch=sm_80 tests/golden/mlp.mbt >/dev/null 2>"$probe" \
        && grep -q 'needs NVRTC, which is not installed' "$probe"; then
        skip gpu-emu "$(sed -n 's/.*not installed here: //p' "$probe" | head -n 1)"
        return
    fi
    run_relayed gpu-emu tests/cudaemu/check_attention.sh
    MBT_GPU_TEST_DEVICE=emu run_relayed gpu-emu tests/gpu/run.sh
}
layer_cuda() { run_cuda "$BUILD/mbtc" && run_cuda_embed "$BUILD/mbtc"; }
layer_diag() { run_diag diag "$BUILD/mbtc"; }
layer_check() { run_check check "$BUILD/mbtc"; }
layer_golden() { run_golden golden "$BUILD/mbtc" 1000; }
layer_pathological() { run_pathological pathological "$BUILD/mbtc" 1000 5; }
layer_exec() {
    run_exec "$BUILD/mbtc"
    run_exec_ramp "$BUILD/mbtc" "$BUILD/tmp/exec/d/t_train.bin"
    run_exec_examples "$BUILD/mbtc" "$BUILD/tmp/exec/d/t_train.bin"
    run_exec_generate "$BUILD/mbtc"
}
# ---- cuda ------------------------------------------------------------------------------------
# cuda_spilling FILE ALLOWED: the kernels of FILE's `# ptxas` lines (mbtc --cuda-info) whose spill
# stores, spill loads or stack frame are not 0 for some architecture, minus those whose name
# matches the extended regex ALLOWED ('' allows none). Prints one name a line.
cuda_spilling() {
    local allowed=${2:-'^$'}
    LC_ALL=C grep -a '^# ptxas ' "$1" | LC_ALL=C grep -aE '(^|[^0-9])[1-9][0-9]* B (spill stores|spill loads|stack)' \
        | LC_ALL=C sed 's/^# ptxas \([^:]*\):.*/\1/' | LC_ALL=C grep -avE "$allowed"
}

# Kernels allowed to spill, each with why: none. (The generated attention backward for k rows
# spilled ~100 B until attention became runtime/kernels/rt_attention.cuh's templates.)
CUDA_SPILL_OK=''

run_cuda() {
    local mbtc=$1 dir="$BUILD/tmp/cuda" f t name out err probe jobs=() names=() i rc bad n
    mkdir -p "$dir"
    probe="$dir/probe.err"
    if ! "$mbtc" --emit=ptx --cuda-arch=sm_80 tests/golden/mlp.mbt >/dev/null 2>"$probe"; then
        if grep -q 'needs NVRTC, which is not installed' "$probe"; then
            skip cuda "$(sed -n 's/.*not installed here: //p' "$probe" | head -n 1)"
        else
            fail cuda/probe "mbtc --emit=ptx failed" "$probe"
        fi
        return 1
    fi
    # two train blocks at a time (each mbtc runs NVRTC for sm_80 then sm_90)
    for f in examples/*.mbt; do
        for t in $(LC_ALL=C sed -n 's/^train[[:space:]]\{1,\}\([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' "$f"); do
            names+=("$(basename "$f" .mbt)-$t")
            { timeout 120 "$mbtc" --emit=kernels --cuda-info --cuda-arch=sm_80,sm_90 --train "$t" "$f" \
                >"$dir/$(basename "$f" .mbt)-$t.out" 2>"$dir/$(basename "$f" .mbt)-$t.err"; echo $? >"$dir/$(basename "$f" .mbt)-$t.rc"; } &
            jobs+=($!)
            if [ ${#jobs[@]} -ge 2 ]; then wait "${jobs[0]}"; jobs=("${jobs[@]:1}"); fi
        done
    done
    wait
    for name in "${names[@]}"; do
        out="$dir/$name.out"
        err="$dir/$name.err"
        rc=$(cat "$dir/$name.rc")
        n=$(LC_ALL=C grep -ac '^# ptxas ' "$out")
        bad=$(cuda_spilling "$out" "$CUDA_SPILL_OK" | tr '\n' ' ')
        if [ -n "$(describe_status "$rc")" ] || [ "$rc" != 0 ]; then
            fail "cuda/example/$name" "mbtc --emit=kernels --cuda-info exited with status $rc" "$err"
        elif [ -s "$err" ]; then
            fail "cuda/example/$name" "mbtc printed on stderr" "$err"
        elif [ "$n" = 0 ]; then
            fail "cuda/example/$name" "no '# ptxas' lines" "$out"
        elif [ -n "$bad" ]; then
            fail "cuda/example/$name" "ptxas reports spills in: $bad"
        else
            pass "cuda/example/$name ($n kernels, sm_80 and sm_90)"
        fi
    done
    # control: the check catches a kernel that spills or has a stack frame on one architecture only
    # (the lines as nvrtc_parse_ptxas's report prints them; test_cuda shows ptxas reporting spills)
    printf '%s\n' '# ptxas k_ok: sm_80 40 registers, 0 B spill stores, 0 B spill loads, 0 B stack, 0 B smem; sm_90 40 registers, 0 B spill stores, 0 B spill loads, 0 B stack, 0 B smem' \
        '# ptxas k_spill: sm_80 40 registers, 0 B spill stores, 0 B spill loads, 0 B stack, 0 B smem; sm_90 128 registers, 12 B spill stores, 16 B spill loads, 0 B stack, 0 B smem' \
        '# ptxas k_stack: sm_80 40 registers, 0 B spill stores, 0 B spill loads, 48 B stack, 0 B smem; sm_90 40 registers, 0 B spill stores, 0 B spill loads, 0 B stack, 0 B smem' >"$dir/control.out"
    if [ "$(cuda_spilling "$dir/control.out" '' | tr '\n' ' ')" = "k_spill k_stack " ] && [ -z "$(cuda_spilling "$dir/control.out" 'k_(spill|stack)$')" ]; then
        pass cuda/control-spill
    else
        fail cuda/control-spill "the spill check did not name exactly k_spill and k_stack" "$dir/control.out"
    fi
}

# Whether file $1 holds the bytes of file $2.
holds_bytes() {
    /usr/bin/python3 -c 'import sys; sys.exit(0 if open(sys.argv[2], "rb").read() in open(sys.argv[1], "rb").read() else 1)' "$1" "$2"
}

# -o embeds the CUDA program: the cubins of --dump-dir (the same translation unit, the same NVRTC)
# byte for byte, and the PTX of the highest architecture alone; --help says so. --cuda-arch=none
# embeds nothing. NVRTC's cache gives the cubins compiling gives. Without a GPU, --device cuda is an
# error naming why, and auto trains on the CPU saying why.
run_cuda_embed() {
    local mbtc=$1 dir="$BUILD/tmp/cuda/embed" out
    rm -rf "$dir"
    mkdir -p "$dir"
    out="$dir/out"
    if ! "$mbtc" examples/mlp.mbt --cuda-arch=sm_80,sm_90 -o "$dir/mlp" >"$out" 2>&1 || [ -s "$out" ] \
        || ! "$mbtc" --emit=cuda --cuda-arch=sm_80,sm_90 --dump-dir "$dir/dump" examples/mlp.mbt >/dev/null 2>"$out" \
        || ! MBT_CACHE_DIR=off "$mbtc" --emit=cuda --cuda-arch=sm_80,sm_90 --dump-dir "$dir/dump-nocache" examples/mlp.mbt >/dev/null 2>"$out"; then
        fail cuda/embed "mbtc -o or --dump-dir of examples/mlp.mbt failed (or printed)" "$out"
        return
    fi
    if holds_bytes "$dir/mlp" "$dir/dump/program.sm_80.cubin" && holds_bytes "$dir/mlp" "$dir/dump/program.sm_90.cubin" \
        && holds_bytes "$dir/mlp" "$dir/dump/program.sm_90.ptx"; then
        pass "cuda/embed/images (cubins sm_80, sm_90 and PTX compute_90 in the executable, byte for byte)"
    else
        fail cuda/embed/images "the executable lacks a cubin or the PTX that --dump-dir wrote"
    fi
    if holds_bytes "$dir/mlp" "$dir/dump/program.sm_80.ptx"; then
        fail cuda/embed/ptx-highest "the executable holds compute_80's PTX too (only the highest architecture's is embedded)"
    else
        pass cuda/embed/ptx-highest
    fi
    if cmp -s "$dir/dump/program.sm_90.cubin" "$dir/dump-nocache/program.sm_90.cubin" \
        && cmp -s "$dir/dump/program.sm_90.ptx" "$dir/dump-nocache/program.sm_90.ptx" \
        && [ -n "$(ls "$MBT_CACHE_DIR/nvrtc" 2>/dev/null)" ]; then
        pass cuda/embed/cache
    else
        fail cuda/embed/cache "the NVRTC cache is empty, or its cubin or PTX differs from a compilation without it"
    fi
    "$dir/mlp" --help >"$out" 2>&1
    if grep -q '^For the GPU: [0-9]* kernels; cubins sm_80, sm_90; PTX compute_90 (compiled for other GPUs on first use)$' "$out"; then
        pass cuda/embed/help
    else
        fail cuda/embed/help "--help does not list the embedded images" "$out"
    fi
    if ! "$mbtc" examples/mlp.mbt --cuda-arch=none -o "$dir/mlp-cpu" >"$out" 2>&1 || [ -s "$out" ]; then
        fail cuda/embed/none "mbtc --cuda-arch=none -o failed (or printed)" "$out"
    elif holds_bytes "$dir/mlp-cpu" "$dir/dump/program.sm_90.cubin" \
        || ! "$dir/mlp-cpu" --help 2>&1 | grep -q '^Built for the CPU alone'; then
        fail cuda/embed/none "--cuda-arch=none: the executable holds a cubin, or --help does not say it is for the CPU alone"
    else
        pass cuda/embed/none
    fi
}

layer_asan() {
    if [ "$QUICK" = 1 ]; then
        skip asan "MBT_QUICK=1"
    elif [ ! -x "$BUILD/asan/mbtc" ]; then
        skip asan "no $BUILD/asan/mbtc (make asan builds it)"
    else
        san_env
        run_unit asan/unit "$BUILD/asan/tests"
        run_diag asan/diag "$BUILD/asan/mbtc"
        run_check asan/check "$BUILD/asan/mbtc"
        run_golden asan/golden "$BUILD/asan/mbtc" 10000
        run_pathological asan/pathological "$BUILD/asan/mbtc" 10000 20
        unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
    fi
}
layer_fuzz() {
    if [ "$QUICK" = 1 ]; then
        skip fuzz "MBT_QUICK=1"
    elif [ ! -x "$BUILD/fuzz/fuzz_frontend" ] && [ ! -x "$BUILD/fuzz/fuzz_safetensors" ]; then
        skip fuzz "no $BUILD/fuzz/fuzz_frontend nor fuzz_safetensors (make fuzz-build builds them)"
    else
        run_fuzz
    fi
}

run_layer unit layer_unit
run_layer diag layer_diag
run_layer check layer_check
run_layer golden layer_golden
run_layer cuda layer_cuda
run_layer pathological layer_pathological
run_layer exec layer_exec
run_layer verify run_verify "$BUILD/mbtc"
run_layer accum run_accum "$BUILD/mbtc"
run_layer ckpt run_relayed ckpt tests/ckpt/run.sh
run_layer info run_relayed info tests/info/run.sh
run_layer gpu-selftest run_relayed gpu-selftest tests/gpu/selftest.sh
run_layer gpu-emu layer_gpu_emu
run_layer torch run_torch "$BUILD/mbtc"
run_layer asan layer_asan
run_layer fuzz layer_fuzz

summary
