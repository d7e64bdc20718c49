#!/usr/bin/env python3
"""ghost_bn_oracle.py DUMP GHOST: recomputes, in plain Python (double precision, no numpy), the
loss of tests/verify/ghost_bn.mbt's first step from its step dump (the parameters before the
update and the step's batch:x / batch:y) with nn.GhostBatchNorm's ghost batches of GHOST samples
and nn.BatchChannelNorm's formula as docs/stdlib.md writes them, and holds it to the loss the
executable reported (mbt.loss, relative 1e-5). Prints `ok ...` and exits 0 when they agree,
`differs ...` and exits 1 otherwise: with GHOST = 2 (the program's) it must agree, with GHOST = 4
(the whole micro-batch) it must not, which shows the check sees the ghost grouping."""
import json
import math
import struct
import sys

path, ghost = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    raw = f.read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8 : 8 + n])
meta = header.pop("__metadata__")
base = 8 + n


def tensor(name):
    e = header[name]
    lo, hi = e["data_offsets"]
    fmt = {"F32": "f", "I32": "i"}[e["dtype"]]
    flat = list(struct.unpack("<%d%s" % ((hi - lo) // 4, fmt), raw[base + lo : base + hi]))
    shape = e["shape"]
    if len(shape) == 2:
        return [flat[i * shape[1] : (i + 1) * shape[1]] for i in range(shape[0])]
    return flat


def matmul(rows, w):  # rows: list of vectors [din], w: [din][dout]
    dout = len(w[0])
    out = []
    for r in rows:
        acc = [0.0] * dout
        for a, wr in zip(r, w):
            if a != 0.0:
                for j in range(dout):
                    acc[j] += a * wr[j]
        out.append(acc)
    return out


def standardize(rows, eps=1e-5):  # each column over the rows, biased variance
    d = len(rows[0])
    mu = [sum(r[c] for r in rows) / len(rows) for c in range(d)]
    var = [sum((r[c] - mu[c]) ** 2 for r in rows) / len(rows) for c in range(d)]
    return [[(r[c] - mu[c]) / math.sqrt(var[c] + eps) for c in range(d)] for r in rows]


micro, accum, seq = int(meta["mbt.micro"]), int(meta["mbt.accum"]), int(meta["mbt.seq"])
emb, w1, w2 = tensor("emb.weight"), tensor("fc1.weight"), tensor("fc2.weight")
gw, gb = tensor("gbn.weight"), tensor("gbn.bias")
bw, bb, cw, cb = tensor("bcn.batch_weight"), tensor("bcn.batch_bias"), tensor("bcn.weight"), tensor("bcn.bias")
hw, hb = tensor("head.weight"), tensor("head.bias")
xs, ys = tensor("batch:x"), tensor("batch:y")
groups = 8
total = 0.0
for m in range(accum):
    rows = range(m * micro, (m + 1) * micro)
    h = matmul([emb[t] for b in rows for t in xs[b]], w1)  # [micro * seq, hidden], row b * seq + t
    g = []
    for k in range(micro // ghost):  # ghost batch k: samples k * ghost .. , all their positions
        g += standardize(h[k * ghost * seq : (k + 1) * ghost * seq])
    h = [[max(v * gw[c] + gb[c], 0.0) for c, v in enumerate(r)] for r in g]
    h = standardize(matmul(h, w2))  # BCN's batch step over (samples, positions)
    h = [[v * bw[c] + bb[c] for c, v in enumerate(r)] for r in h]
    out = []
    for r in h:  # BCN's channel step: each token's groups of channels
        size = len(r) // groups
        o = []
        for j in range(groups):
            part = r[j * size : (j + 1) * size]
            mu = sum(part) / size
            var = sum((v - mu) ** 2 for v in part) / size
            o += [(v - mu) / math.sqrt(var + 1e-5) for v in part]
        out.append([max(v * cw[c] + cb[c], 0.0) for c, v in enumerate(o)])
    logits = matmul(out, hw)
    ce = 0.0
    targets = [t for b in rows for t in ys[b]]
    for r, t in zip(logits, targets):
        r = [v + hb[c] for c, v in enumerate(r)]
        top = max(r)
        ce += top + math.log(sum(math.exp(v - top) for v in r)) - r[t]
    total += ce / len(targets) / accum
reported = float(meta["mbt.loss"])
err = abs(total - reported) / abs(reported)
verdict = "ok" if err <= 1e-5 else "differs"
print("%s: oracle loss %.8f (ghost %d), executable %.8f, relative error %.2e" % (verdict, total, ghost, reported, err))
sys.exit(0 if verdict == "ok" else 1)
