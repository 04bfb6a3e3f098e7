"""qkindex.distributed: one head's keys sharded by position over Ray actors (``pip install
qkindex[ray]``). The query moves, the cache stays (vLLM's decode context parallelism; arXiv
2606.01502): each decode query is sent to every shard, and the shards' answers are merged exactly.

::

     client                                   Ray actors (one per shard and replica)
     ------                                   ------------------------------------------
     queries --ray.put--> ref ──fan out──►   shard 0: keys[0:n0]     index  (+ values)
                                 ├──────►   shard 1: keys[n0:n1]    index  (+ values)
                                 └──────►   shard S-1: keys[..:n]    index  (+ values)
     search: (ids + offset, scores) per shard ──► exact top-k of the S·k candidates
     attend: (o, m, l) per shard over its own top-k ──► log-sum-exp merge

Why the merges are exact:

- ``search``: every key of the global top-k is in its own shard's top-k (a shard's k best
  include every key of that shard that beats the global k-th), so the top-k of the union of the
  shards' top-k lists is the global top-k. With flat (exact) shards the answer equals a flat
  index over the whole head; graph shards are ordinary indexes over their keys, each searched
  with the caller's ``ef``, so S shards do about S times one index's work
  (``docs/bench/ray/README.md`` compares recall at equal work).
- ``attend``: shard ``s`` attends its own top-k ``R_s`` and returns the online-softmax triple
  ``m_s = max_j z_j``, ``l_s = sum_j exp(z_j - m_s)``, ``o_s = sum_j exp(z_j - m_s) v_j / l_s``
  with ``z_j = scale * q.k_j`` (float64); the client takes ``m = max_s m_s``,
  ``w_s = l_s exp(m_s - m)``, ``o = sum_s w_s o_s / sum_s w_s`` (DESIGN.md §2, §7). That is
  softmax attention over the union of the ``R_s`` (``S·k`` keys, a superset of the global
  top-k) with no error beyond rounding.

The shard's keys and values stay where the shard lives: ``values`` are placed with the keys
(``ShardedIndex.build(..., values=v)``), not sent with each call as the issue's sketch
``attend(queries, k, values)`` had it, since moving the values per step is what context
parallelism avoids.

Faults: each shard actor is created with ``max_restarts`` and its calls with
``max_task_retries``, so a killed worker is restarted by Ray (rebuilding its index from the same
object-store keys, or reopening its ``.qki`` file) and the call in flight is retried. With
``replicas``, a call whose replica is dead or unavailable (being restarted, or on a node that
cannot be reached) goes to another live replica of the shard, which is asked first from then on.
Inserts are numbered chunks, counted once one replica confirmed them; the client keeps them in
the object store as a replay log, and each call names the state (chunks, last chunk's token) it
expects, so that a replica that restarted or missed chunks says so, and the client replays them
into it before it answers: the answer is the same. The log is bounded: every ``snapshot_chunks``
chunks or ``snapshot_keys`` keys (256 and 65536 by default) a replica's saved shard (the index's
``.qki`` bytes, with its values and keys) replaces the chunks it holds, and a restarted replica
restores it, then replays only the chunks after it. :class:`ShardLostError` is raised only when
no replica of a shard is alive, :class:`ShardUnavailableError` when some are but none answered
in time; no call returns a partial answer.

Whole dumps: :func:`build_dump` builds every (layer, KV head, shard) index as one Ray task each
(retried where a worker dies), writing ``.qki`` files and a ``manifest.json`` (or keeping the
files' bytes as object refs), and :meth:`ShardedIndex.open` maps one head's shards on actors;
:class:`ShardedDump` maps every head, actor ``s`` holding shard ``s`` of every head (a
context-parallel worker's layout) and searching a layer's query heads in one call.
"""

# Files: ``client.py`` (ShardedIndex, ShardedDump: fan-out, merges, failover, insert replay),
# ``shard.py`` (the actors), ``merge.py`` (the exact merges, numpy only), ``dump.py`` (builds
# of a whole dump as Ray tasks, the manifest).

try:
    import ray  # noqa: F401  (the extra's one dependency: fail here, naming it)
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"qkindex.distributed needs Ray ({e}): pip install 'qkindex[ray]' (or pip install ray)"
    ) from e

from .client import (  # noqa: E402
    ShardedAttention,
    ShardedDump,
    ShardedIndex,
    ShardedResult,
    ShardLostError,
    ShardUnavailableError,
)
from .dump import MANIFEST_FORMAT, DumpBuild, build_dump  # noqa: E402
from .merge import merge_attention, merge_topk  # noqa: E402

__all__ = [
    "MANIFEST_FORMAT",
    "ShardLostError",
    "ShardUnavailableError",
    "ShardedIndex",
    "ShardedDump",
    "ShardedResult",
    "ShardedAttention",
    "DumpBuild",
    "build_dump",
    "merge_topk",
    "merge_attention",
]
