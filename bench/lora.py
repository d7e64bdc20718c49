#!/usr/bin/python3
"""bench/lora.py - the LoRA layers' training step with the down and up products fused into one
launch against the same program with them as two GEMMs (mbtc --no-lora-fusion), on the CPU (issue 20).

bench/lora.mbt's blocks: `lora`, 4 nn.LoRALinear(768, 768, rank 16) layers on 16 x 128 tokens
(2048 rows); `multi`, the same with nn.MultiLoRALinear and 4 adapters (512 rows each); `small`,
d 128 and rank 8 (where the products are small and a launch's overhead counts for more). Only the
adapters train (embedding, bases and head frozen). Each block is built twice, fused and unfused;
each round runs the two executables one after the other (alternating which goes first, fresh
processes, the same data, steps and threads); each run (with MBT_PROFILE=1) gives its profile's step time and the time in GEMMs (rt_lora_f32 counted as GEMM
time: the base products are the same in both arms, so the GEMM time's difference is the LoRA
products'), averaged over the steps after the first. The figures are the median and the minimum
over rounds of each arm (the minimum is the least disturbed by other work on a shared machine),
and the ratios unfused / fused (above 1: the fused step is faster); and the run's CPU time (user +
system, all threads, from start to end) over its steps, which waiting for a core on a shared
machine does not inflate. The two arms' logged losses must agree (1e-5 relative, every step) or the
benchmark stops. Then build/bench/lora_products (bench/lora_products.c) times the products alone.
Usage: bench/lora.py [--build build] [--rounds 5] [--steps 12] [--threads N]
[--blocks lora,multi,small]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"bench/lora.py: {' '.join(cmd)} failed (status {r.returncode}):\n{r.stdout[-2000:]}")
    return r.stdout


def train(prog, data, log, steps, threads):
    """One run with --log and MBT_PROFILE=1: its losses, and the profile's step and GEMM ms per step
    (averaged over the steps after the first; rt_lora_f32 counts as GEMM time)."""
    cmd = [prog, "train", "--data", data, "--steps", str(steps), "--log", log]
    if threads:
        cmd += ["--threads", str(threads)]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run(cmd, dict(os.environ, MBT_PROFILE="1"))
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_ms = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e3 / steps
    line = [x for x in out.splitlines() if x.startswith("profile summary:")][0]
    prof = dict(kv.split("=") for kv in line.split()[2:])
    losses = [json.loads(x)["loss"] for x in open(log) if '"loss"' in x]
    return float(prof["step_ms"]), float(prof["gemm_ms"]), cpu_ms, losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--blocks", default="lora,multi,small")
    a = ap.parse_args()
    mbtc = os.path.join(a.build, "mbtc")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(root, "bench", "lora.mbt")
    work = tempfile.mkdtemp(prefix="mbt-bench-lora-")
    run([os.path.join(a.build, "mbt-gendata"), "--tokens", "300000", "--val-tokens", "0", "--out-dir", work])
    data = os.path.join(work, "tiny_train.bin")
    print(f"bench/lora.py: {a.rounds} rounds of {a.steps} steps, threads {a.threads or 'all'}; ms per step "
          "(MBT_PROFILE: the steps after the first), median and min over rounds; gemm: the time in GEMMs and rt_lora_f32")
    print(f"{'block':6} {'arm':8} {'step med':>9} {'step min':>9} {'gemm med':>9} {'gemm min':>9} {'cpu med':>9}")
    for block in a.blocks.split(","):
        progs = {}
        for arm, extra in (("fused", []), ("unfused", ["--no-lora-fusion"])):
            progs[arm] = os.path.join(work, f"{block}_{arm}")
            run([mbtc, src, "--train", block, "--cuda-arch=none", "-o", progs[arm]] + extra)
        res = {"fused": [], "unfused": []}
        for r in range(a.rounds):
            order = ("fused", "unfused") if r % 2 == 0 else ("unfused", "fused")
            losses = {}
            for arm in order:
                step, gemm, cpu, losses[arm] = train(progs[arm], data, os.path.join(work, f"{block}_{arm}.jsonl"), a.steps,
                                                     a.threads)
                res[arm].append((step, gemm, cpu))
            for lf, lu in zip(losses["fused"], losses["unfused"]):
                if abs(lf - lu) > 1e-5 * abs(lu):
                    sys.exit(f"bench/lora.py: {block}: the fused and unfused losses differ ({lf} against {lu})")
        fig = {}
        for arm in ("fused", "unfused"):
            st = [x[0] for x in res[arm]]
            gm = [x[1] for x in res[arm]]
            cp = [x[2] for x in res[arm]]
            fig[arm] = (statistics.median(st), min(st), statistics.median(gm), min(gm), statistics.median(cp))
            print(f"{block:6} {arm:8} {fig[arm][0]:9.2f} {fig[arm][1]:9.2f} {fig[arm][2]:9.2f} {fig[arm][3]:9.2f} {fig[arm][4]:9.2f}"
                  f"   (steps: {', '.join(f'{x:.1f}' for x in st)})")
        f, u = fig["fused"], fig["unfused"]
        print(f"{block:6} unfused/fused: step {u[0] / f[0]:.3f} (median), {u[1] / f[1]:.3f} (min); "
              f"gemm {u[2] / f[2]:.3f} (median), {u[3] / f[3]:.3f} (min); cpu {u[4] / f[4]:.3f} (median)")
        sys.stdout.flush()
    prod = os.path.join(a.build, "bench", "lora_products")
    if os.path.exists(prod):
        print()
        print(run([prod, "30"]), end="")


if __name__ == "__main__":
    main()
