"""torch tensors are accepted like numpy arrays (CPU ones through __array__ / DLPack; bfloat16
as its bit patterns, widened exactly to f32). Skipped where torch is not installed; a failure
in CI (scripts/test.sh installs it)."""

import numpy as np
import pytest

import qkindex

from conftest import need

torch = need("torch")


def test_tensors_are_accepted(data, attention_index):
    keys, train, queries = data
    tk, tt, tq = torch.from_numpy(keys), torch.from_numpy(train), torch.from_numpy(queries)
    want = attention_index.search(queries, k=10, ef=48)
    got = attention_index.search(tq, k=10, ef=48)
    np.testing.assert_array_equal(got.ids, want.ids)
    one = attention_index.search(tq[0], k=10, ef=48)
    np.testing.assert_array_equal(one.ids, want.ids[0])
    # strided (transposed twice is contiguous; a column slice is not)
    np.testing.assert_array_equal(
        attention_index.search(tq[::2], k=10, ef=48).ids, want.ids[::2])
    idx = qkindex.AttentionIndex.build(tk.half(), tt.half(), kq=50)
    assert idx.dtype == "float16"
    ids, _ = qkindex.exact_topk(tq, tk, 10)
    np.testing.assert_array_equal(ids, qkindex.exact_topk(queries, keys, 10)[0])
    assert qkindex.recall(torch.from_numpy(ids), ids) == 1.0


def _bf16_and_copy(a):
    """A bfloat16 tensor of `a` and its exact float32 copy."""
    b = torch.from_numpy(a).bfloat16()
    return b, b.float()


def test_bfloat16_build_and_search_equal_float32_copies(data):
    keys, train, queries = data
    kb, kf = _bf16_and_copy(keys)
    tb, tf = _bf16_and_copy(train)
    qb, qf = _bf16_and_copy(queries)
    built = [
        (qkindex.AttentionIndex.build(kb, tb, kq=50, max_degree=24),
         qkindex.AttentionIndex.build(kf, tf, kq=50, max_degree=24), {"ef": 48}),
        (qkindex.FlatIndex.build(kb), qkindex.FlatIndex.build(kf), {}),
        (qkindex.HnswIndex.build(kb, m=8, ef_construction=64),
         qkindex.HnswIndex.build(kf, m=8, ef_construction=64), {"ef": 48}),
        (qkindex.IvfIndex.build(kb, nlist=16), qkindex.IvfIndex.build(kf, nlist=16), {}),
        (qkindex.VamanaIndex.build(kb), qkindex.VamanaIndex.build(kf), {"ef": 48}),
    ]
    for from_bf16, from_f32, kw in built:
        # widened: the store holds the exact values (kinds without a dtype store f32 keys)
        assert getattr(from_bf16, "dtype", "float32") == "float32"
        for q in (qb, qb[3], qb[::3], qb.T.contiguous().T):
            qq = q.float()
            got, want = from_bf16.search(q, k=10, **kw), from_f32.search(qq, k=10, **kw)
            np.testing.assert_array_equal(got.ids, want.ids)
            np.testing.assert_array_equal(got.scores, want.scores)
            np.testing.assert_array_equal(from_f32.search(q, k=10, **kw).ids, want.ids)
    ids_b, sc_b = qkindex.exact_topk(qb, kb, 10)
    ids_f, sc_f = qkindex.exact_topk(qf, kf, 10)
    np.testing.assert_array_equal(ids_b, ids_f)
    np.testing.assert_array_equal(sc_b, sc_f)
    assert qkindex.attention_mass(qb[0], kb, ids_b[0]) == qkindex.attention_mass(qf[0], kf, ids_f[0])


def test_bfloat16_retopk_equals_float32_copy(data):
    keys, train, queries = data
    kb, kf = _bf16_and_copy(keys)
    qb, qf = _bf16_and_copy(queries)
    tb, tf = _bf16_and_copy(train)
    rb, rf = qkindex.ReTopK(kb, k=20), qkindex.ReTopK(kf, k=20)
    rb.prime(tb[:64])
    rf.prime(tf[:64])
    for i in range(8):
        assert rb.append(kb[i]) == rf.append(kf[i])
        np.testing.assert_array_equal(rb.step(qb[i])[0], rf.step(qf[i])[0])


def test_bfloat16_conversion_is_exact():
    # Values that float16 cannot hold (range) and bfloat16 holds exactly.
    vals = torch.tensor([[3.0e38, -1.5e-38, 1.0 + 2 ** -7, 65504.0 * 4]], dtype=torch.float32)
    b = vals.bfloat16()
    ids, scores = qkindex.exact_topk(torch.ones(1, 4, dtype=torch.bfloat16), b, 1)
    assert scores[0, 0] == np.float32(b.float().sum().item())
    idx = qkindex.FlatIndex.build(b)
    probe = np.eye(4, dtype=np.float32)
    np.testing.assert_array_equal(idx.search(probe, k=1).scores[:, 0], b.float().numpy()[0])


