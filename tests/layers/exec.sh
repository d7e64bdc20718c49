# shellcheck shell=bash
# tests/layers/exec.sh - the helpers the case files of tests/exec/ name in their `# test` and
# `# tests` lines (sourced by tests/run.sh; the cases run by run_cases, tests/layers/cases.sh).
# A helper exits 0 when what it checks holds and prints what it measured as its last line (the
# PASS line's detail); it reads the case's $W, $DATA and $VAL.

# log_losses LOG: the losses of a --log file (JSON lines), one a line.
log_losses() { sed 's/.*"loss": \([0-9.e+-]*\).*/\1/' "$1"; }

# loss_falls LOG MIN: the first step's loss minus the last's is at least MIN nats.
loss_falls() {
    local first last
    first=$(log_losses "$1" | head -n 1)
    last=$(log_losses "$1" | tail -n 1)
    echo "$first -> $last"
    awk -v f="$first" -v l="$last" -v m="$2" 'BEGIN { exit !(f - l >= m) }'
}

# held_out_below PROG LIMIT [TRAIN ARGS...]: PROG trains on $DATA (with TRAIN ARGS), then its
# held-out loss on $VAL must be below LIMIT, an awk expression in which `bigram` is the best loss
# a bigram model can reach on the corpus (mbt-gendata's report, $W/data.txt).
held_out_below() {
    local prog=$1 limit=$2 bigram loss
    shift 2
    bigram=$(sed -n 's/^best with less context: bigram H(x_t | x_t-1) = \([0-9.]*\) .*/\1/p' "$W/data.txt")
    "$prog" train --data "$DATA" --save-weights "$W/held_out.safetensors" "$@" || return 1
    "$prog" eval --weights "$W/held_out.safetensors" --data "$VAL" >"$W/held_out.txt" || return 1
    loss=$(sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p' "$W/held_out.txt")
    echo "held-out $loss, below ${limit//bigram/the bigram bound $bigram}"
    [ -n "$loss" ] && awk -v l="$loss" "BEGIN { bigram = $bigram; exit !(l < $limit) }"
}

# distinct_losses LOG N: LOG has N steps and no two log the same loss (dropout's masks change
# every step: tests/exec/dropout.mbt).
distinct_losses() {
    local l
    l=$(log_losses "$1")
    echo "losses" $l
    [ "$(echo "$l" | grep -c .)" = "$2" ] && [ "$(echo "$l" | sort -u | grep -c .)" = "$2" ]
}

# equal_losses LOG N: LOG has N steps, all with the same loss.
equal_losses() {
    local l
    l=$(log_losses "$1")
    echo "losses" $l
    [ "$(echo "$l" | grep -c .)" = "$2" ] && [ "$(echo "$l" | sort -u | grep -c .)" = 1 ]
}

# differ_log_fields LOG_A:N LOG_B:M KEY: line N of LOG_A and line M of LOG_B both log KEY, with
# different values.
differ_log_fields() {
    local va vb
    va=$(jfield "${1%:*}" "${1##*:}" "$3")
    vb=$(jfield "${2%:*}" "${2##*:}" "$3")
    echo "$3: $va in $(basename "${1%:*}") step ${1##*:}, $vb in $(basename "${2%:*}") step ${2##*:}"
    [ -n "$va" ] && [ -n "$vb" ] && [ "$va" != "$vb" ]
}

# same_eval PROG_A PROG_B WEIGHTS: both programs' `eval` of WEIGHTS on $VAL print the same loss.
same_eval() {
    local a b
    a=$("$1" eval --weights "$3" --data "$VAL" | sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p')
    b=$("$2" eval --weights "$3" --data "$VAL" | sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p')
    echo "eval loss $a and $b"
    [ -n "$a" ] && [ "$a" = "$b" ]
}

# near_eval PROG_A PROG_B WEIGHTS: both programs' `eval` of WEIGHTS on $VAL print losses at most one
# unit of the printed sixth decimal apart: two values within rounding of each other print that way
# when they straddle a rounding boundary (pad_gemm.mbt: GEMMs over k = 64 and 50 round differently).
near_eval() {
    local a b
    a=$("$1" eval --weights "$3" --data "$VAL" | sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p')
    b=$("$2" eval --weights "$3" --data "$VAL" | sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p')
    echo "eval loss $a and $b"
    [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1.5e-6) }'
}

# log_field LOG KEY: KEY's value in each line of a --log file, on one line.
log_field() {
    local k n
    n=$(wc -l <"$1")
    for ((k = 1; k <= n; k++)); do printf '%s%s' "$([ $k = 1 ] || echo ' ')" "$(jfield "$1" $k "$2")"; done
    echo
}

# same_log_fields LOG_A:N LOG_B:M KEY...: line N of LOG_A and line M of LOG_B log the same KEYs,
# to every printed digit.
same_log_fields() {
    local a=${1%:*} n=${1##*:} b=${2%:*} m=${2##*:} k va="" vb=""
    shift 2
    for k in "$@"; do
        va="$va $(jfield "$a" "$n" "$k")"
        vb="$vb $(jfield "$b" "$m" "$k")"
    done
    echo "$*:$va in $(basename "$a") step $n,$vb in $(basename "$b") step $m"
    [ "$va" = "$vb" ] && [ -n "${va// /}" ]
}

# same_log A B N: two --log files of N steps each that agree but for the time taken.
same_log() {
    local a b
    a=$(sed 's/"ms": [^,]*, //; s/, "tokens_per_s": [^}]*//' "$1")
    b=$(sed 's/"ms": [^,]*, //; s/, "tokens_per_s": [^}]*//' "$2")
    echo "$(wc -l <"$1") and $(wc -l <"$2") steps"
    [ "$a" = "$b" ] && [ "$(wc -l <"$1")" = "$3" ]
}

# data_from_window DATA WINDOW SEQ OUT: a token file holding DATA's tokens from window WINDOW of
# SEQ tokens on (a raw copy after the 1024-byte header: a program reading it in file order starts
# where one reading DATA had reached after WINDOW windows).
data_from_window() { tail -c +$((1024 + $2 * $3 * 2 + 1)) "$1" >"$4"; }

# ids_in_vocab VOCAB FILE:COUNT...: each FILE holds COUNT token ids, each below VOCAB.
ids_in_vocab() {
    local v=$1 a
    shift
    for a in "$@"; do
        awk -v v="$v" -v n="${a##*:}" 'NF != n { exit 1 } { for (i = 1; i <= NF; i++) if ($i !~ /^[0-9]+$/ || $i + 0 >= v) exit 1 }' "${a%:*}" \
            || { echo "${a%:*}: expected ${a##*:} ids below $v: $(cat "${a%:*}")"; return 1; }
    done
    echo "$# outputs, every id below $v"
}

# val_tokens N: the first N tokens of $VAL.
val_tokens() { od -An -v -tu2 -j1024 -N$(($1 * 2)) "$VAL"; }

# logits_match_eval PROG WEIGHTS VOCAB: the logits forward against the training forward. The
# held-out windows of T + 1 tokens one eval step reads (M = its batches x micro-batch): for each,
# `generate --print-logits` gives the logits after each prefix, whose mean cross-entropy against
# the next tokens must equal the loss `eval --steps 1` computes on those windows to 1e-5 relative -
# which needs the right row, the right parameters and a causal model.
logits_match_eval() {
    local prog=$1 w=$2 v=$3 T M k prompt toks ce loss evalout
    evalout=$("$prog" eval --weights "$w" --data "$VAL" --steps 1) || return 1
    loss=$(echo "$evalout" | sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p')
    read -r M T <<<"$(echo "$evalout" | sed -n 's/.* on \([0-9]*\) batches of \([0-9]*\) x \([0-9]*\) tokens .*/\1 \2 \3/p' | awk '{ print $1 * $2, $3 }')"
    if [ -z "$loss" ] || [ -z "$M" ] || [ "$M" = 0 ]; then echo "eval printed no loss or batch count: $evalout"; return 1; fi
    toks=($(val_tokens $((M * T + 1))))
    : >"$W/logits.txt"
    : >"$W/next.txt"
    for ((k = 0; k < M; k++)); do
        prompt=$(IFS=,; echo "${toks[*]:k*T:T}")
        "$prog" generate --weights "$w" --prompt-tokens "$prompt" --print-logits >>"$W/logits.txt" || return 1
        printf '%s\n' "${toks[@]:k*T+1:T}" >>"$W/next.txt"
    done
    ce=$(awk -v v="$v" 'NR == FNR { y[FNR] = $1; next }
              NF != v { print "line " FNR " has " NF " logits"; exit }
              { m = $1; for (i = 2; i <= NF; i++) if ($i > m) m = $i
                s = 0; for (i = 1; i <= NF; i++) s += exp($i - m)
                ce += m + log(s) - $(y[FNR] + 1); n++ }
              END { if (n) printf "%.9f %d", ce / n, n }' "$W/next.txt" "$W/logits.txt")
    if [ "${ce#* }" != $((M * T)) ]; then echo "--print-logits: $ce (expected $((M * T)) rows)"; return 1; fi
    echo "$M windows: cross-entropy from the logits ${ce% *}, eval $loss"
    awk -v a="${ce% *}" -v b="$loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }'
}

# long_prompt_slides PROG WEIGHTS CTX: a prompt longer than the context CTX slides: after
# CTX + 8 tokens of $VAL, the logits and the next 5 greedy tokens are those after their last CTX.
long_prompt_slides() {
    local prog=$1 w=$2 c=$3 toks long tail a b g1 g2
    toks=($(val_tokens $((c + 8))))
    long=$(IFS=,; echo "${toks[*]:0:c+8}")
    tail=$(IFS=,; echo "${toks[*]:8:c}")
    a=$("$prog" generate --weights "$w" --prompt-tokens "$long" --print-logits | tail -1)
    b=$("$prog" generate --weights "$w" --prompt-tokens "$tail" --print-logits | tail -1)
    g1=$("$prog" generate --weights "$w" --prompt-tokens "$long" --max-tokens 5 --temperature 0)
    g2=$("$prog" generate --weights "$w" --prompt-tokens "$tail" --max-tokens 5 --temperature 0)
    echo "$((c + 8))-token prompt vs its last $c: logits equal? $([ "$a" = "$b" ] && echo yes || echo no); tokens '$g1' vs '$g2'"
    [ -n "$a" ] && [ "$a" = "$b" ] && [ -n "$g1" ] && [ "$g1" = "$g2" ]
}

# every_example DATA (tests/exec/examples.case): every train block of every example builds with
# `mbtc FILE --train NAME -o` (a full-size block, too big to train here, proves it compiles),
# built for CUDA_ARCHS, into an executable whose --help
# names the block (the runtime checks the descriptor first), and every block that reads the
# README's tiny data (tokens("data/tiny_train.bin", ...): the CPU-size ones) trains 3 steps on
# mbt-gendata's corpus (DATA) with 3 finite losses in its --log. llama_cpu's log shows its
# ramp: 4 x 64 tokens at steps 1 and 2, twice that at step 3 (ramp = [(2, 8)]).
every_example() {
    local mbtc="$BUILD/mbtc" data=$1 dir=$W f ex t kind out log start bt rt n k l bad
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

# ranks NP PROG ARGS...: PROG ARGS as NP data-parallel ranks (docs/parallel.md), one thread each:
# under `mpirun --oversubscribe` (the mpi backend) where Open MPI is installed, else as NP
# processes with torchrun's variables (the tcp backend); MBT_COMM_TIMEOUT=60 bounds a stuck
# collective. Prints rank 0's output (the others' go to /dev/null) and which launcher ran; fails
# when any rank does.
ranks() {
    local np=$1 r rc=0 pids=() port
    shift
    if command -v mpirun >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        MBT_COMM_TIMEOUT=60 timeout -s KILL 300 mpirun --oversubscribe -np "$np" "$@" --threads 1 || rc=1
        echo "$np ranks under mpirun"
        return $rc
    fi
    port=$((30000 + (BASHPID + RANDOM) % 20000)) # (BASHPID: cases run two at a time, in subshells)
    for ((r = 0; r < np; r++)); do
        RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MBT_COMM_TIMEOUT=60 \
            timeout -s KILL 300 "$@" --threads 1 &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || rc=1; done
    echo "$np ranks of the tcp backend (no mpirun here)"
    return $rc
}

# kv_matches_recompute PROG WEIGHTS CTX (issue 17): the KV cache (forward_chunk, generate's default)
# against the recompute path (forward_logits, --no-cache) on the first CTX - 2 tokens of $VAL:
#   - the prompt through the cache in steps of 1, 3, 7 and 16 tokens (16: a whole call of
#     forward_chunk) gives, after each step, the logits of that prefix to 1e-5 relative
#     (max |a - b| / max(1, |b|) over the logits; measured 1.1e-6). Not bit for bit: a position's
#     row sits at another index of the GEMMs than in forward_logits, and OpenBLAS's sgemm rounds a
#     row differently depending on its index and the matrix's rows (docs/serve.md, "Numerics");
#   - and those of steps of 3, 7 and 16 are bit for bit those of steps of 1 at the same prefix
#     (the chunk phase's GEMMs, rt_sgemm_rows_batched, round a row whatever its index);
#   - 40 greedy tokens after a 3-token prompt are the same with and without the cache (the last 11
#     past the context, where generate recomputes), and so are 40 sampled ones (temperature 1,
#     seed 5: a logit off by 1e-6 moves a draw only when it falls that close to a boundary).
# logits_agree A B TOL: two `generate --print-logits` outputs with the same rows of the same width
# (the program's vocabulary), every logit within TOL relative (at least 1 in the denominator).
logits_agree() {
    local r
    r=$(awk 'NR == FNR { a[FNR] = $0; next }
             { n = split(a[FNR], x, " "); if (n != NF || n == 0) { print "rows differ at line " FNR; bad = 1; exit }
               for (i = 1; i <= NF; i++) { d = $i - x[i]; if (d < 0) d = -d; m = x[i] < 0 ? -x[i] : x[i]; if (m < 1) m = 1
                 if (d / m > w) w = d / m } rows++; cols = NF }
             END { if (!bad) printf "%d rows of %d logits, max relative difference %.3g\n", rows, cols, w }' "$1" "$2")
    echo "$r"
    [ "$(wc -l <"$1")" = "$(wc -l <"$2")" ] && case $r in *"max relative"*) awk -v x="${r##* }" -v t="$3" 'BEGIN { exit !(x <= t) }' ;; *) false ;; esac
}

kv_matches_recompute() {
    local prog=$1 w=$2 c=$3 toks prompt n=$(($3 - 2)) chunk worst g1 g2
    toks=($(val_tokens "$n"))
    prompt=$(IFS=,; echo "${toks[*]:0:n}")
    "$prog" generate --weights "$w" --prompt-tokens "$prompt" --print-logits --no-cache >"$W/kv_r.txt" || return 1
    for chunk in 1 3 7 16; do
        "$prog" generate --weights "$w" --prompt-tokens "$prompt" --print-logits --prefill-chunk "$chunk" >"$W/kv_$chunk.txt" || return 1
        worst=$(awk -v c="$chunk" -v n="$n" 'NR == FNR { if (FNR % c == 0 || FNR == n) r[++k] = $0; next }
                  { split(r[FNR], a, " "); if (NF != length(a)) { print "rows differ"; exit }
                    for (i = 1; i <= NF; i++) { d = $i - a[i]; if (d < 0) d = -d; m = a[i] < 0 ? -a[i] : a[i]; if (m < 1) m = 1
                      if (d / m > w) w = d / m } lines++ }
                  END { printf "%d %.3g", lines, w }' "$W/kv_r.txt" "$W/kv_$chunk.txt")
        echo "steps of $chunk: ${worst% *} prefixes, max relative difference ${worst#* }"
        [ "${worst% *}" = $(((n + chunk - 1) / chunk)) ] || return 1
        awk -v x="${worst#* }" 'BEGIN { exit !(x <= 1e-5) }' || return 1
    done
    # however the prompt is cut, a prefix's logits are the same bits (the chunk phase's GEMMs
    # round a row whatever its index: docs/serve.md, "Numerics"); steps of 1 give every prefix
    for chunk in 3 7 16; do
        worst=$(awk -v c="$chunk" -v n="$n" 'NR == FNR { if (FNR % c == 0 || FNR == n) r[++k] = $0; next }
                  { lines++; if ($0 != r[FNR]) bad++ } END { printf "%d %d", lines, bad }' "$W/kv_1.txt" "$W/kv_$chunk.txt")
        echo "steps of $chunk against steps of 1: ${worst% *} prefixes, ${worst#* } not bit for bit"
        [ "$worst" = "$(((n + chunk - 1) / chunk)) 0" ] || return 1
    done
    g1=$("$prog" generate --weights "$w" --prompt-tokens 1,2,3 --max-tokens 40 --temperature 0)
    g2=$("$prog" generate --weights "$w" --prompt-tokens 1,2,3 --max-tokens 40 --temperature 0 --no-cache)
    echo "greedy with the cache '$g1', without '$g2'"
    [ -n "$g1" ] && [ "$g1" = "$g2" ] || return 1
    g1=$("$prog" generate --weights "$w" --prompt-tokens 1,2,3 --max-tokens 40 --temperature 1 --seed 5)
    g2=$("$prog" generate --weights "$w" --prompt-tokens 1,2,3 --max-tokens 40 --temperature 1 --seed 5 --no-cache)
    echo "sampled (seed 5) with the cache '$g1', without '$g2'"
    [ -n "$g1" ] && [ "$g1" = "$g2" ]
}

# memory_peak WHAT PROG BASE PLAN [TRAIN ARGS...]: a memory setting's peak (WHAT recompute or
# offload; docs/memory.md). PROG's `info` step arena is the step peak PLAN (its --emit=plan) claims,
# lower than BASE's (the same model without the setting), which PLAN names as the peak "without
# WHAT"; and one step of PROG run with --arena-high-water (and TRAIN ARGS) writes the arena up to
# that peak, less than its alignment (64 bytes: the highest buffer ends inside its last 64), never
# beyond.
memory_peak() {
    local what=$1 prog=$2 base=$3 plan=$4 planned without measured info_p info_b
    shift 4
    info_p=$("$prog" info | sed -n 's/^plan: arena step \([0-9]*\) bytes$/\1/p')
    info_b=$("$base" info | sed -n 's/^plan: arena step \([0-9]*\) bytes$/\1/p')
    planned=$(sed -n "s/^step peak \([0-9]*\) bytes.*, without $what \([0-9]*\) bytes.*/\1/p" "$plan")
    without=$(sed -n "s/^step peak \([0-9]*\) bytes.*, without $what \([0-9]*\) bytes.*/\2/p" "$plan")
    measured=$("$prog" train --steps 1 --data "$DATA" --arena-high-water "$@" |
        sed -n 's/^arena high-water: step 1.s micro-batches wrote \([0-9]*\) bytes of the arena; the plan.s step peak is \([0-9]*\)$/\1 \2/p')
    echo "planned $planned (info $info_p), without $what $without (base's info $info_b), measured ${measured% *} (of ${measured#* })"
    [ -n "$planned" ] && [ -n "$measured" ] && [ "$info_p" = "$planned" ] && [ "$without" = "$info_b" ] &&
        [ "${measured#* }" = "$planned" ] && [ "$planned" -lt "$without" ] &&
        [ "${measured% *}" -le "$planned" ] && [ "${measured% *}" -gt $((planned - 64)) ]
}
# recompute_peak PROG BASE PLAN (tests/exec/recompute.case); offload_peak PROG BASE PLAN
# (tests/exec/offload_activations.case: the store in $W)
recompute_peak() { memory_peak recompute "$@"; }
offload_peak() { memory_peak offload "$@" --offload-dir "$W"; }

# zero3_memory PROG OUT N (tests/exec/zero3.mbt; docs/parallel.md, "ZeRO-3"): the parameter memory
# N ranks of PROG (parallel.zero = 3) measured during their forward_backward calls (OUT: the run's
# output, rank 0's lines for every rank) against what PROG's `info` claims (the same lines as
# --emit=plan's summary): each rank's high-water mark is at least its own shard, at most the pages
# of its shard plus the pages the plan says the gathers map at once (in the plan's page), and below
# the whole region; the run's line must use the plan's window and page.
zero3_memory() {
    local prog=$1 out=$2 n=$3 shard region pg wp sp k line hw rshard rsp rwp rpg ok=1 seen=0 worst=0
    line=$("$prog" info | sed -n 's/^plan: ZeRO-3: a rank holds its shard of at most \([0-9]*\) bytes of the parameters and gathers at most [0-9]* bytes more at once ([0-9]* gathers): [0-9]* of the region.s \([0-9]*\) bytes$/\1 \2/p')
    read -r shard region <<<"$line"
    line=$("$prog" info | sed -n 's/^plan: ZeRO-3: pages of \([0-9]*\) bytes: the gathers map at most \([0-9]*\) pages at once besides the \([0-9]*\) of a shard: .*/\1 \2 \3/p')
    read -r pg wp sp <<<"$line"
    [ -n "$region" ] && [ -n "$sp" ] || { echo "no ZeRO-3 lines in $prog info"; return 1; }
    for ((k = 0; k < n; k++)); do
        line=$(sed -n "s/^ZeRO-3: rank $k: high-water \([0-9]*\) bytes .*(shard \([0-9]*\) in \([0-9]*\) pages + window \([0-9]*\) pages, of \([0-9]*\) bytes).*/\1 \2 \3 \4 \5/p" "$out")
        read -r hw rshard rsp rwp rpg <<<"$line"
        [ -n "$rpg" ] || { echo "no high-water line for rank $k in $out"; return 1; }
        seen=$((seen + 1))
        [ "$hw" -gt "$worst" ] && worst=$hw
        if [ "$hw" -lt "$rshard" ] || [ "$rshard" -gt "$shard" ] || [ "$rsp" -gt "$sp" ] || [ "$rwp" != "$wp" ] ||
            [ "$rpg" != "$pg" ] || [ "$hw" -gt $(((rsp + wp) * pg)) ] || [ "$hw" -ge "$region" ]; then
            echo "rank $k: high-water $hw bytes, shard $rshard in $rsp pages (the plan's at most $shard in $sp), window $rwp pages of $rpg (the plan's $wp of $pg), region $region"
            ok=0
        fi
    done
    echo "$seen ranks: high-water at most $worst bytes of the region's $region; the plan: shard $shard in at most $sp pages + window $wp pages of $pg bytes"
    [ "$ok" = 1 ] && [ "$seen" = "$n" ]
}

# offload_vanishes PROG [WHAT]: PROG (offload { optimizer = nvme }, or WHAT = activations: offload
# { activations = nvme }) trains with its store file in $W/st,
# a checkpoint every 5 steps; once step 5's is written, $W/st is removed. The run must stop with
# an error naming the vanished store file (not run on to its 2000 steps), and its last checkpoint
# must resume.
offload_vanishes() {
    local prog=$1 what=${2:-optimizer} pid rc i last msg=": optimizer: the optimizer state"
    [ "$what" = activations ] && msg=", micro-batch [0-9]+: activations"
    rm -rf "$W/st" "$W/ckv"
    mkdir -p "$W/st"
    "$prog" train --data "$DATA" --steps 2000 --ckpt-every 5 --ckpt-sync --ckpt-dir "$W/ckv" --offload-dir "$W/st" \
        >"$W/vanish.out" 2>&1 &
    pid=$!
    for ((i = 0; i < 6000; i++)); do
        [ -e "$W/ckv/step-00000005/state.json" ] && break
        sleep 0.01
    done
    rm -rf "$W/st"
    wait $pid
    rc=$?
    grep -v '^step ' "$W/vanish.out" | tail -n 3
    [ $rc = 1 ] && grep -qE "^[^ ]*: step [0-9]+$msg: store file '$W/st/mbt-[^']*' has vanished .*No such file or directory" "$W/vanish.out" || return 1
    last=$(sed -n 's/^checkpoint: step \([0-9]*\) written.*/\1/p' "$W/vanish.out" | tail -n 1)
    "$prog" train --data "$DATA" --resume latest --ckpt-dir "$W/ckv" --offload-dir "$W" --steps $((last + 1)) >"$W/vanish-resume.out" 2>&1 || return 1
    echo "stopped at step $(sed -n 's/.*: step \([0-9]*\)[:,] .*/\1/p' "$W/vanish.out"); resumed from step $last's checkpoint"
}

# offload_fsize PROG: with a file-size limit (ulimit -f, in KiB) below the store file's size, the
# store cannot be allocated: a clear error before the first step, naming the file and its size.
offload_fsize() {
    local prog=$1 rc
    (
        trap '' XFSZ
        ulimit -f 100
        exec "$prog" train --data "$DATA" --offload-dir "$W" --ckpt-dir "$W/ckf"
    ) >"$W/fsize.out" 2>&1
    rc=$?
    cat "$W/fsize.out" | tail -n 1
    [ $rc = 1 ] && grep -qE "cannot allocate the store file '$W/mbt-[^']*' \([0-9]+ bytes\): File too large" "$W/fsize.out" &&
        ! grep -q '^step 1/' "$W/fsize.out" && ! ls "$W"/mbt-*.optimizer "$W"/mbt-*.activations >/dev/null 2>&1
}

# no_store_files DIR: no store file (mbt-*.optimizer, mbt-*.activations) is left in DIR.
no_store_files() {
    local left
    left=$(ls "$1" | grep -cE '^mbt-.*\.(optimizer|activations)$')
    echo "$left store files left in $(basename "$1")"
    [ "$left" = 0 ]
}

# same_step_log A B N: two --log files whose N step records agree but for the time taken (their
# checkpoint records, written in the background, are left out).
same_step_log() {
    local a b
    a=$(grep '"loss"' "$1" | sed 's/"ms": [^,]*, //; s/, "tokens_per_s": [^}]*//')
    b=$(grep '"loss"' "$2" | sed 's/"ms": [^,]*, //; s/, "tokens_per_s": [^}]*//')
    echo "$(echo "$a" | grep -c .) and $(echo "$b" | grep -c .) steps; the last: $(echo "$b" | tail -n 1)"
    [ "$a" = "$b" ] && [ "$(echo "$a" | grep -c .)" = "$3" ]
}
