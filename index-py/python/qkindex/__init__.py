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

``qkindex.ReTopK(keys, k=100)`` selects per decode step by reusing the top-k sets of similar
past queries (``.prime(prefill_queries)``, then ``ids, stats = rt.step(query)``), falling back to
an exact scan (or ``index=``) when no cached query is similar enough.

Arrays are numpy arrays or CPU torch tensors (anything with ``__array__`` or DLPack), float16,
bfloat16 (torch, ``ml_dtypes``; widened to float32 exactly) or float32; float64 raises
``TypeError`` (no silent casts), and so does a tensor on a GPU (naming ``.cpu()``). A 1-D query
gives 1-D results. The GIL is released during builds, searches and inserts; a batch of queries
is searched on rayon's thread pool (``RAYON_NUM_THREADS``); Ctrl-C interrupts a build.

Threads: any number of threads may search one index at once, and
``AttentionIndex.insert`` may run meanwhile in another thread: each search sees the index
before or after an insert, never in between (an insert during searches copies the index
first). ``ReTopK`` serialises ``step``, ``prime`` and ``append`` on one lock.

``qkindex.hf`` (``pip install qkindex[hf]``: torch, transformers) captures q/k/v from a
Hugging Face model into a dump and runs retrieval attention inside its decode steps.
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
    decode_default_build,
    exact_topk,
    knn_device,
    load,
    load_dump,
    recall,
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
    "decode_default_build",
    "exact_topk",
    "knn_device",
    "load",
    "load_dump",
    "recall",
    "validate_dump",
    "write_dump",
]
