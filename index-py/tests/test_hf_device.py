"""qkindex.hf on any device, with the KV offloaded to host memory, and in batches (issue 46).

Tested on the CPU, through the same code a GPU runs: every tensor is made on the model's device
(a static check below), and every copy between the model's side and host memory goes through
``hf.TRANSFERS``, which counts it even on the CPU. SmolLM2-135M and Gemma 3 270M from our GGUF
files; skipped where torch / transformers / the models are missing, failures in CI.
"""

import ast
from pathlib import Path

import numpy as np
import pytest

from conftest import SUBSET, need

torch = need("torch")
transformers = need("transformers")
hf = need("qkindex.hf")

HF_SOURCE = Path(hf.__file__)


def _ids(n, start=0):
    return torch.from_numpy(np.load(SUBSET / "prompt_ids.npy")[start:start + n].astype(np.int64))


def _generate(model, ids, ra=None, new=8, mask=None):
    """Greedy tokens after ``ids`` ``[b, n]``, under ``ra`` (its own cache) or the model's
    attention."""
    kw = {"max_new_tokens": new, "do_sample": False}
    if mask is not None:
        kw["attention_mask"] = mask
    if ra is None:
        return model.generate(ids, **kw)[:, ids.shape[1]:]
    with ra:
        return model.generate(ids, past_key_values=ra.cache(), **kw)[:, ids.shape[1]:]


def test_no_tensor_is_made_on_a_fixed_device():
    """Every torch factory call in qkindex.hf names its device (the bug of issue 46: static
    positions made on the CPU, then concatenated with cuda tensors)."""
    factories = {"arange", "zeros", "ones", "empty", "full", "tensor", "linspace", "randn",
                 "as_tensor"}
    missing = []
    for node in ast.walk(ast.parse(HF_SOURCE.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and node.func.attr in factories
                and not any(k.arg == "device" for k in node.keywords)):
            missing.append(f"line {node.lineno}: torch.{node.func.attr}")
    # _token_ids reads the caller's ids (moved to the model's device by its callers).
    assert missing == ["line %d: torch.as_tensor" % _line_of("ids = torch.as_tensor(input_ids)")]


def _line_of(text):
    for i, line in enumerate(HF_SOURCE.read_text().splitlines(), 1):
        if text in line:
            return i
    raise AssertionError(text)


_WITHOUT_OFFLOAD = {}


@pytest.mark.parametrize("policy,offload", [("index-topk", "merge"), ("index-topk", "gather"),
                                            ("exact-topk", "merge"), ("static", "merge")])
def test_offload_generates_the_tokens_of_the_same_policy_without_it(smollm2, policy, offload):
    # sink 8 + window 32 + buffer 8: the device drops columns every 8 steps.
    ids = _ids(300)[None]
    kw = dict(sink=8, window=32, k=16, ef=48, build={"kq": 20}, buffer=8)
    if policy not in _WITHOUT_OFFLOAD:
        ra = hf.RetrievalAttention(smollm2, policy, **kw)
        _WITHOUT_OFFLOAD[policy] = _generate(smollm2, ids, ra, new=16)
    ra = hf.RetrievalAttention(smollm2, policy, offload=offload, **kw)
    got = _generate(smollm2, ids, ra, new=16)
    assert torch.equal(got, _WITHOUT_OFFLOAD[policy])
    st = ra.stats()
    assert st["offload"] == offload and st["selections"] == 15 * 30 * 9
    if policy != "static":
        assert st["recall"] > (0.99 if policy == "exact-topk" else 0.5)


def test_offload_cache_holds_sinks_window_and_buffer_on_the_model_device(smollm2):
    ids = _ids(300)[None]
    kw = dict(sink=8, window=32, k=16, ef=48, build={"kq": 20}, buffer=8, measure=False)
    held = {}
    for offload in (False, True):
        ra = hf.RetrievalAttention(smollm2, "index-topk", offload=offload, **kw)
        cache = ra.cache()
        with ra:
            smollm2.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=cache)
        held[offload] = cache.kv_bytes()
        # Positions and masks see the whole sequence: 300 + 9 positions in the cache.
        assert cache.get_seq_length() == 309
    layers, kvh, d, f32 = 30, 3, 64, 4
    full = 2 * layers * kvh * 309 * d * f32
    assert held[False] == {"model": full, "host": 0}
    # Offloaded: sinks + window + buffer columns per layer on the device, the rest in host
    # memory (the prefill's rest + buffer, grown by at least 256 rows when full).
    assert held[True]["model"] == 2 * layers * kvh * (8 + 32 + 8) * d * f32
    rest = 309 - 8 - 32
    row = 2 * layers * kvh * d * f32
    assert rest * row <= held[True]["host"] <= (rest + 8 + 256) * row


