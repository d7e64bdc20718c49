# tests/comm/slurm.sh - the comm layer's Slurm part, sourced by tests/comm/run.sh after its mpi part
# (it uses run.sh's DIR, DATA, TIMEOUT, dp2 and helpers). It starts a Slurm cluster of its own on
# this machine - munged, slurmctld and slurmd with a configuration, key, socket, ports and state
# under DIR/slurm, named to the tools by SLURM_CONF, so nothing of the system's is read or
# changed - and launches the training executable with srun (docs/parallel.md, "Launching"):
#   slurm-pmix       srun --mpi=pmix -n 2: the mpi backend through PMIx, one process's bytes
#   slurm-tcp        srun -n 2 with MASTER_ADDR/MASTER_PORT: the tcp rendezvous, rank SLURM_PROCID
#   slurm-none       srun -n 2 without PMIx or MASTER_*: every task refuses before any work
#   slurm-batch      a batch script's own shell (SLURM_NTASKS=2, no step): runs alone
#   slurm-train-kill kill -9 of task 1 under srun: the step ends within the timeout; resume alone
# Root and Debian's slurmd, slurmctld, slurm-client, munge and libpmix-dev (tools/deps.sh test
# installs them as root) are needed; without them, or when the cluster does not start here, it
# prints SKIP comm/slurm and why (with the daemons' logs).

