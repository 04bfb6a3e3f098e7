"""qkindex: approximate top-k maximum-inner-product search over attention keys.

Build an index over one attention head's keys, search it with decode queries, and measure
recall and attention mass against the exact top-k::

    import qkindex
    dump = qkindex.load_dump("data/smollm2-8k-subset")
    keys, train, queries = dump.k(9)[0], dump.q(9)[0], dump.qdec(9)[0]
    index = qkindex.AttentionIndex.build(keys, train)
    res = index.search(queries, k=100, ef=128)
    exact_ids, _ = qkindex.exact_topk(queries, keys, 100)
    print(qkindex.recall(res.ids, exact_ids), res.distance_computations.mean() / len(keys))

Any kind from one spec string (the ``IndexSpec`` of the Rust library and the CLI's ``--kind``),
returned as its kind's class, whose ``search`` takes that kind's parameters::

    ivf = qkindex.build("ivf:codes=i8", keys)              # int8 codes, exact re-rank
    res = ivf.search(queries, k=100, nprobe=8, ef=400)
    graph = qkindex.build("attention", keys, train, kq=50)  # options are more spec keys

``qkindex.search_many(indexes, queries, k=100)`` searches ``queries[i]`` (``[n, b, d]``) on
``indexes[i]`` for every ``i`` in one call, all searches in parallel, as a decode step searches
the heads of a layer: results ``[n, b, k]``, stats ``[n, b]``.

``qkindex.ReTopK(keys, k=100)`` selects per decode step by reusing the top-k sets of similar
past queries (``.prime(prefill_queries)``, then ``ids, stats = rt.step(query)``), falling back to
an exact scan (or ``index=``) when no cached query is similar enough.

Arrays are numpy arrays or CPU torch tensors (anything with ``__array__`` or DLPack), float16,
bfloat16 (torch, ``ml_dtypes``; widened to float32 exactly) or float32; float64 raises
``TypeError`` (no silent casts), and so does a tensor on a GPU (naming ``.cpu()``). A 1-D query
gives 1-D results. The GIL is released during builds, searches and inserts; a batch of queries
is searched on rayon's thread pool (``RAYON_NUM_THREADS``); Ctrl-C interrupts a build.

Threads: any number of threads may search one index at once, and ``insert``
(``AttentionIndex``, ``FlatIndex``) may run meanwhile in other threads: each search sees the
index before or after an insert, never in between. Searches read a snapshot (an ``Arc``
taken under a read lock); inserts run one at a time under the write lock, editing the index in
place, or a copy of it while a search still holds the previous snapshot. ``ReTopK`` serialises ``step``, ``prime`` and ``append`` on one lock.

``qkindex.hf`` (``pip install qkindex[hf]``: torch, transformers) captures q/k/v from a
Hugging Face model into a dump and runs retrieval attention inside its decode steps.

``qkindex.distributed`` (``pip install qkindex[ray]``) shards one head's keys by position over
Ray actors and merges the shards' top-k and partial attentions exactly (``ShardedIndex``), and
builds a whole dump's indexes as Ray tasks (``build_dump``).
"""

from ._native import (
    AttentionIndex,
    Dump,
    FlatIndex,
    FormatError,
    HnswIndex,
    IvfIndex,
    ReTopK,
    SearchResult,
    VamanaIndex,
    __version__,
    attention_mass,
    build,
    decode_default_build,
    exact_topk,
    knn_device,
    load,
    load_dump,
    recall,
    search_many,
    validate_dump,
)
from ._write import write_dump

__all__ = [
    "AttentionIndex",
    "Dump",
    "FlatIndex",
    "FormatError",
    "HnswIndex",
    "IvfIndex",
    "ReTopK",
    "SearchResult",
    "VamanaIndex",
    "__version__",
    "attention_mass",
    "build",
    "decode_default_build",
    "exact_topk",
    "knn_device",
    "load",
    "load_dump",
    "recall",
    "search_many",
    "validate_dump",
    "write_dump",
]
