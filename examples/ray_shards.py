"""One head's keys in 3 position shards on Ray actors: exact top-k and exact attention merged
from the shards (qkindex.distributed; pip install 'qkindex[ray]'). Runs on one machine with a
local Ray; on a cluster, call ray.init(address="auto") instead.

    python examples/ray_shards.py
"""

import numpy as np
import ray

import qkindex
import qkindex.distributed as qd

rng = np.random.default_rng(0)
n, d = 30_000, 64
keys = rng.standard_normal((n, d)).astype(np.float32)
values = rng.standard_normal((n, d)).astype(np.float32)
train = (rng.standard_normal((2_000, d)) * 0.7 + 0.5).astype(np.float32)  # prefill queries
queries = (rng.standard_normal((8, d)) * 0.7 + 0.5).astype(np.float32)  # decode queries

ray.init(num_cpus=4, include_dashboard=False)
# Each actor builds the index of its positions (exact: "flat"; a graph: "attention").
heads = qd.ShardedIndex.build("attention", keys, train, shards=3, values=values, kq=50)
res = heads.search(queries, k=100, ef=128)  # ids are global positions, best first
exact_ids, _ = qkindex.exact_topk(queries, keys, 100)
print("shards", heads.bounds, "recall@100", qkindex.recall(res.ids, exact_ids))
att = heads.attend(queries, k=100, ef=128)  # each shard's (o, max, sum), merged exactly
print("attention output", att.output.shape, "over", att.ids.shape[1], "keys per query")
heads.insert(rng.standard_normal((500, d)).astype(np.float32),
             rng.standard_normal((500, d)).astype(np.float32))  # into the last shard
print("after inserts", heads.bounds)
heads.close()
ray.shutdown()
