#!/usr/bin/python3
"""bench/dp.py - the data-parallel step on this machine's CPU (docs/bench.md, docs/parallel.md).

Builds examples/tiny.mbt's train block as it stands (global 32 = 4 micro-batches of 8) and with
`parallel { data = 2 }` (2 ranks x 2 micro-batches), and times, alternating, R rounds of:
  alone  - the data = 1 program, one process, --threads T (default: the CPUs available);
  2 ranks - the data = 2 program under `mpirun -np 2` (tcp ranks where mpirun is missing),
            --threads T/2 each (at least 1), MBT_DEBUG=1 and MBT_DP_BUCKET_MB (default 1: the
            0.8M-parameter gradient in 4 buckets, so that the communication thread has work),
            twice: with the buckets overlapped with the backward of the last micro-batch
            (MBT_DP_OVERLAP=1, the default) and after it (MBT_DP_OVERLAP=0).
A run's time per step is the mean of its --log `ms` after the warm-up steps; a case's is the
median over rounds. From rank 0's MBT_DEBUG output it reads the collectives' table (the time in
exchange_shards and gather_shards: the reduction) and the buckets line (how long the
communication thread ran collectives, and how long the step waited for it); the fraction hidden
is 1 - waited / collectives: behind the backward (and the sums) with the overlap, behind the
ranks' sums of other buckets without (docs/parallel.md, "Buckets"). Asserts nothing; prints a table and writes
bench/results/dp-<host>-<time>.json.
With --zero 2 the 2-rank program says `parallel { data = 2, zero = 2 }`: ZeRO-2's partial sums by
shard, each micro-batch's gradient exchanged by shards; overlapped, bucket by bucket during every
micro-batch's backward (docs/parallel.md, "ZeRO-2's buckets overlapped with each backward"); after
(MBT_DP_OVERLAP=0), whole after each backward on the step's thread (no buckets line: all of it is
exposed, hidden 0 by construction). The reduction is then exchange_shards alone (no gather).
Usage: bench/dp.py [--build build] [--rounds 3] [--steps 13] [--warmup 3] [--threads N] [--bucket-mb 1] [--zero 2]
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"bench/dp.py: {' '.join(cmd)} failed (status {r.returncode}):\n{r.stdout[-3000:]}")
    return r.stdout


def step_ms(log, warmup):
    rows = [json.loads(line) for line in open(log)]
    ms = [r["ms"] for r in rows if "loss" in r]
    return statistics.mean(ms[warmup:]) if len(ms) > warmup else float("nan")


def parse_debug(out):
    """rank 0's collectives table and buckets line (docs/parallel.md, MBT_DEBUG)"""
    coll = {}
    for m in re.finditer(r"^\[rank 0\]\s+(\w+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M):
        coll[m.group(1)] = {"calls": int(m.group(2)), "mb": float(m.group(3)), "total_ms": float(m.group(4))}
    b = re.search(r"^\[rank 0\] buckets: (\d+) of at most (\d+) floats, (\d+) reductions: the communication thread "
                  r"([\d.]+) ms in collectives, the step waited ([\d.]+) ms", out, re.M)
    buckets = None
    if b:
        buckets = {"buckets": int(b.group(1)), "floats": int(b.group(2)), "reductions": int(b.group(3)),
                   "comm_ms": float(b.group(4)), "waited_ms": float(b.group(5))}
    return coll, buckets


def main(argv):
    ap = argparse.ArgumentParser(description="data-parallel step time, 1 process against 2 ranks (CPU)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="threads of the one process (default: the CPUs available)")
    ap.add_argument("--bucket-mb", default="1", help="MBT_DP_BUCKET_MB for the ranks (default 1)")
    ap.add_argument("--zero", type=int, default=0, choices=(0, 2), help="the 2-rank program's parallel.zero (default 0)")
    ap.add_argument("--work", help="a directory for the executables and data (default: a temporary one)")
    a = ap.parse_args(argv)
    threads = a.threads or len(os.sched_getaffinity(0))
    rank_threads = max(1, threads // 2)
    work = a.work or tempfile.mkdtemp(prefix="mbt-bench-dp-")
    os.makedirs(work, exist_ok=True)
    src = open("examples/tiny.mbt").read()
    if "parallel" in src:
        sys.exit("bench/dp.py: examples/tiny.mbt already says parallel; this script adds it")
    zero = f", zero = {a.zero}" if a.zero else ""
    two = re.sub(r"(\n  batch [^\n]*\n)", r"\1  parallel  { data = 2" + zero + " }\n", src, count=1)
    open(os.path.join(work, "tiny2.mbt"), "w").write(two)
    mbtc = os.path.join(a.build, "mbtc")
    p1, p2 = os.path.join(work, "tiny1"), os.path.join(work, "tiny2")
    run([mbtc, "-I", "examples", "examples/tiny.mbt", "-o", p1])
    run([mbtc, "-I", "examples", os.path.join(work, "tiny2.mbt"), "-o", p2])
    run([os.path.join(a.build, "mbt-gendata"), "--tokens", "400000", "--val-tokens", "0", "--out-dir", work, "--name", "dp"])
    data = os.path.join(work, "dp_train.bin")
    mpirun = shutil.which("mpirun")
    env = dict(os.environ, MBT_DEBUG="1", MBT_DP_BUCKET_MB=a.bucket_mb, MBT_COMM_TIMEOUT="120")
    for k in ("RANK", "WORLD_SIZE", "MBT_COMM", "MBT_PROFILE", "MBT_TRACE"):
        env.pop(k, None)
    if mpirun and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    launcher = f"mpirun -np 2 --bind-to none ({rank_threads} thread{'s' if rank_threads > 1 else ''} a rank)" if mpirun \
        else f"2 tcp ranks ({rank_threads} thread{'s' if rank_threads > 1 else ''} a rank)"
    print(f"tiny (examples/tiny.mbt, 0.8M parameters, global 32 = 4 x 8 sequences of 64), {a.steps} steps "
          f"({a.warmup} warm-up), {a.rounds} rounds; alone: {threads} threads; 2 ranks: {launcher}, "
          f"MBT_DP_BUCKET_MB={a.bucket_mb}, parallel.zero = {a.zero}; work dir {work}")
    rounds = []
    for r in range(a.rounds):
        log1 = os.path.join(work, f"alone-{r}.jsonl")
        run([p1, "train", "--data", data, "--steps", str(a.steps), "--threads", str(threads), "--log", log1])
        row = {"alone_ms": step_ms(log1, a.warmup)}
        for tag, ov in (("", "1"), ("after_", "0")):  # the overlap (the default), then the reduction after the backward
            log2 = os.path.join(work, f"ranks-{tag}{r}.jsonl")
            args = [p2, "train", "--data", data, "--steps", str(a.steps), "--threads", str(rank_threads), "--log", log2]
            e2 = dict(env, MBT_DP_OVERLAP=ov)
            if mpirun:
                out = run([mpirun, "--oversubscribe", "--bind-to", "none", "-np", "2", "-x", "MBT_DEBUG", "-x",
                           "MBT_DP_BUCKET_MB", "-x", "MBT_COMM_TIMEOUT", "-x", "MBT_DP_OVERLAP"] + args, env=e2)
            else:
                port = str(29000 + os.getpid() % 1000 + 2 * r + int(ov))
                procs = []
                for k in range(2):
                    e = dict(e2, RANK=str(k), WORLD_SIZE="2", LOCAL_RANK=str(k), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
                    procs.append(subprocess.Popen(args, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                outs = [p.communicate(timeout=1800)[0] for p in procs]
                if any(p.returncode for p in procs):
                    sys.exit(f"bench/dp.py: the tcp ranks failed:\n{outs[0][-2000:]}\n{outs[1][-2000:]}")
                out = outs[0]
            coll, buckets = parse_debug(out)
            red_ms = sum(coll.get(k, {}).get("total_ms", 0.0) for k in ("exchange_shards", "gather_shards"))
            row.update({tag + "ranks_ms": step_ms(log2, a.warmup), tag + "collectives": coll, tag + "buckets": buckets,
                        tag + "reduction_ms_per_step": red_ms / a.steps})
            if buckets and buckets["comm_ms"] > 0:
                row[tag + "hidden"] = max(0.0, 1 - buckets["waited_ms"] / buckets["comm_ms"])
            if buckets:
                row[tag + "waited_ms_per_step"] = buckets["waited_ms"] / a.steps
            elif a.zero == 2 and tag == "after_":  # the whole exchange on the step's thread: all of it waited for
                row[tag + "hidden"] = 0.0
                row[tag + "waited_ms_per_step"] = red_ms / a.steps
        rounds.append(row)
        print(f"  round {r + 1}: alone {row['alone_ms']:.1f} ms/step; 2 ranks overlapped {row['ranks_ms']:.1f} ms/step "
              f"(reduction {row['reduction_ms_per_step']:.2f} ms/step, hidden {100 * row.get('hidden', 0):.1f}%), after the "
              f"backward {row['after_ranks_ms']:.1f} ms/step (reduction {row['after_reduction_ms_per_step']:.2f} ms/step, "
              f"hidden {100 * row.get('after_hidden', 0):.1f}%)")
    med = lambda k: statistics.median(x[k] for x in rounds if k in x) if any(k in x for x in rounds) else float("nan")
    alone = med("alone_ms")
    print(f"| case | alone ms/step | 2 ranks ms/step | speed-up | reduction ms/step (rank 0) | step waited ms/step | hidden |")
    print(f"|---|---|---|---|---|---|---|")
    for tag, name in (("", "tiny, overlapped with the backward"), ("after_", "tiny, after the backward")):
        ranks, red, wt, hid = med(tag + "ranks_ms"), med(tag + "reduction_ms_per_step"), med(tag + "waited_ms_per_step"), \
            med(tag + "hidden")
        print(f"| {name} | {alone:.1f} | {ranks:.1f} | {alone / ranks:.2f}x | {red:.2f} | {wt:.2f} | {100 * hid:.1f}% |")
    os.makedirs("bench/results", exist_ok=True)
    path = os.path.join("bench/results", f"dp-{platform.node()}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    json.dump({"machine": platform.node(), "cpus": len(os.sched_getaffinity(0)), "threads": threads,
               "rank_threads": rank_threads, "launcher": launcher, "zero": a.zero, "bucket_mb": a.bucket_mb, "steps": a.steps,
               "warmup": a.warmup, "rounds": rounds,
               "median": {k: med(k) for k in ("alone_ms", "ranks_ms", "reduction_ms_per_step", "waited_ms_per_step", "hidden",
                                              "after_ranks_ms", "after_reduction_ms_per_step", "after_waited_ms_per_step",
                                              "after_hidden")}},
              open(path, "w"), indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
