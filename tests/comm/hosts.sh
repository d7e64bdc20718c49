# tests/comm/hosts.sh - the comm layer's two-host part, sourced by tests/comm/run.sh (it uses run.sh's
# DIR, DATA, TIMEOUT, dp2 and helpers). Two network namespaces joined by a veth pair stand for two
# machines (10.77.N.1 and 10.77.N.2, no loopback between them): the tcp rendezvous and the
# collectives cross a real link between two network stacks (docs/parallel.md, "Launching"):
#   hosts-tcp        rank 0 on host A, rank 1 on host B (MASTER_ADDR = A): one process's bytes
#   hosts-link-down  the link cut mid-run: both ranks stop within the timeout, naming it; the
#                    last checkpoint resumes alone to an uninterrupted run's bytes
#   hosts-no-route   rank 1 alone, A's address unreachable: it gives up at the timeout, saying so
# Needs root and iproute2's `ip netns`; without them it prints SKIP comm/hosts and why.

hosts_main() {
    if [ "$(id -u)" != 0 ]; then echo "SKIP comm/hosts: needs root (ip netns)"; return; fi
    local IP=ip
    command -v ip >/dev/null 2>&1 || IP=/usr/sbin/ip
    [ -x "$(command -v $IP)" ] || { echo "SKIP comm/hosts: iproute2's ip is not installed"; return; }
    local n=$(($$ % 250 + 1)) A=mbtA$$ B=mbtB$$
    local a=10.77.$n.1 b=10.77.$n.2
    HOSTS_NS="$A $B"
    if ! { $IP netns add $A && $IP netns add $B && $IP link add vA$$ type veth peer name vB$$ \
        && $IP link set vA$$ netns $A && $IP link set vB$$ netns $B \
        && $IP -n $A addr add $a/24 dev vA$$ && $IP -n $B addr add $b/24 dev vB$$ \
        && $IP -n $A link set vA$$ up && $IP -n $B link set vB$$ up \
        && $IP -n $A link set lo up && $IP -n $B link set lo up; } >"$DIR/hosts-setup.out" 2>&1; then
        echo "SKIP comm/hosts: cannot make two network namespaces here: $(tail -n 1 "$DIR/hosts-setup.out")"
        return
    fi
    [ -e "$DIR/alone-10.st" ] || MBT_COMM=self "$DIR/dp2" train --steps 10 --data "$DATA" \
        --save-weights "$DIR/alone-10.st" >"$DIR/alone-10.out" 2>&1
    # on_host NS RANK PORT OUT ARGS...: rank RANK of 2 in namespace NS, rank 0 at A:PORT
    on_host() {
        local ns=$1 r=$2 port=$3 out=$4
        shift 4
        $IP netns exec "$ns" env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=$a MASTER_PORT=$port \
            timeout -s KILL 120 "$@" >"$out" 2>&1
    }
    local name=hosts-tcp rc0 rc1
    on_host $A 0 29500 "$DIR/$name.0" "$DIR/dp2" train --steps 10 --data "$DATA" --save-weights "$DIR/$name.st" &
    on_host $B 1 29500 "$DIR/$name.1" "$DIR/dp2" train --steps 10 --data "$DATA"
    rc1=$?
    wait $!
    rc0=$?
    if [ "$rc0$rc1" != 00 ]; then fail $name "statuses $rc0 and $rc1" "$DIR/$name.0" "$DIR/$name.1"
    elif ! cmp -s "$DIR/alone-10.st" "$DIR/$name.st"; then fail $name "weights differ from one process's" "$DIR/$name.0"
    else pass "$name (ranks at $a and $b: one process's bytes)"; fi

    name=hosts-link-down
    local ms start
    on_host $A 0 29501 "$DIR/$name.0" "$DIR/dp2" train --steps 100000000 --data "$DATA" --ckpt-every 50 \
        --ckpt-dir "$DIR/$name.ck" &
    local p0=$!
    on_host $B 1 29501 "$DIR/$name.1" "$DIR/dp2" train --steps 100000000 --data "$DATA" &
    local p1=$!
    if ! wait_for "$DIR/$name.ck/latest" 60; then fail $name "no checkpoint after 60 s" "$DIR/$name.0"; kill -9 $p0 $p1 2>/dev/null
    else
        start=$(now_ms)
        $IP -n $B link set vB$$ down
        bg_wait $p0 $((TIMEOUT + 10))
        rc0=$?
        bg_wait $p1 $((TIMEOUT + 10))
        rc1=$?
        ms=$(($(now_ms) - start))
        local re="rank [01] of 2 timed out after 3(\.[0-9]+)? s waiting in [a-z_0-9]+ for rank [01]"
        if [ "$rc0$rc1" != 11 ]; then fail $name "statuses $rc0 and $rc1, not 1 and 1" "$DIR/$name.0" "$DIR/$name.1"
        elif ! grep -qE "$re" "$DIR/$name.0" || ! grep -qE "$re" "$DIR/$name.1"; then
            fail $name "not both ranks said /$re/" "$DIR/$name.0" "$DIR/$name.1"
        elif [ $ms -ge $((TIMEOUT * 1000 + 3000)) ]; then fail $name "took $ms ms" "$DIR/$name.0" "$DIR/$name.1"
        else pass "$name ($ms ms: $(grep -ohE "$re" "$DIR/$name.0"))"; fi
        resumed_ok hosts-link-down-resume-alone "$DIR/$name.ck" alone
    fi

    # rank 1 alone while A's address is down: connecting fails until the timeout, which it names
    name=hosts-no-route
    $IP -n $A link set vA$$ down
    on_host $B 1 29502 "$DIR/$name" "$DIR/dp2" train --steps 10 --data "$DATA"
    rc1=$?
    re="cannot connect to rank 0 \(MASTER_ADDR:MASTER_PORT\) at $a:29502 before the timeout"
    if [ $rc1 = 1 ] && grep -qE "$re" "$DIR/$name"; then pass "$name ($(grep -oE 'before the timeout.*' "$DIR/$name" | head -n 1))"
    else fail $name "status $rc1, expected 1 and /$re/" "$DIR/$name"; fi
}
hosts_main
for ns in ${HOSTS_NS:-}; do ${IP:-ip} netns del "$ns" 2>/dev/null || /usr/sbin/ip netns del "$ns" 2>/dev/null; done
unset HOSTS_NS
