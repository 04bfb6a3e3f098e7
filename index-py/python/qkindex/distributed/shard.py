"""The actor side: ``_Shard`` holds one position shard of one head (its index, and optionally its
values and keys for ``attend``); ``_DumpShard`` holds one position shard of every head of a
:func:`~qkindex.distributed.build_dump` output. Both build or open their indexes on the first
call, so that a build error reaches the client as its own type and a restarted actor rebuilds on
the call Ray retries.

A ``_Shard``'s inserts are numbered chunks; its state is ``(applied, last)``: how many chunks it
holds and the client's token of the last one. Each search names the state the client expects, and
a replica in another state (restarted, behind, or holding a chunk the client dropped) answers
:class:`_Stale` instead, without building anything, so that the client can bring it up to date:
replay the chunks it lacks, or first :meth:`_Shard.restore` a snapshot (the bytes of the shard's
saved index, with its values and keys) that :meth:`_Shard.snapshot` took on a replica."""

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
    """A replica not in the state the call expected: it holds ``applied`` chunks, the last with
    token ``last`` (``applied == -1``: an insert failed inside it, so its state is unknown)."""

    applied: int
    last: Optional[int] = None


def _save_bytes(index) -> bytes:
    """The index's ``.qki`` file as bytes."""
    fd, path = tempfile.mkstemp(suffix=".qki")
    os.close(fd)
    try:
        index.save(path)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def _load_bytes(data: bytes):
    """An index from a ``.qki`` file's bytes (read into memory: the file is removed)."""
    fd, path = tempfile.mkstemp(suffix=".qki")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    try:
        return qkindex.load(path, mmap=False)
    finally:
        os.unlink(path)


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
        self._values0, self._keys0 = values, keys_for_attend  # for restore(None): as created
        self.values = None if values is None else _Rows(values)
        self.keys = None if keys_for_attend is None else _Rows(keys_for_attend)
        self.applied = 0  # insert chunks held (numbered from the shard's creation)
        self.last: Optional[int] = None  # the client's token of the last chunk held
        self.restored_at: Optional[int] = None  # chunks in the snapshot it was restored from

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
            self.index = _load_bytes(source["data"])
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
            "restored_at": self.restored_at,
        }

    def _state_is(self, state: Tuple[int, Optional[int]]) -> bool:
        return (self.applied, self.last) == tuple(state)

    def insert(self, seq: int, token: int, keys: np.ndarray, values: Optional[np.ndarray]):
        """Applies chunk ``seq`` (the client's ``token``) if it is the next one; the last one
        again (a retried call) is a no-op; any other answers :class:`_Stale`."""
        if seq == self.applied - 1 and token == self.last:
            return len(self._ensure())
        if seq != self.applied:
            return _Stale(self.applied, self.last)
        index = self._ensure()
        try:
            for row in keys:
                index.insert(row)
            if values is not None:
                self.values.append(values)
            if self.keys is not None:
                self.keys.append(keys)
        except BaseException:
            # Part of the chunk may be in: the client restores this replica before using it.
            self.applied, self.last = -1, None
            raise
        self.applied, self.last = seq + 1, token
        return len(index)

    def snapshot(self):
        """``(state, data)`` (call with ``num_returns=2``): ``{"applied", "last", "n"}``, and the
        shard as :meth:`restore` takes it: the index's ``.qki`` bytes, its values and keys."""
        index = self._ensure()
        data = {"index": _save_bytes(index),
                "values": None if self.values is None else self.values.array,
                "keys": None if self.keys is None else self.keys.array}
        return {"applied": self.applied, "last": self.last, "n": len(index)}, data

    def restore(self, data: Optional[Dict[str, Any]], applied: int, last: Optional[int]):
        """Replaces this replica's shard by a :meth:`snapshot`'s ``data`` holding ``applied``
        chunks (the last with token ``last``); ``None``: by its source as created, no chunk."""
        if data is None:
            self.index = None  # rebuilt from the source by the next call
            self.values = None if self._values0 is None else _Rows(self._values0)
            self.keys = None if self._keys0 is None else _Rows(self._keys0)
            self.applied, self.last, self.restored_at = 0, None, None
            return 0
        self.index = _load_bytes(data["index"])
        self.values = None if data["values"] is None else _Rows(data["values"])
        self.keys = None if data["keys"] is None else _Rows(data["keys"])
        self.applied, self.last, self.restored_at = applied, last, applied
        return len(self.index)

    def search(self, queries: np.ndarray, k: int, params: Dict[str, Any],
               state: Tuple[int, Optional[int]]):
        # The state first: a restarted replica says so before building an index that a
        # snapshot would replace.
        if not self._state_is(state):
            return _Stale(self.applied, self.last)
        n = len(self._ensure())
        t0 = time.perf_counter()
        res = self.index.search(queries, k=min(k, n), **params)
        ids = res.ids.copy()
        ids[ids >= 0] += self.offset
        return ids, res.scores, res.distance_computations, time.perf_counter() - t0

    def attend(
        self, queries: np.ndarray, k: int, params: Dict[str, Any], scale: float,
        state: Tuple[int, Optional[int]],
    ):
        if not self._state_is(state):
            return _Stale(self.applied, self.last)
        n = len(self._ensure())
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
                     state: Tuple[int, Optional[int]]):
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
