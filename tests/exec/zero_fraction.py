#!/usr/bin/env python3
"""zero_fraction.py FILE TENSOR: prints the fraction of TENSOR's F32 values in the safetensors FILE
that are exactly 0, and their count."""
import json
import struct
import sys

path, name = sys.argv[1:3]
with open(path, "rb") as f:
    raw = f.read()
(n,) = struct.unpack("<Q", raw[:8])
t = json.loads(raw[8 : 8 + n])[name]
assert t["dtype"] == "F32", t["dtype"]
begin, end = t["data_offsets"]
vals = struct.unpack("<%df" % ((end - begin) // 4), raw[8 + n + begin : 8 + n + end])
zeros = sum(1 for v in vals if v == 0.0)
print("%.4f of %d values are 0" % (zeros / len(vals), len(vals)))
