#!/usr/bin/env bash
# tests/gpu/selftest.sh BUILD - tests of tests/gpu/cmpdump.py, the comparison `make test-gpu` holds
# the GPU's training step to, on a machine without a GPU: step dumps of examples/tiny.mbt (4
# micro-batches of 8 x 64 tokens, AdamW) made on the CPU.
#
#   threads-*      --threads 1 against --threads 2: identical dumps pass, with the tolerances and --exact
#   perturbed-*    a copy with one value changed - a gradient entry by 1e-4 of its tensor's largest,
#                  an updated weight by 1e-5, the loss by 1e-4 relative, a starting weight by one ulp -
#                  must fail (exit 1) with exactly one FAIL line, naming what was changed
#   not-a-dump     a token file is refused (exit 2) with a message
#   torch-*        (with PyTorch for /usr/bin/python3) tests/torch/oracle.py's own f32 step from the same
#                  weights and batches, its summation orders and AdamW formula not mbt's - as a GPU's
#                  differ from the CPU's - passes at the default tolerances; the same with the
#                  updated weights compared plainly (--plain-next) fails, which is why cmpdump allows
#                  for entries whose gradient is rounding noise; and two wrong steps fail: the exact
#                  GELU for mbt's tanh form (the gradients) and AdamW without weight decay (the update)
#
# Prints PASS/FAIL/SKIP lines and `N passed, M failed` last; exit status 1 when anything failed.
# About 15 s on 2 cores (most of it PyTorch's steps).
set -u
set -o pipefail
if [ $# -lt 1 ]; then
    echo "usage: tests/gpu/selftest.sh BUILD" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "FAIL gpu-selftest/setup: no build directory '$1' (run make first)"; echo "0 passed, 1 failed"; exit 1; }
cd "$ROOT" || exit 2
# shellcheck source=tests/report.sh
. tests/report.sh
PY=/usr/bin/python3
CMP=(/usr/bin/python3 tests/gpu/cmpdump.py)
T=gpu-selftest
DIR="$BUILD/tmp/gpu-selftest"
rm -rf "$DIR"
mkdir -p "$DIR" || exit 2
OUT="$DIR/out.txt"

if ! "$PY" -c 'import numpy' >/dev/null 2>&1; then
    fail "$T/setup" "$PY cannot import numpy (apt-get install python3-numpy)"
    summary
    exit
fi
if ! "$BUILD/mbt-gendata" --out-dir "$DIR/d" --name t --tokens 100000 --val-tokens 0 >"$OUT" 2>&1 \
    || ! "$BUILD/mbtc" examples/tiny.mbt -o "$DIR/tiny" >"$OUT" 2>&1; then
    fail "$T/setup" "mbt-gendata or mbtc -o examples/tiny.mbt failed" "$OUT"
    summary
    exit
fi
for n in 1 2; do
    if ! "$DIR/tiny" train --steps 1 --threads $n --data "$DIR/d/t_train.bin" --dump-step "$DIR/t$n.st" >"$OUT" 2>&1; then
        fail "$T/setup" "train --steps 1 --threads $n --dump-step failed" "$OUT"
        summary
        exit
    fi
done

# expect_ok NAME ARGS...: cmpdump ARGS exits 0 with its `cmpdump: ok` line
expect_ok() {
    local name=$1 rc
    shift
    "${CMP[@]}" "$@" >"$OUT" 2>&1
    rc=$?
    if [ $rc = 0 ] && grep -q '^cmpdump: ok' "$OUT"; then pass "$T/$name ($(sed -n 's/^cmpdump: ok (\(.*\))$/\1/p' "$OUT"))"
    else fail "$T/$name" "cmpdump exited with status $rc, expected 0 and 'cmpdump: ok'" "$OUT"; fi
}

# expect_fail NAME ALL NEED ARGS...: cmpdump ARGS exits 1 with `cmpdump: FAILED`, every FAIL
# line's subject (what it names) matches the extended regular expression ALL and some subject
# matches NEED. ALL `=X`: exactly one FAIL line, naming X.
expect_fail() {
    local name=$1 all=$2 need=$3 rc subjects n list
    shift 3
    "${CMP[@]}" "$@" >"$OUT" 2>&1
    rc=$?
    subjects=$(sed -n 's/^FAIL \([^:]*\(:[^: ]*\)\{0,1\}\): .*/\1/p' "$OUT")
    n=$(printf '%s' "$subjects" | grep -c .)
    list=$(printf '%s\n' "$subjects" | paste -sd' ')
    if [ $rc != 1 ] || ! grep -q '^cmpdump: FAILED' "$OUT"; then
        fail "$T/$name" "cmpdump exited with status $rc, expected 1 and 'cmpdump: FAILED'" "$OUT"
    elif [ "${all:0:1}" = = ] && [ "$subjects" != "${all:1}" ]; then
        fail "$T/$name" "expected one FAIL line, for '${all:1}'; got $n: $list" "$OUT"
    elif [ "${all:0:1}" != = ] && grep -vqE "$all" <<<"$subjects"; then
        fail "$T/$name" "FAIL lines for other things than /$all/: $list" "$OUT"
    elif ! grep -qE "$need" <<<"$subjects"; then # (not a pipe: grep -q's early exit, pipefail)
        fail "$T/$name" "no FAIL line for /$need/: $list" "$OUT"
    else
        pass "$T/$name (FAILED on $n: $(echo "$list" | cut -d' ' -f1-3)$([ "$n" -gt 3 ] && echo ' ...'))"
    fi
}

