#!/usr/bin/python3
"""memory.py - `make bench`'s memory rows: peak memory and step time of GPT-2 124M on the CPU
(bench/gpt2_124m.mbt, micro 4 x 64) with none, recompute [gelu], recompute [all], activations to
nvme and the optimizer state to nvme (docs/bench.md, "Memory"; docs/memory.md).

    /usr/bin/python3 bench/memory.py [--build build] [--threads N] [--steps S] [--warmup W]

For each train block of bench/gpt2_124m.mbt: build it with mbtc for the CPU alone (--cuda-arch=none:
the stores' offloads are a CPU build's; a block `mbtc -o` refuses is a
row saying so, with mbtc's message); `./prog info` gives the plan's step arena and the optimizer
state it keeps in memory; one run of S steps from the same initial weights with
--arena-high-water and --log gives the measured arena bytes step 1 wrote, the time per step (mean
after W warm-up steps) and the process's peak resident memory (getrusage of the child). Nothing is
asserted: a table and JSON under bench/results/. The last losses are printed so a reader sees that
the settings train alike (they are bit-identical where the arithmetic is, docs/memory.md).

    /usr/bin/python3 bench/memory.py --gpu [--batch 64] [--seq 1024] [--steps S] [--warmup W]

On a GPU (make bench-gpu; SKIP without one): the same model in bf16 at micro B x T (default 64 x
1024, the size issue 18's targets name) with none, recompute [gelu], recompute [all], activations to
host and the optimizer state to host, built for the GPU (bench/gpu.py's variant of the first block,
the setting's line added after `precision = bf16`), compiled side by side; each trained S steps with
--device cuda: the plan's step arena (`./prog info`), the device's peak (the executable's own
high-water mark of its device allocations, its `GPU: peak` line) and the time per step (mean after
W warm-up steps), each against none. llm.c's figure for recompute [gelu] at micro 64 x 1024 (23,692
MiB on an H100, ../shared/perf/h100-2026-11-25.md) is printed beside, not measured here.
"""
import argparse
import datetime
import json
import os
import re
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "bench/gpt2_124m.mbt"
ROWS = [
    ("none", "gpt2_124m_cpu"),
    ("recompute [gelu]", "gpt2_124m_cpu_rc_gelu"),
    ("recompute [all]", "gpt2_124m_cpu_rc_all"),
    ("activations to nvme", "gpt2_124m_cpu_act_nvme"),
    ("optimizer to nvme", "gpt2_124m_cpu_opt_nvme"),
]


def say(msg=""):
    print(msg, flush=True)


