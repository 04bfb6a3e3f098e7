#!/usr/bin/env python3
"""Cut the bundled real subset out of a full SmolLM2 dump (docs/DESIGN.md section 4 layout).

Keeps the given layers and one GQA group (one KV head and the query heads that read it), so
that a fresh clone has real attention vectors for tests, examples and the README's first
command without reading ../shared at run time.

    python3 scripts/make-subset.py --src ../shared/data/smollm2-public-8k \
        --out data/smollm2-8k-subset --layers 9,23 --kv-head 0
"""
import argparse
import json
import os
import shutil

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="9,23")
    ap.add_argument("--kv-head", type=int, default=0)
    a = ap.parse_args()
    with open(os.path.join(a.src, "manifest.json")) as f:
        man = json.load(f)
    layers = [int(x) for x in a.layers.split(",")]
    group = man["n_q_heads"] // man["n_kv_heads"]
    qh = slice(a.kv_head * group, (a.kv_head + 1) * group)
    kh = slice(a.kv_head, a.kv_head + 1)
    os.makedirs(a.out, exist_ok=True)
    for layer in layers:
        for part, heads in [("q", qh), ("qdec", qh), ("k", kh), ("kdec", kh), ("v", kh), ("vdec", kh)]:
            src = os.path.join(a.src, "layer%02d.%s.npy" % (layer, part))
            if os.path.exists(src):
                x = np.load(src)[heads]
                np.save(os.path.join(a.out, "layer%02d.%s.npy" % (layer, part)), np.ascontiguousarray(x))
    for extra in ["prompt_ids.npy", "decode_input_ids.npy", "generated_ids.npy"]:
        if os.path.exists(os.path.join(a.src, extra)):
            shutil.copy(os.path.join(a.src, extra), os.path.join(a.out, extra))
    sub = dict(man)
    sub.update({"layers": layers, "n_q_heads": group, "n_kv_heads": 1,
                "source": man.get("source", man.get("text", "")) +
                " | subset: layers %s, KV head %d and its query heads %d..%d of the full dump"
                % (layers, a.kv_head, qh.start, qh.stop - 1)})
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(sub, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
