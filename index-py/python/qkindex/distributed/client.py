"""The client side: :class:`ShardedIndex` (one head over S shard actors) and
:class:`ShardedDump` (every head of a built dump, actor ``s`` holding shard ``s`` of each), the
fan-out, the exact merges, failover between replicas, and the replay log of inserts (bounded by
shard snapshots) that brings restarted or lagging replicas up to date."""

import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError

import qkindex

from .dump import DumpBuild, _split_bounds
from .merge import merge_attention, merge_topk
from .shard import _DumpShard, _Shard, _Stale

# Kinds whose indexes take inserts (``insert`` on the Python class).
_INSERTABLE = (qkindex.AttentionIndex, qkindex.FlatIndex)


def _wait_ready(handles):
    """Each shard's `info()` once every actor (all replicas) has built or opened its index; on any
    error the actors already started are ended and the error is raised."""
    try:
        refs = [[h.info.remote() for h in hs] for hs in handles]  # all build at once
        return [ray.get(r) for r in refs]
    except BaseException:
        for hs in handles:
            for h in hs:
                ray.kill(h, no_restart=True)
        raise


class ShardLostError(RuntimeError):
    """A shard whose every replica died beyond Ray's restarts: its keys are unreachable, so no
    answer is given (a partial top-k or attention would be silently wrong). Raised only when no
    replica of the shard is alive; while one is, calls fail over to it."""

    def __init__(self, shard: int, lo: int, hi: int, cause: BaseException):
        self.shard, self.lo, self.hi, self.cause = shard, lo, hi, cause
        super().__init__(
            f"shard {shard} (keys {lo}..{hi}) is lost: every replica died and Ray will not "
            f"restart it ({type(cause).__name__}: {cause}); no partial answer is returned"
        )


class ShardUnavailableError(RuntimeError):
    """A shard whose replicas are alive but none answered within
    :attr:`ShardedIndex.unavailable_timeout_s` (Ray restarting them, or a node it cannot reach):
    no answer is given, and the call can be made again."""

    def __init__(self, shard: int, lo: int, hi: int, waited_s: float, cause: BaseException):
        self.shard, self.lo, self.hi, self.waited_s, self.cause = shard, lo, hi, waited_s, cause
        super().__init__(
            f"shard {shard} (keys {lo}..{hi}) is unavailable: no live replica answered in "
            f"{waited_s:.1f} s ({type(cause).__name__}: {cause}); no partial answer is returned"
        )


@dataclass
class ShardedResult:
    """Merged ``search`` results: ``ids`` int64 and ``scores`` float32 ``[b, k]`` (``[k]`` for a
    1-D query; ids are global positions, best first, ``-1``/``-inf`` padding only where the
    shards together found fewer than k), ``distance_computations`` int64 ``[b]`` (summed over
    shards), and ``timing`` (seconds: ``total``, ``merge``, ``shards`` — each shard's own search
    time inside its actor; ``total - max(shards) - merge`` is the fan-out cost)."""

    ids: np.ndarray
    scores: np.ndarray
    distance_computations: np.ndarray
    timing: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardedAttention:
    """Merged ``attend`` results: ``output`` float32 ``[b, dv]`` (``[dv]`` for a 1-D query), the
    merged log-sum-exp parts ``max`` and ``sum`` float64 ``[b]`` (softmax over the keys attended:
    ``sum = sum_j exp(z_j - max)``), ``ids`` int64 ``[b, S·k]`` (the keys each shard attended,
    global, ``-1`` padded), and ``timing`` as in :class:`ShardedResult`."""

    output: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    ids: np.ndarray
    timing: Dict[str, Any] = field(default_factory=dict)


@dataclass
class _Chunk:
    """One insert into one shard: its rows in the object store and the client's token for it
    (unique, so that a replica holding a chunk the client dropped is told apart)."""

    token: int
    keys: Any  # object ref, [rows, d]
    values: Any  # object ref, [rows, dv], or None
    rows: int


