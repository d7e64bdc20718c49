#!/usr/bin/env python3
"""peft_adapter.py - checks `./prog train --save-adapter DIR` against what PEFT loads (issue 20).

For tests/exec/lora.mbt's model: logits = head(relu(proj(emb(x)))), proj an nn.LoRALinear. Each
position's logits depend on its own token only, so the compiled program's `generate
--print-logits` lines (one per prompt prefix) are the logits of each prompt token.

    peft_adapter.py rules DIR WEIGHTS LOGITS PROMPT [--alpha A]
        Loads DIR (adapter_config.json, adapter_model.safetensors) by PEFT's rules, written out
        here in plain Python (no torch): keys are base_model.model.<module>.lora_A/B.weight, a
        module is adapted when its name is in target_modules or ends in "." and one of them, its
        rank and alpha are rank_pattern's / alpha_pattern's (matched as `(.*\\.)?KEY$`) or r and
        lora_alpha, and the layer computes W x + lora_B(lora_A(x)) * alpha / r. The base weights
        (emb, proj.base_layer, head) come from WEIGHTS, the program's --save-weights file, as PEFT
        would get them from the base model. The logits of each token of PROMPT must match LOGITS
        to 1e-5 (relative to the largest logit). --alpha A replaces lora_alpha (a control that
        must fail once lora_B has left zero).
    peft_adapter.py peft DIR WEIGHTS LOGITS PROMPT [--alpha A]
        The same with PyTorch and peft themselves: a torch model with nn.Linear `proj`, the base
        weights loaded, then peft.PeftModel.from_pretrained(model, DIR).

    peft_adapter.py config DIR
        Only the loading by PEFT's rules: every tensor's module targeted, its rank (rank_pattern
        or r) the shapes' rank; prints each module's rank and scaling (alpha_pattern or
        lora_alpha over the rank).

Prints "peft adapter: ok ..." and exits 0, or "peft adapter: FAILED ..." and exits 1.
"""
import json
import re
import struct
import sys

