#!/usr/bin/env python3
"""qkindex.hf's RetrievalAttention on Qwen2.5-Coder-1.5B-Instruct loaded by transformers from
our GGUF file (float32, CPU, offline), against the model's own (exact) attention: the top-1
agreement over decode steps after a long prompt (issue 63, item 7).

For each policy: one prefill of ``--prefill`` tokens of ``--text`` under the policy (exact
attention; it builds the indexes), then ``--steps`` decode steps, teacher-forced on the same
tokens as the reference run. The reference ("full") decodes from a plain ``DynamicCache`` copy of
the first policy's prefill cache (same keys and values: the prefill is exact under every policy)
with the model's own sdpa attention. ``--source text``: the tokens are the text's next tokens;
``--source greedy``: the reference's greedy tokens (the first one from the prefill's logits),
which every policy is then fed, so that agreement = the step's greedy token is unchanged.

Per policy it prints and writes (``--out``, JSON): top-1 agreement with the reference, the mean
NLL of the fed tokens (and the reference's), the mean KL(reference || policy) of the next-token
distributions, and ``ra.stats()`` (recall@k of the retrieved keys against the exact top-k of
the rest, keys scored and attended per selection, attended softmax mass and its ratio to the
exact top-k's).

    HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python scripts/hf_qwen.py --prefill 2048 --steps 64 \\
        --out docs/bench/hf-qwen/text-2048.json
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def plain_copy(cache, config):
    """A ``DynamicCache`` holding copies of ``cache``'s keys and values (every layer)."""
    from transformers import DynamicCache

    out = DynamicCache(config=config)
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.clone(), layer.values.clone(), i)
    return out


def decode(model, cache, first_ids, steps, feed=None):
    """``steps`` decode steps from ``cache``: step i feeds ``feed[i]`` (teacher forcing) or,
    without ``feed``, the previous step's argmax starting from ``first_ids`` (greedy). Returns
    (the fed ids, log-probabilities ``[steps, vocab]``, seconds)."""
    import qkindex.hf as hf

    kw = hf.cache_kwarg(model)
    fed, logps = [], []
    nxt = first_ids
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(steps):
            tok = feed[i] if feed is not None else nxt
            fed.append(tok)
            out = model(input_ids=torch.tensor([[tok]], device=model.device), **{kw: cache},
                        use_cache=True)
            lp = torch.log_softmax(out.logits[0, -1].to(torch.float32), dim=-1)
            logps.append(lp)
            nxt = int(lp.argmax())
    return fed, torch.stack(logps), time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default="models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--text", default="texts/pg-essays.txt")
    ap.add_argument("--offset", type=int, default=0, help="first token of the text to use")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--source", choices=("text", "greedy"), default="text")
    ap.add_argument("--policies", default="index-topk,exact-topk",
                    help="comma-separated RetrievalAttention policies")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--sink", type=int, default=128)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--ef", type=int, default=None, help="default: each index's own")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--out", default=None, help="JSON results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import qkindex.hf as hf

    gguf_dir, gguf_name = os.path.split(os.path.abspath(args.gguf))
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name,
                                                 dtype=torch.float32).eval()
    cfg = model.config
    log(f"loaded {gguf_name} in {time.perf_counter() - t0:.0f}s: {cfg.model_type}, "
        f"{cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads over "
        f"{cfg.num_key_value_heads} KV heads, rope_theta {hf._rope_theta(cfg):g}")
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    all_ids = tok(text, add_special_tokens=False)["input_ids"]
    need = args.offset + args.prefill + args.steps + 1
    if len(all_ids) < need:
        sys.exit(f"{args.text}: {len(all_ids)} tokens, {need} needed")
    ids = torch.tensor([all_ids[args.offset:need]], dtype=torch.int64)
    prompt = ids[:, :args.prefill]
    kw = hf.cache_kwarg(model)

    policies = [p for p in args.policies.split(",") if p]
    result = {
        "model": gguf_name, "text": os.path.relpath(args.text), "offset": args.offset,
        "prefill": args.prefill, "steps": args.steps, "source": args.source,
        "k": args.k, "sink": args.sink, "window": args.window, "ef": args.ef,
        "threads": args.threads, "transformers": transformers.__version__,
        "torch": torch.__version__, "policies": {},
    }
    ref = None  # (fed ids, log-probs) of the model's own attention
    first = None
    for policy in policies:
        ra = hf.RetrievalAttention(model, policy, sink=args.sink, window=args.window, k=args.k,
                                   ef=args.ef)
        cache = ra.cache()
        with torch.no_grad(), ra:
            t0 = time.perf_counter()
            out = model(input_ids=prompt, **{kw: cache}, use_cache=True, logits_to_keep=1)
            prefill_s = time.perf_counter() - t0
        first_tok = int(out.logits[0, -1].argmax())
        log(f"{policy}: prefill of {args.prefill} tokens in {prefill_s:.0f}s")
        if ref is None:
            first = first_tok
            feed = (ids[0, args.prefill:args.prefill + args.steps].tolist()
                    if args.source == "text" else None)
            fed, lp, secs = decode(model, plain_copy(cache, cfg), first, args.steps, feed)
            ref = (fed, lp)
            nll = -lp[:-1].gather(1, torch.tensor(fed[1:])[:, None]).mean()
            result["full"] = {"decode_s": secs, "fed": fed,
                              "top1": lp.argmax(1).tolist(),
                              "nll": float(nll) if args.source == "text" else None}
            log(f"full: {args.steps} steps in {secs:.0f}s")
        assert first_tok == first, "the prefill is exact under every policy"
        fed, rlp = ref
        with ra:
            _, lp, secs = decode(model, cache, first, args.steps, fed)
        agree = (lp.argmax(1) == rlp.argmax(1)).tolist()
        kl = (rlp.exp() * (rlp - lp)).sum(1)
        nxt = torch.tensor(fed[1:])[:, None]
        st = ra.stats()
        r = {
            "top1_agreement": sum(agree) / len(agree),
            "top1_agree_steps": sum(agree),
            "disagree_at": [i for i, a in enumerate(agree) if not a],
            "top1": lp.argmax(1).tolist(),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            # NLL of the fed tokens (steps 0..steps-2 predict fed[1:]).
            "nll": float(-lp[:-1].gather(1, nxt).mean()),
            "nll_full": float(-rlp[:-1].gather(1, nxt).mean()),
            "prefill_s": prefill_s, "decode_s": secs, "stats": st,
        }
        result["policies"][policy] = r
        log(f"{policy}: top-1 agreement {r['top1_agree_steps']}/{args.steps} "
            f"({100 * r['top1_agreement']:.1f}%), KL mean {r['kl_mean']:.4f} max "
            f"{r['kl_max']:.4f}, NLL {r['nll']:.4f} (full {r['nll_full']:.4f}); "
            f"recall@{args.k} {st['recall']:.4f}, keys scored {st['keys_scored']:.1f}, "
            f"attended {st['keys_attended']:.1f}, mass ratio {st['mass_ratio']:.4f}; "
            f"{args.steps} steps in {secs:.0f}s")
        del cache
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