@dataclass
class _ShardRecord:
    lo: int  # first global position
    n: int  # keys it holds (client's count: inserts once a replica confirmed them)
    replicas: List[Any]  # actor handles, the one to ask first first; dead ones are removed
    # The replay log: the chunks after the snapshot, numbered base, base + 1, ...
    chunks: List[_Chunk] = field(default_factory=list)
    # The object refs of the actors' constructor arguments, held here so that a restart (which
    # runs the constructor again) finds them (ray-project/ray#53727).
    pinned: Tuple[Any, ...] = ()
    lost: Optional[BaseException] = None  # why the last replica died
    base: int = 0  # chunks folded into the snapshot
    base_token: Optional[int] = None  # the token of chunk base - 1
    snapshot: Any = None  # object ref of a _Shard.snapshot's data; None: the shard's source

    @property
    def end(self) -> int:
        """Chunks inserted (folded into the snapshot or in the log)."""
        return self.base + len(self.chunks)

    def state(self) -> Tuple[int, Optional[int]]:
        """``(chunks, token of the last)`` that an up-to-date replica holds."""
        return self.end, self.token_at(self.end)

    def token_at(self, applied: int) -> Optional[int]:
        """The token of chunk ``applied - 1`` (``base <= applied <= end``)."""
        if applied == self.base:
            return self.base_token
        return self.chunks[applied - self.base - 1].token

    def log_keys(self) -> int:
        return sum(c.rows for c in self.chunks)


def _as_rows(name: str, x, dim: Optional[int] = None, allow_1d: bool = False) -> np.ndarray:
    """Validates a float16/float32 ``[n, dim]`` array (``[dim]`` where ``allow_1d``)."""
    a = np.asarray(x)
    if a.dtype not in (np.float16, np.float32):
        raise TypeError(f"{name}: expected float16 or float32, got {a.dtype} (no silent casts)")
    if a.ndim == 1 and allow_1d:
        a = a[None, :]
    if a.ndim != 2 or (dim is not None and a.shape[1] != dim):
        want = f"[n, {dim}]" if dim is not None else "[n, d]"
        raise ValueError(f"{name}: expected shape {want}, got {list(np.shape(x))}")
    finite = np.isfinite(a).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"{name}: row {row} is not finite (NaN or inf)")
    return np.ascontiguousarray(a)


