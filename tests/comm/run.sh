#!/usr/bin/env bash
# tests/comm/run.sh BUILD - the collectives across processes (tests/run.sh's comm layer;
# docs/parallel.md). BUILD/tests/comm_check (tests/comm/comm_check.c) checks every collective's
# exact result with uneven shard sizes, run as 2 and 4 ranks of the tcp backend (started from a
# shell loop with torchrun's variables) and under `mpirun --oversubscribe -np 2|4` (the mpi
# backend); ZeRO-3's parameter region (comm_check --zero3) as 4 tcp and 2 mpi ranks. Then
# failures, with MBT_COMM_TIMEOUT=3: a rank that exits early, one killed with
# SIGKILL, one that hangs, ranks that call different collectives, a rendezvous nobody comes to,
# ranks that disagree on WORLD_SIZE; and a training executable started with a world size that
# is not its parallel.data; tcp ranks on two hosts (network namespaces: tests/comm/hosts.sh). Then
# srun and sbatch (tests/comm/slurm.sh). Prints `PASS comm/NAME`, `FAIL comm/NAME: why` (details
# indented) or, without mpirun, root or Slurm, `SKIP comm/mpi|hosts|slurm: why` for those parts.
set -u
if [ $# -lt 1 ]; then
    echo "usage: tests/comm/run.sh BUILD" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "$1" && pwd) || exit 2
cd "$ROOT" || exit 2
DIR="$BUILD/tmp/comm"
rm -rf "$DIR"
mkdir -p "$DIR" || exit 2
CHECK="$BUILD/tests/comm_check"
failed=0
pass() { echo "PASS comm/$1"; }
fail() {
    echo "FAIL comm/$1: $2"
    local f
    for f in "${@:3}"; do [ -f "$f" ] && tail -n 12 "$f" | sed 's/^/    /'; done
    failed=1
}
[ -x "$CHECK" ] || { fail setup "no $CHECK (make unit builds it)"; exit 1; }

# no launcher's variables from the environment this runs in
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT MBT_COMM OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK PMI_SIZE MBT_DEBUG
export MBT_COMM_TIMEOUT=3
TIMEOUT=3
# a port range of this run's own, so that runs side by side do not meet
PORT=$((20000 + ($$ % 2000) * 10))
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# tcp_run NAME P ARGS...: P ranks of comm_check ARGS with torchrun's variables; rank r's output in
# DIR/NAME.r, its exit status in DIR/NAME.r.rc; DIR/NAME.ms: how long until all had exited
# (a rank still running 3 x the timeout later is killed, status 124)
tcp_run() {
    local name=$1 P=$2 r pids=() start
    shift 2
    PORT=$((PORT + 1))
    start=$(now_ms)
    for ((r = 0; r < P; r++)); do
        (
            RANK=$r WORLD_SIZE=$P LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
                timeout -s KILL $((3 * TIMEOUT + 5)) "$@" >"$DIR/$name.$r" 2>&1
            echo $? >"$DIR/$name.$r.rc"
        ) 2>/dev/null & # (bash's own "Killed" notes: the kill tests mean them)
        pids+=($!)
    done
    wait "${pids[@]}" 2>/dev/null
    echo $(($(now_ms) - start)) >"$DIR/$name.ms"
}
rc_of() { cat "$DIR/$1.$2.rc"; }

