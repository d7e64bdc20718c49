"""Packed batches give the same loss and gradients as the same documents run one by one (issue 20).

Writes three llm.c shards for tests/verify/docs.mbt (seq T = 32, EOT = 3, one step of G = 8 rows):
  packed  the documents packed back to back into rows (each row full), then rows of filler
  single  each document alone at the start of its own row, the rest of the row filler (G rows a
          shard, single_0.bin, single_1.bin ...)
  filler  rows of filler only
Every document starts with token S = 5 and ends with EOT; filler is [S, EOT] pairs, and the token
after every row is S, so each document's last token predicts S wherever it stands. With attention
masked at document boundaries and positions restarting, a document's tokens have the same losses
(and gradients) wherever they are packed; a filler pair too. So over a step (the mean over its
G * T tokens), with n_X the number of filler tokens in shard X:
    G T loss(packed) - n_packed loss(filler) = sum over i of G T loss(single_i) - n_single_i loss(filler)
and the same for every gradient. `check` reads the three --dump-step files and compares both sides.

Tolerance: the sides are sums of the same f32 per-token terms in another order (and the filler
term scaled), so they agree to f32 rounding of the step's reductions: 1e-5 relative to the loss,
and for the gradients 1e-5 of the largest term of the sums (G T |grad| plus the filler's part) of
each tensor: the filler's gradient is subtracted from both sides, so they are differences of
larger f32 sums whose rounding is relative to those terms. An unmasked attention misses by far more,
which the case checks with docs_nomask.mbt.
"""
import json
import struct
import sys

import random

T, G, EOT, S = 32, 8, 3, 5


HELD_OUT = 20 * G  # the windows the executable holds out at the tail for eval (eval.steps x global)


def shard(path, rows):
    assert all(len(r) == T for r in rows) and len(rows) == G
    rows = rows + [filler(T)] * HELD_OUT  # training reads the first G rows: one step, every row once
    toks = [t for r in rows for t in r] + [S]  # the token after the last row
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, len(toks)) + b"\0" * (1024 - 12))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def filler(n):
    assert n % 2 == 0
    return [S, EOT] * (n // 2)


def write(out):
    rng = random.Random(20)
    # documents of even length 4..16, packed exactly into rows (a row's lengths sum to T)
    docs, rows = [], []
    for _ in range(4):  # 4 packed rows; the other G - 4 are filler
        row, left = [], T
        while left:
            n = min(left, rng.choice([4, 6, 8, 10, 12, 14, 16]))
            if left - n == 2:  # no 2-token remainder: fold it in
                n = left
            d = [S] + [rng.choice([t for t in range(64) if t not in (S, EOT)]) for _ in range(n - 2)] + [EOT]
            docs.append(d)
            row += d
            left -= n
        rows.append(row)
    packed = rows + [filler(T)] * (G - len(rows))
    shard(f"{out}/packed.bin", packed)
    shard(f"{out}/filler.bin", [filler(T)] * G)
    # one by one: a row each, G rows a shard (a step), as many shards as it takes
    groups = [docs[i:i + G] for i in range(0, len(docs), G)]
    for i, grp in enumerate(groups):
        single = [d + filler(T - len(d)) for d in grp]
        shard(f"{out}/single_{i}.bin", single + [filler(T)] * (G - len(single)))
    json.dump({"groups": [[len(d) for d in grp] for grp in groups]}, open(f"{out}/docs.json", "w"))
    print(f"{len(docs)} documents of lengths {[len(d) for d in docs]}: {len(rows)} packed rows, {len(docs)} single rows "
          f"in {len(groups)} shards")


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    grads = {}
    for k, v in h.items():
        if k.startswith("grad:"):
            a, b = v["data_offsets"]
            grads[k] = struct.unpack(f"<{(b - a) // 4}f", data[a:b])
    return float(h["__metadata__"]["mbt.loss"]), grads


def check(out):
    groups = json.load(open(f"{out}/docs.json"))["groups"]
    GT = G * T
    lp, gp = read(f"{out}/packed.st")
    lf, gf = read(f"{out}/filler.st")
    singles = [read(f"{out}/single_{i}.st") for i in range(len(groups))]
    n_packed = GT - sum(sum(grp) for grp in groups)
    n_single = [GT - sum(grp) for grp in groups]
    lhs = GT * lp - n_packed * lf
    rhs = sum(GT * l - n * lf for (l, _), n in zip(singles, n_single))
    err = abs(lhs - rhs) / abs(rhs)
    print(f"loss: packed {lp:.9g}, one by one {[round(l, 9) for l, _ in singles]}, filler {lf:.9g}")
    print(f"  document tokens' loss sum: packed {lhs:.9g}, one by one {rhs:.9g}, relative error {err:.2e} (tolerance 1e-05)")
    bad = err > 1e-5
    worst = 0.0
    for k in gp:
        l = [GT * p - n_packed * f for p, f in zip(gp[k], gf[k])]
        r = [sum(GT * g[k][j] - n * gf[k][j] for (_, g), n in zip(singles, n_single)) for j in range(len(gf[k]))]
        # the scale of the terms (the filler's gradient is subtracted, so the sides are
        # differences of larger f32 sums: their rounding is relative to those)
        terms = [GT * abs(p) + n_packed * abs(f) for p, f in zip(gp[k], gf[k])]
        scale = max(terms) or 1.0
        e = max(abs(x - y) for x, y in zip(l, r)) / scale
        worst = max(worst, e)
        if e > 1e-5:
            print(f"  {k}: error {e:.2e} over tolerance")
            bad = True
    print(f"  gradients: largest error {worst:.2e} of a tensor's largest term (tolerance 1e-05)")
    print("packing: FAILED" if bad else "packing: ok")
    sys.exit(1 if bad else 0)


def same_row(a, i, b, j):
    """Line i of file a (1-based) and line j of file b are the same logits, to the last digit."""
    ra = open(a).read().splitlines()[int(i) - 1]
    rb = open(b).read().splitlines()[int(j) - 1]
    print("same row" if ra == rb else f"rows differ:\n{ra[:200]}\n{rb[:200]}")
    sys.exit(0 if ra == rb else 1)


if __name__ == "__main__":
    if sys.argv[1] == "same-row":
        same_row(*sys.argv[2:6])
    else:
        {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
