"""qkindex.ReTopK: steps against a numpy reimplementation of the selector, path statistics,
priming, appended keys, an index as the exact path, and input errors."""

from collections import deque

import numpy as np
import pytest

import qkindex

from conftest import brute_topk, ood_data


class Reference:
    """The selector in numpy (float64 cosines and scores), as the paper states it."""

    def __init__(self, c=32, r=4, w=32, tau=0.85, refresh=128, k=512):
        self.c, self.r, self.w, self.tau, self.refresh, self.k = c, r, w, tau, refresh, k
        self.cache = deque()
        self.steps = 0

    def step(self, q, keys):
        n = len(keys)
        k = min(self.k, n)
        q = np.asarray(q, np.float64)
        u = q / np.linalg.norm(q)
        sims = [(float(cu @ u), i) for i, (cu, _) in enumerate(self.cache)]
        sims.sort(key=lambda s: (-s[0], -s[1]))  # most similar first, then most recent
        best = sims[0][0] if sims else -np.inf
        self.steps += 1
        if not self.cache:
            path = "empty_cache"
        elif self.steps % self.refresh == 0:
            path = "refresh"
        elif best < self.tau:
            path = "low_similarity"
        else:
            path = "reuse"
        if path == "reuse":
            cand = set(range(max(n - self.w, 0), n))
            for _, i in sims[: self.r]:
                cand |= {int(x) for x in self.cache[i][1] if x < n}
            cand = np.array(sorted(cand))
            scores = np.asarray(keys, np.float64)[cand] @ q
            order = np.argsort(-scores, kind="stable")[:k]
            ids = cand[order]
        else:
            ids = brute_topk(q, keys, k)[0]
        self.cache.append((u, ids))
        if len(self.cache) > self.c:
            self.cache.popleft()
        return path, np.asarray(ids, np.int64), best, (len(cand) if path == "reuse" else n)


