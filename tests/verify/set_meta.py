#!/usr/bin/env python3
"""set_meta.py IN OUT KEY VALUE: copies the safetensors file IN to OUT with its metadata entry KEY
set to the string VALUE (the header rewritten, its length prefix updated; the data unchanged).
The verify layer crafts hostile step dumps with it."""
import json
import struct
import sys

src, dst, key, value = sys.argv[1:5]
with open(src, "rb") as f:
    raw = f.read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8 : 8 + n])
header.setdefault("__metadata__", {})[key] = value
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + raw[8 + n :])
