#!/usr/bin/python3
"""hf_weights.py - Hugging Face weights as they are, read by compiled mbt programs (tests/run.sh's
torch layer, run_hf_weights).

    hf_weights.py names gpt2|llama PLAN.txt
        PLAN.txt is `mbtc examples/gpt2.mbt --train gpt2_cpu --emit=plan` (or llama.mbt's
        llama_cpu): its parameter table must be exactly the names and shapes of Hugging Face's
        GPT2LMHeadModel checkpoint `gpt2` (124M: vocab 50257, 1024 positions, 768 wide, 12 heads,
        12 layers; Conv1D weights [in, out]) less its `h.N.attn.bias` mask buffers, or of a
        LlamaForCausalLM with llama.mbt's configuration (nn.Linear weights [out, in]).

    hf_weights.py check gpt2|llama PROG DIR [--tol 1e-4]
    hf_weights.py ckpt gpt2|llama PROG CKPT_DIR INIT.safetensors [--tol 1e-4]
        PROG is `examples/gpt2.mbt`'s GPT2 (or llama.mbt's Llama) at a tiny size, built by
        `mbtc -I examples tests/torch/hf_gpt2.mbt -o PROG` (hf_llama.mbt): the same model
        definitions, imported. Writes a random state dict with HF's exact names and layouts
        (GPT-2's with the `h.N.attn.bias` and `h.N.attn.masked_bias` buffers HF's checkpoints carry)
        as safetensors in F32, F16 and BF16 with bench/torch_gpt.py's writer, runs
        `PROG generate --weights F --prompt-tokens ... --print-logits`, and compares each prefix's
        logits with a float64 forward written from HF's modeling code (GPT2: LayerNorm, Conv1D
        x @ W + b, the mask taken from the attn.bias buffer, gelu_new; Llama: RMSNorm, rotate_half
        rope, repeat_kv, SwiGLU, untied lm_head) on the same weights as read back from the file
        (F16 and BF16 widened to f32 exactly, as mbt does). The error is max |mbt - ref| /
        max |ref| over all prefixes; each dtype must be within --tol.
        Controls that must fail: a transposed weight is refused with the exact shape message; a
        perturbed weight moves the logits beyond --tol; the reference with a layout mbt's model
        must not have (GPT-2: a square Conv1D weight used as nn.Linear [out, in]; Llama: rope on
        interleaved pairs, query heads grouped by tiling rather than repeat_kv) differs beyond
        --tol. Prints one line per comparison and `hf weights: ok` or `hf weights: FAILED`.
"""
import argparse
import math
import os
import re
import json
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from torch_gpt import load_safetensors, save_safetensors  # noqa: E402

# The tiny sizes of tests/torch/hf_gpt2.mbt and hf_llama.mbt.
TINY = {
    "gpt2": dict(vocab=96, ctx=16, d=32, heads=4, layers=2),
    "llama": dict(vocab=96, d=32, heads=4, kv_heads=2, hidden=64, layers=2, eps=1e-5, theta=10000.0),
}
# The full sizes of examples/gpt2.mbt (HF's `gpt2`) and examples/llama.mbt (its Llama() defaults).
FULL = {
    "gpt2": dict(vocab=50257, ctx=1024, d=768, heads=12, layers=12),
    "llama": dict(vocab=32000, d=512, heads=8, kv_heads=4, hidden=1536, layers=8, eps=1e-5, theta=10000.0),
}
PROMPT = [5, 17, 42, 3, 88, 64, 0, 11, 95, 23, 7, 50, 31, 2]  # 14 tokens, below vocab 96 and ctx 16


# ---- Hugging Face's state dicts (names, shapes) --------------------------------------------------


