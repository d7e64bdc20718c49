#!/usr/bin/env bash
# tests/gpu/run.sh BUILD - `make test-gpu`: the compiled programs' training step on the GPU
# (`--device cuda`) against the same step on the CPU. Needs an NVIDIA GPU: without one (`nvidia-smi
# -L` fails or lists none) it prints `SKIP: no GPU (why)` and `0 passed, 0 failed` and exits 0.
#
# The programs: every train block of examples/*.mbt that reads the tiny corpus (tokens("data/
# tiny_train.bin", ...): the CPU-size blocks, as tests/run.sh's exec layer picks them; the
# full-size ones - GPT-2 124M at 16 x 1024, llama_small - have no CPU step to compare with in
# reasonable time), tests/gpu/attn_shapes.mbt (attention in the shapes the examples lack: grouped
# heads, D != E, T not a multiple of a tile, fewer keys than queries, not causal), its bf16
# counterpart tests/gpu/attn_shapes_bf16.mbt (whose forwards run on the tensor cores),
# tests/verify/tiny_bf16.mbt (tiny with precision = bf16), tests/exec/dropout.mbt (dropout with
# p > 0: the device's masks, forward and backward, must be the CPU's for the step to compare),
# tests/verify/docs.mbt (attention masked at document boundaries, issue 20), tests/exec/buckets.mbt
# (sequence-length buckets: step 1 at length 8, step 2 at 16, issue 20) and tests/exec/groups.mbt
# and lora.mbt (frozen parameters, no_decay and a LoRA adapter: the grouped update's index masks on
# the device), multi_lora.mbt (two adapters batched over their rows; both LoRA programs' up
# products are added to the base's by the GEMM's add epilogue, cuBLASLt's C input),
# tests/verify/ghost_bn.mbt (nn.GhostBatchNorm and nn.BatchChannelNorm: reductions over ghost
# batches of samples and positions, issue 20), tests/gpu/rows.mbt (4096 rows a micro-batch: the
# two-level sums of the LayerNorm and bias gradients, fuse_lower.c, and their column kernels, f32
# and bf16) and tests/verify/ghost_bn_running.mbt (their running statistics: training() from the
# key on the device, the buffers' update after the step through a download and upload, issue 20)
# and tests/gpu/docs_bf16.mbt (docs.mbt in bf16 with rows of 160: the document mask on the
# flash-attention-2 kernels, issue 20) and tests/gpu/ce_pad.mbt (the classifier kernel over a tied
# head's vocabulary of 1100 padded to 1152, f32 and bf16, the gradient over the logits, issue 15)
# and tests/gpu/concat.mbt (concatenations and a where through head transposes, f32 and bf16: the
# select arms written inside an if/else and the 32-bit offsets, docs/cuda.md, issue 15).
# For each, on mbt-gendata's corpus:
#   gpu/EX-BLOCK/step      `train --steps 2 --dump-step F --log F.jsonl` with --device cpu and with
#                          the device; tests/gpu/cmpdump.py holds the device's step 1 to the CPU's:
#                          starting weights, batches and learning rate identical, loss 1e-5 relative,
#                          each gradient 1e-5 of its tensor's largest entry, the updated weights 1e-6
#                          (docs/testing.md, "The GPU tests", says why these); a bf16 program's loss
#                          1e-4 and gradients 5e-2, verify-step's bf16 tolerances (the two devices
#                          round their bf16 GEMM results after sums in different orders)
#   gpu/EX-BLOCK/step2     step 2's logged loss (from each device's own updated weights) within 1e-5
#                          (bf16: 1e-4)
#   gpu/EX-BLOCK/rerun     the device run again: a byte-identical dump and the same logged losses and
#                          gradient norms (every printed digit)
#   gpu/EX-BLOCK/verify    (mlp, tiny, moe, tiny_bf16, rows: the verify layer's, whose float64 reference
#                          takes seconds; ghost_bn_running, whose running buffers' update the step
#                          compare above allows for as a zero-gradient entry's) `mbtc --verify-step`
#                          on the device's dump: its gradients and
#                          its update (fed its own gradients) against the reference evaluator, 1e-4
#                          (bf16: 5e-2)
#   gpu/lora-lora-trained, gpu/multi_lora-multi-trained
#                          tests/exec/lora.mbt's and multi_lora.mbt's step 1 from weights trained 3 steps on
#                          the CPU (lora_B away from zero: the fused LoRA launches, docs/cuda.md), device
#                          against CPU, cmpdump's tolerances
# then, on examples/tiny.mbt (weights trained 3 steps on the CPU):
#   gpu/eval               `eval --steps 2` on the device: the CPU's loss within 1e-5 relative
#   gpu/generate-logits    `generate --print-logits` over a 16-token prompt on the device: each
#                          prefix's logits within 1e-5 of the row's largest of the CPU's
#   gpu/debug-timing       MBT_DEBUG=1 prints a per-kernel timing table: a header line naming
#                          "kernel" and "us" (or µs), and rows naming the program's kernel functions
#                          (the `__global__` functions of `mbtc --emit=cuda`)
#   gpu/trace              MBT_TRACE=F.json writes JSON whose traceEvents is a non-empty list of
#                          events, some named after the program's kernel functions, on track 0
#                          named "compute"; gpu/trace-offload-act and gpu/trace-offload-host
#                          (sections offload-act, offload-opt): the offloads' copies on tracks 1
#                          and 2 and the compute stream's waits for them, counted against the plan
#                          (tests/gpu/trace_tracks.py)
#   gpu/offload-act        tests/exec/offload_activations.mbt with offload { activations = host }: 10
#                          steps byte-identical to no offload, the step peak, info, the measured arena
#                          high-water and the pinned bytes agree; gpu/offload-act-control (emulated
#                          GPU): leaving out a wait for the copy stream changes the weights
#   gpu/offload-act-nvme   the same program's act with activations = nvme: through pinned staging to a
#                          store file and back, 10 steps byte-identical to no offload, the store's size
#                          and the staging's bounded size, the peak as planned; -control (emulated GPU):
#                          leaving out a wait changes the weights; -errors: no store directory, a full
#                          disk, the store removed mid-run (a clear error; the checkpoint resumes)
#   gpu/graph              tests/exec/dropout.mbt's drop, 5 steps, with CUDA graphs (the default) and
#                          with MBT_CUDA_GRAPH=0: byte-identical weights and logs, graphs launched
#   gpu/param-casts        tests/exec/param_casts.mbt's kept (the weight casts once a step) and every
#                          (recast each micro-batch), 3 steps: byte-identical weights and logs, and
#                          MBT_DEBUG's table counts the cast kernel 3 and 12 times
# and, on tests/verify/ghost_bn_running.mbt:
#   gpu/running            5 steps on the device, then its running buffers, eval's loss and
#                          generation's logits against tests/verify/ghost_bn_running_oracle.py
# and, on tests/exec/dp.mbt:
#   gpu/dp/nccl, /overlap, /staged
#                          dp1 alone and dp2 as 2 ranks (tcp backend) on the device, 3 steps: the
#                          same logs and byte-identical weights (the step's tree, docs/parallel.md),
#                          the ranks' sums moved by NCCL (GPU to GPU) after the backward, by NCCL in
#                          buckets on a communication stream during it, and through host memory;
#                          gpu/dp/overlap-debug, -control, -fail, -4, -z1: the buckets' MBT_DEBUG
#                          lines, each step's join left out on the emulated GPU (other weights), a
#                          rank's NCCL failing, 4 ranks, ZeRO-1
#   gpu/zero2-shard, -staged  tests/exec/zero2.mbt's 2 x 3 (NCCL) and 4 x 3 (staged): ZeRO-2's partial
#                          sums by shard on the device, one process's logs and weights, 3 steps
#   gpu/zero2-buckets      the 2 x 3 over NCCL in 7 buckets, each micro-batch's exchange on the
#                          communication stream during its backward: one process's bytes; -no-join:
#                          the join after each backward left out (MBT_TEST_DROP_JOIN=1) is caught
#   gpu/zero3, -4, -deep, -bf16, -dump, -moe, -resume, -control, -wait-control, -page (tests/exec/zero3.mbt and
#                          dp_moe.mbt): ZeRO-3 on the device,
#                          2 ranks over NCCL and 4 staged against one process without ZeRO, byte for
#                          byte (logs, an evaluation, a checkpoint, weights), a resume from 2 ranks to
#                          4, each rank's mapped parameter pages within the plan's bound; a schedule
#                          that releases too early, and a wait left out, on the emulated GPU
#   gpu/zero1, gpu/zero2   z1 as 2 ranks (NCCL), z2 as 4 (staged): ZeRO-1 and -2 on the device, 3
#                          steps, dp1's logs and weights byte for byte (zero1: rank 0's device peak
#                          lower by the state outside its shard); gpu/zero1-offload-host: z1 with
#                          offload { optimizer = host }, each rank's CPU updating its shard
#                          (-staged: the same with MBT_NCCL=0, the gather starting from the host's shard)
# and, on tests/serve/gpt.mbt (tests/gpu/kv.sh says what each compares):
#   gpu/kv/logits, chunked, greedy, serve/NAME, pool-refused
#                          the KV cache (generate's and serve's chunk phase) on the device
# and, on tests/exec/pad_gemm.mbt (aligned GEMM shapes, docs/cuda.md):
#   gpu/pad/step, step2    built with --pad-gemm=64, step 1 on the device against the same source built
#                          with --pad-gemm=1 on the CPU (cmpdump's tolerances), step 2's loss 1e-5; the
#                          device's dump holds zeros in every padded row (rt_step_dump checks)
# A first run (gpu/probe) must train one step on the device at all; when it cannot, the rest is not run.
#
# MBT_GPU_TEST_DEVICE selects the device under test:
#   cuda (default)  the GPU, as above.
#   emu             the GPU path on the CPU, for machines without a GPU (tests/run.sh's gpu-emu
#                   layer): the executables run with --device cuda against tests/cudaemu/fake_cuda.c
#                   as the CUDA driver and cuBLASLt, and each program's kernels - its CUDA C from
#                   `mbtc --emit=cuda`, compiled for the host by tests/cudaemu/build.sh - run in
#                   tests/cudaemu/cudaemu.h's emulation. Everything the host does for the GPU runs
#                   (uploads, launches with the kernel table's geometry, GEMM descriptors, copies,
#                   the gradient norm, timing and the trace), and every kernel's code; not NVIDIA's
#                   compiler, driver or cuBLASLt, nor CUDA's math library. Reruns are not compared
#                   (the emulation is deterministic by construction), gpt2-gpt2_cpu is left out
#                   (GPT-2 124M's GEMMs take ~50 s on the emulator; on a GPU it runs), and
#                   --verify-step (~10 s of float64 a program) runs for mlp, tiny_bf16 and rows alone: the
#                   others' steps are held to the CPU's, which the verify layer holds to the reference.
#   cpu             a dry run of this script: the device under test is the CPU with --threads 1 (the
#                   reference uses the default thread count), which must agree bit for bit; the
#                   MBT_DEBUG / MBT_TRACE tests are skipped. It checks the harness, not a GPU.
#
# The tests are in sections, one a `# ---- ` part below (a function sec_NAME), which report in this
# order: steps (the train blocks above), pad, dp (with ZeRO-1/-2), zero2 (zero2-shard, -buckets),
# zero3, recompute, stats (gpu/running), eval (eval, generate-logits), kv, offload-opt
# (offload-host, -nvme, -bytes, -copy-control, trace-offload-host), offload-act (offload-act,
# -control, trace-offload-act), offload-nvme (offload-act-nvme*, trace-offload-act-nvme),
# graphs, debug (debug-timing, trace), casts (param-casts*). The probe runs first, always.
#   MBT_GPU_TEST_SECTIONS=a,b,...  runs those sections alone (unset or empty: all of them), e.g.
#                   zero3,offload-act on a short GPU lease; a name that is not a section is refused
#                   with the list. Each section builds what it runs from (offload-nvme runs
#                   offload-act's base itself when offload-act is not selected); what it cannot run
#                   on this machine it SKIPs with the reason.
#   MBT_GPU_TEST_LANES=N  sections run N at a time (the emulated GPU: 2 by default; a GPU and the
#                   CPU's dry run: 1, which runs each in this shell, its lines printed as they
#                   come); each section's lines are relayed in the order above as soon as it and
#                   every section before it are done, so the output is the same whichever ends first.
#                   A section that reads another's products (offload-nvme: offload-act's base runs;
#                   debug: eval's tiny build) starts after it.
#
# Output: PASS/FAIL/SKIP lines, `N passed, M failed` last; exit status 1 when anything failed.
set -u
set -o pipefail
# the sections, in the order they report (each a `# ---- ` part below, a function sec_NAME)
SECTIONS=(steps pad dp zero2 zero3 recompute stats eval kv offload-opt offload-act offload-nvme graphs debug casts)
# a section that reads another's products starts after it when both run (otherwise it makes them)
declare -A SECTION_AFTER=([offload-nvme]=offload-act [debug]=eval)
# with lanes, the order sections start in: the longest first (seconds on the emulated GPU, 2 loaded
# cores: steps 390, dp 220, zero3 210, offload-act 115 and offload-nvme 55 after it, casts 100,
# zero2 95, offload-opt 65, kv 50, pad 45, recompute 40, debug 25, the rest 5 or less)
SECTION_START=(steps dp zero3 offload-act casts zero2 offload-opt offload-nvme kv pad recompute eval debug stats graphs)
usage() {
    echo "usage: [MBT_GPU_TEST_DEVICE=cuda|emu|cpu] [MBT_GPU_TEST_SECTIONS=a,b,...] [MBT_GPU_TEST_LANES=N] tests/gpu/run.sh BUILD"
    echo "sections (the probe always runs first): ${SECTIONS[*]}"
}
# want SECTION: whether MBT_GPU_TEST_SECTIONS (unset or empty: every section) names it
want() { [ -z "${MBT_GPU_TEST_SECTIONS:-}" ] || [[ ",${MBT_GPU_TEST_SECTIONS// /}," == *",$1,"* ]]; }
if [ $# -lt 1 ]; then
    usage >&2
    exit 2
fi
sections_named=${MBT_GPU_TEST_SECTIONS:-}
for s in ${sections_named//,/ }; do
    if [[ " ${SECTIONS[*]} " != *" $s "* ]]; then
        echo "tests/gpu/run.sh: MBT_GPU_TEST_SECTIONS names '$s', which is not a section" >&2
        usage >&2
        exit 2
    fi
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 2
# shellcheck source=tests/report.sh
. tests/report.sh
if ! BUILD=$(cd "$1" 2>/dev/null && pwd); then
    fail gpu/setup "build directory '$1' does not exist (run make first)"
    summary
    exit
fi
unset MBT_PATH MBT_DEBUG MBT_TRACE
PY=${MBT_PYTHON:-/usr/bin/python3} # MBT_PYTHON: a python with numpy (a GPU machine's venv)
MBTC="$BUILD/mbtc"
DIR="$BUILD/tmp/gpu"
OUT="$DIR/out.txt"
LOSS_TOL=1e-5 # step 2's logged loss, relative (step 1's is cmpdump's)
VERIFY_BLOCKS=" mlp-bigram tiny-tiny moe-moe_tiny tiny_bf16-tiny dropout-drop rows-rows rows-rows_bf16 ghost_bn_running-running_bn "
EMU_LEFT_OUT=" gpt2-gpt2_cpu "
FAKE="$BUILD/tests/libmbt_fake_cuda.so"
FAKE_NCCL="$BUILD/tests/libmbt_fake_nccl.so" # the emulated GPU's NCCL (tests/cudaemu/fake_nccl.c)

DEVICE=${MBT_GPU_TEST_DEVICE:-cuda}
case "$DEVICE" in
cuda)
    DUT=(--device cuda)
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "SKIP: no GPU (nvidia-smi not found)"
        echo "0 passed, 0 failed"
        exit 0
    fi
    if ! gpus=$(nvidia-smi -L 2>&1); then
        echo "SKIP: no GPU (nvidia-smi -L failed: $(echo "$gpus" | head -n 1))"
        echo "0 passed, 0 failed"
        exit 0
    fi
    if ! grep -q '^GPU [0-9]' <<<"$gpus"; then
        echo "SKIP: no GPU (nvidia-smi -L lists none)"
        echo "0 passed, 0 failed"
        exit 0
    fi
    echo "# $(grep -m1 '^GPU [0-9]' <<<"$gpus")"
    ;;
emu)
    DUT=(--device cuda)
    export MBT_CUDA_ARCH=sm_80 # the stand-in driver is an 8.0 device; its cubin is all it loads
    VERIFY_BLOCKS=" mlp-bigram tiny_bf16-tiny dropout-drop rows-rows rows-rows_bf16 ghost_bn_running-running_bn " # the rest: cmpdump against the CPU, whose step the verify layer checks
    echo "# MBT_GPU_TEST_DEVICE=emu: the GPU path on the CPU (tests/cudaemu/fake_cuda.c, tests/cudaemu/cudaemu.h)"
    ;;
cpu)
    DUT=(--device cpu --threads 1)
    echo "# MBT_GPU_TEST_DEVICE=cpu: a dry run of the harness, the CPU with --threads 1 as the device under test"
    ;;
*)
    echo "tests/gpu/run.sh: MBT_GPU_TEST_DEVICE must be cuda, emu or cpu, not '$DEVICE'" >&2
    exit 2
    ;;
esac

rm -rf "$DIR"
mkdir -p "$DIR" || exit 2
if [ ! -x "$MBTC" ] || [ ! -x "$BUILD/mbt-gendata" ]; then
    fail gpu/setup "$MBTC or $BUILD/mbt-gendata does not exist (run make first)"
    summary
    exit
fi
if [ "$DEVICE" = emu ] && { [ ! -f "$FAKE" ] || ! command -v "${CXX:-g++}" >/dev/null 2>&1; }; then
    fail gpu/setup "the emulated GPU needs $FAKE (make unit) and a C++ compiler (${CXX:-g++})"
    summary
    exit
fi
if ! "$PY" -c 'import numpy' >/dev/null 2>&1; then
    fail gpu/setup "$PY cannot import numpy, which tests/gpu/cmpdump.py needs (apt-get install python3-numpy)"
    summary
    exit
fi
DATA="$DIR/d/t_train.bin"
if ! "$BUILD/mbt-gendata" --out-dir "$DIR/d" --name t --tokens 200000 --val-tokens 20000 >"$OUT" 2>&1; then
    fail gpu/setup "mbt-gendata failed" "$OUT"
    summary
    exit
fi

# jfield FILE N KEY: the value of KEY in the Nth line (a JSON object) of a --log file.
jfield() { sed -n "${2}p" "$1" | sed -n 's/.*"'"$3"'": \([^,}]*\).*/\1/p'; }
# the log without its timings: what two runs of one program must log alike
untimed() { sed 's/"ms": [^,]*, //; s/, "tokens_per_s": [^}]*//' "$1"; }
# train PROG TAG ARGS...: 2 steps, dumping step 1 to TAG.st and logging to TAG.jsonl, output in TAG.out
train() {
    local prog=$1 tag=$2
    shift 2
    { timeout 600 "$prog" train --steps 2 --data "$DATA" --dump-step "$tag.st" --log "$tag.jsonl" "$@" \
        </dev/null >"$tag.out" 2>&1; } 2>>"$tag.out"
}
# on_device KERNELS PROG TAG ARGS...: train on the device under test; KERNELS is the program's CUDA
# C (mbtc --emit=cuda), which the emulated GPU compiles into KERNELS.so and runs
on_device() {
    local cu=$1
    shift
    if [ "$DEVICE" != emu ]; then
        train "$@" "${DUT[@]}"
        return
    fi
    if [ ! -f "$cu.so" ] && ! tests/cudaemu/build.sh "$cu" "$cu.so" >"$2.out" 2>&1; then
        echo "tests/cudaemu/build.sh $cu failed" >>"$2.out"
        return 1
    fi
    MBT_LIBCUDA="$FAKE" MBT_LIBCUBLASLT="$FAKE" MBT_LIBNCCL="$FAKE_NCCL" MBT_FAKE_CUDA_EMU="$cu.so" train "$@" "${DUT[@]}"
}
# within A B TOL: A and B are numbers within TOL of A, relatively
within() {
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a; exit !(a == a + 0 && b == b + 0 && d <= t * s) }'
}

# build DIR FILE MBTC ARGS...: DIR/prog (mbtc -o) and DIR/prog.cu (--emit=cuda), unless built
# already (the probe's is mlp's; $DIR/tiny is gpu/eval's and gpu/debug-timing's); the output in $OUT
build() {
    local d=$1
    shift
    [ -x "$d/prog" ] && [ -s "$d/prog.cu" ] && return 0
    { timeout 600 "$MBTC" "$@" -o "$d/prog" </dev/null >"$OUT" 2>&1; } 2>>"$OUT" && "$MBTC" "$@" --emit=cuda >"$d/prog.cu" 2>"$OUT"
}