def _decode_transfers(model, ids, ra, steps=3):
    """Prefills ``ids`` ``[1, n]`` under ``ra``, waits for its builds, then decodes ``steps``
    tokens; returns the transfers of the prefill and of each decode step."""
    kw = hf.cache_kwarg(model)
    cache = ra.cache()
    per_step = []
    with torch.no_grad(), ra:
        hf.TRANSFERS.reset()
        out = model(input_ids=ids, **{kw: cache}, use_cache=True, logits_to_keep=1)
        prefill = hf.TRANSFERS.snapshot()
        for layer in ra.layers:
            ra.indexes(layer.layer_idx)
        tok = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            hf.TRANSFERS.reset()
            out = model(input_ids=tok, **{kw: cache}, use_cache=True)
            per_step.append(hf.TRANSFERS.snapshot())
            tok = out.logits[:, -1:].argmax(-1)
    return prefill, per_step


@pytest.mark.parametrize("offload", [False, "merge", "gather"])
def test_decode_steps_copy_what_the_index_needs_not_the_cache(smollm2, offload):
    """Per decode step and layer: the queries and the key (and value) leaving the window go to
    the host, ids (or the merged part, or the chosen rows) come back; as much at 600 tokens of
    context as at 300. At the prefill the rest's keys cross once."""
    kw = dict(sink=8, window=32, k=16, ef=48, build={"kq": 20}, measure=False,
              offload=offload)
    layers, kvh, h, d, f32 = 30, 3, 9, 64, 4
    steps = {}
    for n in (300, 600):
        ra = hf.RetrievalAttention(smollm2, "index-topk", **kw)
        prefill, per_step = _decode_transfers(smollm2, _ids(n)[None], ra)
        steps[n] = per_step
        rest_keys = layers * kvh * (n - 8 - 32) * d * f32
        # Keys (and values under offload) once, plus the training queries and small tensors.
        train = layers * kvh * min(4096, 3 * n) * d * f32
        once = rest_keys * (2 if offload else 1)
        # + per layer: the picked training rows' ids (int64) and the padding.
        assert once <= prefill["to_host_bytes"] <= once + train + layers * (8 * 3 * n + 64)
    # What comes back per layer: ids (int64), the host part and its log-sum-exp, or the
    # chosen rows' keys and values.
    back = {False: h * 16 * 8, "merge": h * (d + 1) * f32, "gather": 2 * h * 16 * d * f32}
    for s in steps[300]:
        assert s["to_host"] == layers * (3 if offload else 2)
        assert s["to_model"] == layers and s["to_model_bytes"] == layers * back[offload]
        # The largest copy: the queries or what comes back, never a part of the cache.
        assert s["largest"] == max(back[offload], h * d * f32)
    assert steps[300] == steps[600]


def test_exact_topk_on_the_model_device_copies_nothing_per_step(smollm2):
    ra = hf.RetrievalAttention(smollm2, "exact-topk", sink=8, window=32, k=16, measure=False)
    prefill, per_step = _decode_transfers(smollm2, _ids(300)[None], ra)
    assert prefill["to_host_bytes"] < 4096  # the padding of the batch, per layer
    assert all(s["to_host"] == s["to_model"] == 0 for s in per_step)


def _left_padded(prompts, pad_id=0):
    n = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), n), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(prompts), n), dtype=torch.int64)
    for b, p in enumerate(prompts):
        ids[b, n - len(p):] = p
        mask[b, n - len(p):] = 1
    return ids, mask


@pytest.mark.parametrize("offload", [False, True])
def test_a_batch_of_four_generates_what_each_prompt_generates_alone(smollm2, offload):
    prompts = [_ids(n, start) for n, start in ((300, 0), (170, 500), (240, 1000), (95, 1500))]
    kw = dict(sink=8, window=32, k=16, ef=48, build={"kq": 20}, buffer=8, offload=offload)
    ids, mask = _left_padded(prompts)
    ra = hf.RetrievalAttention(smollm2, "index-topk", **kw)
    cache = ra.cache()
    with ra:
        got = smollm2.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                               past_key_values=cache)[:, ids.shape[1]:]
    # One index set per sequence, over its own rest only (padding never enters one).
    seqs = cache.retrieval[0]
    assert len(seqs) == 4 and [s.pad for s in seqs] == [300 - len(p) for p in prompts]
    for s, p in zip(seqs, prompts):
        assert len(s.indexes[0]) == len(p) + 7 - 8 - 32
    assert seqs[0].indexes[0] is not seqs[1].indexes[0]
    for b, p in enumerate(prompts):
        alone = _generate(smollm2, p[None], hf.RetrievalAttention(smollm2, "index-topk", **kw))
        assert torch.equal(got[b], alone[0]), b


