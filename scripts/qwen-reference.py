#!/usr/bin/env python3
"""Reference fixtures of Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF), computed by Hugging Face
``transformers`` on the CPU in float32 (its own GGUF loader and dequantizers, and its Qwen2
tokenizer converted from the GGUF vocabulary: code that shares nothing with the driver), for the
model crate's tests (issue 63).

Made with transformers 5.25.0, torch 2.15.0+cu132 (run on the CPU, float32, 1 thread),
tokenizers 0.23.3, gguf 0.19.0, numpy 2.4.6 (also stored in each fixture's "made_with"), from
models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (sha256
cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046, from
``bash scripts/get-model.sh --model qwen2.5-1.5b``), by

    HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python scripts/qwen-reference.py \\
        --gguf models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --text texts/pg-essays.txt \\
        --out model/tests/fixtures/qwen2

(texts/pg-essays.txt from ``bash scripts/get-text.sh``; without it the script takes
/usr/share/common-licenses/Apache-2.0 and says so in ppl.json's "text"). It writes:

- tokenizer.json: for each text, its ids (no BOS: the GGUF's add_bos_token is false) and the
  ids of a chat prompt made by ``apply_chat_template`` (add_generation_prompt=True), with the
  rendered prompt string;
- qk.json: for a short code prompt (its ids stored), the post-RoPE q ``[12 heads, 4, 128]`` and
  k ``[2 kv heads, 4, 128]`` of layers 0, 14 and 27 at the last 4 positions. They are taken by
  ``qkindex.hf.capture`` when the qkindex package imports, and always by this script's own hooks
  (the q_proj/k_proj outputs, biases included, rotated by RoPE with rope_theta, NeoX/rotate-half
  order); the two are compared ("capture_max_abs_diff"). Rows are in Hugging Face's order, which
  for qwen2 is the GGUF's order (transformers permutes only llama-arch q/k weights);
- logits.json: the same prompt's top-5 logits (ids, values, log-probs) at the last position
  and the greedy continuation of 16 tokens (``generate``, do_sample=False);
- ppl.json: the first 512 tokens of the text (ids stored), the negative log-likelihood of each
  of the 511 predicted tokens and the perplexity exp(mean NLL), one forward pass, no BOS.

Floats are written as the shortest decimal that reads back as the same float32.
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

LAYERS = (0, 14, 27)
LAST = 4
N_GREEDY = 16
N_PPL = 512

TEXTS = [
    "Hello, world!",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "12345 3.14159 2026-12-07 1,000,000 0x1F 007",
    "你好，世界。日本語のテキスト",
    "a    b\n\n\n  c\t\td",
    "emoji: 😀👍🏽🚀 and ❤️ (flag: 🇯🇵)",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }",
    "   leading spaces and trailing   ",
    "I'm sure you're right: it's what they'd've said. DON'T SHOUT",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "Ünïcödé façade naïve — “quotes” ‘single’ … café",
]

CHAT = [
    {"role": "system", "content": "You are a helpful coding assistant."},
    {"role": "user", "content": "Write a Python function that reverses a string."},
]

PROMPT = "def is_prime(n: int) -> bool:\n    \"\"\"Return True if n is a prime number.\"\"\"\n"


def f32(x):
    """float32 values as nested lists of Python floats that print as the shortest float32 repr."""
    a = np.asarray(x, dtype=np.float32)
    if a.ndim == 0:
        return float(str(a[()]))  # numpy's str of a float32 scalar: its shortest repr
    return [f32(v) for v in a]


def made_with():
    import gguf
    import tokenizers
    import transformers
    try:
        from importlib.metadata import version
        gguf_version = version("gguf")
    except Exception:
        gguf_version = getattr(gguf, "__version__", "?")
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "gguf": gguf_version,
        "numpy": np.__version__,
        "dtype": "float32",
        "device": "cpu",
        "script": "scripts/qwen-reference.py",
    }


def rope(x, positions, theta):
    """NeoX (rotate-half) RoPE of x [heads, n, d] at the given positions, as transformers' Qwen2."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(torch.float32) / d))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


