"""The Python contract of docs/DESIGN.md §4 for the kinds that exist: build, search, exact top-k,
metrics, dumps."""

import numpy as np
import pytest

import qkindex
from conftest import brute_topk


def test_flat_matches_brute_force_and_exact_topk(data):
    keys, _, queries = data
    flat = qkindex.FlatIndex.build(keys)
    res = flat.search(queries, k=10)
    ids, scores = brute_topk(queries, keys, 10)
    assert res.ids.dtype == np.int64 and res.ids.shape == (len(queries), 10)
    assert res.scores.dtype == np.float32 and res.scores.shape == (len(queries), 10)
    assert res.distance_computations.dtype == np.int64
    assert res.distance_computations.shape == (len(queries),)
    np.testing.assert_array_equal(res.ids, ids)
    np.testing.assert_allclose(res.scores, scores, rtol=1e-4, atol=1e-4)
    assert (res.distance_computations == len(keys)).all()
    eids, escores = qkindex.exact_topk(queries, keys, 10)
    assert eids.dtype == np.int64 and escores.dtype == np.float32
    np.testing.assert_array_equal(eids, ids)
    np.testing.assert_allclose(escores, scores, rtol=1e-4, atol=1e-4)


def test_attention_index_recall_and_scanned(data, attention_index):
    keys, _, queries = data
    idx = attention_index
    assert len(idx) == len(keys) and idx.dim == keys.shape[1] and idx.dtype == "float32"
    exact, _ = qkindex.exact_topk(queries, keys, 10)
    res = idx.search(queries, k=10, ef=64)
    assert (np.diff(res.scores, axis=1) <= 0).all(), "scores descending"
    assert qkindex.recall(res.ids, exact) >= 0.9
    scanned = res.distance_computations.mean() / len(keys)
    assert 0 < scanned < 0.8
    # ef = n visits everything reachable: exact.
    full = idx.search(queries, k=10, ef=len(keys))
    assert qkindex.recall(full.ids, exact) == 1.0
    # the default ef (index default, raised to k)
    assert qkindex.recall(idx.search(queries, k=10).ids, exact) >= 0.9


@pytest.mark.parametrize("prune", ["top", "occlusion", "occlusion-fill"])
def test_every_pruning_rule_builds_a_searchable_index(data, prune):
    keys, train, queries = data
    idx = qkindex.AttentionIndex.build(keys, train, kq=50, max_degree=24, prune=prune)
    exact, _ = qkindex.exact_topk(queries, keys, 10)
    assert qkindex.recall(idx.search(queries, k=10, ef=64).ids, exact) >= 0.9
    assert qkindex.recall(idx.search(queries, k=10, ef=len(keys)).ids, exact) == 1.0


def test_unknown_pruning_rule_is_a_value_error(data):
    keys, train, _ = data
    with pytest.raises(ValueError, match=r"prune: expected .*got \"nearest\""):
        qkindex.AttentionIndex.build(keys, train, prune="nearest")


def test_scores_are_inner_products(data, attention_index):
    keys, _, queries = data
    res = attention_index.search(queries, k=5, ef=32)
    want = np.einsum("bd,bkd->bk", queries, keys[res.ids])
    np.testing.assert_allclose(res.scores, want, rtol=1e-4, atol=1e-4)


def test_one_query_gives_1d_results(data, attention_index):
    keys, _, queries = data
    for idx in (attention_index, qkindex.FlatIndex.build(keys)):
        one = idx.search(queries[3], k=7)
        batch = idx.search(queries[3:4], k=7)
        assert one.ids.shape == (7,) and one.scores.shape == (7,)
        assert isinstance(one.distance_computations, np.int64)
        np.testing.assert_array_equal(one.ids, batch.ids[0])
        assert one.distance_computations == batch.distance_computations[0]
    ids, scores = qkindex.exact_topk(queries[0], keys, 4)
    assert ids.shape == (4,) and scores.shape == (4,)


def test_float16_keys_stay_float16(data):
    keys, train, queries = data
    k16 = keys.astype(np.float16)
    idx = qkindex.AttentionIndex.build(k16, train.astype(np.float16), kq=50)
    assert idx.dtype == "float16"
    flat = qkindex.FlatIndex.build(k16)
    assert flat.dtype == "float16"
    want, _ = brute_topk(queries, k16.astype(np.float32), 10)
    got = flat.search(queries.astype(np.float16), k=10)
    # f16 queries are widened exactly; ties aside the exact scan equals numpy's
    assert qkindex.recall(got.ids, want) >= 0.99
    assert qkindex.recall(idx.search(queries, k=10, ef=128).ids, want) >= 0.9


