"""The baseline kinds (HnswIndex, IvfIndex, VamanaIndex) and save -> load(mmap) round trips."""

import numpy as np
import pytest

import qkindex


@pytest.fixture(scope="module")
def exact(data):
    keys, _, queries = data
    return qkindex.exact_topk(queries, keys, 10)[0]


def _check(res, exact, n, b):
    assert res.ids.dtype == np.int64 and res.ids.shape == (b, 10)
    assert res.scores.dtype == np.float32 and res.distance_computations.dtype == np.int64
    assert (np.diff(res.scores, axis=1) <= 0).all()
    assert (res.distance_computations > 0).all()


def test_hnsw(data, exact):
    keys, _, queries = data
    for l2 in (True, False):
        idx = qkindex.HnswIndex.build(keys, m=8, ef_construction=64, l2_reduction=l2)
        assert len(idx) == len(keys) and idx.params["l2_reduction"] is l2
        res = idx.search(queries, k=10, ef=64)
        _check(res, exact, len(keys), len(queries))
        assert qkindex.recall(res.ids, exact) >= (0.8 if l2 else 0.5)
        one = idx.search(queries[0], k=10, ef=64)
        np.testing.assert_array_equal(one.ids, res.ids[0])


def test_ivf(data, exact):
    keys, _, queries = data
    idx = qkindex.IvfIndex.build(keys, nlist=16, iters=5)
    assert idx.nlist == 16
    res = idx.search(queries, k=10, nprobe=4)
    _check(res, exact, len(keys), len(queries))
    full = idx.search(queries, k=10, nprobe=16)  # every list: exact
    assert qkindex.recall(full.ids, exact) == 1.0
    assert (full.distance_computations == len(keys) + 16).all()
    with pytest.raises(ValueError, match="nlist"):
        qkindex.IvfIndex.build(keys, nlist=0)


def test_vamana_and_robust(data, exact):
    keys, train, queries = data
    idx = qkindex.VamanaIndex.build(keys, r=16, l=32)
    res = idx.search(queries, k=10, ef=len(keys))
    _check(res, exact, len(keys), len(queries))
    assert qkindex.recall(res.ids, exact) >= 0.95
    robust = qkindex.VamanaIndex.build(keys, r=16, l=32, train_queries=train, robust=True)
    assert robust.params["robust"] is True
    assert qkindex.recall(robust.search(queries, k=10, ef=64).ids, exact) >= 0.8
    with pytest.raises(ValueError, match="train_queries"):
        qkindex.VamanaIndex.build(keys, robust=True)
    with pytest.raises(ValueError, match=r"train_queries: expected shape \[n, 32\]"):
        qkindex.VamanaIndex.build(keys, train_queries=train[:, :5], robust=True)


@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip(tmp_path, data, attention_index, mmap):
    keys, _, queries = data
    flat = qkindex.FlatIndex.build(keys.astype(np.float16))
    hnsw = qkindex.HnswIndex.build(keys, m=8, ef_construction=64)
    ivf = qkindex.IvfIndex.build(keys.astype(np.float16), nlist=16, iters=5)
    vamana = qkindex.VamanaIndex.build(keys, r=16, l=32)
    for idx, kw in (
        (attention_index, {"ef": 48}),
        (flat, {}),
        (hnsw, {"ef": 48}),
        (ivf, {"nprobe": 4}),
        (vamana, {"ef": 48}),
    ):
        path = tmp_path / f"{type(idx).__name__}.qki"
        idx.save(path)
        back = qkindex.load(path, mmap=mmap)
        assert type(back) is type(idx) and len(back) == len(idx)
        if hasattr(idx, "dtype"):
            assert back.dtype == idx.dtype
        a, b = idx.search(queries, k=10, **kw), back.search(queries, k=10, **kw)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.distance_computations, b.distance_computations)
        back_fast = qkindex.load(path, verify=False)
        np.testing.assert_array_equal(back_fast.search(queries, k=10, **kw).ids, a.ids)


def test_damaged_files_are_format_errors(tmp_path, attention_index):
    path = tmp_path / "a.qki"
    attention_index.save(path)
    raw = bytearray(path.read_bytes())
    (tmp_path / "short.qki").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(qkindex.FormatError):
        qkindex.load(tmp_path / "short.qki")
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "flip.qki").write_bytes(raw)
    with pytest.raises(qkindex.FormatError):
        qkindex.load(tmp_path / "flip.qki")
    (tmp_path / "junk.qki").write_bytes(b"not an index file at all" * 10)
    with pytest.raises(qkindex.FormatError):
        qkindex.load(tmp_path / "junk.qki")
    with pytest.raises(FileNotFoundError):
        qkindex.load(tmp_path / "missing.qki")


def test_beam_narrows_the_search(data, attention_index):
    """`beam` expands only the best items of the list: the same answer at `beam >= ef`, fewer
    inner products below it, and 0 is a ValueError."""
    _, _, queries = data
    plain = attention_index.search(queries, k=20, ef=40)
    same = attention_index.search(queries, k=20, ef=40, beam=40)
    assert (plain.ids == same.ids).all()
    narrow = attention_index.search(queries, k=20, ef=40, beam=8)
    assert narrow.ids.shape == plain.ids.shape
    assert narrow.distance_computations.sum() < plain.distance_computations.sum()
    with pytest.raises(ValueError, match="beam"):
        attention_index.search(queries, k=20, beam=0)


def test_int8_storage(data, exact, tmp_path):
    """dtype="int8" stores one byte per element, a scale per key and an offset and range per
    dimension (issue 26): the flat scan's
    recall against the f32 truth stays high, and the file round trip keeps it int8."""
    keys, train, queries = data
    flat = qkindex.FlatIndex.build(keys, dtype="int8")
    assert flat.dtype == "int8"
    res = flat.search(queries, k=10)
    _check(res, exact, len(keys), len(queries))
    assert qkindex.recall(res.ids, exact) >= 0.95
    idx = qkindex.AttentionIndex.build(keys, train, dtype="int8")
    assert idx.dtype == "int8"
    path = tmp_path / "a8.qki"
    idx.save(path)
    loaded = qkindex.load(path)
    assert loaded.dtype == "int8"
    np.testing.assert_array_equal(
        loaded.search(queries, k=10, ef=64).ids, idx.search(queries, k=10, ef=64).ids
    )
    with pytest.raises(ValueError, match="dtype"):
        qkindex.FlatIndex.build(keys, dtype="int4")
