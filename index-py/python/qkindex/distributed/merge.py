"""The exact merges of the shards' answers (numpy only, no Ray): the top-k of the shards' top-k
lists, and the log-sum-exp merge of partial attentions (DESIGN.md §2, §7)."""

from typing import Sequence, Tuple

import numpy as np


def merge_topk(
    ids: Sequence[np.ndarray], scores: Sequence[np.ndarray], k: int
) -> Tuple[np.ndarray, np.ndarray]:
    """The exact top-k of the shards' lists: ``ids[s]``/``scores[s]`` are ``[b, k_s]`` (global
    ids, ``-1``/``-inf`` padding allowed). Returns ``[b, k]`` int64 and float32, best first; ties
    go to the lower shard (earlier positions), then to the shard's own order."""
    all_ids = np.concatenate([np.asarray(i, np.int64) for i in ids], axis=1)
    all_scores = np.concatenate([np.asarray(s, np.float32) for s in scores], axis=1)
    b, width = all_ids.shape
    if width < k:
        pad = k - width
        all_ids = np.concatenate([all_ids, np.full((b, pad), -1, np.int64)], axis=1)
        all_scores = np.concatenate([all_scores, np.full((b, pad), -np.inf, np.float32)], axis=1)
    masked = np.where(all_ids >= 0, all_scores, -np.inf)
    order = np.argsort(-masked, axis=1, kind="stable")[:, :k]
    out_ids = np.take_along_axis(all_ids, order, axis=1)
    out_scores = np.take_along_axis(masked, order, axis=1).astype(np.float32)
    out_ids[~np.isfinite(out_scores)] = -1
    return out_ids, out_scores


def merge_attention(
    outputs: Sequence[np.ndarray], maxes: Sequence[np.ndarray], sums: Sequence[np.ndarray]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact log-sum-exp merge of partial attentions: ``outputs[s]`` ``[b, dv]`` (normalized
    within the part), ``maxes[s]`` and ``sums[s]`` ``[b]`` (a part with no keys has ``max = -inf``,
    ``sum = 0``). Returns ``(output [b, dv], max [b], sum [b])`` in float64."""
    o = np.stack([np.asarray(x, np.float64) for x in outputs])  # [S, b, dv]
    m = np.stack([np.asarray(x, np.float64) for x in maxes])  # [S, b]
    l = np.stack([np.asarray(x, np.float64) for x in sums])  # [S, b]
    top = m.max(axis=0)  # [b]
    if not np.isfinite(top).all():
        row = int(np.flatnonzero(~np.isfinite(top))[0])
        raise ValueError(f"merge_attention: query {row} attended no key in any shard")
    w = np.where(l > 0, l * np.exp(m - top[None, :]), 0.0)  # [S, b]
    total = w.sum(axis=0)
    out = np.einsum("sb,sbd->bd", w, np.nan_to_num(o)) / total[:, None]
    return out, top, total


def _partial_attention(z: np.ndarray, valid: np.ndarray, v: np.ndarray):
    """One part's (o, m, l) from logits ``z`` ``[b, k]`` float64, a mask of the valid entries and
    the gathered values ``v`` ``[b, k, dv]``."""
    z = np.where(valid, z, -np.inf)
    m = z.max(axis=1)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(valid, np.exp(z - safe_m[:, None]), 0.0)
    l = p.sum(axis=1)
    o = np.einsum("bk,bkd->bd", p, v)
    o = np.divide(o, l[:, None], out=np.zeros_like(o), where=l[:, None] > 0)
    return o, m, l