def test_empty_batch(data, attention_index):
    _, _, queries = data
    res = attention_index.search(queries[:0], k=5)
    assert res.ids.shape == (0, 5) and res.distance_computations.shape == (0,)


def test_recall_function():
    assert qkindex.recall(np.array([1, 2, 3]), np.array([3, 4, 1, 9])) == 0.5
    found = np.array([[1, 2], [5, -1]])
    exact = np.array([[2, 1], [5, 6]])
    assert qkindex.recall(found, exact) == pytest.approx(0.75)
    assert qkindex.recall(found.astype(np.int32), exact.astype(np.uint32)) == pytest.approx(0.75)


def test_attention_mass_matches_numpy(data):
    keys, _, queries = data
    q = queries[0]
    ids, _ = qkindex.exact_topk(q, keys, 20)
    logits = keys.astype(np.float64) @ q.astype(np.float64) / np.sqrt(keys.shape[1])
    w = np.exp(logits - logits.max())
    w /= w.sum()
    assert qkindex.attention_mass(q, keys, ids) == pytest.approx(w[ids].sum(), rel=1e-6)
    assert qkindex.attention_mass(q, keys, np.arange(len(keys))) == pytest.approx(1.0)
    # batch: the mean over queries; −1 padding counts nothing
    ids2, _ = qkindex.exact_topk(queries[:2], keys, 20)
    m2 = qkindex.attention_mass(queries[:2], keys, ids2)
    m_each = [qkindex.attention_mass(queries[i], keys, ids2[i]) for i in range(2)]
    assert m2 == pytest.approx(np.mean(m_each))
    padded = np.concatenate([ids, [-1, -1]])
    assert qkindex.attention_mass(q, keys, padded) == pytest.approx(w[ids].sum(), rel=1e-6)


def test_params_and_build_stats(attention_index):
    p = attention_index.params
    assert p["kq"] == 50 and p["max_degree"] == 24
    s = attention_index.build_stats
    assert s["train_queries"] == 400 and s["edges"] > 0 and s["total_s"] >= 0
    assert "AttentionIndex(n=2000" in repr(attention_index)


def test_python_defaults_match_the_rust_defaults():
    import inspect

    rust = qkindex._native._attention_defaults()
    sig = inspect.signature(qkindex.AttentionIndex.build)
    for name in ("kq", "max_degree", "build_ef", "default_ef", "causal"):
        assert sig.parameters[name].default == rust[name], name


def test_device_cpu_and_auto(data):
    keys, train, queries = data
    a, _ = qkindex.exact_topk(queries, keys, 5, device="cpu")
    b, _ = qkindex.exact_topk(queries, keys, 5, device="auto")
    np.testing.assert_array_equal(a, b)


def test_knn_device_names_the_backend_and_why():
    assert qkindex.knn_device("cpu") == "cpu"
    auto = qkindex.knn_device()
    # Without a usable GPU, auto says so and why; with one, it names the device.
    assert auto.startswith("cpu (auto: no usable GPU: ") or auto.startswith("cuda:0"), auto
    with pytest.raises(ValueError, match="device"):
        qkindex.knn_device("tpu")


def test_causal_build(data):
    keys, train, queries = data
    idx = qkindex.AttentionIndex.build(keys[:400], train, kq=20, causal=True)
    assert idx.params["causal"] is True
    exact, _ = qkindex.exact_topk(queries, keys[:400], 10)
    assert qkindex.recall(idx.search(queries, k=10, ef=400).ids, exact) == 1.0


