#!/usr/bin/python3
"""torch_gpt.py - GPT-2 in plain PyTorch, laid out exactly as mbt lays it out: the peer of
`make bench` and the oracle of the correctness tests (docs/bench.md).

Run it with Debian's python3-torch (`/usr/bin/python3`; torch 1.13 on Debian 12).

The model is the one stdlib/nn.mbt builds, parameter for parameter:

  - `Linear(din, dout)` keeps `weight` as [din, dout] (GPT-2's Conv1D layout, y = x @ weight + bias),
    not torch.nn.Linear's [dout, din]; weights start normal(0, 0.02), biases at zero;
  - `LayerNorm(d)`: `weight` (ones) and `bias` (zeros), eps 1e-5, over the last axis;
  - `CausalSelfAttention(d, heads)`: `c_attn` (d -> 3d, split into q, k, v in that order), heads of
    size d / heads, softmax(q k^T / sqrt(hd)) with a causal mask, then `c_proj` (d -> d);
  - `MLP(d, 4d)`: `c_fc`, gelu's tanh approximation (as GPT-2 and mbt's `gelu`), `c_proj`;
  - `GPT2Block`: x + attn(ln_1(x)), then x + mlp(ln_2(x));
  - the model: token embeddings `wte` [vocab, d] plus learned positions `wpe` [ctx, d], the blocks
    `h.0` .. `h.{layers-1}`, `ln_f`, and logits ln_f(x) @ wte^T (tied output layer); the loss is
    cross_entropy's mean over every token.

Parameter names are mbt's dotted checkpoint names: examples/tiny.mbt's TinyGPT declares its
embeddings as parameters (`wte`, `wpe`), examples/gpt2.mbt's GPT2 as nn.Embedding sub-models
(`wte.weight`, `wpe.weight`); `GPT(..., embedding_modules=True)` gives the latter. So
`dict(model.named_parameters())` has the same keys and shapes as the safetensors file an mbt
program writes with `train --save-weights F.safetensors`, and `load_mbt_weights` reads one.

As a library:

    from torch_gpt import GPT, CONFIGS, load_mbt_weights, read_tokens, batch_at, mbt_loss_on_batch
    model = GPT(**CONFIGS["tiny"])
    load_mbt_weights(model, "w.safetensors")
    x, y = batch_at(read_tokens("data/tiny_train.bin"), B=8, T=64, window=0)
    loss = model.loss(x, y)

As a command (the self-check: same loss as the compiled program on the same weights and batch):

    /usr/bin/python3 bench/torch_gpt.py check --config tiny --weights w.safetensors \\
        --data data/tiny_train.bin --batch 8 --seq 64 [--expect 4.158883 --tol 1e-5]

and the PyTorch half of the benchmarks (bench/run.py drives it on the CPU; bench/gpu.py on a GPU
adds `--device cuda`, `--precision bf16`, `--compile` and `--fused`):

    /usr/bin/python3 bench/torch_gpt.py train --config tiny --threads 2 --steps 13 --batch 8 \\
        --seq 64 --global 32 --lr 1e-3 --weight-decay 0.1 --data data/tiny_train.bin --log t.jsonl
"""
import argparse
import contextlib
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# The models of examples/: constructor arguments of GPT.
CONFIGS = {
    # examples/tiny.mbt: TinyGPT(vocab = 64, ctx = 128, d = 128, heads = 4, layers = 4)
    "tiny": dict(vocab=64, ctx=128, d=128, heads=4, layers=4, embedding_modules=False),
    # examples/gpt2.mbt: GPT2(vocab = 50257, ctx = 1024, d = 768, heads = 12, layers = 12)
    "gpt2": dict(vocab=50257, ctx=1024, d=768, heads=12, layers=12, embedding_modules=True),
}

# ---- the model (stdlib/nn.mbt) -------------------------------------------------------------------


