"""ml_dtypes bfloat16 arrays (what JAX and others hand numpy) are read like torch's: widened to
f32 exactly. Skipped where ml_dtypes is missing; a failure in CI (scripts/test.sh installs it)."""

import numpy as np

import qkindex

from conftest import need

ml_dtypes = need("ml_dtypes")


def test_ml_dtypes_bfloat16_equals_float32_copy(data, tmp_path):
    keys, train, queries = data
    kb, tb, qb = (a.astype(ml_dtypes.bfloat16) for a in (keys, train, queries))
    kf, tf, qf = (a.astype(np.float32) for a in (kb, tb, qb))
    ib = qkindex.AttentionIndex.build(kb, tb, kq=50, max_degree=24)
    i_f = qkindex.AttentionIndex.build(kf, tf, kq=50, max_degree=24)
    for q in (qb, qb[5], qb[:, :][::2]):
        got, want = ib.search(q, k=10, ef=48), i_f.search(q.astype(np.float32), k=10, ef=48)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores, want.scores)
    np.testing.assert_array_equal(qkindex.exact_topk(qb, kb, 7)[0], qkindex.exact_topk(qf, kf, 7)[0])
    dump = qkindex.write_dump(tmp_path / "d", {"model": "t", "rope_theta": 1e4},
                              {0: {"q": qb[None], "k": kb[None, :32]}})
    np.testing.assert_array_equal(dump.q(0)[0], qf)
