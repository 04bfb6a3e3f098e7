"""qkindex.hf on SmolLM2-135M and Gemma 3 270M loaded by transformers from our GGUF files:
capture equals the driver's dump; RetrievalAttention equals full attention where it selects
every key, and its statistics are those of its selections. Skipped where torch / transformers / the model are
missing; failures in CI.

The fixture ``fixtures/smollm2-driver-64`` is the driver's dump of the first 64 prompt ids of
the bundled subset (float16):

    np.save("ids64.npy", np.load("data/smollm2-8k-subset/prompt_ids.npy")[:64])
    qkindex dump --ids ids64.npy --layers 0,29 --decode 0 --dtype f16 --device cpu \\
        --source "data/smollm2-8k-subset/prompt_ids.npy[:64]" --out fixtures/smollm2-driver-64
"""

from pathlib import Path

import numpy as np
import pytest

import qkindex

from conftest import SUBSET, need

torch = need("torch")
hf = need("qkindex.hf")

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2-driver-64"


def rel_err(got, want):
    """Relative error of `got` against `want`: ||got - want|| / ||want|| (Frobenius)."""
    want = np.asarray(want, np.float64)
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


def test_capture_equals_the_driver_dump(smollm2, tmp_path):
    ids = np.load(FIXTURE / "prompt_ids.npy")
    dump = hf.capture(smollm2, torch.from_numpy(ids.astype(np.int64)), layers=[0, 29],
                      out=tmp_path / "cap")
    ref = qkindex.load_dump(FIXTURE)
    m = dump.manifest
    for key in ("n_q_heads", "n_kv_heads", "head_dim", "n_prefill", "n_layers", "rope_theta"):
        assert m[key] == ref.manifest[key], key
    for layer in (0, 29):
        for part in ("q", "k", "v"):
            got, want = getattr(dump, part)(layer), getattr(ref, part)(layer)
            assert got.shape == want.shape
            assert rel_err(got, want) < 2e-3, (layer, part, rel_err(got, want))


def test_gemma3_capture_equals_the_driver_dump(gemma3, tmp_path):
    """Gemma 3: a local (sliding-window) layer and a global one, post-QK-norm and post-RoPE
    (10K and 1M bases), against ``fixtures/gemma3-driver-48``::

        qkindex dump --model gemma3-270m --ids ids48.npy --layers 0,5 --decode 0 --dtype f16 \\
            --device cpu --out fixtures/gemma3-driver-48
    """
    fixture = FIXTURE.parent / "gemma3-driver-48"
    ids = np.load(fixture / "prompt_ids.npy")
    dump = hf.capture(gemma3, torch.from_numpy(ids.astype(np.int64)), layers=[0, 5],
                      out=tmp_path / "cap")
    ref = qkindex.load_dump(fixture)
    for key in ("n_q_heads", "n_kv_heads", "head_dim", "n_prefill", "n_layers", "rope_theta"):
        assert dump.manifest[key] == ref.manifest[key], key
    for layer in (0, 5):
        for part in ("q", "k", "v"):
            got, want = getattr(dump, part)(layer), getattr(ref, part)(layer)
            assert got.shape == want.shape
            assert rel_err(got, want) < 2e-3, (layer, part, rel_err(got, want))


def test_gemma3_retrieval_that_selects_every_key_equals_full_attention(gemma3):
    """On Gemma 3 only the 3 global layers retrieve (the sliding ones keep sdpa); a k that
    covers the rest makes index-topk attend every key, so the perplexity is full attention's."""
    ids = torch.from_numpy(np.load(FIXTURE.parent / "gemma3-driver-48" / "prompt_ids.npy")
                           .astype(np.int64))
    full = hf.perplexity(gemma3, ids, prefill=30)
    ra = hf.RetrievalAttention(gemma3, "index-topk", sink=4, window=8, k=48, ef=64,
                               build={"kq": 8})
    assert [m.layer_idx for m in ra.layers] == [5, 11, 17]
    got = hf.perplexity(gemma3, ids, prefill=30, attention=ra)
    assert got["tokens"] == full["tokens"] == 17
    assert abs(got["nll"] - full["nll"]) < 1e-4
    st = ra.stats()
    assert st["recall"] == 1.0 and abs(st["mass_ratio"] - 1.0) < 1e-5
    assert st["selections"] == 17 * 3 * 4