# on_device_cmd KERNELS PROG OUT ARGS...: PROG ARGS... on the device under test, output in OUT
on_device_cmd() {
    local cu=$1 prog=$2 out=$3
    shift 3
    if [ "$DEVICE" = emu ]; then
        [ -f "$cu.so" ] || tests/cudaemu/build.sh "$cu" "$cu.so" >"$out" 2>&1 || return 1
        MBT_LIBCUDA="$FAKE" MBT_LIBCUBLASLT="$FAKE" MBT_LIBNCCL="$FAKE_NCCL" MBT_FAKE_CUDA_EMU="$cu.so" timeout 600 "$prog" "$@" "${DUT[@]}" </dev/null >"$out" 2>&1
    else
        timeout 600 "$prog" "$@" "${DUT[@]}" </dev/null >"$out" 2>&1
    fi
}
# The GPUs a rank of NCCL needs (the emulated GPU's NCCL has as many as asked)
ngpus=0
[ "$DEVICE" = emu ] || ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
# ranks N NCCL OUT PROG ARGS...: PROG ARGS... as N ranks of the tcp backend on the device under test,
# with MBT_NCCL=NCCL (left as it is when NCCL is empty), rank R's output in OUT.R.out; ranks_rc 1
# when a rank failed. The caller's environment goes with them (VAR=... ranks ...). The port is drawn
# from the section's own range (SECTION_NO): sections running side by side never share one.
# The range lies in Linux's ephemeral ports (32768-60999), which any outgoing connection of the
# machine may hold at the moment: rank 0 failing to listen ("Address already in use") is retried on
# another port, twice at most.
ranks() {
    local n=$1 nccl=$2 out=$3 prog=$4 port pids r p try
    shift 4
    for try in 1 2 3; do
        port=$((30000 + ${SECTION_NO:-0} * 2000 + ($$ + RANDOM) % 2000)) pids=()
        for ((r = 0; r < n; r++)); do
            (
                [ -z "$nccl" ] || export MBT_NCCL="$nccl"
                export RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MBT_COMM_TIMEOUT=300
                on_device_cmd "$prog.cu" "$prog" "$out.$r.out" "$@"
            ) &
            pids+=($!)
        done
        ranks_rc=0
        for p in "${pids[@]}"; do wait "$p" || ranks_rc=1; done
        [ $ranks_rc = 0 ] || ! grep -q "cannot listen at port $port: Address already in use" "$out.0.out" && return
    done
}

# ---- the probe: one step on the device at all --------------------------------------------------
P="$DIR/mlp-bigram"
mkdir -p "$P"
if ! build "$P" examples/mlp.mbt --train bigram -I examples; then
    fail gpu/probe "mbtc examples/mlp.mbt -o or --emit=cuda failed" "$OUT"
    summary
    exit
fi
if ! on_device "$P/prog.cu" "$P/prog" "$DIR/probe"; then
    fail gpu/probe "examples/mlp.mbt cannot train on the device: ${DUT[*]} failed (nothing else was run)" "$DIR/probe.out"
    summary
    exit
fi
pass "gpu/probe (mlp trains 2 steps with ${DUT[*]})"

# lora_trained DIR NAME: fused LoRA with lora_B away from zero (gpu/NAME-trained). At the start
# lora_B is zero, so step 1 barely exercises the fused LoRA launches (docs/cuda.md, "Fused LoRA":
# the up product adds zeros, the input gradient's dS is zero): the block's executable trains 3 steps
# on the CPU, then step 1 from those weights (--init-weights) runs on the device against the CPU,
# cmpdump's tolerances - the forward's fused launch, lora.mbt's input-gradient launch (the
# embedding's gradient) and the adapters' gradients from the stored S and dS.
LORA_TRAINED_BLOCKS=" lora-lora multi_lora-multi "
lora_trained() {
    local d=$1 name=$2
    if ! timeout 600 "$d/prog" train --steps 3 --data "$DATA" --device cpu --save-weights "$d/w3.st" </dev/null >"$d/w3.out" 2>&1; then
        fail "gpu/$name-trained" "3 steps on the CPU failed" "$d/w3.out"
    elif ! train "$d/prog" "$d/tcpu" --device cpu "${CPU_THREADS[@]}" --init-weights "$d/w3.st"; then
        fail "gpu/$name-trained" "the CPU run from trained weights failed" "$d/tcpu.out"
    elif ! on_device "$d/prog.cu" "$d/prog" "$d/tdev" --init-weights "$d/w3.st"; then
        fail "gpu/$name-trained" "the ${DUT[*]} run from trained weights failed" "$d/tdev.out"
    elif "$PY" tests/gpu/cmpdump.py "$d/tcpu.st" "$d/tdev.st" >"$d/tcmp.txt" 2>&1; then
        pass "gpu/$name-trained/step ($(sed -n 's/^cmpdump: ok (\(.*\); tolerances.*/\1/p' "$d/tcmp.txt"))"
    else
        fail "gpu/$name-trained/step" "step 1 from trained weights differs on the device" "$d/tcmp.txt"
    fi
}

# ---- one train block: the step against the CPU's, reruns, the reference ---------------------------
sec_steps() {
# check_block FILE BLOCK NAME BF16 [MBTC ARGS...]
check_block() {
    local f=$1 t=$2 name=$3 bf16=$4 d="$DIR/$3" rc a b
    local OUT="$DIR/$3/out.txt" # its own: blocks may run side by side
    shift 4
    local tols=() loss_tol=$LOSS_TOL
    if [ "$bf16" = 1 ]; then
        tols=(--loss-tol 1e-4 --grad-tol 5e-2)
        loss_tol=1e-4
    fi
    mkdir -p "$d"
    if ! build "$d" "$f" --train "$t" "$@"; then
        fail "gpu/$name" "mbtc $f --train $t -o or --emit=cuda failed" "$OUT"
        return
    fi
    if ! train "$d/prog" "$d/cpu" --device cpu "${CPU_THREADS[@]}"; then fail "gpu/$name" "the CPU run failed" "$d/cpu.out"; return; fi
    if ! on_device "$d/prog.cu" "$d/prog" "$d/dev"; then fail "gpu/$name" "the ${DUT[*]} run failed" "$d/dev.out"; return; fi

    "$PY" tests/gpu/cmpdump.py "${tols[@]}" "$d/cpu.st" "$d/dev.st" >"$d/cmp.txt" 2>&1
    rc=$?
    if [ $rc = 0 ]; then pass "gpu/$name/step ($(sed -n 's/^cmpdump: ok (\(.*\); tolerances.*/\1/p' "$d/cmp.txt"))"
    else fail "gpu/$name/step" "the device's step 1 differs from the CPU's (cmpdump status $rc)" "$d/cmp.txt"; fi

    a=$(jfield "$d/cpu.jsonl" 2 loss)
    b=$(jfield "$d/dev.jsonl" 2 loss)
    if [ -n "$a" ] && [ -n "$b" ] && within "$a" "$b" "$loss_tol"; then
        pass "gpu/$name/step2 (loss: CPU $a, device $b)"
    else fail "gpu/$name/step2" "step 2's loss: CPU '$a', device '$b' (tolerance $loss_tol relative)"; fi

    if [ "$DEVICE" = emu ]; then
        : # the emulation is deterministic by construction: a rerun shows nothing
    elif ! on_device "$d/prog.cu" "$d/prog" "$d/dev2"; then
        fail "gpu/$name/rerun" "the second ${DUT[*]} run failed" "$d/dev2.out"
    elif ! cmp -s "$d/dev.st" "$d/dev2.st"; then
        "$PY" tests/gpu/cmpdump.py --exact "$d/dev.st" "$d/dev2.st" >"$OUT" 2>&1
        fail "gpu/$name/rerun" "two runs on the device dumped different step files" "$OUT"
    elif [ "$(untimed "$d/dev.jsonl")" != "$(untimed "$d/dev2.jsonl")" ]; then
        diff <(untimed "$d/dev.jsonl") <(untimed "$d/dev2.jsonl") >"$OUT"
        fail "gpu/$name/rerun" "two runs on the device logged different losses or norms" "$OUT"
    else
        pass "gpu/$name/rerun (identical dumps and logs)"
    fi

    if [[ "$VERIFY_BLOCKS" == *" $name "* ]]; then
        { timeout 600 "$MBTC" "$@" "$f" --train "$t" --verify-step "$d/dev.st" >"$OUT" 2>&1; } 2>>"$OUT"
        rc=$?
        if [ $rc = 0 ] && grep -q '^verify-step: ok' "$OUT"; then
            pass "gpu/$name/verify ($(sed -n 's/^verify-step: ok (\(.*\);.*/\1/p' "$OUT"))"
        else fail "gpu/$name/verify" "mbtc --verify-step on the device's dump: status $rc" "$OUT"; fi
    fi
    [[ "$LORA_TRAINED_BLOCKS" != *" $name "* ]] || lora_trained "$d" "$name"
    rm -f "$d"/*.st
    rm -f "$d/prog" "$d"/*.so
}

# each train block of FILE: its name, whether its body reads data/tiny_train.bin (every_example's
# rule, tests/layers/exec.sh) and whether it asks for precision = bf16
blocks() {
    LC_ALL=C awk '/^train[[:space:]]+[A-Za-z_][A-Za-z0-9_]*/ { t = $2; sub(/[^A-Za-z0-9_].*/, "", t); run = 0; bf = 0; next }
                  t != "" && /tokens\("data\/tiny_train\.bin"/ { run = 1 }
                  t != "" && /^[[:space:]]*precision[[:space:]]*=[[:space:]]*bf16/ { bf = 1 }
                  t != "" && /^}/ { print t, (run ? "run" : "build"), bf; t = "" }' "$1"
}

# Blocks run MBT_GPU_TEST_JOBS at a time (the emulated GPU: 2 by default, one core each; a GPU: 1
# by default - its programs are small, so a machine with cores to spare can run several, which
# changes no result: each run's bits depend on its own inputs alone). Each block's lines are kept
# in its report and relayed, and counted, in the blocks' order as soon as it and every block
# before it are done, so that a run cut short still shows what finished.
JOBS=${MBT_GPU_TEST_JOBS:-1}
CPU_THREADS=() # the reference's thread count changes none of its bits (the exec layer's threads test)
if [ "$DEVICE" = emu ]; then
    JOBS=${MBT_GPU_TEST_JOBS:-2}
    CPU_THREADS=(--threads 1)
fi
names=()
relayed=0
relay_done() { # the reports of the finished blocks at the head of the order
    while [ "$relayed" -lt "${#names[@]}" ] && [ -e "$DIR/${names[$relayed]}/done" ]; do
        cat "$DIR/${names[$relayed]}/report.txt"
        PASSED=$((PASSED + $(grep -c '^PASS ' "$DIR/${names[$relayed]}/report.txt")))
        FAILED=$((FAILED + $(grep -c '^FAIL ' "$DIR/${names[$relayed]}/report.txt")))
        relayed=$((relayed + 1))
    done
}
running=0
for f in examples/*.mbt tests/gpu/attn_shapes.mbt tests/gpu/attn_shapes_bf16.mbt tests/verify/tiny_bf16.mbt tests/exec/dropout.mbt \
    tests/verify/docs.mbt tests/exec/buckets.mbt tests/exec/groups.mbt tests/exec/lora.mbt tests/exec/multi_lora.mbt \
    tests/verify/ghost_bn.mbt tests/gpu/rows.mbt tests/verify/ghost_bn_running.mbt tests/gpu/docs_bf16.mbt tests/gpu/ce_pad.mbt \
    tests/gpu/concat.mbt; do
    ex=$(basename "$f" .mbt)
    while read -r t kind bf16; do
        [ "$kind" = run ] || continue
        if [ "$DEVICE" = emu ] && [[ "$EMU_LEFT_OUT" == *" $ex-$t "* ]]; then continue; fi
        names+=("$ex-$t")
        mkdir -p "$DIR/$ex-$t"
        { check_block "$f" "$t" "$ex-$t" "$bf16" -I examples >"$DIR/$ex-$t/report.txt" 2>&1; touch "$DIR/$ex-$t/done"; } &
        running=$((running + 1))
        if [ "$running" -ge "$JOBS" ]; then
            wait -n
            running=$((running - 1))
        fi
        relay_done
    done < <(blocks "$f")
done
wait
relay_done
}

# ---- aligned GEMM shapes: a padded program on the device against the unpadded one on the CPU ---------
# gpu/pad: tests/exec/pad_gemm.mbt (a vocabulary of 50, tied and untied output layers) built with
# --pad-gemm=64 runs step 1 on the device; the same source built with --pad-gemm=1 runs it on the CPU.
# cmpdump holds the two dumps (the program's shapes in both) to the tolerances of gpu/EX/step, step
# 2's loss within 1e-5, and the device's dump was written at all only if every element of its
# parameter, gradient and updated regions outside the parameters - the padded rows among them - is
# zero (rt_step_dump refuses it otherwise: docs/cuda.md, "Aligned GEMM shapes").
sec_pad() {
d="$DIR/pad"
mkdir -p "$d/p" "$d/u"
if ! "$BUILD/mbt-gendata" --out-dir "$d/d" --name t --vocab 50 --tokens 50000 --val-tokens 5000 >"$OUT" 2>&1; then
    fail gpu/pad "mbt-gendata --vocab 50 failed" "$OUT"
elif ! build "$d/p" tests/exec/pad_gemm.mbt --pad-gemm=64 -I examples || ! build "$d/u" tests/exec/pad_gemm.mbt --pad-gemm=1 -I examples; then
    fail gpu/pad "mbtc tests/exec/pad_gemm.mbt -o or --emit=cuda failed" "$OUT"
elif ! grep -q 'gemm.* n=64 ' <("$MBTC" tests/exec/pad_gemm.mbt --pad-gemm=64 --emit=kernels 2>&1); then
    fail gpu/pad "mbtc --pad-gemm=64 --emit=kernels shows no GEMM with n = 64"
elif ! DATA="$d/d/t_train.bin" train "$d/u/prog" "$d/cpu" --device cpu --threads 1; then
    fail gpu/pad "the unpadded program's CPU run failed" "$d/cpu.out"
elif ! DATA="$d/d/t_train.bin" on_device "$d/p/prog.cu" "$d/p/prog" "$d/dev"; then
    fail gpu/pad "the padded program's ${DUT[*]} run failed" "$d/dev.out"
else
    if "$PY" tests/gpu/cmpdump.py "$d/cpu.st" "$d/dev.st" >"$d/cmp.txt" 2>&1; then
        pass "gpu/pad/step (padded on the device against unpadded on the CPU: $(sed -n 's/^cmpdump: ok (\(.*\); tolerances.*/\1/p' "$d/cmp.txt"))"
    else fail gpu/pad/step "the padded program's step 1 on the device differs from the unpadded one's on the CPU" "$d/cmp.txt"; fi
    a=$(jfield "$d/cpu.jsonl" 2 loss)
    b=$(jfield "$d/dev.jsonl" 2 loss)
    if [ -n "$a" ] && [ -n "$b" ] && within "$a" "$b" "$LOSS_TOL"; then
        pass "gpu/pad/step2 (loss: unpadded CPU $a, padded device $b)"
    else fail gpu/pad/step2 "step 2's loss: unpadded CPU '$a', padded device '$b' (tolerance $LOSS_TOL relative)"; fi
fi
}

