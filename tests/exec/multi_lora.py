#!/usr/bin/env python3
"""multi_lora.py - nn.MultiLoRALinear's adapters against each trained alone (tests/exec/multi_lora.mbt).

    multi_lora.py split W0 N OUT
        W0 is the multi-adapter program's start (--steps 0 --save-weights): writes OUT{n}.safetensors
        for n < N, the single-adapter program's start for adapter n: every other tensor as it is,
        proj.lora_A.weight and proj.lora_B.weight the slice n of the stacked ones.
    multi_lora.py windows SHARD T B N STEPS OUT
        The windows adapter n sees in the multi-adapter run (shuffle = false, micro = global = B:
        step s reads windows s*B .. s*B+B-1, and rows n*B/N .. of each are adapter n's), written
        one window (T+1 tokens) a raw uint16 shard as OUT{n}/wSSSSS.bin, in the order the alone run
        (micro B/N) reads them, then the 20 x B/N windows it holds out (never trained on).
    multi_lora.py compare W N ALONE0 ALONE1 ... [--tol X]
        The multi-adapter run's final adapters (W) against the alone runs' (ALONEn): slice n of
        proj.lora_A / lora_B against ALONEn's proj.lora_A / lora_B, relative to the largest value,
        within X (1e-5); prints "multi lora: ok ..." or "multi lora: FAILED ..." (exit 1).
    multi_lora.py losses LOG ALONE_LOG0 ALONE_LOG1 ...
        The multi-adapter run's loss at each step (the sum of the adapters' mean losses) against
        the sum of the alone runs' losses, within 1e-5 relative.
"""
import json
import os
import struct
import sys


def read_st(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        raw = blob[8 + n + a : 8 + n + b]
        out[name] = (t["shape"], list(struct.unpack(f"<{len(raw) // 4}f", raw)))
    return out


def write_st(path, tensors):
    header, off, chunks = {"__metadata__": {"format": "pt"}}, 0, []
    for name, (shape, vals) in tensors.items():
        raw = struct.pack(f"<{len(vals)}f", *vals)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        chunks.append(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def slice_of(t, n):
    shape, vals = t
    per = len(vals) // shape[0]
    return shape[1:], vals[n * per : (n + 1) * per]


def fail(msg):
    print(f"multi lora: FAILED: {msg}")
    sys.exit(1)


def main():
    a = sys.argv[1:]
    if a and a[0] == "split":
        w0, n_ad, out = a[1], int(a[2]), a[3]
        w = read_st(w0)
        for n in range(n_ad):
            t = dict(w)
            for k in ("proj.lora_A.weight", "proj.lora_B.weight"):
                t[k] = slice_of(w[k], n)
            write_st(f"{out}{n}.safetensors", t)
    elif a and a[0] == "windows":
        shard, T, B, N, steps, out = a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), a[6]
        with open(shard, "rb") as f:
            blob = f.read()
        magic, _, count = struct.unpack("<3i", blob[:12])
        if magic != 20240520:
            fail(f"{shard} is not an llm.c uint16 shard")
        toks = struct.unpack(f"<{count}H", blob[1024 : 1024 + 2 * count])
        per = B // N
        for n in range(N):
            os.makedirs(f"{out}{n}", exist_ok=True)
            k = 0
            for s in range(steps):
                for j in range(per):
                    win = s * B + n * per + j
                    with open(f"{out}{n}/w{k:05d}.bin", "wb") as f:
                        f.write(struct.pack(f"<{T + 1}H", *toks[win * T : win * T + T + 1]))
                    k += 1
            # the alone run holds out its last 20 x micro windows for evaluation (docs/runtime.md,
            # "Held-out data"), whether or not it evaluates: windows it never trains on
            for j in range(20 * per):
                with open(f"{out}{n}/w{k:05d}.bin", "wb") as f:
                    f.write(struct.pack(f"<{T + 1}H", *toks[:T + 1]))
                k += 1
    elif a and a[0] == "compare":
        tol = 1e-5
        if "--tol" in a:
            i = a.index("--tol")
            tol = float(a[i + 1])
            a = a[:i] + a[i + 2 :]
        w, n_ad, alone = read_st(a[1]), int(a[2]), a[3:]
        if len(alone) != n_ad:
            fail(f"{len(alone)} alone runs for {n_ad} adapters")
        worst_all = 0.0
        for n, path in enumerate(alone):
            s = read_st(path)
            for k in ("proj.lora_A.weight", "proj.lora_B.weight"):
                shape, got = slice_of(w[k], n)
                if s[k][0] != shape:
                    fail(f"adapter {n} {k}: {shape} against {s[k][0]}")
                scale = max(abs(v) for v in s[k][1])
                worst = max(abs(x - y) for x, y in zip(got, s[k][1]))
                if scale == 0 or not worst <= tol * scale:
                    fail(f"adapter {n} {k}: largest difference {worst:.3g} against values up to {scale:.3g}")
                worst_all = max(worst_all, worst / scale)
        print(f"multi lora: ok ({n_ad} adapters; largest relative difference {worst_all:.3g})")
    elif a and a[0] == "losses":
        def losses(p):
            with open(p) as f:
                return [json.loads(line)["loss"] for line in f if '"loss"' in line and '"step"' in line]
        multi, alone = losses(a[1]), [losses(p) for p in a[2:]]
        if not multi or any(len(l) != len(multi) for l in alone):
            fail(f"{len(multi)} steps logged against {[len(l) for l in alone]}")
        worst = 0.0
        for s, m in enumerate(multi):
            want = sum(l[s] for l in alone)
            d = abs(m - want) / abs(want)
            if not d <= 1e-5:
                fail(f"step {s + 1}: loss {m} against the alone runs' sum {want}")
            worst = max(worst, d)
        print(f"multi lora: ok (losses of {len(multi)} steps; largest relative difference {worst:.3g})")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
