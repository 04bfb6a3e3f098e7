#!/usr/bin/env python3
"""Reference values of dequantized GGUF tensors, computed by the `gguf` Python package (ggml's own
reader and numpy dequantizers, independent of the driver's Rust code), for driver/tests/gguf_reference.rs.

    python3 -m pip install gguf numpy
    python3 scripts/gguf-reference.py models/gemma-3-270m-q4_k_m.gguf > driver/tests/fixtures/gemma3-dequant.json

For each named tensor: its ggml type, element count, the first 256 values, every 997th value, and
the sum and sum of squares (float64) of all values.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

TENSORS = [
    "blk.0.attn_k.weight",        # Q5_0
    "blk.0.attn_output.weight",   # Q4_K
    "blk.0.ffn_down.weight",      # Q6_K
    "blk.0.attn_v.weight",        # Q8_0
    "blk.17.ffn_down.weight",
    "blk.11.attn_q.weight",
    "blk.0.attn_q_norm.weight",   # F32
]


def main(path):
    reader = GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}
    out = {"file": path.split("/")[-1], "tensors": []}
    for name in TENSORS:
        t = by_name[name]
        x = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
        out["tensors"].append({
            "name": name,
            "type": t.tensor_type.name,
            "n": int(x.size),
            "head": [float(v) for v in x[:256]],
            "stride": 997,
            "sampled": [float(v) for v in x[::997]],
            "sum": float(x.sum()),
            "sum_sq": float((x * x).sum()),
        })
    json.dump(out, sys.stdout, indent=None)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
