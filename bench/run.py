#!/usr/bin/python3
"""run.py - `make bench`: CPU training step time of mbt-compiled programs against PyTorch on the
same model, batch, optimizer and thread count (docs/bench.md).

    /usr/bin/python3 bench/run.py [--build build] [--threads N] [--rounds R] [--cases tiny,gpt2-124m]

For each case: build the program with mbtc (timed), make its data with mbt-gendata, then
  1. a self-check: the program's freshly initialised weights (`train --steps 0 --save-weights`)
     are loaded by bench/torch_gpt.py, and both compute the loss of the first batch of the data
     (`eval --steps 1`); they must agree to 1e-5;
  2. R rounds, each one mbt run then one PyTorch run (mbt, torch, mbt, torch, ...), every run a
     fresh process training S steps from those same weights with the same thread count; a run's
     time per step is the mean wall time of its steps after the first W (warm-up) ones, as each
     logs it; the case's time is the median over the rounds (over the uncontended ones, when other
     processes kept the machine busy during some: see below);
  3. the table: ms/step and tokens/s of each, the ratio torch / mbt (> 1: mbt is faster), and
     where mbt's step time goes (MBT_PROFILE=1: the GEMM share, pooled kernels, serial code).
Results are also written as JSON under bench/results/ with the machine, the commit and the
configuration. Nothing here is a test: no number is asserted except the self-check.

Runs on a machine others share are contended; each run records how many cores other processes
kept busy meanwhile (from /proc/stat minus the run's own CPU time), and the table says so. """
import argparse
import datetime
import json
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_GPT = os.path.join(ROOT, "bench", "torch_gpt.py")
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch (not a pyenv python on PATH)

# The cases. Each must say exactly what its mbt program's train block says (checked against the
# program's banner for micro, seq, global and accumulation; lr, betas, weight decay and schedule
# are copied from the .mbt file, whose line is quoted).
CASES = {
    # examples/tiny.mbt: optim.adamw(lr = 1e-3, weight_decay = 0.1), lr.cosine(warmup = 20, total = 400),
    # batch { global = 32, micro = 8 }, tokens(..., seq = 64) (shuffled)
    "tiny": dict(source="examples/tiny.mbt", include=[], config="tiny", micro=8, seq=64, global_batch=32,
                 lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1, cosine=(20, 400),
                 gendata=["--vocab", "64"], warmup=3, steps=13),
    # bench/gpt2_124m.mbt: examples/gpt2.mbt's GPT2(); optim.adamw(lr = 6e-4, betas = (0.9, 0.95),
    # weight_decay = 0.1), constant lr, batch { global = 4, micro = 4 }, tokens(..., seq = 64, shuffle = false)
    "gpt2-124m": dict(source="bench/gpt2_124m.mbt", include=["-I", "examples"], config="gpt2", micro=4, seq=64,
                      global_batch=4, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, cosine=None,
                      gendata=["--vocab", "1024", "--tokens", "300000", "--val-tokens", "0"], warmup=2, steps=5),
}


def say(msg=""):
    print(msg, flush=True)


def cpu_count():
    """The CPUs this process may use: what an mbt executable's --threads defaults to."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(n, 64))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def busy_seconds():
    """Seconds of CPU time the whole machine has spent busy (not idle or waiting), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    v = [int(x) for x in fields]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is inside user
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_quiet(max_wait, threshold):
    """Waits (up to max_wait seconds) until the machine's other work keeps fewer than `threshold`
    cores busy, sampled over one second; returns (that load, seconds waited)."""
    t0 = time.monotonic()
    while True:
        b0 = busy_seconds()
        time.sleep(1.0)
        load = busy_seconds() - b0
        waited = time.monotonic() - t0
        if load < threshold or waited >= max_wait:
            return load, waited


def run_measured(cmd, env=None, cwd=None):
    """Runs cmd, returns (stdout, wall seconds, cores other processes kept busy meanwhile)."""
    b0, c0, t0 = busy_seconds(), children_cpu_seconds(), time.monotonic()
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    b1, c1 = busy_seconds(), children_cpu_seconds()
    if p.returncode != 0:
        say(p.stdout[-4000:])
        raise SystemExit(f"bench: command failed with status {p.returncode}: {' '.join(cmd)}")
    other = max(0.0, ((b1 - b0) - (c1 - c0)) / wall) if wall > 0 else 0.0
    return p.stdout, wall, other


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_stats(records, warmup):
    """Mean ms of the steps after the first `warmup`, and the last step's loss."""
    steps = [r for r in records if "ms" in r]
    timed = [r["ms"] for r in steps[warmup:]]
    if not timed:
        raise SystemExit("bench: no timed steps (steps <= warm-up)")
    return sum(timed) / len(timed), timed, steps[-1]["loss"]