slurm_skip() { echo "SKIP comm/slurm: $1"; }
# The cluster itself would not start (this machine's environment, not the executable): SKIP, with the logs.
slurm_skip_log() {
    echo "SKIP comm/slurm: the test's Slurm cluster did not start: $1"
    local f
    for f in "${@:2}"; do [ -f "$f" ] && tail -n 6 "$f" | sed 's/^/    /'; done
}
slurm_main() {
    local t
    if [ "$(id -u)" != 0 ]; then slurm_skip "needs root (slurmd runs the tasks as their user)"; return; fi
    for t in munged mungekey slurmctld slurmd srun sbatch sinfo; do
        command -v $t >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v $t >/dev/null 2>&1 \
            || { slurm_skip "$t is not installed (tools/deps.sh test installs slurmd, slurmctld, slurm-client and munge)"; return; }
    done
    export PATH=$PATH:/usr/sbin
    local S="$DIR/slurm" host port
    host=$(hostname -s)
    port=$((40000 + ($$ % 1000) * 4))
    mkdir -p "$S/ctld" "$S/d" || return
    # munge: a key and a socket of this run's own
    mungekey --create --keyfile="$S/munge.key" >"$S/munge.out" 2>&1 || { slurm_skip_log "mungekey failed" "$S/munge.out"; return; }
    munged --force --key-file="$S/munge.key" --socket="$S/munge.sock" --pid-file="$S/munged.pid" \
        --log-file="$S/munged.log" --seed-file="$S/munge.seed" >>"$S/munge.out" 2>&1 \
        || { slurm_skip_log "munged did not start" "$S/munge.out" "$S/munged.log"; return; }
    cat >"$S/slurm.conf" <<EOF
ClusterName=mbttest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$S/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/d
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=mbt Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
    export SLURM_CONF="$S/slurm.conf"
    slurmctld >"$S/slurmctld.out" 2>&1 && slurmd >"$S/slurmd.out" 2>&1 \
        || { slurm_skip_log "slurmctld or slurmd did not start" "$S/slurmctld.out" "$S/slurmd.out" "$S/slurmctld.log" "$S/slurmd.log"; return; }
    local i state=""
    for ((i = 0; i < 100; i++)); do
        state=$(sinfo -h -o %t 2>/dev/null)
        [ "$state" = idle ] && break
        sleep 0.2
    done
    [ "$state" = idle ] || { slurm_skip_log "the node is '$state', not idle, after 20 s" "$S/slurmctld.log" "$S/slurmd.log"; return; }
    pass "slurm-cluster ($(srun --version), node $host idle)"

    # one process's weights after 10 steps (dp2 has one micro-batch a rank: the same bytes at 1 and 2 ranks)
    [ -e "$DIR/alone-10.st" ] || MBT_COMM=self "$DIR/dp2" train --steps 10 --data "$DATA" --save-weights "$DIR/alone-10.st" \
        >"$DIR/alone-10.out" 2>&1 || fail slurm-alone "dp2 alone failed" "$DIR/alone-10.out"
    # srun_same NAME WORLD ENV...: srun -n 2 (ENV before it, e.g. MASTER_ADDR=...; --mpi=pmix as SRUN_MPI
    # says) trains 10 steps; rank 0's start-up line names WORLD and the weights are one process's
    srun_same() {
        local name=$1 world=$2 rc
        shift 2
        env "$@" timeout -s KILL 120 srun -n 2 ${SRUN_MPI:+--mpi=$SRUN_MPI} "$DIR/dp2" train --steps 10 --data "$DATA" \
            --save-weights "$DIR/$name.st" >"$DIR/$name.0" 2>&1
        rc=$?
        if [ $rc != 0 ]; then fail $name "srun's status is $rc" "$DIR/$name.0"
        elif ! grep -q "^train dp2: .*; seed 1337; 2 processes ($world)$" "$DIR/$name.0"; then
            fail $name "rank 0's start-up line does not say '2 processes ($world)'" "$DIR/$name.0"
        elif ! cmp -s "$DIR/alone-10.st" "$DIR/$name.st"; then fail $name "weights differ from one process's" "$DIR/$name.0"
        else pass "$name (2 tasks, one process's bytes)"; fi
    }
    SRUN_MPI=pmix srun_same slurm-pmix "mpi (Open MPI [0-9.]*), started by srun"
    srun_same slurm-tcp "tcp, started by srun (MASTER_ADDR)" MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 2))

    local name rc
    name=slurm-none
    local want="dp2: collectives: srun started 2 tasks without PMIx (srun --mpi=none, Slurm's default), so no task can find the others and each would train alone: give srun --mpi=pmix (Open MPI), or set MASTER_ADDR and MASTER_PORT for the tcp rendezvous (the rank is SLURM_PROCID)"
    timeout -s KILL 60 srun -n 2 "$DIR/dp2" train --steps 10 --data "$DATA" --save-weights "$DIR/$name.st" >"$DIR/$name.0" 2>&1
    rc=$?
    if [ $rc = 0 ]; then fail $name "srun's status is 0" "$DIR/$name.0"
    elif [ "$(grep -cxF "$want" "$DIR/$name.0")" != 2 ]; then fail $name "not both tasks said: $want" "$DIR/$name.0"
    elif [ -e "$DIR/$name.st" ]; then fail $name "a weights file was written" "$DIR/$name.0"
    else pass "$name (both tasks refused: srun status $rc)"; fi

    name=slurm-batch
    printf '#!/bin/sh\nexec "%s" train --steps 10 --data "%s" --save-weights "%s"\n' "$DIR/dp2" "$DATA" "$DIR/$name.st" >"$S/batch.sh"
    timeout -s KILL 120 sbatch --wait -n 2 -o "$DIR/$name.0" "$S/batch.sh" >"$DIR/$name.sbatch" 2>&1
    rc=$?
    if [ $rc != 0 ]; then fail $name "sbatch --wait's status is $rc" "$DIR/$name.sbatch" "$DIR/$name.0"
    elif ! grep -q "^data-parallel: the program's 2 data ranks run in this one process" "$DIR/$name.0"; then
        fail $name "the batch script's process did not run alone" "$DIR/$name.0"
    elif ! cmp -s "$DIR/alone-10.st" "$DIR/$name.st"; then fail $name "weights differ from one process's" "$DIR/$name.0"
    else pass "$name (SLURM_NTASKS=2 without a step: alone)"; fi

    # kill -9 of task 1 after the first checkpoint: the step ends well within the timeout, not waited out
    name=slurm-train-kill
    srun -n 2 --mpi=pmix "$DIR/dp2" train --steps 1000000 --data "$DATA" --ckpt-every 20 --ckpt-dir "$DIR/$name.ck" \
        >"$DIR/$name.0" 2>&1 &
    local spid=$! r1="" p start ms
    if wait_for "$DIR/$name.ck/latest" 60; then
        for p in $(pgrep -f "$DIR/dp2 train --steps 1000000"); do
            tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=1" && r1=$p
        done
    fi
    if [ -z "$r1" ]; then fail $name "no checkpoint or no task 1 after 60 s" "$DIR/$name.0"; kill -9 $spid 2>/dev/null
    else
        sleep 0.2
        start=$(now_ms)
        kill -9 "$r1"
        bg_wait $spid $((TIMEOUT + 20))
        rc=$?
        ms=$(($(now_ms) - start))
        if [ $rc = 0 ] || [ $rc = 124 ]; then fail $name "srun's status is $rc" "$DIR/$name.0"
        elif [ -n "$(pgrep -f "$DIR/dp2 train --steps 1000000")" ]; then fail $name "a task still runs" "$DIR/$name.0"
        elif [ $ms -ge $((TIMEOUT * 1000 + 10000)) ]; then fail $name "took $ms ms" "$DIR/$name.0"
        else pass "$name ($ms ms, srun's status $rc)"; fi
        resumed_ok slurm-train-kill-resume-alone "$DIR/$name.ck" alone
    fi
}
slurm_stop() {
    local f
    for f in slurmd slurmctld munged; do
        [ -f "$DIR/slurm/$f.pid" ] && kill "$(cat "$DIR/slurm/$f.pid")" 2>/dev/null
    done
    unset SLURM_CONF
}
slurm_main
slurm_stop