def run_child(cmd, cwd=None):
    """Runs cmd; returns (status, output, wall seconds, peak resident KiB of that child)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out, time.monotonic() - t0, ru.ru_maxrss


def write_results(out, default_name, payload):
    """The JSON results to `out`, or to bench/results/<default_name>-<host>-<time>.json; says where."""
    out = out or os.path.join(ROOT, "bench", "results",
                              f"{default_name}-{socket.gethostname()}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(payload, f, indent=1)
    say(f"results: {os.path.relpath(out, ROOT)}")


GPU_ROWS = [
    ("none", ""),
    ("recompute [gelu]", "recompute = [gelu]"),
    ("recompute [all]", "recompute = [all]"),
    ("activations to host", "offload   { activations = host }"),
    ("optimizer to host", "offload   { optimizer = host }"),
]
LLMC_RC_GELU_MIB = 23692  # llm.c, micro 64 x 1024, recompute GELU, H100 (../shared/perf/h100-2026-11-25.md)


def gpu_rows(a, build):
    """--gpu: the GPU table (docs/bench.md, "Memory settings on a GPU")."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu as gpu_bench  # bench/gpu.py: the variant source, the corpus, the GPU's peak line
    import run as cpu_bench
    dev = a.device_for_testing or "cuda"
    ok, why = gpu_bench.gpu_present() if dev == "cuda" else (True, "")
    if not ok:
        say(f"SKIP: no GPU ({why})")
        return 0
    mbtc, gendata = os.path.join(build, "mbtc"), os.path.join(build, "mbt-gendata")
    work = os.path.join(build, "bench", "memory-gpu")
    os.makedirs(os.path.join(work, "data"), exist_ok=True)
    case = dict(cpu_bench.CASES["gpt2-124m"])
    B, T = a.batch, a.seq
    src, inc, g = gpu_bench.variant_source(case, B, T, work, "bf16")
    with open(src) as f:
        base_text = f.read()
    progs, procs = [], []
    for label, line in GPU_ROWS:
        text = base_text.replace("\n  precision = bf16", "\n  precision = bf16" + ("\n  " + line if line else ""), 1)
        path = src[:-4] + "_" + re.sub(r"[^a-z]+", "_", label).strip("_") + ".mbt"
        with open(path, "w") as f:
            f.write(text)
        prog = path[:-4]
        progs.append((label, prog))
        procs.append(subprocess.Popen([mbtc] + case["include"] + inc + [path, "-o", prog], cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    built = [(p.communicate()[0], p.returncode) for p in procs]  # compiled side by side
    data = gpu_bench.corpus(argparse.Namespace(case="gpt2-124m"), case, gendata, work,
                            gpu_bench.corpus_windows(a.steps, g) * (T + 1))
    init = os.path.join(work, f"init-b{B}-t{T}.safetensors")
    say(f"== memory on the GPU: GPT-2 124M bf16, micro {B} x {T}, {a.steps} steps a run, {a.warmup} warm-up")
    results = []
    for (label, prog), (out, st) in zip(progs, built):
        if st != 0:
            why = next((l.split("error: ", 1)[1] for l in out.splitlines() if "error: " in l), out.strip()[-200:])
            say(f"  {label}: not built - mbtc -o refuses it: {why}")
            results.append(dict(setting=label, refused=why))
            continue
        if not os.path.exists(init):
            run_child([prog, "train", "--steps", "0", "--data", data, "--save-weights", init])
        _, info, _, _ = run_child([prog, "info"])
        m = re.search(r"^plan: arena step (\d+) bytes$", info, re.M)
        log = prog + ".jsonl"
        st, out, _, _ = run_child([prog, "train", "--device", dev, "--steps", str(a.steps), "--data", data,
                                   "--init-weights", init, "--log", log])
        if st != 0:
            say(f"  {label}: the run failed: {(out.strip().splitlines() or ['?'])[-1]}")
            results.append(dict(setting=label, failed=out[-2000:]))
            continue
        with open(log) as f:
            recs = [r for r in (json.loads(l) for l in f if l.strip()) if "ms" in r]  # the steps, not the evaluation
        timed = [r["ms"] for r in recs[a.warmup:]]
        r = dict(setting=label, step_arena_planned=int(m.group(1)) if m else None, device_peak=gpu_bench.gpu_peak(out),
                 ms_per_step=sum(timed) / len(timed) if timed else float("nan"), steps_ms=timed,
                 last_loss=recs[-1]["loss"] if recs else None)
        results.append(r)
        if r["device_peak"] is None:  # --device-for-testing cpu: no device
            r["device_peak"] = 0
        say(f"  {label}: device peak {r['device_peak'] / 2**20:.0f} MiB, {r['ms_per_step']:.2f} ms/step, "
            f"last loss {r['last_loss']}")
    base = next((r for r in results if r["setting"] == "none" and "device_peak" in r), None)
    hdr = f"{'setting':<22} {'step arena MiB':>15} {'device peak MiB':>16} {'vs none':>8} {'ms/step':>9} {'vs none':>8}"
    say()
    say(hdr)
    say("-" * len(hdr))
    for r in results:
        if "device_peak" not in r:
            say(f"{r['setting']:<22} {'not built' if 'refused' in r else 'failed'}")
            continue
        rel = lambda k: f"{100 * (r[k] / base[k] - 1):+7.1f}%" if base and base[k] else "       -"
        say(f"{r['setting']:<22} {(r['step_arena_planned'] or 0) / 2**20:15.1f} {r['device_peak'] / 2**20:16.0f} "
            f"{rel('device_peak')} {r['ms_per_step']:9.2f} {rel('ms_per_step')}")
    say(f"(llm.c with recompute of GELU at micro 64 x 1024: {LLMC_RC_GELU_MIB:,} MiB on an H100, its own report;"
        f" not run here)")
    write_results(a.out, "memory-gpu", dict(batch=B, seq=T, steps=a.steps, warmup=a.warmup, results=results))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description="GPT-2 124M peak memory and step time per memory setting")
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=0, help="0: all the CPUs available")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", help="JSON results (default bench/results/memory-<host>-<time>.json)")
    ap.add_argument("--gpu", action="store_true", help="the GPU table: bf16, micro --batch x --seq, --device cuda")
    ap.add_argument("--batch", type=int, default=64, help="--gpu: the micro-batch (default 64)")
    ap.add_argument("--seq", type=int, default=1024, help="--gpu: the sequence length (default 1024)")
    ap.add_argument("--device-for-testing", help="--gpu: run on this device (cpu) to test the script")
    a = ap.parse_args(argv)
    build = os.path.abspath(os.path.join(ROOT, a.build))
    if a.gpu:
        return gpu_rows(a, build)
    mbtc, gendata = os.path.join(build, "mbtc"), os.path.join(build, "mbt-gendata")
    work = os.path.join(build, "bench")
    os.makedirs(os.path.join(work, "data"), exist_ok=True)
    threads = a.threads if a.threads > 0 else len(os.sched_getaffinity(0))
    data = os.path.join(work, "data", "gpt2-124m_train.bin")  # run.py's GPT-2 data (same arguments)
    if not os.path.exists(data):
        subprocess.run([gendata, "--vocab", "1024", "--tokens", "300000", "--val-tokens", "0", "--out-dir",
                        os.path.join(work, "data"), "--name", "gpt2-124m"], check=True, stdout=subprocess.DEVNULL)
    load = os.getloadavg()[0]
    say(f"== memory: GPT-2 124M on the CPU ({SOURCE}, micro 4 x 64), {threads} threads, {a.steps} steps a run, "
        f"{a.warmup} warm-up; load average {load:.2f} on {os.cpu_count()} CPUs")
    init = os.path.join(work, "memory-init.safetensors")
    results = []
    for label, block in ROWS:
        prog = os.path.join(work, f"mem-{block}")
        st, out, compile_s, _ = run_child([mbtc, "-I", "examples", "--cuda-arch=none", os.path.join(ROOT, SOURCE), "--train", block, "-o", prog],
                                          cwd=ROOT)
        if st != 0:
            why = next((l.split("error: ", 1)[1] for l in out.splitlines() if "error: " in l), out.strip()[-200:])
            say(f"  {label}: not built - mbtc -o refuses it: {why}")
            results.append(dict(setting=label, block=block, refused=why))
            continue
        if not os.path.exists(init):
            run_child([prog, "train", "--steps", "0", "--data", data, "--save-weights", init])
        _, info, _, _ = run_child([prog, "info"])
        planned = int(re.search(r"^plan: arena step (\d+) bytes$", info, re.M).group(1))
        arena = int(re.search(r"^plan: arena (\d+) bytes, the largest$", info, re.M).group(1))
        state = int(re.search(r"optimizer state (\d+) bytes", info).group(1))
        log = os.path.join(work, f"mem-{block}.jsonl")
        cmd = [prog, "train", "--steps", str(a.steps), "--threads", str(threads), "--data", data, "--init-weights", init,
               "--log", log, "--arena-high-water"]
        # a store directory where the program keeps a store (the plan may offload no activation)
        if "optimizer to nvme" in label or "plan: activations offloaded to nvme" in info:
            cmd += ["--offload-dir", work]
        st, out, wall, rss = run_child(cmd)
        if st != 0:
            say(out[-2000:])
            raise SystemExit(f"bench: {block} failed")
        m = re.search(r"wrote (\d+) bytes of the arena", out)
        with open(log) as f:
            recs = [json.loads(l) for l in f if l.strip()]
        timed = [r["ms"] for r in recs[a.warmup:]]
        ms = sum(timed) / len(timed) if timed else float("nan")
        r = dict(setting=label, block=block, compile_s=compile_s, step_arena_planned=planned, arena=arena,
                 step_arena_measured=int(m.group(1)) if m else None, optimizer_state_in_memory=state,
                 peak_rss_kib=rss, ms_per_step=ms, steps_ms=timed, last_loss=recs[-1]["loss"] if recs else None)
        results.append(r)
        say(f"  {label}: step arena {planned / 2**20:.1f} MiB planned, {r['step_arena_measured'] / 2**20:.1f} MiB "
            f"measured; {ms:.0f} ms/step; peak RSS {rss / 1024:.0f} MiB; last loss {r['last_loss']}")
    base = results[0]
    hdr = f"{'setting':<22} {'step arena MiB':>15} {'measured MiB':>13} {'vs none':>8} {'opt. state MiB':>15} " \
          f"{'peak RSS MiB':>13} {'ms/step':>9} {'vs none':>8}"
    say()
    say(hdr)
    say("-" * len(hdr))
    for r in results:
        if "refused" in r:
            say(f"{r['setting']:<22} not built: mbtc -o refuses it (docs/memory.md, 'Not done yet')")
            continue
        say(f"{r['setting']:<22} {r['step_arena_planned'] / 2**20:15.1f} {r['step_arena_measured'] / 2**20:13.1f} "
            f"{100 * (r['step_arena_planned'] / base['step_arena_planned'] - 1):+7.1f}% "
            f"{r['optimizer_state_in_memory'] / 2**20:15.1f} {r['peak_rss_kib'] / 1024:13.0f} {r['ms_per_step']:9.0f} "
            f"{100 * (r['ms_per_step'] / base['ms_per_step'] - 1):+7.1f}%")
    say(f"(one run a setting; the machine's load average was {load:.2f} at the start: with other work on it the "
        f"step times are contended)")
    write_results(a.out, "memory", dict(threads=threads, steps=a.steps, warmup=a.warmup, load=load, results=results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