def git_commit():
    try:
        c = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], stdout=subprocess.PIPE, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               stdout=subprocess.PIPE, text=True).stdout.strip()
        return c + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def build_program(mbtc, source, include, prog):
    """Compiles `source` (relative to the repository) into the executable `prog` with mbtc and
    `include` (["-I", DIR] ...); returns the compile time in seconds. Stops the benchmark when
    mbtc fails."""
    t0 = time.monotonic()
    p = subprocess.run([mbtc, *include, os.path.join(ROOT, source), "-o", prog], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    compile_s = time.monotonic() - t0
    if p.returncode != 0:
        say(p.stdout)
        raise SystemExit(f"bench: mbtc failed on {source}")
    say(f"  compile: mbtc {source} -o {os.path.relpath(prog, ROOT)}: {compile_s:.2f} s")
    return compile_s


def make_data(gendata, gendata_args, data_dir, name):
    """mbt-gendata's corpus DATA_DIR/NAME_train.bin, made with `gendata_args` unless it exists;
    returns its path."""
    data = os.path.join(data_dir, f"{name}_train.bin")
    if not os.path.exists(data):
        os.makedirs(data_dir, exist_ok=True)
        subprocess.run([gendata, *gendata_args, "--out-dir", data_dir, "--name", name], check=True,
                       stdout=subprocess.DEVNULL)
    return data


def save_initial_weights(prog, data, init, case, extra=()):
    """Writes the program's freshly initialised weights to `init` (`train --steps 0
    --save-weights`), which both sides then start from, and checks the program's banner against
    the case's batch (micro, seq, global). Returns (global, seq, micro)."""
    out, _, _ = run_measured([prog, "train", "--steps", "0", *extra, "--data", data, "--save-weights", init])
    m = re.search(r"(\d+) steps of (\d+) sequences x (\d+) tokens \(micro-batch (\d+), accumulation (\d+)\)", out)
    if not m:
        raise SystemExit(f"bench: cannot read the program's banner:\n{out}")
    g, T, B = int(m.group(2)), int(m.group(3)), int(m.group(4))
    if (g, T, B) != (case["global_batch"], case["seq"], case["micro"]):
        raise SystemExit(f"bench: {case['source']} trains global {g} x seq {T}, micro {B}, but the benchmark "
                         f"expects {case['global_batch']} x {case['seq']}, micro {case['micro']}")
    return g, T, B


def main(argv):
    ap = argparse.ArgumentParser(description="mbt vs PyTorch CPU training step time (docs/bench.md)")
    ap.add_argument("--build", default="build", help="the build directory (mbtc, mbt-gendata)")
    ap.add_argument("--threads", type=int, default=0, help="threads for both (default: the CPUs available)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (mbt, torch) runs per case (default 3)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--steps", type=int, default=0, help="steps per run, warm-up included (default per case)")
    ap.add_argument("--warmup", type=int, default=-1, help="warm-up steps not timed (default per case)")
    ap.add_argument("--no-check", action="store_true", help="skip the loss self-check")
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="before each timed run, wait up to this many seconds for other processes to keep fewer "
                         "than --quiet-load cores busy (default 30; 0: do not wait)")
    ap.add_argument("--quiet-load", type=float, default=0.25,
                    help="see --quiet-wait; a round whose runs saw more is contended, and the medians leave "
                         "contended rounds out when there are uncontended ones (default 0.25 cores)")
    ap.add_argument("--out", help="JSON results (default bench/results/cpu-<host>-<time>.json)")
    a = ap.parse_args(argv)

    build = os.path.abspath(os.path.join(ROOT, a.build))
    mbtc, gendata = os.path.join(build, "mbtc"), os.path.join(build, "mbt-gendata")
    for tool in (mbtc, gendata):
        if not os.access(tool, os.X_OK):
            raise SystemExit(f"bench: {tool} is missing: run `make all` first")
    work = os.path.join(build, "bench")
    os.makedirs(os.path.join(work, "data"), exist_ok=True)
    threads = a.threads if a.threads > 0 else cpu_count()
    cases = [c for c in a.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            raise SystemExit(f"bench: unknown case '{c}' (known: {', '.join(CASES)})")

    torch_version = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
    if torch_version.returncode != 0:
        raise SystemExit(f"bench: {PYTHON} cannot import torch (apt-get install python3-torch):\n"
                         f"{torch_version.stdout[-2000:]}")
    machine = dict(host=socket.gethostname(), cpu=cpu_model(), nproc=os.cpu_count(), cpus_available=cpu_count(),
                   kernel=platform.release(), torch=torch_version.stdout.strip(), python=PYTHON)
    say(f"mbt CPU benchmark: {machine['cpu']}, {machine['cpus_available']} CPUs available (nproc {machine['nproc']}); "
        f"torch {machine['torch']}; commit {git_commit()}")
    say(f"threads: {threads} for both (mbt --threads {threads}, torch.set_num_threads({threads}))")
    say(f"method: {a.rounds} rounds of (mbt, torch) per case, each a fresh process from the same initial weights; "
        f"time per step = mean over the steps after the warm-up ones; median over (uncontended) rounds")
    say()

    results = []
    for name in cases:
        c = dict(CASES[name])
        if a.steps > 0:
            c["steps"] = a.steps
        if a.warmup >= 0:
            c["warmup"] = a.warmup
        if c["steps"] <= c["warmup"]:
            raise SystemExit(f"bench: {name}: steps {c['steps']} must exceed the warm-up steps {c['warmup']}")
        say(f"== {name}: {c['source']} (micro {c['micro']} x seq {c['seq']}, global {c['global_batch']}, adamw), "
            f"{c['steps']} steps a run, {c['warmup']} warm-up")

        # the program, its data, and the initial weights both sides start from
        prog = os.path.join(work, name)
        compile_s = build_program(mbtc, c["source"], c["include"], prog)
        data = make_data(gendata, c["gendata"], os.path.join(work, "data"), name)
        init = os.path.join(work, f"{name}-init.safetensors")
        g, T, B = save_initial_weights(prog, data, init, c, ["--threads", str(threads)])

        check = None
        if not a.no_check:
            out, _, _ = run_measured([prog, "eval", "--weights", init, "--data", data, "--steps", "1",
                                      "--threads", str(threads)])
            m = re.search(r"loss ([0-9.]+)", out)
            mbt_loss = float(m.group(1))
            # eval's one step is a global batch: accumulation x micro sequences, whose mean loss is
            # the mean over the g windows as one batch
            out, _, _ = run_measured([PYTHON, TORCH_GPT, "check", "--config", c["config"], "--weights", init,
                                      "--data", data, "--batch", str(g), "--seq", str(T), "--expect",
                                      repr(mbt_loss), "--threads", str(threads)])
            m = re.search(r"torch loss ([0-9.]+)", out)
            check = dict(mbt=mbt_loss, torch=float(m.group(1)), diff=abs(float(m.group(1)) - mbt_loss))
            say(f"  self-check, loss of the first batch from the same weights: mbt {mbt_loss:.6f}, "
                f"torch {check['torch']:.6f}, |difference| {check['diff']:.1e} (tolerance 1e-5)")
            if check["diff"] > 1e-5:
                raise SystemExit("bench: the PyTorch model does not compute what the mbt program computes")

        runs = {"mbt": [], "torch": []}
        env_mbt = dict(os.environ, MBT_PROFILE="1")
        def quiet():
            if a.quiet_wait > 0:
                load, waited = wait_quiet(a.quiet_wait, a.quiet_load)
                if waited > 1.5:
                    say(f"  (waited {waited:.0f} s for a quieter machine; other load now {load:.2f} cores)")

        for r in range(a.rounds):
            log = os.path.join(work, f"{name}-mbt-{r}.jsonl")
            quiet()
            out, wall, other = run_measured([prog, "train", "--steps", str(c["steps"]), "--threads", str(threads),
                                             "--data", data, "--init-weights", init, "--log", log], env=env_mbt)
            mean, timed, loss = step_stats(read_log(log), c["warmup"])
            prof = re.search(r"profile summary: (.*)", out)
            pf = {k: float(v) for k, v in (kv.split("=") for kv in prof.group(1).split())} if prof else {}
            report = out[out.find("profile (MBT_PROFILE)"):] if "profile (MBT_PROFILE)" in out else ""
            runs["mbt"].append(dict(ms=mean, steps_ms=timed, loss=loss, wall_s=wall, other_cores=other, profile=pf,
                                    report=report))
            say(f"  round {r + 1}: mbt   {mean:9.2f} ms/step (steps {', '.join(f'{x:.1f}' for x in timed)}), "
                f"last loss {loss:.6f}, GEMM share {100 * pf.get('gemm_share', float('nan')):.1f}%, "
                f"other load {other:.2f} cores")

            log = os.path.join(work, f"{name}-torch-{r}.jsonl")
            cmd = [PYTHON, TORCH_GPT, "train", "--config", c["config"], "--threads", str(threads), "--steps",
                   str(c["steps"]), "--batch", str(B), "--seq", str(T), "--global", str(g), "--lr", repr(c["lr"]),
                   "--beta1", repr(c["betas"][0]), "--beta2", repr(c["betas"][1]), "--weight-decay",
                   repr(c["weight_decay"]), "--data", data, "--init-weights", init, "--log", log]
            if c["cosine"]:
                cmd += ["--cosine", "--warmup", str(c["cosine"][0]), "--total", str(c["cosine"][1])]
            quiet()
            out, wall, other = run_measured(cmd)
            mean, timed, loss = step_stats(read_log(log), c["warmup"])
            runs["torch"].append(dict(ms=mean, steps_ms=timed, loss=loss, wall_s=wall, other_cores=other))
            say(f"  round {r + 1}: torch {mean:9.2f} ms/step (steps {', '.join(f'{x:.1f}' for x in timed)}), "
                f"last loss {loss:.6f}, other load {other:.2f} cores")

        # rounds in which neither run shared the machine with other work, when there are any
        clean = [r for r in range(a.rounds) if max(runs["mbt"][r]["other_cores"], runs["torch"][r]["other_cores"])
                 < a.quiet_load]
        used = clean if clean else list(range(a.rounds))
        say(f"  rounds used for the medians: {len(clean)} of {a.rounds} uncontended"
            + ("" if clean else " - none, so all rounds are used and the numbers are contended"))
        runs_used = {k: [v[r] for r in used] for k, v in runs.items()}
        med = {k: statistics.median(x["ms"] for x in v) for k, v in runs_used.items()}
        tokens = g * T
        shares = [x["profile"] for x in runs_used["mbt"] if x["profile"]]
        res = dict(case=name, source=c["source"], config=c["config"], micro=B, seq=T, global_batch=g,
                   tokens_per_step=tokens, threads=threads, rounds=a.rounds, steps=c["steps"], warmup=c["warmup"],
                   compile_s=compile_s, check=check, runs=runs, rounds_used=used, uncontended_rounds=len(clean),
                   mbt_ms=med["mbt"], torch_ms=med["torch"], mbt_tokens_per_s=tokens / med["mbt"] * 1e3,
                   torch_tokens_per_s=tokens / med["torch"] * 1e3, ratio=med["torch"] / med["mbt"],
                   gemm_share=statistics.median(s["gemm_share"] for s in shares) if shares else None,
                   pool_share=statistics.median(s["pool_ms"] / s["step_ms"] for s in shares) if shares else None,
                   serial_share=statistics.median(s["serial_ms"] / s["step_ms"] for s in shares) if shares else None,
                   other_cores=max(x["other_cores"] for v in runs_used.values() for x in v))
        results.append(res)
        # the profile of the mbt round closest to the median
        best = min(runs_used["mbt"], key=lambda x: abs(x["ms"] - med["mbt"]))
        if best["report"]:
            say("  where mbt's step time goes (MBT_PROFILE=1, the median round):")
            for line in best["report"].rstrip().splitlines():
                say("    " + line)
        say()

    # the table
    say(f"CPU training step, {threads} threads, median over alternating (mbt, torch) rounds "
        f"(ratio = torch ms/step / mbt ms/step; > 1: mbt is faster)")
    hdr = (f"{'case':<10} {'batch':<16} {'rounds':>6} {'mbt ms/step':>12} {'mbt tok/s':>10} {'torch ms/step':>14} "
           f"{'torch tok/s':>11} {'ratio':>7} {'mbt GEMM share':>15} {'kernels':>8} {'serial':>7}")
    say(hdr)
    say("-" * len(hdr))
    for r in results:
        batch = f"{r['micro']}x{r['seq']}" + (f" (global {r['global_batch']})" if r["global_batch"] != r["micro"] else "")
        gs = f"{100 * r['gemm_share']:.1f}%" if r["gemm_share"] is not None else "-"
        ps = f"{100 * r['pool_share']:.1f}%" if r["pool_share"] is not None else "-"
        ss = f"{100 * r['serial_share']:.1f}%" if r["serial_share"] is not None else "-"
        rounds = f"{len(r['rounds_used'])}/{r['rounds']}" + ("" if r["uncontended_rounds"] else "*")
        say(f"{r['case']:<10} {batch:<16} {rounds:>6} {r['mbt_ms']:12.2f} {r['mbt_tokens_per_s']:10.0f} {r['torch_ms']:14.2f} "
            f"{r['torch_tokens_per_s']:11.0f} {r['ratio']:6.3f}x {gs:>15} {ps:>8} {ss:>7}")
    say("(rounds: those the medians use - the uncontended ones, * when none was; GEMM share: wall time inside "
        "rt_sgemm_batched / mbt's step time; kernels: the pool's parallel loops outside GEMMs; serial: the rest - "
        "host code, small kernels run inline, data, logging)")
    for r in results:
        if r["uncontended_rounds"] == 0:
            say(f"note: {r['case']}: every round was contended (other processes kept up to {r['other_cores']:.2f} "
                f"cores busy during a run): its times are not clean measurements")

    out = a.out or os.path.join(ROOT, "bench", "results",
                                f"cpu-{socket.gethostname()}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(machine=machine, commit=git_commit(), threads=threads, rounds=a.rounds,
                       date=datetime.datetime.now().isoformat(timespec="seconds"), results=results), f, indent=1)
    say(f"results: {os.path.relpath(out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
