#!/usr/bin/python3
"""bench/serve_gpu.py - decode throughput of `PROG serve` on a GPU against the HBM bound, and TTFT/TPOT
against Hugging Face transformers' generate on the same GPU (docs/bench.md, "Serving on a GPU").

For each model (GPT-2 124M and a Llama-style model, bench/serve_gpu.mbt's train blocks) the script
builds the executable with mbtc, makes its weights (one training step from the initialisers on
mbt-gendata's corpus: decode time does not depend on what the weights say, every request runs to
max_tokens), starts `PROG serve --device DEV` once, and for each batch size B sends B concurrent
streaming requests (a burst) of --prompt-len random token ids and --output-len output tokens
(temperature 0, forced to max_tokens). From the client's timestamps of the streamed tokens:
  - TTFT: send to first token, mean over the B requests (the burst's prefill included);
  - TPOT: per request (last token - first token) / (tokens - 1), mean over the B requests;
  - decode tokens/s (steady state): the window from the last request's first token (every
    request is decoding, no prefill left) to the first request's last token (none has finished);
    the tokens streamed inside it over its length.
The bound: a decode step must read the weights (their bytes at their stored dtype, from the
safetensors file the server loads) and each sequence's KV cache at the mean context of the window
(prompt + the mean number of tokens generated in it, x the bytes a token from the server's start-up
line, "N bytes a block" / the block); bound tokens/s = B x HBM bandwidth / bytes a step, the
bandwidth measured in the same run (a device-to-device copy of --copy-mib MiB timed with torch's
CUDA events, read + write counted) and the vendor's figure for the GPU named beside it. The issue's
target is 70% of the bound at B >= 64. "as built" repeats the bound with the weights read once
a call of forward_chunk, ceil(B / rows) calls a step, the rows a call takes from the server's
/metrics (mbt_serve_engine_call_rows: the program's batch.tokens, at most 256, docs/serve.md);
"calls/step" is measured: the server's calls over its steps during the burst.

The peer: transformers' GPT2LMHeadModel / LlamaForCausalLM with random weights of the same
configuration (the GPU machine has no network), the same dtype (f32) and device, generate() greedy
with the KV cache for the same B, prompt and output lengths: TTFT = generate(max_new_tokens = 1)'s
time, TPOT = (generate(O) - generate(1)) / (O - 1), each after a warm-up. Without transformers (or
torch) the peer is skipped with a line saying so.

Every number in the table and the JSON is labelled "measured" or "computed".

--dry runs the whole pipeline on the CPU (--device cpu) with the toy models (gpt2_dry, llama_dry:
context 64), small batches and lengths, the host's memory bandwidth (a bytearray copy) in place of
HBM's, and the peer on CPU torch when transformers is installed; tests/gpu/check_bench_serve_gpu.sh
runs it (the gpu-emu layer). Its times mean nothing.

Usage: bench/serve_gpu.py --build build [--models gpt2,llama] [--batches 1,8,16,32,64,128]
         [--prompt-len 128] [--output-len 128] [--python PY] [--json OUT] [--dry]
"""
import argparse
import http.client
import json
import math
import os
import platform
import re
import signal
import struct
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "bench/serve_gpu.mbt"

# The models: the train block of SOURCE, its context, and the Hugging Face configuration of the
# same model (the peer's).
MODELS = {
    "gpt2": dict(block="gpt2_serve", ctx=512, hf=dict(kind="gpt2", vocab=50257, d=768, heads=12, layers=12)),
    "llama": dict(block="llama_serve", ctx=512,
                  hf=dict(kind="llama", vocab=32000, d=512, heads=8, kv_heads=4, hidden=1536, layers=8, eps=1e-5,
                          theta=10000.0)),
}
DRY_MODELS = {
    "gpt2": dict(block="gpt2_dry", ctx=64, hf=dict(kind="gpt2", vocab=1024, d=64, heads=2, layers=2)),
    "llama": dict(block="llama_dry", ctx=64,
                  hf=dict(kind="llama", vocab=1024, d=64, heads=4, kv_heads=2, hidden=128, layers=2, eps=1e-5,
                          theta=10000.0)),
}

