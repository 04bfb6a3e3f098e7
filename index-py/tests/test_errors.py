"""Inputs: dtypes, shapes, strides and non-finite values give TypeError/ValueError naming the
argument; nothing crashes the interpreter."""

import numpy as np
import pytest

import qkindex


class FakeBf16:
    """Claims torch's bfloat16 without being a tensor (torch is not needed to test the check)."""

    dtype = "torch.bfloat16"

    def __array__(self, *args, **kwargs):
        raise AssertionError("must not be converted")


class FakeCuda:
    """Stands in for a CUDA torch tensor: its device type is not the CPU."""

    class device:
        type = "cuda"

        def __str__(self):
            return "cuda:0"

    device = device()
    dtype = "torch.float32"

    def __array__(self, *args, **kwargs):
        raise AssertionError("must not be converted")


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64])
def test_wrong_dtypes_are_type_errors(data, attention_index, dtype):
    keys, train, queries = data
    with pytest.raises(TypeError, match=rf"keys: expected float16, bfloat16 or float32, got {np.dtype(dtype)}"):
        qkindex.FlatIndex.build(keys.astype(dtype))
    with pytest.raises(TypeError, match=rf"train_queries: .*got {np.dtype(dtype)}"):
        qkindex.AttentionIndex.build(keys, train.astype(dtype))
    with pytest.raises(TypeError, match=rf"queries: .*got {np.dtype(dtype)}"):
        attention_index.search(queries.astype(dtype))
    with pytest.raises(TypeError, match=rf"queries: .*got {np.dtype(dtype)}"):
        qkindex.exact_topk(queries.astype(dtype), keys, 5)


def test_bfloat16_that_is_no_tensor_is_named(data, attention_index):
    with pytest.raises(TypeError, match="queries: cannot read a FakeBf16 of dtype torch.bfloat16"):
        attention_index.search(FakeBf16())
    with pytest.raises(TypeError, match="keys: .*bfloat16"):
        qkindex.FlatIndex.build(FakeBf16())


def test_device_tensors_that_cannot_be_copied_name_cpu(attention_index):
    with pytest.raises(TypeError, match=r"queries: a tensor on cuda:0 could not be copied to host "
                                        r"memory .*: pass tensor\.cpu\(\)"):
        attention_index.search(FakeCuda())
    with pytest.raises(TypeError, match=r"keys: a tensor on cuda:0 .*tensor\.cpu\(\)"):
        qkindex.exact_topk(np.zeros((1, 4), np.float32), FakeCuda(), 1)


class CopiedCuda(FakeCuda):
    """A device tensor whose ``cpu()`` (the one copy to host memory) is counted."""

    def __init__(self, array, dtype="torch.float32"):
        self.array, self.dtype, self.copies = array, dtype, 0

    def cpu(self):
        self.copies += 1
        return self.array


def test_device_tensors_are_copied_to_host_memory_once(data, attention_index):
    keys, train, queries = data
    q, k, t = CopiedCuda(queries), CopiedCuda(keys), CopiedCuda(train)
    np.testing.assert_array_equal(attention_index.search(q, k=5, ef=48).ids,
                                  attention_index.search(queries, k=5, ef=48).ids)
    ids, scores = qkindex.exact_topk(q, k, 5)
    want = qkindex.exact_topk(queries, keys, 5)
    np.testing.assert_array_equal(ids, want[0])
    np.testing.assert_array_equal(scores, want[1])
    built = qkindex.AttentionIndex.build(k, t, kq=50, max_degree=24)
    np.testing.assert_array_equal(built.search(queries, k=5, ef=48).ids,
                                  attention_index.search(queries, k=5, ef=48).ids)
    flat = qkindex.FlatIndex.build(k)
    np.testing.assert_array_equal(flat.search(queries, k=5).ids, want[0])
    # One copy per argument and call: search + exact_topk for q, exact_topk + two builds for k.
    assert (q.copies, k.copies, t.copies) == (2, 3, 1)


def test_device_tensors_of_other_dtypes_are_refused_before_a_copy():
    for dtype in ("torch.float64", "torch.int32", "torch.float8_e4m3fn"):
        x = CopiedCuda(np.zeros((3, 4), np.float32), dtype)
        with pytest.raises(TypeError, match=rf"keys: expected float16, bfloat16 or float32, got "
                                            rf"{dtype[6:]} \(no silent casts"):
            qkindex.FlatIndex.build(x)
        assert x.copies == 0


def test_python_lists_are_read_but_not_cast(data, attention_index):
    with pytest.raises(TypeError, match="float64"):
        attention_index.search([0.0] * attention_index.dim)
    with pytest.raises(TypeError, match="queries"):
        attention_index.search("not an array")


def test_shapes(data, attention_index):
    keys, train, queries = data
    d = keys.shape[1]
    with pytest.raises(ValueError, match=rf"queries: expected shape \[b, {d}\] or \[{d}\], got \(32, 31\)"):
        attention_index.search(queries[:, :-1])
    with pytest.raises(ValueError, match=r"queries: .*got \(2, 3, 32\)"):
        attention_index.search(queries[:6].reshape(2, 3, d))
    with pytest.raises(ValueError, match=r"keys: expected shape \[n, d\] \(2-D\), got \(32,\)"):
        qkindex.FlatIndex.build(keys[0])
    with pytest.raises(ValueError, match=rf"train_queries: expected shape \[n, {d}\], got \(400, 16\)"):
        qkindex.AttentionIndex.build(keys, train[:, :16])
    with pytest.raises(ValueError, match="keys: expected at least one row"):
        qkindex.FlatIndex.build(keys[:0])
    with pytest.raises(ValueError, match="train_queries: expected at least one row"):
        qkindex.AttentionIndex.build(keys, train[:0])
    with pytest.raises(ValueError, match="keys: expected shape"):
        qkindex.FlatIndex.build(np.zeros((5, 0), np.float32))


