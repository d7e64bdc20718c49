#!/usr/bin/python3
"""cmpdump.py - compares two step dumps of one program (`./prog train --dump-step F`, docs/runtime.md,
"Step dumps"): A, the reference (the CPU's), and B (the GPU's). Needs python3 and numpy only.

    tests/gpu/cmpdump.py A.safetensors B.safetensors [--loss-tol 1e-5] [--grad-tol 1e-5]
                         [--next-tol 1e-6] [--step-tol 1e-4] [--exact] [--plain-next]

What must be equal, bit for bit: the tensor names, dtypes and shapes; the metadata mbt.micro,
mbt.accum, mbt.seq, mbt.lr and mbt.clip (the host computes them); the batches (batch:x, batch:y);
and the weights the step started from (every parameter NAME: both runs initialise them on the host
from the seed, so a difference means the runs did not start from the same place and nothing else
can be compared).

What may differ by rounding (the GPU's reductions - GEMMs, row sums, the gradient norm - add in
another order than the CPU's, and its expf/tanhf/powf are CUDA's, within 1-2 ulp of glibc's), each
with its tolerance (docs/testing.md, "The GPU tests", says why these values):

  loss     |loss_A - loss_B| / |loss_A| <= --loss-tol (1e-5)
  grad:N   max |a - b| / max |a| over the tensor <= --grad-tol (1e-5)
  next:N   the updated weights, entry by entry. An entry's step (next - start) is, besides terms
           the gradient does not enter (weight decay), a function of its gradient g that is odd,
           increasing and concave for g > 0 - AdamW's first step lr g / (|g| + eps), SGD's lr g -
           so it changes relatively by no more than g does relative to the smaller of the two
           gradients, and by at most twice the step when g changes sign. An entry whose gradient
           is zero in exact arithmetic and rounding noise on both devices (the attention key bias,
           which softmax does not see: ~1e-11 against entries of 1e-2) can then step in opposite
           directions; that is not an error of the update. So each entry may differ by
               (--step-tol + w) S,   w = min(2, |g_A - g_B| / min(|g_A|, |g_B|))   (2 on a sign change)
           where S is the largest step of the tensor in A and --step-tol (1e-4) is the update's own
           rounding (1 - beta2^t in f32 multiplies an ulp of powf by 1 / (1 - beta2)), plus
           --next-tol (1e-6) of the tensor's largest |next_A| (the stored values' rounding). The
           error printed is the largest difference beyond (--step-tol + w) S, over max |next_A|;
           entries that differ by more than --next-tol but pass thanks to that term are counted
           ("loose"). The update alone, fed the GPU's own gradients, is held to the reference
           evaluator by `mbtc --verify-step` (tests/gpu/run.sh runs both).

--exact: every tensor and every metadata value must be identical (two runs that must be
bit-identical: reruns, thread counts). --plain-next: next:N by max |a - b| / max |a| alone, with no
allowance (tests/gpu/selftest.sh shows it failing on two correct implementations).

Prints one line per parameter (grad and next errors, loose entries), a `FAIL ...` line for each
tensor or value out of tolerance naming it, and last `cmpdump: ok (...)` or `cmpdump: FAILED (...)`.
Exit status 0 ok, 1 a difference beyond tolerance, 2 the files cannot be compared (not step dumps,
unreadable, or dumps of different programs or batch shapes). """
import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4")}
HEADER_LIMIT = 100_000_000  # the runtime's own reader refuses longer headers
CHUNK = 1 << 22  # entries compared at a time (gpt2's wte has 38.6M: keeps float64 temporaries small)


class DumpError(Exception):
    """A file that is not a step dump this tool can read."""


