"""List recall of the pooled kNN (knn-pool) against the exact top-100, in numpy.

usage: python3 pool_recall.py DATA_DIR P C_PER_SQRT_M
  DATA_DIR: a synth_ood.py output (keys.npy, prefill_queries.npy)
  P: keys per pool; C_PER_SQRT_M: clusters = round(C_PER_SQRT_M * sqrt(m))

The same steps as index-core/src/attention/pool_knn.rs: spherical k-means of the queries (4
Lloyd iterations on 32 strided rows per cluster, strided initial centroids), each cluster's pool
the exact top-P keys of its members' mean query, each list the exact top-100 in the pool; the
recall is measured on 2,000 evenly strided rows.
"""
import sys
import time

import numpy as np


def main(data, pool, per_sqrt_m, kq=100, iters=4, sample=2000):
    keys = np.load(f"{data}/keys.npy").astype(np.float32)
    queries = np.load(f"{data}/prefill_queries.npy").astype(np.float32)
    m = len(queries)
    c = int(round(per_sqrt_m * np.sqrt(m)))
    t = time.time()
    unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    centroids = unit[np.linspace(0, m - 1, c).astype(int)].copy()
    train = unit[np.linspace(0, m - 1, min(m, 32 * c)).astype(int)]
    for _ in range(iters):
        labels = np.argmax(train @ centroids.T, axis=1)
        for j in range(c):
            members = train[labels == j]
            if len(members):
                centroids[j] = members.sum(0)
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    labels = np.concatenate([np.argmax(unit[i:i + 8192] @ centroids.T, axis=1)
                             for i in range(0, m, 8192)])
    means = np.zeros((c, queries.shape[1]), np.float32)
    np.add.at(means, labels, queries)
    means /= np.maximum(np.bincount(labels, minlength=c), 1)[:, None]
    pools = np.concatenate([np.argpartition(-(means[i:i + 256] @ keys.T), pool, axis=1)[:, :pool]
                            for i in range(0, c, 256)])
    rows = np.linspace(0, m - 1, sample).astype(int)
    exact = np.argpartition(-(queries[rows] @ keys.T), kq, axis=1)[:, :kq]
    hits = 0
    for j, r in enumerate(rows):
        p = pools[labels[r]]
        top = p[np.argpartition(-(queries[r] @ keys[p].T), kq)[:kq]]
        hits += len(np.intersect1d(top, exact[j]))
    sizes = np.bincount(labels, minlength=c)
    print(f"n={len(keys)} C={c} P={pool} list recall {hits / (sample * kq):.4f} "
          f"(cluster size median {np.median(sizes):.0f}, max {sizes.max()}; {time.time() - t:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
