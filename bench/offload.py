#!/usr/bin/python3
"""bench/offload.py - what optimizer-state offload to the NVMe store costs a training step, GPT-2
124M on the CPU (docs/bench.md, docs/memory.md "Optimizer-state offload").

Builds bench/gpt2_124m.mbt (micro-batch 4 x 64, AdamW: 0.93 GiB of moments) as it is ("none") and
with `offload { optimizer = nvme }` ("nvme"), both for the CPU alone, makes its data with
mbt-gendata, and trains each for the same steps from the same initial weights, alternating the
two for --rounds rounds. Per run: the mean step time after the first (warm-up) step, from the
--log JSONL; the process's peak resident memory (ru_maxrss); for nvme, the time the updates
waited for the store, as the executable reports it. The two arms must log the same losses, bit
for bit (a self-check; nothing else is asserted). The store file goes in --offload-dir (default:
BUILD/bench, on the build's disk; a tmpfs there measures memory, not a disk).

Usage: bench/offload.py [--build build] [--steps 4] [--rounds 2] [--threads N] [--offload-dir DIR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench/offload.py: {' '.join(cmd)} failed (status {r.returncode}):\n{r.stdout[-2000:]}")
    return r.stdout


def run_rss(cmd):
    """Runs cmd; its output and its peak resident memory in bytes (wait4's ru_maxrss, KiB on Linux)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"bench/offload.py: {' '.join(cmd)} failed (status {p.returncode}):\n{out[-2000:]}")
    return out, ru.ru_maxrss * 1024


def main(argv):
    ap = argparse.ArgumentParser(description="optimizer-state offload's cost, GPT-2 124M on the CPU")
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=4, help="steps a run, the first a warm-up (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (none, nvme) runs (default 2)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--offload-dir", default="", help="where the store file goes (default BUILD/bench)")
    a = ap.parse_args(argv)
    build = os.path.abspath(os.path.join(ROOT, a.build))
    work = os.path.join(build, "bench")
    os.makedirs(os.path.join(work, "data"), exist_ok=True)
    store_dir = os.path.abspath(a.offload_dir or work)
    mbtc, gendata = os.path.join(build, "mbtc"), os.path.join(build, "mbt-gendata")

    src = open(os.path.join(ROOT, "bench", "gpt2_124m.mbt")).read()
    nvme_src = os.path.join(work, "gpt2_124m_nvme.mbt")
    with open(nvme_src, "w") as f:
        # the first train block's (the one mbtc builds; bench/memory.py's blocks after it have settings
        # of their own, offload among them)
        f.write(src.replace("  steps     = 10", "  offload   { optimizer = nvme }\n  steps     = 10", 1))
    progs = {"none": os.path.join(work, "offload-none"), "nvme": os.path.join(work, "offload-nvme")}
    for arm, source in (("none", os.path.join(ROOT, "bench", "gpt2_124m.mbt")), ("nvme", nvme_src)):
        run([mbtc, "-I", os.path.join(ROOT, "examples"), "--cuda-arch=none", source, "-o", progs[arm]])
    plan = {arm: run([progs[arm], "info"]) for arm in progs}
    state_mem = {arm: int(re.search(r"optimizer state (\d+) bytes", plan[arm]).group(1)) for arm in plan}
    data = os.path.join(work, "data", "offload_train.bin")
    if not os.path.exists(data):
        run([gendata, "--out-dir", os.path.join(work, "data"), "--name", "offload", "--vocab", "1024", "--tokens",
             "300000", "--val-tokens", "0"])
    init = os.path.join(work, "offload-init.safetensors")
    run([progs["none"], "train", "--data", data, "--steps", "0", "--save-weights", init])

    threads = ["--threads", str(a.threads)] if a.threads else []
    runs = {"none": [], "nvme": []}
    for r in range(a.rounds):
        for arm in ("none", "nvme"):
            log = os.path.join(work, f"offload-{arm}-{r}.jsonl")
            cmd = [progs[arm], "train", "--data", data, "--steps", str(a.steps), "--init-weights", init, "--log", log,
                   "--ckpt-dir", os.path.join(work, f"offload-{arm}.ckpt")] + threads
            if arm == "nvme":
                cmd += ["--offload-dir", store_dir]
            out, rss = run_rss(cmd)
            rows = [json.loads(line) for line in open(log) if '"loss"' in line]
            ms = statistics.mean(x["ms"] for x in rows[1:]) if len(rows) > 1 else rows[0]["ms"]
            m = re.search(r"updates waited ([0-9.]+) s for the store in all \(([0-9.]+) ms/step\)", out)
            eng = re.search(r"optimizer state: offloaded to '[^']*' \(\d+ bytes; ([^)]*)\)", out)
            runs[arm].append(dict(ms=ms, rss=rss, losses=[x["loss"] for x in rows],
                                  wait_ms=float(m.group(2)) if m else None, engine=eng.group(1) if eng else None))
            print(f"round {r + 1}: {arm:<5} {ms:9.1f} ms/step (after the first), peak RSS {rss / 2**20:8.1f} MiB"
                  + (f", waited for the store {m.group(2)} ms/step ({eng.group(1)})" if m else ""), flush=True)
    same = all(x["losses"] == runs["none"][0]["losses"] for v in runs.values() for x in v)
    print(f"self-check: the two arms' losses are {'the same, bit for bit' if same else 'DIFFERENT'} "
          f"({runs['none'][0]['losses']})")
    print()
    print("GPT-2 124M on the CPU, micro-batch 4 x 64, AdamW; median over the rounds")
    print(f"{'optimizer state':<16} {'ms/step':>9} {'vs none':>8} {'peak RSS MiB':>13} {'state in memory':>16} "
          f"{'store wait ms/step':>19}")
    base = statistics.median(x["ms"] for x in runs["none"])
    for arm in ("none", "nvme"):
        ms = statistics.median(x["ms"] for x in runs[arm])
        rss = statistics.median(x["rss"] for x in runs[arm])
        waits = [x["wait_ms"] for x in runs[arm] if x["wait_ms"] is not None]
        print(f"{arm:<16} {ms:9.1f} {ms / base:7.3f}x {rss / 2**20:13.1f} {state_mem[arm] / 2**20:12.1f} MiB "
              f"{statistics.median(waits) if waits else float('nan'):19.1f}")
    print(f"(store file in {store_dir}; state in memory: the plan's, ./prog info: the moments without offload, the "
          f"three staging buffers with it)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