def read_safetensors(path):
    """(tensors, metadata) of a safetensors file: an 8-byte little-endian header length N, N bytes
    of JSON ({name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}), then the data, each
    tensor at [begin, end) of it. Tensors are read-only numpy arrays mapped from the file (F32 and
    I32, the only dtypes a step dump holds)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DumpError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > HEADER_LIMIT:
                raise DumpError(f"{path}: header length {n} exceeds the limit of {HEADER_LIMIT} bytes")
            raw = f.read(n)
            f.seek(0, 2)
            size = f.tell()
    except OSError as e:
        raise DumpError(f"{path}: {e.strerror or e}") from None
    if len(raw) < n:
        raise DumpError(f"{path}: the header length {n} runs past the end of the file")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DumpError(f"{path}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise DumpError(f"{path}: the header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    base, tensors = 8 + n, {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise DumpError(f"{path}: tensor '{name}' has no dtype, shape and data_offsets") from None
        if dtype not in DTYPES:
            raise DumpError(f"{path}: tensor '{name}' is {dtype}; a step dump holds F32 and I32 only")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= begin <= end) or end - begin != count * DTYPES[dtype].itemsize or base + end > size:
            raise DumpError(f"{path}: tensor '{name}' {dtype}{shape} does not fit its data_offsets [{begin}, {end})")
        if count == 0:
            tensors[name] = np.zeros(shape, DTYPES[dtype])
        else:
            tensors[name] = np.memmap(path, dtype=DTYPES[dtype], mode="r", offset=base + begin, shape=tuple(shape))
    return tensors, meta


def chunks(*arrays):
    """The arrays' flat views, CHUNK entries at a time, as float64."""
    flat = [a.reshape(-1) for a in arrays]
    for i in range(0, flat[0].size, CHUNK):
        yield [np.asarray(f[i:i + CHUNK], dtype=np.float64) for f in flat]


def absmax(a):
    m = 0.0
    for (c,) in chunks(a):
        if c.size:
            m = max(m, float(np.max(np.abs(c))))
    return m


def finite(a):
    return all(bool(np.isfinite(c).all()) for (c,) in chunks(a))


def grad_error(a, b):
    """max |a - b| / (max |a| + 1e-30), and the flat index of the largest difference."""
    scale, worst, at, off = absmax(a), 0.0, 0, 0
    for ca, cb in chunks(a, b):
        if ca.size:
            d = np.abs(ca - cb)
            i = int(np.argmax(d))
            if d[i] > worst:
                worst, at = float(d[i]), off + i
        off += ca.size
    return worst / (scale + 1e-30), at


def next_error(p, na, nb, ga, gb, tol, step_tol, plain=False):
    """The updated weights' error (see the module's docstring): the largest |na - nb| beyond the
    allowance (step_tol + w) S, over (max |na| + 1e-30); its flat index; and the loose entries,
    those that differ by more than tol x max |na| but pass thanks to the allowance. plain: no
    allowance (w = step_tol = 0)."""
    scale = absmax(na)
    big_step = 0.0  # S: the reference's largest step in this tensor
    for cp, ca in chunks(p, na):
        if ca.size:
            big_step = max(big_step, float(np.max(np.abs(ca - cp))))
    tol_abs = tol * scale
    worst, at, off, loose = 0.0, 0, 0, 0
    for ca, cb, cga, cgb in chunks(na, nb, ga, gb):
        if not ca.size:
            continue
        dg = np.abs(cga - cgb)
        small = np.minimum(np.abs(cga), np.abs(cgb))
        with np.errstate(divide="ignore", invalid="ignore"):
            # relative to the smaller gradient; a sign flip or a zero on one side only: 2
            w = np.where(dg == 0, 0.0, np.where(small > 0, np.minimum(2.0, dg / small), 2.0))
        w[np.signbit(cga) != np.signbit(cgb)] = 2.0
        w[dg == 0] = 0.0
        allow = 0.0 if plain else (step_tol + w) * big_step
        diff = np.abs(ca - cb)
        excess = np.maximum(0.0, diff - allow)
        i = int(np.argmax(excess))
        if excess[i] > worst:
            worst, at = float(excess[i]), off + i
        loose += int(np.count_nonzero((diff > tol_abs) & (excess <= tol_abs)))
        off += ca.size
    return worst / (scale + 1e-30), at, loose


def index_str(shape, flat):
    return "[" + ", ".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]" if shape else "[]"