def test_non_finite_rows_are_named(data, attention_index):
    keys, train, queries = data
    for bad_value in (np.nan, np.inf, -np.inf):
        q = queries.copy()
        q[5, 2] = bad_value
        with pytest.raises(ValueError, match="queries: non-finite value .* in row 5"):
            attention_index.search(q)
    k = keys.copy()
    k[17, 0] = np.nan
    with pytest.raises(ValueError, match="keys: non-finite value .* in row 17"):
        qkindex.FlatIndex.build(k)
    with pytest.raises(ValueError, match="keys: non-finite value .* in row 17"):
        qkindex.FlatIndex.build(k.astype(np.float16))
    t = train.copy()
    t[399, 31] = np.inf
    with pytest.raises(ValueError, match="train_queries: non-finite value .* in row 399"):
        qkindex.AttentionIndex.build(keys, t)
    # float16 overflow is not finite either
    with np.errstate(over="ignore"):
        big = np.full((1, keys.shape[1]), 1e5, np.float32).astype(np.float16)
    with pytest.raises(ValueError, match="queries: non-finite value .* in row 0"):
        attention_index.search(big)


def test_parameters(data, attention_index):
    keys, train, queries = data
    with pytest.raises(ValueError, match="k: must be at least 1, got 0"):
        attention_index.search(queries, k=0)
    with pytest.raises(ValueError, match="k: must be at most the number of keys"):
        attention_index.search(queries, k=len(keys) + 1)
    with pytest.raises(ValueError, match="ef"):
        attention_index.search(queries, k=10, ef=5)
    with pytest.raises(ValueError, match="ef: must be at least 1, got -3"):
        attention_index.search(queries, k=10, ef=-3)
    with pytest.raises(ValueError, match="kq: must be at least 1, got -1"):
        qkindex.AttentionIndex.build(keys, train, kq=-1)
    with pytest.raises(ValueError, match="max_degree"):
        qkindex.AttentionIndex.build(keys, train, max_degree=0)
    if qkindex.knn_device("auto").startswith("cpu"):
        with pytest.raises(RuntimeError, match="no usable GPU"):
            qkindex.AttentionIndex.build(keys, train, device="cuda")
    with pytest.raises(ValueError, match="device"):
        qkindex.exact_topk(queries, keys, 5, device="tpu")
    with pytest.raises(ValueError, match="k: must be at most"):
        qkindex.exact_topk(queries, keys, len(keys) + 1)
    with pytest.raises(TypeError):
        attention_index.search(queries, k="10")


def test_metric_arguments(data):
    keys, _, queries = data
    with pytest.raises(ValueError, match="found_ids: expected 2 rows"):
        qkindex.recall(np.zeros((3, 4), np.int64), np.zeros((2, 4), np.int64))
    with pytest.raises(TypeError, match="found_ids: expected an integer array"):
        qkindex.recall(np.zeros((2, 4)), np.zeros((2, 4), np.int64))
    with pytest.raises(ValueError, match="ids: 5000 is out of range"):
        qkindex.attention_mass(queries[0], keys, np.array([1, 5000]))
    with pytest.raises(ValueError, match="ids: expected one row per query"):
        qkindex.attention_mass(queries[:2], keys, np.array([1, 2]))


@pytest.mark.parametrize(
    "view",
    [
        lambda q: q[::2],  # row stride
        lambda q: q[::-1],  # negative row stride
        lambda q: q[:, ::-1],  # negative column stride
        lambda q: np.asfortranarray(q),  # column-major
        lambda q: np.broadcast_to(q[0], q.shape),  # zero row stride
        lambda q: np.lib.stride_tricks.as_strided(q, shape=(16, q.shape[1]), strides=(q.strides[0] * 2, q.strides[1])),
    ],
)
def test_any_strides_give_the_results_of_a_contiguous_copy(data, attention_index, view):
    keys, _, queries = data
    v = view(queries)
    assert not v.flags.c_contiguous or v.strides[0] == 0
    a = attention_index.search(v, k=10, ef=64)
    b = attention_index.search(np.ascontiguousarray(v), k=10, ef=64)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.scores, b.scores)
    flat_a = qkindex.FlatIndex.build(np.asfortranarray(keys)).search(v, k=5)
    flat_b = qkindex.FlatIndex.build(keys).search(np.ascontiguousarray(v), k=5)
    np.testing.assert_array_equal(flat_a.ids, flat_b.ids)


def test_a_one_d_strided_query(data, attention_index):
    _, _, queries = data
    col = np.asfortranarray(queries)[4]  # 1-D, contiguous
    strided = np.repeat(queries[4], 2)[::2]  # 1-D, stride 2
    a = attention_index.search(col, k=5)
    b = attention_index.search(strided, k=5)
    np.testing.assert_array_equal(a.ids, b.ids)


def test_inputs_are_not_modified(data, attention_index):
    keys, _, queries = data
    before = queries.copy()
    attention_index.search(queries, k=10)
    np.testing.assert_array_equal(before, queries)


class DlpackOnly:
    """An object that speaks only DLPack (as some tensor libraries do)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_inputs(data, attention_index):
    keys, _, queries = data
    want = attention_index.search(queries, k=10, ef=48)
    got = attention_index.search(DlpackOnly(queries), k=10, ef=48)
    np.testing.assert_array_equal(got.ids, want.ids)
    flat = qkindex.FlatIndex.build(DlpackOnly(keys.astype(np.float16)))
    assert flat.dtype == "float16"
    with pytest.raises(TypeError, match="queries: .*float64"):
        attention_index.search(DlpackOnly(queries.astype(np.float64)))
