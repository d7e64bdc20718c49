#!/usr/bin/python3
"""oracle.py - the PyTorch oracle of tests/run.sh's torch layer: a compiled mbt program's training
step against the same model written in PyTorch (bench/torch_gpt.py), in f32.

    oracle.py init W.safetensors [--config tiny] [--seed S]
        writes weights for the model: every entry drawn afresh (normal, std 0.05, LayerNorm
        weights around 1 and biases around 0 with std 0.1), so no parameter sits at a value
        that hides a mistake (a zero bias, a unit scale)

    oracle.py check STEP.safetensors [--config tiny] [--loss-tol 1e-5] [--grad-tol 1e-4]
        STEP is what `./prog train --steps 1 --init-weights W --dump-step STEP` wrote: the weights
        the step started from, its token batches, its loss, its accumulated gradients and the
        weights after the update (docs/runtime.md, "Step dumps"). PyTorch runs the same
        micro-batches (each weighted 1 / accum, as the runtime does) and backward; then, given the
        dump's gradients, clip_grad_norm_ and one step of torch.optim.AdamW with the dump's
        learning rate and the program's hyper-parameters. Prints
        the loss error and each parameter's gradient error and update error (largest absolute
        difference relative to the tensor's largest entry; for the update, beyond the f32
        roundings of the stored values (2 ulps: PyTorch stores p twice), relative to the largest
        step), and exits 1 when the loss
        differs by more than --loss-tol or a gradient or update by more than --grad-tol.

    oracle.py step STEP.safetensors OUT.safetensors [--config tiny] [--betas B1 B2] [--eps E] [--weight-decay W]
                   [--control-erf-gelu]
        PyTorch's own step (its gradients, clipping and AdamW update) from STEP's weights and
        batches, written as a step dump: an independent f32 implementation that
        tests/gpu/selftest.sh compares with mbt's at the GPU harness's tolerances.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import torch_gpt  # noqa: E402
from torch_gpt import CONFIGS, GPT, load_mbt_weights, load_safetensors, save_safetensors  # noqa: E402


def metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8")).get("__metadata__", {})


def init(args):
    torch.manual_seed(args.seed)
    model = GPT(**CONFIGS[args.config])
    out = {}
    for name, p in model.named_parameters():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            out[name] = 1.0 + 0.1 * torch.randn(p.shape)
        elif ".ln_" in name or name.startswith("ln_f"):
            out[name] = 0.1 * torch.randn(p.shape)
        else:
            out[name] = 0.05 * torch.randn(p.shape)
    save_safetensors(args.weights, out, {"format": "pt"})
    print(f"wrote {len(out)} tensors to {args.weights}")
    return 0


def rel_error(a, b):
    scale = b.abs().max().item()
    diff = (a.double() - b.double()).abs().max().item()
    return diff / scale if scale > 0 else diff


def torch_step(args, path):
    """PyTorch's forward and backward of the step dump `path`'s micro-batches (each loss weighted
    1 / accum, as the runtime does) from the weights it started from. Returns (dump, metadata,
    model, {name: parameter}, {name: starting value}, loss, {name: gradient before clipping})."""
    if args.control_erf_gelu:
        # the control: GELU's exact form instead of the tanh approximation mbt's gelu computes
        # (they differ by up to ~1e-3); a comparison with mbt's step must then fail
        torch_gpt.MLP.forward = lambda self, x: self.c_proj(torch.nn.functional.gelu(self.c_fc(x)))
    meta = metadata(path)
    dump = load_safetensors(path)
    micro, accum, seq = int(meta["mbt.micro"]), int(meta["mbt.accum"]), int(meta["mbt.seq"])
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = GPT(**CONFIGS[args.config])
    load_mbt_weights(model, path)
    params = dict(model.named_parameters())
    start = {n: p.detach().clone() for n, p in params.items()}
    x, y = dump["batch:x"].long(), dump["batch:y"].long()
    assert x.shape == (micro * accum, seq), f"batch:x is {list(x.shape)}, expected [{micro * accum}, {seq}]"
    loss = 0.0
    for m in range(accum):
        rows = slice(m * micro, (m + 1) * micro)
        lm = model.loss(x[rows], y[rows])
        (lm / accum).backward()
        loss += lm.item() / accum
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    return dump, meta, model, params, start, loss, grads


def adamw_step(args, model, lr, clip):
    """clip_grad_norm_ (when the program clips) and one torch.optim.AdamW step on the parameters'
    .grad, with the program's hyper-parameters (args) and the dump's learning rate."""
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=tuple(args.betas), eps=args.eps,
                            weight_decay=args.weight_decay)
    opt.step()


def step(args):
    """PyTorch's own step - its gradients, its clipping, its AdamW update - from the weights and
    batches of an mbt step dump, written as a step dump (the same tensors and metadata, PyTorch's
    values): an independent f32 implementation of the step, which tests/gpu/selftest.sh holds
    against mbt's with tests/gpu/cmpdump.py's GPU tolerances."""
    dump, meta, model, params, start, loss, grads = torch_step(args, args.step)
    adamw_step(args, model, float(meta["mbt.lr"]), float(meta["mbt.clip"]))
    out = {"batch:x": dump["batch:x"], "batch:y": dump["batch:y"]}
    for n, p in params.items():
        out[n], out["grad:" + n], out["next:" + n] = start[n], grads[n], p.detach()
    save_safetensors(args.out, out, dict(meta, **{"mbt.loss": repr(loss)}))
    print(f"wrote PyTorch's step ({len(params)} parameters, loss {loss:.9g}) to {args.out}")
    return 0


def check(args):
    dump, meta, model, params, start, loss, grads = torch_step(args, args.step)  # grads: before clipping, as the dump's
    micro, accum, seq = int(meta["mbt.micro"]), int(meta["mbt.accum"]), int(meta["mbt.seq"])
    mbt_loss, lr, clip = float(meta["mbt.loss"]), float(meta["mbt.lr"]), float(meta["mbt.clip"])
    # The update is checked on mbt's own gradients: at step 1 AdamW moves each entry by about
    # lr * g / (|g| + eps), so an entry whose gradient is zero in exact arithmetic turns last-bit
    # differences of the two gradients into different steps; fed the same gradients, PyTorch's
    # AdamW and the compiled update must agree.
    for n, p in params.items():
        p.grad.copy_(dump["grad:" + n])
    adamw_step(args, model, lr, clip)

    loss_err = abs(mbt_loss - loss) / abs(loss)
    print(f"torch oracle: {accum} micro-batch(es) of {micro} x {seq} tokens, {len(params)} parameters")
    print(f"  loss: mbt {mbt_loss:.9g}, torch {loss:.9g}, relative error {loss_err:.2e} (tolerance {args.loss_tol:.0e})")
    print(f"  {'parameter':40s} {'grad error':>12s} {'step error':>12s}")
    bad = loss_err > args.loss_tol
    worst_g = worst_s = 0.0
    for name, p in params.items():
        g_err = rel_error(dump["grad:" + name], grads[name])
        new, old, mbt_new = p.detach().double(), start[name].double(), dump["next:" + name].double()
        ulp = torch.from_numpy(np.spacing(np.abs(new.float().numpy()))).double()
        step_scale = (new - old).abs().max().item()
        # torch.optim.AdamW stores p twice in f32 (the decay, then the step), the compiled update
        # once: up to half a unit in the last place each, so 2 ulps of difference are rounding
        excess = ((mbt_new - new).abs() - 2 * ulp).clamp(min=0).max().item()
        s_err = excess / step_scale if step_scale > 0 else excess
        over = g_err > args.grad_tol or s_err > args.grad_tol
        bad |= over
        worst_g, worst_s = max(worst_g, g_err), max(worst_s, s_err)
        print(f"  {name:40s} {g_err:12.2e} {s_err:12.2e}{'  <- over tolerance' if over else ''}")
    print(f"torch oracle: {'FAILED' if bad else 'ok'} (loss error {loss_err:.2e}, largest gradient error {worst_g:.2e}, "
          f"largest update error {worst_s:.2e}; tolerances {args.loss_tol:.0e} and {args.grad_tol:.0e})")
    return 1 if bad else 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("init")
    a.add_argument("weights")
    a.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    a.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("check")
    c.add_argument("step")
    c.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    c.add_argument("--loss-tol", type=float, default=1e-5)
    c.add_argument("--grad-tol", type=float, default=1e-4)
    # stdlib/optim.mbt's adamw with examples/tiny.mbt's settings (its decay is PyTorch AdamW's)
    c.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.999])
    c.add_argument("--eps", type=float, default=1e-8)
    c.add_argument("--weight-decay", type=float, default=0.1)
    c.add_argument("--control-erf-gelu", action="store_true", help="a wrong model, to show the check fails")
    s = sub.add_parser("step", help="PyTorch's own step from a dump's weights and batches, written as a dump")
    s.add_argument("step")
    s.add_argument("out")
    s.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    s.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.999])
    s.add_argument("--eps", type=float, default=1e-8)
    s.add_argument("--weight-decay", type=float, default=0.1)
    s.add_argument("--control-erf-gelu", action="store_true", help="a wrong model, to show a comparison fails")
    args = ap.parse_args(argv)
    return {"init": init, "check": check, "step": step}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
