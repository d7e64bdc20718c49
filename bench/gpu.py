#!/usr/bin/python3
"""gpu.py - `make bench-gpu`: GPT-2 124M's training step on one NVIDIA GPU, mbt (`--device cuda`)
against PyTorch on the same GPU (docs/bench.md, "On a GPU").

    /usr/bin/python3 bench/gpu.py [--build build] [--rounds 3] [--steps 25] [--warmup 5]
                                  [--batch 4|max] [--seq 64] [--modes mbt,torch-f32,...] [--out F.json]
                                  [--python PYTHON_WITH_CUDA_TORCH]
    /usr/bin/python3 bench/gpu.py --self-test        # the arithmetic and parsers, on any machine

Without a GPU (`nvidia-smi -L` fails or lists none) it prints `SKIP: no GPU (why)` and exits 0.

The case is bench/run.py's gpt2-124m (bench/gpt2_124m.mbt: examples/gpt2.mbt's GPT2, AdamW lr 6e-4,
betas (0.9, 0.95), weight decay 0.1, constant lr, no clipping, windows in file order). --batch and
--seq give the micro-batch and sequence length (default: the program's 4 x 64; `make bench-gpu`
asks for --seq 1024 --batch max, the largest micro-batch of --batch-candidates with which mbt - in
bf16 when mbt-bf16 is a mode - trains a step on the GPU, tried largest first; every mode then runs
that batch, and a PyTorch mode that cannot says so in its row); an mbt program's batch is compiled
in, so another one is compiled from a copy of the .mbt with its `seq =` and `batch { global,
micro }` replaced. Both sides start from the program's initial weights
(`train --steps 0 --save-weights`), read the same windows, and a self-check first holds their
losses on the first batch to 1e-5, as bench/run.py's does.

The runs (--modes; each a fresh process, R rounds, each round every mode in this order):
  mbt                 the compiled program, --device cuda: f32, GEMMs without TF32
  mbt-bf16            the same program with `precision = bf16` (f32 master weights and AdamW; bf16
                      activations and GEMMs with f32 sums), compiled from a copy of the .mbt
  torch-f32           bench/torch_gpt.py's model eagerly in f32, TF32 off (matmul and cuDNN)
  torch-f32-compile   the same, its loss function under torch.compile (torch >= 2.0)
  torch-bf16          torch.autocast(bfloat16) over the forward and loss; f32 weights and AdamW
  torch-bf16-compile  the same, compiled
PyTorch's AdamW is its fused implementation (--torch-adamw; mbt's update is one fused kernel).
A run's time per step is the mean of its steps after the first W as it logs them (mbt's --log
`ms`, PyTorch's timer around the step ending with torch.cuda.synchronize); a mode's is the median
over the rounds; tokens/s = global batch x seq / that time.

MFU, as nanoGPT's estimate_mfu and llm.c count it (the PaLM paper's appendix B):
    FLOPs per token = 6 N + 12 L d T
N the parameters trained (124,439,808: the tied wte counted once, wpe included), L layers, d the
width, T the sequence length: 6 N for the forward (2 N) and backward (4 N) of every weight matrix,
12 L d T for attention's two T x T matmuls forward and backward, the causal mask not discounted.
MFU = FLOPs per token x tokens/s / the GPU's peak for the run's arithmetic: dense BF16 tensor cores
for bf16 runs, plain FP32 (not TF32) for f32 runs, from NVIDIA's data sheets (PEAKS below; the GPU
named by nvidia-smi; --peak-f32 / --peak-bf16 give others).

Bandwidth: a device-to-device copy of 1 GiB with PyTorch (`dst.copy_(src)`, 2 bytes moved per byte
copied) is the reference. mbt's kernels are timed by one more run with MBT_DEBUG=1, whose timing
table (calls, total and mean microseconds per kernel function and GEMM shape) is parsed; for the
elementwise kernels the bytes a launch must move are taken from `mbtc --emit=cuda`'s comments
(every buffer's size, once for each of read and written: broadcast operands count once, so this is
the least traffic) and bytes / mean time is set against the copy's rate.

Nothing is printed that was not measured: a mode that cannot run says why and has no numbers.
Results go to bench/results/gpu-<host>-<time>.json with the GPU, the versions and the commit. """
import argparse
import datetime
import doctest
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as cpu_bench  # noqa: E402  (bench/run.py: the cases, building, data, weights, logs)
from run import PYTHON, ROOT, TORCH_GPT, say  # noqa: E402

MODES = ["mbt", "mbt-bf16", "torch-f32", "torch-f32-compile", "torch-bf16", "torch-bf16-compile"]
PRECISION = {"mbt": "f32", "mbt-bf16": "bf16", "torch-f32": "f32", "torch-f32-compile": "f32", "torch-bf16": "bf16",
             "torch-bf16-compile": "bf16"}
LABEL = {"mbt": "mbt", "mbt-bf16": "mbt", "torch-f32": "torch eager", "torch-f32-compile": "torch.compile",
         "torch-bf16": "torch eager", "torch-bf16-compile": "torch.compile"}
ARITH = {"mbt": "f32 (no TF32)", "mbt-bf16": "bf16 mixed", "torch-f32": "f32 (no TF32)",
         "torch-f32-compile": "f32 (no TF32)", "torch-bf16": "bf16 autocast", "torch-bf16-compile": "bf16 autocast"}

# Dense peak TFLOPS (FP32 on CUDA cores; BF16 on tensor cores, without sparsity), NVIDIA's data
# sheets, SXM boards unless named. First match of the pattern in the GPU's name wins.
PEAKS = [
    (r"H200", "H200 SXM", 66.9, 989.4),  # the H100 SXM's compute, more and faster memory
    (r"H100.*PCIe", "H100 PCIe", 51.2, 756.5),
    (r"H100(?!.*NVL)", "H100 SXM", 66.9, 989.4),
    (r"A100", "A100", 19.5, 312.0),
]


# ---- arithmetic --------------------------------------------------------------------------------

def flops_per_token(n_params, layers, d, seq):
    """6 N + 12 L d T.

    >>> flops_per_token(124_439_808, 12, 768, 1024)   # GPT-2 124M at T = 1024
    859885056
    >>> flops_per_token(124_439_808, 12, 768, 64)
    753716736
    """
    return 6 * n_params + 12 * layers * d * seq


