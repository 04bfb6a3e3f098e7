"""qkindex.hf on a tiny random-weight Qwen2 (issue 63, item 7): the Qwen2 shape without a
download. ``transformers.Qwen2Config``: 2 layers, 12 query heads over 2 KV heads (a group of 6,
as Qwen2.5-1.5B), head_dim 32, q/k/v projection biases (set non-zero here: transformers
initialises them to zero), RoPE base 1e6. ``capture`` equals an independent computation (the
q_proj/k_proj/v_proj outputs taken by hooks, rotated here); ``RetrievalAttention`` that selects
every key reproduces the model's own logits, and with a small k agrees on the top-1 token at
most steps; Qwen2 layers made sliding by ``use_sliding_window`` keep their mask. Seconds on
one CPU thread. Skipped where torch / transformers are missing; failures in CI.

The real model (Qwen2.5-Coder-1.5B-Instruct from its GGUF): scripts/hf_qwen.py, figures in
docs/bench/hf-qwen/.
"""

import numpy as np
import pytest

from conftest import need

torch = need("torch")
transformers = need("transformers")
hf = need("qkindex.hf")

HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB, THETA = 12, 2, 32, 2, 512, 1e6
N = 224  # tokens of the test sequence
PREFILL = 160  # then N - 1 - PREFILL teacher-forced decode steps
SINK, WINDOW = 8, 32


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: the model is tiny, and on a busy machine more threads only wait for
    each other (a minute instead of seconds)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def qwen2():
    """The tiny Qwen2, float32, eval mode, with attention sharp enough that a retrieval that
    misses keys changes the output (q/k weights at std 0.1), random q/k/v biases and a
    spread-out LM head (std 1, so that the top-1 token is rarely a near tie)."""
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM, intermediate_size=512,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=1024, rope_theta=THETA, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in hf.attention_layers(model):
            for name, std in (("q_proj", 0.1), ("k_proj", 0.1), ("v_proj", 0.05)):
                proj = getattr(m, name)
                proj.weight.copy_(torch.randn(proj.weight.shape, generator=g) * std)
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=g) * 0.5)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def ids():
    """Random token ids with repeats (a copied span), so that some keys matter a lot."""
    g = np.random.default_rng(2)
    x = g.integers(0, VOCAB, N)
    x[120:150] = x[20:50]
    return torch.from_numpy(x.astype(np.int64))


def test_the_tiny_model_is_qwen2_shaped(qwen2):
    mods = hf.attention_layers(qwen2)
    assert [type(m).__name__ for m in mods] == ["Qwen2Attention"] * LAYERS
    for m in mods:
        assert m.q_proj.out_features == HEADS * HEAD_DIM
        assert m.k_proj.out_features == KV_HEADS * HEAD_DIM
        assert all(getattr(m, p).bias is not None and getattr(m, p).bias.abs().sum() > 0
                   for p in ("q_proj", "k_proj", "v_proj"))
        assert m.sliding_window is None  # Qwen2.5: no sliding-window layers
    ra = hf.RetrievalAttention(qwen2, "index-topk")
    assert [m.layer_idx for m in ra.layers] == list(range(LAYERS))


def _rope(x, theta):
    """Independent RoPE (NeoX / rotate-half order) of ``x`` ``[heads, n, d]`` at positions
    0..n-1, in float64."""
    _, n, d = x.shape
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))
    half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + half * sin