def own_qk(model, ids, layers, theta):
    """Post-RoPE q [heads, n, d] and k [kv_heads, n, d] from hooks on q_proj and k_proj."""
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    got = {}
    hooks = []
    for layer in layers:
        attn = model.model.layers[layer].self_attn

        def hook(name, layer):
            def f(_module, _inp, out):
                got[(layer, name)] = out[0].detach().to(torch.float32)
            return f
        hooks.append(attn.q_proj.register_forward_hook(hook("q", layer)))
        hooks.append(attn.k_proj.register_forward_hook(hook("k", layer)))
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    n = ids.shape[1]
    pos = torch.arange(n)
    out = {}
    for layer in layers:
        q = got[(layer, "q")].view(n, -1, d).transpose(0, 1)
        k = got[(layer, "k")].view(n, -1, d).transpose(0, 1)
        out[layer] = (rope(q, pos, theta).numpy(), rope(k, pos, theta).numpy())
    return out


def capture_qk(model, ids, layers):
    """The same through qkindex.hf.capture, or None where qkindex does not import."""
    try:
        import tempfile

        import qkindex.hf
    except Exception as e:  # the package is optional here
        return None, f"qkindex.hf not importable: {e}"
    with tempfile.TemporaryDirectory(prefix="qwen-ref-") as tmp:
        dump = qkindex.hf.capture(model, ids, layers=list(layers), out=os.path.join(tmp, "dump"))
        return {layer: (np.array(dump.q(layer)), np.array(dump.k(layer))) for layer in layers}, \
            "qkindex.hf.capture"


