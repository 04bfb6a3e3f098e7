"""One default per knob: a build with the Python defaults gets the library's defaults (the
params' `Default` in Rust), so the keyword defaults of the signatures cannot drift from them."""

import inspect

import numpy as np
import pytest

import qkindex

from conftest import ood_data


def _defaults(fn):
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def test_signature_defaults_are_the_library_defaults():
    keys, train, _ = ood_data(n=300, m=60, d=16)
    cases = [
        (
            qkindex.AttentionIndex,
            qkindex.AttentionIndex.build(keys, train),
            ["kq", "max_degree", "build_ef", "default_ef", "causal", "prune"],
        ),
        (
            qkindex.HnswIndex,
            qkindex.HnswIndex.build(keys),
            ["m", "ef_construction", "l2_reduction", "seed"],
        ),
        (
            qkindex.VamanaIndex,
            qkindex.VamanaIndex.build(keys),
            ["r", "l", "alpha", "robust", "seed"],
        ),
    ]
    for cls, index, names in cases:
        sig = _defaults(cls.build)
        for name in names:
            got = index.params[name]
            if isinstance(got, float):
                assert np.float32(got) == np.float32(sig[name]), (cls.__name__, name, got, sig[name])
            else:
                assert got == sig[name], (cls.__name__, name, got, sig[name])
    # IVF does not expose its params; its defaults show in what it builds.
    sig = _defaults(qkindex.IvfIndex.build)
    assert sig["nlist"] is None
    assert qkindex.IvfIndex.build(keys).nlist == round(4 * 300**0.5)


def test_decode_default_build_is_the_decode_preset():
    """``decode_default_build()``: the keywords of the driver's decode default (its ``--index``
    default, what ``qkindex.hf`` builds), each one ``AttentionIndex.build`` takes."""
    kw = qkindex.decode_default_build()
    assert kw == {"causal": True, "queries_per_key": 1.25, "global_full": 0.1,
                  "far_check": 0.04, "auto_ef": 0.95, "pool_above": 32768}
    assert set(kw) <= set(_defaults(qkindex.AttentionIndex.build))
    keys, train, _ = ood_data(n=300, m=60, d=16)
    # Query i at position 5i sees the keys before it; the last ones see all of them.
    visible = np.minimum(5 * np.arange(1, 61), 300)
    index = qkindex.AttentionIndex.build(keys, train, visible=visible, **kw)
    for name, value in kw.items():
        assert index.params[name] == value, name
    assert "auto_ef" in index.build_stats
    # Past `pool_above` keys the kNN is the pooled one, without the causal lists.
    long = qkindex.AttentionIndex.build(keys, train, visible=visible, **{**kw, "pool_above": 299})
    assert long.params["knn_pool"] == 8000 and long.params["causal"] is False
    assert "global_full" not in long.params and long.params["pool_above"] == 299
    # Its causal lists need the counts, and the counts must be counts.
    with pytest.raises(ValueError, match="queries_per_key"):
        qkindex.AttentionIndex.build(keys, train, **kw)
    with pytest.raises(ValueError, match="visible: expected counts"):
        qkindex.AttentionIndex.build(keys, train, visible=[-1] * 60, **kw)
