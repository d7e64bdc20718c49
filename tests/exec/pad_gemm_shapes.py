"""pad_gemm_shapes.py FILE NAME:D0,D1 ... - the exec layer's check (tests/exec/pad_gemm.mbt) that a
safetensors file written by a program with padded parameters holds them with the program's
shapes: prints `shapes ok` and exits 0 when each NAME has exactly the shape given, else names the
first that does not and exits 1."""
import json
import struct
import sys


def main():
    path = sys.argv[1]
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    for want in sys.argv[2:]:
        name, dims = want.split(":")
        shape = [int(d) for d in dims.split(",")]
        got = header.get(name, {}).get("shape")
        if got != shape:
            print(f"{name}: shape {got} in {path}, want {shape}")
            return 1
    print("shapes ok: " + " ".join(sys.argv[2:]))
    return 0


sys.exit(main())
