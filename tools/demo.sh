#!/usr/bin/env bash
# tools/demo.sh BUILD - what `make demo` shows: a training set from a synthetic process whose
# entropy is known (mbt-gendata), examples/tiny.mbt compiled to an executable, trained on 2 CPU
# cores (about two and a half minutes; longer when the cores are busy), its held-out loss next to
# the known optimum, and a few generated samples scored under the true process. Then the examples
# checked, and the message for a program with a shape mistake. Exit status 0 when everything ran.
#
# MBT_DEMO_STEPS=N trains N steps instead of the program's 400 (the learning-rate schedule still
# spans 400); MBT_DEMO_THREADS=N uses N threads instead of 2.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ $# -lt 1 ]; then
    echo "usage: tools/demo.sh BUILD" >&2
    exit 2
fi
if ! BUILD=$(cd "$1" 2>/dev/null && pwd); then
    echo "tools/demo.sh: no build directory '$1' (run make first)" >&2
    exit 1
fi
MBTC="$BUILD/mbtc"
if [ ! -x "$MBTC" ]; then
    echo "tools/demo.sh: $MBTC does not exist (run make first)" >&2
    exit 1
fi
cd "$ROOT" || exit 1
mkdir -p "$BUILD/tmp" || exit 1
# mbtc finds the stdlib beside itself (<bindir>/../stdlib); a build directory elsewhere is
# pointed at the repository's.
if [ ! -d "$BUILD/../stdlib" ]; then export MBT_PATH="$ROOT/stdlib${MBT_PATH:+:$MBT_PATH}"; fi
STEPS=${MBT_DEMO_STEPS:-}
THREADS=${MBT_DEMO_THREADS:-2}

rule() { printf '\n== %s %s\n' "$1" "$(printf '%*s' $((70 - ${#1})) '' | tr ' ' '=')"; }
die() {
    echo "demo: $*" >&2
    exit 1
}
show() {
    echo "\$ $*"
    "$@"
}

rule "1. the data: an order-2 Markov chain whose entropy rate is known exactly"
# examples/tiny.mbt reads data/tiny_train.bin; the held-out file is data/tiny_val.bin.
show "$BUILD/mbt-gendata" --out-dir data --name tiny | tee "$BUILD/tmp/demo-gendata.txt" || die "mbt-gendata failed"
H=$(sed -n 's/^entropy rate: \([0-9.]*\) nats.*/\1/p' "$BUILD/tmp/demo-gendata.txt")
H1=$(sed -n 's/^best with less context: bigram H(x_t | x_t-1) = \([0-9.]*\) .*/\1/p' "$BUILD/tmp/demo-gendata.txt")

rule "2. compile: mbtc examples/tiny.mbt -o build/tiny"
t0=$(date +%s%N)
show "$MBTC" examples/tiny.mbt -o "$BUILD/tiny" || die "mbtc -o failed"
echo "(compiled in $((($(date +%s%N) - t0) / 1000000)) ms: graph, autodiff, fusion, LLVM kernels and host code, linked with libmbtrt)"

rule "3. train on $THREADS CPU threads"
show "$BUILD/tiny" train ${STEPS:+--steps "$STEPS"} --threads "$THREADS" --log "$BUILD/tmp/demo-train.jsonl" \
    --save-weights "$BUILD/tiny.safetensors" || die "training failed"

rule "4. the held-out loss against the known optimum"
show "$BUILD/tiny" eval --weights "$BUILD/tiny.safetensors" --data data/tiny_val.bin --threads "$THREADS" \
    | tee "$BUILD/tmp/demo-eval.txt" || die "eval failed"
L=$(sed -n 's/^eval [^:]*: loss \([0-9.]*\) .*/\1/p' "$BUILD/tmp/demo-eval.txt")
awk -v l="$L" -v h="$H" -v h1="$H1" 'BEGIN {
    printf "held-out loss %.4f nats/token; the optimum (entropy rate) is %.4f, %.4f above it.\n", l, h, l - h
    printf "for scale: the best bigram model reaches %.4f, uniform guessing %.4f.\n", h1, log(64)
}'

rule "5. samples (temperature 1), scored under the true chain"
samples="$BUILD/tmp/demo-samples.txt"
: >"$samples"
for seed in 1 2 3; do
    "$BUILD/tiny" generate --weights "$BUILD/tiny.safetensors" --prompt-tokens 0,1 --max-tokens 48 --temperature 1 \
        --seed "$seed" --threads "$THREADS" >>"$samples" || die "generate failed"
done
cat "$samples"
"$BUILD/mbt-gendata" --score "$samples" || die "scoring the samples failed"
echo "(text drawn from the chain itself scores about its entropy rate; uniformly random tokens about 7.7.)"

rule "6. every example checks"
all_ok=1
for f in examples/*.mbt; do
    [ -f "$f" ] || continue
    err="$BUILD/tmp/demo-check.err"
    "$MBTC" --check "$f" 2>"$err" >/dev/null
    rc=$?
    if [ "$rc" = 0 ] && [ ! -s "$err" ]; then
        printf 'OK      %s\n' "$f"
    else
        all_ok=0
        printf 'FAILED  %-24s (exit status %d)\n' "$f" "$rc"
        sed 's/^/        /' "$err" | head -n 30
    fi
done

rule "7. a mistake, caught before anything runs"
demo="$BUILD/tmp/demo_mistake.mbt"
cat >"$demo" <<'EOF'
# The projection is 4 * d wide, but forward promises a result d wide.
model Proj(d = 64) {
  w = param f32[d, 4 * d] ~ normal(0, 0.02)

  fn forward(x: f32[B, T, d]) -> f32[B, T, d] {
    return x @ w
  }
}
EOF
echo "\$ mbtc --check $demo"
"$MBTC" --check "$demo" 2>&1
echo "(exit status $?)"

echo
[ "$all_ok" = 1 ] || die "some examples did not check (see above)"
echo "demo done: build/tiny is the executable ('build/tiny --help'), build/tiny.safetensors its weights."
