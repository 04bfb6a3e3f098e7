# %% [markdown]
# # qkindex quickstart: top-k attention keys from a real model
#
# Loads a dump of SmolLM2-135M's post-RoPE queries and keys (the bundled subset by default, or
# a dump directory given as the first argument), builds an `AttentionIndex` and, for
# comparison, an `HnswIndex` per query head, searches the decode-step queries and compares with
# the exact top-100: recall@100, the fraction of keys scanned, and the softmax mass kept.
# Saves a plot of recall against scanned.
#
#     MPLBACKEND=Agg python examples/notebook_quickstart.py [DUMP] [--layers 9,23] [--heads 0,1,2]
#
# Cells are marked `# %%` (VS Code / Jupytext open the file as a notebook).

# %%
import argparse
import time
from pathlib import Path

import numpy as np

import qkindex

REPO = Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd()
parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("dump", nargs="?", default=str(REPO / "data" / "smollm2-8k-subset"))
parser.add_argument("--layers", default=None, help="comma-separated model layers (default: all)")
parser.add_argument("--heads", default=None, help="comma-separated query heads (default: all)")
parser.add_argument("--ef", default="100,128,160,256,512", help="candidate list sizes to sweep")
parser.add_argument("--k", type=int, default=100)
parser.add_argument("--out", default="quickstart-out", help="where the plot goes")
args, _ = parser.parse_known_args()  # tolerate a notebook kernel's own arguments

# %% Load the dump: queries and keys are [heads, tokens, head_dim] float32 arrays.
dump = qkindex.load_dump(args.dump)
m = dump.manifest
print(dump)
layers = [int(x) for x in args.layers.split(",")] if args.layers else dump.layers
heads = [int(x) for x in args.heads.split(",")] if args.heads else list(range(m["n_q_heads"]))
efs = [int(x) for x in args.ef.split(",")]
group = m["n_q_heads"] // m["n_kv_heads"]

# %% Build one index per query head and sweep ef.
rows = []
for layer in layers:
    q, k, qdec = dump.q(layer), dump.k(layer), dump.qdec(layer)
    for head in heads:
        kv = dump.kv_head_of(head)
        # Keys as the model keeps them (float16); training queries: the prefill queries of
        # every query head that reads this KV head, this head's own last.
        keys = k[kv].astype(np.float16)
        others = [h for h in range(kv * group, (kv + 1) * group) if h != head]
        train = np.concatenate([q[h] for h in others] + [q[head]])
        queries = qdec[head]
        exact_ids, _ = qkindex.exact_topk(queries, keys, args.k)
        exact_mass = qkindex.attention_mass(queries, keys, exact_ids)

        # The query-aware graph (built from the queries' top-k) against HNSW on the MIPS->L2
        # reduction (built from key-key closeness only).
        builders = {
            "attention": lambda: qkindex.AttentionIndex.build(keys, train),
            "hnsw": lambda: qkindex.HnswIndex.build(keys, m=16, ef_construction=200),
        }
        for name, build in builders.items():
            t = time.perf_counter()
            index = build()
            build_s = time.perf_counter() - t
            for ef in efs:
                if ef < args.k:
                    continue
                res = index.search(queries, k=args.k, ef=ef)
                rows.append({
                    "index": name, "layer": layer, "head": head, "ef": ef,
                    "recall": qkindex.recall(res.ids, exact_ids),
                    "scanned": float(res.distance_computations.mean()) / len(keys),
                    "mass_ratio": qkindex.attention_mass(queries, keys, res.ids) / exact_mass,
                    "build_s": build_s,
                })

# %% The table: recall@k against the fraction of keys scanned.
print(f"\n{'index':<10} {'layer':>5} {'head':>4} {'ef':>5} {'recall':>7} {'scanned':>8} {'mass':>6} {'build_s':>8}")
for r in rows:
    print(f"{r['index']:<10} {r['layer']:>5} {r['head']:>4} {r['ef']:>5} {r['recall']:>7.3f} "
          f"{r['scanned']:>8.3f} {r['mass_ratio']:>6.3f} {r['build_s']:>8.2f}")

# %% Plot recall against scanned, one line per (index, layer, head). Headless runs set
# MPLBACKEND=Agg.
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 4))
for key in sorted({(r["index"], r["layer"], r["head"]) for r in rows}):
    pts = [r for r in rows if (r["index"], r["layer"], r["head"]) == key]
    ax.plot([r["scanned"] for r in pts], [r["recall"] for r in pts], "o-",
            label=f"{key[0]} L{key[1]} H{key[2]}")
ax.axhline(0.95, color="grey", lw=0.8, ls="--")
ax.set_xlabel("fraction of keys scanned")
ax.set_ylabel(f"recall@{args.k}")
ax.set_title(f"{m['model'].split(' ')[0]}: decode queries, {len(keys)} keys")
ax.legend(fontsize=7)
ax.grid(alpha=0.3)
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "recall_vs_scanned.png", dpi=120, bbox_inches="tight")
print(f"\nsaved {out / 'recall_vs_scanned.png'}")