class Linear(nn.Module):
    """y = x @ weight + bias, weight [din, dout] (nn.mbt's Linear, GPT-2's Conv1D)."""

    def __init__(self, din, dout, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(din, dout).normal_(0.0, 0.02))
        self.bias = nn.Parameter(torch.zeros(dout)) if bias else None

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.addmm(self.bias, x2, self.weight) if self.bias is not None else x2 @ self.weight
        return y.view(shape)


class Embedding(nn.Module):
    """weight[idx], weight [n, d] (nn.mbt's Embedding)."""

    def __init__(self, n, d):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, d).normal_(0.0, 0.02))

    def forward(self, idx):
        return self.weight[idx]


class LayerNorm(nn.Module):
    """layernorm over the last axis, eps 1e-5 (nn.mbt's LayerNorm)."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class CausalSelfAttention(nn.Module):
    """nn.mbt's CausalSelfAttention: c_attn -> q, k, v; causal softmax(q k^T / sqrt(hd)) v; c_proj."""

    def __init__(self, d, heads, ctx):
        super().__init__()
        assert d % heads == 0
        self.d, self.heads, self.hd = d, heads, d // heads
        self.c_attn = Linear(d, 3 * d)
        self.c_proj = Linear(d, d)
        # a buffer, not a parameter: named_parameters() stays mbt's list
        self.register_buffer("mask", torch.ones(ctx, ctx, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=-1)
        q = q.view(B, T, self.heads, self.hd).transpose(1, 2)  # [B, heads, T, hd]
        k = k.view(B, T, self.heads, self.hd).transpose(1, 2)
        v = v.view(B, T, self.heads, self.hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v  # [B, heads, T, hd]
        y = y.transpose(1, 2).contiguous().view(B, T, d)
        return self.c_proj(y)


class MLP(nn.Module):
    """nn.mbt's MLP: c_proj(gelu(c_fc(x))), gelu's tanh approximation."""

    def __init__(self, d, hidden):
        super().__init__()
        self.c_fc = Linear(d, hidden)
        self.c_proj = Linear(hidden, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    """nn.mbt's GPT2Block: pre-norm attention and MLP, each added to the residual."""

    def __init__(self, d, heads, ctx):
        super().__init__()
        self.ln_1 = LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, ctx)
        self.ln_2 = LayerNorm(d)
        self.mlp = MLP(d, 4 * d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """examples/tiny.mbt's TinyGPT (embedding_modules=False: parameters `wte`, `wpe`) or
    examples/gpt2.mbt's GPT2 (embedding_modules=True: `wte.weight`, `wpe.weight`)."""

    def __init__(self, vocab, ctx, d, heads, layers, embedding_modules=False):
        super().__init__()
        self.vocab, self.ctx, self.embedding_modules = vocab, ctx, embedding_modules
        if embedding_modules:
            self.wte = Embedding(vocab, d)
            self.wpe = Embedding(ctx, d)
        else:
            self.wte = nn.Parameter(torch.empty(vocab, d).normal_(0.0, 0.02))
            self.wpe = nn.Parameter(torch.empty(ctx, d).normal_(0.0, 0.02))
        self.h = nn.ModuleList([GPT2Block(d, heads, ctx) for _ in range(layers)])
        self.ln_f = LayerNorm(d)

    def embeddings(self):
        """(token table [vocab, d], position table [ctx, d])"""
        if self.embedding_modules:
            return self.wte.weight, self.wpe.weight
        return self.wte, self.wpe

    def forward(self, idx):
        """idx: int64 [B, T] -> logits [B, T, vocab]"""
        wte, wpe = self.embeddings()
        T = idx.shape[1]
        x = wte[idx] + wpe[:T]
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ wte.t()

    def loss(self, idx, targets):
        """cross_entropy(model(idx), targets): the mean over every token"""
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---- safetensors (torch 1.13 has no safetensors package) -----------------------------------------

_ST_DTYPES = {"F32": (np.float32, 4), "F64": (np.float64, 8), "F16": (np.float16, 2), "BF16": (np.uint16, 2),
              "I32": (np.int32, 4), "I64": (np.int64, 8)}


def load_safetensors(path):
    """{name: tensor} from a safetensors file: an 8-byte little-endian header length N, N bytes of
    JSON ({name: {dtype, shape, data_offsets}, "__metadata__": {...}}), then the raw data. Floats
    come back as float32 (BF16 widened exactly), integers as int64."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: the header length {n} runs past the end of the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has dtype {dtype}, which this reader does not handle")
        np_dtype, size = _ST_DTYPES[dtype]
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * size or end > len(data):
            raise ValueError(f"{path}: tensor '{name}': {dtype}{shape} does not fit its data_offsets [{begin}, {end})")
        a = np.frombuffer(data[begin:end], dtype=np_dtype).reshape(shape)
        if dtype == "BF16":
            # (1-d first: a 0-d array shifted by a Python int becomes an int64 scalar)
            a = (a.reshape(-1).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(shape)
        elif np.issubdtype(a.dtype, np.floating):
            a = a.astype(np.float32)
        else:
            a = a.astype(np.int64)
        out[name] = torch.from_numpy(np.array(a))
    return out


def save_safetensors(path, tensors, metadata=None, dtype="F32"):
    """Writes {name: float tensor} as F32 safetensors (names sorted, header padded to 8 bytes), a
    file mbt programs read with --init-weights. dtype="F16" or "BF16" rounds every tensor to that
    type (to nearest, ties to even) instead, as Hugging Face's half-precision checkpoints are.
    Integer tensors are written as I32 whatever dtype says (a step dump's batch:x, batch:y)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name in sorted(tensors):
        t = tensors[name].detach()
        if not t.is_floating_point():
            a = t.to(torch.int32).contiguous().cpu().numpy()
            b = a.tobytes()
            header[name] = {"dtype": "I32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
            continue
        t = t.to(torch.float32).contiguous().cpu()
        if dtype == "F32":
            a = t.numpy()
        elif dtype == "F16":
            a = t.numpy().astype(np.float16)
        elif dtype == "BF16":
            a = t.to(torch.bfloat16).view(torch.int16).numpy()
        else:
            raise ValueError(f"save_safetensors: dtype {dtype} is not F32, F16 or BF16")
        b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_mbt_weights(model, path):
    """Copies every parameter of model from an mbt weights file, by its dotted name. A missing
    tensor or another shape is an error; tensors the model does not have are ignored (counted in
    the return value)."""
    tensors = load_safetensors(path)
    params = dict(model.named_parameters())
    for name, p in params.items():
        if name not in tensors:
            raise KeyError(f"{path}: no tensor '{name}' (the file has {len(tensors)} tensors)")
        t = tensors[name]
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{path}: tensor '{name}' is {list(t.shape)} but the parameter is {list(p.shape)}")
        with torch.no_grad():
            p.copy_(t)
    return len([n for n in tensors if n not in params])


# ---- token data (docs/runtime.md, "Token data") --------------------------------------------------


def read_tokens(path):
    """A shard's tokens as int64: llm.c's format (256 int32 header, magic 20240520 with uint16
    tokens or 20240801 with uint32) or raw uint16."""
    raw = np.fromfile(path, dtype=np.uint8)
    head = raw[:1024].view(np.int32) if raw.size >= 1024 else np.zeros(3, np.int32)
    if head[0] == 20240520:
        return raw[1024:].view(np.uint16).astype(np.int64)
    if head[0] == 20240801:
        return raw[1024:].view(np.uint32).astype(np.int64)
    return raw.view(np.uint16).astype(np.int64)


def batch_at(tokens, B, T, window):
    """The batch of windows window .. window+B-1 (window k is tokens kT .. kT+T): x its first T
    tokens, y its last T, as the runtime cuts a shard (int64 [B, T] each)."""
    rows = [tokens[(window + i) * T:(window + i) * T + T + 1] for i in range(B)]
    if any(len(r) < T + 1 for r in rows):
        raise ValueError(f"the data hold fewer than {window + B} windows of {T + 1} tokens")
    a = torch.from_numpy(np.stack(rows))
    return a[:, :T].contiguous(), a[:, 1:].contiguous()


# ---- the self-check ------------------------------------------------------------------------------


def mbt_loss_on_batch(config, weights, data, B, T, window=0, dtype=torch.float32, device="cpu"):
    """The loss of the model `config` (a CONFIGS key or a dict of GPT's arguments) with the mbt
    weights file `weights` on windows window .. window+B-1 of the token file `data`: what
    `./prog eval --weights W --data D --steps 1` computes for window 0. On a GPU in f32 without
    TF32 (see use_device)."""
    cfg = CONFIGS[config] if isinstance(config, str) else config
    use_device(device, tf32=False)
    model = GPT(**cfg)
    load_mbt_weights(model, weights)
    model = model.to(dtype).to(device)
    x, y = batch_at(read_tokens(data), B, T, window)
    with torch.no_grad():
        return float(model.loss(x.to(device), y.to(device)))


def use_device(device, tf32=False):
    """The torch.device for `device` ("cpu", "cuda", "cuda:1"); on a GPU, TF32 for matmuls and
    convolutions on or off (off: f32 GEMMs are computed in f32, as mbt's are)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"torch {torch.__version__}: --device {device}, but torch.cuda.is_available() is False")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return dev


def sync(dev):
    """Waits for the GPU's queued work (a no-op on the CPU): before reading a step's clock."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# ---- the benchmark's PyTorch side ----------------------------------------------------------------


def cosine_lr(step, warmup, total, min_ratio=0.1):
    """stdlib/lr.mbt's cosine multiplier at 0-based step `step`."""
    if step < warmup:
        return (step + 1) / warmup
    if step >= total:
        return min_ratio
    progress = (step - warmup) / max(total - warmup, 1)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(args):
    """Trains `args.steps` optimizer steps the way an mbt program's train loop does (accumulation
    of global / micro micro-batches, each loss scaled by 1 / accumulation, AdamW with decoupled
    weight decay on every parameter, no clipping) and writes each step's wall time to a JSONL
    log in the runtime's format: {"step", "loss", "ms", "tokens", "tokens_per_s"} (and on a GPU
    "max_mem_bytes", torch.cuda.max_memory_allocated). --device cuda runs it on a GPU (the step's
    time then ends with torch.cuda.synchronize), --precision bf16 under torch.autocast(bfloat16)
    with f32 weights and optimizer, --compile the loss function compiled with torch.compile,
    --tf32 lets f32 GEMMs use TF32 (off by default: f32 as mbt computes it)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = use_device(args.device, tf32=args.tf32)
    model = GPT(**CONFIGS[args.config])
    if args.init_weights:
        load_mbt_weights(model, args.init_weights)
    model.to(dev)
    model.train()
    kw = dict(fused=True) if args.fused else dict(foreach=args.foreach)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), eps=1e-8,
                            weight_decay=args.weight_decay, **kw)
    autocast = (lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)) if args.precision == "bf16" \
        else contextlib.nullcontext
    loss_fn = model.loss
    if args.compile:
        if not hasattr(torch, "compile"):
            raise SystemExit(f"torch {torch.__version__} has no torch.compile (it came with 2.0)")
        loss_fn = torch.compile(model.loss)
    tokens = read_tokens(args.data)
    B, T = args.batch, args.seq
    accum = args.global_batch // B
    nwin = (len(tokens) - 1) // T
    tokens_per_step = args.global_batch * T
    window = 0
    log = open(args.log, "w") if args.log else None
    print(f"torch {torch.__version__}: {args.config}, {sum(p.numel() for p in model.parameters()):,} parameters; "
          f"{args.steps} steps of {args.global_batch} x {T} tokens (micro-batch {B}, accumulation {accum}); "
          f"{torch.get_num_threads()} threads; device {dev}, {args.precision}"
          f"{' (TF32 on)' if args.tf32 and dev.type == 'cuda' else ''}{', compiled' if args.compile else ''}; "
          f"AdamW {'fused' if args.fused else 'foreach' if args.foreach else 'single-tensor'}", flush=True)
    for step in range(args.steps):
        t0 = time.perf_counter()
        mult = cosine_lr(step, args.warmup, args.total) if args.cosine else 1.0
        for g in opt.param_groups:
            g["lr"] = args.lr * mult
        losses = []
        for _ in range(accum):
            if window + B > nwin:
                window = 0
            x, y = batch_at(tokens, B, T, window)
            window += B
            with autocast():
                loss = loss_fn(x.to(dev), y.to(dev))
            (loss / accum).backward()
            losses.append(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        ms = (time.perf_counter() - t0) * 1e3
        total = 0.0
        for lm in losses:
            total += lm.item() / accum
        rec = {"step": step + 1, "loss": total, "ms": ms, "tokens": tokens_per_step,
               "tokens_per_s": tokens_per_step / (ms / 1e3)}
        if dev.type == "cuda":
            rec["max_mem_bytes"] = torch.cuda.max_memory_allocated(dev)
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()
        print(f"step {step + 1}/{args.steps}: loss {total:.6f}, {ms:.2f} ms", flush=True)
    if log:
        log.close()
    if args.save_weights:
        save_safetensors(args.save_weights, dict(model.named_parameters()), {"format": "pt"})


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="the loss of mbt weights on the first batch of a token file")
    c.add_argument("--config", choices=sorted(CONFIGS), required=True)
    c.add_argument("--weights", required=True, help="an mbt weights file (train --save-weights)")
    c.add_argument("--data", required=True, help="a token file")
    c.add_argument("--batch", type=int, required=True)
    c.add_argument("--seq", type=int, required=True)
    c.add_argument("--window", type=int, default=0)
    c.add_argument("--expect", type=float, help="mbt's loss on the same batch")
    c.add_argument("--tol", type=float, default=1e-5, help="allowed |torch - expect| (default 1e-5)")
    c.add_argument("--threads", type=int, default=0)
    c.add_argument("--device", default="cpu", help="cpu, or cuda (f32 without TF32)")
    t = sub.add_parser("train", help="the benchmark's PyTorch training run")
    t.add_argument("--config", choices=sorted(CONFIGS), required=True)
    t.add_argument("--threads", type=int, required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--batch", type=int, required=True, help="micro-batch (sequences)")
    t.add_argument("--seq", type=int, required=True)
    t.add_argument("--global", dest="global_batch", type=int, required=True, help="sequences per optimizer step")
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--beta1", type=float, default=0.9)
    t.add_argument("--beta2", type=float, default=0.999)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--cosine", action="store_true", help="lr.cosine(warmup, total) as in the mbt program")
    t.add_argument("--warmup", type=int, default=0)
    t.add_argument("--total", type=int, default=1)
    t.add_argument("--foreach", action="store_true", help="AdamW's multi-tensor path (torch's default is off)")
    t.add_argument("--fused", action="store_true", help="AdamW's fused kernels (torch >= 2.0, on a GPU)")
    t.add_argument("--device", default="cpu", help="cpu (default), or cuda")
    t.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="bf16: the forward and loss under torch.autocast(bfloat16); weights and AdamW stay f32")
    t.add_argument("--compile", action="store_true", help="torch.compile the loss function (torch >= 2.0)")
    t.add_argument("--tf32", action="store_true", help="let f32 GEMMs on a GPU use TF32 (default off)")
    t.add_argument("--data", required=True)
    t.add_argument("--log")
    t.add_argument("--seed", type=int, default=1337)
    t.add_argument("--init-weights")
    t.add_argument("--save-weights")
    a = ap.parse_args(argv)
    if a.cmd == "check":
        if a.threads > 0:
            torch.set_num_threads(a.threads)
        loss = mbt_loss_on_batch(a.config, a.weights, a.data, a.batch, a.seq, a.window, device=a.device)
        if a.expect is None:
            print(f"torch loss {loss:.9f}")
            return 0
        diff = abs(loss - a.expect)
        ok = diff <= a.tol
        print(f"torch loss {loss:.9f}, mbt {a.expect:.9f}, |difference| {diff:.2e} "
              f"({'within' if ok else 'OVER'} {a.tol:g})")
        return 0 if ok else 1
    train(a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
