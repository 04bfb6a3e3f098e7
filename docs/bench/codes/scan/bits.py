"""Issue 26: which code family for the scans, by measurement. Recall@100 (q2k, against the exact
f32 top-100) of a scan that ranks every key by its code estimate and re-ranks the best C exactly,
for int8, 4-bit and 1-bit codes, every head of a dump.

- int8: affine per dimension, one scale per key (the shipped `codes=i8`).
- int4: the same normalisation, 16 levels per dimension.
- 1-bit: RaBitQ-style: keys centred on their mean, rotated by a random-sign Hadamard matrix,
  one sign bit per dimension; estimate <q, c> + |k - c| <q_rot, sign(k_rot)> / (sqrt(d) <k_rot/|k_rot|, sign/sqrt(d)>).

usage: python3 bits.py DUMP [C,C,...]"""
import json
import sys

import numpy as np

d_ = sys.argv[1]
cs = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "100,125,200,400,800").split(",")]
m = json.load(open(d_ + "/manifest.json"))
g = m["n_q_heads"] // m["n_kv_heads"]
rng = np.random.default_rng(0)


def topk(s, k):
    return np.argpartition(-s, k - 1, axis=1)[:, :k]


def affine_levels(K, levels):
    lo, hi = K.min(0, keepdims=True), K.max(0, keepdims=True)
    o, r = (hi + lo) / 2, np.maximum((hi - lo) / 2, 1e-30)
    X = (K - o) / r
    half = (levels - 1) / 2
    s = np.abs(X).max(1, keepdims=True) / half
    s[s == 0] = 1
    return np.clip(np.round(X / s), -half, half) * s * r + o


def hadamard(d):
    H = np.array([[1.0]])
    while H.shape[0] < d:
        H = np.block([[H, H], [H, -H]])
    return H / np.sqrt(d)


def rabitq_scores(Q, K):
    d = K.shape[1]
    R = hadamard(d) * rng.choice([-1, 1], size=d)[None, :]
    c = K.mean(0, keepdims=True)
    X = (K - c) @ R
    norm = np.linalg.norm(X, axis=1, keepdims=True)
    b = np.sign(X)
    b[b == 0] = 1
    b /= np.sqrt(d)
    ip = (X / np.maximum(norm, 1e-30) * b).sum(1, keepdims=True)  # <o, o_bar>
    return Q @ c.T + (Q @ R) @ (b * norm / np.maximum(ip, 1e-30)).T


res = {}
for L in m["layers"]:
    k = np.load(f"{d_}/layer{L:02d}.k.npy").astype(np.float32)
    q = np.load(f"{d_}/layer{L:02d}.qdec.npy").astype(np.float32)
    for h in range(q.shape[0]):
        K, Q = k[h // g], q[h]
        exact = Q @ K.T
        truth = topk(exact, 100)
        for name, est in (
            ("int8", Q @ affine_levels(K, 255).T),
            ("int4", Q @ affine_levels(K, 15).T),
            ("1-bit", rabitq_scores(Q, K)),
        ):
            for c in cs:
                cand = topk(est, min(c, K.shape[0] - 1))
                sub = np.take_along_axis(exact, cand, 1)
                top = np.take_along_axis(cand, topk(sub, 100), 1)
                r = np.mean([len(set(a) & set(b)) / 100 for a, b in zip(top, truth)])
                res.setdefault((name, c), []).append(r)
print(f"# {d_}: recall@100 after re-ranking the best C estimates exactly; mean / min over heads")
print("| codes | bits/dim | " + " | ".join(f"C = {c}" for c in cs) + " |")
print("|---|---|" + "---|" * len(cs))
for name, bits in (("int8", 8), ("int4", 4), ("1-bit", 1)):
    print(f"| {name} | {bits} | " + " | ".join(f"{np.mean(res[(name, c)]):.4f} / {np.min(res[(name, c)]):.4f}" for c in cs) + " |")