def test_load_real_dump(subset):
    dump = qkindex.load_dump(subset)
    m = dump.manifest
    assert m["format"].startswith("qkindex-dump/") and m["head_dim"] == 64
    layer = dump.layers[0]
    q, k, qdec = dump.q(layer), dump.k(layer), dump.qdec(layer)
    assert q.dtype == np.float32
    assert q.shape == (m["n_q_heads"], m["n_prefill"], 64)
    assert k.shape == (m["n_kv_heads"], m["n_prefill"], 64)
    assert qdec.shape == (m["n_q_heads"], m["n_decode"], 64)
    assert dump.has(layer, "v") and dump.kv_head_of(m["n_q_heads"] - 1) == m["n_kv_heads"] - 1
    assert qkindex.validate_dump(subset) == []
    # The stored float16 values read back exactly.
    raw = np.load(subset / f"layer{layer:02d}.k.npy")
    np.testing.assert_array_equal(k, raw.astype(np.float32))
    with pytest.raises(ValueError, match="layer"):
        dump.q(99)


def test_real_dump_head_recall(subset):
    dump = qkindex.load_dump(subset)
    layer = dump.layers[0]
    keys = dump.k(layer)[0].astype(np.float16)
    train = dump.q(layer)[0]
    queries = dump.qdec(layer)[0][:16]
    idx = qkindex.AttentionIndex.build(keys, train)
    exact, _ = qkindex.exact_topk(queries, keys, 100)
    res = idx.search(queries, k=100, ef=256)
    assert qkindex.recall(res.ids, exact) >= 0.9
    assert res.distance_computations.mean() < len(keys)


def _tensors(rng, n_q=4, n_kv=2, n=50, n_dec=3, d=8, dtype=np.float16):
    def t(h, r):
        return rng.standard_normal((h, r, d)).astype(dtype)

    return {"q": t(n_q, n), "k": t(n_kv, n), "v": t(n_kv, n), "qdec": t(n_q, n_dec),
            "kdec": t(n_kv, n_dec)}


def test_write_dump_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    layers = {2: _tensors(rng), 7: _tensors(rng, dtype=np.float32)}
    # a strided view is written in logical order
    layers[2]["k"] = np.ascontiguousarray(layers[2]["k"][:, ::-1])[:, ::-1]
    out = tmp_path / "dump"
    dump = qkindex.write_dump(out, {"model": "test", "rope_theta": 1e4, "extra": 1}, layers)
    m = dump.manifest
    assert m["layers"] == [2, 7] and m["n_q_heads"] == 4 and m["n_kv_heads"] == 2
    assert m["n_prefill"] == 50 and m["n_decode"] == 3 and m["head_dim"] == 8
    assert m["n_layers"] == 8 and m["source"] == ""
    assert qkindex.validate_dump(out) == []
    for layer, parts in layers.items():
        for p, a in parts.items():
            np.testing.assert_array_equal(getattr(dump, p)(layer), a.astype(np.float32))
    assert np.load(out / "layer02.q.npy").dtype == np.float16
    assert np.load(out / "layer07.q.npy").dtype == np.float32


def test_write_dump_rejects_bad_input(tmp_path):
    rng = np.random.default_rng(2)
    good = _tensors(rng)
    fields = {"model": "test", "rope_theta": 1e4}
    with pytest.raises(ValueError, match="rope_theta"):
        qkindex.write_dump(tmp_path / "a", {"model": "x"}, {0: good})
    with pytest.raises(TypeError, match=r"layers\[0\]\['q'\].*float64"):
        qkindex.write_dump(tmp_path / "a", fields, {0: {**good, "q": good["q"].astype(np.float64)}})
    with pytest.raises(ValueError, match=r"layers\[0\]\['k'\]: expected shape \[2, 50, 8\]"):
        qkindex.write_dump(tmp_path / "a", fields, {0: {**good, "k": good["k"][:, :40]}})
    bad = good["v"].copy()
    bad[1, 7, 3] = np.nan
    with pytest.raises(ValueError, match="head 1, row 7"):
        qkindex.write_dump(tmp_path / "a", fields, {0: {**good, "v": bad}})
    with pytest.raises(ValueError, match="missing 'k'"):
        qkindex.write_dump(tmp_path / "a", fields, {0: {"q": good["q"]}})
    with pytest.raises(ValueError, match="unknown tensors"):
        qkindex.write_dump(tmp_path / "a", fields, {0: {**good, "x": good["q"]}})
    with pytest.raises(ValueError, match="head_dim"):
        qkindex.write_dump(tmp_path / "a", {**fields, "head_dim": 16}, {0: good})


