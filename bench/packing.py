#!/usr/bin/python3
"""bench/packing.py - tokens/s of packed versus padded batches on variable-length documents (issue 20).

Writes synthetic documents with variable lengths (log-uniform from 8 to 512 tokens, each ending in
the end-of-text id 3) in two shards holding the same documents: `packed`, the documents back to
back, which tokens(..., docs = 3) packs into rows of seq = 128 tokens (a document longer than
what is left of a row goes on in the next row as a new document); and `padded`, each document
(or each 128-token chunk of a longer one) alone at the start of its own row, the rest of the row
padding (EOT tokens). Both are trained by the one executable of bench/packing.mbt, so a step
costs the same either way; what differs is how many of its tokens are document tokens. Each round
runs both (alternating, fresh processes, the same steps and threads); a run's time per step is
the mean of its --log `ms` after the warm-up steps; document tokens/s is the document tokens its
steps read over that time. The case's figure is the median over rounds. A third row, `buckets`,
trains the packed shard with bench/packing.mbt's block packing_buckets: sequence-length buckets
[32, 64, 128] in turn, one a step (the same 1024 tokens a step; issue 20).

The padded baseline is a throughput baseline only: mbt's cross_entropy has no ignored targets,
so its padding is trained on as ordinary tokens (a real padded run would mask their loss, which
costs the same compute). Usage: bench/packing.py [--build build] [--rounds 3] [--steps 13]
[--warmup 3] [--threads N]
"""
import argparse
import json
import math
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile

T, ROWS, EOT = 128, 8, 3
HELD_OUT = 20 * ROWS  # windows the executable holds out at the tail (eval.steps x global)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"bench/packing.py: {' '.join(cmd)} failed (status {r.returncode}):\n{r.stdout[-2000:]}")
    return r.stdout


def shard(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, len(toks)) + b"\0" * (1024 - 12))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def documents(n_tokens, seed):
    rng = random.Random(seed)
    docs, total = [], 0
    while total < n_tokens:
        n = int(math.exp(rng.uniform(math.log(8), math.log(512))))
        d = [rng.choice([t for t in range(64) if t != EOT]) for _ in range(n - 1)] + [EOT]
        docs.append(d)
        total += n
    return docs


def write(work, steps):
    need = (steps + 1) * ROWS * T  # document tokens enough for the packed run's steps
    docs = documents(need, 20)
    packed = [t for d in docs for t in d]
    rows = []
    for d in docs:
        for i in range(0, len(d), T):
            c = d[i:i + T]
            rows.append(c + [EOT] * (T - len(c)))
    padded = [t for r in rows for t in r]
    pad = [EOT] * (HELD_OUT * T + 1)
    shard(os.path.join(work, "packed.bin"), packed + pad)
    shard(os.path.join(work, "padded.bin"), padded + pad)
    # document tokens per row of the padded shard, in file order (it is read in order: shuffle = false)
    useful = [min(T, len(d) - i) for d in docs for i in range(0, len(d), T)]
    return docs, useful


def train(prog, data, work, name, steps, threads):
    log = os.path.join(work, name + ".jsonl")
    cmd = [prog, "train", "--data", data, "--steps", str(steps), "--log", log]
    if threads:
        cmd += ["--threads", str(threads)]
    run(cmd)
    return [json.loads(line)["ms"] for line in open(log) if "loss" in line]


def main(argv):
    ap = argparse.ArgumentParser(description="tokens/s of packed versus padded batches (variable-length documents)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", help="a directory for the executable and data (default: a temporary one)")
    a = ap.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="mbt-bench-packing-")
    os.makedirs(work, exist_ok=True)
    prog = os.path.join(work, "packing")
    run([os.path.join(a.build, "mbtc"), "bench/packing.mbt", "--train", "packing", "-o", prog])
    progb = os.path.join(work, "packing_buckets")
    run([os.path.join(a.build, "mbtc"), "bench/packing.mbt", "--train", "packing_buckets", "-o", progb])
    docs, useful = write(work, a.steps)
    lens = [len(d) for d in docs]
    # document tokens per step: packed rows are all document tokens; padded rows hold useful[r]
    per_step_packed = ROWS * T
    per_step_padded = [sum(useful[s * ROWS:(s + 1) * ROWS]) for s in range(a.steps)]
    print(f"packed vs padded (bench/packing.mbt: 4 layers, d 128, {ROWS} x {T} tokens a step), {len(docs)} documents "
          f"of {min(lens)}..{max(lens)} tokens (mean {statistics.mean(lens):.0f}), {a.steps} steps, {a.warmup} warm-up")
    res = {"packed": [], "padded": [], "buckets": []}
    for r in range(a.rounds):
        for name in ("packed", "padded", "buckets"):
            data = os.path.join(work, ("padded" if name == "padded" else "packed") + ".bin")
            ms = train(progb if name == "buckets" else prog, data, work, name, a.steps, a.threads)
            timed = ms[a.warmup:]
            doc_tokens = sum(per_step_padded[a.warmup:]) if name == "padded" else per_step_packed * len(timed)
            tps = doc_tokens / (sum(timed) / 1000.0)
            res[name].append((statistics.mean(timed), tps))
            print(f"  round {r + 1} {name:6}: {statistics.mean(timed):8.2f} ms/step, {tps:10.0f} document tokens/s")
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    fill = sum(per_step_padded[a.warmup:]) / (per_step_packed * (a.steps - a.warmup))
    print(f"packed: {med['packed'][0]:.2f} ms/step, {med['packed'][1]:.0f} document tokens/s (rows 100% documents)")
    print(f"padded: {med['padded'][0]:.2f} ms/step, {med['padded'][1]:.0f} document tokens/s (rows {100 * fill:.0f}% documents)")
    print(f"buckets: {med['buckets'][0]:.2f} ms/step, {med['buckets'][1]:.0f} document tokens/s (the packed data as "
          f"windows of 32, 64, 128 tokens in turn; one step compiled for 128)")
    print(f"packed / padded: {med['packed'][1] / med['padded'][1]:.2f}x document tokens/s")
    print(f"buckets / packed: {med['buckets'][1] / med['packed'][1]:.2f}x document tokens/s")


if __name__ == "__main__":
    main(sys.argv[1:])