def hf_gpt2_shapes(c, buffers=True):
    """GPT2LMHeadModel's checkpoint (model.safetensors of `gpt2`): Conv1D weights are [in, out]."""
    d = c["d"]
    out = {"wte.weight": [c["vocab"], d], "wpe.weight": [c["ctx"], d]}
    for i in range(c["layers"]):
        p = f"h.{i}."
        out.update({p + "ln_1.weight": [d], p + "ln_1.bias": [d],
                    p + "attn.c_attn.weight": [d, 3 * d], p + "attn.c_attn.bias": [3 * d],
                    p + "attn.c_proj.weight": [d, d], p + "attn.c_proj.bias": [d],
                    p + "ln_2.weight": [d], p + "ln_2.bias": [d],
                    p + "mlp.c_fc.weight": [d, 4 * d], p + "mlp.c_fc.bias": [4 * d],
                    p + "mlp.c_proj.weight": [4 * d, d], p + "mlp.c_proj.bias": [d]})
        if buffers:  # the causal mask and its fill value: buffers, not weights
            out[p + "attn.bias"] = [1, 1, c["ctx"], c["ctx"]]
            out[p + "attn.masked_bias"] = []
    out.update({"ln_f.weight": [d], "ln_f.bias": [d]})
    return out


def hf_llama_shapes(c):
    """LlamaForCausalLM's checkpoint: nn.Linear weights are [out, in]; lm_head is not tied."""
    d, hd = c["d"], c["d"] // c["heads"]
    out = {"model.embed_tokens.weight": [c["vocab"], d]}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": [d],
                    p + "self_attn.q_proj.weight": [c["heads"] * hd, d],
                    p + "self_attn.k_proj.weight": [c["kv_heads"] * hd, d],
                    p + "self_attn.v_proj.weight": [c["kv_heads"] * hd, d],
                    p + "self_attn.o_proj.weight": [d, c["heads"] * hd],
                    p + "post_attention_layernorm.weight": [d],
                    p + "mlp.gate_proj.weight": [c["hidden"], d],
                    p + "mlp.up_proj.weight": [c["hidden"], d],
                    p + "mlp.down_proj.weight": [d, c["hidden"]]})
    out.update({"model.norm.weight": [d], "lm_head.weight": [c["vocab"], d]})
    return out


def random_state(model, c, seed):
    """Every entry drawn afresh (norm weights around 1, biases around 0, matrices std 0.2 / sqrt(in)),
    so that no weight sits at a value that hides a mistake; GPT-2's buffers as HF holds them."""
    g = torch.Generator().manual_seed(seed)
    shapes = hf_gpt2_shapes(c) if model == "gpt2" else hf_llama_shapes(c)
    sd = {}
    for name, shape in shapes.items():
        if name.endswith("attn.bias") and len(shape) == 4:
            sd[name] = torch.tril(torch.ones(shape[2], shape[3])).view(shape)
        elif name.endswith("attn.masked_bias"):
            sd[name] = torch.tensor(-1e4)
        elif "ln" in name or "norm" in name:
            sd[name] = (1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith(".bias"):
            sd[name] = 0.1 * torch.randn(shape, generator=g)
        elif "wte" in name or "wpe" in name or "embed" in name:
            sd[name] = 0.5 * torch.randn(shape, generator=g)
        else:
            fan_in = shape[0] if model == "gpt2" else shape[1]
            sd[name] = 1.5 / math.sqrt(fan_in) * torch.randn(shape, generator=g)
    return sd


# ---- the references, from HF's modeling code, in float64 ----------------------------------------


def gpt2_forward(sd, c, idx, linear_layout=False):
    """GPT2LMHeadModel.forward: idx [T] -> logits [T, vocab]. linear_layout=True (a control) uses the
    square c_proj weights as nn.Linear's [out, in], which is wrong for Conv1D."""
    w = {k: v.double() for k, v in sd.items()}
    T, d, H = len(idx), c["d"], c["heads"]
    hd = d // H
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (d,), w[p + ".weight"], w[p + ".bias"], 1e-5)

    def conv1d(x, p, square=False):
        W = w[p + ".weight"]
        return x @ (W.t() if (linear_layout and square) else W) + w[p + ".bias"]

    for i in range(c["layers"]):
        p = f"h.{i}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(d, dim=-1)
        q, k, v = (t.view(T, H, hd).transpose(0, 1) for t in (q, k, v))
        att = q @ k.transpose(-1, -2) / math.sqrt(hd)
        mask = w[p + "attn.bias"][0, 0, :T, :T] > 0  # HF's _attn: the buffer is the mask
        att = torch.where(mask, att, torch.tensor(torch.finfo(torch.float64).min, dtype=torch.float64))
        y = (torch.softmax(att, dim=-1) @ v).transpose(0, 1).reshape(T, d)
        x = x + conv1d(y, p + "attn.c_proj", square=True)
        h = conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))  # gelu_new
        x = x + conv1d(h, p + "mlp.c_proj")
    return ln(x, "ln_f") @ w["wte.weight"].t()