def write(out_dir, name, obj):
    path = os.path.join(out_dir, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default="models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--text", default="texts/pg-essays.txt")
    ap.add_argument("--out", default="model/tests/fixtures/qwen2")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf_name = os.path.split(os.path.abspath(args.gguf))
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    print(f"tokenizer loaded in {time.time() - t0:.1f}s", file=sys.stderr)
    base = {"file": gguf_name, "made_with": made_with()}

    # (a) tokenizer
    texts = []
    for text in TEXTS:
        ids = tok(text, add_special_tokens=True)["input_ids"]
        plain = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == plain, "the tokenizer added special tokens (expected none: add_bos false)"
        texts.append({"text": text, "ids": ids, "decoded": tok.decode(ids)})
    rendered = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    chat_ids = tok(rendered, add_special_tokens=False)["input_ids"]
    direct = tok.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)
    if isinstance(direct, dict) or hasattr(direct, "keys"):
        direct = direct["input_ids"]
    assert list(direct) == chat_ids, "apply_chat_template(tokenize=True) != tokenize(rendered)"
    write(args.out, "tokenizer.json", dict(base, **{
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id, "add_bos": False,
        "texts": texts,
        "chat": {"messages": CHAT, "add_generation_prompt": True, "rendered": rendered,
                 "ids": chat_ids},
    }))

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name,
                                                 dtype=torch.float32)
    model.eval()
    print(f"model loaded in {time.time() - t0:.1f}s", file=sys.stderr)
    cfg = model.config
    theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
                  or getattr(cfg, "rope_theta"))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    config = {
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": head_dim,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "rope_theta": theta, "rms_norm_eps": cfg.rms_norm_eps, "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings), "lm_head_tied": bool(tied),
    }
    print(f"config: {config}", file=sys.stderr)

    # (b) post-RoPE q and k
    ids = torch.tensor([tok(PROMPT, add_special_tokens=False)["input_ids"]], dtype=torch.int64)
    n = ids.shape[1]
    t0 = time.time()
    mine = own_qk(model, ids, LAYERS, theta)
    captured, how = capture_qk(model, ids, LAYERS)
    print(f"q/k in {time.time() - t0:.1f}s ({how})", file=sys.stderr)
    layers = []
    max_diff = None
    for layer in LAYERS:
        q, k = mine[layer]
        if captured is not None:
            cq, ck = captured[layer]
            assert cq.shape == q.shape and ck.shape == k.shape, (cq.shape, q.shape, ck.shape, k.shape)
            diff = float(max(np.abs(cq - q).max(), np.abs(ck - k).max()))
            max_diff = diff if max_diff is None else max(max_diff, diff)
            q, k = cq, ck  # store what the model's attention received
        layers.append({"layer": layer, "q": f32(q[:, n - LAST:, :]), "k": f32(k[:, n - LAST:, :])})
    if max_diff is not None:
        print(f"capture vs own hooks: max |diff| {max_diff:.3g}", file=sys.stderr)
        assert max_diff < 1e-3, f"qkindex.hf.capture and the own RoPE disagree by {max_diff}"
    write(args.out, "qk.json", dict(base, **{
        "config": config, "prompt": PROMPT, "ids": ids[0].tolist(),
        "positions": list(range(n - LAST, n)),
        "q_shape": [cfg.num_attention_heads, LAST, head_dim],
        "k_shape": [cfg.num_key_value_heads, LAST, head_dim],
        "taken_by": how if captured is not None else "own hooks (q_proj/k_proj + RoPE)",
        "capture_note": how, "capture_max_abs_diff": max_diff,
        "layers": layers,
    }))

    # (c) top-5 logits at the last position and the greedy continuation
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, -1].to(torch.float32)
    logp = torch.log_softmax(logits, dim=-1)
    top = torch.topk(logits, 5)
    t0 = time.time()
    with torch.no_grad():
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_GREEDY,
                             do_sample=False, num_beams=1, temperature=None, top_p=None,
                             top_k=None, eos_token_id=None,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
    cont = gen[0, n:].tolist()
    print(f"greedy {len(cont)} tokens in {time.time() - t0:.1f}s", file=sys.stderr)
    write(args.out, "logits.json", dict(base, **{
        "prompt": PROMPT, "ids": ids[0].tolist(),
        "top5": {"ids": top.indices.tolist(), "logits": f32(top.values.numpy()),
                 "logprobs": f32(logp[top.indices].numpy())},
        "logsumexp": f32(torch.logsumexp(logits, dim=-1).numpy()),
        "greedy": {"n": N_GREEDY, "stop_at_eos": False, "ids": cont, "text": tok.decode(cont)},
    }))

    # (d) perplexity of the first 512 tokens of a text
    text_path = args.text
    if not os.path.exists(text_path):
        text_path = "/usr/share/common-licenses/Apache-2.0"
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    # Tokenizing a prefix long enough for 512 tokens (whole-text tokenization would give the same
    # first tokens except possibly at the cut, which lies far past token 512).
    chars = 4096
    while True:
        all_ids = tok(text[:chars], add_special_tokens=False)["input_ids"]
        if len(all_ids) > N_PPL + 16 or chars >= len(text):
            break
        chars *= 2
    full = tok(text[: chars * 2], add_special_tokens=False)["input_ids"]
    assert full[:N_PPL] == all_ids[:N_PPL], "the 512-token prefix depends on where the text is cut"
    pids = torch.tensor([all_ids[:N_PPL]], dtype=torch.int64)
    t0 = time.time()
    with torch.no_grad():
        lg = model(input_ids=pids, use_cache=False).logits[0].to(torch.float32)
    nll = -torch.log_softmax(lg[:-1], dim=-1).gather(1, pids[0, 1:, None])[:, 0]
    ppl = math.exp(float(nll.to(torch.float64).mean()))
    print(f"ppl {ppl:.4f} over {nll.numel()} tokens in {time.time() - t0:.1f}s", file=sys.stderr)
    write(args.out, "ppl.json", dict(base, **{
        "text": os.path.relpath(text_path) if text_path == args.text else text_path,
        "n_tokens": N_PPL, "bos": False, "ids": pids[0].tolist(),
        "nll": f32(nll.numpy()), "mean_nll": float(nll.to(torch.float64).mean()), "ppl": ppl,
    }))


if __name__ == "__main__":
    main()
