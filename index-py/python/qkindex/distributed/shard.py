"""The actor side: ``_Shard`` holds one position shard of one head (its index, and optionally its
values and keys for ``attend``); ``_DumpShard`` holds one position shard of every head of a
:func:`~qkindex.distributed.build_dump` output. Both build or open their indexes on the first
call, so that a build error reaches the client as its own type and a restarted actor rebuilds on
the call Ray retries."""

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np
import ray

import qkindex

from .merge import _partial_attention


class _Rows:
    """A float32 ``[n, d]`` array that grows by doubling, so that one-row inserts at decode time
    cost O(d) amortized, not a copy of the shard."""

    def __init__(self, rows):
        a = np.array(rows, np.float32)
        self._buf, self.n = a, a.shape[0]

    def append(self, rows):
        rows = np.asarray(rows, np.float32).reshape(-1, self._buf.shape[1])
        need = self.n + rows.shape[0]
        if need > self._buf.shape[0]:
            grown = np.empty((max(need, 2 * self._buf.shape[0]), self._buf.shape[1]), np.float32)
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n:need] = rows
        self.n = need

    @property
    def array(self) -> np.ndarray:
        return self._buf[: self.n]


@dataclass
class _Stale:
    """A shard that holds fewer inserted chunks than the client sent (it was restarted)."""

    applied: int


class _Shard:
    """One position shard: keys ``[lo, lo + n)`` of the head, its index, and optionally its
    values (``[n, dv]``) and keys (kept for exact float64 re-scoring in ``attend``)."""

    def __init__(self, source: Dict[str, Any], offset: int, values=None, keys_for_attend=None):
        # The index is built (or opened) by the first call, not here: an error in the build then
        # reaches the client as its own type (ValueError, FormatError) through Ray's task error,
        # where a constructor's error would only say that the actor died. A restarted actor
        # rebuilds it the same way, on the call Ray retries.
        self.source = source
        self.offset = offset
        self.index = None
        self.applied = 0  # insert chunks applied since creation
        self.values = None if values is None else _Rows(values)
        self.keys = None if keys_for_attend is None else _Rows(keys_for_attend)

    def _ensure(self):
        if self.index is not None:
            return self.index
        # Refs nested in a dict are not resolved by Ray (only top-level arguments are).
        source = {k: ray.get(v) if isinstance(v, ray.ObjectRef) else v
                  for k, v in self.source.items()}
        kind = source["from"]
        if kind == "build":
            self.index = qkindex.build(
                source["spec"], source["keys"], source.get("train_queries"), **source["options"]
            )
        elif kind == "file":
            self.index = qkindex.load(source["path"], mmap=source.get("mmap", True))
        elif kind == "bytes":
            fd, path = tempfile.mkstemp(suffix=".qki")
            with os.fdopen(fd, "wb") as f:
                f.write(source["data"])
            try:
                self.index = qkindex.load(path, mmap=False)
            finally:
                os.unlink(path)
        else:
            raise ValueError(f"unknown shard source {kind!r}")
        return self.index

    def info(self) -> Dict[str, Any]:
        self._ensure()
        return {
            "len": len(self.index),
            "dim": self.index.dim,
            "kind": type(self.index).__name__,
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "applied": self.applied,
        }

    def insert(self, seq: int, keys: np.ndarray, values: Optional[np.ndarray]):
        self._ensure()
        if seq != self.applied:
            return _Stale(self.applied)
        for row in keys:
            self.index.insert(row)
        if values is not None:
            self.values.append(values)
        if self.keys is not None:
            self.keys.append(keys)
        self.applied += 1
        return len(self.index)

    def search(self, queries: np.ndarray, k: int, params: Dict[str, Any], n_expected: int):
        n = len(self._ensure())
        if n < n_expected:
            return _Stale(self.applied)
        t0 = time.perf_counter()
        res = self.index.search(queries, k=min(k, n), **params)
        ids = res.ids.copy()
        ids[ids >= 0] += self.offset
        return ids, res.scores, res.distance_computations, time.perf_counter() - t0

    def attend(
        self, queries: np.ndarray, k: int, params: Dict[str, Any], scale: float, n_expected: int
    ):
        n = len(self._ensure())
        if n < n_expected:
            return _Stale(self.applied)
        if self.values is None:
            raise ValueError("this shard holds no values: place them with values= to attend")
        t0 = time.perf_counter()
        res = self.index.search(queries, k=min(k, n), **params)
        valid = res.ids >= 0
        local = np.where(valid, res.ids, 0)
        if self.keys is not None:
            # Exact float64 logits from the shard's own keys (the index's scores are float32).
            q = np.asarray(queries, np.float64)
            z = np.einsum("bd,bkd->bk", q, self.keys.array[local].astype(np.float64)) * scale
        else:
            z = res.scores.astype(np.float64) * scale
        o, m, l = _partial_attention(z, valid, self.values.array[local].astype(np.float64))
        ids = np.where(valid, res.ids + self.offset, -1)
        return o, m, l, ids, res.distance_computations, time.perf_counter() - t0


class _DumpShard:
    """Position shard ``s`` of every (layer, KV head) index of a :func:`build_dump` output: the
    layout of a context-parallel worker, which holds all heads of its token range. Opened on the
    first call (and again by a restarted actor, on the call Ray retries)."""

    def __init__(self, files: Dict[Tuple[int, int], Any], offset: int, n: int, group: int,
                 mmap: bool):
        self.files, self.offset, self.n, self.group, self.mmap = files, offset, n, group, mmap
        self.indexes = None
        self.applied = 0  # no inserts: kept for the client's bookkeeping

    def _ensure(self):
        if self.indexes is None:
            opened = {}
            for key, src in self.files.items():
                opened[key] = _Shard({"from": "bytes", "data": src}
                                     if isinstance(src, ray.ObjectRef)
                                     else {"from": "file", "path": src, "mmap": self.mmap},
                                     self.offset)._ensure()
            for key, idx in opened.items():
                if len(idx) != self.n:
                    raise qkindex.FormatError(f"layer {key[0]} KV head {key[1]}: the manifest "
                                              f"says {self.n} keys, its file holds {len(idx)}")
            self.indexes = opened
        return self.indexes

    def info(self) -> Dict[str, Any]:
        idx = self._ensure()
        first = next(iter(idx.values()))
        return {"len": self.n, "dim": first.dim, "kind": type(first).__name__,
                "indexes": len(idx), "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id(), "applied": 0}

    def search_layer(self, layer: int, queries: np.ndarray, k: int, params: Dict[str, Any],
                     n_expected: int):
        idx = self._ensure()
        heads = queries.shape[0]
        missing = [h for h in range(heads) if (layer, h // self.group) not in idx]
        if missing:
            raise ValueError(f"layer {layer}: no index for query head {missing[0]} (KV head "
                             f"{missing[0] // self.group}); built: {sorted(idx)}")
        t0 = time.perf_counter()
        res = qkindex.search_many([idx[(layer, h // self.group)] for h in range(heads)], queries,
                                  k=min(k, self.n), **params)
        ids = res.ids.copy()
        ids[ids >= 0] += self.offset
        return ids, res.scores, res.distance_computations, time.perf_counter() - t0