def llama_forward(sd, c, idx, interleaved_rope=False, tiled_groups=False):
    """LlamaForCausalLM.forward: idx [T] -> logits [T, vocab]. The two flags are controls: rope on
    interleaved pairs (Meta's original layout, not HF's rotate_half), and query heads mapped to
    key/value heads by tiling instead of HF's repeat_kv."""
    w = {k: v.double() for k, v in sd.items()}
    T, d, H, Hk = len(idx), c["d"], c["heads"], c["kv_heads"]
    hd = d // H

    def rms(x, p):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["eps"]) * w[p]

    inv_freq = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, hd/2]
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()

    def rope(x):  # x [heads, T, hd]
        if interleaved_rope:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            c2, s2 = freqs.cos(), freqs.sin()
            return torch.stack((x1 * c2 - x2 * s2, x1 * s2 + x2 * c2), -1).flatten(-2)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), -1) * sin  # apply_rotary_pos_emb with rotate_half

    x = w["model.embed_tokens.weight"][idx]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        h = rms(x, p + "input_layernorm.weight")
        q = (h @ w[p + "self_attn.q_proj.weight"].t()).view(T, H, hd).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].t()).view(T, Hk, hd).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].t()).view(T, Hk, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        if tiled_groups:
            k, v = k.repeat(H // Hk, 1, 1), v.repeat(H // Hk, 1, 1)
        else:
            k, v = k.repeat_interleave(H // Hk, 0), v.repeat_interleave(H // Hk, 0)  # repeat_kv
        att = q @ k.transpose(-1, -2) / math.sqrt(hd)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = (torch.softmax(att, -1) @ v).transpose(0, 1).reshape(T, d)
        x = x + y @ w[p + "self_attn.o_proj.weight"].t()
        h = rms(x, p + "post_attention_layernorm.weight")
        g = h @ w[p + "mlp.gate_proj.weight"].t()
        x = x + (torch.nn.functional.silu(g) * (h @ w[p + "mlp.up_proj.weight"].t())) @ w[p + "mlp.down_proj.weight"].t()
    return rms(x, "model.norm.weight") @ w["lm_head.weight"].t()


# ---- running the program ------------------------------------------------------------------------


def mbt_logits(prog, weights):
    """[len(PROMPT), vocab] from --print-logits, or (None, stderr) when the program refused."""
    r = subprocess.run([prog, "generate", "--weights", weights, "--prompt-tokens", ",".join(map(str, PROMPT)),
                        "--print-logits", "--threads", "1"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    rows = [[float(v) for v in line.split()] for line in r.stdout.strip().split("\n")]
    return torch.tensor(rows, dtype=torch.float64), r.stderr.strip()


def reference(model, sd, c, **controls):
    fwd = gpt2_forward if model == "gpt2" else llama_forward
    return torch.stack([fwd(sd, c, torch.tensor(PROMPT[:n]), **controls)[-1] for n in range(1, len(PROMPT) + 1)])


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def check(args):
    c, ok = TINY[args.model], True
    os.makedirs(args.dir, exist_ok=True)
    sd = random_state(args.model, c, seed=1234)

    def expect(cond, line):
        nonlocal ok
        print(("ok     " if cond else "FAILED ") + line)
        ok &= bool(cond)

    base = None
    for dtype in ("F32", "F16", "BF16"):
        path = os.path.join(args.dir, f"{args.model}_{dtype.lower()}.safetensors")
        save_safetensors(path, sd, {"format": "pt"}, dtype=dtype)
        read = load_safetensors(path)  # the weights as mbt reads them: widened to f32 exactly
        ref = reference(args.model, read, c)
        got, err = mbt_logits(args.prog, path)
        if got is None:
            expect(False, f"{args.model} {dtype}: the program refused the file: {err}")
            continue
        e = rel_err(got, ref)
        expect(got.shape == ref.shape and e <= args.tol,
               f"{args.model} {dtype}: {len(PROMPT)} prefixes x {c['vocab']} logits, max error {e:.2e} of max |logit| "
               f"{ref.abs().max().item():.3g} (tolerance {args.tol:g})")
        if dtype == "F32":
            base = (read, ref)
            if args.model == "gpt2":
                extra = sum(1 for n in read if n not in hf_gpt2_shapes(c, buffers=False))
                want_note = f"note: {extra} tensors of '{path}' are not parameters of this program and were not read"
                expect(extra > 0 and want_note in err, f"{args.model} F32: the {extra} buffers are skipped with a note ({err})")
        elif base is not None:
            # the rounding to 16 bits matters: the F32 weights' logits are not these
            e32 = rel_err(got, base[1])
            expect(e32 > args.tol, f"control: {dtype} logits differ from the F32 weights' by {e32:.2e} (> {args.tol:g})")
    if base is None:
        print("hf weights: FAILED")
        return 1
    read, ref = base

    # control: a transposed weight is refused, naming both shapes
    name = "h.0.attn.c_attn.weight" if args.model == "gpt2" else "model.layers.0.mlp.gate_proj.weight"
    bad = dict(read)
    bad[name] = read[name].t().contiguous()
    path = os.path.join(args.dir, f"{args.model}_transposed.safetensors")
    save_safetensors(path, bad, {"format": "pt"})
    got, err = mbt_logits(args.prog, path)
    shape = list(read[name].shape)
    want = (f"weights file '{path}' does not fit the program (1 problem): '{name}' is {list(reversed(shape))} "
            f"but the parameter is {shape}")
    expect(got is None and err.endswith(want), f"control: transposed {name} refused ({err})")

    # control: a perturbed weight moves the logits beyond the tolerance
    name = "h.1.mlp.c_proj.weight" if args.model == "gpt2" else "model.layers.1.self_attn.o_proj.weight"
    bad = dict(read)
    bad[name] = read[name].clone()
    bad[name][3, 5] += 0.5
    path = os.path.join(args.dir, f"{args.model}_perturbed.safetensors")
    save_safetensors(path, bad, {"format": "pt"})
    got, err = mbt_logits(args.prog, path)
    e = rel_err(got, ref) if got is not None else 0.0
    expect(got is not None and e > args.tol, f"control: {name}[3, 5] + 0.5 moves the logits by {e:.2e} (> {args.tol:g})")

    # control: a layout the model must not have gives other logits
    if args.model == "gpt2":
        wrong = {"square Conv1D weights as nn.Linear [out, in]": dict(linear_layout=True)}
    else:
        wrong = {"rope on interleaved pairs": dict(interleaved_rope=True),
                 "query heads grouped by tiling, not repeat_kv": dict(tiled_groups=True)}
    got, _ = mbt_logits(args.prog, os.path.join(args.dir, f"{args.model}_f32.safetensors"))
    for what, flags in wrong.items():
        e = rel_err(got, reference(args.model, read, c, **flags))
        expect(e > args.tol, f"control: the reference with {what} differs from mbt by {e:.2e} (> {args.tol:g})")

    print("hf weights: ok" if ok else "hf weights: FAILED")
    return 0 if ok else 1


def ckpt(args):
    """A checkpoint mbt wrote, read by PyTorch: the same logits from model.safetensors, and an
    optimizer state PyTorch's AdamW can take (exp_avg, exp_avg_sq per parameter)."""
    c, ok = TINY[args.model], True

    def expect(cond, line):
        nonlocal ok
        print(("ok     " if cond else "FAILED ") + line)
        ok &= bool(cond)

    step = open(os.path.join(args.ckpt, "latest")).read().splitlines()[0]  # then its state.json's checksum
    d = os.path.join(args.ckpt, step)
    state = json.load(open(os.path.join(d, "state.json")))
    sd = load_safetensors(os.path.join(d, "model.safetensors"))
    init_sd = load_safetensors(args.init)
    buffers = {n: t for n, t in init_sd.items() if n not in sd}  # GPT-2's attn.bias masks: not parameters
    ref = reference(args.model, {**sd, **buffers}, c)
    got, err = mbt_logits(args.prog, os.path.join(d, "model.safetensors"))
    e = rel_err(got, ref) if got is not None else float("inf")
    expect(e <= args.tol, f"{step}: PyTorch's logits from the checkpoint's weights match mbt's: max error {e:.2e} (tolerance {args.tol:g})")
    init = reference(args.model, init_sd, c)
    moved = rel_err(init, ref)
    expect(moved > args.tol, f"control: the initial weights' logits differ from the checkpoint's by {moved:.2e}")
    opt = load_safetensors(os.path.join(d, "optimizer.safetensors"))
    names = state["optimizer"]["state"]
    expect(names == ["m", "v"] and len(opt) == 2 * len(sd), f"optimizer.safetensors holds {names} for all {len(sd)} parameters")
    params = {n: torch.nn.Parameter(t.clone()) for n, t in sd.items()}
    adam = torch.optim.AdamW(params.values(), lr=1e-3)
    for n, p in params.items():
        adam.state[p] = {"step": torch.tensor(float(state["step"])), "exp_avg": opt[n + ".m"].float(),
                         "exp_avg_sq": opt[n + ".v"].float()}
    shapes = all(opt[n + ".m"].shape == t.shape and opt[n + ".v"].shape == t.shape for n, t in sd.items())
    nonneg = all((opt[n + ".v"] >= 0).all().item() for n in sd)
    expect(shapes and nonneg and adam.state_dict()["state"],
           f"AdamW takes the state at step {state['step']}: m and v shaped like their parameters, v >= 0")
    print("ckpt: ok" if ok else "ckpt: FAILED")
    return 0 if ok else 1


def names(args):
    """The parameter table of `mbtc ... --emit=plan` against HF's names and shapes."""
    c = FULL[args.model]
    want = hf_gpt2_shapes(c, buffers=False) if args.model == "gpt2" else hf_llama_shapes(c)
    got = {}
    in_table = False
    with open(args.plan) as f:
        for line in f:
            if line.startswith("parameter "):
                in_table = True
                continue
            if in_table:
                m = re.match(r"^(\S+)\s+f32\[([0-9, ]*)\]\s", line)
                if not m:
                    break
                got[m.group(1)] = [int(v) for v in m.group(2).split(",")] if m.group(2).strip() else []
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    shapes = [f"{n} {got[n]} (HF {want[n]})" for n in want if n in got and got[n] != want[n]]
    print(f"{args.model}: {len(got)} parameters in the plan, {len(want)} in HF's checkpoint (less buffers)")
    for what, items in (("missing", missing), ("not in HF's checkpoint", extra), ("shape differs", shapes)):
        if items:
            print(f"  {what}: {', '.join(items[:10])}{' ...' if len(items) > 10 else ''}")
    ok = got and not missing and not extra and not shapes
    print("hf names: ok" if ok else "hf names: FAILED")
    return 0 if ok else 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("check")
    a.add_argument("model", choices=["gpt2", "llama"])
    a.add_argument("prog")
    a.add_argument("dir")
    a.add_argument("--tol", type=float, default=1e-4)
    b = sub.add_parser("names")
    b.add_argument("model", choices=["gpt2", "llama"])
    b.add_argument("plan")
    k = sub.add_parser("ckpt")
    k.add_argument("model", choices=["gpt2", "llama"])
    k.add_argument("prog")
    k.add_argument("ckpt")
    k.add_argument("init")
    k.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    return {"check": check, "names": names, "ckpt": ckpt}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
