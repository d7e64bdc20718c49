#!/usr/bin/python3
"""bench/buckets.py - step time of sequence-length buckets against the program compiled for the
bucket's length (issue 20, Dataset Decomposition).

bench/buckets.mbt (a 2-layer GPT, d 64 in 4 heads of 16, rows of seq = 512, 2048 tokens a step,
buckets [64, 128, 256, 512]) is compiled once per length T as two programs:

  bucketed T    the program as written with `curriculum = [(0, T)]`: every step at length T, the
                step compiled once for rows of 512 (data.pos restarting every T tokens, attention
                masked by it: docs/runtime.md, "Sequence-length buckets")
  seq T         the program compiled for rows of T (`seq = T`, no buckets; the same 2048 tokens a
                step as 2048 / T rows): what a step compiled per bucket length would run

Both read the same stream of documents (lengths uniform in 1024..4096 tokens, each ending in the
end-of-text id 3, `shuffle = false`) and compute the same step (buckets.case: bit for bit), so the
script checks that each pair logs the same losses. A round runs every program twice (fresh
processes, alternating bucketed and seq at each length): for --steps steps and for --warmup
steps. Two figures a program, each the median over the rounds: the wall time per step (the mean
of the long run's --log `ms` after the warm-up steps), and the CPU time per step (the long run's
user + system time less the short run's, over the steps between: the process's start and the
warm-up cancel). With one thread (the default) the CPU time is the step's work, which other jobs
on a shared machine inflate far less than the wall time. With --before MBTC (another build's
mbtc, e.g. one from before a change), the bucketed programs are also built by it and timed in the
same rounds. --device cuda runs them on the GPU (read the wall times then: the CPU time is the
host's) and --bf16 builds them with precision = bf16 (the GPU's FA2 attention kernels, which
carry the document mask). Usage: bench/buckets.py [--build build] [--rounds 3] [--steps 6]
[--warmup 2] [--threads 1] [--lengths 64,128,256,512] [--before MBTC] [--device cuda] [--bf16]
"""
import argparse
import json
import os
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile

SEQ, TOKENS, EOT = 512, 2048, 3


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"bench/buckets.py: {' '.join(cmd)} failed (status {r.returncode}):\n{r.stdout[-2000:]}")
    return r.stdout


def shard(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, len(toks)) + b"\0" * (1024 - 12))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def write_data(path, steps):
    # the steps' tokens, and the windows the executable holds out at the tail for evaluation (20
    # global batches: 20 x 2048 tokens at every length), with room to spare
    need = (steps + 2) * TOKENS + 20 * TOKENS + 4096
    rng = random.Random(20)
    toks = []
    while len(toks) < need:
        n = rng.randint(1024, 4096)
        toks += [rng.choice([t for t in range(64) if t != EOT]) for _ in range(n - 1)] + [EOT]
    shard(path, toks)


def variants(src, work, lengths, bf16):
    text = open(src).read()
    if bf16:
        text = text.replace("  steps     = 100\n", "  precision = bf16\n  steps     = 100\n")
    batch = f"batch     {{ tokens = {TOKENS}, buckets = [64, 128, 256, 512] }}"
    assert batch in text and f"seq = {SEQ}," in text
    out = {}
    for T in lengths:
        b = text.replace(batch, batch[:-2] + f", curriculum = [(0, {T})] }}")
        s = text.replace(batch, f"batch     {{ tokens = {TOKENS} }}").replace(f"seq = {SEQ},", f"seq = {T},")
        for name, t in ((f"b{T}", b), (f"s{T}", s)):
            p = os.path.join(work, name + ".mbt")
            open(p, "w").write(t)
            out[name] = p
    return out