class ShardedIndex:
    """One head's keys in S position shards on Ray actors (see the module doc).

    Make one with :meth:`build` (each actor builds its shard's index from its keys and the
    training queries) or :meth:`open` (each actor maps a ``.qki`` file from shared storage, or
    loads the bytes a :func:`build_dump` kept as an object ref). ``ray.init`` must have been
    called (a local or cluster address).

    ``unavailable_timeout_s`` (default 30) is how long a call waits when every live replica of
    a shard is unavailable (being restarted, or unreachable) before it raises
    :class:`ShardUnavailableError`; set it on the instance."""

    unavailable_timeout_s: float = 30.0

    def __init__(
        self,
        records: List[_ShardRecord],
        *,
        dim: int,
        spec: str,
        kind: str,
        train_ref=None,
        options: Optional[Dict[str, Any]] = None,
        capacity: Optional[int] = None,
        has_values: bool = False,
        keep_keys: bool = False,
        actor_options: Optional[Dict[str, Any]] = None,
        replicas: int = 1,
        snapshot_chunks: int = 256,
        snapshot_keys: int = 65536,
    ):
        self._shards = records
        self.dim = dim
        self.spec = spec
        self.kind = kind
        self._train_ref = train_ref
        self._options = dict(options or {})
        self.capacity = capacity
        self.has_values = has_values
        self._keep_keys = keep_keys
        self._actor_options = dict(actor_options or {})
        self.replicas = replicas
        if snapshot_chunks < 1 or snapshot_keys < 1:
            raise ValueError(f"snapshot_chunks and snapshot_keys must be >= 1, got "
                             f"{snapshot_chunks} and {snapshot_keys}")
        self.snapshot_chunks = snapshot_chunks
        self.snapshot_keys = snapshot_keys
        self._token = 0  # the last chunk token given

    # -- construction --------------------------------------------------------------------------

    @staticmethod
    def _actor_cls(actor_options: Dict[str, Any]):
        opts = {"max_restarts": 3, "max_task_retries": 3, "scheduling_strategy": "SPREAD"}
        opts.update(actor_options)
        return ray.remote(**opts)(_Shard)

    @classmethod
    def _place(cls, sources, offsets, values_refs, keys_refs, replicas, actor_options):
        actor = cls._actor_cls(actor_options)
        handles = []
        for s, src in enumerate(sources):
            handles.append(
                [
                    actor.remote(src, offsets[s], values_refs[s], keys_refs[s])
                    for _ in range(replicas)
                ]
            )
        # Wait for every actor to finish building (or opening) before the first call, so that
        # a build error (ValueError naming the parameter, FormatError naming the file) surfaces
        # here; the actors already started are ended then.
        return handles, _wait_ready(handles)

    @classmethod
    def build(
        cls,
        spec: str,
        keys,
        train_queries=None,
        *,
        shards: int = 2,
        values=None,
        capacity: Optional[int] = None,
        replicas: int = 1,
        actor_options: Optional[Dict[str, Any]] = None,
        snapshot_chunks: int = 256,
        snapshot_keys: int = 65536,
        **options: Any,
    ) -> "ShardedIndex":
        """Splits ``keys`` (``[n, d]`` float16/float32, positions ``0..n``) into ``shards``
        contiguous position ranges and starts one actor per shard and replica, which builds
        ``qkindex.build(spec, its keys, train_queries, **options)``. ``values`` (``[n, dv]``) go
        with the keys for :meth:`attend`. ``capacity`` is the most keys a shard takes before an
        insert opens a new one (default: twice the largest initial shard). ``replicas`` actors
        hold each shard: the first live one answers, and the next takes over when it dies for
        good or is unavailable (failover, not load balancing). ``actor_options`` are passed to
        ``ray.remote`` (``num_cpus``, ``runtime_env``, ``max_restarts`` (default 3),
        ``max_task_retries`` (default 3), ``scheduling_strategy`` (default ``"SPREAD"``), ...).

        ``snapshot_chunks`` (default 256) and ``snapshot_keys`` (default 65536) bound the replay
        log of inserts the client keeps per shard: once a shard's log holds that many chunks
        (inserts) or keys, a replica that holds them all saves the shard (its index's ``.qki``
        bytes, its values and keys) as a snapshot in the object store, which replaces the chunks
        (and the shard's previous snapshot). A restarted replica restores the snapshot and
        replays only the chunks after it. A snapshot costs one save of the shard, so one-row
        decode inserts pay it once per 256 tokens."""
        if shards < 1 or replicas < 1:
            raise ValueError(f"shards and replicas must be >= 1, got {shards} and {replicas}")
        keys = _as_rows("keys", keys)
        n, d = keys.shape
        if n < shards:
            raise ValueError(f"keys: {n} keys cannot fill {shards} shards")
        train = None
        if train_queries is not None:
            train = _as_rows("train_queries", train_queries, d)
        if values is not None:
            values = np.asarray(values)
            if values.ndim != 2 or values.shape[0] != n:
                raise ValueError(f"values: expected shape [{n}, dv], got {list(values.shape)}")
        bounds = _split_bounds(n, shards)
        train_ref = ray.put(train) if train is not None else None
        sources, values_refs, keys_refs = [], [], []
        for lo, hi in bounds:
            kref = ray.put(keys[lo:hi])
            sources.append(
                {"from": "build", "spec": spec, "keys": kref, "train_queries": train_ref,
                 "options": options}
            )
            values_refs.append(ray.put(values[lo:hi]) if values is not None else None)
            keys_refs.append(kref if values is not None else None)
        offsets = [lo for lo, _ in bounds]
        handles, infos = cls._place(sources, offsets, values_refs, keys_refs, replicas,
                                    dict(actor_options or {}))
        records = [_ShardRecord(lo, hi - lo, hs, pinned=(src, v, k))
                   for (lo, hi), hs, src, v, k in zip(bounds, handles, sources, values_refs,
                                                     keys_refs)]
        largest = max(hi - lo for lo, hi in bounds)
        return cls(
            records, dim=d, spec=spec, kind=infos[0][0]["kind"], train_ref=train_ref,
            options=options, capacity=capacity if capacity is not None else 2 * largest,
            has_values=values is not None, keep_keys=values is not None,
            actor_options=actor_options, replicas=replicas, snapshot_chunks=snapshot_chunks,
            snapshot_keys=snapshot_keys,
        )

    @classmethod
    def open(
        cls,
        sources: Union[str, os.PathLike, Sequence[Any]],
        *,
        layer: Optional[int] = None,
        kv_head: Optional[int] = None,
        values=None,
        keys=None,
        replicas: int = 1,
        mmap: bool = True,
        actor_options: Optional[Dict[str, Any]] = None,
    ) -> "ShardedIndex":
        """Places already built shards: a :func:`build_dump` output directory (with ``layer`` and
        ``kv_head``), a :class:`DumpBuild` (the same), or a list of ``.qki`` paths or of
        object refs holding a file's bytes, in position order. Each actor maps its file
        (``mmap``) from storage every node sees. ``values`` (``[n, dv]``) enable :meth:`attend`;
        with ``keys`` too its logits are re-scored in float64, else they are the index's float32
        scores. Inserts are not taken (the build's training queries are not at hand)."""
        known = None  # shard lengths from a manifest
        if isinstance(sources, (str, os.PathLike)):
            sources = DumpBuild.read(sources)
        if isinstance(sources, DumpBuild):
            known = [hi - lo for lo, hi in sources.shard_bounds[(layer, kv_head)]] \
                if (layer, kv_head) in sources.shard_bounds else None
            sources = sources.shards(layer, kv_head)
        srcs = []
        for s in sources:
            if isinstance(s, ray.ObjectRef):
                srcs.append({"from": "bytes", "data": s})
            else:
                srcs.append({"from": "file", "path": str(s), "mmap": mmap})
        if known is not None:
            lens = known
        else:
            # A bare list: open each once to learn its length (offsets need them all).
            actor = cls._actor_cls(dict(actor_options or {}))
            probe = [actor.options(max_restarts=0).remote(src, 0) for src in srcs]
            try:
                lens = [info["len"] for info in ray.get([p.info.remote() for p in probe])]
            finally:
                for p in probe:
                    ray.kill(p)
        offsets = list(np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(int))
        n = int(sum(lens))
        values_refs, keys_refs = [None] * len(srcs), [None] * len(srcs)
        if values is not None:
            values = np.asarray(values)
            if values.ndim != 2 or values.shape[0] != n:
                raise ValueError(f"values: expected shape [{n}, dv], got {list(values.shape)}")
            values_refs = [ray.put(values[o:o + m]) for o, m in zip(offsets, lens)]
            if keys is not None:
                keys = _as_rows("keys", keys)
                if keys.shape[0] != n:
                    raise ValueError(f"keys: expected {n} rows, got {keys.shape[0]}")
                keys_refs = [ray.put(keys[o:o + m]) for o, m in zip(offsets, lens)]
        handles, infos = cls._place(srcs, [int(o) for o in offsets], values_refs, keys_refs,
                                    replicas, dict(actor_options or {}))
        for s, (m, info) in enumerate(zip(lens, infos)):
            if info[0]["len"] != m:
                for hs in handles:
                    for h in hs:
                        ray.kill(h, no_restart=True)
                raise qkindex.FormatError(f"shard {s}: the manifest says {m} keys, its file "
                                          f"holds {info[0]['len']}")
        dims = {info[0]["dim"] for info in infos}
        if len(dims) != 1:
            raise ValueError(f"shards of different head dims: {sorted(dims)}")
        records = [_ShardRecord(int(o), m, hs, pinned=(src, v, k))
                   for o, m, hs, src, v, k in zip(offsets, lens, handles, srcs, values_refs,
                                                  keys_refs)]
        return cls(
            records, dim=infos[0][0]["dim"], spec="(files)", kind=infos[0][0]["kind"],
            capacity=None, has_values=values is not None, keep_keys=keys is not None,
            actor_options=actor_options, replicas=replicas,
        )

    # -- queries -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(r.n for r in self._shards)

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def bounds(self) -> List[Tuple[int, int]]:
        """Each shard's global position range ``[lo, hi)``."""
        return [(r.lo, r.lo + r.n) for r in self._shards]

    def info(self) -> List[List[Dict[str, Any]]]:
        """Per shard, per replica: ``len``, ``dim``, ``kind``, ``pid``, ``node``."""
        return [self._call(s, "info") for s in range(self.num_shards)]

    def _check_queries(self, queries, k: int):
        q = _as_rows("queries", queries, self.dim, allow_1d=True)
        one = np.ndim(queries) == 1
        n = len(self)
        if k < 1 or k > n:
            raise ValueError(f"k: expected 1 <= k <= {n} (the keys of all shards), got {k}")
        return q, one

    def _fan_out(self, method: str, *args):
        """Calls ``method(*args, state)`` on the first live replica of every shard at once (all
        submitted before any is awaited), then collects the answers in shard order, failing over
        where a replica is dead or unavailable."""
        subs = []
        for s, rec in enumerate(self._shards):
            if not rec.replicas:
                raise ShardLostError(s, rec.lo, rec.lo + rec.n, rec.lost)
            h = rec.replicas[0]
            subs.append((h, getattr(h, method).remote(*args, rec.state())))
        return [self._resolve(s, h, ref, method, args, True) for s, (h, ref) in enumerate(subs)]

    def _resolve(self, s: int, handle, ref, method: str, args, expect: bool,
                 mode: str = "failover"):
        """Waits for shard ``s``'s answer to ``method(*args)`` (and the expected state, where
        ``expect``) from ``handle``, whose call ``ref`` is in flight.

        - A replica that died for good is dropped; with none left, :class:`ShardLostError`.
        - A replica that is unavailable (Ray is restarting it, or cannot reach it) goes to the
          back of the shard's list. In mode ``"failover"`` the call goes to the next live
          replica; when every one is unavailable it is tried again until
          :attr:`unavailable_timeout_s`, then :class:`ShardUnavailableError`.
        - A replica in another state than the client's (:class:`_Stale`: restarted, behind, or
          holding a chunk the client dropped) is brought up to date (:meth:`_catch_up`), then
          asked again; an ``insert`` is then done (the catch-up applied it).

        Modes: ``"failover"`` (any replica will do: ``search``, ``attend``), ``"wait"`` (this
        replica, waited for while unavailable: ``info``), ``"once"`` (this replica, and its
        errors raised: one replica's part of an insert, which another may confirm)."""
        rec = self._shards[s]
        t0 = time.monotonic()
        tried: List[Any] = []  # replicas found unavailable since the last pause
        catch_ups = 0
        while True:
            try:
                res = ray.get(ref)
                if not isinstance(res, _Stale):
                    return res
                catch_ups += 1
                if catch_ups > 4:
                    raise ShardUnavailableError(
                        s, rec.lo, rec.lo + rec.n, time.monotonic() - t0,
                        RuntimeError(f"the replica changed state during {catch_ups - 1} "
                                     f"catch-ups (restarting again and again?)"))
                if self._catch_up(s, handle, res) and method == "insert":
                    return None  # the catch-up applied it
            except ActorUnavailableError as e:
                if mode == "once":
                    raise
                if mode == "failover" and handle in rec.replicas and len(rec.replicas) > 1:
                    rec.replicas.remove(handle)  # the others are asked first from now on
                    rec.replicas.append(handle)
                tried.append(handle)
                others = [h for h in rec.replicas if h not in tried] if mode == "failover" else []
                if others:
                    handle = others[0]
                else:
                    waited = time.monotonic() - t0
                    if waited > self.unavailable_timeout_s:
                        raise ShardUnavailableError(s, rec.lo, rec.lo + rec.n, waited, e) from e
                    time.sleep(0.5)
                    tried = []
                    if mode == "failover":
                        handle = rec.replicas[0]
            except RayActorError as e:  # died for good (Ray will not restart it)
                if handle in rec.replicas:
                    rec.replicas.remove(handle)
                if not rec.replicas:
                    rec.lost = e
                    raise ShardLostError(s, rec.lo, rec.lo + rec.n, e) from e
                if mode != "failover":
                    raise
                handle = rec.replicas[0]
            call = list(args) + ([rec.state()] if expect else [])
            ref = getattr(handle, method).remote(*call)

    def _catch_up(self, s: int, handle, stale: _Stale) -> bool:
        """Brings a replica in state ``stale`` to the client's: it replays the chunks the replica
        lacks where the replica's chunks are a prefix of the client's; otherwise (it restarted
        and the log no longer starts at 0, or it holds a chunk the client dropped, or a failed
        insert left it unknown) it first restores the shard's snapshot (or its source, before
        any snapshot). False when the replica turned out to be in yet another state (it
        restarted meanwhile): the caller asks it again."""
        rec = self._shards[s]
        if (rec.base <= stale.applied <= rec.end
                and stale.last == rec.token_at(stale.applied)):
            start = stale.applied
        else:
            ray.get(handle.restore.remote(rec.snapshot, rec.base, rec.base_token))
            start = rec.base
        refs = [handle.insert.remote(seq, c.token, c.keys, c.values)
                for seq, c in enumerate(rec.chunks[start - rec.base:], start)]
        return not any(isinstance(r, _Stale) for r in ray.get(refs))

    def _call(self, s: int, method: str, *args):
        """``method(*args)`` on every live replica of shard ``s`` (waiting for an unavailable
        one; a dead one is dropped and left out)."""
        rec = self._shards[s]
        if not rec.replicas:
            raise ShardLostError(s, rec.lo, rec.lo + rec.n, rec.lost)
        out = []
        for h in list(rec.replicas):
            try:
                out.append(self._resolve(s, h, getattr(h, method).remote(*args), method, args,
                                         False, mode="wait"))
            except RayActorError:
                continue  # died: dropped by _resolve (ShardLostError where it was the last)
        return out

    def search(self, queries, k: int = 100, **params: Any) -> ShardedResult:
        """The exact top-k over all shards of each shard's top-k (``min(k, shard size)``);
        ``params`` are the shard kind's search parameters (``ef``, ``nprobe``, ``beam``)."""
        t0 = time.perf_counter()
        q, one = self._check_queries(queries, k)
        qref = ray.put(q)
        parts = self._fan_out("search", qref, k, params)
        t1 = time.perf_counter()
        ids, scores = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
        dc = np.sum([np.asarray(p[2], np.int64) for p in parts], axis=0)
        t2 = time.perf_counter()
        timing = {"total": t2 - t0, "merge": t2 - t1, "shards": [p[3] for p in parts]}
        if one:
            return ShardedResult(ids[0], scores[0], dc[0], timing)
        return ShardedResult(ids, scores, dc, timing)

    def attend(self, queries, k: int = 100, *, scale: Optional[float] = None,
               **params: Any) -> ShardedAttention:
        """Softmax attention (``scale`` default ``1/sqrt(d)``) of each query over the union of
        the shards' own top-k keys, merged exactly from the shards' (o, m, l) parts."""
        if not self.has_values:
            raise ValueError("attend needs values: place them with ShardedIndex.build(values=...)")
        t0 = time.perf_counter()
        q, one = self._check_queries(queries, k)
        scale = 1.0 / math.sqrt(self.dim) if scale is None else float(scale)
        qref = ray.put(q)
        parts = self._fan_out("attend", qref, k, params, scale)
        t1 = time.perf_counter()
        out, m, l = merge_attention([p[0] for p in parts], [p[1] for p in parts],
                                    [p[2] for p in parts])
        ids = np.concatenate([p[3] for p in parts], axis=1)
        t2 = time.perf_counter()
        timing = {"total": t2 - t0, "merge": t2 - t1, "shards": [p[5] for p in parts]}
        out = out.astype(np.float32)
        if one:
            return ShardedAttention(out[0], m[0], l[0], ids[0], timing)
        return ShardedAttention(out, m, l, ids, timing)

    # -- inserts -------------------------------------------------------------------------------

    def insert(self, keys, values=None) -> np.ndarray:
        """Appends keys (``[m, d]`` or one ``[d]``) at the next positions: into the last shard
        until it holds ``capacity`` keys, then into a new shard (a new actor building ``spec``
        over the overflow, with the same training queries). Returns their global ids.

        Each part sent to a shard is one chunk, sent to every live replica and counted (in
        ``len``, ``bounds`` and the next positions) once one replica confirmed it; one
        unavailable replica does not hold it up. A replica that missed it (unavailable, or
        restarted) is brought up to date before it next answers: the chunks it lacks are
        replayed, after the shard's snapshot is restored where the log no longer reaches back
        to it. A chunk that no replica confirmed is dropped: the count stays, and the error is
        raised (:class:`ShardLostError` where no replica is alive, :class:`ShardUnavailableError`
        where none answered in time). An error part way through a multi-shard insert leaves
        the parts confirmed before it in (``len`` says how many)."""
        if self.capacity is None:
            raise TypeError("this ShardedIndex was opened from files: it takes no inserts")
        if self.kind not in {c.__name__ for c in _INSERTABLE}:
            raise TypeError(f"{self.kind} takes no inserts (AttentionIndex and FlatIndex do)")
        rows = _as_rows("keys", keys, self.dim, allow_1d=True)
        if self.has_values:
            if values is None:
                raise ValueError("values: this index holds values, so inserts need them too")
            values = np.asarray(values)
            if values.ndim == 1:
                values = values[None, :]
            if values.shape[0] != rows.shape[0]:
                raise ValueError(f"values: expected {rows.shape[0]} rows, got {values.shape[0]}")
        elif values is not None:
            raise ValueError("values: this index was placed without values")
        first = len(self)
        done = 0
        while done < rows.shape[0]:
            last = self._shards[-1]
            room = self.capacity - last.n
            if room <= 0:
                take = min(self.capacity, rows.shape[0] - done)
                self._open_shard(rows[done:done + take],
                                 None if values is None else values[done:done + take])
            else:
                take = min(room, rows.shape[0] - done)
                self._insert_chunk(len(self._shards) - 1, rows[done:done + take],
                                   None if values is None else values[done:done + take])
            done += take
        return np.arange(first, first + rows.shape[0], dtype=np.int64)

    def _insert_chunk(self, s: int, keys: np.ndarray, values: Optional[np.ndarray]):
        """One chunk into shard ``s``: logged, counted once a replica confirmed it (dropped from
        the log if none did), then folded into a snapshot where the log is over its bound."""
        rec = self._shards[s]
        if not rec.replicas:
            raise ShardLostError(s, rec.lo, rec.lo + rec.n, rec.lost)
        self._token += 1
        chunk = _Chunk(self._token, ray.put(keys),
                       ray.put(values) if values is not None else None, keys.shape[0])
        seq = rec.end
        rec.chunks.append(chunk)
        try:
            confirmed = self._confirm(s, (seq, chunk.token, chunk.keys, chunk.values))
        except BaseException:
            rec.chunks.pop()
            raise
        rec.n += chunk.rows
        if len(rec.chunks) >= self.snapshot_chunks or rec.log_keys() >= self.snapshot_keys:
            self._snapshot(s, confirmed)

    def _confirm(self, s: int, args):
        """Sends ``insert(*args)`` to every live replica of shard ``s`` and returns the first
        that confirms it (the others' answers are not waited for: one that fails is brought up
        to date later). Where none does, it waits for a live one as a search would."""
        rec = self._shards[s]
        pending = {h.insert.remote(*args): h for h in rec.replicas}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            h = pending.pop(done[0])
            try:
                self._resolve(s, h, done[0], "insert", args, False, mode="once")
                return h
            except (RayActorError, ShardLostError, ShardUnavailableError):
                continue  # unavailable (tried below) or dead (dropped)
        if not rec.replicas:
            raise ShardLostError(s, rec.lo, rec.lo + rec.n, rec.lost)
        h = rec.replicas[0]
        self._resolve(s, h, h.insert.remote(*args), "insert", args, False)
        return rec.replicas[0]  # the one that answered (failover moves the others back)

    def _snapshot(self, s: int, handle):
        """Folds shard ``s``'s replay log into a snapshot taken on ``handle`` (a replica that
        just confirmed the last chunk). Where it fails the log is kept and the next insert tries
        again: the insert itself has been confirmed and counted, so it does not raise."""
        rec = self._shards[s]
        try:
            state_ref, data_ref = handle.snapshot.options(num_returns=2).remote()
            state = ray.get(state_ref)
            if (state["applied"], state["last"]) != rec.state():
                return
            # The snapshot is put again from here, so that it lives in this node's object store
            # (owned and held by the client), not only on the replica's node, which may be the
            # one that fails next.
            data = ray.put(ray.get(data_ref))
        except RayActorError:
            return  # died or unavailable meanwhile
        except RayError as e:
            warnings.warn(f"shard {s}: the snapshot of its replay log failed, the log is kept "
                          f"({type(e).__name__}: {e})", RuntimeWarning, stacklevel=3)
            return
        rec.snapshot, rec.base, rec.base_token = data, state["applied"], state["last"]
        rec.chunks = []

    def _open_shard(self, keys: np.ndarray, values: Optional[np.ndarray]):
        lo = len(self)
        kref = ray.put(keys)
        src = {"from": "build", "spec": self.spec, "keys": kref,
               "train_queries": self._train_ref, "options": self._options}
        vref = ray.put(values) if values is not None else None
        handles, _ = self._place([src], [lo], [vref], [kref if self._keep_keys else None],
                                 self.replicas, self._actor_options)
        self._shards.append(_ShardRecord(lo, keys.shape[0], handles[0], pinned=(src, vref, kref)))

    def close(self):
        """Ends the shard actors."""
        for rec in self._shards:
            for h in rec.replicas:
                ray.kill(h, no_restart=True)
            rec.replicas = []
            rec.lost = RuntimeError("closed by ShardedIndex.close()")


