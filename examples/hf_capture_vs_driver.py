"""Compares ``qkindex.hf.capture`` (transformers) with the driver's ``qkindex dump`` of the same
token ids: per layer and tensor, the relative error ||hf - driver|| / ||driver|| (Frobenius)
and the largest |hf - driver| over the largest |driver|.

    qkindex dump --text PROMPT --prefix 512 --layers 0,9,29 --decode 0 --dtype f32 --out DRV
    HF_HUB_OFFLINE=1 python examples/hf_capture_vs_driver.py DRV [--json OUT]
"""

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import qkindex  # noqa: E402
import qkindex.hf as hf  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dump", help="the driver's dump directory (with prompt_ids.npy)")
    p.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--json", default=None)
    a = p.parse_args()
    ref = qkindex.load_dump(a.dump)
    ids = np.load(Path(a.dump) / "prompt_ids.npy").astype(np.int64)[: ref.manifest["n_prefill"]]
    mp = Path(a.model)
    model = AutoModelForCausalLM.from_pretrained(str(mp.parent), gguf_file=mp.name,
                                                 dtype=torch.float32).eval()
    with tempfile.TemporaryDirectory() as tmp:
        dump = hf.capture(model, torch.from_numpy(ids), layers=ref.layers, out=Path(tmp) / "hf")
        rows = []
        for layer in ref.layers:
            for part in ("q", "k", "v"):
                got = getattr(dump, part)(layer).astype(np.float64)
                want = getattr(ref, part)(layer).astype(np.float64)
                fro = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                mx = float(np.abs(got - want).max() / np.abs(want).max())
                rows.append({"layer": layer, "part": part, "rel_err": fro, "max_rel_err": mx})
                print(f"layer {layer:2d} {part}: rel err {fro:.2e}, max |diff| / max |driver| {mx:.2e}")
    worst = max(r["rel_err"] for r in rows)
    print(f"worst relative error {worst:.2e} over {len(ids)} tokens")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"tokens": len(ids), "rows": rows, "worst": worst},
                                           indent=1) + "\n")


if __name__ == "__main__":
    main()
