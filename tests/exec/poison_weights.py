"""poison_weights.py IN OUT nan|inf - a copy of safetensors file IN with every F32 value NaN (or +Inf):
the exec layer's gen_gpt case checks that `generate` stops on such weights (gen-nan-weights)."""
import json
import struct
import sys

src, dst, what = sys.argv[1], sys.argv[2], sys.argv[3]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
bad = struct.pack("<f", float(what))
for name, t in header.items():
    if name == "__metadata__" or t["dtype"] != "F32":
        continue
    lo, hi = t["data_offsets"]
    data[lo:hi] = bad * ((hi - lo) // 4)
open(dst, "wb").write(raw[:8 + n] + bytes(data))