# perturb IN OUT TENSOR HOW: a copy of step dump IN with one value changed. TENSOR is a tensor's
# name (its middle entry is changed) or `loss` (the metadata mbt.loss); HOW is `add:R` (add R
# times the tensor's largest |entry|, or multiply the loss by 1 + R) or `ulp` (the next float up).
perturb() {
    "$PY" - "$@" <<'EOF'
import json, struct, sys
import numpy as np
src, dst, name, how = sys.argv[1:5]
raw = bytearray(open(src, "rb").read())
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n].decode("utf-8"))
if name == "loss":
    meta = header["__metadata__"]
    meta["mbt.loss"] = repr(float(meta["mbt.loss"]) * (1 + float(how.split(":")[1])))
    h = json.dumps(header).encode("utf-8")
    h += b" " * (-len(h) % 8)
    raw = struct.pack("<Q", len(h)) + h + raw[8 + n:]
else:
    begin, end = header[name]["data_offsets"]
    a = np.frombuffer(raw, dtype="<f4", count=(end - begin) // 4, offset=8 + n + begin)  # a view of raw
    i = a.size // 2
    if how == "ulp":
        a[i] = np.nextafter(a[i], np.float32(np.inf))
    else:
        a[i] += np.float32(float(how.split(":")[1]) * np.max(np.abs(a)))
open(dst, "wb").write(raw)
EOF
}

expect_ok threads-tolerances "$DIR/t1.st" "$DIR/t2.st"
expect_ok threads-exact --exact "$DIR/t1.st" "$DIR/t2.st"

for c in "grad:h.1.mlp.c_fc.weight add:1e-4" "next:h.2.attn.c_proj.weight add:1e-5" "loss add:1e-4" "wpe ulp"; do
    read -r name how <<<"$c"
    if ! perturb "$DIR/t1.st" "$DIR/p.st" "$name" "$how" >"$OUT" 2>&1; then
        fail "$T/perturbed-${name%%:*}" "could not write the perturbed copy" "$OUT"
        continue
    fi
    expect_fail "perturbed-${name%%:*}" "=$name" . "$DIR/t1.st" "$DIR/p.st"
done

"${CMP[@]}" "$DIR/t1.st" "$DIR/d/t_train.bin" >"$OUT" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "^cmpdump: cannot compare: $DIR/d/t_train.bin: " "$OUT"; then pass "$T/not-a-dump ($(cut -c1-120 "$OUT"))"
else fail "$T/not-a-dump" "status $rc, expected 2 and 'cmpdump: cannot compare: FILE: ...'" "$OUT"; fi

# PyTorch's step from the same start (tiny.mbt: adamw(lr = 3e-3, weight_decay = 0.1), default betas)
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    for c in torch-step torch-plain-next torch-control-gelu torch-control-decay; do
        skip "$T/$c" "no PyTorch for $PY (apt-get install python3-torch)"
    done
else
    ORACLE=("$PY" tests/torch/oracle.py step "$DIR/t1.st")
    if "${ORACLE[@]}" "$DIR/torch.st" >"$OUT" 2>&1 && "${ORACLE[@]}" "$DIR/torch-gelu.st" --control-erf-gelu >>"$OUT" 2>&1 \
        && "${ORACLE[@]}" "$DIR/torch-nodecay.st" --weight-decay 0 >>"$OUT" 2>&1; then
        expect_ok torch-step "$DIR/t1.st" "$DIR/torch.st"
        expect_fail torch-plain-next '^next:' '^next:' --plain-next "$DIR/t1.st" "$DIR/torch.st"
        expect_fail torch-control-gelu '^(grad:|next:|loss$)' '^grad:' "$DIR/t1.st" "$DIR/torch-gelu.st"
        expect_fail torch-control-decay '^next:' '^next:' "$DIR/t1.st" "$DIR/torch-nodecay.st"
    else
        fail "$T/torch-step" "tests/torch/oracle.py step failed" "$OUT"
    fi
fi
summary