def train(prog, data, log, steps, threads, device):
    """The run's logged losses, its per-step ms, and its CPU seconds (user + system)."""
    cmd = [prog, "train", "--data", data, "--steps", str(steps), "--log", log]
    if device:
        cmd += ["--device", device]
    if threads:
        cmd += ["--threads", str(threads)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    rows = [json.loads(line) for line in open(log) if "loss" in line]
    return [r["loss"] for r in rows], [r["ms"] for r in rows], cpu


def main(argv):
    ap = argparse.ArgumentParser(description="step time of sequence-length buckets against seq = T")
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", default="64,128,256,512")
    ap.add_argument("--before", help="another mbtc: its bucketed programs are timed too")
    ap.add_argument("--device", help="train's --device (e.g. cuda: then read the wall times, not the CPU times)")
    ap.add_argument("--bf16", action="store_true", help="the programs with precision = bf16 (on a GPU: the FA2 kernels)")
    ap.add_argument("--work", help="a directory for the executables and data (default: a temporary one)")
    a = ap.parse_args(argv)
    lengths = [int(x) for x in a.lengths.split(",")]
    work = a.work or tempfile.mkdtemp(prefix="mbt-bench-buckets-")
    os.makedirs(work, exist_ok=True)
    srcs = variants("bench/buckets.mbt", work, lengths, a.bf16)
    progs = {}
    for name, src in srcs.items():
        progs[name] = os.path.join(work, name)
        run([os.path.join(a.build, "mbtc"), src, "-o", progs[name]])
        if a.before and name[0] == "b":
            progs["before-" + name] = os.path.join(work, "before-" + name)
            run([a.before, src, "-o", progs["before-" + name]])
    data = os.path.join(work, "docs.bin")
    write_data(data, a.steps)
    print(f"buckets vs seq = T (bench/buckets.mbt: 2 layers, d 64, 4 heads of 16, seq {SEQ}, {TOKENS} tokens "
          f"a step, {'bf16' if a.bf16 else 'f32'}), {a.steps} steps, {a.warmup} warm-up, {a.rounds} rounds, "
          f"threads {a.threads or 'all'}, device {a.device or 'cpu'}")
    wall = {name: [] for name in progs}
    cpu = {name: [] for name in progs}
    for r in range(a.rounds):
        for T in lengths:
            names = [f"b{T}", f"s{T}"] + ([f"before-b{T}"] if a.before else [])
            losses = {}
            for name in names:
                log = os.path.join(work, name + ".jsonl")
                losses[name], ms, c_long = train(progs[name], data, log, a.steps, a.threads, a.device)
                _, _, c_short = train(progs[name], data, log, a.warmup, a.threads, a.device)
                wall[name].append(statistics.mean(ms[a.warmup:]))
                cpu[name].append(1000.0 * (c_long - c_short) / (a.steps - a.warmup))
                print(f"  round {r + 1} {name:11}: {wall[name][-1]:9.2f} ms/step wall, {cpu[name][-1]:9.2f} ms/step CPU")
            # the self-check: a bucketed step at T is the step compiled for T (and, before, the same)
            for name in names[1:]:
                if losses[name] != losses[f"b{T}"]:
                    sys.exit(f"bench/buckets.py: {name} logged other losses than b{T}: {losses[name]} and {losses[f'b{T}']}")
    w = {k: statistics.median(v) for k, v in wall.items()}
    c = {k: statistics.median(v) for k, v in cpu.items()}
    print("| length T | bucketed (seq 512): wall, CPU ms/step | seq = T: wall, CPU ms/step | bucketed / seq = T (CPU) "
          "| bucketed tokens/s (CPU) |" + (" before: bucketed wall, CPU ms/step |" if a.before else ""))
    for T in lengths:
        b, s_ = f"b{T}", f"s{T}"
        row = (f"| {T} | {w[b]:.1f}, {c[b]:.1f} | {w[s_]:.1f}, {c[s_]:.1f} | {c[b] / c[s_]:.2f}x | "
               f"{TOKENS / (c[b] / 1000):.0f} |")
        if a.before:
            row += f" {w['before-' + b]:.1f}, {c['before-' + b]:.1f} |"
        print(row)
    full = f"b{max(lengths)}"
    for T in lengths:
        print(f"bucket {T}: {c[full] / c[f'b{T}']:.2f}x the tokens/s of bucket {max(lengths)} by CPU time "
              f"({w[full] / w[f'b{T}']:.2f}x by wall time); seq = {T}: {c[full] / c[f's{T}']:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