# ---- data parallelism on the device: the step's tree, one process against 2 ranks -----------------
# gpu/dp/TRANSPORT: tests/exec/dp.mbt's dp1 alone (4 micro-batches summed on the device) and dp2 as
# 2 ranks of the tcp backend (2 each), 3 steps: the same logs to every digit and byte-identical
# weights (docs/parallel.md, the tree). Two transports for the ranks' partial sums, NCCL in two ways:
#   nccl    exchanged and gathered GPU to GPU by NCCL, added on each rank's device by the same tree
#           (the emulated GPU's NCCL is tests/cudaemu/fake_nccl.c; on a real machine it needs a GPU a
#           rank: NCCL refuses two ranks on one device, so it runs where 2 GPUs are visible), after
#           the backward, whole (MBT_DP_OVERLAP=0)
#   overlap the same in 7 buckets of MBT_DP_BUCKET_MB=0.1 on a communication stream, each queued
#           during the last micro-batch's backward once final (the default with NCCL); with
#           gpu/dp/overlap-debug (MBT_DEBUG's buckets lines) and gpu/dp/overlap-control (each
#           step's join left out on the emulated GPU: other weights)
#   staged  MBT_NCCL=0: through host memory, added on the host in 7 buckets of MBT_DP_BUCKET_MB=0.1
#           after the backward (the GPU does not overlap them with it)
sec_dp() {
d="$DIR/dp"
mkdir -p "$d/1" "$d/2"
if ! build "$d/1" tests/exec/dp.mbt --train dp1 -I examples || ! build "$d/2" tests/exec/dp.mbt --train dp2 -I examples; then
    fail gpu/dp "mbtc tests/exec/dp.mbt -o or --emit=cuda failed" "$OUT"
elif [ "$DEVICE" = emu ] && ! { [ -f "$d/2/prog.cu.so" ] || tests/cudaemu/build.sh "$d/2/prog.cu" "$d/2/prog.cu.so" >"$OUT" 2>&1; }; then
    fail gpu/dp "tests/cudaemu/build.sh failed" "$OUT"
else
    on_device_cmd "$d/1/prog.cu" "$d/1/prog" "$d/1.out" train --steps 3 --data "$DATA" --save-weights "$d/1.st" --log "$d/1.jsonl"
    rc1=$?
    strip() { sed 's/"ms": [^,]*, //; s/, "tokens_per_s": [^}]*//' "$1"; }
    # dp_ranks TAG ENV...: dp2 as 2 tcp ranks on the device, 3 steps, in 7 buckets (MBT_DP_BUCKET_MB=0.1),
    # with ENV set: $d/2.TAG.st, .jsonl and .R.out; rc2 its status (1 when a rank failed).
    # DP_N and DP_DIR (2, $d/2 unless set) run another program, as that many ranks.
    dp_ranks() {
        local tag=$1 n=${DP_N:-2} dir=${DP_DIR:-$d/2}
        shift
        rm -f "$d/2.$tag.st"
        (
            export "${@?}" MBT_DP_BUCKET_MB=0.1
            ranks "$n" "" "$d/2.$tag" "$dir/prog" train --steps 3 --data "$DATA" --save-weights "$d/2.$tag.st" --log "$d/2.$tag.jsonl"
            exit $ranks_rc
        )
        rc2=$?
    }
    # nccl: the sum after the backward, whole (MBT_DP_OVERLAP=0); overlap: the GPU's buckets on a
    # communication stream during the last micro-batch's backward (the default with NCCL)
    for tr in nccl overlap staged; do
        if [ $tr != staged ] && [ "$DEVICE" != emu ] && [ "$ngpus" -lt 2 ]; then
            skip gpu/dp/$tr "NCCL needs a GPU a rank and this machine has $ngpus"
            continue
        fi
        case $tr in
        nccl) dp_ranks $tr MBT_NCCL=1 MBT_DP_OVERLAP=0 ;;
        overlap) dp_ranks $tr MBT_NCCL=1 MBT_FAKE_CUDA_WAITS=1 ;;
        staged) dp_ranks $tr MBT_NCCL=0 ;;
        esac
        if [ $tr = nccl ]; then
            said="^data-parallel: the ranks' sum on the GPUs, after the backward: shards exchanged and gathered by NCCL"
            what="the GPUs sum over NCCL"
        elif [ $tr = overlap ]; then
            said="^data-parallel: the ranks' sum on the GPUs in 7 buckets .* on a communication stream: each queued during the last micro-batch's backward"
            what="the GPUs sum 7 buckets on a communication stream during the backward"
        else
            said="^data-parallel: the ranks' sum in 7 buckets .* after the backward (the GPU's)"
            what="the GPU reduces its 7 buckets after the backward"
        fi
        if [ "$rc1" != 0 ] || [ "$rc2" != 0 ]; then
            fail gpu/dp/$tr "a run failed (alone: status $rc1; 2 ranks: $rc2)" "$d/1.out" "$d/2.$tr.0.out" "$d/2.$tr.1.out"
        elif ! grep -q "^data-parallel: 2 processes" "$d/2.$tr.0.out"; then
            fail gpu/dp/$tr "rank 0 does not say it is one of 2 processes" "$d/2.$tr.0.out"
        elif ! grep -q "$said" "$d/2.$tr.0.out"; then
            fail gpu/dp/$tr "rank 0 does not say $what" "$d/2.$tr.0.out"
        elif ! cmp -s "$d/1.st" "$d/2.$tr.st" || [ "$(strip "$d/1.jsonl")" != "$(strip "$d/2.$tr.jsonl")" ]; then
            fail gpu/dp/$tr "2 ranks on the device did not log and save what one process did" "$d/1.jsonl" "$d/2.$tr.jsonl"
        else
            pass "gpu/dp/$tr (2 ranks on the device: the logs and the weights of one process, byte for byte, 3 steps)"
        fi
    done
    # gpu/dp/overlap-debug: MBT_DEBUG's buckets lines, and with them (CUDA graphs off) the same bytes:
    # every rank queued all 7 buckets of each of the 3 steps on the communication stream before its
    # backward ended (the generated code's rt_grad_ready marks them: without it none would be)
    if [ "$DEVICE" != emu ] && [ "$ngpus" -lt 2 ]; then
        skip gpu/dp/overlap-debug "NCCL needs a GPU a rank and this machine has $ngpus"
    else
        dp_ranks dbg MBT_NCCL=1 MBT_DEBUG=1
        q="buckets overlapped with the backward in 3 reductions: 21 of 21 buckets queued on the communication stream before the backward ended"
        if [ "$rc2" != 0 ]; then
            fail gpu/dp/overlap-debug "a rank failed with MBT_DEBUG=1" "$d/2.dbg.0.out" "$d/2.dbg.1.out"
        elif ! grep -q "^\[rank 0\] $q" "$d/2.dbg.0.out" || ! grep -q "^\[rank 1\] $q" "$d/2.dbg.1.out"; then
            fail gpu/dp/overlap-debug "a rank does not say '$q'" "$d/2.dbg.0.out" "$d/2.dbg.1.out"
        elif ! cmp -s "$d/1.st" "$d/2.dbg.st"; then
            fail gpu/dp/overlap-debug "with MBT_DEBUG=1 2 ranks did not save what one process did" "$d/2.dbg.0.out"
        else
            pass "gpu/dp/overlap-debug (each rank: $q; dp1's weights)"
        fi
    fi
    # gpu/dp/overlap-control (the emulated GPU): the emulated communication stream runs its work only
    # when the compute stream waits for it (tests/cudaemu/fake_cuda.c, as late as a GPU could), so each
    # step's join shows in gpu/dp/overlap's MBT_FAKE_CUDA_WAITS trace as the wait that runs the buckets'
    # 14 launches (the local fold and the ranks' sum of 7 buckets) and 14 host functions (their NCCL
    # exchanges and gathers): none of it ran before the backward ended. Each join left out alone
    # (MBT_FAKE_CUDA_DROP_WAIT, both ranks) must end with other weights.
    if [ "$DEVICE" != emu ]; then
        skip gpu/dp/overlap-control "MBT_GPU_TEST_DEVICE=$DEVICE: only the emulated GPU can leave out a wait"
    else
        joins=$(sed -n 's/^fake_cuda: wait \([0-9]*\) also runs 14 launches and 14 host functions queued on a second stream$/\1/p' \
            "$d/2.overlap.0.out")
        same=""
        for n in $joins; do
            dp_ranks drop MBT_NCCL=1 MBT_FAKE_CUDA_DROP_WAIT="$n"
            if [ ! -s "$d/2.drop.st" ] || cmp -s "$d/1.st" "$d/2.drop.st"; then same="$same $n"; fi
        done
        if [ "$(wc -w <<<"$joins")" != 3 ]; then
            fail gpu/dp/overlap-control "gpu/dp/overlap's trace does not show 3 joins that run the 7 buckets' work ('$joins')" \
                "$d/2.overlap.0.out"
        elif [ -n "$same" ]; then
            fail gpu/dp/overlap-control "with join$same left out, 2 ranks still saved dp1's weights" "$d/2.drop.0.out"
        else
            pass "gpu/dp/overlap-control (the buckets' work ran at each step's join, waits ${joins//$'\n'/ }: 0 of 7 buckets a step started before the backward ended on the emulator; each join left out alone: other weights)"
        fi
    fi
    # gpu/dp/overlap-fail (the emulated GPU): rank 1's NCCL group fails while the backward queues its
    # first bucket (MBT_FAKE_NCCL_FAIL=1): both ranks stop with status 1, rank 1 naming the bucket's
    # ncclGroupEnd, rank 0 its buckets' NCCL error at the join (its peer gone), neither hanging
    if [ "$DEVICE" != emu ]; then
        skip gpu/dp/overlap-fail "MBT_GPU_TEST_DEVICE=$DEVICE: only the emulated NCCL fails on request"
    else
        dp_ranks fail MBT_NCCL=1 MBT_FAKE_NCCL_FAIL=1
        w1="step 1: summing the gradient over the ranks (NCCL, in buckets): the gradient's bucket 0: ncclGroupEnd"
        w0="step 1: summing the gradient over the ranks (NCCL, in buckets): NCCL (collectives: the buckets' reductions over NCCL): NCCL error"
        if [ "$rc2" = 0 ]; then
            fail gpu/dp/overlap-fail "the ranks exited 0 with rank 1's NCCL failing" "$d/2.fail.0.out" "$d/2.fail.1.out"
        elif ! grep -qF "(rank 1): $w1" "$d/2.fail.1.out" || ! grep -qF "prog: $w0" "$d/2.fail.0.out"; then
            fail gpu/dp/overlap-fail "the ranks do not say why they stopped" "$d/2.fail.0.out" "$d/2.fail.1.out"
        else
            pass "gpu/dp/overlap-fail (rank 1's group failed: both stopped; $(grep -oF "$w1" "$d/2.fail.1.out"))"
        fi
    fi
    # gpu/dp/overlap-4, -z1: the buckets overlapped with dp4 (4 ranks of one micro-batch: no local
    # fold) and z1 (ZeRO-1 on 2 ranks: each updates its shard of the summed buckets): dp1's bytes
    for spec in "dp4 4" "z1 2"; do
        read -r blk nr <<<"$spec"
        name=gpu/dp/overlap-${blk#dp}
        if [ "$DEVICE" != emu ] && [ "$ngpus" -lt "$nr" ]; then
            skip "$name" "NCCL needs a GPU a rank and this machine has $ngpus"
            continue
        fi
        mkdir -p "$d/$blk"
        if ! build "$d/$blk" tests/exec/dp.mbt --train "$blk" -I examples; then
            fail "$name" "mbtc tests/exec/dp.mbt --train $blk -o or --emit=cuda failed" "$OUT"
            continue
        fi
        if [ "$DEVICE" = emu ] && ! tests/cudaemu/build.sh "$d/$blk/prog.cu" "$d/$blk/prog.cu.so" >"$OUT" 2>&1; then
            fail "$name" "tests/cudaemu/build.sh failed" "$OUT"
            continue
        fi
        DP_N=$nr DP_DIR="$d/$blk" dp_ranks "o$blk" MBT_NCCL=1
        if [ "$rc2" != 0 ]; then
            fail "$name" "a rank failed" "$d/2.o$blk.0.out"
        elif ! grep -q "^data-parallel: the ranks' sum on the GPUs in 7 buckets .* on a communication stream" "$d/2.o$blk.0.out"; then
            fail "$name" "rank 0 does not say the GPUs sum 7 buckets on a communication stream" "$d/2.o$blk.0.out"
        elif ! cmp -s "$d/1.st" "$d/2.o$blk.st" || [ "$(strip "$d/1.jsonl")" != "$(strip "$d/2.o$blk.jsonl")" ]; then
            fail "$name" "$nr ranks did not log and save what one process did" "$d/1.jsonl" "$d/2.o$blk.jsonl"
        else
            pass "$name ($nr ranks, 7 buckets overlapped with the backward: the logs and the weights of one process, byte for byte, 3 steps)"
        fi
    done
    # gpu/zero1 (2 ranks, NCCL) and gpu/zero2 (4 ranks, staged through the host): ZeRO on the
    # device - each rank's update kernels run over its shard of the parameters, with its shard of
    # the optimizer state alone on its GPU, the updated shards gathered - give dp1's logs and
    # weights byte for byte, as on the CPU (tests/exec/dp.mbt's dp-zero1, dp-zero2)
    # zero_saves PROG DP.OUT ZERO.OUT: rank 0's device high-water mark under ZeRO is the data-parallel
    # run's (the same model, ranks and transport) less exactly the optimizer state outside its shard
    # (the whole state is never allocated on its GPU)
    zero_saves() {
        local state param len pd pz
        state=$("$1" info | sed -n 's/^plan: .*optimizer state \([0-9]*\) bytes.*/\1/p')
        param=$("$1" info | sed -n 's/^plan: parameters \([0-9]*\) bytes.*/\1/p')
        len=$(sed -n 's/^ZeRO-[12]: this rank holds and updates elements \[\([0-9]*\), \([0-9]*\)).*/\2 - \1/p' "$3")
        pd=$(sed -n 's/^GPU: peak .*(\([0-9]*\) bytes).*/\1/p' "$2")
        pz=$(sed -n 's/^GPU: peak .*(\([0-9]*\) bytes).*/\1/p' "$3")
        [ -n "$state" ] && [ -n "$param" ] && [ -n "$len" ] && [ -n "$pd" ] && [ -n "$pz" ] || {
            echo "missing: state '$state' param '$param' shard '$len' peaks '$pd' '$pz'"
            return 1
        }
        local want=$((state - state / param * 4 * (len)))
        echo "peak $pd bytes without ZeRO, $pz with: $((pd - pz)) less; the state outside the shard is $want"
        [ $((pd - pz)) = "$want" ]
    }
    # shard_moved OUT NCCL: rank 0's host updates (offload { optimizer = host }) copied its shard of
    # the gradient down each step and its shard of the parameters up - nothing up when the gather is
    # staged through the host (NCCL 0), which starts from the host's shard
    shard_moved() {
        local len want
        len=$(sed -n 's/^ZeRO-1: this rank holds and updates elements \[\([0-9]*\), \([0-9]*\)).*/\2 - \1/p' "$1")
        [ -n "$len" ] || return 1
        want="optimizer offload: the host's updates copied $((3 * 4 * (len))) bytes down and $(($2 * 3 * 4 * (len))) up in 3 steps"
        grep "^optimizer offload: " "$1"
        grep -q "^$want " "$1"
    }
    sed 's/^\(  parallel  { data = 2, zero = 1 }\)$/\1\n  offload   { optimizer = host }/' tests/exec/dp.mbt >"$d/dp_host.mbt"
    # (z1hosts: z1host staged through the host, MBT_NCCL=0: the host's update leaves the shard on the
    # host, where the gather starts from it)
    for spec in "z1 2 1" "z2 4 0" "z1host 2 1" "z1hosts 2 0"; do
        read -r blk nr nccl <<<"$spec"
        name=gpu/zero${blk#z}
        src=tests/exec/dp.mbt
        host=0
        [ "$blk" = z1host ] && name=gpu/zero1-offload-host src="$d/dp_host.mbt" host=1
        [ "$blk" = z1hosts ] && name=gpu/zero1-offload-host-staged src="$d/dp_host.mbt" host=1
        if [ "$nccl" = 1 ] && [ "$DEVICE" != emu ] && [ "$ngpus" -lt "$nr" ]; then
            skip $name "NCCL needs a GPU a rank and this machine has $ngpus"
            continue
        fi
        mkdir -p "$d/$blk"
        if ! build "$d/$blk" "$src" --train "${blk%%host*}" -I examples; then
            fail $name "mbtc $src --train ${blk%%host*} -o or --emit=cuda failed" "$OUT"
            continue
        fi
        # the emulated kernels built once, before the ranks (each would build them into one file)
        if [ "$DEVICE" = emu ] && ! tests/cudaemu/build.sh "$d/$blk/prog.cu" "$d/$blk/prog.cu.so" >"$OUT" 2>&1; then
            fail $name "tests/cudaemu/build.sh failed" "$OUT"
            continue
        fi
        ranks "$nr" "$nccl" "$d/$blk" "$d/$blk/prog" train --steps 3 --data "$DATA" --save-weights "$d/$blk.st" --log "$d/$blk.jsonl"
        rc2=$ranks_rc
        if [ $rc1 != 0 ] || [ $rc2 != 0 ]; then
            fail $name "a run failed (alone: status $rc1; $nr ranks: $rc2)" "$d/$blk.0.out"
        elif ! grep -q "^ZeRO-${blk:1:1}: this rank holds and updates elements \[0, " "$d/$blk.0.out"; then
            fail $name "rank 0 does not say it updates its shard" "$d/$blk.0.out"
        elif [ $host = 1 ] && [ "$DEVICE" != emu ]; then # the host's update has no FMA: within 1e-5, as gpu/offload-host
            if "$BUILD/tests/st_compare" "$d/1.st" "$d/$blk.st" "" 1e-5 norm >"$OUT" 2>&1; then
                pass "$name ($nr ranks, the CPU updating each shard: one process's weights within 1e-5)"
            else fail $name "the weights differ from one process's by more than 1e-5" "$OUT"; fi
        elif ! cmp -s "$d/1.st" "$d/$blk.st" || [ "$(strip "$d/1.jsonl")" != "$(strip "$d/$blk.jsonl")" ]; then
            fail $name "$nr ranks with ZeRO on the device did not log and save what one process did" "$d/1.jsonl" "$d/$blk.jsonl"
        elif [ $host = 1 ] && ! grep -q "^optimizer state: in host memory .*the CPU updates it" "$d/$blk.0.out"; then
            fail $name "rank 0 does not say the CPU updates the state in host memory" "$d/$blk.0.out"
        elif [ $host = 1 ] && ! shard_moved "$d/$blk.0.out" "$nccl" >"$OUT"; then
            fail $name "rank 0's host updates did not move its shard alone" "$OUT"
        elif [ "$blk" = z1 ] && ! zero_saves "$d/$blk/prog" "$d/2.nccl.0.out" "$d/$blk.0.out" >"$OUT"; then
            fail $name "rank 0's device memory does not fall by the optimizer state it no longer holds" "$OUT"
        else
            pass "$name ($nr ranks, MBT_NCCL=$nccl: the logs and the weights of one process, byte for byte, 3 steps$([ "$blk" = z1 ] && echo "; $(tail -n 1 "$OUT")"))"
        fi
    done
fi
}

# ---- ZeRO-2's partial sums by shard on the device (docs/parallel.md) ----------------------------------
# gpu/zero2-shard (2 ranks, NCCL) and gpu/zero2-shard-staged (4 ranks, MBT_NCCL=0): tests/exec/zero2.mbt's
# z2n2a3 and z2n4a3 (3 micro-batches a rank, not a power of two: exact by the interleaved path
# alone), each micro-batch's gradient exchanged by shards and summed into shard-size partial sums
# (on the device over NCCL, in host memory staged), 3 steps: the logs and the weights of one process
# (ref6, ref12) byte for byte, and rank 0's banner saying which.
sec_zero2() {
d="$DIR/zero2-shard"
for spec in "ref6 z2n2a3 2 1 gpu/zero2-shard" "ref12 z2n4a3 4 0 gpu/zero2-shard-staged"; do
    read -r ref blk nr nccl name <<<"$spec"
    where="on the GPU; NCCL exchanges them"
    [ "$nccl" = 0 ] && where="of host memory: each micro-batch's gradient staged through the host"
    if [ "$nccl" = 1 ] && [ "$DEVICE" != emu ] && [ "$ngpus" -lt "$nr" ]; then
        skip $name "NCCL needs a GPU a rank and this machine has $ngpus"
        continue
    fi
    mkdir -p "$d/$ref" "$d/$blk"
    if ! build "$d/$ref" tests/exec/zero2.mbt --train "$ref" -I examples || ! build "$d/$blk" tests/exec/zero2.mbt --train "$blk" -I examples; then
        fail $name "mbtc tests/exec/zero2.mbt -o or --emit=cuda failed" "$OUT"
        continue
    fi
    if [ "$DEVICE" = emu ] && ! { [ -f "$d/$blk/prog.cu.so" ] || tests/cudaemu/build.sh "$d/$blk/prog.cu" "$d/$blk/prog.cu.so" >"$OUT" 2>&1; }; then
        fail $name "tests/cudaemu/build.sh failed" "$OUT"
        continue
    fi
    on_device_cmd "$d/$ref/prog.cu" "$d/$ref/prog" "$d/$ref.out" train --steps 3 --data "$DATA" --save-weights "$d/$ref.st" --log "$d/$ref.jsonl"
    rc1=$?
    ranks "$nr" "$nccl" "$d/$blk" "$d/$blk/prog" train --steps 3 --data "$DATA" --save-weights "$d/$blk.st" --log "$d/$blk.jsonl"
    rc2=$ranks_rc
    if [ $rc1 != 0 ] || [ $rc2 != 0 ]; then
        fail $name "a run failed (alone: status $rc1; $nr ranks: $rc2)" "$d/$blk.0.out"
    elif ! grep -q "^gradient partial sums: by shard (ZeRO-2, $nr ranks, a power of two): .* bytes $where)$" "$d/$blk.0.out"; then
        fail $name "rank 0 does not say its partial sums are by shard, $where" "$d/$blk.0.out"
    elif ! cmp -s "$d/$ref.st" "$d/$blk.st" || [ "$(untimed "$d/$ref.jsonl")" != "$(untimed "$d/$blk.jsonl")" ]; then
        fail $name "$nr ranks with ZeRO-2's partial sums by shard did not log and save what one process did" "$d/$ref.jsonl" "$d/$blk.jsonl"
    else
        pass "$name ($nr ranks x 3 micro-batches, MBT_NCCL=$nccl, partial sums by shard $where: the logs and the weights of one process, byte for byte, 3 steps)"
    fi
done
# gpu/zero2-shard-control: z0n2a3 (zero = 0, the contiguous path: each rank's 3 micro-batches by its
# own tree, then the ranks') as 2 staged ranks must end with other weights than ref6's
name=gpu/zero2-shard-control
mkdir -p "$d/z0n2a3" "$d/ref6"
# (ref6 runs above only where 2 ranks of NCCL can: on one GPU it runs here, as this staged control's reference)
if [ ! -s "$d/ref6.st" ] && build "$d/ref6" tests/exec/zero2.mbt --train ref6 -I examples; then
    on_device_cmd "$d/ref6/prog.cu" "$d/ref6/prog" "$d/ref6.out" train --steps 3 --data "$DATA" --save-weights "$d/ref6.st" --log "$d/ref6.jsonl"
fi
if [ ! -s "$d/ref6.st" ]; then
    fail $name "the one-process reference ref6 did not build or run on the device" "$d/ref6.out"
elif ! build "$d/z0n2a3" tests/exec/zero2.mbt --train z0n2a3 -I examples \
    || { [ "$DEVICE" = emu ] && ! { [ -f "$d/z0n2a3/prog.cu.so" ] || tests/cudaemu/build.sh "$d/z0n2a3/prog.cu" "$d/z0n2a3/prog.cu.so" >"$OUT" 2>&1; }; }; then
    fail $name "mbtc tests/exec/zero2.mbt --train z0n2a3 (or its emulated kernels) failed" "$OUT"
else
    ranks 2 0 "$d/z0n2a3" "$d/z0n2a3/prog" train --steps 3 --data "$DATA" --save-weights "$d/z0n2a3.st"
    rc2=$ranks_rc
    if [ $rc2 != 0 ]; then
        fail $name "a rank failed" "$d/z0n2a3.0.out"
    elif ! grep -q "^gradient partial sums: whole-size" "$d/z0n2a3.0.out"; then
        fail $name "rank 0 does not say its partial sums are whole-size" "$d/z0n2a3.0.out"
    elif cmp -s "$d/ref6.st" "$d/z0n2a3.st"; then
        fail $name "the contiguous path at 2 x 3 saved one process's bytes: the comparison above cannot tell the trees apart" "$d/z0n2a3.0.out"
    else
        pass "$name (2 ranks x 3, the contiguous path: other weights than one process's)"
    fi
fi

# gpu/zero2-buckets: z2n2a3 as 2 ranks over NCCL with MBT_DP_BUCKET_MB=0.1 (7 buckets): each
# micro-batch's exchange bucket by bucket on the communication stream during its backward, each
# bucket cut at the ZeRO shards (docs/parallel.md, "ZeRO-2's buckets overlapped with each
# backward"), 3 steps: ref6's logs and weights byte for byte, the banner's receive buffer a bucket's
# (131072 bytes against the whole exchange's 524288), MBT_DEBUG's line every bucket queued before
# its backward ended. gpu/zero2-buckets-no-join: MBT_TEST_DROP_JOIN=1 (the join after each backward
# left out) is caught at the second micro-batch, every rank failing.
name=gpu/zero2-buckets
if [ "$DEVICE" != emu ] && [ "$ngpus" -lt 2 ]; then
    skip $name "NCCL needs a GPU a rank and this machine has $ngpus"
    skip $name-no-join "NCCL needs a GPU a rank and this machine has $ngpus"
elif [ ! -s "$d/ref6.st" ] || [ ! -x "$d/z2n2a3/prog" ]; then
    fail $name "no ref6 run or z2n2a3 build on the device above (gpu/zero2-shard's)"
    fail $name-no-join "no ref6 run or z2n2a3 build on the device above (gpu/zero2-shard's)"
else
    for mode in buckets no-join; do
        dbg=1 drop=
        [ $mode = no-join ] && dbg= drop=1
        rm -f "$d/zb.st" "$d/zb.jsonl"
        MBT_DP_BUCKET_MB=0.1 MBT_DEBUG=$dbg MBT_TEST_DROP_JOIN=$drop ranks 2 "" "$d/zb-$mode" "$d/z2n2a3/prog" \
            train --steps 3 --data "$DATA" --save-weights "$d/zb.st" --log "$d/zb.jsonl"
        rc2=$ranks_rc
        if [ $mode = no-join ]; then
            if [ $rc2 = 0 ]; then
                fail $name-no-join "the ranks ran to the end with the join left out" "$d/zb-$mode.0.out"
            # (each rank catches it at its second micro-batch: global 3 on rank 0, 4 on rank 1)
            elif ! grep -q "step 1, micro-batch [34]: the GPU's gradient buckets: a reduction began while the one before was not joined" "$d/zb-$mode.0.out" "$d/zb-$mode.1.out"; then
                fail $name-no-join "no rank said the join was left out" "$d/zb-$mode.0.out" "$d/zb-$mode.1.out"
            else
                pass "$name-no-join (the join left out: caught at a rank's second micro-batch, every rank failing)"
            fi
        elif [ $rc2 != 0 ]; then
            fail $name "a rank failed" "$d/zb-$mode.0.out"
        elif ! grep -q "^data-parallel: ZeRO-2's exchange on the GPUs in 7 buckets .* receive buffer 131072 bytes on the GPU (the whole exchange's: 524288)" "$d/zb-$mode.0.out"; then
            fail $name "rank 0 does not say ZeRO-2's exchange is in 7 buckets with a bucket's receive buffer" "$d/zb-$mode.0.out"
        elif ! grep -q "^\[rank 0\] buckets overlapped with the backward in 9 reductions: 63 of 63 buckets queued on the communication stream before the backward ended" "$d/zb-$mode.0.out"; then
            fail $name "rank 0's MBT_DEBUG line does not count every bucket queued during its backward" "$d/zb-$mode.0.out"
        elif ! cmp -s "$d/ref6.st" "$d/zb.st" || [ "$(untimed "$d/ref6.jsonl")" != "$(untimed "$d/zb.jsonl")" ]; then
            fail $name "2 ranks with ZeRO-2's buckets did not log and save what one process did" "$d/ref6.jsonl" "$d/zb.jsonl"
        else
            pass "$name (2 ranks x 3 over NCCL, 7 buckets on the communication stream during every backward: one process's logs and weights, 3 steps)"
        fi
    done
fi
}

# ---- ZeRO-3 on the device: the parameters sharded, gathered around their uses ----------------------
# tests/exec/zero3.mbt (dp.mbt's model, an evaluation, checkpoints) built by sed as one process
# without ZeRO (r1), 2 ranks (r2, as written) and 4 (r4), zero = 3 (docs/parallel.md, "ZeRO-3 on
# the GPU"). Each rank's device holds its shard of the parameters in a reserved region; the rest is
# mapped and gathered around the step's uses on a stream the launches wait for, and unmapped after
# (the emulated driver's pages are 4 KiB, and touching one no chunk is mapped at ends the run).
#   gpu/zero3          2 ranks over NCCL, 4 steps with an evaluation at the last and a checkpoint
#                      every 2: r1's log records and weights byte for byte, and step 2's checkpoint
#                      files r1's
#   gpu/zero3-4        4 ranks staged through the host (MBT_NCCL=0): r1's logs and weights; each
#                      rank's measured high-water of mapped parameter pages within the bound the run
#                      prints (its shard's pages + the pages the plan's gathers map at once, which
#                      `info` claims, recomputed here) and below the whole region; on the emulated
#                      GPU the programs with zero = 3 are built with --zero3-page=65536 and run at
#                      MBT_FAKE_CUDA_GRANULARITY=65536 (a real GPU: 2 MiB, the default, where this
#                      model's region is one page: below it is then zero3-deep's, z3_memory says)
#   gpu/zero3-deep     the same memory check on d = 128 with 8 layers (4 ranks, 1 step); on a GPU d =
#                      256, whose region spans more pages than a rank's bound, so that below the
#                      region is checked on every device
#   gpu/zero3-bf16     that model with precision = bf16 (its casts each before its reader), 2 ranks
#                      staged, 1 step: one process's logs and weights, and the memory check
#   gpu/zero3-dump     2 ranks' --dump-step file (the whole region gathered) one process's
#   gpu/zero3-moe      tests/exec/dp_moe.mbt with zero = 3 (forward_stats gathers too), 2 ranks over
#                      NCCL: moe1's logs and weights, 3 steps
#   gpu/zero3-resume   4 ranks (staged) resume gpu/zero3's step-2 checkpoint to r1's step-4 weights
#   gpu/zero3-offload-host  r2 with offload { optimizer = host } (each rank's CPU updating its shard)
#   gpu/zero3-control  (emulated GPU) a broken schedule, each gather released before the launches
#                      that read it (MBT_TEST_ZERO3_RELEASE_EARLY=1): the run stops at the first read
#                      of an unmapped page; gpu/zero3-wait-control: one wait of the compute stream
#                      for a gather left out (MBT_FAKE_CUDA_DROP_WAIT=3): not r1's weights;
#                      gpu/zero3-fail: rank 1's NCCL failing in a gather stops both ranks, saying why;
#                      gpu/zero3-page: a granularity (4 KiB) other than the plan's page is refused
sec_zero3() {
d="$DIR/zero3"
mkdir -p "$d/r1" "$d/r2" "$d/r4"
sed 's/data[[:space:]]=[[:space:]]2,[[:space:]]zero[[:space:]]=[[:space:]]3/data=1/' tests/exec/zero3.mbt >"$d/r1.mbt"
cp tests/exec/zero3.mbt "$d/r2.mbt"
sed 's/data[[:space:]]=[[:space:]]2/data=4/' tests/exec/zero3.mbt >"$d/r4.mbt"
# The page the plan groups ZeRO-3's gathers by must be the device's allocation granularity (the
# run refuses another): a real GPU's 2 MiB is a GPU build's default; the emulated GPU runs at 64 KiB
# (MBT_FAKE_CUDA_GRANULARITY, for this section), the programs with zero = 3 built for it
Z3PAGE=()
Z3DEEP="d=256,layers=8" # gpu/zero3-deep's and -bf16's model (below)
z3_gran_saved=${MBT_FAKE_CUDA_GRANULARITY-unset}
if [ "$DEVICE" = emu ]; then
    Z3PAGE=(--zero3-page=65536)
    Z3DEEP="d=128,layers=8"
    export MBT_FAKE_CUDA_GRANULARITY=65536
fi
z3_built=1
for t in r1 r2 r4; do
    z3p=("${Z3PAGE[@]}")
    [ $t = r1 ] && z3p=() # one process without ZeRO: no page to give
    if ! build "$d/$t" "$d/$t.mbt" -I examples "${z3p[@]}"; then
        fail gpu/zero3 "mbtc $t.mbt (tests/exec/zero3.mbt) -o or --emit=cuda failed" "$OUT"
        z3_built=0
    elif [ "$DEVICE" = emu ] && ! { [ -f "$d/$t/prog.cu.so" ] || tests/cudaemu/build.sh "$d/$t/prog.cu" "$d/$t/prog.cu.so" >"$OUT" 2>&1; }; then
        fail gpu/zero3 "tests/cudaemu/build.sh failed for $t" "$OUT"
        z3_built=0
    fi
done
# z3_ranks N NCCL TAG PROG ARGS...: PROG train ARGS as N ranks (tcp) with MBT_NCCL=NCCL on the
# device; output in $d/TAG.R.out; z3rc 1 when a rank failed. Extra environment from the caller's.
z3_ranks() {
    local n=$1 nccl=$2 tag=$3 prog=$4
    shift 4
    ranks "$n" "$nccl" "$d/$tag" "$prog" train --data "$DATA" "$@"
    z3rc=$ranks_rc
}
# the log's step and evaluation records without their timings (a checkpoint's record times its write)
z3log() { untimed "$1" | grep -v '"checkpoint"'; }
# z3_same A B: A.st and B.st byte for byte, and A.jsonl and B.jsonl the same records (z3log)
z3_same() { cmp -s "$1.st" "$2.st" && [ "$(z3log "$1.jsonl")" = "$(z3log "$2.jsonl")" ]; }
# z3_vs_one NAME TAG N NCCL ARGS...: $d/TAG1's program trained ARGS on the device as one process and
# $d/TAG2's as N ranks (z3_ranks; outputs $d/TAG.R.out), each with --log and --save-weights
# ($d/TAG1.*, $d/TAG2.*); returns 0 when both ran and the ranks logged and saved what one process
# did, else fails NAME and returns 1
z3_vs_one() {
    local name=$1 tag=$2 n=$3 nccl=$4 rc1
    shift 4
    on_device_cmd "$d/${tag}1/prog.cu" "$d/${tag}1/prog" "$d/${tag}1.out" train --data "$DATA" "$@" \
        --log "$d/${tag}1.jsonl" --save-weights "$d/${tag}1.st"
    rc1=$?
    z3_ranks "$n" "$nccl" "$tag" "$d/${tag}2/prog" "$@" --log "$d/${tag}2.jsonl" --save-weights "$d/${tag}2.st"
    if [ $rc1 != 0 ] || [ $z3rc != 0 ]; then
        fail "$name" "a run failed (alone: $rc1; $n ranks: $z3rc)" "$d/${tag}1.out" "$d/$tag.0.out"
        return 1
    elif ! z3_same "$d/${tag}1" "$d/${tag}2"; then
        fail "$name" "$n ranks with ZeRO-3 did not log and save what one process did" "$d/${tag}1.jsonl" "$d/${tag}2.jsonl"
        return 1
    fi
}
if [ $z3_built = 1 ]; then
    on_device_cmd "$d/r1/prog.cu" "$d/r1/prog" "$d/r1.out" train --data "$DATA" --steps 4 --ckpt-every 2 --ckpt-dir "$d/ck1" \
        --log "$d/r1.jsonl" --save-weights "$d/r1.st"
    rc1=$?
    if [ $rc1 != 0 ]; then
        fail gpu/zero3 "one process without ZeRO failed (status $rc1)" "$d/r1.out"
    elif [ "$DEVICE" != emu ] && [ "$ngpus" -lt 2 ]; then
        skip gpu/zero3 "NCCL needs a GPU a rank and this machine has $ngpus"
    else
        rm -rf "$d/ck2"
        z3_ranks 2 1 z2 "$d/r2/prog" --steps 4 --ckpt-every 2 --ckpt-dir "$d/ck2" --log "$d/z2.jsonl" --save-weights "$d/z2.st"
        if [ $z3rc != 0 ]; then
            fail gpu/zero3 "2 ranks with ZeRO-3 failed" "$d/z2.0.out" "$d/z2.1.out"
        elif ! grep -q "^ZeRO-3: this rank holds elements \[0, 65536) .*on the GPU: .*gathered by NCCL" "$d/z2.0.out"; then
            fail gpu/zero3 "rank 0 does not say it gathers its parameters by NCCL on the GPU" "$d/z2.0.out"
        elif ! z3_same "$d/r1" "$d/z2"; then
            fail gpu/zero3 "2 ranks with ZeRO-3 did not log and save what one process did" "$d/r1.jsonl" "$d/z2.jsonl"
        elif ! cmp -s "$d/ck1/step-00000002/model.safetensors" "$d/ck2/step-00000002/model.safetensors" ||
            ! cmp -s "$d/ck1/step-00000002/optimizer.safetensors" "$d/ck2/step-00000002/optimizer.safetensors"; then
            fail gpu/zero3 "the 2 ranks' step-2 checkpoint is not one process's" "$d/z2.0.out"
        else
            pass "gpu/zero3 (2 ranks over NCCL: the logs, an evaluation, a checkpoint and the weights of one process, byte for byte, 4 steps)"
        fi
    fi
    # z3_memory PROG OUT N [SPANS]: the N ranks' measured high-water marks of mapped parameter pages
    # (rank 0's lines in OUT) each within the bound the run prints with the window `PROG info`
    # claims, and below the whole region. Below the region can only hold where the region is more
    # pages than a rank's bound (`info`'s "M of the region's R pages", M < R): on the emulated GPU
    # (64 KiB pages) every program here is, and it is checked always; on a GPU, whose pages are 2 MiB,
    # tests/exec/zero3.mbt's whole region (449536 bytes) is one page, so there it is checked where
    # M < R and said to be out of reach otherwise - and with SPANS (gpu/zero3-deep, sized for it)
    # M < R must hold, so that one run on every device holds a rank below the whole region. Prints
    # the marks.
    z3_memory() {
        local claim pg wp region bad most rpages
        claim=$("$1" info | sed -n "s/^plan: ZeRO-3: pages of \([0-9]*\) bytes: the gathers map at most \([0-9]*\) pages at once .*: \([0-9]*\) of the region's \([0-9]*\) pages.*/\1 \2 \3 \4/p")
        read -r pg wp most rpages <<<"$claim"
        region=$("$1" info | sed -n "s/^plan: ZeRO-3: a rank holds .*region's \([0-9]*\) bytes$/\1/p")
        if [ -z "$wp" ] || [ -z "$rpages" ] || [ -z "$region" ] ||
            [ "$(grep -c "^ZeRO-3: rank [0-9]*: high-water [0-9]* bytes .* window $wp pages, of $pg bytes): within$" "$2")" != "$3" ]; then
            echo "a rank's mapped parameter pages are not within its shard's pages + the plan's window (${wp:-no claim} pages of ${pg:-?} bytes)"
            return 1
        fi
        # the bound recomputed here: high-water <= (the shard's pages + the window's) x the page
        bad=$(sed -n "s/^ZeRO-3: rank \([0-9]*\): high-water \([0-9]*\) bytes .*(shard [0-9]* in \([0-9]*\) pages + window .*/\1 \2 \3/p" "$2" |
            awk -v pg="$pg" -v wp="$wp" '$2 > ($3 + wp) * pg { print "rank " $1 ": " $2 " bytes above (" $3 " + " wp ") x " pg }')
        if [ -n "$bad" ]; then
            echo "$bad"
            return 1
        fi
        local below="below it"
        if [ "$DEVICE" != emu ] && [ "$most" -ge "$rpages" ]; then
            if [ -n "${4:-}" ]; then
                echo "the plan's bound is the whole region ($most of its $rpages pages of $pg bytes): a rank below the region cannot be told apart here"
                return 1
            fi
            below="the region's $rpages pages within the bound's $most: below it is gpu/zero3-deep's check here"
        elif awk -v r="$region" '/^ZeRO-3: rank [0-9]*: high-water/ { if ($5 + 0 >= r + 0) bad = 1 } END { exit !bad }' "$2"; then
            echo "a rank mapped the whole parameter region ($region bytes)"
            return 1
        fi
        echo "mapped $(sed -n 's/^ZeRO-3: rank [0-9]*: high-water \([0-9]*\) bytes.*/\1/p' "$2" | paste -sd/ -) of the region's $region bytes in pages of $pg, each within its shard's pages + $wp, $below"
    }
    z3_ranks 4 0 z4 "$d/r4/prog" --steps 4 --log "$d/z4.jsonl" --save-weights "$d/z4.st"
    if [ $z3rc != 0 ]; then
        fail gpu/zero3-4 "4 ranks with ZeRO-3 (staged) failed" "$d/z4.0.out" "$d/z4.1.out" "$d/z4.2.out" "$d/z4.3.out"
    elif ! z3_same "$d/r1" "$d/z4"; then
        fail gpu/zero3-4 "4 ranks with ZeRO-3 did not log and save what one process did" "$d/r1.jsonl" "$d/z4.jsonl"
    elif ! z3_memory "$d/r4/prog" "$d/z4.0.out" 4 >"$OUT"; then
        fail gpu/zero3-4 "$(cat "$OUT")" "$d/z4.0.out"
    else
        pass "gpu/zero3-4 (4 ranks staged: one process's logs and weights, byte for byte; $(cat "$OUT"))"
    fi
    # the same memory check on a deeper model, 1 step (each step gathers and releases the same): d =
    # 128, 8 layers, 1.6 M parameters, on the emulated GPU (99 pages of 64 KiB); on a GPU d = 256 (6.4
    # M, 13 pages of 2 MiB, a rank's bound 9 of them), where d = 128's 4 pages are all within a rank's
    # bound and could not show a rank below the region (z3_memory's SPANS)
    mkdir -p "$d/deep"
    sed "s/d[[:space:]]=[[:space:]]64,[[:space:]]layers[[:space:]]=[[:space:]]2/$Z3DEEP/" "$d/r4.mbt" >"$d/deep.mbt"
    if ! build "$d/deep" "$d/deep.mbt" -I examples "${Z3PAGE[@]}"; then
        fail gpu/zero3-deep "mbtc deep.mbt -o or --emit=cuda failed" "$OUT"
    else
        z3_ranks 4 0 deep "$d/deep/prog" --steps 1
        if [ $z3rc != 0 ]; then
            fail gpu/zero3-deep "4 ranks of the deeper model failed" "$d/deep.0.out"
        elif ! z3_memory "$d/deep/prog" "$d/deep.0.out" 4 spans >"$OUT"; then
            fail gpu/zero3-deep "$(cat "$OUT")" "$d/deep.0.out"
        else
            pass "gpu/zero3-deep (4 ranks, ${Z3DEEP//,/, }: $(cat "$OUT"))"
        fi
    fi
    # a bf16 program (the deeper model with precision = bf16, 2 ranks staged, 1 step): its weight
    # casts are each a launch of its own before the copy's first reader under zero = 3
    # (fuse_casts_apart), so the gathers map a window, not every page at the step's first launch
    # (before: 99 of the region's 99 pages at 64 KiB); one process's logs and weights, byte for byte
    mkdir -p "$d/bf1" "$d/bf2"
    sed "s/steps[[:space:]]*=[[:space:]]20/steps=20\nprecision=bf16/; s/d[[:space:]]=[[:space:]]64,[[:space:]]layers[[:space:]]=[[:space:]]2/$Z3DEEP/" \
        tests/exec/zero3.mbt >"$d/bf2.mbt"
    sed 's/data[[:space:]]=[[:space:]]2,[[:space:]]zero[[:space:]]=[[:space:]]3/data=1/' "$d/bf2.mbt" >"$d/bf1.mbt"
    if ! build "$d/bf1" "$d/bf1.mbt" -I examples || ! build "$d/bf2" "$d/bf2.mbt" -I examples "${Z3PAGE[@]}"; then
        fail gpu/zero3-bf16 "mbtc bf1.mbt or bf2.mbt -o or --emit=cuda failed" "$OUT"
    elif z3_vs_one gpu/zero3-bf16 bf 2 0 --steps 1; then
        if ! z3_memory "$d/bf2/prog" "$d/bf.0.out" 2 >"$OUT"; then
            fail gpu/zero3-bf16 "$(cat "$OUT")" "$d/bf.0.out"
        else
            pass "gpu/zero3-bf16 (2 ranks staged, bf16, ${Z3DEEP//,/, }: one process's logs and weights, byte for byte; $(cat "$OUT"))"
        fi
    fi
    # --dump-step: 2 ranks (staged) write the file one process writes (the whole region gathered)
    on_device_cmd "$d/r1/prog.cu" "$d/r1/prog" "$d/r1d.out" train --data "$DATA" --steps 1 --dump-step "$d/r1.dump"
    rc1=$?
    z3_ranks 2 0 dump "$d/r2/prog" --steps 1 --dump-step "$d/z2.dump"
    if [ $rc1 != 0 ] || [ $z3rc != 0 ]; then
        fail gpu/zero3-dump "a --dump-step run failed (alone: $rc1; 2 ranks: $z3rc)" "$d/r1d.out" "$d/dump.0.out"
    elif ! cmp -s "$d/r1.dump" "$d/z2.dump"; then
        fail gpu/zero3-dump "2 ranks with ZeRO-3 dumped another step 1 than one process" "$d/dump.0.out"
    else
        pass "gpu/zero3-dump (2 ranks staged: --dump-step's file byte for byte one process's)"
    fi
    # the MoE example (tests/exec/dp_moe.mbt): its router statistics come from forward_stats, which
    # gathers by a schedule of its own; 2 ranks over NCCL, 3 steps, moe1's logs and weights
    mkdir -p "$d/moe1" "$d/moe2"
    sed 's/data[[:space:]]=[[:space:]]2[[:space:]]}/data=2,zero=3}/' tests/exec/dp_moe.mbt >"$d/moe3.mbt"
    if ! build "$d/moe1" "$d/moe3.mbt" --train moe1 -I examples || ! build "$d/moe2" "$d/moe3.mbt" --train moe2 -I examples "${Z3PAGE[@]}"; then
        fail gpu/zero3-moe "mbtc dp_moe.mbt -o or --emit=cuda failed" "$OUT"
    elif [ "$DEVICE" != emu ] && [ "$ngpus" -lt 2 ]; then
        skip gpu/zero3-moe "NCCL needs a GPU a rank and this machine has $ngpus"
    elif [ "$DEVICE" = emu ] && ! { [ -f "$d/moe2/prog.cu.so" ] || tests/cudaemu/build.sh "$d/moe2/prog.cu" "$d/moe2/prog.cu.so" >"$OUT" 2>&1; }; then
        fail gpu/zero3-moe "tests/cudaemu/build.sh failed" "$OUT"
    elif z3_vs_one gpu/zero3-moe moe 2 1 --steps 3; then
        pass "gpu/zero3-moe (2 ranks over NCCL, forward_stats gathering too: one process's logs and weights, byte for byte, 3 steps)"
    fi
    if [ ! -d "$d/ck2/step-00000002" ]; then
        skip gpu/zero3-resume "gpu/zero3 wrote no checkpoint to resume"
    else
        z3_ranks 4 0 res "$d/r4/prog" --steps 4 --resume "$d/ck2/step-00000002" --ckpt-dir "$d/ck4" --save-weights "$d/res.st"
        if [ $z3rc != 0 ] || ! grep -q "^resumed from '.*step-00000002': step 2 done" "$d/res.0.out"; then
            fail gpu/zero3-resume "4 ranks did not resume the 2 ranks' checkpoint" "$d/res.0.out"
        elif ! cmp -s "$d/r1.st" "$d/res.st"; then
            fail gpu/zero3-resume "the resumed run's step-4 weights are not one process's" "$d/res.0.out"
        else
            pass "gpu/zero3-resume (2 ranks' step-2 checkpoint resumed by 4 with ZeRO-3: one process's step-4 weights)"
        fi
    fi
    # offload { optimizer = host }: each rank's CPU updates its shard of the parameters (the host's
    # copy, uploaded to its device shard); 2 ranks staged, r1's weights (within 1e-5 on a GPU, whose
    # update kernels fuse multiply-adds the host's loop does not; byte for byte on the emulated one)
    mkdir -p "$d/oh"
    sed 's/^\(  parallel  { data = 2, zero = 3 }\)$/\1\n  offload   { optimizer = host }/' tests/exec/zero3.mbt >"$d/oh.mbt"
    if ! build "$d/oh" "$d/oh.mbt" -I examples "${Z3PAGE[@]}"; then
        fail gpu/zero3-offload-host "mbtc oh.mbt -o or --emit=cuda failed" "$OUT"
    else
        z3_ranks 2 0 oh "$d/oh/prog" --steps 4 --save-weights "$d/oh.st"
        if [ $z3rc != 0 ]; then
            fail gpu/zero3-offload-host "2 ranks with the optimizer on the host failed" "$d/oh.0.out" "$d/oh.1.out"
        elif ! grep -q "^optimizer state: in host memory .*the CPU updates it" "$d/oh.0.out"; then
            fail gpu/zero3-offload-host "rank 0 does not say the CPU updates the state in host memory" "$d/oh.0.out"
        elif [ "$DEVICE" = emu ] && ! cmp -s "$d/r1.st" "$d/oh.st"; then
            fail gpu/zero3-offload-host "the weights are not one process's" "$d/oh.0.out"
        elif ! "$BUILD/tests/st_compare" "$d/r1.st" "$d/oh.st" "" 1e-5 norm >"$OUT" 2>&1; then
            fail gpu/zero3-offload-host "the weights differ from one process's by more than 1e-5" "$OUT"
        else
            pass "gpu/zero3-offload-host (2 ranks staged, each CPU updating its shard: one process's weights$([ "$DEVICE" = emu ] && echo ", byte for byte" || echo " within 1e-5"))"
        fi
    fi
    if [ "$DEVICE" != emu ]; then
        skip gpu/zero3-control "the emulated GPU's controls (a real GPU faults differently)"
    else
        MBT_TEST_ZERO3_RELEASE_EARLY=1 z3_ranks 2 0 early "$d/r2/prog" --steps 1 --save-weights "$d/early.st"
        if [ $z3rc = 0 ]; then
            fail gpu/zero3-control "with each gather released before its launches, the ranks still exited 0" "$d/early.0.out"
        elif ! grep -q "^fake_cuda: device address .* of a cuMemAddressReserve range) was touched where no chunk is mapped" "$d/early.0.out" "$d/early.1.out"; then
            fail gpu/zero3-control "the ranks stopped, but not at a read of an unmapped page" "$d/early.0.out" "$d/early.1.out"
        else
            pass "gpu/zero3-control (a gather released before its launches: the first read of an unmapped page stops the run)"
        fi
        # a rank's NCCL failing in a gather (the emulated NCCL's MBT_FAKE_NCCL_FAIL=1): both ranks stop
        # with status 1 and say why, neither at a read of an unmapped page
        MBT_FAKE_NCCL_FAIL=1 z3_ranks 2 1 nfail "$d/r2/prog" --steps 2
        if [ $z3rc = 0 ]; then
            fail gpu/zero3-fail "the ranks exited 0 with rank 1's NCCL failing" "$d/nfail.0.out" "$d/nfail.1.out"
        elif grep -q "^fake_cuda: device address" "$d/nfail.0.out" "$d/nfail.1.out" ||
            ! grep -q "ZeRO-3: gathering parameters \[[0-9]*, [0-9]*) on the GPU: ncclGroupEnd (collectives: gather_shards over NCCL): NCCL error" "$d/nfail.1.out" ||
            ! grep -q "^prog: step 1, micro-batch 1: .*NCCL" "$d/nfail.0.out"; then
            fail gpu/zero3-fail "the ranks do not say why they stopped" "$d/nfail.0.out" "$d/nfail.1.out"
        else
            pass "gpu/zero3-fail (rank 1's NCCL failing in a gather: both ranks stop and say why)"
        fi
        # a device whose granularity is not the plan's page (4 KiB against the 64 KiB r2 was built
        # for): every rank refuses at the start, naming both
        MBT_FAKE_CUDA_GRANULARITY=4096 z3_ranks 2 0 gran "$d/r2/prog" --steps 1
        if [ $z3rc = 0 ]; then
            fail gpu/zero3-page "with a granularity of 4096 bytes the ranks ran a plan made for pages of 65536" "$d/gran.0.out"
        elif ! grep -q "ZeRO-3: the program's gathers were planned for pages of 65536 bytes, and this GPU's allocation granularity (cuMemGetAllocationGranularity) is 4096 bytes: rebuild it with mbtc --zero3-page=4096" "$d/gran.0.out"; then
            fail gpu/zero3-page "the ranks stopped, but do not say the page is not the granularity" "$d/gran.0.out" "$d/gran.1.out"
        else
            pass "gpu/zero3-page (a granularity of 4096 bytes against the plan's 65536: refused at the start, naming both)"
        fi
        rm -f "$d/drop.st"
        MBT_FAKE_CUDA_DROP_WAIT=3 z3_ranks 2 0 drop "$d/r2/prog" --steps 4 --save-weights "$d/drop.st"
        # the gather's pages read before its data landed: NaN (a new chunk's bytes) or another gather's
        if [ $z3rc = 0 ] && ! cmp -s "$d/r1.st" "$d/drop.st"; then
            pass "gpu/zero3-wait-control (a wait for a gather left out: other weights)"
        elif [ $z3rc != 0 ] && grep -q "the loss is nan; stopping" "$d/drop.0.out" "$d/drop.1.out"; then
            pass "gpu/zero3-wait-control (a wait for a gather left out: $(grep -h -o "step [0-9]*, micro-batch [0-9]*: the loss is nan; stopping" "$d/drop.0.out" "$d/drop.1.out" | head -n 1))"
        else
            fail gpu/zero3-wait-control "with a wait for a gather left out, 2 ranks saved one process's weights or failed otherwise" "$d/drop.0.out" "$d/drop.1.out"
        fi
    fi
fi
if [ "$z3_gran_saved" = unset ]; then unset MBT_FAKE_CUDA_GRANULARITY; else export MBT_FAKE_CUDA_GRANULARITY=$z3_gran_saved; fi
}

