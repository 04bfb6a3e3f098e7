"""One default per knob: a build with the Python defaults gets the library's defaults (the
params' `Default` in Rust), so the keyword defaults of the signatures cannot drift from them."""

import inspect

import numpy as np

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