def test_validate_dump_says_what_is_wrong(tmp_path):
    rng = np.random.default_rng(3)
    out = tmp_path / "d"
    qkindex.write_dump(out, {"model": "t", "rope_theta": 1e4}, {0: _tensors(rng), 1: _tensors(rng)})
    (out / "layer01.k.npy").unlink()
    np.save(out / "layer00.q.npy", np.zeros((4, 49, 8), np.float16))
    qdec = np.zeros((4, 3, 8), np.float32)
    qdec[2, 1, 0] = np.inf
    np.save(out / "layer00.qdec.npy", qdec)
    np.save(out / "layer00.v.npy", np.zeros((2, 50, 8), np.float64))
    problems = qkindex.validate_dump(out)
    text = "\n".join(problems)
    assert len(problems) == 4, text
    assert "layer01.k.npy: missing" in text
    assert "layer00.q.npy" in text and "[4, 50, 8]" in text
    assert "layer00.qdec.npy" in text and "non-finite" in text
    assert "layer00.v.npy" in text and "float16 or float32" in text


def test_bad_manifest_is_a_format_error(tmp_path):
    (tmp_path / "manifest.json").write_text('{"format": "qkindex-dump/1"}')
    with pytest.raises(qkindex.FormatError, match="manifest"):
        qkindex.load_dump(tmp_path)
    assert issubclass(qkindex.FormatError, ValueError)
    assert qkindex.validate_dump(tmp_path) != []
    with pytest.raises(FileNotFoundError):
        qkindex.load_dump(tmp_path / "nope")


def test_reading_a_corrupt_tensor_is_a_format_error(tmp_path):
    rng = np.random.default_rng(4)
    out = tmp_path / "d"
    dump = qkindex.write_dump(out, {"model": "t", "rope_theta": 1e4}, {0: _tensors(rng)})
    raw = (out / "layer00.k.npy").read_bytes()
    (out / "layer00.k.npy").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(qkindex.FormatError):
        dump.k(0)


def test_rust_timing_helper(data, attention_index):
    _, _, queries = data
    times = qkindex._native._search_latency_ns(attention_index, queries[:4], k=10, ef=32, rounds=3)
    assert len(times) == 12 and all(t > 0 for t in times)
    with pytest.raises(TypeError, match="index"):
        qkindex._native._search_latency_ns(object(), queries[:4])


def test_auto_ef_raises_the_default_ef_to_what_the_last_queries_need(data):
    keys, train, queries = data
    plain = qkindex.AttentionIndex.build(keys, train)
    assert plain.build_stats["auto_ef"] is None
    index = qkindex.AttentionIndex.build(keys, train, auto_ef=0.999)
    a = index.build_stats["auto_ef"]
    assert a["target"] == 0.999 and a["queries"] == 64 and a["heads"] == 1
    assert a["ef_before"] == 128 and a["ef_after"] == max(128, a["needed"])
    assert index.params["default_ef"] == a["ef_after"]
    if a["reached"]:
        assert a["recall_after"] >= 0.999
    # Searches without an ef run at the measured one.
    by_default = index.search(queries, k=10)
    at = index.search(queries, k=10, ef=a["ef_after"])
    np.testing.assert_array_equal(by_default.ids, at.ids)
    np.testing.assert_array_equal(by_default.scores, at.scores)
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="auto_ef"):
            qkindex.AttentionIndex.build(keys, train, auto_ef=bad)


def test_knn_pool_builds_from_pooled_lists(data):
    keys, train, queries = data
    exact = qkindex.AttentionIndex.build(keys, train)
    assert "knn_pool" not in exact.params
    index = qkindex.AttentionIndex.build(keys, train, knn_pool=200)
    assert index.params["knn_pool"] == 200
    assert index.build_stats["train_queries"] == len(train)
    # A search over every key is the exact top-k whatever lists the graph was built from.
    got = index.search(queries, k=10, ef=len(keys))
    want_ids, want_scores = brute_topk(queries, keys, 10)
    np.testing.assert_array_equal(got.ids, want_ids)
    np.testing.assert_allclose(got.scores, want_scores, rtol=1e-4, atol=1e-4)
    for bad in ({"knn_pool": 99}, {"knn_pool": 200, "causal": True}, {"knn_pool": -1}):
        with pytest.raises(ValueError, match="knn_pool"):
            qkindex.AttentionIndex.build(keys, train, **bad)