class ShardedDump(ShardedIndex):
    """Every (layer, KV head) index of a :func:`build_dump` output on S actors, one per position
    shard: actor ``s`` holds shard ``s`` of every head, as a context-parallel worker holds every
    head of its token range. ``search(layer, queries, k)`` searches all query heads of a layer in
    one call per shard (``qkindex.search_many`` inside the actor), so the fan-out is paid once
    per layer, not once per head. No inserts and no ``attend`` (place a head with
    ``ShardedIndex.build(..., values=)`` for those)."""

    @classmethod
    def open(cls, out: Union[str, os.PathLike, "DumpBuild"], *, replicas: int = 1,
             mmap: bool = True, actor_options: Optional[Dict[str, Any]] = None
             ) -> "ShardedDump":
        built = out if isinstance(out, DumpBuild) else DumpBuild.read(out)
        if built.n_q_heads is None or built.n_kv_heads is None:
            raise qkindex.FormatError("the build's manifest lacks n_q_heads / n_kv_heads")
        group = built.n_q_heads // built.n_kv_heads
        bounds = {tuple(b) for b in map(tuple, built.shard_bounds.values())}
        if len(bounds) != 1:
            raise qkindex.FormatError("the heads of this build are split at different positions")
        bounds = list(next(iter(bounds)))
        opts = {"max_restarts": 3, "max_task_retries": 3, "scheduling_strategy": "SPREAD"}
        opts.update(actor_options or {})
        actor = ray.remote(**opts)(_DumpShard)
        handles, files_per_shard = [], []
        for s, (lo, hi) in enumerate(bounds):
            files = {key: outs[s] for key, outs in built.outputs.items()}
            files_per_shard.append(files)
            handles.append([actor.remote(files, lo, hi - lo, group, mmap)
                            for _ in range(replicas)])
        infos = _wait_ready(handles)
        records = [_ShardRecord(lo, hi - lo, hs, pinned=(files,))
                   for (lo, hi), hs, files in zip(bounds, handles, files_per_shard)]
        dump = cls(records, dim=infos[0][0]["dim"], spec=built.spec, kind=infos[0][0]["kind"],
                   capacity=None, actor_options=actor_options, replicas=replicas)
        dump.n_q_heads, dump.n_kv_heads = built.n_q_heads, built.n_kv_heads
        dump.layers = sorted({layer for layer, _ in built.outputs})
        return dump

    def search(self, layer: int, queries, k: int = 100, **params: Any) -> ShardedResult:
        """``queries`` ``[n_q_heads, b, d]`` (float16/float32): query head ``h`` is searched on
        its KV head's shards of ``layer``. Results ``[n_q_heads, b, k]`` (ids global positions),
        ``distance_computations`` ``[n_q_heads, b]`` summed over shards."""
        t0 = time.perf_counter()
        q = np.asarray(queries)
        if q.ndim != 3 or q.shape[0] != self.n_q_heads or q.shape[2] != self.dim:
            raise ValueError(f"queries: expected shape [{self.n_q_heads}, b, {self.dim}], got "
                             f"{list(q.shape)}")
        heads, b, d = q.shape
        flat = _as_rows("queries", q.reshape(heads * b, d), d)
        n = len(self)
        if k < 1 or k > n:
            raise ValueError(f"k: expected 1 <= k <= {n} (the keys of all shards), got {k}")
        qref = ray.put(flat.reshape(heads, b, d))
        parts = self._fan_out("search_layer", layer, qref, k, params)
        t1 = time.perf_counter()
        ids, scores = merge_topk([p[0].reshape(heads * b, -1) for p in parts],
                                 [p[1].reshape(heads * b, -1) for p in parts], k)
        dc = np.sum([np.asarray(p[2], np.int64) for p in parts], axis=0)
        t2 = time.perf_counter()
        timing = {"total": t2 - t0, "merge": t2 - t1, "shards": [p[3] for p in parts]}
        return ShardedResult(ids.reshape(heads, b, k), scores.reshape(heads, b, k), dc, timing)

    def attend(self, *args, **kwargs):
        raise TypeError("ShardedDump has no attend: place the head with "
                        "ShardedIndex.build(..., values=...) to attend over shards")
