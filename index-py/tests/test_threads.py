"""Searches from several Python threads (GIL released) give the same results as sequential
ones."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import qkindex


def _run(idx, queries, single):
    kw = {"ef": 48} if isinstance(idx, qkindex.AttentionIndex) else {}
    if single:
        return [idx.search(q, k=10, **kw) for q in queries]
    return [idx.search(queries[i:i + 8], k=10, **kw) for i in range(0, len(queries), 8)]


def test_four_threads_equal_sequential(data, attention_index):
    keys, _, queries = data
    flat = qkindex.FlatIndex.build(keys)
    for idx in (attention_index, flat):
        for single in (True, False):
            want = _run(idx, queries, single)
            barrier = threading.Barrier(4)

            def work(_):
                barrier.wait()
                return [_run(idx, queries, single) for _ in range(3)]

            with ThreadPoolExecutor(4) as pool:
                results = list(pool.map(work, range(4)))
            for per_thread in results:
                for got in per_thread:
                    for g, w in zip(got, want):
                        np.testing.assert_array_equal(g.ids, w.ids)
                        np.testing.assert_array_equal(g.scores, w.scores)
                        np.testing.assert_array_equal(g.distance_computations, w.distance_computations)


def test_batched_search_equals_one_by_one(data, attention_index):
    _, _, queries = data
    batch = attention_index.search(queries, k=10, ef=48)
    for i, q in enumerate(queries):
        one = attention_index.search(q, k=10, ef=48)
        np.testing.assert_array_equal(batch.ids[i], one.ids)
        assert batch.distance_computations[i] == one.distance_computations


def test_builds_in_threads(data):
    keys, train, queries = data
    want = qkindex.AttentionIndex.build(keys, train, kq=30).search(queries, k=10).ids
    with ThreadPoolExecutor(2) as pool:
        idxs = list(pool.map(lambda _: qkindex.AttentionIndex.build(keys, train, kq=30), range(2)))
    for idx in idxs:
        np.testing.assert_array_equal(idx.search(queries, k=10).ids, want)
