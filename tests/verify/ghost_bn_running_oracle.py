#!/usr/bin/env python3
"""ghost_bn_running_oracle.py - plain-Python (double precision, no numpy) checks of
tests/verify/ghost_bn_running.mbt: emb (frozen) -> nn.GhostBatchNorm(16, ghost = 2, momentum =
0.25) -> head, micro-batches of 4 rows of 8 tokens, 2 a step, data read in order (shuffle = false).

  names WEIGHTS                         the weights hold gbn.running_mean and gbn.running_var, f32[16]
  running WEIGHTS DATA STEPS GHOST MODE the buffers after STEPS steps, recomputed from the data and
                                        the (frozen) embedding with ghost batches of GHOST rows;
                                        MODE step: one update per optimizer step from the mean
                                        over the global batch (the documented rule); micro: one
                                        per micro-batch (PyTorch's per forward), for the control
  eval WEIGHTS VAL OUT STATS            the held-out loss of `eval --steps 1` (OUT) recomputed on
                                        the first 8 windows of VAL, normalised by the running
                                        statistics (STATS running) or by each ghost batch's own
                                        (STATS batch, the control)
  generate WEIGHTS TOKEN OUT            the logits `generate --prompt-tokens TOKEN --print-logits`
                                        printed first, from the running statistics

Prints `ok: ...` and exits 0 when the executable's numbers agree, `differs: ...` and exits 1
otherwise."""
import json
import math
import struct
import sys