PREFIX = "base_model.model."


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            raise SystemExit(f"peft adapter: FAILED: {path}: {name} is {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        raw = blob[8 + n + a : 8 + n + b]
        vals = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        out[name] = (t["shape"], vals)
    return meta, out


def matrix(t):
    shape, vals = t
    rows, cols = shape
    return [vals[r * cols : (r + 1) * cols] for r in range(rows)]


def matvec(m, x):  # m [out, in] (nn.Linear's layout) times x [in]
    return [sum(w * v for w, v in zip(row, x)) for row in m]


def pattern_value(patterns, module, default):
    for key, val in patterns.items():  # peft.utils.other.get_pattern_key's rule
        if re.match(rf"(.*\.)?({key})$", module):
            return val
    return default


def fail(msg):
    print(f"peft adapter: FAILED: {msg}")
    sys.exit(1)


def load_rules(adir, alpha_override):
    with open(f"{adir}/adapter_config.json") as f:
        cfg = json.load(f)
    if cfg.get("peft_type") != "LORA":
        fail(f"peft_type is {cfg.get('peft_type')!r}, not 'LORA'")
    meta, tensors = read_safetensors(f"{adir}/adapter_model.safetensors")
    if meta.get("format") != "pt":
        fail(f"metadata {meta} has no format = pt")
    targets = cfg["target_modules"]
    layers = {}
    for name, t in tensors.items():
        m = re.fullmatch(re.escape(PREFIX) + r"(.+)\.(lora_A|lora_B)\.weight", name)
        if not m:
            fail(f"'{name}' is not a PEFT LoRA key (base_model.model.<module>.lora_A/B.weight)")
        module, which = m.groups()
        if not (module in targets or any(module.endswith("." + t) for t in targets)):
            fail(f"'{module}' is not matched by target_modules {targets}")
        layers.setdefault(module, {})[which] = t
    for module, l in layers.items():
        if set(l) != {"lora_A", "lora_B"}:
            fail(f"'{module}' lacks one of lora_A, lora_B")
        r = pattern_value(cfg.get("rank_pattern") or {}, module, cfg["r"])
        alpha = pattern_value(cfg.get("alpha_pattern") or {}, module, cfg["lora_alpha"])
        if alpha_override is not None:
            alpha = alpha_override
        if l["lora_A"][0][0] != r or l["lora_B"][0][1] != r:
            fail(f"'{module}': lora_A {l['lora_A'][0]} and lora_B {l['lora_B'][0]} do not have rank {r}")
        l["scaling"] = alpha / r
    return cfg, layers


def compare(got, want, what):
    scale = max(abs(v) for row in want for v in row)
    worst = max(abs(g - w) for gr, wr in zip(got, want) for g, w in zip(gr, wr))
    if len(got) != len(want) or any(len(g) != len(w) for g, w in zip(got, want)):
        fail(f"{what}: shapes differ")
    if not worst <= 1e-5 * scale:
        fail(f"{what}: largest difference {worst:.3g} against logits up to {scale:.3g}")
    return worst, scale


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "config":
        _, layers = load_rules(args[1], None)
        print("peft adapter: ok (" + ", ".join(f"{m} r {l['lora_A'][0][0]} scaling {l['scaling']:g}" for m, l in sorted(layers.items())) + ")")
        return
    if len(args) < 5 or args[0] not in ("rules", "peft"):
        raise SystemExit(__doc__)
    mode, adir, wpath, lpath, prompt = args[:5]
    alpha_override = float(args[6]) if len(args) >= 7 and args[5] == "--alpha" else None
    tokens = [int(t) for t in prompt.split(",")]
    with open(lpath) as f:
        want = [[float(v) for v in line.split()] for line in f if line.strip()]
    if len(want) != len(tokens):
        fail(f"{lpath} has {len(want)} lines for {len(tokens)} prompt tokens")
    _, w = read_safetensors(wpath)
    emb, head = matrix(w["emb.weight"]), matrix(w["head.weight"])

    if mode == "rules":
        cfg, layers = load_rules(adir, alpha_override)
        if set(layers) != {"proj"}:
            fail(f"adapted modules {sorted(layers)}, expected ['proj']")
        base = matrix(w["proj.base_layer.weight"])
        A, B, s = matrix(layers["proj"]["lora_A"]), matrix(layers["proj"]["lora_B"]), layers["proj"]["scaling"]
        got = []
        for tok in tokens:
            x = emb[tok]
            y = [b + s * u for b, u in zip(matvec(base, x), matvec(B, matvec(A, x)))]
            got.append(matvec(head, [max(v, 0.0) for v in y]))
        worst, scale = compare(got, want, "PEFT's rules")
        print(f"peft adapter: ok (rules; {len(layers)} layer, r {cfg['r']}, lora_alpha {cfg['lora_alpha']}; "
              f"largest difference {worst:.3g} against logits up to {scale:.3g})")
        return

    import torch  # the torch layer's case: PyTorch and peft themselves
    from peft import PeftModel

    class Adapted(torch.nn.Module):
        def __init__(self, vocab, d):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.proj = torch.nn.Linear(d, d, bias=False)
            self.head = torch.nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            return self.head(torch.relu(self.proj(self.emb(idx))))

    vocab, d = w["emb.weight"][0]
    model = Adapted(vocab, d)
    with torch.no_grad():
        for name, key in (("emb.weight", "emb.weight"), ("proj.weight", "proj.base_layer.weight"), ("head.weight", "head.weight")):
            shape, vals = w[key]
            model.get_parameter(name).copy_(torch.tensor(vals, dtype=torch.float32).reshape(shape))
    if alpha_override is not None:  # the control: the same adapter with another lora_alpha
        import shutil
        import tempfile

        tmp = tempfile.mkdtemp()
        shutil.copy(f"{adir}/adapter_model.safetensors", tmp)
        with open(f"{adir}/adapter_config.json") as f:
            cfg = json.load(f)
        cfg["lora_alpha"] = alpha_override
        with open(f"{tmp}/adapter_config.json", "w") as f:
            json.dump(cfg, f)
        adir = tmp
    pm = PeftModel.from_pretrained(model, adir)
    pm.eval()
    with torch.no_grad():
        got = pm(torch.tensor([tokens])).reshape(len(tokens), -1).double().tolist()
    worst, scale = compare(got, want, "PEFT")
    print(f"peft adapter: ok (peft {__import__('peft').__version__}; largest difference {worst:.3g} "
          f"against logits up to {scale:.3g})")


if __name__ == "__main__":
    main()
