"""st_scaled.py A B PREFIX FACTOR - every F32 value of B's tensors named PREFIX... is FACTOR times the
same value of A (to 1e-6 relative, f32 rounding of a few steps), and at least one value is nonzero:
the exec layer's groups case checks that weight decay alone scaled a decayed parameter by
(1 - lr * weight_decay) ^ steps. Exits 0 when it holds, 1 (saying where) when not."""
import json
import struct
import sys


def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        lo, hi = t["data_offsets"]
        out[name] = struct.unpack("<%df" % ((hi - lo) // 4), raw[8 + n + lo:8 + n + hi])
    return out


a, b, prefix, factor = tensors(sys.argv[1]), tensors(sys.argv[2]), sys.argv[3], float(sys.argv[4])
checked = nonzero = 0
for name in sorted(a):
    if not name.startswith(prefix):
        continue
    if name not in b or len(b[name]) != len(a[name]):
        print("%s: missing or of another size in %s" % (name, sys.argv[2]))
        sys.exit(1)
    for i, (x, y) in enumerate(zip(a[name], b[name])):
        if abs(y - factor * x) > 1e-6 * abs(factor * x) + 1e-30:
            print("%s[%d]: %.9g is not %.9g x %.9g" % (name, i, y, factor, x))
            sys.exit(1)
        checked += 1
        nonzero += x != 0
if nonzero == 0:
    print("no nonzero value of a tensor named %s... to compare" % prefix)
    sys.exit(1)
print("%d values of %s... are %.9g x their start" % (checked, prefix, factor))
