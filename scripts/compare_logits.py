#!/usr/bin/env python3
"""Compares float32 logits in safetensors files, with the standard library only (runs on the
GPU machine and here alike).

  compare_logits.py ids GOLDEN KEY                -> prints the i32 tensor KEY as 1,2,3
  compare_logits.py diff A[:KEY] B[:KEY] [LIMIT]  -> max|a-b| / max|b|; exit 1 above LIMIT
KEY defaults to 'logits'."""
import array
import json
import struct
import sys


def load(spec):
    path, _, key = spec.partition(":")
    key = key or "logits"
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        meta = header[key]
        begin, end = meta["data_offsets"]
        f.seek(8 + n + begin)
        data = f.read(end - begin)
    values = array.array({"F32": "f", "I32": "i"}[meta["dtype"]])
    values.frombytes(data)
    return values, meta["shape"]


def main():
    if sys.argv[1] == "ids":
        values, _ = load(sys.argv[2] + ":" + sys.argv[3])
        print(",".join(str(v) for v in values))
        return 0
    try:
        a, sa = load(sys.argv[2])
        b, sb = load(sys.argv[3])
    except OSError as e:
        print(f"FAIL: {e}")
        return 1
    limit = float(sys.argv[4]) if len(sys.argv) > 4 else float("inf")
    if sa != sb:
        print(f"shape mismatch {sa} vs {sb}")
        return 1
    err = max(abs(x - y) if x == x else float("inf") for x, y in zip(a, b))
    scale = max(abs(y) for y in b)
    rel = err / scale
    print(f"max|a-b| {err:.3e}  max|b| {scale:.3f}  rel {rel:.3e}  {'ok' if rel <= limit else 'FAIL'} (limit {limit:g})")
    return 0 if rel <= limit else 1


sys.exit(main())
