#!/usr/bin/python3
"""make_corpus_vs.py - writes the seed corpus of the step-dump fuzzer (tests/fuzz/corpus_verify_step/,
fuzz_verify_step): dumps shaped for its fixed program (parameters emb.weight [8, 4], fc.weight
[4, 8], fc.bias [8]; micro-batches of 2 x 4 tokens, 2 a step), one valid and the others each
with one kind of damage --verify-step reports: a metadata entry missing, malformed, zero or
huge (mbt.accum = 2^59 + 1, whose product with micro overflowed), a tensor missing, misshapen
or of an integer dtype, batches of the wrong size. The files are committed; rerun this after
changing it:   /usr/bin/python3 tests/fuzz/make_corpus_vs.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_verify_step")
PARAMS = [("emb.weight", [8, 4]), ("fc.weight", [4, 8]), ("fc.bias", [8])]
META = {"mbt.micro": "2", "mbt.accum": "2", "mbt.seq": "4", "mbt.loss": "2.0794", "mbt.lr": "0.01", "mbt.clip": "1"}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def f32(n, k=0):
    return struct.pack(f"<{n}f", *[((i * 7 + k) % 11 - 5) * 0.01 for i in range(n)])


def dump(meta=None, drop=(), shapes=None, dtypes=None, rows=4):
    meta = dict(META, **(meta or {}))
    meta = {k: v for k, v in meta.items() if v is not None}
    tensors = []
    for name, shape in PARAMS:
        for prefix, k in (("", 0), ("grad:", 1), ("next:", 2)):
            tensors.append((prefix + name, "F32", shape, f32(numel(shape), k)))
    for name in ("batch:x", "batch:y"):
        tensors.append((name, "I32", [rows, 4], struct.pack(f"<{rows * 4}i", *[i % 8 for i in range(rows * 4)])))
    header, data = {"__metadata__": meta}, b""
    for name, dtype, shape, b in tensors:
        if name in drop:
            continue
        shape = (shapes or {}).get(name, shape)
        dtype = (dtypes or {}).get(name, dtype)
        if dtype == "I32" and name[:6] != "batch:":
            b = struct.pack(f"<{numel(shape)}i", *range(numel(shape)))
        b = b[: numel(shape) * 4].ljust(numel(shape) * 4, b"\0")
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


files = {
    "ok": dump(),
    "ok_no_clip": dump({"mbt.clip": "0"}),
    "bad_no_micro": dump({"mbt.micro": None}),
    "bad_accum_zero": dump({"mbt.accum": "0"}),
    "bad_accum_text": dump({"mbt.accum": "two"}),
    "bad_accum_overflow": dump({"mbt.accum": str(2**59 + 1)}),
    "bad_accum_beyond_batches": dump({"mbt.accum": "3"}),
    "bad_seq_other": dump({"mbt.seq": "8"}),
    "bad_micro_other": dump({"mbt.micro": "1"}),
    "bad_loss_missing": dump({"mbt.loss": None}),
    "bad_lr_text": dump({"mbt.lr": "fast"}),
    "bad_no_grad": dump(drop=("grad:fc.bias",)),
    "bad_no_next": dump(drop=("next:emb.weight",)),
    "bad_no_param": dump(drop=("fc.weight",)),
    "bad_no_batch_y": dump(drop=("batch:y",)),
    "bad_param_shape": dump(shapes={"fc.weight": [8, 4]}),
    "bad_param_i32": dump(dtypes={"fc.bias": "I32"}),
    "bad_batch_f32": dump(dtypes={"batch:x": "F32"}),
    "bad_batch_rows": dump(rows=3),
}
os.makedirs(OUT, exist_ok=True)
for name, b in files.items():
    with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
        f.write(b)