def test_capture_checks_its_arguments(smollm2, tmp_path):
    with pytest.raises(ValueError, match=r"layers: \[30\] do not exist"):
        hf.capture(smollm2, torch.arange(8), layers=[30], out=tmp_path / "a")
    with pytest.raises(ValueError, match="input_ids: expected shape"):
        hf.capture(smollm2, torch.zeros(2, 8, dtype=torch.long), out=tmp_path / "b")
    with pytest.raises(TypeError, match="input_ids: expected integer"):
        hf.capture(smollm2, torch.zeros(8), out=tmp_path / "c")


def _ids(n):
    return torch.from_numpy(np.load(SUBSET / "prompt_ids.npy")[:n].astype(np.int64))


@pytest.mark.parametrize("policy", ["exact-topk", "index-topk"])
def test_retrieval_that_selects_every_key_equals_full_attention(smollm2, policy):
    # Rest = positions 8..(n - 32); k covers it, so the selection is every key.
    ids = _ids(200)
    full = hf.perplexity(smollm2, ids, prefill=150)
    ra = hf.RetrievalAttention(smollm2, policy, sink=8, window=32, k=200, ef=256,
                               build={"kq": 20})
    got = hf.perplexity(smollm2, ids, prefill=150, attention=ra)
    assert got["tokens"] == full["tokens"] == 49
    assert abs(got["nll"] - full["nll"]) < 1e-4
    st = ra.stats()
    assert st["recall"] == 1.0
    assert abs(st["mass"] - 1.0) < 1e-5 and abs(st["mass_ratio"] - 1.0) < 1e-5
    assert st["selections"] == 49 * 30 * 9
    # The attended set is static + the whole rest: n at each step.
    assert st["keys_attended"] == pytest.approx(np.mean(np.arange(151, 200)))
    if policy == "index-topk":
        # Keys that left the window were inserted: the rest's keys at the last step.
        assert len(ra.indexes(0)[0]) == 199 - 32 - 8
        assert 0 < st["keys_scored"] <= 200 * 3 + 64


def test_static_and_index_topk_on_a_longer_context(smollm2):
    ids = _ids(620)
    full = hf.perplexity(smollm2, ids, prefill=600)
    runs = {}
    for policy in ("static", "exact-topk", "index-topk"):
        ra = hf.RetrievalAttention(smollm2, policy, sink=16, window=64, k=64)
        runs[policy] = (hf.perplexity(smollm2, ids, prefill=600, attention=ra), ra.stats())
    st, ex, idx = (runs[p][1] for p in ("static", "exact-topk", "index-topk"))
    assert np.isnan(st["recall"]) and st["keys_scored"] == 0 and st["keys_attended"] == 80
    assert ex["recall"] == 1.0 and idx["recall"] > 0.8
    assert ex["keys_attended"] == idx["keys_attended"] == 80 + 64
    # A scan scores the whole rest (n - sink - window at each step n = 601..619).
    assert ex["keys_scored"] == pytest.approx(np.mean(np.arange(601, 620) - 80))
    assert 0 < idx["keys_scored"] <= 1.1 * ex["keys_scored"]
    assert idx["mass"] <= ex["mass"] + 1e-6 and st["mass"] < ex["mass"]
    assert idx["mass_ratio"] <= 1 + 1e-6 and ex["mass_ratio"] == pytest.approx(1.0)
    for policy, (ppl, _) in runs.items():
        assert np.isfinite(ppl["ppl"]), policy
    # The exact top-k keeps the perplexity close to full attention, the index close to it.
    assert abs(runs["exact-topk"][0]["ppl"] / full["ppl"] - 1) < 0.1
    assert abs(runs["index-topk"][0]["ppl"] / runs["exact-topk"][0]["ppl"] - 1) < 0.1


