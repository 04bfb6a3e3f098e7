"""Concurrent ``search`` and ``insert`` from 8 Python threads on every kind that inserts
(issue 45): at least 10^4 operations per kind; no search returns an id whose insert had not
started, every returned score is the inner product with the key of that id, every inserted key
is findable as soon as its insert returns, nothing crashes, and the final index answers
exactly as an index built the same way and given the same inserts in id order."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import qkindex

D = 32
N_BASE = 1000
WRITERS, READERS = 2, 6
INSERTS_PER_WRITER = 1000
SEARCHES_PER_READER = 1400


def _data():
    rng = np.random.default_rng(45)
    base = rng.standard_normal((N_BASE, D)).astype(np.float32)
    train = (rng.standard_normal((600, D)) * 0.7 + 1.0).astype(np.float32)
    # Inserted keys are longer than the base keys, so each is its own best match.
    extra = (rng.standard_normal((WRITERS * INSERTS_PER_WRITER, D)) * 2.5).astype(np.float32)
    queries = (rng.standard_normal((64, D)) * 0.7 + 1.0).astype(np.float32)
    return base, train, extra, queries


KINDS = {
    "attention": (
        lambda base, train: qkindex.AttentionIndex.build(base, train, kq=30, max_degree=16),
        lambda idx, key: idx.insert(key),
        {"ef": 64},
    ),
    "flat": (
        lambda base, train: qkindex.FlatIndex.build(base),
        lambda idx, key: idx.insert(key),
        {},
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_eight_threads_search_and_insert(kind):
    build, insert, kw = KINDS[kind]
    base, train, extra, queries = _data()
    idx = build(base, train)
    lock = threading.Lock()
    started = [0]  # inserts begun (ids below N_BASE + started may be visible)
    key_of = {}  # id -> row of `extra`, recorded when the insert returns
    barrier = threading.Barrier(WRITERS + READERS)
    seen = []  # (query rows, ids, scores) of every search, checked once all keys are known

    def writer(w):
        barrier.wait()
        missed = 0
        for i in range(w, len(extra), WRITERS):
            with lock:
                started[0] += 1
            new_id = insert(idx, extra[i])
            with lock:
                key_of[new_id] = i
            # Findable as soon as the insert returns.
            res = idx.search(extra[i], k=10, **kw)
            missed += int(new_id not in res.ids)
        return missed, INSERTS_PER_WRITER * 2

    def reader(r):
        barrier.wait()
        rng = np.random.default_rng(r)
        for s in range(SEARCHES_PER_READER):
            rows = rng.integers(0, len(queries), size=1 + (s % 3 == 0) * 3)
            if r == 0 and s % 2:
                res = qkindex.search_many([idx, idx], queries[rows][None].repeat(2, 0), k=10, **kw)
                ids, scores = res.ids[1], res.scores[1]
            else:
                res = idx.search(queries[rows], k=10, **kw)
                ids, scores = res.ids, res.scores
            with lock:
                limit = N_BASE + started[0]
            assert (ids >= 0).all() and (ids < limit).all(), (ids.max(), limit)
            seen.append((rows, ids, scores))
        return 0, SEARCHES_PER_READER

    with ThreadPoolExecutor(WRITERS + READERS) as pool:
        jobs = [pool.submit(writer, w) for w in range(WRITERS)]
        jobs += [pool.submit(reader, r) for r in range(READERS)]
        outcomes = [j.result() for j in jobs]
    assert sum(ops for _, ops in outcomes) >= 10_000
    assert sum(missed for missed, _ in outcomes) == 0, "inserted keys not found right after insert"
    assert len(idx) == N_BASE + len(extra)
    assert sorted(key_of) == list(range(N_BASE, N_BASE + len(extra)))

    # Every score a search returned is the inner product with the key of that id, best first.
    all_keys = np.concatenate([base, extra[[key_of[i] for i in range(N_BASE, len(idx))]]])
    for rows, ids, scores in seen:
        want = np.einsum("bkd,bd->bk", all_keys[ids], queries[rows])
        np.testing.assert_allclose(scores, want, rtol=1e-4, atol=1e-4)
        assert (np.diff(scores, axis=1) <= 0).all()

    # A sequential replay (same build, the same inserts in id order) answers identically.
    replay = build(base, train)
    for i in range(N_BASE, len(idx)):
        assert insert(replay, extra[key_of[i]]) == i
    for got, want in zip(
        (idx.search(queries, k=10, **kw), idx.search(extra[:64], k=10, **kw)),
        (replay.search(queries, k=10, **kw), replay.search(extra[:64], k=10, **kw)),
    ):
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores, want.scores)