# ---- tcp: every collective exact ----------------------------------------------------------------
# (with MBT_DEBUG=1: each rank's table of the collectives, 4 calls of exchange_shards; with
# MBT_TRACE: each rank's Chrome trace, 24 events)
for P in 2 4; do
    MBT_DEBUG=1 MBT_TRACE="$DIR/trace-$P.json" tcp_run tcp-$P $P "$CHECK"
    bad=""
    for ((r = 0; r < P; r++)); do
        [ "$(rc_of tcp-$P $r)" = 0 ] && grep -q "^rank $r of $P (tcp): ok, [0-9]* values checked" "$DIR/tcp-$P.$r" \
            && grep -q "^\[rank $r\] collectives: rank $r of $P, tcp, timeout 3 s$" "$DIR/tcp-$P.$r" \
            && grep -qE "^\[rank $r\]   exchange_shards +4 " "$DIR/tcp-$P.$r" \
            && grep -qE "^\[rank $r\]   broadcast +8 " "$DIR/tcp-$P.$r" \
            && grep -qxF "trace: $DIR/trace-$P.comm-rank$r.json" "$DIR/tcp-$P.$r" \
            && [ "$(grep -c '"name":"exchange_shards","ph":"X"' "$DIR/trace-$P.comm-rank$r.json")" = 4 ] \
            && [ "$(grep -c '"ph":"X"' "$DIR/trace-$P.comm-rank$r.json")" = 24 ] || bad="$bad $r"
    done
    if [ -z "$bad" ]; then pass "tcp-$P ($(grep -h -o '[0-9]* values' "$DIR"/tcp-$P.[0-9] | awk '{s += $1} END {print s}') values checked)"
    else fail tcp-$P "ranks$bad failed" "$DIR"/tcp-$P.[0-9]; fi
done

# ---- tcp: ZeRO-3's parameter region (runtime/comm/zero3.h; comm_check --zero3) -------------------
# 4 ranks, 100000 floats in 30 ranges of uneven lengths: each range holds the owners' values after
# its need (a page given back while a neighbouring range was gathered into it reads zeros: the
# check fails so when the per-page hold count is removed, measured), and each rank's resident
# high-water mark lies between its shard and its shard plus two ranges and four pages.
tcp_run tcp-zero3 4 "$CHECK" --zero3 100000
bad=""
for ((r = 0; r < 4; r++)); do
    [ "$(rc_of tcp-zero3 $r)" = 0 ] && grep -q "^rank $r of 4 (tcp): zero3 ok, [0-9]* values checked" "$DIR/tcp-zero3.$r" || bad="$bad $r"
done
if [ -z "$bad" ]; then pass "tcp-zero3 ($(sed -n 's/^rank 0 of 4 (tcp): zero3 ok, //p' "$DIR/tcp-zero3.0"))"
else fail tcp-zero3 "ranks$bad failed" "$DIR"/tcp-zero3.[0-9]; fi

# ---- tcp: failures ------------------------------------------------------------------------------
# fails_fast NAME P VICTIM REGEX: every rank but VICTIM exited 1, some rank's output matches
# REGEX, and all were done well before the timeout (the failure was seen, not waited out)
fails_fast() {
    local name=$1 P=$2 victim=$3 re=$4 r bad="" ms
    for ((r = 0; r < P; r++)); do
        [ "$r" = "$victim" ] && continue
        [ "$(rc_of "$name" $r)" = 1 ] || bad="$bad $r:$(rc_of "$name" $r)"
    done
    ms=$(cat "$DIR/$name.ms")
    if [ -n "$bad" ]; then fail "$name" "ranks (rank:status)$bad did not exit 1" "$DIR"/$name.[0-9]
    elif ! grep -qE "$re" "$DIR"/$name.[0-9]; then fail "$name" "no rank said /$re/" "$DIR"/$name.[0-9]
    elif [ "$ms" -ge $((TIMEOUT * 1000)) ]; then fail "$name" "took $ms ms, not less than the timeout (${TIMEOUT} s)" "$DIR"/$name.[0-9]
    else pass "$name ($ms ms: $(grep -hoE "$re" "$DIR"/$name.[0-9] | head -n 1))"; fi
}
tcp_run tcp-die 4 "$CHECK" --die 2
fails_fast tcp-die 4 2 "lost its connection to rank 2|rank 2 closed its connection"
tcp_run tcp-kill 4 "$CHECK" --kill 1
if [ "$(rc_of tcp-kill 1)" != 137 ]; then fail tcp-kill "rank 1 was not killed (status $(rc_of tcp-kill 1))" "$DIR/tcp-kill.1"
else fails_fast tcp-kill 4 1 "lost its connection to rank 1|rank 1 closed its connection"; fi
# (an EOF or a reset, whichever the kernel delivers first: both name rank 0, as tcp-die and tcp-kill accept)
tcp_run tcp-kill0 3 "$CHECK" --kill 0
fails_fast tcp-kill0 3 0 "lost its connection to rank 0 in exchange_shards|rank 0 closed its connection while rank [12] of 3 waited in exchange_shards"
tcp_run tcp-mismatch 4 "$CHECK" --mismatch 2
fails_fast tcp-mismatch 4 -1 "rank [013] is in exchange_shards \(call 1, [0-9]+ bytes\) while rank 2 is in broadcast \(call 1, 8 bytes\): the ranks called different collectives"