# ---- recompute on the device: the re-runs leave every bit as it was ----------------------------------
# gpu/recompute: tests/exec/recompute.mbt's base (no recompute), rc_gelu and rc_all (every block's
# forward run again before its backward), 3 steps each on the device: the same logs to every digit
# and byte-identical weights as base on the device (the re-runs launch the same kernels on the same
# inputs), and --arena-high-water's measured bytes of the device's arena within the step peak the
# plan claims (less than its 64-byte alignment short of it).
sec_recompute() {
d="$DIR/recompute"
mkdir -p "$d/base" "$d/rc_gelu" "$d/rc_all"
rc_fail=""
rc_hw=""
for t in base rc_gelu rc_all; do
    if ! build "$d/$t" tests/exec/recompute.mbt --train "$t" -I examples; then rc_fail="mbtc tests/exec/recompute.mbt --train $t failed"; break; fi
    on_device_cmd "$d/$t/prog.cu" "$d/$t/prog" "$d/$t.out" train --steps 3 --data "$DATA" --save-weights "$d/$t.st" \
        --log "$d/$t.jsonl" --arena-high-water || { rc_fail="the $t run on the device failed"; break; }
    hw=$(sed -n 's/^arena high-water: step 1.s micro-batches wrote \([0-9]*\) bytes of the arena; the plan.s step peak is \([0-9]*\)$/\1 \2/p' "$d/$t.out")
    if [ -z "$hw" ] || [ "${hw% *}" -gt "${hw#* }" ] || [ "${hw% *}" -le $((${hw#* } - 64)) ]; then
        rc_fail="$t: the device's arena high-water '${hw% *}' is not within 64 bytes below the plan's step peak '${hw#* }'"
        break
    fi
    rc_hw="$rc_hw $t ${hw% *}/${hw#* }"
done
if [ -n "$rc_fail" ]; then
    fail gpu/recompute "$rc_fail" "$OUT" "$d/base.out" "$d/rc_gelu.out" "$d/rc_all.out"
elif ! cmp -s "$d/base.st" "$d/rc_gelu.st" || ! cmp -s "$d/base.st" "$d/rc_all.st" ||
    [ "$(untimed "$d/base.jsonl")" != "$(untimed "$d/rc_gelu.jsonl")" ] || [ "$(untimed "$d/base.jsonl")" != "$(untimed "$d/rc_all.jsonl")" ]; then
    fail gpu/recompute "recompute on the device changed the weights or the logs" "$d/base.jsonl" "$d/rc_gelu.jsonl" "$d/rc_all.jsonl"
else
    pass "gpu/recompute (rc_gelu and rc_all: base's weights and logs on the device, 3 steps; arena written/planned:$rc_hw)"
fi
}

# ---- running statistics on the device (issue 20) -------------------------------------------------
# gpu/running: tests/verify/ghost_bn_running.mbt trained 5 steps on the device - training() read from
# the key on the device, the buffers updated after each step through their download and upload - then
# tests/verify/ghost_bn_running_oracle.py's checks on the device's results: the running buffers
# against the plain-Python recomputation, eval's loss (forward_loss on the device, training() 0)
# against the one with the running statistics, and generation's logits for a one-token prompt.
sec_stats() {
d="$DIR/running"
R="$d/prog" # (its own: the train block's build in $DIR/ghost_bn_running-running_bn is removed after its checks)
mkdir -p "$d" "$R"
if ! build "$R" tests/verify/ghost_bn_running.mbt --train running_bn -I examples; then
    fail gpu/running "mbtc tests/verify/ghost_bn_running.mbt -o or --emit=cuda failed" "$OUT"
else
    O=tests/verify/ghost_bn_running_oracle.py
    on_device_cmd "$R/prog.cu" "$R/prog" "$d/train.out" train --steps 5 --data "$DATA" --save-weights "$d/w.st"
    on_device_cmd "$R/prog.cu" "$R/prog" "$d/eval.out" eval --weights "$d/w.st" --data "$DATA" --steps 1
    on_device_cmd "$R/prog.cu" "$R/prog" "$d/logits.out" generate --weights "$d/w.st" --prompt-tokens 5 --print-logits
    if r1=$($PY $O running "$d/w.st" "$DATA" 5 2 step 2>&1) && r2=$($PY $O eval "$d/w.st" "$DATA" "$d/eval.out" running 2>&1) \
        && r3=$($PY $O generate "$d/w.st" 5 "$d/logits.out" 2>&1); then
        pass "gpu/running (5 steps on the device; $r1; $r2; $r3)"
    else
        fail gpu/running "the device's running statistics: ${r1:-} ${r2:-} ${r3:-}" "$d/train.out"
    fi
fi
}

# ---- eval and generate on the device: the GPU's forward_loss and forward_logits -----------------------
# gpu/eval and gpu/generate-logits: examples/tiny.mbt's weights trained 3 steps on the CPU; its build
# (in $DIR/tiny) is gpu/debug-timing's too.
sec_eval() {
d="$DIR/infer"
T="$DIR/tiny"
mkdir -p "$d" "$T"
PROMPT=3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3
if ! build "$T" examples/tiny.mbt --train tiny \
    || ! timeout 600 "$T/prog" train --steps 3 --data "$DATA" --device cpu --save-weights "$d/w.st" </dev/null >"$d/train.out" 2>&1; then
    fail gpu/eval "building tiny or training its weights on the CPU failed" "$d/train.out"
else
    # eval: the held-out loss of the same weights and batches (1e-5 relative, as step 1's)
    timeout 600 "$T/prog" eval --weights "$d/w.st" --data "$DATA" --steps 2 --device cpu </dev/null >"$d/eval-cpu.out" 2>&1
    on_device_cmd "$T/prog.cu" "$T/prog" "$d/eval-dev.out" eval --weights "$d/w.st" --data "$DATA" --steps 2
    a=$(sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p' "$d/eval-cpu.out")
    b=$(sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p' "$d/eval-dev.out")
    if [ -n "$a" ] && [ -n "$b" ] && within "$a" "$b" "$LOSS_TOL"; then pass "gpu/eval (loss: CPU $a, device $b)"
    else fail gpu/eval "eval's loss: CPU '$a', device '$b' (tolerance $LOSS_TOL relative)" "$d/eval-dev.out"; fi
    # generate --print-logits: each prefix's logits, every entry within 1e-5 of the row's largest
    timeout 600 "$T/prog" generate --weights "$d/w.st" --prompt-tokens "$PROMPT" --print-logits --device cpu \
        </dev/null >"$d/logits-cpu.out" 2>&1
    on_device_cmd "$T/prog.cu" "$T/prog" "$d/logits-dev.out" generate --weights "$d/w.st" --prompt-tokens "$PROMPT" --print-logits
    if worst=$(paste -d '|' "$d/logits-cpu.out" "$d/logits-dev.out" | awk -F'|' '
            { na = split($1, a, " "); nb = split($2, b, " "); if (na != nb || na == 0) { bad = 1; exit }
              m = 0; for (i = 1; i <= na; i++) { x = a[i] < 0 ? -a[i] : a[i]; if (x > m) m = x }
              for (i = 1; i <= na; i++) { e = a[i] - b[i]; if (e < 0) e = -e; if (m > 0 && e / m > w) w = e / m }
              rows++ }
            END { if (bad || rows != 16) exit 1; printf "%.2e", w; exit !(w <= 1e-5) }'); then
        pass "gpu/generate-logits (16 prefixes, largest difference $worst of a row's largest logit)"
    else
        fail gpu/generate-logits "generate --print-logits differs from the CPU's by more than 1e-5 of a row's largest logit ($worst)" "$d/logits-dev.out"
    fi
fi
}

# ---- the KV cache on the device: forward_chunk, the paged pool in device memory, serve ------------
sec_kv() {
# shellcheck source=tests/gpu/kv.sh
. tests/gpu/kv.sh
}

# ---- offload { optimizer = host }: the state in host memory, the CPU's update --------------------
# gpu/offload-host: tests/exec/offload_optimizer.mbt's program with optimizer = host and without
# offload, 10 steps each on the device with a checkpoint at step 5 (docs/memory.md). With host the
# device holds no optimizer state (./prog info), the gradients come down and the parameters go up
# each step, and the CPU's optimizer_update (the CPU build's kernels) updates them: the losses within
# 1e-5 of the device's own update's and the weights within 1e-5 norm-wise (on the emulated GPU, whose
# kernels keep the host's arithmetic, byte for byte: the update is the same elementwise formula);
# a resume from step 5 ends with the same weights, byte for byte. gpu/offload-nvme: the same with
# optimizer = nvme (the state in a store file, streamed through the CPU's update).
sec_offload_opt() {
d="$DIR/offload"
mkdir -p "$d/host" "$d/none" "$d/hostp"
sed 's/optimizer = nvme/optimizer = host/' tests/exec/offload_optimizer.mbt >"$d/host.mbt"
sed '/^[[:space:]]*offload[[:space:]]/d' tests/exec/offload_optimizer.mbt >"$d/none.mbt"
if ! build "$d/host" "$d/host.mbt" -I examples || ! build "$d/none" "$d/none.mbt" -I examples; then
    fail gpu/offload-host "mbtc -o or --emit=cuda of the offload program failed" "$OUT"
else
    on_device_cmd "$d/host/prog.cu" "$d/host/prog" "$d/host.out" train --steps 10 --data "$DATA" --save-weights "$d/host.st" \
        --log "$d/host.jsonl" --ckpt-every 5 --ckpt-dir "$d/ckh"
    rc1=$?
    on_device_cmd "$d/none/prog.cu" "$d/none/prog" "$d/none.out" train --steps 10 --data "$DATA" --save-weights "$d/none.st" \
        --log "$d/none.jsonl" --ckpt-dir "$d/ckn"
    rc2=$?
    on_device_cmd "$d/host/prog.cu" "$d/host/prog" "$d/resume.out" train --steps 10 --data "$DATA" \
        --resume "$d/ckh/step-00000005" --ckpt-dir "$d/ckh2" --save-weights "$d/resumed.st"
    rc3=$?
    "$d/host/prog" info >"$d/info.out" 2>&1
    far=""
    grep '"loss"' "$d/none.jsonl" >"$d/none.steps" # (the step records alone: not the checkpoint's)
    grep '"loss"' "$d/host.jsonl" >"$d/host.steps"
    for k in $(seq 1 10); do
        within "$(jfield "$d/none.steps" "$k" loss)" "$(jfield "$d/host.steps" "$k" loss)" 1e-5 || far="$far $k"
    done
    if [ $rc1 != 0 ] || [ $rc2 != 0 ] || [ $rc3 != 0 ]; then
        fail gpu/offload-host "a run failed (host: status $rc1; none: $rc2; resumed: $rc3)" "$d/host.out" "$d/none.out" "$d/resume.out"
    elif ! grep -q "^optimizer state: in host memory .*the CPU updates it" "$d/host.out" \
        || ! grep -q "^device: cuda" "$d/host.out"; then
        fail gpu/offload-host "the run on the device does not say the CPU updates the state in host memory" "$d/host.out"
    elif ! grep -q "optimizer state 0 on the device" "$d/info.out"; then
        fail gpu/offload-host "./prog info does not say the device holds no optimizer state" "$d/info.out"
    elif [ -n "$far" ]; then
        fail gpu/offload-host "the losses of steps$far differ by more than 1e-5 from the device's own update's" "$d/none.jsonl" "$d/host.jsonl"
    elif ! "$BUILD/tests/st_compare" "$d/none.st" "$d/host.st" "" 1e-5 norm >"$d/cmp.out" 2>&1; then
        fail gpu/offload-host "the weights differ from the device's own update's by more than 1e-5" "$d/cmp.out"
    elif ! cmp -s "$d/host.st" "$d/resumed.st"; then
        fail gpu/offload-host "resumed from step 5, the run does not end with the same weights" "$d/resume.out"
    else
        same=$(cmp -s "$d/none.st" "$d/host.st" && echo "byte for byte" || echo "within 1e-5")
        pass "gpu/offload-host (10 steps with the state in host memory: the device's own update's losses and weights, $same; resumed bit-exactly)"
    fi
    # gpu/offload-nvme: the program as it is (optimizer = nvme) on the device: the state in a store
    # file, streamed a chunk at a time through the CPU's update (the gradients down, the parameters
    # up); the same checks against the device's own update, and a resume from step 5
    mkdir -p "$d/nvme"
    if ! build "$d/nvme" tests/exec/offload_optimizer.mbt -I examples; then
        fail gpu/offload-nvme "mbtc -o or --emit=cuda of tests/exec/offload_optimizer.mbt failed" "$OUT"
    else
        on_device_cmd "$d/nvme/prog.cu" "$d/nvme/prog" "$d/nvme.out" train --steps 10 --data "$DATA" --save-weights "$d/nvme.st" \
            --log "$d/nvme.jsonl" --ckpt-every 5 --ckpt-dir "$d/ckv" --offload-dir "$d"
        rc1=$?
        on_device_cmd "$d/nvme/prog.cu" "$d/nvme/prog" "$d/nvme-resume.out" train --steps 10 --data "$DATA" \
            --resume "$d/ckv/step-00000005" --ckpt-dir "$d/ckv2" --save-weights "$d/nvme-resumed.st" --offload-dir "$d"
        rc3=$?
        far=""
        grep '"loss"' "$d/nvme.jsonl" >"$d/nvme.steps"
        for k in $(seq 1 10); do
            within "$(jfield "$d/none.steps" "$k" loss)" "$(jfield "$d/nvme.steps" "$k" loss)" 1e-5 || far="$far $k"
        done
        if [ $rc1 != 0 ] || [ $rc3 != 0 ]; then
            fail gpu/offload-nvme "a run failed (nvme: status $rc1; resumed: $rc3)" "$d/nvme.out" "$d/nvme-resume.out"
        elif ! grep -q "^optimizer state: offloaded to '.*' (.*): [0-9]* chunks" "$d/nvme.out" || ! grep -q "^device: cuda" "$d/nvme.out"; then
            fail gpu/offload-nvme "the run on the device does not say its state is in a store file" "$d/nvme.out"
        elif [ -n "$far" ]; then
            fail gpu/offload-nvme "the losses of steps$far differ by more than 1e-5 from the device's own update's" "$d/none.jsonl" "$d/nvme.jsonl"
        elif ! "$BUILD/tests/st_compare" "$d/none.st" "$d/nvme.st" "" 1e-5 norm >"$d/cmpv.out" 2>&1; then
            fail gpu/offload-nvme "the weights differ from the device's own update's by more than 1e-5" "$d/cmpv.out"
        elif ! cmp -s "$d/nvme.st" "$d/nvme-resumed.st"; then
            fail gpu/offload-nvme "resumed from step 5, the run does not end with the same weights" "$d/nvme-resume.out"
        elif ls "$d"/mbt-*.optimizer >/dev/null 2>&1; then
            fail gpu/offload-nvme "a store file was left behind in the offload directory: $(ls "$d"/mbt-*.optimizer)"
        else
            same=$(cmp -s "$d/none.st" "$d/nvme.st" && echo "byte for byte" || echo "within 1e-5")
            pass "gpu/offload-nvme (10 steps with the state in a store file: the device's own update's losses and weights, $same; resumed bit-exactly)"
        fi
    fi
    # gpu/offload-bytes: what the host's updates moved (the runtime's count of the copies it queued on
    # the update's copy stream): each step the whole gradient down and the whole parameter region up
    # (no ZeRO here), through page-locked parameter and gradient regions; nvme in the store's chunks,
    # host in eighths of the region (train_step.c's rt_host_chunk)
    pbytes=$("$d/host/prog" info | sed -n 's/^plan: parameters \([0-9]*\) bytes.*/\1/p')
    ob_bad=""
    for run in host nvme; do
        line=$(grep '^optimizer offload: ' "$d/$run.out")
        want="optimizer offload: the host's updates copied $((10 * pbytes)) bytes down and $((10 * pbytes)) up in 10 steps ($pbytes and $pbytes a step), through $((2 * (pbytes + 64))) bytes of page-locked host memory"
        [ -n "$pbytes" ] && [ "$line" = "$want" ] || ob_bad="$ob_bad $run: '$line', want '$want';"
    done
    grep -q "^optimizer state: offloaded to .*: 8 chunks" "$d/nvme.out" || ob_bad="$ob_bad nvme: not 8 chunks;"
    if [ -n "$ob_bad" ]; then
        fail gpu/offload-bytes "$ob_bad" "$d/host.out" "$d/nvme.out"
    else
        pass "gpu/offload-bytes (host and nvme: $pbytes bytes down and up a step, $((2 * (pbytes + 64))) bytes page-locked; nvme in 8 chunks)"
    fi
    # gpu/offload-copy-control (the emulated GPU, whose copy stream runs its copies only when waited
    # for): 3 steps of host and of nvme, each with a compute stream's wait for the uploads of step 1's
    # update left out (MBT_FAKE_CUDA_DROP_WAIT; MBT_FAKE_CUDA_WAITS shows which: nvme's one a step,
    # running its last uploads; host's last chunk's, in step 2's forward), must end with other
    # weights than with it - the step after an update reads the parameters the uploads bring, and
    # the wait is what orders them
    if [ "$DEVICE" != emu ]; then
        skip gpu/offload-copy-control "MBT_GPU_TEST_DEVICE=$DEVICE: only the emulated GPU can leave out a wait"
    else
        cc_bad=""
        for run in host nvme; do
            extra=()
            [ $run = nvme ] && extra=(--offload-dir "$d")
            MBT_FAKE_CUDA_WAITS=1 on_device_cmd "$d/$run/prog.cu" "$d/$run/prog" "$d/$run-c3.out" train --steps 3 --data "$DATA" \
                --save-weights "$d/$run-c3.st" "${extra[@]}" || cc_bad="$cc_bad $run: the run with every wait failed;"
            if [ $run = nvme ]; then
                # nvme's 8 chunks: of their uploads the first 6 ran when the host waited for the
                # downloads queued after them - each went up while a later chunk was updated - and
                # the last 2 at the step's one wait, which is dropped
                nw=$(grep -c '^fake_cuda: wait [0-9]* runs 0 copies to the host, 2 back$' "$d/$run-c3.out")
                [ "$nw" = 3 ] && [ "$(grep -c '^fake_cuda: wait' "$d/$run-c3.out")" = 3 ] \
                    || cc_bad="$cc_bad $run: not one wait a step running 2 uploads alone ($nw);"
                drop=1
            else
                # host, deferred to the next step's reads: a step's wait for its 8 downloads (the
                # gradient's zeroing after them), then a wait for each chunk's upload alone (the
                # next forward's, or the run's end's flush); the last chunk's in step 2's forward is
                # dropped (an earlier chunk's upload also runs at the next chunk's wait: the stream
                # runs them in order)
                nd=$(grep -c '^fake_cuda: wait [0-9]* runs 8 copies to the host, 0 back$' "$d/$run-c3.out")
                nu=$(grep -c '^fake_cuda: wait [0-9]* runs 0 copies to the host, 1 back$' "$d/$run-c3.out")
                [ "$nd" = 3 ] && [ "$nu" = 24 ] && [ "$(grep -c '^fake_cuda: wait' "$d/$run-c3.out")" = 27 ] \
                    || cc_bad="$cc_bad $run: not a wait for the 8 downloads and one for each chunk's upload a step ($nd, $nu);"
                drop=$(sed -n 's/^fake_cuda: wait \([0-9]*\) runs 0 copies to the host, 1 back$/\1/p' "$d/$run-c3.out" | sed -n 8p)
            fi
            MBT_FAKE_CUDA_DROP_WAIT=${drop:-1} on_device_cmd "$d/$run/prog.cu" "$d/$run/prog" "$d/$run-d3.out" train --steps 3 \
                --data "$DATA" --save-weights "$d/$run-d3.st" "${extra[@]}" || cc_bad="$cc_bad $run: the run without the wait failed;"
            cmp -s "$d/$run-c3.st" "$d/$run-d3.st" && cc_bad="$cc_bad $run: the same weights without the wait;"
        done
        if [ -n "$cc_bad" ]; then
            fail gpu/offload-copy-control "$cc_bad" "$d/host-c3.out" "$d/nvme-c3.out"
        else
            pass "gpu/offload-copy-control (host: the wait for step 1's update's last chunk's upload left out; nvme: step 1's wait for its uploads; other weights after 3 steps)"
        fi
    fi
    # gpu/offload-host-overlap: the host program built with --zero3-page=4096, so that the forward
    # reads the parameters by ranges of a few thousand floats (the gathers' units, plan_gather.c)
    # rather than as one range (the GPU's 2 MiB page groups this small model into one): 3 steps
    # deferred (the default) and kept in their step (MBT_OPT_OVERLAP=0) end with the same weights
    # byte for byte, and in the deferred run's trace (MBT_TRACE) the compute stream has launches
    # between its waits for the chunks' uploads - the next forward's first launches were queued
    # before the CPU had updated every chunk; the kept run waits for the chunks' uploads only at
    # its join (no chunk wait)
    if [ "$DEVICE" = cpu ]; then
        skip gpu/offload-host-overlap "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU writes no GPU trace"
    elif ! build "$d/hostp" "$d/host.mbt" -I examples --zero3-page=4096; then
        fail gpu/offload-host-overlap "mbtc --zero3-page=4096 of the host program failed" "$OUT"
    else
        ov_bad=""
        for mode in defer keep; do
            flag=""
            [ $mode = keep ] && flag=0
            rm -f "$d/ov-$mode.json"
            MBT_OPT_OVERLAP=$flag MBT_DEBUG=1 MBT_TRACE="$d/ov-$mode.json" on_device_cmd "$d/hostp/prog.cu" "$d/hostp/prog" \
                "$d/ov-$mode.out" train --steps 3 --data "$DATA" --save-weights "$d/ov-$mode.st" || ov_bad="$ov_bad $mode: the run failed;"
        done
        chunk_wait="optimizer offload: the step waits for a chunk's upload"
        ov=$("$PY" tests/gpu/trace_between.py "$d/ov-defer.json" "$chunk_wait" 2>&1)
        ov_keep=$("$PY" tests/gpu/trace_between.py "$d/ov-keep.json" "$chunk_wait" 2>&1)
        read -r ov_waits ov_between <<<"$ov"
        ov_keep=${ov_keep%% *}
        if [ -n "$ov_bad" ]; then
            fail gpu/offload-host-overlap "$ov_bad" "$d/ov-defer.out" "$d/ov-keep.out"
        elif ! cmp -s "$d/ov-defer.st" "$d/ov-keep.st"; then
            fail gpu/offload-host-overlap "the deferred update's weights differ from the update kept in its step" "$d/ov-defer.out"
        elif [ "${ov_keep:-x}" != 0 ] || ! [ "${ov_between:-0}" -gt 0 ] 2>/dev/null; then
            fail gpu/offload-host-overlap "no launch between the chunks' waits, or chunk waits without deferring ($ov)" "$d/ov-defer.out"
        else
            pass "gpu/offload-host-overlap (3 steps: deferred and kept byte for byte; $ov_waits chunk waits, $ov_between launches between them)"
        fi
    fi
    # gpu/trace-offload-host: host and nvme, 2 steps with MBT_DEBUG=1 and MBT_TRACE: the update's
    # copies on the trace's track 2 ("optimizer's copies"), the gradient down and the parameters up
    # a chunk at a time (host: its 8 eighths a step; nvme: the store's 8), and on track 0 the compute
    # stream's waits: nvme's for the uploads (rt_gpu_opt_join) once a step, host's (deferred) for
    # the downloads once a step and for each chunk's upload; MBT_DEBUG's line for the copy stream's
    # total apart from the compute stream's
    if [ "$DEVICE" = cpu ]; then
        skip gpu/trace-offload-host "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU writes no GPU trace"
    else
        to_bad="" to_got=""
        for run in host nvme; do
            chunks=8 extra=() waits=(0 "optimizer offload: the step waits for the uploads" 2)
            [ $run = nvme ] && extra=(--offload-dir "$d")
            [ $run = host ] && waits=(0 "optimizer offload: the step waits for the gradient's downloads" 2
                0 "optimizer offload: the step waits for a chunk's upload" $((2 * chunks)))
            rm -f "$d/$run.trace.json"
            MBT_DEBUG=1 MBT_TRACE="$d/$run.trace.json" on_device_cmd "$d/$run/prog.cu" "$d/$run/prog" "$d/$run-trace.out" \
                train --steps 2 --data "$DATA" "${extra[@]}" || to_bad="$to_bad $run: the traced run failed;"
            if ! "$PY" tests/gpu/trace_tracks.py "$d/$run.trace.json" 2 "optimizer offload: gradient down" $((2 * chunks)) \
                2 "optimizer offload: parameters up" $((2 * chunks)) "${waits[@]}" >"$d/$run-tracks.out" 2>&1; then
                to_bad="$to_bad $run: $(tail -n 1 "$d/$run-tracks.out");"
            elif ! grep -q "^GPU time: optimizer's copies: $((4 * chunks)) copies on their own stream, [0-9.]* us (beside the compute stream's, not in its total)\$" \
                "$d/$run-trace.out"; then
                to_bad="$to_bad $run: MBT_DEBUG's table does not give the $((4 * chunks)) copies' total apart;"
            else
                to_got="$to_got $run: $(cat "$d/$run-tracks.out");"
            fi
        done
        if [ -n "$to_bad" ]; then
            fail gpu/trace-offload-host "$to_bad" "$d/host-trace.out" "$d/nvme-trace.out"
        else
            to_got=${to_got# }
            pass "gpu/trace-offload-host (${to_got%;})"
        fi
    fi
fi
}

# ---- offload { activations = host }: held activations to pinned host memory and back ------------
# gpu/offload-act: tests/exec/offload_activations.mbt's programs with activations = host (act, built
# with --offload-gbps=1000 so that the plan offloads 14 buffers with copies overlapping, not the one
# that the default 20 GB/s allows at this size; act_rc, with recompute = [gelu] too, at the default)
# and without offload (base, rc), 10 steps each on the device (docs/memory.md, "Activation
# offload"). The copies move bytes unchanged on a second stream, so the logs are the same to every
# digit and the weights byte for byte; the step peak is lower than without offload by what
# --emit=plan claims, `info` repeats it, and the arena bytes a step writes on the device
# (--arena-high-water) reach it within its 64-byte alignment and never pass it; the pinned memory
# allocated is the plan's; the step with its copies is captured and launched as CUDA graphs as
# base's is (the graphs' counts alike: the copy stream forked into the capture and joined back);
# the run prints the copy stream's measured rate against the plan's (the emulated GPU's clock runs
# queued copies at 25 GB/s, which the events must give back). On the emulated GPU the copy stream's copies run as late as a GPU could
# run them (tests/cudaemu/fake_cuda.c), and the controls leave out one wait of the step for them at a
# time (MBT_FAKE_CUDA_DROP_WAIT; which waits run which copies, MBT_FAKE_CUDA_WAITS): each wait of the
# first micro-batch that the first use of a buffer read back needs, the first that a reused slot's
# write needs, and the first join of each kind inside the graphs step 2 launches, must change the
# weights after 2 steps. (Other writes' waits may change nothing:
# the plan waits where a slot may be reused, and the next write into it can come after the next wait.)
sec_offload_act() {
d="$DIR/offload-act"
mkdir -p "$d/base" "$d/act" "$d/rc" "$d/act_rc"
sed 's/activations = nvme/activations = host/' tests/exec/offload_activations.mbt >"$d/t.mbt"
declare -A oa_flags=([base]="" [act]="--offload-gbps=1000" [rc]="" [act_rc]="")
oa_fail=""
oa_hw=""
for t in base act rc act_rc; do
    # shellcheck disable=SC2086
    if ! build "$d/$t" "$d/t.mbt" --train "$t" ${oa_flags[$t]} -I examples; then oa_fail="mbtc $d/t.mbt --train $t -o or --emit=cuda failed"; break; fi
    on_device_cmd "$d/$t/prog.cu" "$d/$t/prog" "$d/$t.out" train --steps 10 --data "$DATA" --save-weights "$d/$t.st" \
        --log "$d/$t.jsonl" --arena-high-water || { oa_fail="the $t run on the device failed"; break; }
    "$d/$t/prog" info >"$d/$t.info" 2>&1
done
# oa_peak T BASE: T's planned peak (--emit=plan and info), its "without offload" (BASE's info), the
# measured high-water mark; the pinned bytes of the plan, info and the run
oa_peak() {
    local t=$1 b=$2 plan planned without info_p info_b hw pin_plan pin_info pin_run n
    # shellcheck disable=SC2086
    plan=$("$MBTC" "$d/t.mbt" --train "$t" ${oa_flags[$t]} -I examples --emit=plan 2>&1)
    n=$(sed -n 's/^### offload activations = host: \([0-9]*\) held buffers\{0,1\} offloaded.*/\1/p' <<<"$plan")
    planned=$(sed -n 's/^step peak \([0-9]*\) bytes.*, without offload \([0-9]*\) bytes.*/\1/p' <<<"$plan")
    without=$(sed -n 's/^step peak \([0-9]*\) bytes.*, without offload \([0-9]*\) bytes.*/\2/p' <<<"$plan")
    pin_plan=$(sed -n 's/^### offload activations = host: .* to pinned host memory of \([0-9]*\) bytes.*/\1/p' <<<"$plan")
    info_p=$(sed -n 's/^plan: arena step \([0-9]*\) bytes$/\1/p' "$d/$t.info")
    info_b=$(sed -n 's/^plan: arena step \([0-9]*\) bytes$/\1/p' "$d/$b.info")
    pin_info=$(sed -n 's/^plan: activations offloaded to host: \([0-9]*\) bytes of pinned host memory.*/\1/p' "$d/$t.info")
    pin_run=$(sed -n 's/^activations: offloaded to \([0-9]*\) bytes of \(pinned \)\{0,1\}host memory.*/\1/p' "$d/$t.out")
    hw=$(sed -n 's/^arena high-water: step 1.s micro-batches wrote \([0-9]*\) bytes of the arena; the plan.s step peak is \([0-9]*\)$/\1 \2/p' "$d/$t.out")
    echo "$t: $n buffers offloaded, planned $planned (info $info_p), without offload $without ($b's info $info_b), measured ${hw% *} (of ${hw#* }); pinned $pin_plan (info $pin_info, run $pin_run)"
    [ -n "$planned" ] && [ -n "$hw" ] && [ "$info_p" = "$planned" ] && [ "$without" = "$info_b" ] && [ "${hw#* }" = "$planned" ] &&
        [ "$planned" -lt "$without" ] && [ "${hw% *}" -le "$planned" ] && [ "${hw% *}" -gt $((planned - 64)) ] &&
        [ -n "$pin_plan" ] && [ "$pin_plan" = "$pin_info" ] && [ "$pin_plan" = "$pin_run" ]
}
if [ -n "$oa_fail" ]; then
    fail gpu/offload-act "$oa_fail" "$OUT" "$d/base.out" "$d/act.out" "$d/rc.out" "$d/act_rc.out"
elif ! cmp -s "$d/base.st" "$d/act.st" || ! cmp -s "$d/base.st" "$d/act_rc.st" || ! cmp -s "$d/base.st" "$d/rc.st" ||
    [ "$(untimed "$d/base.jsonl")" != "$(untimed "$d/act.jsonl")" ] || [ "$(untimed "$d/base.jsonl")" != "$(untimed "$d/act_rc.jsonl")" ]; then
    fail gpu/offload-act "offload { activations = host } on the device changed the weights or the logs" "$d/base.jsonl" "$d/act.jsonl" "$d/act_rc.jsonl"
elif [ "$DEVICE" != cpu ] && ! grep -q "^activations: offloaded to [0-9]* bytes of pinned host memory, copied on a second stream" "$d/act.out"; then
    fail gpu/offload-act "the run on the device does not say it copies to pinned host memory" "$d/act.out"
elif [ "$DEVICE" != cpu ] && ! grep -qE "^activations: the copies measured at [0-9.]+ GB/s to the host and [0-9.]+ GB/s back \([0-9]+ bytes each way\); the plan assumed 1000\.0 GB/s" "$d/act.out"; then
    fail gpu/offload-act "the run on the device does not say how fast its copies ran against the plan's rate" "$d/act.out"
elif [ "$DEVICE" = emu ] && ! grep -q "measured at 25\.0 GB/s to the host and 25\.0 GB/s back" "$d/act.out"; then
    fail gpu/offload-act "the copies' rate is not the emulated GPU's 25 GB/s (its clock's): the events time something else" "$d/act.out"
elif [ "$DEVICE" != cpu ] && [ "$(grep -o 'CUDA graphs: .*' "$d/act.out")" != "$(grep -o 'CUDA graphs: .*' "$d/base.out")" ]; then
    fail gpu/offload-act "the step with copies was not captured and launched as CUDA graphs as base's was" "$d/act.out" "$d/base.out"
elif ! oa_hw="$(oa_peak act base); $(oa_peak act_rc rc)"; then
    fail gpu/offload-act "the step peak, info, the measured high-water mark or the pinned bytes disagree: $oa_hw"
else
    pass "gpu/offload-act (act and act_rc: base's weights and logs on the device, 10 steps, $(grep -o 'CUDA graphs: [0-9]* captured, [0-9]* launched' "$d/act.out"), $(grep -o 'copies measured at [0-9.]* GB/s to the host' "$d/act.out"); $oa_hw)"
fi
if [ "$DEVICE" != emu ]; then
    skip gpu/offload-act-control "MBT_GPU_TEST_DEVICE=$DEVICE: only the emulated GPU can leave out a wait"
elif [ -z "$oa_fail" ]; then
    MBT_FAKE_CUDA_WAITS=1 on_device_cmd "$d/act/prog.cu" "$d/act/prog" "$d/waits.out" train --steps 2 --data "$DATA" --save-weights "$d/act2.st"
    # the first micro-batch's waits (up to the first that runs a write after one ran a read): the
    # first that runs a write, and each that runs a read; and in the graphs launched in step 2, the
    # first join that runs a write and the first that runs a read
    drops=$(awk '/^fake_cuda: wait [0-9]+ runs/ { w = $3; out = $5; back = $10
                 if (NF > 11) { if (back > 0 && !gb) { gb = 1; print w } else if (out > 0 && !go) { go = 1; print w }; next }
                 if (done) next
                 if (out > 0 && seen) { done = 1; next }
                 if (back > 0) { seen = 1; print w } else if (out > 0 && !first) { first = 1; print w } }' "$d/waits.out")
    same=""
    for n in $drops; do
        MBT_FAKE_CUDA_DROP_WAIT=$n on_device_cmd "$d/act/prog.cu" "$d/act/prog" "$d/drop.out" train --steps 2 --data "$DATA" \
            --save-weights "$d/drop.st"
        if [ ! -s "$d/drop.st" ] || cmp -s "$d/act2.st" "$d/drop.st"; then same="$same $n"; fi
        rm -f "$d/drop.st"
    done
    # each wait is for one buffer's copy (gpu_act.c's act_event_record): some leave copies queued
    # after that buffer's on the stream (a wait for everything queued never would)
    nleave=$(grep -c '^fake_cuda: wait [0-9]* leaves [0-9]* operations queued after its event$' "$d/waits.out")
    if [ ! -s "$d/act2.st" ] || [ "$(wc -w <<<"$drops")" -lt 4 ] || ! grep -q 'in a graph$' "$d/waits.out"; then
        fail gpu/offload-act-control "MBT_FAKE_CUDA_WAITS found no waits to leave out ('$drops')" "$d/waits.out"
    elif [ "$nleave" = 0 ]; then
        fail gpu/offload-act-control "no wait left a later copy queued: the waits wait for every copy queued, not their buffer's" "$d/waits.out"
    elif [ -n "$same" ]; then
        fail gpu/offload-act-control "with wait$same of the step left out, the run did not end with other weights" "$d/waits.out"
    else
        pass "gpu/offload-act-control (each of waits $(echo $drops) left out alone: other weights after 2 steps; $nleave waits left later copies queued)"
    fi
fi
# gpu/trace-offload-act: act, 2 steps with MBT_DEBUG=1 and MBT_TRACE: the copies on the trace's
# track 1 ("activations' copies"), each of the plan's N buffers out and back once a micro-batch
# (2 a step: batch { global = 8, micro = 4 }), so 4N of each; the compute stream's waits for them
# on track 0 (on the emulated GPU as many as the compute stream's waits for the copy stream that
# MBT_FAKE_CUDA_WAITS counts); MBT_DEBUG's line for the copy stream's total apart from the compute
# stream's (docs/cuda.md, "Timing").
if [ "$DEVICE" = cpu ]; then
    skip gpu/trace-offload-act "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU writes no GPU trace"
elif [ -n "$oa_fail" ]; then
    fail gpu/trace-offload-act "the offload-act runs failed (see gpu/offload-act)"
else
    # shellcheck disable=SC2086
    n=$("$MBTC" "$d/t.mbt" --train act ${oa_flags[act]} -I examples --emit=plan 2>&1 |
        sed -n 's/^### offload activations = host: \([0-9]*\) held buffers\{0,1\} offloaded.*/\1/p')
    rm -f "$d/act.trace.json"
    MBT_DEBUG=1 MBT_TRACE="$d/act.trace.json" MBT_FAKE_CUDA_WAITS=1 on_device_cmd "$d/act/prog.cu" "$d/act/prog" "$d/trace.out" \
        train --steps 2 --data "$DATA"
    rc=$?
    waits=+
    [ "$DEVICE" = emu ] && waits=$(grep -c '^fake_cuda: wait [0-9]* runs' "$d/trace.out")
    if [ $rc != 0 ] || [ -z "$n" ] || [ "$n" = 0 ]; then
        fail gpu/trace-offload-act "the traced run failed (status $rc) or the plan offloads no buffer ('$n')" "$d/trace.out"
    elif ! "$PY" tests/gpu/trace_tracks.py "$d/act.trace.json" 1 "activations: copy to host" $((4 * n)) \
        1 "activations: copy back" $((4 * n)) 0 "activations: the step waits for its copies" "$waits" >"$d/tracks.out" 2>&1; then
        fail gpu/trace-offload-act "MBT_TRACE's tracks are not the plan's copies and waits ($n buffers, $waits waits)" "$d/tracks.out"
    elif ! grep -q "^GPU time: activations' copies: $((8 * n)) copies on their own stream, [0-9.]* us (beside the compute stream's, not in its total)\$" \
        "$d/trace.out"; then
        fail gpu/trace-offload-act "MBT_DEBUG's table does not give the $((8 * n)) copies' total apart" "$d/trace.out"
    else
        pass "gpu/trace-offload-act ($n buffers: $(cat "$d/tracks.out"))"
    fi
fi
}

# ---- offload { activations = nvme } on the GPU: device -> pinned staging -> a store file and back ---
# gpu/offload-act-nvme: tests/exec/offload_activations.mbt's act as it is (activations = nvme),
# built with --offload-gbps=1000 (14 buffers, 1.5 MiB, offloaded; at the default 1 GB/s against
# the GPU's launches the plan offloads little at this size), 10 steps on the device with
# --offload-staging 65536 (4 slots of 16 KiB: every 64 KiB buffer passes through the whole ring in
# chunks, and the 1.5 MiB store through 64 KiB of pinned memory), and again with the default staging
# (one chunk a buffer) through the store's worker thread (MBT_STORE_IO=thread), and act_rc (with
# recompute = [gelu] too, 13 buffers): base's weights byte for byte and its logs to every digit
# (gpu/offload-act's base, the same program); the GPU build run with --device cpu writes the store
# directly (no staging) and ends 3 steps with base's CPU weights; the plan's step
# peak below base's, `info` the same, the measured arena high-water within 64 bytes below it; the
# store file the plan's size (the banner's) and none left after the runs; the pinned staging the
# flag's, less than the store. gpu/offload-act-nvme-control (emulated GPU, where the copy stream's
# copies and host functions - the store's reads and writes - run as late as a GPU could run them):
# the first wait of the first micro-batch that runs copies to the host and each that runs copies
# back, each left out alone, change the weights after 2 steps (other writes' waits may change
# nothing, as for host). gpu/offload-act-nvme-errors: a store directory that does not
# exist, a full disk and an unwritable directory (a 256 KiB tmpfs, and a read-only one, in a mount
# namespace, where unshare -rm works) stop the run
# before its first step, naming the file; the store's directory removed after step 5's checkpoint
# stops the run at the next step's copies (under a timeout: no hang) and the run resumed from the
# checkpoint ends with base's weights.
sec_offload_nvme() {
if [ "$DEVICE" = cpu ]; then
    skip gpu/offload-act-nvme "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU stages nothing (the exec layer runs nvme there)"
    skip gpu/offload-act-nvme-control "MBT_GPU_TEST_DEVICE=$DEVICE: only the emulated GPU can leave out a wait"
    skip gpu/offload-act-nvme-errors "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU stages nothing"
    skip gpu/trace-offload-act-nvme "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU writes no GPU trace"
else
    b="$DIR/offload-act"
    d="$DIR/offload-act-nvme"
    mkdir -p "$d/act" "$d/act_rc" "$d/st"
    # dev_env CMD...: CMD with the emulated GPU's environment (nothing on a GPU)
    dev_env() {
        if [ "$DEVICE" = emu ]; then
            MBT_LIBCUDA="$FAKE" MBT_LIBCUBLASLT="$FAKE" MBT_LIBNCCL="$FAKE_NCCL" MBT_FAKE_CUDA_EMU="$d/act/prog.cu.so" "$@"
        else "$@"; fi
    }
    on_fail=""
    # base: gpu/offload-act's run, which runs first; when that section is not selected, this one's own
    if [ ! -s "$b/base.st" ] && ! want offload-act; then
        mkdir -p "$b/base"
        sed 's/activations = nvme/activations = host/' tests/exec/offload_activations.mbt >"$b/t.mbt"
        build "$b/base" "$b/t.mbt" --train base -I examples &&
            on_device_cmd "$b/base/prog.cu" "$b/base/prog" "$b/base.out" train --steps 10 --data "$DATA" --save-weights "$b/base.st" \
                --log "$b/base.jsonl" --arena-high-water
        "$b/base/prog" info >"$b/base.info" 2>&1
    fi
    if [ ! -s "$b/base.st" ]; then
        on_fail="gpu/offload-act's base run, which this compares with, failed"
    elif ! build "$d/act" tests/exec/offload_activations.mbt --train act --offload-gbps=1000 -I examples; then
        on_fail="mbtc tests/exec/offload_activations.mbt --train act --offload-gbps=1000 -o or --emit=cuda failed"
    elif ! on_device_cmd "$d/act/prog.cu" "$d/act/prog" "$d/act.out" train --steps 10 --data "$DATA" --save-weights "$d/act.st" \
        --log "$d/act.jsonl" --arena-high-water --offload-dir "$d/st" --offload-staging 65536; then
        on_fail="the act run on the device failed"
    elif ! MBT_STORE_IO=thread on_device_cmd "$d/act/prog.cu" "$d/act/prog" "$d/actt.out" train --steps 10 --data "$DATA" \
        --save-weights "$d/actt.st" --log "$d/actt.jsonl" --offload-dir "$d/st"; then
        on_fail="the act run with the default staging and the store's thread failed"
    elif ! build "$d/act_rc" tests/exec/offload_activations.mbt --train act_rc --offload-gbps=1000 -I examples; then
        on_fail="mbtc tests/exec/offload_activations.mbt --train act_rc --offload-gbps=1000 -o or --emit=cuda failed"
    elif ! on_device_cmd "$d/act_rc/prog.cu" "$d/act_rc/prog" "$d/act_rc.out" train --steps 10 --data "$DATA" \
        --save-weights "$d/act_rc.st" --log "$d/act_rc.jsonl" --arena-high-water --offload-dir "$d/st" --offload-staging 65536; then
        on_fail="the act_rc run (recompute = [gelu] too) on the device failed"
    elif ! timeout 600 "$d/act/prog" train --steps 3 --data "$DATA" --save-weights "$d/cpu_act.st" --offload-dir "$d/st" \
        --device cpu </dev/null >"$d/cpu_act.out" 2>&1 ||
        ! timeout 600 "$b/base/prog" train --steps 3 --data "$DATA" --save-weights "$d/cpu_base.st" --device cpu </dev/null \
            >"$d/cpu_base.out" 2>&1; then
        on_fail="the GPU build run with --device cpu failed"
    fi
    "$d/act/prog" info >"$d/act.info" 2>&1
    plan=$("$MBTC" tests/exec/offload_activations.mbt --train act --offload-gbps=1000 -I examples --emit=plan 2>&1)
    n=$(sed -n 's/^### offload activations = nvme: \([0-9]*\) held buffers\{0,1\} offloaded.*/\1/p' <<<"$plan")
    store_plan=$(sed -n 's/^### offload activations = nvme: .* to a store file of \([0-9]*\) bytes.*/\1/p' <<<"$plan")
    planned=$(sed -n 's/^step peak \([0-9]*\) bytes.*, without offload \([0-9]*\) bytes.*/\1/p' <<<"$plan")
    without=$(sed -n 's/^step peak \([0-9]*\) bytes.*, without offload \([0-9]*\) bytes.*/\2/p' <<<"$plan")
    info_p=$(sed -n 's/^plan: arena step \([0-9]*\) bytes$/\1/p' "$d/act.info")
    info_b=$(sed -n 's/^plan: arena step \([0-9]*\) bytes$/\1/p' "$b/base.info")
    store_run=$(sed -n "s/^activations: offloaded to '.*' (\([0-9]*\) bytes; .*/\1/p" "$d/act.out")
    pinned=$(sed -n 's/^activations: staged through \([0-9]*\) bytes of pinned host memory (4 slots of 16384 bytes).*/\1/p' "$d/act.out")
    hw=$(sed -n 's/^arena high-water: step 1.s micro-batches wrote \([0-9]*\) bytes of the arena; the plan.s step peak is \([0-9]*\)$/\1 \2/p' "$d/act.out")
    on_hw="$n buffers offloaded to a store of $store_plan bytes (run $store_run) through $pinned bytes of staging; step peak planned $planned (info $info_p), without offload $without (base's info $info_b), measured ${hw% *}"
    if [ -n "$on_fail" ]; then
        fail gpu/offload-act-nvme "$on_fail" "$OUT" "$d/act.out" "$d/actt.out"
    elif ! cmp -s "$b/base.st" "$d/act.st" || ! cmp -s "$b/base.st" "$d/actt.st" || ! cmp -s "$b/base.st" "$d/act_rc.st" ||
        [ "$(untimed "$b/base.jsonl")" != "$(untimed "$d/act.jsonl")" ] || [ "$(untimed "$b/base.jsonl")" != "$(untimed "$d/actt.jsonl")" ] ||
        [ "$(untimed "$b/base.jsonl")" != "$(untimed "$d/act_rc.jsonl")" ]; then
        fail gpu/offload-act-nvme "offload { activations = nvme } on the device changed the weights or the logs" "$b/base.jsonl" "$d/act.jsonl" "$d/actt.jsonl"
    elif ! cmp -s "$d/cpu_base.st" "$d/cpu_act.st" || ! grep -q "^activations: offloaded to '.*' (1572864 bytes; " "$d/cpu_act.out" ||
        grep -q "staged through" "$d/cpu_act.out"; then
        fail gpu/offload-act-nvme "the GPU build run on the CPU (--device cpu) did not write the store directly with base's weights" "$d/cpu_act.out"
    elif ! rc_hw=$(sed -n 's/^arena high-water: step 1.s micro-batches wrote \([0-9]*\) bytes of the arena; the plan.s step peak is \([0-9]*\)$/\1 \2/p' "$d/act_rc.out") ||
        [ -z "$rc_hw" ] || [ "${rc_hw% *}" -gt "${rc_hw#* }" ] || [ "${rc_hw% *}" -le $((${rc_hw#* } - 64)) ]; then
        fail gpu/offload-act-nvme "act_rc's measured arena high-water is not within 64 bytes below its plan's peak ('$rc_hw')" "$d/act_rc.out"
    elif ! grep -q "^activations: staged through .* on a second stream; forward_backward runs uncaptured" "$d/actt.out" ||
        ! grep -q "worker thread" "$d/actt.out"; then
        fail gpu/offload-act-nvme "the default-staging run does not say it stages through pinned memory on the store's thread" "$d/actt.out"
    elif ls "$d/st" | grep -q .; then
        fail gpu/offload-act-nvme "a store file was left behind: $(ls "$d/st")"
    elif ! grep -q "^plan: activations offloaded to nvme: a store file of $store_plan bytes during each micro-batch's step (on a GPU through pinned staging" "$d/act.info"; then
        fail gpu/offload-act-nvme "info does not give the plan's store and the GPU's staging" "$d/act.info"
    elif [ -z "$planned" ] || [ -z "$hw" ] || [ -z "$pinned" ] || [ "$info_p" != "$planned" ] || [ "$without" != "$info_b" ] ||
        [ "${hw#* }" != "$planned" ] || [ "$planned" -ge "$without" ] || [ "${hw% *}" -gt "$planned" ] ||
        [ "${hw% *}" -le $((planned - 64)) ] || [ -z "$store_plan" ] || [ "$store_plan" != "$store_run" ] ||
        [ "$pinned" != 65536 ] || [ "$pinned" -ge "$store_plan" ]; then
        fail gpu/offload-act-nvme "the step peak, info, the high-water mark, the store's or the staging's size disagree: $on_hw" "$d/act.out"
    else
        pass "gpu/offload-act-nvme (base's weights and logs on the device, 10 steps, through 4 slots of 16 KiB, through the default staging on the store's thread, and with recompute = [gelu] (act_rc: measured ${rc_hw% *} of ${rc_hw#* }); the GPU build on the CPU: base's weights; $on_hw)"
    fi
    if [ "$DEVICE" != emu ]; then
        skip gpu/offload-act-nvme-control "MBT_GPU_TEST_DEVICE=$DEVICE: only the emulated GPU can leave out a wait"
    elif [ -z "$on_fail" ]; then
        MBT_FAKE_CUDA_WAITS=1 on_device_cmd "$d/act/prog.cu" "$d/act/prog" "$d/waits.out" train --steps 2 --data "$DATA" \
            --save-weights "$d/act2.st" --offload-dir "$d/st" --offload-staging 65536
        # the first micro-batch's waits: up to the first that runs a write after one ran a read
        drops=$(awk '/^fake_cuda: wait [0-9]+ runs/ { w = $3; out = $5; back = $10
                     if (done) next
                     if (out > 0 && seen) { done = 1; next }
                     if (back > 0) { seen = 1; print w } else if (out > 0 && !first) { first = 1; print w } }' "$d/waits.out")
        same=""
        for w in $drops; do
            MBT_FAKE_CUDA_DROP_WAIT=$w on_device_cmd "$d/act/prog.cu" "$d/act/prog" "$d/drop.out" train --steps 2 --data "$DATA" \
                --save-weights "$d/drop.st" --offload-dir "$d/st" --offload-staging 65536
            if [ ! -s "$d/drop.st" ] || cmp -s "$d/act2.st" "$d/drop.st"; then same="$same $w"; fi
            rm -f "$d/drop.st"
        done
        if [ ! -s "$d/act2.st" ] || [ "$(wc -w <<<"$drops")" -lt 4 ]; then
            fail gpu/offload-act-nvme-control "MBT_FAKE_CUDA_WAITS found no waits to leave out ('$drops')" "$d/waits.out"
        elif [ -n "$same" ]; then
            fail gpu/offload-act-nvme-control "with wait$same of the step left out, the run did not end with other weights" "$d/waits.out"
        else
            pass "gpu/offload-act-nvme-control (each of waits $(echo $drops) left out alone: other weights after 2 steps)"
        fi
    fi
    # gpu/trace-offload-act-nvme: act through 16 KiB slots, 2 steps with MBT_DEBUG=1 and MBT_TRACE:
    # each copy's whole staging one event on track 1, 4N "activations: copy to nvme" and 4N "...
    # copy back from nvme" for the plan's N buffers (2 micro-batches a step), none overlapping;
    # the plan's waits on track 0
    if [ -n "$on_fail" ] || [ -z "$n" ]; then
        fail gpu/trace-offload-act-nvme "the act program did not run, or its plan offloads nothing (see gpu/offload-act-nvme)"
    else
        rm -f "$d/act.trace.json"
        if ! MBT_DEBUG=1 MBT_TRACE="$d/act.trace.json" on_device_cmd "$d/act/prog.cu" "$d/act/prog" "$d/trace.out" train \
            --steps 2 --data "$DATA" --offload-dir "$d/st" --offload-staging 65536; then
            fail gpu/trace-offload-act-nvme "the traced run failed" "$d/trace.out"
        elif ! "$PY" tests/gpu/trace_tracks.py "$d/act.trace.json" 1 "activations: copy to nvme" $((4 * n)) \
            1 "activations: copy back from nvme" $((4 * n)) 0 "activations: the step waits for its copies" + >"$d/tracks.out" 2>&1; then
            fail gpu/trace-offload-act-nvme "MBT_TRACE's tracks are not the plan's copies through the store ($n buffers)" "$d/tracks.out"
        else
            pass "gpu/trace-offload-act-nvme ($n buffers: $(cat "$d/tracks.out"))"
        fi
    fi
    # the errors: each must stop the run with status 1 and its message; none may hang (timeout)
    err=""
    if [ -n "$on_fail" ]; then
        err="the act program did not run"
    else
        dev_env timeout 300 "$d/act/prog" train --data "$DATA" --offload-dir "$d/none" "${DUT[@]}" </dev/null >"$d/nodir.out" 2>&1
        rc=$?
        if [ $rc != 1 ] || ! grep -q "activations: store directory '$d/none': No such file or directory" "$d/nodir.out" ||
            grep -q '^step 1/' "$d/nodir.out"; then
            err="a store directory that does not exist: status $rc, not the error before the first step"
            cp "$d/nodir.out" "$d/err.out"
        fi
    fi
    full="not tried: unshare -rm cannot mount a tmpfs here, so neither a full disk nor a read-only one"
    if [ -z "$err" ] && unshare -rm sh -c "mkdir -p '$d/tm' && mount -t tmpfs -o size=256k tmpfs '$d/tm'" >/dev/null 2>&1; then
        dev_env timeout 300 unshare -rm sh -c 'mount -t tmpfs -o size=256k tmpfs "$1" && shift && exec "$@"' sh "$d/tm" \
            "$d/act/prog" train --data "$DATA" --offload-dir "$d/tm" "${DUT[@]}" </dev/null >"$d/full.out" 2>&1
        rc=$?
        if [ $rc != 1 ] || ! grep -qE "activations: cannot allocate the store file '$d/tm/mbt-[^']*' \([0-9]+ bytes\): No space left on device" "$d/full.out" ||
            grep -q '^step 1/' "$d/full.out"; then
            err="a full disk (a 256 KiB tmpfs): status $rc, not the error before the first step"
            cp "$d/full.out" "$d/err.out"
        else full="a 256 KiB tmpfs: no space, before step 1"; fi
        # an unwritable directory (root writes anywhere else): a read-only tmpfs
        dev_env timeout 300 unshare -rm sh -c 'mount -t tmpfs -o ro,size=256k tmpfs "$1" && shift && exec "$@"' sh "$d/tm" \
            "$d/act/prog" train --data "$DATA" --offload-dir "$d/tm" "${DUT[@]}" </dev/null >"$d/ro.out" 2>&1
        rc=$?
        if [ $rc != 1 ] || ! grep -qE "activations: cannot create the store file '$d/tm/mbt-[^']*': Read-only file system" "$d/ro.out" ||
            grep -q '^step 1/' "$d/ro.out"; then
            err="an unwritable directory (a read-only tmpfs): status $rc, not the error before the first step"
            cp "$d/ro.out" "$d/err.out"
        else full="$full; a read-only tmpfs: not writable, before step 1"; fi
    fi
    if [ -z "$err" ]; then
        rm -rf "$d/st" "$d/ckv"
        mkdir -p "$d/st"
        dev_env timeout 300 "$d/act/prog" train --data "$DATA" --steps 2000 --ckpt-every 5 --ckpt-sync --ckpt-dir "$d/ckv" \
            --offload-dir "$d/st" --offload-staging 65536 "${DUT[@]}" </dev/null >"$d/vanish.out" 2>&1 &
        pid=$!
        for ((i = 0; i < 30000; i++)); do
            [ -e "$d/ckv/step-00000005/state.json" ] && break
            sleep 0.01
        done
        size=$(stat -c %s "$d"/st/mbt-*.activations 2>/dev/null)
        rm -rf "$d/st"
        wait $pid
        rc=$?
        last=$(sed -n 's/^checkpoint: step \([0-9]*\) written.*/\1/p' "$d/vanish.out" | tail -n 1)
        if [ $rc != 1 ] || ! grep -qE "^[^ ]*: step [0-9]+, micro-batch [0-9]+: activations: store file '$d/st/mbt-[^']*' has vanished .*No such file or directory" "$d/vanish.out"; then
            err="the store's directory removed mid-run: status $rc, not the error at the next step"
            cp "$d/vanish.out" "$d/err.out"
        elif [ "$size" != "$store_plan" ]; then
            err="the store file was $size bytes while training, not the plan's $store_plan"
        elif ! dev_env timeout 300 "$d/act/prog" train --data "$DATA" --resume latest --ckpt-dir "$d/ckv" --offload-dir "$d" --steps 10 \
            --save-weights "$d/resumed.st" "${DUT[@]}" </dev/null >"$d/resume.out" 2>&1 || ! cmp -s "$b/base.st" "$d/resumed.st"; then
            err="resumed from step $last's checkpoint, the run did not end with base's weights"
            cp "$d/resume.out" "$d/err.out"
        elif ls "$d" | grep -qE '^mbt-.*\.activations$'; then
            err="the resumed run left its store file behind"
        fi
    fi
    if [ -n "$err" ]; then
        fail gpu/offload-act-nvme-errors "$err" "$d/err.out"
    else
        pass "gpu/offload-act-nvme-errors (no directory: before step 1; full: $full; the store ($size bytes) removed: stopped at step $(sed -n 's/.*: step \([0-9]*\), micro-batch.*/\1/p' "$d/vanish.out"), resumed from step $last to base's weights)"
    fi
fi
}

# ---- CUDA graphs: the step captured and replayed, bit for bit the step launched kernel by kernel ----
# gpu/graph: tests/exec/dropout.mbt's drop (dropout keyed by step and micro-batch, uploaded each
# micro-batch; 2 micro-batches a step, so two gradient regions; lr and t uploaded each update),
# 5 steps with MBT_CUDA_GRAPH=0 and with graphs (the default): byte-identical weights, the same
# logs to every digit, and the graphs run said so (the runtime's "GPU:" line; on the emulated GPU
# also fake_cuda's own count of graph launches).
sec_graphs() {
if [ "$DEVICE" = cpu ]; then
    skip gpu/graph "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU has no CUDA graphs"
else
    d="$DIR/graph"
    mkdir -p "$d"
    if ! build "$d" tests/exec/dropout.mbt --train drop -I examples; then
        fail gpu/graph "mbtc tests/exec/dropout.mbt --train drop -o or --emit=cuda failed" "$OUT"
    else
        MBT_CUDA_GRAPH=0 on_device_cmd "$d/prog.cu" "$d/prog" "$d/off.out" train --steps 5 --data "$DATA" \
            --save-weights "$d/off.st" --log "$d/off.jsonl"
        rc0=$?
        MBT_FAKE_CUDA_REPORT=1 on_device_cmd "$d/prog.cu" "$d/prog" "$d/on.out" train --steps 5 --data "$DATA" \
            --save-weights "$d/on.st" --log "$d/on.jsonl"
        rc1=$?
        launched=$(sed -n 's/^GPU: .*CUDA graphs: \([0-9]*\) captured, \([0-9]*\) launched.*/\2/p' "$d/on.out")
        fake=$(sed -n 's/^fake_cuda: .* \([0-9]*\) graph launches.*/\1/p' "$d/on.out")
        if [ $rc0 != 0 ] || [ $rc1 != 0 ]; then
            fail gpu/graph "a run failed (MBT_CUDA_GRAPH=0: status $rc0; graphs: $rc1)" "$d/off.out" "$d/on.out"
        elif ! grep -q "^GPU: .*CUDA graphs: off (MBT_CUDA_GRAPH=0)" "$d/off.out"; then
            fail gpu/graph "MBT_CUDA_GRAPH=0 did not turn the graphs off" "$d/off.out"
        elif [ -z "$launched" ] || [ "$launched" -lt 5 ]; then
            fail gpu/graph "the graphs' run launched '${launched}' graphs (at least 5 expected)" "$d/on.out"
        elif [ "$DEVICE" = emu ] && [ "$fake" != "$launched" ]; then
            fail gpu/graph "the runtime says $launched graphs were launched, the stand-in driver '$fake'" "$d/on.out"
        elif ! cmp -s "$d/off.st" "$d/on.st" || [ "$(untimed "$d/off.jsonl")" != "$(untimed "$d/on.jsonl")" ]; then
            fail gpu/graph "the step as graphs saved or logged other numbers than launched kernel by kernel" "$d/off.jsonl" "$d/on.jsonl"
        else
            pass "gpu/graph ($launched graph launches; the weights and logs of MBT_CUDA_GRAPH=0, byte for byte, 5 steps)"
        fi
        # a driver that refuses every capture (the stand-in's MBT_FAKE_CUDA_NO_CAPTURE): the step runs
        # uncaptured, with the same numbers, and the GPU line says why
        if [ "$DEVICE" = emu ]; then
            MBT_FAKE_CUDA_NO_CAPTURE=1 on_device_cmd "$d/prog.cu" "$d/prog" "$d/refused.out" train --steps 5 --data "$DATA" \
                --save-weights "$d/refused.st" --log "$d/refused.jsonl"
            rc=$?
            if [ $rc != 0 ]; then
                fail gpu/graph-refused "the run whose captures the driver refuses failed (status $rc)" "$d/refused.out"
            elif ! grep -q "^GPU: .*CUDA graphs: 0 captured, 0 launched; .*a capture failed.*cuStreamBeginCapture" "$d/refused.out"; then
                fail gpu/graph-refused "the GPU line does not say that the captures failed" "$d/refused.out"
            elif ! cmp -s "$d/off.st" "$d/refused.st" || [ "$(untimed "$d/off.jsonl")" != "$(untimed "$d/refused.jsonl")" ]; then
                fail gpu/graph-refused "refused captures changed the numbers" "$d/off.jsonl" "$d/refused.jsonl"
            else
                pass "gpu/graph-refused (captures refused by the driver: the step runs uncaptured, the same weights and logs)"
            fi
        fi
    fi
fi
}

# ---- MBT_DEBUG's timing table and MBT_TRACE's Chrome trace ----------------------------------------
sec_debug() {
if [ "$DEVICE" = cpu ]; then
    skip gpu/debug-timing "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU prints no GPU timing table"
    skip gpu/trace "MBT_GPU_TEST_DEVICE=$DEVICE: the CPU writes no GPU trace"
else
    d="$DIR/debug"
    mkdir -p "$d"
    mkdir -p "$DIR/tiny"
    if ! build "$DIR/tiny" examples/tiny.mbt --train tiny; then
        fail gpu/debug-timing "mbtc examples/tiny.mbt -o or --emit=cuda failed" "$OUT"
    else
        cp "$DIR/tiny/prog.cu" "$d/tiny.cu"
        cp "$DIR/tiny/prog" "$d/tiny"
        # the kernel functions: `extern "C" __global__ void [__launch_bounds__(...)] NAME(`
        sed -n 's/.*__global__ void \(__launch_bounds__([^)]*) \)\{0,1\}\([A-Za-z_][A-Za-z0-9_]*\)(.*/\2/p' "$d/tiny.cu" | sort -u >"$d/kernels.txt"
        MBT_DEBUG=1 MBT_TRACE="$d/trace.json" on_device "$d/tiny.cu" "$d/tiny" "$d/run"
        rc=$?
        # the table: from its header (a line naming "kernel" and "us"/"µs") on; rows name kernels
        awk 'tolower($0) ~ /kernel/ && ($0 ~ /(^|[^A-Za-z])us([^A-Za-z]|$)/ || $0 ~ /µs/) { on = 1 } on' "$d/run.out" >"$d/table.txt"
        named=$(grep -owFf "$d/kernels.txt" "$d/table.txt" | sort -u | wc -l)
        if [ $rc != 0 ]; then
            fail gpu/debug-timing "MBT_DEBUG=1 MBT_TRACE=F train --device cuda exited with status $rc" "$d/run.out"
        elif [ ! -s "$d/kernels.txt" ]; then
            fail gpu/debug-timing "no __global__ functions found in mbtc --emit=cuda's output" "$d/tiny.cu"
        elif [ ! -s "$d/table.txt" ]; then
            fail gpu/debug-timing "MBT_DEBUG=1 printed no header line naming 'kernel' and 'us'" "$d/run.out"
        elif [ "$named" = 0 ]; then
            fail gpu/debug-timing "the timing table names none of the program's $(wc -l <"$d/kernels.txt") kernel functions" "$d/table.txt"
        else
            pass "gpu/debug-timing (the table names $named of the program's $(wc -l <"$d/kernels.txt") kernel functions)"
        fi
        if [ $rc != 0 ]; then
            fail gpu/trace "the MBT_TRACE run failed (see gpu/debug-timing)"
        elif "$PY" - "$d/trace.json" "$d/kernels.txt" >"$OUT" 2>&1 <<'EOF'; then
import json, sys
try:
    with open(sys.argv[1]) as f:
        trace = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"{sys.argv[1]}: {e}")
events = trace.get("traceEvents") if isinstance(trace, dict) else None
if not isinstance(events, list) or not events:
    sys.exit(f"traceEvents is not a non-empty list: {str(trace)[:200]}")
bad = [e for e in events if not isinstance(e, dict) or "name" not in e or "ph" not in e]
if bad:
    sys.exit(f"{len(bad)} of {len(events)} events have no name or ph, e.g. {bad[0]}")
kernels = set(open(sys.argv[2]).read().split())
# one track, the compute stream's, named by a thread_name metadata event
tids = {e.get("tid") for e in events if e["ph"] == "X"}
tracks = {e.get("tid"): (e.get("args") or {}).get("name") for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
if tids != {0} or tracks != {0: "compute"}:
    sys.exit(f"the events are on tracks {sorted(tids, key=str)} named {tracks}, not on track 0 named 'compute'")
named = {e["name"] for e in events} & kernels
if not named:
    sys.exit(f"no event is named after one of the program's {len(kernels)} kernel functions; names: "
             f"{sorted({str(e['name']) for e in events})[:10]}")
print(f"{len(events)} events, {len(named)} of the {len(kernels)} kernel functions")
EOF
            pass "gpu/trace ($(tail -n 1 "$OUT"))"
        else
            fail gpu/trace "MBT_TRACE's file is not the expected trace" "$OUT"
        fi
    fi
fi
}
# ---- a bf16 program's weight casts: once an optimizer step, or written by the update (issue 15) ----
# gpu/param-casts: tests/exec/param_casts.mbt's kept (its cast launch skipped at a step's second to
# fourth micro-batch, RtStep.casts_kept 1, and from the second step on at the first too, casts_kept
# 2: the update wrote cast(p_new) into the parameter casts' region, plan.h's PH_PCAST), kept1 (the
# same at one micro-batch a step) and their peers every and every1 (recompute = [gelu]: cast at
# every micro-batch), 3 steps on the device: byte-identical weights and the same logs; with
# MBT_DEBUG=1 the timing table counts kept's and kept1's cast kernel once in all (the first step's
# first micro-batch: 0 times after the first step), every's 12 times and every1's 3; kept and kept1
# run as CUDA graphs too (MBT_DEBUG turns them off), with the same weights.
sec_casts() {
if [ "$DEVICE" = cpu ]; then
    skip gpu/param-casts "MBT_GPU_TEST_DEVICE=$DEVICE: the exec layer's param_casts.case runs it on the CPU"
else
    d="$DIR/param-casts"
    ok=1
    for t in kept every kept1 every1; do
        mkdir -p "$d/$t"
        build "$d/$t" tests/exec/param_casts.mbt --train $t || ok=0
    done
    if [ $ok = 0 ]; then
        fail gpu/param-casts "mbtc tests/exec/param_casts.mbt -o or --emit=cuda failed" "$OUT"
    else
        for t in kept every kept1 every1; do
            MBT_DEBUG=1 on_device_cmd "$d/$t/prog.cu" "$d/$t/prog" "$d/$t.out" train --steps 3 --data "$DATA" \
                --save-weights "$d/$t.st" --log "$d/$t.jsonl"
            echo $? >"$d/$t.rc"
        done
        # and as CUDA graphs (MBT_DEBUG runs the step uncaptured): the calls with casts_kept 0, 1
        # and 2 are graphs of their own, which must give the same numbers
        for t in kept kept1; do
            on_device_cmd "$d/$t/prog.cu" "$d/$t/prog" "$d/${t}g.out" train --steps 3 --data "$DATA" \
                --save-weights "$d/${t}g.st" --log "$d/${t}g.jsonl"
            echo $? >"$d/${t}g.rc"
        done
        count() { awk '$1 == "step_k0_cast" { n = $2 } END { print n + 0 }' "$d/$1.out"; }
        rcs="$(cat "$d/kept.rc" "$d/every.rc" "$d/kept1.rc" "$d/every1.rc" "$d/keptg.rc" "$d/kept1g.rc" | tr '\n' ' ')"
        if [ "$rcs" != "0 0 0 0 0 0 " ]; then
            fail gpu/param-casts "a run failed (kept, every, kept1, every1, kept and kept1 as graphs: status $rcs)" \
                "$d/kept.out" "$d/every.out" "$d/kept1.out" "$d/every1.out" "$d/keptg.out" "$d/kept1g.out"
        elif ! cmp -s "$d/kept.st" "$d/every.st" || [ "$(untimed "$d/kept.jsonl")" != "$(untimed "$d/every.jsonl")" ]; then
            fail gpu/param-casts "the casts kept over a step's micro-batches saved or logged other numbers than recast each time" "$d/kept.jsonl" "$d/every.jsonl"
        elif ! cmp -s "$d/kept1.st" "$d/every1.st" || [ "$(untimed "$d/kept1.jsonl")" != "$(untimed "$d/every1.jsonl")" ]; then
            fail gpu/param-casts "the casts the update wrote (one micro-batch a step) saved or logged other numbers than recast each time" "$d/kept1.jsonl" "$d/every1.jsonl"
        elif ! cmp -s "$d/keptg.st" "$d/every.st" || ! cmp -s "$d/kept1g.st" "$d/every1.st" \
            || [ "$(untimed "$d/kept1g.jsonl")" != "$(untimed "$d/every1.jsonl")" ] || ! grep -q "^GPU: .*CUDA graphs: [1-9]" "$d/kept1g.out"; then
            fail gpu/param-casts "kept or kept1 as CUDA graphs saved or logged other numbers than recast each time (or ran no graph)" "$d/keptg.out" "$d/kept1g.out"
        elif [ "$(count kept) $(count every) $(count kept1) $(count every1)" != "1 12 1 3" ]; then
            fail gpu/param-casts "step_k0_cast ran $(count kept), $(count every), $(count kept1) and $(count every1) times in kept's, every's, kept1's and every1's 3 steps (1, 12, 1 and 3 expected)" "$d/kept.out" "$d/kept1.out"
        else
            pass "gpu/param-casts (the cast kernel once in 3 steps of 4 micro-batches and in 3 of 1, 12 and 3 times recasting; weights and logs byte for byte, as CUDA graphs too)"
        fi
    fi
    # gpu/param-casts-zero1/TRANSPORT: zero1 (ZeRO-1, 2 ranks, one micro-batch each) against every2
    # (one process, the same global batch, recasting): with NCCL each rank's shard of the parameter
    # casts' region is gathered GPU to GPU beside the parameters, so no step but the first casts
    # (step_k0_cast once in 3 steps, MBT_DEBUG); staged through the host (MBT_NCCL=0) the region is
    # not gathered and every step's first micro-batch casts (3 times)
    mkdir -p "$d/zero1" "$d/every2"
    if ! build "$d/zero1" tests/exec/param_casts.mbt --train zero1 || ! build "$d/every2" tests/exec/param_casts.mbt --train every2; then
        fail gpu/param-casts-zero1 "mbtc tests/exec/param_casts.mbt -o or --emit=cuda failed" "$OUT"
    elif [ "$DEVICE" = emu ] && ! { [ -f "$d/zero1/prog.cu.so" ] || tests/cudaemu/build.sh "$d/zero1/prog.cu" "$d/zero1/prog.cu.so" >"$OUT" 2>&1; }; then
        fail gpu/param-casts-zero1 "tests/cudaemu/build.sh failed" "$OUT"
    else
        on_device_cmd "$d/every2/prog.cu" "$d/every2/prog" "$d/every2.out" train --steps 3 --data "$DATA" \
            --save-weights "$d/every2.st" --log "$d/every2.jsonl"
        rce=$?
        for spec in "nccl 1 1" "staged 0 3"; do
            read -r tr nccl want <<<"$spec"
            if [ "$nccl" = 1 ] && [ "$DEVICE" != emu ] && [ "$ngpus" -lt 2 ]; then
                skip gpu/param-casts-zero1/$tr "NCCL needs a GPU a rank and this machine has $ngpus"
                continue
            fi
            rm -f "$d/z.$tr.st"
            MBT_DEBUG=1 ranks 2 "$nccl" "$d/z.$tr" "$d/zero1/prog" train --steps 3 --data "$DATA" --save-weights "$d/z.$tr.st" \
                --log "$d/z.$tr.jsonl"
            rcz=$ranks_rc
            n=$(awk '$1 == "step_k0_cast" { n = $2 } END { print n + 0 }' "$d/z.$tr.0.out")
            if [ "$rce" != 0 ] || [ "$rcz" != 0 ]; then
                fail gpu/param-casts-zero1/$tr "a run failed (every2: status $rce; zero1's 2 ranks: $rcz)" "$d/every2.out" \
                    "$d/z.$tr.0.out" "$d/z.$tr.1.out"
            elif ! cmp -s "$d/z.$tr.st" "$d/every2.st" || [ "$(untimed "$d/z.$tr.jsonl")" != "$(untimed "$d/every2.jsonl")" ]; then
                fail gpu/param-casts-zero1/$tr "ZeRO-1's 2 ranks saved or logged other numbers than one recasting process" \
                    "$d/z.$tr.jsonl" "$d/every2.jsonl"
            elif [ "$n" != "$want" ]; then
                fail gpu/param-casts-zero1/$tr "step_k0_cast ran $n times on rank 0 in 3 steps ($want expected)" "$d/z.$tr.0.out"
            else
                pass "gpu/param-casts-zero1/$tr (2 ranks: every2's weights and logs byte for byte; the cast kernel $n times in 3 steps)"
            fi
        done
    fi
fi
}
# ---- the sections: one after another, or MBT_GPU_TEST_LANES at a time ---------------------------
# MBT_GPU_TEST_LANES (the emulated GPU: 2 by default; a GPU and the CPU's dry run: 1) sections run side
# by side, each a background shell whose report (PASS/FAIL/SKIP lines) is kept in
# $DIR/sections/NAME/report.txt and relayed, and counted, in SECTIONS' order as soon as it and every
# section before it are done: the output is the same whatever finishes first. A section starts when
# a lane is free (the longest first: SECTION_START) and the section SECTION_AFTER names, if it runs,
# is done; each one's start and end times are in $DIR/sections/NAME/start and done. Each has its own $OUT and
# its own range of ports (SECTION_NO, ranks). With one lane each runs in this shell, its lines
# printed as they come, as before lanes. The sections' bodies keep the column they had before they
# became functions.
LANES=${MBT_GPU_TEST_LANES:-1}
[ "$DEVICE" = emu ] && LANES=${MBT_GPU_TEST_LANES:-2}
SEL=()
for s in "${SECTIONS[@]}"; do want "$s" && SEL+=("$s"); done
echo "# sections: ${SEL[*]}$([ "$LANES" -gt 1 ] && echo " ($LANES at a time)")"
if [ "$LANES" -le 1 ]; then
    for i in "${!SEL[@]}"; do
        SECTION_NO=$((i + 1))
        "sec_${SEL[$i]//-/_}"
    done
else
    declare -A sec_started=()
    sec_relayed=0
    while [ "$sec_relayed" -lt "${#SEL[@]}" ]; do
        busy=0
        for s in "${SEL[@]}"; do
            [ -n "${sec_started[$s]:-}" ] && [ ! -e "$DIR/sections/$s/done" ] && busy=$((busy + 1))
        done
        for s in "${SECTION_START[@]}"; do
            want "$s" || continue
            [ "$busy" -lt "$LANES" ] || break
            [ -z "${sec_started[$s]:-}" ] || continue
            after=${SECTION_AFTER[$s]:-}
            if [ -n "$after" ] && want "$after" && [ ! -e "$DIR/sections/$after/done" ]; then continue; fi
            sec_started[$s]=1
            busy=$((busy + 1))
            mkdir -p "$DIR/sections/$s"
            (
                for i in "${!SECTIONS[@]}"; do [ "${SECTIONS[$i]}" = "$s" ] && SECTION_NO=$((i + 1)); done
                OUT="$DIR/sections/$s/out.txt"
                date +%s >"$DIR/sections/$s/start"
                # (in a shell of its own, which an error of the section's may end: then it says so)
                ("sec_${s//-/_}"; echo "# end of section $s") >"$DIR/sections/$s/report.txt" 2>&1
                rc=$?
                grep -q "^# end of section $s\$" "$DIR/sections/$s/report.txt" ||
                    fail "gpu/section-$s" "the section's shell stopped before its end (status $rc)" >>"$DIR/sections/$s/report.txt"
                sed -i "/^# end of section $s\$/d" "$DIR/sections/$s/report.txt"
                date +%s >"$DIR/sections/$s/done"
            ) &
        done
        while [ "$sec_relayed" -lt "${#SEL[@]}" ] && [ -e "$DIR/sections/${SEL[$sec_relayed]}/done" ]; do
            r="$DIR/sections/${SEL[$sec_relayed]}/report.txt"
            cat "$r"
            PASSED=$((PASSED + $(grep -c '^PASS ' "$r")))
            FAILED=$((FAILED + $(grep -c '^FAIL ' "$r")))
            SKIPPED=$((SKIPPED + $(grep -c '^SKIP ' "$r")))
            sec_relayed=$((sec_relayed + 1))
        done
        [ "$sec_relayed" -lt "${#SEL[@]}" ] || break
        wait -n 2>/dev/null || sleep 0.2 # a section ended (or none was left to wait for)
    done
    wait
fi
summary
