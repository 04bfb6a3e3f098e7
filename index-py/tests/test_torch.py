"""CPU torch tensors are accepted like numpy arrays (through __array__ / DLPack; qkindex never
imports torch). Skipped where torch is not installed (CI does not install it: gigabytes)."""

import numpy as np
import pytest

import qkindex

torch = pytest.importorskip("torch", reason="torch is not installed (CI does not install it)")


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


def test_bfloat16_and_float64_tensors_are_type_errors(data, attention_index):
    _, _, queries = data
    tq = torch.from_numpy(queries)
    with pytest.raises(TypeError, match="queries: expected float16 or float32, got torch.bfloat16"):
        attention_index.search(tq.bfloat16())
    with pytest.raises(TypeError, match="queries: expected float16 or float32, got float64"):
        attention_index.search(tq.double())


def test_write_dump_from_tensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    layer = {"q": torch.randn(2, 30, 8, generator=g).half(), "k": torch.randn(1, 30, 8, generator=g).half()}
    dump = qkindex.write_dump(tmp_path / "d", {"model": "t", "rope_theta": 1e4}, {0: layer})
    np.testing.assert_array_equal(dump.q(0), layer["q"].float().numpy())
