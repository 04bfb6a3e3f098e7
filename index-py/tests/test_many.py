"""``qkindex.build`` (any kind from one spec string) and ``qkindex.search_many`` (many indexes,
each with its own queries, in one call) (issue 45)."""

import numpy as np
import pytest

import qkindex

from conftest import brute_topk


@pytest.mark.parametrize(
    "spec, cls",
    [
        ("attention", qkindex.AttentionIndex),
        ("attention:codes=i8-inline", qkindex.AttentionIndex),
        ("flat", qkindex.FlatIndex),
        ("flat:codes=i8", qkindex.FlatIndex),
        ("ivf", qkindex.IvfIndex),
        ("ivf:codes=i8", qkindex.IvfIndex),
        ("hnsw:m=8", qkindex.HnswIndex),
        ("robust-vamana:r=16,l=32", qkindex.VamanaIndex),
    ],
)
def test_build_any_spec_returns_its_class_and_saves(spec, cls, data, tmp_path):
    keys, train, queries = data
    idx = qkindex.build(spec, keys, train)
    assert isinstance(idx, cls) and len(idx) == len(keys)
    exact, _ = brute_topk(queries, keys, 10)
    # Wide searches: every list of IVF, a long candidate list (re-ranked codes included).
    kw = {"ef": 200, **({"nprobe": idx.nlist} if cls is qkindex.IvfIndex else {})}
    res = idx.search(queries, k=10, **kw)
    assert qkindex.recall(res.ids, exact) > 0.9, spec
    path = tmp_path / "index.qki"
    idx.save(path)
    back = qkindex.load(path)
    assert type(back) is cls
    np.testing.assert_array_equal(back.search(queries, k=10, **kw).ids, res.ids)


def test_codes_kinds_take_their_search_parameters(data):
    keys, _, queries = data
    exact, _ = brute_topk(queries, keys, 10)
    ivf = qkindex.build("ivf:codes=i8", keys)
    assert ivf.params["codes"] == "i8"
    # More lists and more re-ranked candidates: at least the recall of fewer.
    few = qkindex.recall(ivf.search(queries, k=10, nprobe=2, ef=10).ids, exact)
    many = qkindex.recall(ivf.search(queries, k=10, nprobe=ivf.nlist, ef=400).ids, exact)
    assert many >= few and many > 0.95
    flat = qkindex.build("flat", keys, codes="i8")
    assert flat.params["codes"] == "i8"
    assert qkindex.recall(flat.search(queries, k=10, ef=200).ids, exact) > 0.95


def test_build_options_are_spec_keys(data):
    keys, train, _ = data
    assert qkindex.build("ivf", keys, nlist=7).nlist == 7
    assert qkindex.build("ivf:nlist=5", keys, iters=3).nlist == 5
    a = qkindex.build("attention", keys, train, kq=20, default_ef=40, causal=False)
    assert a.params["kq"] == 20 and a.params["default_ef"] == 40
    h = qkindex.build("hnsw", keys, m=6, ef_construction=40)
    assert h.params["m"] == 6


def test_build_errors_name_the_problem(data):
    keys, train, _ = data
    with pytest.raises(ValueError, match="unknown index kind"):
        qkindex.build("nope", keys)
    with pytest.raises(ValueError, match="nlist"):
        qkindex.build("ivf", keys, nlist=0)
    with pytest.raises(ValueError, match="colour"):
        qkindex.build("flat", keys, colour=3)
    with pytest.raises(ValueError, match="train_queries"):
        qkindex.build("attention", keys)
    with pytest.raises(ValueError, match="train_queries"):
        qkindex.build("attention", keys, train[:, :5])


def test_search_many_equals_each_index_searched_alone(data):
    keys, train, queries = data
    indexes = [
        qkindex.build("attention", keys, train),
        qkindex.build("flat", keys[:1500]),
        qkindex.build("ivf:codes=i8", keys),
    ]
    q = np.stack([queries[:5], queries[5:10], queries[10:15]])
    res = qkindex.search_many(indexes, q, k=10, ef=48)
    assert res.ids.shape == (3, 5, 10) and res.scores.shape == (3, 5, 10)
    assert res.distance_computations.shape == (3, 5)
    assert res.ids.dtype == np.int64
    for i, idx in enumerate(indexes):
        one = idx.search(q[i], k=10, ef=48)
        np.testing.assert_array_equal(res.ids[i], one.ids)
        np.testing.assert_array_equal(res.scores[i], one.scores)
        np.testing.assert_array_equal(res.distance_computations[i], one.distance_computations)
    # float16 queries, and an empty batch.
    half = qkindex.search_many(indexes[:2], q[:2].astype(np.float16), k=5)
    assert half.ids.shape == (2, 5, 5)
    assert qkindex.search_many(indexes, q[:, :0], k=5).ids.shape == (3, 0, 5)


def test_search_many_errors(data, attention_index):
    keys, _, queries = data
    q = queries[None, :4]
    with pytest.raises(ValueError, match=r"queries: expected shape \[2, b, 32\]"):
        qkindex.search_many([attention_index, attention_index], q)
    with pytest.raises(ValueError, match="queries"):
        qkindex.search_many([attention_index], queries[:4])
    with pytest.raises(ValueError, match="at least one"):
        qkindex.search_many([], q)
    with pytest.raises(TypeError, match=r"indexes\[1\]"):
        qkindex.search_many([attention_index, "x"], np.concatenate([q, q]))
    small = qkindex.FlatIndex.build(keys[:5, :16])
    with pytest.raises(ValueError, match=r"indexes\[1\]: key dimension 16"):
        qkindex.search_many([attention_index, small], np.concatenate([q, q]))
    with pytest.raises(ValueError, match="k: must be at most"):
        qkindex.search_many([qkindex.FlatIndex.build(keys[:5])], q, k=6)
    bad = q.copy()
    bad[0, 1, 3] = np.nan
    with pytest.raises(ValueError):
        qkindex.search_many([attention_index], bad)


def test_patience_stops_graph_searches_early(data, attention_index):
    """``patience`` (issue 62): a graph search stops once its best k have not changed for that
    many expansions; the same in ``search`` and ``search_many``; a patience longer than any
    search changes nothing; 0 is refused."""
    _, _, queries = data
    many = lambda **kw: qkindex.search_many([attention_index], queries[None], k=10, ef=200, **kw)
    full, early = many(), many(patience=4)
    assert early.distance_computations.sum() < full.distance_computations.sum()
    one = attention_index.search(queries, k=10, ef=200, patience=4)
    np.testing.assert_array_equal(one.ids, early.ids[0])
    np.testing.assert_array_equal(many(patience=10**6).ids, full.ids)
    # A percentage of ef: 2% of 200 is 4 expansions.
    np.testing.assert_array_equal(many(patience="2%").ids, early.ids)
    for bad in (0, "0%", "soon"):
        with pytest.raises(ValueError, match="patience"):
            many(patience=bad)
        with pytest.raises(ValueError, match="patience"):
            attention_index.search(queries, k=10, patience=bad)
    with pytest.raises(TypeError, match="patience"):
        many(patience=2.5)