def test_generate_under_retrieval_attention(smollm2):
    ids = _ids(300)[None]
    want = smollm2.generate(ids, max_new_tokens=6, do_sample=False)
    with hf.RetrievalAttention(smollm2, "exact-topk", sink=8, window=32, k=300):
        got = smollm2.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want)
    assert smollm2.config._attn_implementation != hf.ATTENTION_NAME  # restored


def test_policy_arguments_are_checked(smollm2):
    with pytest.raises(ValueError, match="policy: expected one of"):
        hf.RetrievalAttention(smollm2, "full")
    with pytest.raises(ValueError, match="window: must be at least 1"):
        hf.RetrievalAttention(smollm2, "static", window=0)
    with pytest.raises(ValueError, match="patience: must be at least 1 or None"):
        hf.RetrievalAttention(smollm2, "index-topk", patience=0)


def _decode_nll(model, ids, prefill, cache, steps):
    """Prefill ``ids[:prefill]`` into ``cache``; yields the nll of each next token over
    ``steps`` decode steps (a generator, so that two sequences can interleave)."""
    kw = hf.cache_kwarg(model)
    model(input_ids=ids[None, :prefill], **{kw: cache}, use_cache=True, logits_to_keep=1)
    for t in range(prefill, prefill + steps):
        out = model(input_ids=ids[None, t:t + 1], **{kw: cache}, use_cache=True)
        logp = torch.log_softmax(out.logits[0, -1].to(torch.float32), dim=-1)
        yield -float(logp[ids[t + 1]])


def _crop_counts():
    """Whether ``DynamicLayer.crop`` takes a count of tokens to drop (later 5.x) rather than the
    length to keep (5.0)."""
    import inspect
    from transformers.cache_utils import DynamicLayer

    return "tokens_to_remove" in inspect.signature(DynamicLayer.crop).parameters


def test_retrieval_caches_keep_each_sequence_its_own_indexes(smollm2):
    """Two sequences decoded in turns, each in its own RetrievalCache, score exactly as each
    decoded alone; a cropped cache has no indexes left, so a decode step says so."""
    ids = _ids(400)
    a, b = ids[:200], ids[150:350]
    ra = hf.RetrievalAttention(smollm2, "index-topk", sink=8, window=32, k=16, ef=32,
                               build={"kq": 20}, measure=False)
    with torch.no_grad(), ra:
        alone = [list(_decode_nll(smollm2, s, 150, ra.cache(), 12)) for s in (a, b)]
        ca, cb = ra.cache(), ra.cache()
        ga, gb = _decode_nll(smollm2, a, 150, ca, 12), _decode_nll(smollm2, b, 150, cb, 12)
        turns = [[], []]
        for _ in range(12):
            turns[0].append(next(ga))
            turns[1].append(next(gb))
        assert turns == alone
        assert sorted(ca.retrieval) == sorted(cb.retrieval) == list(range(30))
        ia, ib = ca.retrieval[0][0].indexes[0], cb.retrieval[0][0].indexes[0]
        assert ia is not ib
        # The last step saw 162 positions: a rest of 162 - 32 - 8 keys (110 at the prefill).
        assert len(ia) == len(ib) == 162 - 32 - 8
        # A negative count of tokens to drop (162 -> 100) in later 5.x, the length to keep in 5.0.
        ca.crop(-62 if _crop_counts() else 100)
        assert ca.retrieval == {}
        with pytest.raises(RuntimeError, match="decode before a prefill"):
            smollm2(input_ids=a[None, 100:101], **{hf.cache_kwarg(smollm2): ca}, use_cache=True)
