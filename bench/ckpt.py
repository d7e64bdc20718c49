#!/usr/bin/python3
"""bench/ckpt.py - what a checkpoint costs training, GPT-2 124M on the CPU (docs/bench.md).

Builds bench/gpt2_124m.mbt, makes its data with mbt-gendata, and trains it twice for the same
steps with a checkpoint every `--every` steps: once with --ckpt-sync (training waits while each
checkpoint is written: the synchronous cost) and once as the executable does by default (the
state is copied to memory and written by a background thread). From each run's --log JSONL it
prints, per checkpoint, the time training waited and the time the write took, and the ratio of
the mean waits, asynchronous over synchronous (the goal: under 10%), and the bytes written per
second. Usage: bench/ckpt.py [--build build] [--steps 7] [--every 2] [--threads N]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench/ckpt.py: {' '.join(cmd)} failed (status {r.returncode}):\n{r.stdout[-2000:]}")
    return r.stdout


def train(prog, data, work, name, steps, every, threads, sync):
    log = os.path.join(work, name + ".jsonl")
    ckdir = os.path.join(work, name + ".ckpt")
    cmd = [prog, "train", "--data", data, "--steps", str(steps), "--ckpt-every", str(every), "--ckpt-keep", "1",
           "--ckpt-dir", ckdir, "--log", log]
    if threads:
        cmd += ["--threads", str(threads)]
    if sync:
        cmd.append("--ckpt-sync")
    run(cmd)
    rows = [json.loads(line) for line in open(log)]
    shutil.rmtree(ckdir, ignore_errors=True)
    steps_ms = [r["ms"] for r in rows if "loss" in r]
    ckpts = [r for r in rows if "checkpoint" in r]
    return steps_ms, ckpts


def main(argv):
    ap = argparse.ArgumentParser(description="checkpoint cost: synchronous vs asynchronous writes (GPT-2 124M, CPU)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", help="a directory for the executable, data and checkpoints (default: a temporary one)")
    a = ap.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="mbt-bench-ckpt-")
    os.makedirs(work, exist_ok=True)
    prog = os.path.join(work, "gpt2_124m")
    run([os.path.join(a.build, "mbtc"), "-I", "examples", "bench/gpt2_124m.mbt", "-o", prog])
    run([os.path.join(a.build, "mbt-gendata"), "--vocab", "1024", "--tokens", "300000", "--val-tokens", "0",
         "--out-dir", work, "--name", "ck"])
    data = os.path.join(work, "ck_train.bin")
    print(f"GPT-2 124M (bench/gpt2_124m.mbt), {a.steps} steps, a checkpoint every {a.every} steps, work dir {work}")
    res = {}
    for name, sync in (("sync", True), ("async", False)):
        steps_ms, ck = train(prog, data, work, name, a.steps, a.every, a.threads, sync)
        # the checkpoint after the last step is waited for at the end of the run, not by a step: left out
        ck = [c for c in ck if c["step"] < a.steps]
        res[name] = (steps_ms, ck)
        for c in ck:
            print(f"  {name:5s} step {c['step']:3d}: training waited {c['waited_s'] * 1e3:8.1f} ms; write {c['write_s']:6.2f} s, "
                  f"{c['bytes'] / 1e6:7.1f} MB, {c['bytes'] / 1e6 / c['write_s']:6.0f} MB/s")
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    ws, wa = mean([c["waited_s"] for c in res["sync"][1]]), mean([c["waited_s"] for c in res["async"][1]])
    step_ms = mean(sorted(res["async"][0])[: max(1, len(res["async"][0]) - 1)])
    rate = mean([c["bytes"] / c["write_s"] for c in res["sync"][1] + res["async"][1]])
    print(f"mean wait per checkpoint: synchronous {ws * 1e3:.1f} ms, asynchronous {wa * 1e3:.1f} ms: "
          f"{100 * wa / ws:.1f}% of the synchronous cost (goal: under 10%)")
    print(f"a training step takes {step_ms:.0f} ms; writes ran at {rate / 1e6:.0f} MB/s")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
