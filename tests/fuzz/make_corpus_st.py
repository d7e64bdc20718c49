#!/usr/bin/python3
"""make_corpus_st.py - writes the seed corpus of the safetensors fuzzer (tests/fuzz/corpus_st/):
small valid files (every readable dtype, a scalar, an empty tensor, metadata, escaped and UTF-8
names, the padding the reference writer adds) and small invalid ones (each kind of damage the
reader names: truncation, a header length beyond the file, malformed JSON, offsets outside the
data, overlaps, gaps, unknown dtypes, too many dimensions). The files are committed; rerun this
after changing it:   /usr/bin/python3 tests/fuzz/make_corpus_st.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_st")


def raw(header: bytes, data: bytes = b"", length=None, pad=True) -> bytes:
    if pad:
        header += b" " * (-len(header) % 8)
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def st(tensors, meta=None, pad=True):
    """tensors: [(name, dtype, shape, bytes)] laid out in the given order."""
    h, data = {}, b""
    if meta is not None:
        h["__metadata__"] = meta
    for name, dtype, shape, b in tensors:
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    return raw(json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode(), data, pad=pad)


f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
f16 = lambda *v: struct.pack(f"<{len(v)}e", *v)
bf16 = lambda *v: b"".join(struct.pack("<f", x)[2:] for x in v)
i32 = lambda *v: struct.pack(f"<{len(v)}i", *v)
i64 = lambda *v: struct.pack(f"<{len(v)}q", *v)
f64 = lambda *v: struct.pack(f"<{len(v)}d", *v)

F1 = b'{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
files = {
    # ---- valid
    "ok_empty": raw(b"{}"),
    "ok_metadata_only": st([], {"format": "pt", "note": "x"}),
    "ok_scalar": st([("s", "F32", [], f32(42.0))]),
    "ok_all_dtypes": st([("a", "F64", [2], f64(1.5, -2.0)), ("b", "I64", [2], i64(1, -(2**40))),
                         ("c", "F32", [2, 2], f32(1, 2, 3, 4)), ("d", "I32", [3], i32(-1, 0, 7)),
                         ("e", "BF16", [2], bf16(1.0, 3.140625)), ("f", "F16", [2], f16(0.5, 65504.0)),
                         ("g", "U8", [3], b"\x00\x01\xff"), ("h", "BOOL", [2], b"\x01\x00"),
                         ("i", "I8", [1], b"\x80"), ("j", "U16", [1], b"\x01\x02")], {"format": "pt"}),
    "ok_empty_tensor": st([("z", "F32", [0, 5], b""), ("a", "F32", [1], f32(1))]),
    "ok_names": st([("h.0.attn.c_attn.weight", "F32", [1, 3], f32(1, 2, 3)), ("\u00fcnicode \"q\"\n", "F16", [1], f16(2))]),
    "ok_escapes": raw(b'{"a\\u00e9\\ud83d\\ude00\\t":' + F1 + b'}', f32(1)),
    "ok_whitespace": raw(b'{ "a" : { "dtype" : "F32" , "shape" : [ 1 ] , "data_offsets" : [ 0 , 4 ] } }', f32(1)),
    "ok_rank16": st([("r", "F32", [1] * 16, f32(1))]),
    "ok_unpadded": st([("a", "F32", [1], f32(1))], pad=False),
    "ok_gpt2_like": st([("h.0.attn.bias", "F32", [1, 1, 2, 2], f32(1, 0, 1, 1)),
                        ("wte.weight", "F16", [4, 2], f16(*range(8))),
                        ("h.0.attn.c_attn.weight", "BF16", [2, 6], bf16(*[0.25] * 12))], {"format": "pt"}),
    # ---- invalid
    "bad_short": b"\x08\x00\x00",
    "bad_header_cut": raw(b'{"a":' + F1 + b"}", f32(1))[:20],
    "bad_data_cut": raw(b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', f32(1, 2, 3, 4))[:-3],
    "bad_header_beyond_file": raw(b"{}", b"", length=1000),
    "bad_header_huge": raw(b"{}", b"", length=2**40),
    "bad_not_object": raw(b"[]"),
    "bad_unclosed": raw(b'{"a":' + F1, f32(1), pad=False),
    "bad_trailing_comma": raw(b'{"a":' + F1 + b",}", f32(1)),
    "bad_json_garbage": raw(b'{"a":' + F1 + b"} x", f32(1), pad=False),
    "bad_outside_data": raw(b'{"a":{"dtype":"F32","shape":[25],"data_offsets":[0,100]}}', f32(0) * 6),
    "bad_reversed": raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}', f32(0, 0)),
    "bad_overlap": raw(b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
                       b'"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}', f32(*range(6))),
    "bad_gap": raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32(0, 1)),
    "bad_size_mismatch": raw(b'{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}', f32(*range(5))),
    "bad_unknown_dtype": raw(b'{"a":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}}', f32(1)),
    "bad_sub_byte_dtype": raw(b'{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', b"\x00"),
    "bad_too_many_dims": raw(b'{"a":{"dtype":"F32","shape":[' + b",".join([b"1"] * 17) + b'],"data_offsets":[0,4]}}', f32(1)),
    "bad_too_many_elements": raw(b'{"a":{"dtype":"F32","shape":[1073741824,1073741824,1073741824],"data_offsets":[0,4]}}', f32(1)),
    "bad_duplicate_name": raw(b'{"a":' + F1 + b',"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32(1, 2)),
    "bad_metadata_nested": raw(b'{"__metadata__":{"k":{"x":"y"}}}'),
    "bad_lone_surrogate": raw(b'{"\\udc00":' + F1 + b"}", f32(1)),
    "bad_i64_beyond_i32": st([("big", "I64", [2], i64(1, 2**40))]),  # valid file; an i32 read fails
}

os.makedirs(OUT, exist_ok=True)
for name, b in sorted(files.items()):
    with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
        f.write(b)
print(f"wrote {len(files)} files to {OUT}")