def mfu(n_params, layers, d, seq, tokens_per_s, peak_tflops):
    """The model FLOPs utilisation: FLOPs per token x tokens/s over the peak.

    >>> round(mfu(124_439_808, 12, 768, 1024, 100_000, 989.4), 6)  # 859,885,056 x 1e5 / 989.4e12
    0.08691
    >>> round(mfu(124_439_808, 12, 768, 1024, 10_000, 66.9), 6)  # 859,885,056 x 1e4 / 66.9e12
    0.128533
    """
    return flops_per_token(n_params, layers, d, seq) * tokens_per_s / (peak_tflops * 1e12)


def peak_for(gpu_name):
    """(board, FP32 TFLOPS, BF16 TFLOPS) for a GPU name as nvidia-smi prints it, or None.

    >>> peak_for("NVIDIA H100 80GB HBM3")
    ('H100 SXM', 66.9, 989.4)
    >>> peak_for("NVIDIA H100 PCIe")
    ('H100 PCIe', 51.2, 756.5)
    >>> peak_for("NVIDIA H200")
    ('H200 SXM', 66.9, 989.4)
    >>> peak_for("NVIDIA H100 NVL") is None, peak_for("NVIDIA GeForce RTX 4090") is None
    (True, True)
    """
    for pattern, board, f32, bf16 in PEAKS:
        if re.search(pattern, gpu_name):
            return board, f32, bf16
    return None