def query_stream(queries, steps, seed):
    """Decode-like queries: mostly small perturbations of the previous one, sometimes a jump."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        if out and rng.random() < 0.6:
            prev = out[-1]
            scale = np.linalg.norm(prev) / np.sqrt(len(prev))
            out.append((prev + 0.15 * scale * rng.standard_normal(len(prev))).astype(np.float32))
        else:
            out.append(queries[rng.integers(len(queries))].copy())
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_steps_match_numpy_brute_force(dtype):
    keys, train, _ = ood_data(n=1500, m=200, d=32, seed=3)
    keys = keys.astype(dtype)
    params = dict(c=8, r=2, w=16, tau=0.9, refresh=10, k=20)
    rt = qkindex.ReTopK(keys, **params)
    ref = Reference(**params)
    paths = []
    for t, q in enumerate(query_stream(train, 80, seed=4)):
        ids, stats = rt.step(q)
        path, want, best, cand = ref.step(q, keys.astype(np.float32))
        assert stats["path"] == path, t
        assert ids.dtype == np.int64 and ids.shape == (20,)
        np.testing.assert_array_equal(ids, want, err_msg=f"step {t} ({path})")
        assert stats["candidates"] == cand
        assert stats["distance_computations"] == cand
        assert stats["similarity_computations"] == min(t, 8)
        if t:
            assert stats["best_similarity"] == pytest.approx(best, abs=1e-5)
        paths.append(path)
    assert 20 <= paths.count("reuse") <= 70, paths
    assert paths.count("refresh") == 8
    assert rt.steps == 80 and rt.cache_len == 8


def test_path_statistics_of_a_repeated_query(data):
    keys, _, queries = data
    rt = qkindex.ReTopK(keys, refresh=4, k=10)
    assert rt.params == dict(c=32, r=4, w=32, tau=pytest.approx(0.85), refresh=4, k=10,
                             seed_fallback=True)
    exact = brute_topk(queries[0], keys, 10)[0]
    seen = []
    for step in range(1, 10):
        ids, stats = rt.step(queries[0])
        np.testing.assert_array_equal(ids, exact)
        assert set(stats) == {"path", "candidates", "best_similarity",
                              "similarity_computations", "distance_computations", "hops"}
        seen.append(stats["path"])
        if stats["path"] == "reuse":
            assert stats["best_similarity"] == pytest.approx(1.0, abs=1e-5)
            assert stats["candidates"] <= 10 + 32
            assert stats["hops"] == 0
        else:
            assert stats["candidates"] == len(keys)
        assert rt.steps == step and rt.cache_len == step
    assert seen == ["empty_cache", "reuse", "reuse", "refresh", "reuse", "reuse", "reuse",
                    "refresh", "reuse"]
    first = qkindex.ReTopK(keys).step(queries[0])[1]
    assert first["best_similarity"] == -np.inf and first["similarity_computations"] == 0

    # Dissimilar queries fall back: an orthogonal pair has cosine 0 < tau.
    d = keys.shape[1]
    rt = qkindex.ReTopK(keys, k=5)
    e0, e1 = np.eye(d, dtype=np.float32)[:2]
    rt.step(e0)
    ids, stats = rt.step(e1)
    assert stats["path"] == "low_similarity"
    assert stats["best_similarity"] == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_array_equal(ids, brute_topk(e1, keys, 5)[0])


def test_prime_with_causal_visibility(data):
    keys, train, queries = data
    rt = qkindex.ReTopK(keys, c=4, r=1, k=8)
    m = 10
    rt.prime(train[:m], visible=np.arange(1, m + 1))
    assert rt.cache_len == 4 and rt.steps == 0
    # The most recent primed query, asked again, is reused; its set is its exact top-8 over
    # keys 0..10, re-ranked with the last 32 keys of all 2000.
    ids, stats = rt.step(train[m - 1])
    assert stats["path"] == "reuse"
    cand = np.r_[brute_topk(train[m - 1], keys[:m], 8)[0], np.arange(len(keys) - 32, len(keys))]
    s = keys[cand].astype(np.float64) @ train[m - 1].astype(np.float64)
    np.testing.assert_array_equal(ids, cand[np.argsort(-s, kind="stable")[:8]])

    rt = qkindex.ReTopK(keys, k=8)
    rt.prime(train[:3])  # visible defaults to every key
    assert rt.cache_len == 3
    with pytest.raises(ValueError, match=r"visible: expected shape \(3,\)"):
        rt.prime(train[:3], visible=[1, 2])
    with pytest.raises(ValueError, match="visible"):
        rt.prime(train[:2], visible=[1, len(keys) + 1])
    with pytest.raises(ValueError, match="visible: must be at least 0"):
        rt.prime(train[:2], visible=[1, -1])
    with pytest.raises(TypeError, match="visible"):
        rt.prime(train[:2], visible=[1.0, 2.0])
    assert rt.cache_len == 3


def test_appended_keys_enter_through_the_window(data):
    keys, _, queries = data
    rt = qkindex.ReTopK(keys[:100], k=5, w=4)
    q = queries[0]
    rt.step(q)
    rt.step(q)
    assert len(rt) == 100
    # A key far along q: the next step (reuse) must find it through the window, and the
    # exact path (a flat scan of the grown keys) must too.
    big = (q / np.linalg.norm(q) * 1e3).astype(np.float32)
    assert rt.append(big) == 100
    assert len(rt) == 101
    ids, stats = rt.step(q)
    assert stats["path"] == "reuse" and ids[0] == 100
    rt2 = qkindex.ReTopK(keys[:100], k=5, tau=1.0)
    rt2.append(big)
    ids, stats = rt2.step(q)
    assert stats["path"] == "empty_cache" and ids[0] == 100
    assert stats["candidates"] == 101
    with pytest.raises(ValueError, match=r"key: expected shape"):
        rt.append(keys[:2])
    with pytest.raises(ValueError, match="non-finite"):
        rt.append(np.full(keys.shape[1], np.nan, np.float32))
    assert len(rt) == 101


def test_an_index_as_the_exact_path(data, attention_index):
    keys, _, queries = data
    rt = qkindex.ReTopK(keys, index=attention_index, k=10, ef=64, refresh=1)
    for i, q in enumerate(queries[:5]):
        ids, stats = rt.step(q)
        assert stats["path"] == ("empty_cache" if i == 0 else "refresh")
        assert stats["distance_computations"] < len(keys)
        assert stats["hops"] > 0
        assert len(set(ids.tolist())) == 10 and ids.min() >= 0 and ids.max() < len(keys)
        s = keys[ids].astype(np.float64) @ q.astype(np.float64)
        assert np.all(np.diff(s) <= 1e-4)
    with pytest.raises(ValueError, match="append"):
        rt.append(keys[0])
    with pytest.raises(ValueError, match="index: must index the same keys"):
        qkindex.ReTopK(keys[:100], index=attention_index)
    with pytest.raises(TypeError, match="index: expected a qkindex index"):
        qkindex.ReTopK(keys, index="flat")
    flat = qkindex.FlatIndex.build(keys)
    ids, _ = qkindex.ReTopK(keys, index=flat, k=7).step(queries[0])
    np.testing.assert_array_equal(ids, brute_topk(queries[0], keys, 7)[0])


def test_k_is_capped_at_the_number_of_keys(data):
    keys, _, queries = data
    rt = qkindex.ReTopK(keys[:5])
    for q in queries[:3]:
        ids, _ = rt.step(q)
        assert sorted(ids.tolist()) == [0, 1, 2, 3, 4]


def test_bad_inputs(data):
    keys, _, queries = data
    d = keys.shape[1]
    with pytest.raises(TypeError, match="keys: expected float16, bfloat16 or float32, got float64"):
        qkindex.ReTopK(keys.astype(np.float64))
    with pytest.raises(ValueError, match=r"keys: expected shape \[n, d\]"):
        qkindex.ReTopK(keys[0])
    for kwargs, name in [(dict(c=0), "c"), (dict(r=0), "r"), (dict(r=40), "r"),
                         (dict(k=0), "k"), (dict(refresh=0), "refresh"), (dict(tau=1.5), "tau"),
                         (dict(tau=float("nan")), "tau"), (dict(w=-1), "w"), (dict(ef=0), "ef")]:
        with pytest.raises(ValueError, match=name):
            qkindex.ReTopK(keys, **kwargs)
    rt = qkindex.ReTopK(keys)
    with pytest.raises(TypeError, match="query: .*float64"):
        rt.step(queries[0].astype(np.float64))
    with pytest.raises(ValueError, match=rf"query: expected shape \[b, {d}\] or \[{d}\]"):
        rt.step(queries[0][:-1])
    with pytest.raises(ValueError, match=rf"query: expected shape \({d},\)"):
        rt.step(queries[:2])
    bad = queries[0].copy()
    bad[3] = np.inf
    with pytest.raises(ValueError, match="query: non-finite"):
        rt.step(bad)
    with pytest.raises(ValueError, match=r"queries: expected shape \[n, 32\]"):
        rt.prime(queries[0])
    assert rt.steps == 0 and rt.cache_len == 0
    # float16 queries and keys are accepted
    ids, _ = qkindex.ReTopK(keys.astype(np.float16), k=3).step(queries[0].astype(np.float16))
    assert ids.shape == (3,)
    assert "ReTopK(n=2000, dim=32" in repr(rt)


def test_a_reuse_step_with_few_candidates_pads_with_minus_one(data):
    keys, train, _ = data
    rt = qkindex.ReTopK(keys, k=100, w=32)
    # The primed query saw one key: reusing its set gives 1 + 32 window candidates.
    rt.prime(train[:1], visible=[1])
    ids, stats = rt.step(train[0])
    assert stats["path"] == "reuse" and stats["candidates"] == 33
    assert ids.shape == (100,)
    assert (ids[:33] >= 0).all() and (ids[33:] == -1).all()
    assert set(ids[:33].tolist()) == {0, *range(len(keys) - 32, len(keys))}