MICRO, ACCUM, SEQ, D, MOMENTUM, EPS = 4, 2, 8, 16, 0.25, 1e-5


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        fmt = {"F32": "f", "I32": "i"}[e["dtype"]]
        out[name] = (e["shape"], list(struct.unpack("<%d%s" % ((hi - lo) // 4, fmt), raw[8 + n + lo : 8 + n + hi])))
    return out


def tokens(path):  # an llm.c shard: 256 int32 of header (magic, version, count), then uint16 ids
    with open(path, "rb") as f:
        raw = f.read()
    magic, _, count = struct.unpack("<3i", raw[:12])
    assert magic == 20240520, "not an llm.c shard"
    return list(struct.unpack("<%dH" % count, raw[1024 : 1024 + 2 * count]))


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def window(tok, w):  # x and y of window w (rows of SEQ tokens, y shifted by one)
    return tok[w * SEQ : w * SEQ + SEQ], tok[w * SEQ + 1 : w * SEQ + SEQ + 1]


def stats(rows):  # rows: token vectors of one ghost batch -> mean, biased var per channel
    n = len(rows)
    mu = [sum(r[c] for r in rows) / n for c in range(D)]
    var = [sum((r[c] - mu[c]) ** 2 for r in rows) / n for c in range(D)]
    return mu, var


def micro_stat(emb, tok, first, ghost):  # the micro-batch of windows first..first+MICRO-1
    rows = [[emb[t] for t in window(tok, first + b)[0]] for b in range(MICRO)]
    groups = [sum(rows[k : k + ghost], []) for k in range(0, MICRO, ghost)]
    mus, vs = zip(*(stats(g) for g in groups))
    n = ghost * SEQ
    mean = [sum(m[c] for m in mus) / len(groups) for c in range(D)]
    var = [sum(v[c] for v in vs) / len(groups) * n / (n - 1) for c in range(D)]
    return mean, var


def agree(name, got, want, scale_tol):
    scale = max(abs(w) for w in want) or 1.0
    err = max(abs(g - w) for g, w in zip(got, want)) / scale
    return err <= scale_tol, "%s: largest error %.3g of its scale %.3g" % (name, err, scale)


def emb_table(w):
    shape, flat = w["emb.weight"]
    return [flat[i * shape[1] : (i + 1) * shape[1]] for i in range(shape[0])]


def cmd_names(args):
    w = load(args[0])
    bad = [n for n in ("gbn.running_mean", "gbn.running_var") if n not in w or w[n][0] != [D]]
    if bad:
        print("differs: names: missing or misshapen %s" % bad)
        return 1
    print("ok: names gbn.running_mean, gbn.running_var f32[%d] saved with the weights" % D)
    return 0


def cmd_running(args):
    w, tok, steps, ghost, mode = load(args[0]), tokens(args[1]), int(args[2]), int(args[3]), args[4]
    emb = emb_table(w)
    rm, rv = [0.0] * D, [1.0] * D
    for s in range(steps):
        per = [micro_stat(emb, tok, (s * ACCUM + m) * MICRO, ghost) for m in range(ACCUM)]
        if mode == "micro":
            updates = per
        else:  # the statistics pass: the mean over the step's micro-batches, stored as f32
            updates = [([f32(sum(p[0][c] for p in per) / ACCUM) for c in range(D)],
                        [f32(sum(p[1][c] for p in per) / ACCUM) for c in range(D)])]
        for mean, var in updates:
            rm = [f32((1 - MOMENTUM) * rm[c] + MOMENTUM * mean[c]) for c in range(D)]
            rv = [f32((1 - MOMENTUM) * rv[c] + MOMENTUM * var[c]) for c in range(D)]
    ok1, m1 = agree("running_mean", w["gbn.running_mean"][1], rm, 1e-5)
    ok2, m2 = agree("running_var", w["gbn.running_var"][1], rv, 2e-6)
    what = "running (%d steps, ghost %d, per %s): %s; %s" % (steps, ghost, mode, m1, m2)
    print(("ok: " if ok1 and ok2 else "differs: ") + what)
    return 0 if ok1 and ok2 else 1


def forward(w, vecs, mu, var):  # one token vector each: normalised, scaled, the head's logits
    gw, gb = w["gbn.weight"][1], w["gbn.bias"][1]
    (din, vocab), hw = w["head.weight"]
    hb = w["head.bias"][1]
    out = []
    for x in vecs:
        y = [(x[c] - mu[c]) / math.sqrt(var[c] + EPS) * gw[c] + gb[c] for c in range(D)]
        out.append([hb[j] + sum(y[c] * hw[c * vocab + j] for c in range(D)) for j in range(vocab)])
    return out


def cross_entropy(logits, target):
    top = max(logits)
    return math.log(sum(math.exp(v - top) for v in logits)) + top - logits[target]


def cmd_eval(args):
    w, tok, out, how = load(args[0]), tokens(args[1]), args[2], args[3]
    emb = emb_table(w)
    with open(out) as f:
        got = float(next(l for l in f if l.startswith("eval ")).split("loss ")[1].split()[0])
    rm, rv = w["gbn.running_mean"][1], w["gbn.running_var"][1]
    losses = []
    for m in range(ACCUM):  # eval --steps 1: the first global batch, as micro-batches of MICRO rows
        total = 0.0
        for k in range(0, MICRO, 2):  # ghost batches of 2 rows
            wins = [window(tok, m * MICRO + k + b) for b in range(2)]
            vecs = [emb[t] for x, _ in wins for t in x]
            ys = [t for _, y in wins for t in y]
            mu, var = (rm, rv) if how == "running" else stats(vecs)
            total += sum(cross_entropy(l, t) for l, t in zip(forward(w, vecs, mu, var), ys))
        losses.append(total / (MICRO * SEQ))
    want = sum(losses) / len(losses)
    err = abs(got - want)
    ok = err <= 1e-5 * abs(want) + 1e-6
    print("%s: eval loss %.6f, oracle %.9f with the %s statistics (error %.3g)" % ("ok" if ok else "differs", got, want, how, err))
    return 0 if ok else 1


def cmd_generate(args):
    w, token, out = load(args[0]), int(args[1]), args[2]
    emb = emb_table(w)
    with open(out) as f:
        got = [float(v) for v in f.readline().split()]
    want = forward(w, [emb[token]], w["gbn.running_mean"][1], w["gbn.running_var"][1])[0]
    ok, msg = agree("logits", got, want, 1e-5) if len(got) == len(want) else (False, "%d logits" % len(got))
    print(("ok: generate " if ok else "differs: generate ") + msg)
    return 0 if ok else 1


sys.exit({"names": cmd_names, "running": cmd_running, "eval": cmd_eval, "generate": cmd_generate}[sys.argv[1]](sys.argv[2:]))