# a rank that hangs: the others time out after MBT_COMM_TIMEOUT, naming the collective and the rank
name=tcp-hang
tcp_run $name 3 "$CHECK" --hang 2
bad=""
for r in 0 1; do
    [ "$(rc_of $name $r)" = 1 ] && grep -qE "rank $r of 3 timed out after 3(\.[0-9]+)? s waiting in exchange_shards for rank 2 \(nothing came from it" "$DIR/$name.$r" || bad="$bad $r"
done
if [ -n "$bad" ]; then fail $name "ranks$bad did not time out as expected" "$DIR"/$name.[01]
else pass "$name ($(grep -ho 'timed out after [0-9.]* s waiting in exchange_shards for rank 2' "$DIR/$name.0"))"; fi

# the rendezvous: rank 0 alone, rank 1 alone, ranks that disagree on the world's size
name=tcp-alone0
PORT=$((PORT + 1))
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$CHECK" >"$DIR/$name" 2>&1
rc=$?
re="timed out waiting at port $PORT for the other ranks \(0 of 1 came\)"
if [ $rc = 1 ] && grep -qE "$re" "$DIR/$name"; then pass "$name"; else fail $name "status $rc, expected 1 and /$re/" "$DIR/$name"; fi
name=tcp-alone1
PORT=$((PORT + 1))
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$CHECK" >"$DIR/$name" 2>&1
rc=$?
re="cannot connect to rank 0 \(MASTER_ADDR:MASTER_PORT\) at 127.0.0.1:$PORT before the timeout: Connection refused"
if [ $rc = 1 ] && grep -qE "$re" "$DIR/$name"; then pass "$name"; else fail $name "status $rc, expected 1 and /$re/" "$DIR/$name"; fi
name=tcp-world-size
PORT=$((PORT + 1))
(RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$CHECK" >"$DIR/$name.1" 2>&1) &
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$CHECK" >"$DIR/$name.0" 2>&1
rc=$?
wait
re="rank 1 says WORLD_SIZE is 3, rank 0 says 2"
if [ $rc = 1 ] && grep -q "$re" "$DIR/$name.0"; then pass "$name"; else fail $name "status $rc, expected 1 and '$re'" "$DIR/$name.0"; fi
name=tcp-env
RANK=2 WORLD_SIZE=2 "$CHECK" >"$DIR/$name" 2>&1
rc=$?
re="RANK is '2': it must be a whole number from 0 to 1"
if [ $rc = 1 ] && grep -q "$re" "$DIR/$name"; then pass "$name"; else fail $name "status $rc, expected 1 and '$re'" "$DIR/$name"; fi

# ---- a training executable: the world's size against parallel.data, one rank printing -----------
"$BUILD/mbt-gendata" --out-dir "$DIR/d" --name t --tokens 50000 --val-tokens 0 >"$DIR/gendata.out" 2>&1 || fail setup "mbt-gendata failed" "$DIR/gendata.out"
"$BUILD/mbtc" tests/exec/ramp.mbt --train dp2 -o "$DIR/dp2" >"$DIR/mbtc.out" 2>&1 || fail setup "mbtc -o failed" "$DIR/mbtc.out"
DATA="$DIR/d/t_train.bin"
name=tcp-train-size
tcp_run $name 3 "$DIR/dp2" train --steps 2 --data "$DATA"
want="dp2: this program trains with parallel.data = 2 ranks; torchrun (WORLD_SIZE) started 3 (start as many processes as parallel.data)"
if [ "$(rc_of $name 0)$(rc_of $name 1)$(rc_of $name 2)" != 111 ]; then fail $name "the ranks did not all exit 1" "$DIR"/$name.[0-2]
elif [ "$(cat "$DIR"/$name.[0-2])" != "$want" ]; then fail $name "expected exactly one line from all three: $want" "$DIR"/$name.[0-2]
else pass "$name"; fi
name=tcp-train
tcp_run $name 2 "$DIR/dp2" train --steps 2 --data "$DATA"
if [ "$(rc_of $name 0)$(rc_of $name 1)" != 00 ]; then fail $name "a rank failed" "$DIR"/$name.[01]
elif ! grep -q "^train dp2: .*; seed 1337; 2 processes (tcp, started by torchrun (WORLD_SIZE))$" "$DIR/$name.0"; then
    fail $name "rank 0's start-up line does not name the world" "$DIR/$name.0"
elif [ -s "$DIR/$name.1" ]; then fail $name "rank 1 printed something" "$DIR/$name.1"
else pass "$name"; fi

# ---- a training run that loses a rank, or is asked to stop ----------------------------------------
# bg_start NAME P ARGS...: P ranks of ARGS with torchrun's variables in the background, rank r's pid
# in BGPID[r] (the process itself: kill -9 reaches it), its output in DIR/NAME.r
bg_start() {
    local name=$1 P=$2 r
    shift 2
    PORT=$((PORT + 1))
    BGPID=()
    for ((r = 0; r < P; r++)); do
        (RANK=$r WORLD_SIZE=$P LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT exec "$@" >"$DIR/$name.$r" 2>&1) 2>/dev/null &
        BGPID+=($!)
    done
}
# wait_for FILE SECONDS: until FILE exists (status 1 when it did not in time)
wait_for() {
    local i
    for ((i = 0; i < $2 * 20; i++)); do
        [ -e "$1" ] && return 0
        sleep 0.05
    done
    return 1
}
# bg_wait PID SECONDS: PID's exit status, or 124 after killing it when it runs longer
bg_wait() {
    local i
    for ((i = 0; i < $2 * 20; i++)); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.05
    done
    kill -0 "$1" 2>/dev/null && { kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; return 124; }
    wait "$1" 2>/dev/null
}
# the step of a checkpoint directory's `latest` (step-000000K0 -> K0)
latest_step() { sed -n 's/.*step-0*\([0-9][0-9]*\).*/\1/p' "$1/latest" 2>/dev/null | head -n 1; }
# resumed_ok NAME CKDIR LAUNCH...: resume CKDIR's latest to 5 steps past it, as LAUNCH says (alone or
# tcp ranks), and compare the weights with an uninterrupted run of one process to that step (dp2
# has one micro-batch a rank: the ranks' tree is one process's, so the bytes must be equal)
resumed_ok() {
    local name=$1 ck=$2 k end
    shift 2
    k=$(latest_step "$ck")
    [ -n "$k" ] || { fail $name "no checkpoint in $ck" "$ck/latest"; return; }
    end=$((k + 5))
    [ -e "$DIR/ref-$end.st" ] || MBT_COMM=self "$DIR/dp2" train --steps $end --data "$DATA" --ckpt-dir "$DIR/ref-$end.ck" \
        --save-weights "$DIR/ref-$end.st" >"$DIR/ref-$end.out" 2>&1
    if [ "$1" = alone ]; then
        MBT_COMM=self "$DIR/dp2" train --steps $end --data "$DATA" --resume "$ck/step-$(printf %08d "$k")" \
            --ckpt-dir "$DIR/$name.ck" --save-weights "$DIR/$name.st" >"$DIR/$name.0" 2>&1
    else
        "$@" $name 2 "$DIR/dp2" train --steps $end --data "$DATA" --resume "$ck/step-$(printf %08d "$k")" \
            --ckpt-dir "$DIR/$name.ck" --save-weights "$DIR/$name.st"
    fi
    if ! grep -q "^resumed from '.*step-$(printf %08d "$k")': step $k done" "$DIR/$name.0"; then fail $name "did not resume step $k" "$DIR/$name.0"
    elif ! cmp -s "$DIR/ref-$end.st" "$DIR/$name.st"; then fail $name "weights at step $end differ from an uninterrupted run's" "$DIR/$name.0" "$DIR/ref-$end.out"
    else pass "$name (step $k to $end)"; fi
}
# kill -9 of rank 1 during training (after its first checkpoint): rank 0 stops at once, naming it
name=tcp-train-kill
bg_start $name 2 "$DIR/dp2" train --steps 1000000 --data "$DATA" --ckpt-every 20 --ckpt-dir "$DIR/$name.ck"
if ! wait_for "$DIR/$name.ck/latest" 60; then fail $name "no checkpoint after 60 s" "$DIR/$name.0"; kill -9 "${BGPID[@]}" 2>/dev/null
else
    sleep 0.2
    start=$(now_ms)
    kill -9 "${BGPID[1]}"
    bg_wait "${BGPID[1]}" 5
    bg_wait "${BGPID[0]}" $((TIMEOUT + 5))
    rc=$?
    ms=$(($(now_ms) - start))
    if [ $rc = 0 ] || [ $rc = 124 ]; then fail $name "rank 0's status is $rc" "$DIR/$name.0"
    elif ! grep -qE "dp2: .*rank 0 of 2 lost its connection to rank 1 .*(exited, crashed or was killed)|rank 1 closed its connection while rank 0 of 2 waited" "$DIR/$name.0"; then
        fail $name "rank 0 did not say it lost rank 1" "$DIR/$name.0"
    elif [ $ms -ge $((TIMEOUT * 1000 + 2000)) ]; then fail $name "rank 0 took $ms ms to stop" "$DIR/$name.0"
    else pass "$name ($ms ms: $(grep -oE 'rank 1 closed its connection|lost its connection to rank 1' "$DIR/$name.0" | head -n 1))"; fi
    resumed_ok tcp-train-kill-resume-alone "$DIR/$name.ck" alone
    resumed_ok tcp-train-kill-resume-2 "$DIR/$name.ck" tcp_run
fi
# SIGTERM to rank 1 alone: its signal travels with the step's loss gather, so both ranks stop after
# the same step; rank 0 writes one checkpoint of it and both exit 0
name=tcp-train-term
bg_start $name 2 "$DIR/dp2" train --steps 1000000 --data "$DATA" --ckpt-every 1000000 --ckpt-dir "$DIR/$name.ck" --log "$DIR/$name.jsonl"
if ! wait_for "$DIR/$name.jsonl" 60; then fail $name "no log after 60 s" "$DIR/$name.0"; kill -9 "${BGPID[@]}" 2>/dev/null
else
    sleep 0.5
    kill -TERM "${BGPID[1]}"
    bg_wait "${BGPID[1]}" 30
    rc1=$?
    bg_wait "${BGPID[0]}" 30
    rc0=$?
    k=$(sed -n 's/^stopped by SIGTERM (to rank 1; every rank stops here) after step \([0-9]*\);.*/\1/p' "$DIR/$name.0")
    if [ "$rc0$rc1" != 00 ]; then fail $name "statuses $rc0 $rc1, expected 0 0" "$DIR/$name.0" "$DIR/$name.1"
    elif [ -z "$k" ]; then fail $name "rank 0 did not say it stopped by rank 1's SIGTERM" "$DIR/$name.0"
    elif [ "$(latest_step "$DIR/$name.ck")" != "$k" ] || [ "$(ls "$DIR/$name.ck" | grep -c '^step-')" != 1 ]; then
        fail $name "expected the one checkpoint step-$k" "$DIR/$name.0"
    elif [ "$(grep -c '"loss"' "$DIR/$name.jsonl")" != "$k" ]; then fail $name "the log has not $k steps" "$DIR/$name.jsonl"
    else pass "$name (both after step $k)"; fi
    resumed_ok tcp-train-term-resume-alone "$DIR/$name.ck" alone
fi

# ---- two hosts: the tcp ranks in two network namespaces (tests/comm/hosts.sh) --------------------
. tests/comm/hosts.sh

# ---- mpi ------------------------------------------------------------------------------------------
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP comm/mpi: mpirun is not installed (tools/deps.sh installs openmpi-bin as root)"
    exit $failed
fi
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# mpi_run NAME NP ARGS...: mpirun --oversubscribe -np NP ARGS; DIR/NAME (output), .rc, .ms
mpi_run() {
    local name=$1 np=$2 start
    shift 2
    start=$(now_ms)
    timeout -s KILL $((3 * TIMEOUT + 20)) mpirun --oversubscribe -np "$np" "$@" >"$DIR/$name" 2>&1
    echo $? >"$DIR/$name.rc"
    echo $(($(now_ms) - start)) >"$DIR/$name.ms"
}
for P in 2 4; do
    mpi_run mpi-$P $P "$CHECK"
    n=$(grep -c "^rank [0-9] of $P (mpi (Open MPI [0-9.]*)): ok, [0-9]* values checked" "$DIR/mpi-$P")
    if [ "$(cat "$DIR/mpi-$P.rc")" = 0 ] && [ "$n" = "$P" ]; then pass "mpi-$P ($(grep -o 'mpi (Open MPI [0-9.]*)' "$DIR/mpi-$P" | head -n 1))"
    else fail mpi-$P "status $(cat "$DIR/mpi-$P.rc"), $n of $P ranks ok" "$DIR/mpi-$P"; fi
done
mpi_run mpi-zero3 2 "$CHECK" --zero3 100000
n=$(grep -c "^rank [0-9] of 2 (mpi (Open MPI [0-9.]*)): zero3 ok, [0-9]* values checked" "$DIR/mpi-zero3")
if [ "$(cat "$DIR/mpi-zero3.rc")" = 0 ] && [ "$n" = 2 ]; then pass "mpi-zero3 ($(sed -n 's/^rank 0 of 2 ([^)]*)): zero3 ok, //p' "$DIR/mpi-zero3"))"
else fail mpi-zero3 "status $(cat "$DIR/mpi-zero3.rc"), $n of 2 ranks ok" "$DIR/mpi-zero3"; fi
# a rank killed or gone: mpirun itself notices and stops the job (its own message), well before
# the timeout
for how in kill die; do
    name=mpi-$how
    mpi_run $name 4 "$CHECK" --$how 1
    rc=$(cat "$DIR/$name.rc")
    ms=$(cat "$DIR/$name.ms")
    if [ "$rc" = 0 ]; then fail $name "mpirun's status is 0" "$DIR/$name"
    elif ! grep -q "process rank 1 with PID" "$DIR/$name"; then fail $name "mpirun did not name rank 1" "$DIR/$name"
    elif [ "$ms" -ge $((TIMEOUT * 1000 + 2000)) ]; then fail $name "took $ms ms" "$DIR/$name"
    else pass "$name ($ms ms)"; fi
done
name=mpi-hang
mpi_run $name 3 "$CHECK" --hang 2
n=$(grep -cE "rank [01] of 3 timed out after 3(\.[0-9]+)? s waiting in exchange_shards for the other ranks" "$DIR/$name")
if [ "$(cat "$DIR/$name.rc")" != 0 ] && [ "$n" -ge 1 ]; then pass "$name ($(cat "$DIR/$name.ms") ms)"
else fail $name "status $(cat "$DIR/$name.rc"), $n ranks timed out" "$DIR/$name"; fi
name=mpi-train-size
mpi_run $name 3 "$DIR/dp2" train --steps 2 --data "$DATA"
want="dp2: this program trains with parallel.data = 2 ranks; mpirun started 3 (start as many processes as parallel.data)"
if [ "$(cat "$DIR/$name.rc")" = 0 ]; then fail $name "mpirun's status is 0" "$DIR/$name"
elif [ "$(grep -c "parallel.data" "$DIR/$name")" != 1 ] || ! grep -qxF "$want" "$DIR/$name"; then fail $name "expected once: $want" "$DIR/$name"
else pass "$name"; fi
name=mpi-train
mpi_run $name 2 "$DIR/dp2" train --steps 2 --data "$DATA"
if [ "$(cat "$DIR/$name.rc")" != 0 ]; then fail $name "status $(cat "$DIR/$name.rc")" "$DIR/$name"
elif [ "$(grep -c "^train dp2: .*; seed 1337; 2 processes (mpi (Open MPI [0-9.]*), started by mpirun)$" "$DIR/$name")" != 1 ]; then
    fail $name "the start-up line is not there exactly once" "$DIR/$name"
else pass "$name"; fi
# the training run under mpirun: rank 1 killed with SIGKILL after the first checkpoint (mpirun stops
# the job, naming it), then asked to stop with SIGTERM to rank 1 alone (both ranks stop after the
# same step, mpirun's status 0); each checkpoint resumed
# mpi_rank_pid MPIRUN_PID R: the pid of rank R among mpirun's children (its OMPI_COMM_WORLD_RANK)
mpi_rank_pid() {
    local p i
    for ((i = 0; i < 200; i++)); do
        for p in $(pgrep -P "$1"); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
                echo "$p"
                return 0
            fi
        done
        sleep 0.05
    done
    return 1
}
name=mpi-train-kill
mpirun --oversubscribe -np 2 "$DIR/dp2" train --steps 1000000 --data "$DATA" --ckpt-every 20 --ckpt-dir "$DIR/$name.ck" >"$DIR/$name.0" 2>&1 &
mpid=$!
if ! r1=$(mpi_rank_pid $mpid 1) || ! wait_for "$DIR/$name.ck/latest" 60; then fail $name "no rank 1 or no checkpoint after 60 s" "$DIR/$name.0"; kill -9 $mpid 2>/dev/null
else
    sleep 0.2
    start=$(now_ms)
    kill -9 "$r1"
    bg_wait $mpid $((TIMEOUT + 10))
    rc=$?
    ms=$(($(now_ms) - start))
    if [ $rc = 0 ] || [ $rc = 124 ]; then fail $name "mpirun's status is $rc" "$DIR/$name.0"
    elif ! grep -q "process rank 1 with PID" "$DIR/$name.0"; then fail $name "mpirun did not name rank 1" "$DIR/$name.0"
    elif [ $ms -ge $((TIMEOUT * 1000 + 2000)) ]; then fail $name "took $ms ms" "$DIR/$name.0"
    else pass "$name ($ms ms)"; fi
    resumed_ok mpi-train-kill-resume-alone "$DIR/$name.ck" alone
fi
name=mpi-train-term
mpirun --oversubscribe -np 2 "$DIR/dp2" train --steps 1000000 --data "$DATA" --ckpt-every 1000000 --ckpt-dir "$DIR/$name.ck" --log "$DIR/$name.jsonl" >"$DIR/$name.0" 2>&1 &
mpid=$!
if ! r1=$(mpi_rank_pid $mpid 1) || ! wait_for "$DIR/$name.jsonl" 60; then fail $name "no rank 1 or no log after 60 s" "$DIR/$name.0"; kill -9 $mpid 2>/dev/null
else
    sleep 0.5
    kill -TERM "$r1"
    bg_wait $mpid 30
    rc=$?
    k=$(sed -n 's/^stopped by SIGTERM (to rank 1; every rank stops here) after step \([0-9]*\);.*/\1/p' "$DIR/$name.0")
    if [ "$rc" != 0 ]; then fail $name "mpirun's status is $rc" "$DIR/$name.0"
    elif [ -z "$k" ]; then fail $name "rank 0 did not say it stopped by rank 1's SIGTERM" "$DIR/$name.0"
    elif [ "$(latest_step "$DIR/$name.ck")" != "$k" ] || [ "$(ls "$DIR/$name.ck" | grep -c '^step-')" != 1 ]; then
        fail $name "expected the one checkpoint step-$k" "$DIR/$name.0"
    else pass "$name (both after step $k)"; fi
    resumed_ok mpi-train-term-resume-alone "$DIR/$name.ck" alone
fi

# ---- Slurm: srun and sbatch on a cluster of this run's own (tests/comm/slurm.sh) ----------------
. tests/comm/slurm.sh
exit $failed