def test_gemma3_batch_and_offload_equal_each_prompt_alone(gemma3):
    ids48 = np.load(Path(__file__).parent / "fixtures" / "gemma3-driver-48" / "prompt_ids.npy")
    base = torch.from_numpy(ids48.astype(np.int64))
    prompts = [base[:48], base[:40], base[5:48], base[:33]]
    kw = dict(sink=4, window=8, k=8, ef=32, build={"kq": 8}, buffer=4)
    ids, mask = _left_padded(prompts)
    alone = [_generate(gemma3, p[None], hf.RetrievalAttention(gemma3, "index-topk", **kw), new=6)
             for p in prompts]
    for offload in (False, True):
        ra = hf.RetrievalAttention(gemma3, "index-topk", offload=offload, **kw)
        cache = ra.cache()
        with ra:
            got = gemma3.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                  past_key_values=cache)[:, ids.shape[1]:]
        assert sorted(cache.retrieval) == [5, 11, 17]
        for b in range(4):
            assert torch.equal(got[b], alone[b][0]), (offload, b)


def test_offload_needs_the_retrieval_cache_and_one_token_per_step(smollm2):
    ids = _ids(120)[None]
    ra = hf.RetrievalAttention(smollm2, "index-topk", sink=8, window=32, offload=True)
    with ra, pytest.raises(ValueError, match=r"past_key_values=ra.cache\(\)"):
        smollm2.generate(ids, max_new_tokens=2, do_sample=False)
    kw = hf.cache_kwarg(smollm2)
    cache = ra.cache()
    with torch.no_grad(), ra:
        smollm2(input_ids=ids, **{kw: cache}, use_cache=True, logits_to_keep=1)
        with pytest.raises(ValueError, match="one token per call"):
            smollm2(input_ids=_ids(3)[None], **{kw: cache}, use_cache=True)
    with pytest.raises(ValueError, match="offload: expected False, True or one of"):
        hf.RetrievalAttention(smollm2, "index-topk", offload="disk")
    with pytest.raises(NotImplementedError, match="cannot be cropped"):
        cache.crop(-2)


def test_right_padding_is_refused(smollm2):
    ids = _ids(120)[None].repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, -10:] = 0
    with hf.RetrievalAttention(smollm2, "index-topk", sink=8, window=32) as ra, \
            pytest.raises(ValueError, match="left padding only"):
        smollm2(input_ids=ids, attention_mask=mask, **{hf.cache_kwarg(smollm2): ra.cache()},
                use_cache=True)


def test_transformers_version_is_a_tested_5x_and_takes_past_key_values(smollm2):
    """Docs and notebook pass ``past_key_values=`` to ``generate``: every 5.x takes it (5.0
    has no ``cache=``). CI runs this file with the installed transformers; the lowest and
    highest tested are ``hf.TESTED_TRANSFORMERS``."""
    from packaging.version import Version

    v = Version(transformers.__version__)
    low, high = (Version(x) for x in hf.TESTED_TRANSFORMERS)
    assert Version("5.0.0") <= low <= v and v.major == 5 and low <= high, transformers.__version__
    ids = _ids(80)[None]
    ra = hf.RetrievalAttention(smollm2, "index-topk", sink=8, window=32, k=16, build={"kq": 20})
    cache = ra.cache()
    with ra:
        smollm2.generate(ids, max_new_tokens=3, do_sample=False, past_key_values=cache)
    # The cache given was the one used: it holds the sequence's state.
    assert cache.get_seq_length() == 82 and sorted(cache.retrieval) == list(range(30))


def test_the_gpu_script_runs_on_the_cpu(tmp_path):
    """scripts/gpu_hf.py (the GPU check of gpu-all.sh) end to end in its CPU mode: every policy
    ran, exact-topk over every key generated sdpa's tokens, offload held less on the device."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_hf.py"
    done = subprocess.run([sys.executable, str(script), "--device", "cpu", "--small", "--lengths",
                           "300", "--new", "4", "--out", str(tmp_path / "hf.json")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "hf.json").read_text())
    assert report["failures"] == []
    runs = {r["policy"]: r for r in report["runs"]}
    assert sorted(runs) == ["exact-topk", "index-topk", "index-topk+offload", "sdpa"]
    assert all(len(r["tokens"]) == 4 and r["ms_per_token"] > 0 for r in runs.values())
    assert report["checks"][0]["tokens_equal"]
    off, sdpa = runs["index-topk+offload"], runs["sdpa"]
    assert 0 < off["kv_device_bytes"] < sdpa["kv_device_bytes"] and off["kv_host_bytes"] > 0