def model_shape(weights):
    """(parameters, layers, width) of a GPT-2 weights file (safetensors): every tensor's size
    summed, the `h.N.` blocks counted, d from the position table (wpe / wpe.weight, [ctx, d])."""
    with open(weights, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    params = sum(_prod(v["shape"]) for v in header.values())
    layers = len({k.split(".")[1] for k in header if k.startswith("h.")})
    wpe = header.get("wpe.weight") or header.get("wpe")
    return params, layers, wpe["shape"][1]


def _prod(shape):
    p = 1
    for s in shape:
        p *= s
    return p


# ---- mbt's kernels: MBT_DEBUG's timing table and mbtc --emit=cuda --------------------------------

DTYPE_BYTES = {"f32": 4, "i32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "u8": 1, "bool": 1}


def cuda_kernels(cuda_source):
    """The kernels of `mbtc --emit=cuda`, from each one's comment: {name: dict(kind, grid, function
    (the __global__ function it is launched as), bytes (every buffer's size, once if read, once if
    written))}.

    >>> k = cuda_kernels('''/* kernel step_k1_add: elementwise, grid 8
    ...  * buffers:
    ...  *   p0: f32[2, 4] read, buffer 154 (%154)
    ...  *   p1: f32[4] read, buffer 5 (%5)
    ...  *   p2: f32[2, 4] written, buffer 155 (%155)
    ...  */
    ... /* kernel step_k6_add: elementwise, grid 8
    ...  *   p0: f32[2, 4] read, buffer 169 (%179)
    ...  *   p1: f32[] read, buffer 17 (%17)
    ...  *   p2: f32[2, 4] written, buffer 170 (%180)
    ...  * code: the same as step_k1_add's: launched as step_k1_add
    ...  */''')
    >>> k["step_k1_add"]["bytes"], k["step_k6_add"]["bytes"], k["step_k6_add"]["function"]
    (80, 68, 'step_k1_add')
    """
    out, cur = {}, None
    for line in cuda_source.splitlines():
        m = re.match(r"/\* kernel (\w+): (\w+), grid (\d+)", line)
        if m:
            cur = out[m.group(1)] = dict(kind=m.group(2), grid=int(m.group(3)), function=m.group(1), bytes=0)
            continue
        if cur is None:
            continue
        m = re.match(r" \*\s+p\d+: (\w+)\[([^\]]*)\] (.*)", line)
        if m and m.group(1) in DTYPE_BYTES:
            dims = [int(x) for x in m.group(2).split(",") if x.strip()]
            access = len(re.findall(r"\b(read|written)\b", m.group(3).split(", buffer")[0]))
            cur["bytes"] += _prod(dims) * DTYPE_BYTES[m.group(1)] * access
        m = re.match(r" \* code: .*launched as (\w+)", line)
        if m:
            cur["function"] = m.group(1)
        if line.startswith(" */"):
            cur = None
    return out


def _number(tok):
    """A table cell as a number (12, 3.5, 1.2e3, 45.1%), or None."""
    m = re.fullmatch(r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)%?", tok.replace(",", ""))
    return float(m.group(1)) if m else None


def timing_table(text):
    """MBT_DEBUG's table, parsed loosely (its format is the runtime's): from the first line naming
    "kernel" and "us" (or "µs"), each row a name followed by numbers; the header's last fields name
    the numbers (calls, total, mean, share, bytes). Returns dict(header, columns, rows: [dict(name,
    calls, total_us, mean_us, ...)]) or None when there is no such header.

    >>> t = timing_table('''done: 2 steps
    ... kernel / GEMM                  calls   total us    mean us   share
    ... step_k1_add                       24      120.5      5.02    12.0%
    ... gemm 256x2304x768 (nn)            24     2400.0    100.00    60.1%
    ...
    ... after''')
    >>> [(r["name"], r["calls"], r["total_us"], r["mean_us"]) for r in t["rows"]]
    [('step_k1_add', 24.0, 120.5, 5.02), ('gemm 256x2304x768 (nn)', 24.0, 2400.0, 100.0)]
    """
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        low = line.lower()
        if "kernel" in low and (re.search(r"(^|[^a-z])us([^a-z]|$)", low) or "µs" in low):
            start = i
            break
    if start is None:
        return None
    header = lines[start]
    fields = [f for f in re.split(r"\s{2,}|\t", header.strip()) if f]
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            if rows:
                break
            continue
        if set(line.strip()) <= set("-=+| "):
            continue  # a rule under the header
        toks = line.split()
        k = len(toks)
        while k > 0 and _number(toks[k - 1]) is not None:
            k -= 1
        nums = [_number(t) for t in toks[k:]]
        if k == 0 or not nums:
            break
        row = dict(name=" ".join(toks[:k]), values=nums)
        names = fields[-len(nums):] if len(fields) > len(nums) else []
        for field, v in zip(names, nums):
            f = field.lower()
            scale = 1e3 if re.search(r"\bms\b", f) else 1.0
            if "call" in f or f in ("n", "count", "launches"):
                row["calls"] = v
            elif "total" in f:
                row["total_us"] = v * scale
            elif "mean" in f or "avg" in f or "/call" in f:
                row["mean_us"] = v * scale
            elif "share" in f or "%" in f:
                row["share"] = v
            elif "byte" in f:
                row["bytes"] = v
        if "mean_us" not in row and "total_us" in row and row.get("calls"):
            row["mean_us"] = row["total_us"] / row["calls"]
        rows.append(row)
    return dict(header=header, columns=fields, rows=rows)


def elementwise_bandwidth(table, kernels):
    """For each row of the timing table that is an elementwise kernel function of the training
    step or update (step_*, update_*), the bytes one launch moves at least (the mean over the
    kernels launched as that function) and the rate bytes / mean time, in GB/s.

    >>> ks = {"step_k1_add": dict(kind="elementwise", function="step_k1_add", bytes=4000),
    ...       "step_k6_add": dict(kind="elementwise", function="step_k1_add", bytes=2000),
    ...       "step_k2_ln": dict(kind="row", function="step_k2_ln", bytes=100)}
    >>> elementwise_bandwidth(dict(rows=[dict(name="step_k1_add", mean_us=1.5), dict(name="step_k2_ln", mean_us=1)]), ks)
    [{'function': 'step_k1_add', 'kernels': 2, 'bytes_per_call': 3000.0, 'mean_us': 1.5, 'gbps': 2.0}]
    """
    by_fn = {}
    for name, k in kernels.items():
        if name.startswith(("step_", "update_")):
            by_fn.setdefault(k["function"], []).append(k)
    out = []
    for row in table["rows"]:
        ks = by_fn.get(row["name"])
        if not ks or any(k["kind"] != "elementwise" for k in ks) or not row.get("mean_us"):
            continue
        b = row["bytes"] if "bytes" in row else sum(k["bytes"] for k in ks) / len(ks)
        out.append(dict(function=row["name"], kernels=len(ks), bytes_per_call=b, mean_us=row["mean_us"],
                        gbps=b / row["mean_us"] / 1e3))
    return out


# ---- running -----------------------------------------------------------------------------------

def gpu_present():
    """(True, description) when nvidia-smi lists a GPU, else (False, why not)."""
    try:
        p = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError:
        return False, "nvidia-smi not found"
    if p.returncode != 0:
        return False, "nvidia-smi -L failed: " + (p.stdout.strip().splitlines() or ["?"])[0]
    gpus = [line for line in p.stdout.splitlines() if re.match(r"GPU \d+", line)]
    if not gpus:
        return False, "nvidia-smi -L lists none"
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else gpus[0]
    return True, first


def torch_info(python, device):
    """PyTorch's version, its CUDA version, whether it sees the device, has torch.compile and a
    fused AdamW for it (the GPU's only)."""
    cuda = device.startswith("cuda")
    code = "\n".join([
        "import inspect, json, torch",
        "cuda = " + repr(cuda),
        "ok = torch.cuda.is_available() if cuda else True",
        "print(json.dumps(dict(version=torch.__version__, cuda=torch.version.cuda, available=ok,",
        "    compile=hasattr(torch, 'compile'),",
        "    fused=cuda and 'fused' in inspect.signature(torch.optim.AdamW).parameters,",
        "    device=(torch.cuda.get_device_name(0) if ok else None) if cuda else 'cpu')))"])
    p = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return None, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else f"{python} failed"
    return json.loads(p.stdout.strip().splitlines()[-1]), None


# The benchmark's programs hold out one global batch for evaluation (`eval { steps = 1 }`), not the
# default 20: the runtime holds out eval.steps global batches at the end of the data, which at
# micro-batch 64 x 1024 is 1,280 windows (1.3M tokens), so --batch max's probe was refused for
# data, not memory. Evaluation is never run during the timed steps (every = EVAL_EVERY).
EVAL_STEPS = 1
EVAL_EVERY = 1_000_000_000


def set_eval(text):
    r"""The .mbt text with its train block's eval.steps set to EVAL_STEPS (an eval block added
    after the batch line when there is none).

    >>> print(set_eval("  batch     { global = 4, micro = 4 }\n  steps = 10"))
      batch     { global = 4, micro = 4 }
      eval      { every = 1000000000, steps = 1 }
      steps = 10
    >>> set_eval("  eval { every = 250, steps = 20 }\n")
    '  eval { every = 250, steps = 1 }\n'
    >>> set_eval("  eval { every = 250 }\n")
    '  eval { every = 250, steps = 1 }\n'
    """
    if re.search(r"\beval\s*\{", text):
        text, n = re.subn(r"(\beval\s*\{[^}]*?\bsteps\s*=\s*)\d+", lambda m: f"{m.group(1)}{EVAL_STEPS}", text)
        if n == 0:
            text = re.sub(r"(\beval\s*\{[^}]*?)(\s*\})", lambda m: f"{m.group(1)}, steps = {EVAL_STEPS}{m.group(2)}", text)
        return text
    return re.sub(r"(\n?)([ \t]*)(batch\s*\{[^}]*\}[^\n]*)",
                  lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}\n{m.group(2)}eval      {{ every = {EVAL_EVERY}, "
                            f"steps = {EVAL_STEPS} }}", text, count=1)


def corpus_windows(steps, g, extra=2):
    """Windows of T + 1 tokens the data must hold for `steps` global batches of g sequences: the
    steps (and `extra` more), plus the EVAL_STEPS global batches the runtime holds out at the end.

    >>> corpus_windows(25, 64)   # 27 batches trained from, 1 held out
    1792
    """
    return (steps + extra + EVAL_STEPS) * g


def first_train_block(text):
    r"""The .mbt text up to its second train block: the case's block is the first (bench/gpt2_124m.mbt
    adds bench/memory.py's blocks after it, which the variant leaves out).

    >>> first_train_block("import a\ntrain x {\n  seq = 1\n}\n\n# the next\ntrain y {\n}\n")
    'import a\ntrain x {\n  seq = 1\n}\n\n# the next\n'
    """
    starts = [m.start() for m in re.finditer(r"^train\s+\w+\s*\{", text, re.M)]
    return text[:starts[1]] if len(starts) > 1 else text


def variant_source(case, batch, seq, work, precision="f32"):
    """A copy of the case's .mbt file with `seq = T`, `batch { global = B x accumulation, micro =
    B }`, `precision = bf16` after the batch when asked, and eval.steps = EVAL_STEPS (set_eval),
    written under `work`. Returns (its path, extra -I options, global batch)."""
    accum = case["global_batch"] // case["micro"]
    with open(os.path.join(ROOT, case["source"])) as f:
        text = first_train_block(f.read())
    text, n1 = re.subn(r"\bseq\s*=\s*\d+", f"seq = {seq}", text)
    text, n2 = re.subn(r"(batch\s*\{\s*)global\s*=\s*\d+\s*,\s*micro\s*=\s*\d+(\s*\})",
                       lambda m: f"{m.group(1)}global = {batch * accum}, micro = {batch}{m.group(2)}"
                       + ("\n  precision = bf16" if precision == "bf16" else ""), text)
    if (n1, n2) != (1, 1):
        raise SystemExit(f"bench: cannot set the batch of {case['source']}: expected one `seq =` and one "
                         f"`batch {{ global = G, micro = M }}` (found {n1} and {n2})")
    text = set_eval(text)
    path = os.path.join(work, f"{os.path.basename(case['source'])[:-4]}_b{batch}_t{seq}_{precision}.mbt")
    with open(path, "w") as f:
        f.write(f"# written by bench/gpu.py from {case['source']}: micro-batch {batch}, seq {seq}, {precision}\n" + text)
    return path, ["-I", os.path.join(ROOT, os.path.dirname(case["source"]))], batch * accum


def torch_cmd(case, mode, args, data, init, log, B, T, g):
    """bench/torch_gpt.py's training run for a torch-* mode."""
    cmd = [args.python, TORCH_GPT, "train", "--config", case["config"], "--threads", str(cpu_bench.cpu_count()),
           "--steps", str(args.steps), "--batch", str(B), "--seq", str(T), "--global", str(g),
           "--lr", repr(case["lr"]), "--beta1", repr(case["betas"][0]), "--beta2", repr(case["betas"][1]),
           "--weight-decay", repr(case["weight_decay"]), "--data", data, "--init-weights", init, "--log", log,
           "--device", args.device, "--precision", PRECISION[mode]]
    if case["cosine"]:
        cmd += ["--cosine", "--warmup", str(case["cosine"][0]), "--total", str(case["cosine"][1])]
    if mode.endswith("-compile"):
        cmd.append("--compile")
    if args.torch_adamw != "single":
        cmd.append("--" + args.torch_adamw)
    return cmd


def copy_bandwidth(device, nbytes, reps=20):
    """GB/s of dst.copy_(src) for f32 tensors of nbytes each: 2 nbytes moved per copy (run in its
    own process: `gpu.py copy`)."""
    import torch
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(reps):
            dst.copy_(src)
        t1.record()
        torch.cuda.synchronize()
        ms = t0.elapsed_time(t1) / reps
    else:
        t = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src)
        ms = (time.perf_counter() - t) * 1e3 / reps
    assert bool(dst[-1] == 1.0)
    return dict(bytes=n * 4, ms=ms, gbps=2 * n * 4 / (ms * 1e-3) / 1e9, device=device, reps=reps)


def run_mode(cmd, env=None):
    """Runs one timed process; returns (stdout, wall s, other cores busy) or raises RuntimeError
    with the end of its output."""
    b0, c0, t0 = cpu_bench.busy_seconds(), cpu_bench.children_cpu_seconds(), time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    other = max(0.0, ((cpu_bench.busy_seconds() - b0) - (cpu_bench.children_cpu_seconds() - c0)) / wall)
    if p.returncode != 0:
        raise RuntimeError(f"status {p.returncode}: " + (p.stdout.strip().splitlines() or ["no output"])[-1])
    return p.stdout, wall, other


def gpu_peak(text):
    r"""The runtime's own high-water mark of device allocations in bytes, from the `GPU:` line an
    mbt executable prints after training on a GPU (runtime/cli/train.c), or None.

    >>> gpu_peak("done: 2 steps\nGPU: peak 1.5 GiB of device allocations (1610612736 bytes); CUDA graphs: 2 captured")
    1610612736
    >>> gpu_peak("done: 2 steps") is None
    True
    """
    m = re.search(r"^GPU: peak .* of device allocations \((\d+) bytes\)", text, re.M)
    return int(m.group(1)) if m else None


def batch_list(text):
    """--batch: [] for the program's, ["max"], or the micro-batches of a comma-separated list.

    >>> batch_list("0"), batch_list("max"), batch_list("12"), batch_list("12,32, 64")
    ([], ['max'], [12], [12, 32, 64])
    """
    if text in ("", "0"):
        return []
    if text == "max":
        return ["max"]
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"bench: --batch must be a micro-batch, a comma-separated list of them, or max, not '{text}'")
    if not out or any(b <= 0 for b in out):
        raise SystemExit(f"bench: --batch must name positive micro-batches, not '{text}'")
    return out


def bench(a):
    """One benchmark, or with --batch LIST one a micro-batch (each its own JSON file) and a table of
    them all at the end."""
    batches = batch_list(a.batch)
    if len(batches) <= 1:
        return bench_one(a)[0]
    rc, sweep = 0, []
    for b in batches:
        sub = argparse.Namespace(**vars(a))
        sub.batch = str(b)
        if a.out:
            sub.out = (a.out[:-5] if a.out.endswith(".json") else a.out) + f"-b{b}.json"
        say(f"==== --batch {a.batch}: micro-batch {b}")
        r, res = bench_one(sub)
        rc |= r
        if res is None:
            return r
        sweep.append(res)
    say()
    say(f"GPT-2 training step, the sweep over micro-batches {a.batch} (median ms/step of each run as above)")
    hdr = f"{'micro':>5} {'run':<19} {'arithmetic':<14} {'ms/step':>10} {'tokens/s':>11} {'MFU':>7} {'peak memory':>12}"
    say(hdr)
    say("-" * len(hdr))
    for res in sweep:
        for r in res["results"]:
            if "not_run" in r:
                say(f"{res['micro']:>5} {r['label']:<19} {ARITH[r['mode']]:<14} {'-':>10} {'-':>11} {'-':>7} {'-':>12}  "
                    f"not run: {r['not_run']}")
                continue
            mf = f"{100 * r['mfu']:.2f}%" if "mfu" in r else "-"
            say(f"{res['micro']:>5} {r['label']:<19} {ARITH[r['mode']]:<14} {r['ms']:10.3f} {r['tokens_per_s']:11.0f} "
                f"{mf:>7} {fmt_mem(r.get('peak_mem_bytes')):>12}")
    return rc


def fmt_mem(b):
    """Bytes as MiB for the tables, '-' when not measured.

    >>> fmt_mem(18301 * 2**20), fmt_mem(None)
    ('18301 MiB', '-')
    """
    return f"{b / 2**20:.0f} MiB" if b else "-"


def bench_one(a):
    """The benchmark at one --batch (a micro-batch, max, or the program's): (status, dict(micro,
    seq, results)), the dict None when nothing ran (no GPU)."""
    build = os.path.abspath(os.path.join(ROOT, a.build))
    mbtc, gendata = os.path.join(build, "mbtc"), os.path.join(build, "mbt-gendata")
    for tool in (mbtc, gendata):
        if not os.access(tool, os.X_OK):
            raise SystemExit(f"bench: {tool} is missing: run `make all` first")
    case = dict(cpu_bench.CASES[a.case])
    T = a.seq or case["seq"]
    bl = batch_list(a.batch)
    B = case["micro"] if not bl else 0 if bl == ["max"] else bl[0]
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"bench: unknown mode '{m}' (known: {', '.join(MODES)})")
    if a.steps <= a.warmup:
        raise SystemExit(f"bench: --steps {a.steps} must exceed --warmup {a.warmup}")
    work = os.path.join(build, "bench", "gpu")
    os.makedirs(work, exist_ok=True)

    # the machine
    if a.device_for_testing:
        a.device, gpu = a.device_for_testing, f"none: --device-for-testing {a.device_for_testing}"
    else:
        ok, gpu = gpu_present()
        if not ok:
            say(f"SKIP: no GPU ({gpu})")
            return 0, None
        a.device = "cuda"
    tinfo, terr = torch_info(a.python, a.device) if any(m.startswith("torch") for m in modes) else (None, "not asked for")
    peak = None
    if a.peak_f32 and a.peak_bf16:
        peak = ("--peak-f32/--peak-bf16", a.peak_f32, a.peak_bf16)
    elif not a.device_for_testing:
        peak = peak_for(gpu)
    machine = dict(host=socket.gethostname(), gpu=gpu, cpu=cpu_bench.cpu_model(), torch=tinfo, python=a.python)
    say(f"mbt GPU benchmark: {gpu}; torch {tinfo['version'] + ' (CUDA ' + str(tinfo['cuda']) + ')' if tinfo else terr}; "
        f"commit {cpu_bench.git_commit()}")
    say("peak used for MFU: " + (f"{peak[0]}: f32 {peak[1]} TFLOPS (FP32, not TF32), bf16 {peak[2]} TFLOPS (dense)"
                                  if peak else "none known for this device: no MFU (--peak-f32 and --peak-bf16 set one)"))

    # --batch max: the largest candidate micro-batch with which mbt trains a step on the device
    if not B:
        B = largest_batch(a, case, T, work, mbtc, gendata, "bf16" if "mbt-bf16" in modes else "f32")
        if not B:
            raise SystemExit(f"bench: no micro-batch of {a.batch_candidates} trains a step on {a.device} at seq {T}")

    # the programs (f32, and bf16 when asked for), their data, the weights both sides start from
    source, include, g = variant_source(case, B, T, work)
    name = f"{a.case}-b{B}-t{T}"
    prog = os.path.join(work, name)
    progs = {"mbt": (prog, source, include)}
    if "mbt-bf16" in modes:
        src16, inc16, _ = variant_source(case, B, T, work, "bf16")
        progs["mbt-bf16"] = (prog + "-bf16", src16, inc16)
    case.update(micro=B, seq=T, global_batch=g, source=source)
    say(f"== {a.case}: {source} (micro {B} x seq {T}, global {g}, adamw), {a.steps} steps a run, {a.warmup} warm-up, "
        f"{a.rounds} rounds")
    # the f32 program only when its mode runs (the bf16 one, same parameters, saves the initial weights
    # otherwise: a GPU lease's time is not spent compiling a program nothing runs)
    if "mbt" not in modes and "mbt-bf16" in progs:
        del progs["mbt"]
    compile_s = None
    for m, (exe, src, inc) in progs.items():
        s = cpu_bench.build_program(mbtc, src, case["include"] + inc, exe)
        compile_s = s if compile_s is None else compile_s
    data = corpus(a, case, gendata, work, corpus_windows(a.steps, g) * (T + 1))
    init = os.path.join(work, f"{name}-init.safetensors")
    cpu_bench.save_initial_weights(next(iter(progs.values()))[0], data, init, case, ["--device", "cpu"])
    n_params, layers, d = model_shape(init)
    say(f"  model: {n_params:,} parameters, {layers} layers, d {d}; FLOPs per token 6N + 12LdT = "
        f"{flops_per_token(n_params, layers, d, T):,}")

    # can each side run at all?
    unavailable = {}
    for m in modes:
        if m.startswith("mbt"):
            p = subprocess.run([progs[m][0], "train", "--steps", "1", "--device", a.device, "--data", data,
                                "--init-weights", init], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if p.returncode != 0:
                unavailable[m] = (p.stdout.strip().splitlines() or ["?"])[-1]
    for m in modes:
        if m.startswith("torch"):
            if tinfo is None:
                unavailable[m] = f"{a.python} cannot import torch: {terr}"
            elif not tinfo["available"]:
                unavailable[m] = f"torch {tinfo['version']} sees no GPU (torch.cuda.is_available() is False)"
            elif m.endswith("-compile") and not tinfo["compile"]:
                unavailable[m] = f"torch {tinfo['version']} has no torch.compile (2.0 and later)"
    for m, why in unavailable.items():
        say(f"  {m}: not run: {why}")
    if tinfo and a.torch_adamw == "fused" and not tinfo["fused"]:
        say(f"  torch {tinfo['version']} has no fused AdamW on {a.device}: its foreach implementation is used")
        a.torch_adamw = "foreach"

    # the self-check: the first global batch's loss from the same weights, mbt against PyTorch (f32)
    check = None
    if not a.no_check and "mbt" in modes and "mbt" not in unavailable and tinfo and tinfo["available"]:
        p = subprocess.run([prog, "eval", "--weights", init, "--data", data, "--steps", "1", "--device", a.device],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        m = re.search(r"loss ([0-9.]+)", p.stdout)
        if p.returncode != 0 or not m:
            raise SystemExit(f"bench: the self-check's mbt eval failed:\n{p.stdout[-2000:]}")
        mbt_loss = float(m.group(1))
        out, _, _ = cpu_bench.run_measured([a.python, TORCH_GPT, "check", "--config", case["config"], "--weights", init,
                                            "--data", data, "--batch", str(g), "--seq", str(T), "--device", a.device])
        torch_loss = float(re.search(r"torch loss ([0-9.]+)", out).group(1))
        check = dict(mbt=mbt_loss, torch=torch_loss, diff=abs(torch_loss - mbt_loss))
        say(f"  self-check, loss of the first global batch from the same weights on {a.device}: mbt {mbt_loss:.6f}, "
            f"torch {torch_loss:.6f}, |difference| {check['diff']:.1e} (tolerance 1e-5)")
        if check["diff"] > 1e-5:
            raise SystemExit("bench: the PyTorch model does not compute what the mbt program computes")
    elif not a.no_check:
        say("  self-check: not run (it holds the f32 program, mode mbt, to PyTorch f32 on the device: "
            "it needs mode mbt among the modes and PyTorch seeing the device)")

    # the rounds
    runs = {m: [] for m in modes if m not in unavailable}
    for r in range(a.rounds):
        for m in runs:
            log = os.path.join(work, f"{name}-{m}-{r}.jsonl")
            if m.startswith("mbt"):
                cmd = [progs[m][0], "train", "--steps", str(a.steps), "--device", a.device, "--data", data,
                       "--init-weights", init, "--log", log]
            else:
                cmd = torch_cmd(case, m, a, data, init, log, B, T, g)
            try:
                out, wall, other = run_mode(cmd)
            except RuntimeError as e:
                say(f"  round {r + 1}: {m}: failed: {e}")
                runs[m].append(dict(failed=str(e)))
                continue
            recs = cpu_bench.read_log(log)
            mean, timed, loss = cpu_bench.step_stats(recs, a.warmup)
            # peak device memory: mbt's own high-water mark of its device allocations (its `GPU:`
            # line), PyTorch's torch.cuda.max_memory_allocated (its log); on the CPU neither
            mem = gpu_peak(out) if m.startswith("mbt") else max((x.get("max_mem_bytes", 0) for x in recs), default=0)
            runs[m].append(dict(ms=mean, steps_ms=timed, loss=loss, wall_s=wall, other_cores=other,
                                max_mem_bytes=mem or None))
            say(f"  round {r + 1}: {m:<19} {mean:9.3f} ms/step (median step {statistics.median(timed):.3f}), "
                f"last loss {loss:.6f}" + (f", peak memory {mem / 2**30:.2f} GiB" if mem else ""))

    # the medians, tokens/s, MFU
    tokens = g * T
    results = []
    for m in modes:
        ok = [x for x in runs.get(m, []) if "ms" in x]
        res = dict(mode=m, label=LABEL[m], precision=PRECISION[m], rounds=len(ok))
        if m in unavailable:
            res["not_run"] = unavailable[m]
        elif not ok:
            res["not_run"] = "every round failed: " + runs[m][0]["failed"]
        else:
            ms = statistics.median(x["ms"] for x in ok)
            res.update(ms=ms, tokens_per_s=tokens / ms * 1e3, last_loss=ok[-1]["loss"],
                       peak_mem_bytes=max((x["max_mem_bytes"] or 0 for x in ok), default=0) or None)
            if peak:
                pk = peak[1] if PRECISION[m] == "f32" else peak[2]
                res.update(peak_tflops=pk, mfu=mfu(n_params, layers, d, T, res["tokens_per_s"], pk))
        results.append(res)

    # mbt's kernels (one more run of each mbt mode with MBT_DEBUG=1) and the copy bandwidth
    kernels_report = {}
    for m in ("mbt", "mbt-bf16"):
        if a.device.startswith("cuda") and m in runs and any("ms" in x for x in runs[m]):
            exe, src, inc = progs[m]
            kernels_report[m] = kernel_report(a, mbtc, src, case["include"] + inc, exe, data, init, work, f"{name}-{m}")
    copy = None
    if tinfo and tinfo["available"] and not a.no_copy:
        p = subprocess.run([a.python, os.path.abspath(__file__), "copy", "--device", a.device, "--bytes",
                            str(a.copy_bytes)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode == 0:
            copy = json.loads(p.stdout.strip().splitlines()[-1])
        else:
            say(f"  copy bandwidth: failed: {p.stdout.strip()[-500:]}")

    # the report
    say()
    say(f"GPT-2 training step on {gpu}: micro-batch {B} x {T} tokens (global {g}), AdamW; median over "
        f"{a.rounds} rounds of {a.steps - a.warmup} timed steps")
    hdr = f"{'run':<19} {'arithmetic':<14} {'ms/step':>10} {'tokens/s':>11} {'MFU':>7} {'peak memory':>12}  peak used"
    say(hdr)
    say("-" * len(hdr))
    for res in results:
        if res["mode"].startswith("mbt"):
            res["label"] = f"mbt --device {a.device}"
        if "not_run" in res:
            say(f"{res['label']:<19} {ARITH[res['mode']]:<14} {'-':>10} {'-':>11} {'-':>7} {'-':>12}  not run: {res['not_run']}")
            continue
        mf = f"{100 * res['mfu']:.2f}%" if "mfu" in res else "-"
        pk = f"{res['peak_tflops']} TFLOPS ({'FP32' if res['precision'] == 'f32' else 'BF16 dense'})" if "mfu" in res else "-"
        say(f"{res['label']:<19} {ARITH[res['mode']]:<14} {res['ms']:10.3f} {res['tokens_per_s']:11.0f} {mf:>7} "
            f"{fmt_mem(res.get('peak_mem_bytes')):>12}  {pk}")
    say("(peak memory: mbt's own high-water mark of its device allocations, printed by the executable; PyTorch's "
        "torch.cuda.max_memory_allocated; neither counts the CUDA context or cuBLAS's own workspace)")
    say(f"(MFU = (6N + 12LdT) x tokens/s / peak, N = {n_params:,}, L = {layers}, d = {d}, T = {T}: "
        f"{flops_per_token(n_params, layers, d, T):,} FLOPs per token)")
    if copy:
        say(f"device-to-device copy (torch, {copy['bytes'] / 2**30:.2f} GiB): {copy['ms']:.3f} ms, {copy['gbps']:.0f} GB/s "
            f"(read + write)")
    for m, rep in kernels_report.items():
        print_kernels(m, rep, copy)

    out = a.out or os.path.join(ROOT, "bench", "results",
                                f"gpu-{socket.gethostname()}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(machine=machine, commit=cpu_bench.git_commit(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                       case=a.case, source=source, micro=B, seq=T, global_batch=g, steps=a.steps, warmup=a.warmup,
                       rounds=a.rounds, torch_adamw=a.torch_adamw, compile_s=compile_s, params=n_params, layers=layers,
                       d=d, flops_per_token=flops_per_token(n_params, layers, d, T), peak=peak, check=check, runs=runs,
                       results=results, copy=copy, kernels=kernels_report), f, indent=1)
    say(f"results: {os.path.relpath(out, ROOT)}")
    broken = [r["mode"] for r in results if r["mode"] not in unavailable and "not_run" in r]
    summary = dict(micro=B, seq=T, results=results)
    if broken:
        say(f"bench: every round of {', '.join(broken)} failed")
        return 1, summary
    return 0, summary


def corpus(a, case, gendata, work, tokens_needed):
    """mbt-gendata's corpus for the case with at least tokens_needed tokens (made once per size)."""
    gen = list(case["gendata"])
    if "--tokens" in gen:
        i = gen.index("--tokens")
        gen[i + 1] = str(max(int(gen[i + 1]), tokens_needed))
    else:
        gen += ["--tokens", str(max(300000, tokens_needed))]
    return cpu_bench.make_data(gendata, gen, os.path.join(work, "data"), f"{a.case}-{gen[gen.index('--tokens') + 1]}")


def largest_batch(a, case, T, work, mbtc, gendata, precision):
    """The largest of --batch-candidates with which the case's program (at seq T, in `precision`)
    trains one step on the device, trying the largest first; 0 when none does. What fails is said
    (an out-of-memory at a large batch is expected; other failures are shown as they are)."""
    accum = case["global_batch"] // case["micro"]
    cands = sorted({int(x) for x in a.batch_candidates.split(",") if x.strip()}, reverse=True)
    data = corpus(a, case, gendata, work, corpus_windows(1, max(cands, default=1) * accum) * (T + 1))
    for b in cands:
        src, inc, _ = variant_source(case, b, T, work, precision)
        prog = os.path.join(work, f"{a.case}-probe-b{b}-t{T}-{precision}")
        cpu_bench.build_program(mbtc, src, case["include"] + inc, prog)
        p = subprocess.run([prog, "train", "--steps", "1", "--device", a.device, "--data", data],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode == 0:
            say(f"  --batch max: micro-batch {b} x {T} trains a step ({precision}); the runs use it")
            return b
        say(f"  --batch max: micro-batch {b} x {T} does not train a step: "
            f"{(p.stdout.strip().splitlines() or ['?'])[-1]}")
    return 0


def kernel_report(a, mbtc, source, include, prog, data, init, work, name):
    """One more mbt run with MBT_DEBUG=1 (not timed): its timing table, and the elementwise
    kernels' bytes from mbtc --emit=cuda."""
    log = os.path.join(work, f"{name}-mbt-debug.jsonl")
    p = subprocess.run([prog, "train", "--steps", str(a.steps), "--device", a.device, "--data", data,
                        "--init-weights", init, "--log", log], env=dict(os.environ, MBT_DEBUG="1"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rep = dict(status=p.returncode, output_tail=p.stdout[-20000:])
    table = timing_table(p.stdout) if p.returncode == 0 else None
    cu = subprocess.run([mbtc, *include, os.path.join(ROOT, source), "--emit=cuda"], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    kernels = cuda_kernels(cu.stdout) if cu.returncode == 0 else {}
    rep.update(table=table, elementwise=elementwise_bandwidth(table, kernels) if table else [],
               kernels_in_program=len(kernels))
    return rep


def print_kernels(mode, rep, copy):
    say()
    say(f"== {mode} ({ARITH[mode]})")
    t = rep["table"]
    if rep["status"] != 0:
        say(f"mbt with MBT_DEBUG=1 failed (status {rep['status']}): no kernel times")
        return
    if not t or not t["rows"]:
        say("mbt with MBT_DEBUG=1 printed no timing table this script can read; its output ends:")
        for line in rep["output_tail"].splitlines()[-30:]:
            say("    " + line)
        return
    say(f"mbt's kernels (MBT_DEBUG=1, {len(t['rows'])} rows; the table as printed, longest first):")
    say("    " + t["header"].strip())
    for row in t["rows"][:25]:
        say(f"    {row['name']:<40} " + " ".join(f"{v:g}" for v in row["values"]))
    if len(t["rows"]) > 25:
        say(f"    ... {len(t['rows']) - 25} more rows in the JSON")
    ew = rep["elementwise"]
    if not ew:
        say("elementwise kernels' bandwidth: none of the table's rows is an elementwise kernel function of "
            "mbtc --emit=cuda with a mean time, so there is nothing to set against the copy")
        return
    say("elementwise kernels' bandwidth (bytes a launch must move, from mbtc --emit=cuda's buffers, over the "
        "mean time" + (f"; against the {copy['gbps']:.0f} GB/s copy)" if copy else ")"))
    for e in sorted(ew, key=lambda e: -e["bytes_per_call"] * 1.0):
        frac = f"  {100 * e['gbps'] / copy['gbps']:5.1f}% of the copy" if copy else ""
        say(f"    {e['function']:<40} {e['bytes_per_call'] / 2**20:9.2f} MiB {e['mean_us']:10.2f} us "
            f"{e['gbps']:8.0f} GB/s{frac}")


# ---- self-test ---------------------------------------------------------------------------------

def self_test(a):
    """The arithmetic and parsers (doctests), the --emit=cuda parser on the benchmark program and
    the copy measurement on the CPU. (The whole benchmark runs on the CPU with
    --device-for-testing cpu.)"""
    failures, tests = doctest.testmod(sys.modules[__name__], verbose=False)
    say(f"doctests: {tests - failures} of {tests} pass")
    bad = failures > 0
    build = os.path.abspath(os.path.join(ROOT, a.build))
    mbtc = os.path.join(build, "mbtc")
    case = cpu_bench.CASES["gpt2-124m"]
    if os.access(mbtc, os.X_OK):
        # --pad-gemm=64 as a GPU build has it by default (the vocabulary stored as 50304 rows), so
        # that the count below holds whatever MBT_CUDA_ARCH says
        cu = subprocess.run([mbtc, *case["include"], os.path.join(ROOT, case["source"]), "--emit=cuda", "--pad-gemm=64"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        ks = cuda_kernels(cu.stdout)
        train = {n: k for n, k in ks.items() if n.startswith(("step_", "update_"))}
        ew = [k for k in train.values() if k["kind"] == "elementwise"]
        upd = [k for n, k in train.items() if n.startswith("update_")]
        # AdamW's update over the 124,439,808 parameters plus the 47 padded rows of the 768-wide token
        # table (124,475,904 floats in storage) reads p, g, m, v and the 2 scalars, writes p, m, v
        want = 124_475_904 * 4 * 7 + 2 * 4
        ok = cu.returncode == 0 and ew and upd and upd[0]["bytes"] == want
        bad |= not ok
        say(f"--emit=cuda of {case['source']}: {len(ks)} kernels, {len(train)} of training, {len(ew)} elementwise; "
            f"the update kernel moves {upd[0]['bytes'] if upd else '?'} bytes (want {want}: 7 x 124,475,904 f32 + 2 "
            f"scalars): {'ok' if ok else 'WRONG'}")
        if ok:
            # the report's formatting, on a made-up table naming two of the program's kernel functions
            fns = [upd[0]["function"], next(k["function"] for k in ew if k is not upd[0])]
            text = "kernel   calls   total us   mean us   share\n" + "".join(
                f"{fn}   10   {1000.0 * (i + 1):.1f}   {100.0 * (i + 1):.1f}   {10 * (i + 1)}%\n" for i, fn in enumerate(fns))
            table = timing_table(text)
            rep = dict(status=0, output_tail=text, table=table, elementwise=elementwise_bandwidth(table, ks))
            say("the kernel report on a MADE-UP table (formatting only; these numbers were not measured):")
            print_kernels("mbt", rep, dict(gbps=3000.0))
            good = len(rep["elementwise"]) == 2 and abs(rep["elementwise"][0]["gbps"] - want / 100.0 / 1e3) < 1e-6
            say(f"made-up table parsed: {'ok' if good else 'WRONG'}")
            bad |= not good
        # the variant a GPU run builds (micro 12 x 1024, bf16) is a program mbtc accepts
        with tempfile.TemporaryDirectory() as work:
            src, inc, g = variant_source(case, 12, 1024, work, "bf16")
            r = subprocess.run([mbtc, *case["include"], *inc, src, "--check"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT)
        ok = r.returncode == 0 and g == 12
        bad |= not ok
        say(f"the GPU run's variant of {case['source']} (micro 12 x 1024, bf16): "
            f"{'mbtc accepts it' if ok else 'REFUSED: ' + r.stderr.strip()}")
    else:
        say(f"--emit=cuda parser: not run ({mbtc} missing)")
    p = subprocess.run([PYTHON, os.path.abspath(__file__), "copy", "--device", "cpu", "--bytes", str(1 << 24)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    say(f"copy bandwidth on the CPU (16 MiB): {p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.returncode}")
    bad |= p.returncode != 0
    return 1 if bad else 0


def main(argv):
    if argv[:1] == ["copy"]:
        ap = argparse.ArgumentParser(prog="gpu.py copy", description="device-to-device copy bandwidth (PyTorch)")
        ap.add_argument("--device", default="cuda")
        ap.add_argument("--bytes", type=int, default=1 << 30)
        c = ap.parse_args(argv[1:])
        print(json.dumps(copy_bandwidth(c.device, c.bytes)))
        return 0
    ap = argparse.ArgumentParser(description="GPT-2 124M training step on one GPU: mbt --device cuda against "
                                             "PyTorch (eager, torch.compile; f32 and bf16) - docs/bench.md",
                                 epilog="Without a GPU: prints SKIP and exits 0. `gpu.py copy` measures the copy "
                                        "bandwidth alone.")
    ap.add_argument("--build", default="build", help="the build directory (mbtc, mbt-gendata)")
    ap.add_argument("--case", default="gpt2-124m", choices=sorted(cpu_bench.CASES),
                    help="bench/run.py's case (default gpt2-124m)")
    ap.add_argument("--batch", default="0",
                    help="micro-batch, sequences; a comma-separated list of them (a sweep: the benchmark at each, "
                         "then one table); or `max`: the largest of --batch-candidates with which mbt trains "
                         "a step on the device (default: the program's)")
    ap.add_argument("--batch-candidates", default="64,48,32,24,16,12,8,4",
                    help="the micro-batches --batch max tries, largest first (default 64,48,32,24,16,12,8,4)")
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default: the program's)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each running every mode once (default 3)")
    ap.add_argument("--steps", type=int, default=25, help="steps a run, warm-up included (default 25)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up steps not timed (default 5; compilation happens there)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    ap.add_argument("--python", default=PYTHON,
                    help=f"the Python whose PyTorch runs the torch side and the copy (default {PYTHON}, Debian's; "
                         "on a GPU machine one whose torch has CUDA)")
    ap.add_argument("--torch-adamw", choices=["fused", "foreach", "single"], default="fused",
                    help="PyTorch's AdamW implementation (default fused)")
    ap.add_argument("--peak-f32", type=float, default=0.0, help="FP32 peak TFLOPS for MFU (with --peak-bf16)")
    ap.add_argument("--peak-bf16", type=float, default=0.0, help="BF16 dense peak TFLOPS for MFU (with --peak-f32)")
    ap.add_argument("--copy-bytes", type=int, default=1 << 30, help="size of the copied tensor (default 1 GiB)")
    ap.add_argument("--no-copy", action="store_true", help="skip the copy bandwidth")
    ap.add_argument("--no-check", action="store_true", help="skip the loss self-check")
    ap.add_argument("--out", help="JSON results (default bench/results/gpu-<host>-<time>.json)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the FLOPs and MFU arithmetic, the parsers and the copy measurement, and exit")
    ap.add_argument("--device-for-testing", metavar="DEVICE",
                    help="run everything on DEVICE (cpu) without looking for a GPU: for testing this script "
                         "(with --case tiny and few steps); no MFU, no kernel table")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test(a)
    return bench(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