# The vendors' HBM bandwidth (bytes/s), matched against torch.cuda.get_device_name(): the spec named
# beside the measured figure (the bound uses the measured one).
SPECS = [("H200", 4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
         ("H100 PCIe", 2.0e12, "NVIDIA H100 PCIe datasheet: 2.0 TB/s HBM2e"),
         ("H100 NVL", 3.9e12, "NVIDIA H100 NVL datasheet: 3.9 TB/s HBM3"),
         ("H100", 3.35e12, "NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3"),
         ("A100-SXM4-80GB", 2.039e12, "NVIDIA A100 80GB SXM datasheet: 2.039 TB/s HBM2e"),
         ("A100 80GB PCIe", 1.935e12, "NVIDIA A100 80GB PCIe datasheet: 1.935 TB/s HBM2e"),
         ("A100", 1.555e12, "NVIDIA A100 40GB datasheet: 1.555 TB/s HBM2"),
         ("L40S", 864e9, "NVIDIA L40S datasheet: 864 GB/s GDDR6"),
         ("A10", 600e9, "NVIDIA A10 datasheet: 600 GB/s GDDR6")]


def say(*a):
    print(*a, flush=True)


def run(cmd, what, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if p.returncode != 0:
        say(p.stdout[-3000:])
        sys.exit(f"bench/serve_gpu.py: {what} failed (status {p.returncode}): {' '.join(cmd)}")
    return p.stdout


# ---- bandwidth -------------------------------------------------------------------------------------
def bandwidth_torch(py, mib):
    """HBM bandwidth from a device-to-device copy (torch, CUDA events), read + write counted: runs in
    --python (the one with CUDA torch). Returns (bytes/s, device name, sm_XY) or (None, why, None)."""
    code = f"""
import torch, json
n = {mib} << 20
x = torch.empty(n, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
best = None
for _ in range(5):
    a.record()
    for _ in range(10): y.copy_(x)
    b.record(); torch.cuda.synchronize()
    t = a.elapsed_time(b) / 1e3 / 10
    best = t if best is None else min(best, t)
cap = torch.cuda.get_device_capability(0)
print(json.dumps(dict(bw=2 * n / best, name=torch.cuda.get_device_name(0), arch="sm_%d%d" % cap)))
"""
    p = subprocess.run([py, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return None, "torch's copy failed: " + (p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "?"), None
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return r["bw"], r["name"], r["arch"]


def bandwidth_host(mib):
    """--dry: the host's memory bandwidth from a bytearray copy (a memcpy), read + write counted."""
    n = mib << 20
    src, dst = bytearray(n), bytearray(n)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        dst[:] = src
        best = min(best, time.perf_counter() - t0)
    return 2 * n / best


def spec_for(name):
    for key, bw, what in SPECS:
        if key.lower() in name.lower():
            return bw, what
    return None, f"no datasheet figure known for '{name}'"


# ---- the weights' bytes at their stored dtype --------------------------------------------------------
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I32": 4, "I64": 8, "U8": 1, "I8": 1}


def safetensors_bytes(path):
    """The bytes of every tensor in a safetensors file (their stored dtype), from its header; also
    the dtypes seen. Checked against the file's size (header + data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    total, dtypes = 0, set()
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        total += b - a
        dtypes.add(v["dtype"])
    if 8 + n + total != os.path.getsize(path):
        sys.exit(f"bench/serve_gpu.py: {path}: the header's tensors ({total} bytes) do not fill the file")
    return total, sorted(dtypes)


# ---- the server and its clients -----------------------------------------------------------------------
class Server:
    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.banner, self.url = [], None
        for line in self.p.stdout:
            self.banner.append(line.rstrip())
            m = re.search(r"listening on http://([\d.]+):(\d+)", line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
        if self.port_missing():
            sys.exit("bench/serve_gpu.py: the server did not start:\n" + "\n".join(self.banner) + self.p.stdout.read())
        # the rest of its output is drained so that the pipe never fills
        self.rest = []
        threading.Thread(target=lambda: self.rest.extend(self.p.stdout), daemon=True).start()
        text = "\n".join(self.banner)
        m = re.search(r"KV pool \d+ blocks of (\d+) tokens", text)
        b = re.search(r"at (\d+) bytes a block", text)
        e = re.search(r"engine (\S+) on (.*?), KV pool", text)
        if not (m and b and e):
            sys.exit("bench/serve_gpu.py: the start-up lines name no block size, bytes a block or engine:\n" + text)
        self.block, self.block_bytes = int(m.group(1)), int(b.group(1))
        self.engine, self.device = e.group(1), e.group(2)
        if self.engine != "cached":
            sys.exit(f"bench/serve_gpu.py: the server runs the {self.engine} engine, not the cached one:\n" + text)

    def port_missing(self):
        return not hasattr(self, "port")

    def metrics(self):
        """The server's /metrics as {name: value}."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))}

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=120)
        if rc != 0:
            say(f"  (the server exited {rc}: {''.join(self.rest)[-500:]})")


TOKENS = re.compile(rb'"token_ids":\[([0-9,]*)\]')


def one(host, port, prompt, out_len, res, ready, go):
    """One streaming completion; res gets the send time and each streamed token's arrival time. The
    connection is opened first, then the request waits for `go` (every request of the burst is
    ready), so that the burst's requests reach the server together. The events are counted with a
    regular expression, not json.loads, so that the client's CPU time per token stays small."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": out_len, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    try:
        c = http.client.HTTPConnection(host, port, timeout=900)
        c.connect()
    except Exception as ex:  # noqa: BLE001 - reported as the batch's failure
        res.update(ok=False, error=repr(ex))
        return
    finally:
        ready.wait()
    go.wait()
    try:
        start = time.perf_counter()
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            res.update(ok=False, error=f"status {r.status}: {r.read()[:200]!r}")
            return
        times = []
        while True:
            line = r.readline()
            if not line or line.startswith(b"data: [DONE]"):
                break
            if line.startswith(b"data: "):
                now = time.perf_counter()
                m = TOKENS.search(line)
                k = (m.group(1).count(b",") + 1 if m.group(1) else 0) if m else 0
                times.extend([now] * k)
        c.close()
        res.update(ok=True, start=start, times=times)
    except Exception as ex:  # noqa: BLE001 - reported as the batch's failure
        res.update(ok=False, error=repr(ex))


def client_proc(host, port, group, O, q, barrier):
    """A client process: one thread a request of its group, each connected, then all sent once every
    process is ready (`barrier`); puts [(index, result)] on q."""
    results = [dict() for _ in group]
    ready, go = threading.Barrier(len(group) + 1), threading.Event()
    threads = [threading.Thread(target=one, args=(host, port, p, O, r, ready, go)) for (_, p), r in zip(group, results)]
    for t in threads:
        t.start()
    ready.wait()
    barrier.wait()
    go.set()
    for t in threads:
        t.join()
    q.put([(i, r) for (i, _), r in zip(group, results)])


def burst(srv, B, P, O, vocab, seed, procs):
    """B requests at once from `procs` client processes (threads within each; the timestamps are
    time.perf_counter, CLOCK_MONOTONIC, the same clock in every process), so that one Python
    process's GIL does not cap the streamed tokens a second the client can see."""
    import multiprocessing
    import random
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(P)] for _ in range(B)]
    n = max(1, min(B, procs))
    groups = [[(i, prompts[i]) for i in range(k, B, n)] for k in range(n)]
    ctx = multiprocessing.get_context("fork")
    q, barrier = ctx.Queue(), ctx.Barrier(n)
    ps = [ctx.Process(target=client_proc, args=(srv.host, srv.port, g, O, q, barrier)) for g in groups]
    for x in ps:
        x.start()
    results = [None] * B
    for _ in ps:
        for i, r in q.get():
            results[i] = r
    for x in ps:
        x.join()
    bad = [r for r in results if not r.get("ok") or len(r["times"]) != O]
    if bad:
        b = bad[0]
        sys.exit(f"bench/serve_gpu.py: {len(bad)} of {B} requests failed or streamed another count than {O} "
                 f"tokens: {b.get('error') or len(b['times'])}")
    return results


def decode_stats(results, P, O):
    ttft = [r["times"][0] - r["start"] for r in results]
    tpot = [(r["times"][-1] - r["times"][0]) / (O - 1) for r in results]
    w0 = max(r["times"][0] for r in results)  # every request has its first token: all decoding
    w1 = min(r["times"][-1] for r in results)  # none has its last yet
    inside = [t for r in results for t in r["times"] if w0 < t <= w1]
    gen = [sum(1 for t in r["times"] if t <= (w0 + w1) / 2) for r in results]  # tokens made by the window's middle
    if w1 - w0 <= 0 or not inside:
        tps = None
    else:
        tps = len(inside) / (w1 - w0)
    return dict(ttft_ms=1e3 * sum(ttft) / len(ttft), tpot_ms=1e3 * sum(tpot) / len(tpot),
                decode_tokens_per_s=tps, window_s=max(0.0, w1 - w0), window_tokens=len(inside),
                mean_context=P + sum(gen) / len(gen))


# ---- the peer: transformers' generate -----------------------------------------------------------------
PEER = r"""
import json, sys, time, torch
cfg, device, batches, P, O, seed = json.loads(sys.argv[1])
import transformers
torch.manual_seed(seed)
if cfg["kind"] == "gpt2":
    c = transformers.GPT2Config(vocab_size=cfg["vocab"], n_positions=cfg["ctx"], n_embd=cfg["d"], n_layer=cfg["layers"],
                                n_head=cfg["heads"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = transformers.GPT2LMHeadModel(c)
else:
    c = transformers.LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["d"], intermediate_size=cfg["hidden"],
                                 num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                                 num_key_value_heads=cfg["kv_heads"], rms_norm_eps=cfg["eps"], rope_theta=cfg["theta"],
                                 max_position_embeddings=cfg["ctx"], tie_word_embeddings=False)
    m = transformers.LlamaForCausalLM(c)
m = m.to(device=device, dtype=torch.float32).eval()
def sync():
    if device == "cuda": torch.cuda.synchronize()
def gen(ids, n):
    sync(); t0 = time.perf_counter()
    out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                     use_cache=True, pad_token_id=0)
    sync(); t = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + n, out.shape
    return t
rows = {}
with torch.inference_mode():
    for B in batches:
        ids = torch.randint(0, cfg["vocab"], (B, P), device=device)
        gen(ids, 2)  # warm-up
        t1, tO = min(gen(ids, 1) for _ in range(2)), gen(ids, O)
        rows[B] = dict(ttft_ms=1e3 * t1, tpot_ms=1e3 * (tO - t1) / (O - 1), tokens_per_s=B * (O - 1) / (tO - t1))
params = sum(p.numel() for p in m.parameters())  # a tied embedding once
print("PEER " + json.dumps(dict(rows=rows, params=params, transformers=transformers.__version__,
                                torch=torch.__version__)))
"""


def peer(py, cfg, ctx, device, batches, P, O, seed):
    """(rows, versions) or (None, why)."""
    probe = subprocess.run([py, "-c", "import torch, transformers"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        return None, f"{py} has no torch or transformers ({probe.stdout.strip().splitlines()[-1]})", None
    arg = json.dumps([dict(cfg, ctx=ctx), device, batches, P, O, seed])
    p = subprocess.run([py, "-c", PEER, arg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("PEER ")]
    if p.returncode != 0 or not line:
        return None, "the peer failed: " + "\n".join(p.stdout.strip().splitlines()[-5:]), None
    r = json.loads(line[-1][5:])
    return {int(k): v for k, v in r["rows"].items()}, f"transformers {r['transformers']}, torch {r['torch']}", r["params"]


# ---- one model --------------------------------------------------------------------------------------------
def bench_model(a, name, spec, work, bw, out):
    mbtc, gendata = os.path.join(a.build, "mbtc"), os.path.join(a.build, "mbt-gendata")
    prog = os.path.join(work, name)
    t0 = time.monotonic()
    # --dry: the CPU alone; on a GPU its architecture alone (NVRTC's time once, not for sm_80 and sm_90)
    arch = ["--cuda-arch=none" if a.dry else f"--cuda-arch={a.arch}"]
    run([mbtc, "-I", os.path.join(ROOT, "examples"), os.path.join(ROOT, SOURCE), "--train", spec["block"], *arch,
         "-o", prog],
        f"mbtc {SOURCE} --train {spec['block']}")
    say(f"  mbtc --train {spec['block']}: {time.monotonic() - t0:.1f} s (measured)")
    data = os.path.join(work, "d", "t_train.bin")
    if not os.path.exists(data):
        run([gendata, "--out-dir", os.path.join(work, "d"), "--name", "t", "--vocab", "1024", "--tokens",
             str(max(20000, 4 * spec["ctx"])), "--val-tokens", "0"], "mbt-gendata")
    weights = prog + ".safetensors"
    run([prog, "train", "--data", data, "--steps", "1", "--device", a.device, "--save-weights", weights],
        f"{name} train --steps 1")
    wbytes, wdtypes = safetensors_bytes(weights)
    P, O, ctx = a.prompt_len, a.output_len, spec["ctx"]
    if P + O > ctx:
        sys.exit(f"bench/serve_gpu.py: prompt {P} + output {O} tokens exceed {name}'s context {ctx}")
    bmax = max(a.batches)
    cmd = [prog, "serve", "--weights", weights, "--port", "0", "--device", a.device, "--batch-seqs", str(bmax),
           "--batch-tokens", str(max(2048, bmax)), "--prefill-chunk", "512"]
    env = dict(os.environ)
    if a.dry:  # the host's pool: kv.memory of 64 MiB, not of the machine's memory (the line of bytes a block stays)
        env["MBT_SERVE_HOST_MEMORY"] = str(64 << 20)
    srv = Server(cmd, env)
    say("  " + "\n  ".join(srv.banner))
    bpt = srv.block_bytes / srv.block
    rec = dict(block=spec["block"], context=ctx, device=srv.device, server_command=cmd, banner=srv.banner,
               weights_bytes={"value": wbytes, "how": f"computed: the safetensors header, stored dtype {wdtypes}"},
               kv_bytes_per_token={"value": bpt, "how": "computed: the start-up line's bytes a block / block"},
               rows=[])
    try:
        burst(srv, 1, P, min(O, 4), spec["hf"]["vocab"], a.seed, 1)  # warm-up
        call_rows = int(srv.metrics()["mbt_serve_engine_call_rows"])
        rec["call_rows"] = {"value": call_rows, "how": "measured: the server's mbt_serve_engine_call_rows"}
        for B in a.batches:
            m0 = srv.metrics()
            s = decode_stats(burst(srv, B, P, O, spec["hf"]["vocab"], a.seed + B, a.client_procs), P, O)
            m1 = srv.metrics()
            steps = m1["mbt_serve_iterations_total"] - m0["mbt_serve_iterations_total"]
            ncalls = m1["mbt_serve_engine_calls_total"] - m0["mbt_serve_engine_calls_total"]
            step_bytes = wbytes + B * s["mean_context"] * bpt
            calls = math.ceil(B / call_rows)
            bound = B * bw / step_bytes
            bound_built = B * bw / (calls * wbytes + B * s["mean_context"] * bpt)
            tps = s["decode_tokens_per_s"]
            rec["rows"].append(dict(
                batch=B,
                ttft_ms={"value": s["ttft_ms"], "how": "measured"},
                tpot_ms={"value": s["tpot_ms"], "how": "measured"},
                decode_tokens_per_s={"value": tps, "how": "measured: tokens streamed in the steady window / its length"},
                window={"seconds": s["window_s"], "tokens": s["window_tokens"], "how": "measured"},
                mean_context={"value": s["mean_context"], "how": "computed: prompt + mean tokens made by the window's middle"},
                bytes_per_step={"value": step_bytes, "how": "computed: weights + B x mean context x KV bytes a token"},
                bound_tokens_per_s={"value": bound, "how": "computed: B x measured bandwidth / bytes a step"},
                fraction_of_bound={"value": tps / bound if tps else None, "how": "computed"},
                bound_as_built_tokens_per_s={"value": bound_built,
                                             "how": f"computed: the weights read once a call, {calls} calls of "
                                                    f"{call_rows} rows"},
                calls_per_step={"value": ncalls / steps if steps else None,
                                "how": f"measured: {int(ncalls)} calls of forward_chunk in {int(steps)} steps"},
            ))
    finally:
        srv.stop()
    if a.no_peer:
        rec["peer"] = {"skipped": "--no-peer"}
    else:
        rows, how, params = peer(a.python, spec["hf"], ctx, "cpu" if a.dry else "cuda", a.batches, P, O, a.seed)
        rec["peer"] = {"rows": rows, "versions": how, "how": "measured"} if rows else {"skipped": how}
        if rows:  # the same configuration: the same parameter count as mbt's f32 weights
            rec["peer"]["params"] = params
            rec["peer"]["same_params"] = params * 4 == wbytes and wdtypes == ["F32"]
            say(f"  the peer ({how}): {params} parameters, mbt's weights {wbytes // 4} f32 values"
                + ("" if rec["peer"]["same_params"] else ": NOT THE SAME MODEL SIZE"))
    out["models"][name] = rec
    table(name, rec, bw)


def fmt(x, f="{:.1f}"):
    return "-" if x is None else f.format(x)


def table(name, rec, bw):
    peer_rows = rec["peer"].get("rows") or {}
    say(f"\n{name}: {rec['block']} on {rec['device']}, context {rec['context']}, weights "
        f"{rec['weights_bytes']['value'] / 1e6:.1f} MB, KV {rec['kv_bytes_per_token']['value']:.0f} B a token; "
        f"bandwidth {bw / 1e9:.0f} GB/s (measured)")
    if not peer_rows:
        say(f"  the peer (transformers' generate): skipped: {rec['peer']['skipped']}")
    say(f"{'B':>4} {'decode tok/s':>13} {'bound tok/s':>12} {'of bound':>9} {'as built':>10} {'calls/step':>10} "
        f"{'TTFT ms':>9} {'TPOT ms':>8} {'HF TTFT ms':>11} {'HF TPOT ms':>11} {'HF tok/s':>9}")
    say(f"{'':>4} {'(measured)':>13} {'(computed)':>12} {'(comp.)':>9} {'(comp.)':>10} {'(meas.)':>10} {'(meas.)':>9} "
        f"{'(meas.)':>8} {'(measured)':>11} {'(measured)':>11} {'(meas.)':>9}")
    for r in rec["rows"]:
        p = peer_rows.get(r["batch"], {})
        fr = r["fraction_of_bound"]["value"]
        say(f"{r['batch']:>4} {fmt(r['decode_tokens_per_s']['value']):>13} {fmt(r['bound_tokens_per_s']['value']):>12} "
            f"{fmt(100 * fr if fr else None, '{:.1f}%'):>9} {fmt(r['bound_as_built_tokens_per_s']['value']):>10} "
            f"{fmt(r['calls_per_step']['value'], '{:.2f}'):>10} "
            f"{fmt(r['ttft_ms']['value'], '{:.2f}'):>9} {fmt(r['tpot_ms']['value'], '{:.2f}'):>8} "
            f"{fmt(p.get('ttft_ms'), '{:.2f}'):>11} {fmt(p.get('tpot_ms'), '{:.2f}'):>11} {fmt(p.get('tokens_per_s')):>9}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--batches", default=None, help="batch sizes (default 1,8,16,32,64,128; --dry 1,4,16)")
    ap.add_argument("--prompt-len", type=int, default=None, help="default 128 (--dry 8)")
    ap.add_argument("--output-len", type=int, default=None, help="default 128 (--dry 48)")
    ap.add_argument("--python", default=sys.executable, help="the python with CUDA torch (and transformers)")
    ap.add_argument("--copy-mib", type=int, default=None, help="the bandwidth copy's size (default 2048; --dry 64)")
    ap.add_argument("--client-procs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="client processes a batch's requests are spread over (default: half the CPUs)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", help="the folder for programs and weights (default BUILD/tmp/serve-gpu)")
    ap.add_argument("--json")
    ap.add_argument("--dry", action="store_true", help="the pipeline on the CPU, toy models; times mean nothing")
    a = ap.parse_args()
    # a deadline's SIGTERM (tools/gpu-check.sh's timeout) unwinds, so that the server is stopped
    # and does not hold the GPU's memory for the parts after this one
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench/serve_gpu.py: terminated"))
    a.batches = [int(x) for x in (a.batches or ("1,4,16" if a.dry else "1,8,16,32,64,128")).split(",")]
    a.prompt_len = a.prompt_len or (8 if a.dry else 128)
    a.output_len = a.output_len or (48 if a.dry else 128)
    a.copy_mib = a.copy_mib or (64 if a.dry else 2048)
    a.device = "cpu" if a.dry else "cuda"
    if a.output_len < 2:
        ap.error("--output-len must be at least 2 (TPOT)")
    models = DRY_MODELS if a.dry else MODELS
    names = a.models.split(",")
    for n in names:
        if n not in models:
            ap.error(f"unknown model '{n}' (gpt2, llama)")
    work = a.work or os.path.join(os.path.abspath(a.build), "tmp", "serve-gpu" + ("-dry" if a.dry else ""))
    os.makedirs(work, exist_ok=True)
    if a.dry:
        bw, dev = bandwidth_host(a.copy_mib), "the host (--dry)"
        spec_bw, spec_what = None, "--dry: the host's memory, not HBM"
        bw_how = f"measured: a {a.copy_mib} MiB bytearray copy on the host, read + write"
    else:
        bw, dev, a.arch = bandwidth_torch(a.python, a.copy_mib)
        if bw is None:
            say(f"SKIP: no GPU bandwidth ({dev}); bench/serve_gpu.py needs a GPU and CUDA torch in --python "
                "(--dry runs it on the CPU)")
            return
        spec_bw, spec_what = spec_for(dev)
        bw_how = f"measured: a {a.copy_mib} MiB device-to-device copy (torch, CUDA events, best of 5 x 10), read + write"
    say(f"bandwidth: {bw / 1e9:.0f} GB/s ({bw_how}) on {dev}; spec: "
        + (f"{spec_bw / 1e9:.0f} GB/s ({spec_what}), measured {100 * bw / spec_bw:.0f}% of it" if spec_bw else spec_what))
    say(f"batches {a.batches}, prompt {a.prompt_len} tokens, output {a.output_len} tokens, f32 weights, greedy")
    out = {"machine": {"host": platform.node(), "device": dev},
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip(),
           "config": {k: v for k, v in vars(a).items()},
           "bandwidth": {"value": bw, "how": bw_how, "spec": spec_bw, "spec_source": spec_what},
           "target": "70% of the bound at batch 64 and above (issue 17)", "models": {}}
    path = a.json or os.path.join(ROOT, "bench", "results", time.strftime("serve-gpu-%Y%m%d-%H%M%S.json"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for n in names:
        say(f"# {n}")
        bench_model(a, n, models[n], work, bw, out)
        with open(path, "w") as f:  # after each model, so that a run cut off by a deadline keeps the first
            json.dump(out, f, indent=1, default=str)
        say(f"wrote {path}")


if __name__ == "__main__":
    main()
