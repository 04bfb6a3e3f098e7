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


def test_searches_while_another_thread_inserts(data):
    """Four threads search while a fifth inserts: no crash, and every result is a result of
    the index before or after some insert (checked: the ids are valid for the size seen, the
    scores are the true inner products, best first, and no id repeats)."""
    keys, train, queries = data
    base, extra = keys[:1500], keys[1500:]
    idx = qkindex.AttentionIndex.build(base, train, kq=30, max_degree=16)
    stop = threading.Event()
    errors = []

    def insert():
        try:
            for i, key in enumerate(extra):
                assert idx.insert(key, queries[i % len(queries)]) == len(base) + i
        except Exception as e:  # reported by the main thread
            errors.append(e)
        finally:
            stop.set()

    def search(t):
        checked = 0
        while not stop.is_set() or checked < 5:
            q = queries[(t * 7 + checked) % len(queries)]
            res = idx.search(queries[t:t + 4] if checked % 2 else q, k=10, ef=32)
            ids = np.atleast_2d(res.ids)
            sc = np.atleast_2d(res.scores)
            qs = queries[t:t + 4] if checked % 2 else q[None]
            assert (ids >= 0).all() and (ids < len(keys)).all()
            for row, srow, qq in zip(ids, sc, qs):
                assert len(set(row.tolist())) == len(row)
                np.testing.assert_allclose(srow, keys[row] @ qq, rtol=1e-5, atol=1e-5)
                assert (np.diff(srow) <= 0).all()
            checked += 1
        return checked

    with ThreadPoolExecutor(5) as pool:
        writer = pool.submit(insert)
        counts = list(pool.map(search, range(4)))
        writer.result()
    assert not errors, errors
    assert min(counts) >= 5
    assert len(idx) == len(keys)
    # The grown index still searches well (the inserted keys are linked in).
    exact, _ = qkindex.exact_topk(queries, keys, 10)
    assert qkindex.recall(idx.search(queries, k=10, ef=256).ids, exact) > 0.9


def test_retopk_steps_while_another_thread_appends(data):
    keys, train, queries = data
    rt = qkindex.ReTopK(keys[:1500], k=20)
    rt.prime(train[:128])
    stop = threading.Event()

    def append():
        for key in keys[1500:]:
            rt.append(key)
        stop.set()

    def step(t):
        n = 0
        while not stop.is_set() or n < 5:
            ids, _ = rt.step(queries[(t + n) % len(queries)])
            assert (ids >= 0).all() and (ids < len(keys)).all()
            assert len(set(ids.tolist())) == len(ids)
            n += 1
        return n

    with ThreadPoolExecutor(4) as pool:
        w = pool.submit(append)
        assert min(pool.map(step, range(3))) >= 5
        w.result()
    assert len(rt) == len(keys)
