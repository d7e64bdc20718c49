#!/usr/bin/env bash
# tests/ckpt/run.sh BUILD - checkpoints and resuming (tests/run.sh's ckpt layer), on
# tests/ckpt/ckpt.mbt (a bigram MLP with accumulation, a warm-up schedule and a checkpoint block)
# trained on mbt-gendata's corpus. Prints `PASS ckpt/NAME` or `FAIL ckpt/NAME: why` with details
# indented below; exit status 1 when anything failed.
#
# The reference is one uninterrupted run of 2N steps. Every interrupted run - kill -9 at random
# moments, kill -9 in the middle of writing a checkpoint, SIGTERM - is resumed with `--resume
# latest` until it reaches 2N, and must give byte-identical final weights and, step for step,
# the same losses as the reference (each step's loss as logged, across the killed and the resumed
# runs). Then failures: a full disk (a file-size limit), another program's checkpoint, damaged
# files, a held lock.
set -u
if [ $# -lt 1 ]; then
    echo "usage: tests/ckpt/run.sh BUILD" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "$1" && pwd) || exit 2
cd "$ROOT" || exit 2
# MBT_CKPT_MBTC: the compiler that builds the programs (the asan layer's BUILD/asan/mbtc, whose
# executables run under ASan + UBSan; its files then go to BUILD/tmp/asan-ckpt)
MBTC=${MBT_CKPT_MBTC:-$BUILD/mbtc}
DIR="$BUILD/tmp/ckpt"
[ -z "${MBT_CKPT_MBTC:-}" ] || DIR="$BUILD/tmp/asan-ckpt"
rm -rf "$DIR"
mkdir -p "$DIR" || exit 2
failed=0
pass() { echo "PASS ckpt/$1"; }
fail() {
    echo "FAIL ckpt/$1: $2"
    [ $# -ge 3 ] && [ -f "$3" ] && tail -n 15 "$3" | sed 's/^/    /'
    failed=1
}

STEPS=400 # 2N
OUT="$DIR/out.txt"
"$BUILD/mbt-gendata" --out-dir "$DIR/d" --name t --tokens 200000 --val-tokens 0 >"$OUT" 2>&1 || { fail setup "mbt-gendata failed" "$OUT"; exit 1; }
DATA="$DIR/d/t_train.bin"
"$MBTC" tests/ckpt/ckpt.mbt -o "$DIR/ck" >"$OUT" 2>&1 || { fail setup "mbtc -o failed" "$OUT"; exit 1; }
PROG="$DIR/ck"
cd "$DIR" || exit 2

# the losses of a JSONL log as "step loss" lines, one per step (a step logged twice - by a run
# killed after it and by the run that resumed before it - must have logged the same loss twice)
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" | sort -n -u; }

train() { "$PROG" train --data "$DATA" --threads 1 --steps "$STEPS" "$@"; }

if ! train --ckpt-every 0 --log ref.jsonl --save-weights ref.st >"$OUT" 2>&1; then
    fail reference "the uninterrupted run failed" "$OUT"
    exit 1
fi
losses ref.jsonl >ref.losses

# same_as_reference NAME RUN: RUN's final weights (RUN.st) and logged losses (RUN.jsonl) are the
# reference's: the same bytes, and every logged step's loss the reference's for that step
same_as_reference() {
    local name=$1 run=$2 n dup
    losses "$run.jsonl" >"$run.losses"
    n=$(wc -l <"$run.losses")
    dup=$(cut -d' ' -f1 "$run.losses" | uniq -d | head -n 3 | tr '\n' ' ')
    if [ -n "$dup" ]; then
        fail "$name" "steps $dup were logged with different losses by the killed and the resumed run"
    elif ! cmp -s "$run.st" ref.st; then
        fail "$name" "the final weights differ from the uninterrupted run's"
    elif [ "$n" != "$STEPS" ] || ! diff -q "$run.losses" ref.losses >/dev/null; then
        fail "$name" "the losses differ from the uninterrupted run's ($n steps logged)" "$OUT"
        diff "$run.losses" ref.losses | head -n 6 | sed 's/^/    /'
    else
        pass "$name"
    fi
}

# resume_to_end RUN: resumes RUN's checkpoints until the run is complete (a kill may leave no
# checkpoint yet: the run then starts again)
resume_to_end() {
    local run=$1
    local resume=(--resume latest)
    [ -f "$run.ckpt/latest" ] || resume=()
    train --ckpt-dir "$run.ckpt" --ckpt-every 10 "${resume[@]}" --log "$run.jsonl" --save-weights "$run.st" >>"$OUT" 2>&1
}

# ---- kill -9 at random moments, resume ----------------------------------------------------------
for k in 1 2 3 4; do
    run="kill$k"
    delay_ms=$((50 + RANDOM % 700))
    : >"$OUT"
    "$PROG" train --data "$DATA" --threads 1 --steps "$STEPS" --ckpt-dir "$run.ckpt" --ckpt-every 10 --log "$run.jsonl" >"$OUT" 2>&1 &
    pid=$!
    sleep "$(printf '0.%03d' "$delay_ms")"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    done_steps=$(losses "$run.jsonl" | tail -n 1 | cut -d' ' -f1)
    if ! resume_to_end "$run"; then
        fail "kill-9-after-${delay_ms}ms" "resuming failed" "$OUT"
        continue
    fi
    same_as_reference "kill-9-after-${delay_ms}ms (killed after step ${done_steps:-0}, resumed from $(sed -n "s/^resumed from '.*\/\(step-[0-9]*\)'.*/\1/p" "$OUT" | head -n 1))" "$run"
done

# ---- kill -9 in the middle of a checkpoint's write ----------------------------------------------
# MBT_TEST_KILL_IN_CHECKPOINT=3: the process SIGKILLs itself while writing its 3rd checkpoint (step
# 30), after model.safetensors and before the rest: a half-written step-00000030.tmp.PID is left.
run=killwrite
: >"$OUT"
MBT_TEST_KILL_IN_CHECKPOINT=3 train --ckpt-dir "$run.ckpt" --ckpt-every 10 --ckpt-sync --log "$run.jsonl" >"$OUT" 2>&1
rc=$?
leftover=$(ls -d "$run.ckpt"/step-00000030.tmp.* 2>/dev/null | head -n 1)
if [ "$rc" != 137 ] || [ -z "$leftover" ] || [ "$(head -n 1 "$run.ckpt/latest" 2>/dev/null)" != step-00000020 ]; then
    fail kill-9-during-write "expected death by SIGKILL (status 137, got $rc) with a half-written step 30 and latest at step 20" "$OUT"
else
    if resume_to_end "$run" && [ ! -e "$leftover" ]; then
        same_as_reference "kill-9-during-write (resumed from step 20; the half-written step 30 removed)" "$run"
    else
        fail kill-9-during-write "resuming failed or left the half-written directory" "$OUT"
    fi
fi

# resume-log-no-duplicate: the killed run above logged steps 21-30 before dying, and the run that
# resumed from step 20 did them again: its --log keeps the file's lines up to step 20 and adds its
# own, so each step is in the log once (steps 21-30 were there twice), each checkpoint line too
dups=$(sed -n 's/^{"step": \([0-9]*\), "loss".*/\1/p' "$run.jsonl" | sort -n | uniq -d | head -n 5 | tr '\n' ' ')
ckdups=$(sed -n 's/^{"step": \([0-9]*\), "checkpoint".*/\1/p' "$run.jsonl" | sort -n | uniq -d | head -n 5 | tr '\n' ' ')
nlogged=$(grep -c '^{"step": [0-9]*, "loss"' "$run.jsonl")
if [ -n "$dups$ckdups" ]; then
    fail resume-log-no-duplicate "the resumed run's log has steps ${dups}${ckdups:+and checkpoints $ckdups}twice"
elif [ "$nlogged" != "$STEPS" ]; then
    fail resume-log-no-duplicate "the resumed run's log has $nlogged step lines, not $STEPS"
else
    pass "resume-log-no-duplicate (killed after step 30, resumed from 20: $nlogged step lines, each step once)"
fi

# ---- SIGTERM: finish the step, checkpoint, exit 0 -----------------------------------------------
run=sigterm
: >"$OUT"
"$PROG" train --data "$DATA" --threads 1 --steps "$STEPS" --ckpt-dir "$run.ckpt" --ckpt-every 0 --log "$run.jsonl" >"$OUT" 2>&1 &
pid=$!
# SIGTERM once the first step is logged (not after a fixed delay: the whole run can take less
# than any delay on an idle machine, and more than it to start on a loaded one)
for _ in $(seq 1 1000); do
    [ -s "$run.jsonl" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
done
kill -TERM "$pid"
wait "$pid"
rc=$?
stopped=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\);.*/\1/p' "$OUT")
if [ "$rc" != 0 ] || [ -z "$stopped" ] || [ "$(head -n 1 "$run.ckpt/latest" 2>/dev/null)" != "$(printf 'step-%08d' "$stopped")" ]; then
    fail sigterm "expected exit 0 with 'stopped by SIGTERM after step N' and a checkpoint of step N (status $rc)" "$OUT"
elif resume_to_end "$run"; then
    same_as_reference "sigterm (stopped after step $stopped, exit 0, resumed)" "$run"
else
    fail sigterm "resuming failed" "$OUT"
fi

# ---- keep ---------------------------------------------------------------------------------------
kept=$(ls -d kill1.ckpt/step-* 2>/dev/null | wc -l)
if [ "$kept" = 2 ] && [ -d kill1.ckpt/step-00000400 ] && [ -d kill1.ckpt/step-00000390 ]; then
    pass "keep (the program's keep = 2: steps 390 and 400 are left)"
else
    fail keep "expected exactly step-00000390 and step-00000400, found: $(ls kill1.ckpt | tr '\n' ' ')"
fi

# ---- the program's checkpoint block, and a full disk --------------------------------------------
# The block says every = 10, dir = "ckpt", on_error = "continue"; the optimizer file is ~100 KB,
# so a 64 KB file-size limit makes every write fail with EFBIG.
: >"$OUT"
if train --steps 20 >"$OUT" 2>&1 && [ "$(head -n 1 ckpt/latest 2>/dev/null)" = step-00000020 ]; then
    pass "program-block (every = 10 and dir = \"ckpt\" from the program)"
else
    fail program-block "no checkpoint in ckpt/ after 20 steps with the program's own settings" "$OUT"
fi
cp -r ckpt ckpt.before
(ulimit -f 64; train --steps 40 --resume latest >"$OUT" 2>&1)
rc=$?
if [ "$rc" = 0 ] && grep -q "warning: checkpoint at step 30 failed: .*File too large; earlier checkpoints are untouched; training goes on" "$OUT" \
    && [ "$(head -n 1 ckpt/latest)" = step-00000020 ] && diff -r ckpt/step-00000020 ckpt.before/step-00000020 >/dev/null \
    && [ -z "$(ls -d ckpt/*.tmp.* 2>/dev/null)" ]; then
    pass "disk-full-continue (on_error = \"continue\": a warning, training goes on, step 20 untouched)"
else
    fail disk-full-continue "expected a warning at step 30, exit 0, latest still step 20 and unchanged (status $rc)" "$OUT"
fi
sed 's/on_error = "continue"/on_error = "stop"/' "$ROOT/tests/ckpt/ckpt.mbt" >stop.mbt
if "$MBTC" -I "$ROOT/examples" stop.mbt -o stop >"$OUT" 2>&1; then
    (ulimit -f 64; ./stop train --data "$DATA" --threads 1 --steps 40 --resume latest >"$OUT" 2>&1)
    rc=$?
    if [ "$rc" = 1 ] && grep -q "checkpoint at step 30 failed: .*File too large; earlier checkpoints are untouched; stopping" "$OUT" \
        && [ "$(head -n 1 ckpt/latest)" = step-00000020 ] && diff -r ckpt/step-00000020 ckpt.before/step-00000020 >/dev/null \
        && train --steps 40 --resume latest >"$OUT.resume" 2>&1; then
        pass "disk-full-stop (the default: exit 1 with the reason; step 20 untouched and resumable)"
    else
        fail disk-full-stop "expected exit 1 naming the failure, step 20 untouched and resumable (status $rc)" "$OUT"
    fi
else
    fail disk-full-stop "mbtc -o failed" "$OUT"
fi

# ---- refusals -----------------------------------------------------------------------------------
# expect_refusal NAME PATTERN CMD...: CMD exits 1 with a message matching PATTERN and no crash
expect_refusal() {
    local name=$1 pattern=$2 rc
    shift 2
    "$@" >"$OUT" 2>&1
    rc=$?
    if [ "$rc" = 1 ] && grep -qE -e "$pattern" "$OUT"; then pass "$name"
    else fail "$name" "expected exit 1 and a message matching '$pattern' (status $rc)" "$OUT"; fi
}

CK=kill1.ckpt/step-00000400
sed 's/lr = 1e-2/lr = 3e-2/' "$ROOT/tests/ckpt/ckpt.mbt" >other_lr.mbt
sed 's/hidden = 128/hidden = 96/; s/d = 32,/d = 24,/' "$ROOT/tests/ckpt/ckpt.mbt" >other_shape.mbt
for v in other_lr other_shape; do "$MBTC" -I "$ROOT/examples" "$v.mbt" -o "$v" >"$OUT" 2>&1 || fail "$v" "mbtc -o failed" "$OUT"; done
expect_refusal refuse-other-hash "is not of this program: the compiled step differs \(program hash xxh3-128:[0-9a-f]{32}, here xxh3-128:[0-9a-f]{32}\)" \
    ./other_lr train --data "$DATA" --steps 410 --resume "$CK"
expect_refusal refuse-other-shapes "is not of this program: 'emb.weight' has another shape; 'fc1.weight' has another shape; .*--resume-weights-only" \
    ./other_shape train --data "$DATA" --steps 410 --resume "$CK"
: >"$OUT"
if ./other_lr train --data "$DATA" --steps 3 --resume-weights-only "$CK" --ckpt-every 0 >"$OUT" 2>&1 \
    && grep -q "weights from checkpoint '$CK'; the optimizer, the step and the data start afresh" "$OUT" && grep -q "^step 3/3" "$OUT"; then
    pass "resume-weights-only (another learning rate: the weights taken, steps 1-3 run)"
else
    fail resume-weights-only "expected steps 1 to 3 from the checkpoint's weights" "$OUT"
fi
expect_refusal refuse-seed "--seed 5, but checkpoint '.*' was trained with seed 1337" train --resume "$CK" --seed 5
expect_refusal refuse-no-latest "--resume latest: no checkpoint in 'empty.ckpt' \(no file 'latest'\)" train --resume latest --ckpt-dir empty.ckpt

# damaged checkpoints: each a message naming the problem, no crash
damage() { rm -rf bad && cp -r "$CK" bad; }
damage && truncate -s -100 bad/model.safetensors
expect_refusal damaged-truncated "model.safetensors' is [0-9]+ bytes, but state.json says [0-9]+: it was truncated or changed" train --resume bad --steps 410
damage && printf '\x7f' | dd of=bad/optimizer.safetensors bs=1 seek=5000 conv=notrunc status=none
expect_refusal damaged-flipped-byte "optimizer.safetensors' fails its checksum \(xxh3-128 [0-9a-f]{32}, state.json says [0-9a-f]{32}\)" train --resume bad --steps 410
damage && sed -i 's/"step": 400,/"step": 400,,/' bad/state.json
expect_refusal damaged-json "checkpoint state 'bad/state.json' at byte [0-9]+: string or '}' expected near ','" train --resume bad --steps 410
damage && sed -i 's/"version": 2/"version": 7/' bad/state.json
expect_refusal damaged-version "version 7, but this runtime reads version 2" train --resume bad --steps 410
damage && sed -i 's/"fingerprint": "[0-9a-f]*"/"fingerprint": "zz"/' bad/state.json
expect_refusal damaged-position "the step, the seed or the data position is missing or malformed" train --resume bad --steps 410
damage && : >bad/state.json
expect_refusal damaged-empty-state "checkpoint state 'bad/state.json' at byte 0: unexpected token near end of file" train --resume bad --steps 410
# state.json is under its own checksum: a digit of the step or of the data position changed is
# refused (it would resume to other weights), and so is a state.json without its checksum; the
# same checkpoint untouched resumes to the reference's weights, byte for byte
damage && sed -i 's/^  "step": 400,/  "step": 390,/' bad/state.json
expect_refusal state-json-step-digit "checkpoint state 'bad/state.json' fails its checksum \(xxh3-128 [0-9a-f]{32}, it says [0-9a-f]{32}\): it was changed or damaged" \
    train --resume bad --steps 410
damage && sed -i 's/"window": \([0-9]*\)/"window": 1\1/' bad/state.json
expect_refusal state-json-window-digit "checkpoint state 'bad/state.json' fails its checksum" train --resume bad --steps 410
damage && sed -i -z 's/,\n  "state_xxh3_128": "[0-9a-f]*"//' bad/state.json
expect_refusal state-json-no-checksum "checkpoint state 'bad/state.json' has no checksum of itself \(state_xxh3_128\)" train --resume bad --steps 410
rm -rf good390 && cp -r kill1.ckpt/step-00000390 good390
: >"$OUT"
if train --resume good390 --ckpt-dir good.ckpt --ckpt-every 10 --save-weights good.st >"$OUT" 2>&1 && cmp -s good.st ref.st; then
    pass "state-json-untouched (step 390 resumed to step 400: the reference's weights, byte for byte)"
else
    fail state-json-untouched "resuming the untouched step 390 did not give the reference's weights" "$OUT"
fi
mkdir -p badroot && echo "../../etc" >badroot/latest
expect_refusal damaged-latest "'badroot/latest' does not name a checkpoint" train --resume badroot --steps 410
# `latest` carries the XXH3-128 of the state.json it names: a pointer changed to name another
# (complete) checkpoint, a changed digit of its checksum, or a pointer without one is refused;
# the same pointer untouched resumes
ptr() { rm -rf ptr && mkdir ptr && cp -r kill1.ckpt/step-00000390 kill1.ckpt/step-00000400 kill1.ckpt/latest ptr/; }
ptr
: >"$OUT"
if [ "$(wc -l <ptr/latest)" = 2 ] && grep -qE '^state\.json xxh3-128 [0-9a-f]{32}$' ptr/latest \
    && train --resume ptr --steps 410 --ckpt-dir ptr.out >"$OUT" 2>&1 && grep -q "^step 410/410" "$OUT"; then
    pass "latest-untouched (its second line is the checksum; the pointer is followed)"
else
    fail latest-untouched "expected latest to hold a name and a checksum, and to resume" "$OUT"
fi
ptr && sed -i '1s/step-00000400/step-00000390/' ptr/latest
expect_refusal latest-names-other "'ptr/latest' names 'step-00000390', but its state.json has xxh3-128 [0-9a-f]{32} where the pointer records [0-9a-f]{32}: the pointer or the checkpoint was damaged or changed" \
    train --resume ptr --steps 410
ptr && awk 'NR == 2 { c = substr($0, length($0)); $0 = substr($0, 1, length($0) - 1) (c == "0" ? "1" : "0") } { print }' kill1.ckpt/latest >ptr/latest
expect_refusal latest-checksum-digit "'ptr/latest' names 'step-00000400', but its state.json has xxh3-128" \
    train --resume ptr --steps 410
ptr && head -n 1 kill1.ckpt/latest >ptr/latest
expect_refusal latest-no-checksum "'ptr/latest' names 'step-00000400' but does not hold its checksum" \
    train --resume latest --ckpt-dir ptr --steps 410
ptr && rm ptr/step-00000400/state.json
expect_refusal latest-state-missing "'ptr/latest' names 'step-00000400': cannot open checkpoint state 'ptr/step-00000400/state.json'" \
    train --resume ptr --steps 410
"$BUILD/mbt-gendata" --out-dir d2 --name t --tokens 200000 --val-tokens 0 --seed 9 >/dev/null 2>&1
expect_refusal other-data "the training data are not those it was trained on: file 1, 'd2/t_train.bin' \([0-9]+ bytes\), is not '.*t_train.bin'" \
    "$PROG" train --data d2/t_train.bin --threads 1 --steps 410 --resume "$CK"

# one writer per directory
if command -v flock >/dev/null; then
    mkdir -p locked.ckpt
    expect_refusal lock "another run is writing checkpoints to 'locked.ckpt'" \
        flock locked.ckpt/.lock "$PROG" train --data "$DATA" --steps 1 --ckpt-dir locked.ckpt --ckpt-every 1
    # refused at the start even when only a SIGTERM would write a checkpoint (--ckpt-every 0)
    expect_refusal lock-at-start "another run is writing checkpoints to 'locked.ckpt' \(it holds 'locked.ckpt/.lock'\)" \
        flock locked.ckpt/.lock "$PROG" train --data "$DATA" --steps 20 --ckpt-dir locked.ckpt --ckpt-every 0
else
    echo "SKIP ckpt/lock: no flock(1)"
fi

# a regular file as the checkpoint directory: refused at the start, not at the first checkpoint
: >afile
expect_refusal ckpt-dir-file "the checkpoint directory 'afile' is a file, not a directory" \
    train --steps 20 --ckpt-dir afile --ckpt-every 0

exit $failed