def compare(path_a, path_b, loss_tol, grad_tol, next_tol, step_tol, exact, plain_next=False, out=sys.stdout):
    """Returns the exit status (0, 1) after printing the comparison; raises DumpError (2)."""
    ta, ma = read_safetensors(path_a)
    tb, mb = read_safetensors(path_b)
    for path, m in ((path_a, ma), (path_b, mb)):
        missing = [k for k in ("mbt.loss", "mbt.lr", "mbt.clip", "mbt.micro", "mbt.accum", "mbt.seq") if k not in m]
        if missing:
            raise DumpError(f"{path}: not a step dump (no metadata {', '.join(missing)}): write one with "
                            f"`./prog train --steps 1 --dump-step F`")
    shape_a = tuple(ma[k] for k in ("mbt.micro", "mbt.accum", "mbt.seq"))
    shape_b = tuple(mb[k] for k in ("mbt.micro", "mbt.accum", "mbt.seq"))
    if shape_a != shape_b:
        raise DumpError(f"the dumps are of other batches: {path_a} micro {shape_a[0]} x accumulation {shape_a[1]} "
                        f"x seq {shape_a[2]}, {path_b} micro {shape_b[0]} x accumulation {shape_b[1]} x seq {shape_b[2]}")
    if set(ta) != set(tb):
        only_a, only_b = sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
        raise DumpError(f"the dumps hold other tensors (different programs?): only in {path_a}: "
                        f"{', '.join(only_a[:5]) or '-'}; only in {path_b}: {', '.join(only_b[:5]) or '-'}")
    params = [n for n in ta if ":" not in n]
    for n in params:
        if "grad:" + n not in ta or "next:" + n not in ta:
            raise DumpError(f"{path_a}: parameter '{n}' has no grad:{n} or next:{n}: not a step dump")
    for n in ta:
        if ta[n].dtype != tb[n].dtype or ta[n].shape != tb[n].shape:
            raise DumpError(f"tensor '{n}' is {ta[n].dtype}{list(ta[n].shape)} in {path_a} but "
                            f"{tb[n].dtype}{list(tb[n].shape)} in {path_b} (different programs?)")

    fails = []

    def fail(what, why):
        fails.append(what)
        print(f"FAIL {what}: {why}", file=out)

    print(f"cmpdump: {path_a} (A, reference) vs {path_b} (B): {len(params)} parameters, accumulation "
          f"{ma['mbt.accum']} x micro-batch {ma['mbt.micro']} x {ma['mbt.seq']} tokens"
          + ("; exact" if exact else ""), file=out)

    # the inputs and what the host computed: identical
    for k in ("mbt.lr", "mbt.clip") + (("mbt.loss",) if exact else ()):
        if ma[k] != mb[k]:
            fail(f"metadata {k}", f"A {ma[k]}, B {mb[k]} (must be identical)")
    for n in ("batch:x", "batch:y") + tuple(params):
        if not np.array_equal(ta[n], tb[n]):
            d = absmax(np.asarray(ta[n], np.float64) - np.asarray(tb[n], np.float64)) if ta[n].size else 0
            fail(n, f"differs (largest |A - B| {d:.3g}): the runs did not start from the same "
                    f"{'batch' if n.startswith('batch:') else 'weights'}, so the step cannot be compared")

    # the loss
    la, lb = float(ma["mbt.loss"]), float(mb["mbt.loss"])
    loss_err = abs(la - lb) / abs(la) if la != 0 else abs(lb)
    if not (np.isfinite(la) and np.isfinite(lb)):
        fail("loss", f"not finite: A {ma['mbt.loss']}, B {mb['mbt.loss']}")
    elif not exact and not loss_err <= loss_tol:
        fail("loss", f"A {la:.9g}, B {lb:.9g}: relative error {loss_err:.2e} > {loss_tol:.0e}")
    print(f"  loss: A {la:.9g}, B {lb:.9g}, relative error {loss_err:.2e}"
          + ("" if exact else f" (tolerance {loss_tol:.0e})"), file=out)

    # the gradients and the updated weights
    if not exact:
        print(f"  {'parameter':40s} {'shape':>16s} {'grad error':>11s} {'next error':>11s} {'loose':>7s}", file=out)
    worst_g = worst_n = (0.0, "-")
    nloose = 0
    for n in params:
        g, nx = "grad:" + n, "next:" + n
        if exact:
            for t in (g, nx):
                if not np.array_equal(ta[t], tb[t]):
                    e, at = grad_error(ta[t], tb[t])
                    fail(t, f"not identical: max |A - B| / max |A| = {e:.3g} at {index_str(ta[t].shape, at)} "
                            f"(A {ta[t].reshape(-1)[at]:.9g}, B {tb[t].reshape(-1)[at]:.9g})")
            continue
        bad = [t for t in (g, nx) for arr in (ta[t], tb[t]) if not finite(arr)]
        if bad:
            fail(bad[0], "holds a NaN or an infinity" + (" (in A, the reference)" if not finite(ta[bad[0]]) else ""))
            continue
        ge, gat = grad_error(ta[g], tb[g])
        ne, nat, lc = next_error(ta[n], ta[nx], tb[nx], ta[g], tb[g], next_tol, step_tol, plain_next)
        nloose += lc
        flag = ""
        if not ge <= grad_tol:
            flag = "  <- grad"
            fail(g, f"max |A - B| / max |A| = {ge:.3e} > {grad_tol:.0e} at {index_str(ta[g].shape, gat)} "
                    f"(A {ta[g].reshape(-1)[gat]:.9g}, B {tb[g].reshape(-1)[gat]:.9g}, max |A| {absmax(ta[g]):.4g})")
        if not ne <= next_tol:
            flag += "  <- next"
            fail(nx, f"max excess |A - B| / max |A| = {ne:.3e} > {next_tol:.0e} at {index_str(ta[nx].shape, nat)} "
                     f"(start {ta[n].reshape(-1)[nat]:.9g}, A {ta[nx].reshape(-1)[nat]:.9g}, "
                     f"B {tb[nx].reshape(-1)[nat]:.9g}; its gradient A {ta[g].reshape(-1)[nat]:.6g}, "
                     f"B {tb[g].reshape(-1)[nat]:.6g})")
        if ge > worst_g[0]:
            worst_g = (ge, n)
        if ne > worst_n[0]:
            worst_n = (ne, n)
        print(f"  {n:40s} {str(list(ta[n].shape)):>16s} {ge:11.2e} {ne:11.2e} {lc:7d}{flag}", file=out)

    if exact:
        summary = f"{'identical' if not fails else 'not identical'}: {len(ta)} tensors and the metadata"
    else:
        summary = (f"loss error {loss_err:.2e}, largest gradient error {worst_g[0]:.2e} ({worst_g[1]}), largest "
                   f"update error {worst_n[0]:.2e} ({worst_n[1]}), {nloose} loose entries; tolerances loss "
                   f"{loss_tol:.0e}, grad {grad_tol:.0e}, next {next_tol:.0e} + {step_tol:.0e} of the step")
    if fails:
        shown = ", ".join(fails[:8]) + (f" and {len(fails) - 8} more" if len(fails) > 8 else "")
        print(f"cmpdump: FAILED: {shown} ({summary})", file=out)
        return 1
    print(f"cmpdump: ok ({summary})", file=out)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description="compare two step dumps of one program (A the reference)",
                                 epilog="exit status: 0 ok, 1 beyond tolerance, 2 cannot compare")
    ap.add_argument("a", help="the reference dump (the CPU's)")
    ap.add_argument("b", help="the dump compared with it (the GPU's)")
    ap.add_argument("--loss-tol", type=float, default=1e-5, help="relative loss error (default 1e-5)")
    ap.add_argument("--grad-tol", type=float, default=1e-5,
                    help="max |a - b| / max |a| of each gradient (default 1e-5)")
    ap.add_argument("--next-tol", type=float, default=1e-6,
                    help="the updated weights' error beyond what their gradients explain (default 1e-6)")
    ap.add_argument("--step-tol", type=float, default=1e-4,
                    help="how much an entry's step may differ relatively whatever its gradient (default 1e-4)")
    ap.add_argument("--exact", action="store_true", help="every tensor and value must be identical")
    ap.add_argument("--plain-next", action="store_true",
                    help="compare next:N by max |a - b| / max |a| alone, without the allowance for entries whose "
                         "gradients differ relatively (shows why the allowance is there: tests/gpu/selftest.sh)")
    a = ap.parse_args(argv)
    try:
        return compare(a.a, a.b, a.loss_tol, a.grad_tol, a.next_tol, a.step_tol, a.exact, a.plain_next)
    except DumpError as e:
        print(f"cmpdump: cannot compare: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