def test_capture_equals_the_projections_with_bias_and_rope(qwen2, ids, tmp_path):
    taken = {}
    hooks = []
    for m in hf.attention_layers(qwen2):
        for name in ("q_proj", "k_proj", "v_proj"):
            def hook(mod, inp, out, key=(m.layer_idx, name[0])):
                taken[key] = out[0].detach().to(torch.float64).numpy()
            hooks.append(getattr(m, name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            qwen2(input_ids=ids[None, :64], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    dump = hf.capture(qwen2, ids[:64], out=tmp_path / "cap")
    m = dump.manifest
    assert (m["n_q_heads"], m["n_kv_heads"], m["head_dim"]) == (HEADS, KV_HEADS, HEAD_DIM)
    assert m["n_prefill"] == 64 and m["n_layers"] == LAYERS and m["rope_theta"] == THETA
    for layer in range(LAYERS):
        want = {}
        for part, heads in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
            x = taken[(layer, part)].reshape(64, heads, HEAD_DIM).transpose(1, 0, 2)
            want[part] = x if part == "v" else _rope(x, THETA)
        for part in ("q", "k", "v"):
            got = np.asarray(getattr(dump, part)(layer), np.float64)
            assert got.shape == want[part].shape, (layer, part)
            err = np.abs(got - want[part]).max() / np.abs(want[part]).max()
            assert err < 1e-5, (layer, part, err)
        # The bias is part of what was captured (q without it differs).
        assert np.abs(want["q"]).max() > 0.1


def _decode_logits(model, ids, ra=None):
    """Logits ``[steps, vocab]`` of each teacher-forced decode step after a prefill of
    ``PREFILL`` tokens: under ``ra`` (its cache) or the model's own attention."""
    kw = hf.cache_kwarg(model)
    cache = ra.cache() if ra is not None else transformers.DynamicCache(config=model.config)
    out = []

    def run():
        model(input_ids=ids[None, :PREFILL], **{kw: cache}, use_cache=True, logits_to_keep=1)
        for t in range(PREFILL, N - 1):
            out.append(model(input_ids=ids[None, t:t + 1], **{kw: cache},
                             use_cache=True).logits[0, -1].to(torch.float32))

    with torch.no_grad():
        if ra is None:
            run()
        else:
            with ra:
                run()
    return torch.stack(out)


@pytest.fixture(scope="module")
def full(qwen2, ids):
    return _decode_logits(qwen2, ids)


@pytest.mark.parametrize("policy", ["exact-topk", "index-topk"])
def test_retrieval_that_selects_every_key_reproduces_the_logits(qwen2, ids, full, policy):
    ra = hf.RetrievalAttention(qwen2, policy, sink=SINK, window=WINDOW, k=N, ef=256,
                               build={"kq": 16})
    got = _decode_logits(qwen2, ids, ra)
    steps = N - 1 - PREFILL
    assert got.shape == full.shape == (steps, VOCAB)
    err = float((got - full).abs().max())
    assert err < 1e-4 * float(full.abs().max()), err
    assert torch.equal(got.argmax(1), full.argmax(1))
    st = ra.stats()
    assert st["selections"] == steps * LAYERS * HEADS
    assert st["recall"] == 1.0 and abs(st["mass_ratio"] - 1.0) < 1e-5
    # Every key attended: static + the whole rest, n keys at step n.
    assert st["keys_attended"] == pytest.approx(np.mean(np.arange(PREFILL + 1, N)))
    if policy == "index-topk":
        # The keys that left the window went into both KV heads' indexes.
        assert [len(ix) for ix in ra.indexes(1)] == [N - 1 - WINDOW - SINK] * KV_HEADS


def test_a_small_k_runs_and_mostly_agrees_on_the_top1(qwen2, ids, full):
    steps = N - 1 - PREFILL
    runs = {}
    for policy in ("static", "exact-topk", "index-topk"):
        ra = hf.RetrievalAttention(qwen2, policy, sink=SINK, window=WINDOW, k=8, ef=32,
                                   build={"kq": 16})
        logits = _decode_logits(qwen2, ids, ra)
        runs[policy] = (float((logits.argmax(1) == full.argmax(1)).double().mean()), ra.stats(),
                        float((logits - full).abs().max()))
    agree = {p: r[0] for p, r in runs.items()}
    st, ex, ix = (runs[p][1] for p in ("static", "exact-topk", "index-topk"))
    assert ex["keys_attended"] == ix["keys_attended"] == SINK + WINDOW + 8
    assert ex["recall"] == 1.0 and ix["recall"] > 0.7, ix["recall"]
    # (a rest of ~150 keys: the index scores about as many as the scan)
    assert 0 < ix["keys_scored"] <= 1.1 * ex["keys_scored"]
    assert ix["mass"] <= ex["mass"] + 1e-6 and st["mass"] < ex["mass"]
    assert ix["selections"] == steps * LAYERS * HEADS
    # A small k is not exact (the test would notice a retrieval that attends everything) ...
    assert runs["exact-topk"][2] > 1e-4 and runs["index-topk"][2] > 1e-4
    # ... yet keeps the top-1 token at most steps, at least as often as sinks + window alone.
    assert agree["exact-topk"] >= 0.8 and agree["index-topk"] >= 0.8, agree
    assert agree["index-topk"] >= agree["static"], agree


def test_generate_a_left_padded_batch(qwen2, ids):
    """``generate`` with a RetrievalCache on a batch of two sequences of different lengths (left
    padding): with a k that covers every key, the model's own greedy tokens."""
    a, b = ids[:PREFILL], ids[40:PREFILL]
    batch = torch.zeros(2, PREFILL, dtype=torch.int64)
    mask = torch.zeros(2, PREFILL, dtype=torch.int64)
    batch[0], mask[0] = a, 1
    batch[1, PREFILL - len(b):], mask[1, PREFILL - len(b):] = b, 1
    kw = {"attention_mask": mask, "max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        want = qwen2.generate(batch, **kw)
        ra = hf.RetrievalAttention(qwen2, "index-topk", sink=SINK, window=WINDOW, k=N, ef=256,
                                   build={"kq": 16})
        with ra:
            got = qwen2.generate(batch, past_key_values=ra.cache(), **kw)
    assert torch.equal(got, want)
    assert ra.stats()["recall"] == 1.0
    assert qwen2.config._attn_implementation != hf.ATTENTION_NAME  # restored


def test_sliding_window_layers_keep_their_mask(ids):
    """Qwen2 with ``use_sliding_window`` (not Qwen2.5's setting): the layers from
    ``max_window_layers`` on attend a sliding window; RetrievalAttention leaves them to sdpa
    (with their mask) and retrieves in the others: with a k that covers every key, the model's
    own logits."""
    def make(**sliding):
        cfg = transformers.Qwen2Config(
            vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM, intermediate_size=256,
            num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
            max_position_embeddings=1024, rope_theta=THETA, **sliding)
        torch.manual_seed(3)
        model = transformers.Qwen2ForCausalLM(cfg).to(torch.float32).eval()
        with torch.no_grad():
            for m in hf.attention_layers(model):
                m.q_proj.weight.mul_(5)
                m.k_proj.weight.mul_(5)
        return model

    model = make(use_sliding_window=True, sliding_window=48, max_window_layers=1)
    assert [m.sliding_window for m in hf.attention_layers(model)] == [None, 48]
    ra = hf.RetrievalAttention(model, "exact-topk", sink=SINK, window=WINDOW, k=N)
    assert [m.layer_idx for m in ra.layers] == [0]
    want = _decode_logits(model, ids)
    got = _decode_logits(model, ids, ra)
    assert float((got - want).abs().max()) < 1e-4 * float(want.abs().max())
    assert ra.stats()["selections"] == (N - 1 - PREFILL) * HEADS
    # The window matters: the same weights without it give other logits.
    plain = make()
    plain.load_state_dict(model.state_dict())
    assert float((_decode_logits(plain, ids) - want).abs().max()) > 1e-3