def test_float64_is_still_a_type_error(data, attention_index):
    _, _, queries = data
    tq = torch.from_numpy(queries)
    with pytest.raises(TypeError, match="queries: expected float16, bfloat16 or float32, got float64"):
        attention_index.search(tq.double())


def test_tensors_outside_host_memory_name_cpu(attention_index):
    meta = torch.empty(4, 32, device="meta")
    with pytest.raises(TypeError, match=r"queries: a tensor on meta .*tensor\.cpu\(\)"):
        attention_index.search(meta)
    with pytest.raises(TypeError, match=r"keys: a tensor on meta .*tensor\.cpu\(\)"):
        qkindex.FlatIndex.build(meta.bfloat16())


def test_tensors_requiring_grad_are_read(data, attention_index):
    _, _, queries = data
    tq = torch.from_numpy(queries.copy()).requires_grad_()
    np.testing.assert_array_equal(attention_index.search(tq, k=5).ids,
                                  attention_index.search(queries, k=5).ids)
    tb = torch.from_numpy(queries.copy()).bfloat16().requires_grad_()
    np.testing.assert_array_equal(attention_index.search(tb, k=5).ids,
                                  attention_index.search(tb.detach().float(), k=5).ids)


def test_write_dump_from_tensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    layer = {"q": torch.randn(2, 30, 8, generator=g).half(), "k": torch.randn(1, 30, 8, generator=g).half()}
    dump = qkindex.write_dump(tmp_path / "d", {"model": "t", "rope_theta": 1e4}, {0: layer})
    np.testing.assert_array_equal(dump.q(0), layer["q"].float().numpy())


def test_write_dump_from_bfloat16_tensors(tmp_path):
    g = torch.Generator().manual_seed(1)
    layer = {"q": torch.randn(2, 30, 8, generator=g).bfloat16(),
             "k": torch.randn(1, 30, 8, generator=g).bfloat16().requires_grad_()}
    dump = qkindex.write_dump(tmp_path / "d", {"model": "t", "rope_theta": 1e4}, {0: layer})
    np.testing.assert_array_equal(dump.q(0), layer["q"].float().numpy())
    np.testing.assert_array_equal(dump.k(0), layer["k"].detach().float().numpy())


class DlpackOnly:
    """Speaks only DLPack (as JAX or CuPy arrays do): read through ``numpy.from_dlpack``."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, *args, **kwargs):
        return self.t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_dlpack_only_objects_are_read(data, attention_index):
    keys, train, queries = data
    tq, tk = torch.from_numpy(queries), torch.from_numpy(keys)
    np.testing.assert_array_equal(attention_index.search(DlpackOnly(tq), k=5, ef=48).ids,
                                  attention_index.search(queries, k=5, ef=48).ids)
    ids, _ = qkindex.exact_topk(DlpackOnly(tq), DlpackOnly(tk.half()), 5)
    np.testing.assert_array_equal(ids, qkindex.exact_topk(queries, keys.astype(np.float16), 5)[0])
    with pytest.raises(TypeError, match="keys: expected float16, bfloat16 or float32, got float64"):
        qkindex.exact_topk(tq, DlpackOnly(tk.double()), 5)


class OnGpu:
    """A torch tensor standing in for one on a GPU: ``cpu()`` (the copy) is counted."""

    class device:
        type = "cuda"

        def __str__(self):
            return "cuda:0"

    device = device()

    def __init__(self, t):
        self.t, self.dtype, self.copies = t, t.dtype, 0

    def cpu(self):
        self.copies += 1
        return self.t


def test_write_dump_copies_device_tensors_once(tmp_path):
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 30, 8, generator=g).half(), torch.randn(1, 30, 8, generator=g).bfloat16()
    gq, gk = OnGpu(q), OnGpu(k)
    dump = qkindex.write_dump(tmp_path / "d", {"model": "t", "rope_theta": 1e4},
                              {0: {"q": gq, "k": gk}})
    np.testing.assert_array_equal(dump.q(0), q.float().numpy())
    np.testing.assert_array_equal(dump.k(0), k.float().numpy())
    assert (gq.copies, gk.copies) == (1, 1)
    bad = OnGpu(torch.zeros(1, 30, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"layers\[0\]\['k'\]: expected float16, bfloat16 or float32, "
                                        r"got float64"):
        qkindex.write_dump(tmp_path / "e", {"model": "t", "rope_theta": 1e4},
                           {0: {"q": q, "k": bad}})
    assert bad.copies == 0
    with pytest.raises(TypeError, match=r"\['q'\]: a tensor on meta could not be copied .*tensor\.cpu\(\)"):
        qkindex.write_dump(tmp_path / "f", {"model": "t", "rope_theta": 1e4},
                           {0: {"q": torch.empty(2, 30, 8, device="meta"), "k": k}})
