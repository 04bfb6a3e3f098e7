"""``qkindex.hf``: Hugging Face ``transformers`` models (optional: ``pip install qkindex[hf]``).

Both tools plug into ``transformers``' attention-function registry (``AttentionInterface``,
with ``sdpa_mask`` registered for the same name in ``AttentionMaskInterface`` so that masks,
sliding windows included, are built as for ``sdpa``). Inside the registered function the
model's attention module hands over its post-RoPE (and, for Gemma 3, post-QK-norm) queries
``[1, heads, q_len, head_dim]`` and the cache's keys and values ``[1, kv_heads, n, head_dim]``;
what the function does depends on the handler attached to that module:

- :func:`capture` records them per layer into a dump (``write_dump``), then attends with sdpa;
- :class:`RetrievalAttention` attends exactly during the prefill, builds one
  ``AttentionIndex`` per (layer, KV head) over the keys between the sinks and the window, and
  at each decode step attends to sinks + window + the top-k keys of the rest (``static``: none,
  ``exact-topk``: a scan, ``index-topk``: the index), one softmax over their union, which is
  the exact merge of the parts. Keys leaving the window are inserted into the index, guided
  by the step's queries of their group.

Models: Llama-family (SmolLM2) and Gemma 3 (its sliding-window layers keep sdpa with their
mask: nothing to retrieve there). Batch size 1. The keys and values stay in the model's cache:
decode steps read the attended ones from it, the index only chooses which. :class:`RetrievalCache`
(a ``DynamicCache``) also holds a sequence's indexes; the attention function finds it because
the attention module updates its cache just before calling the function.

    model = AutoModelForCausalLM.from_pretrained(dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    dump = qkindex.hf.capture(model, ids, layers=[9], out="dump")
    with qkindex.hf.RetrievalAttention(model, "index-topk", k=100) as ra:
        model.generate(ids, max_new_tokens=32, cache=ra.cache())
    print(ra.stats())
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ._native import AttentionIndex, Dump, decode_default_build, search_many
from ._write import write_dump

#: The name registered in ``AttentionInterface`` (and ``AttentionMaskInterface``).
ATTENTION_NAME = "qkindex"
POLICIES = ("static", "exact-topk", "index-topk")
_HANDLER = "_qkindex_handler"


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: the module's handler, or sdpa without one."""
    # Every layer takes the cache its module just updated (None for a plain cache) and clears
    # the slot, so that a handler never sees another call's.
    _UPDATED.current, _UPDATED.cache = getattr(_UPDATED, "cache", None), None
    handler = getattr(module, _HANDLER, None)
    if handler is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    return handler(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                   **kwargs)


AttentionInterface.register(ATTENTION_NAME, _attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)

# The cache whose ``update`` ran last in this thread (``cache``): a model's attention module
# updates its cache with the new keys and values, then calls the attention function, which
# moves it to ``current`` for the module's handler (and clears ``cache``, so that a plain cache
# is never mistaken for an earlier one).
_UPDATED = threading.local()


class RetrievalCache(DynamicCache):
    """A ``DynamicCache`` that also holds the retrieval state of one sequence: per global
    layer, one ``AttentionIndex`` per KV head over the keys between the sinks and the window
    (``retrieval``), built by :class:`RetrievalAttention` at the prefill and grown at each
    decode step as keys leave the window.

    With the state in the cache, each sequence has its own indexes: two generations whose
    calls interleave (or a cache kept for later turns) never read each other's. Make one with
    :meth:`RetrievalAttention.cache` and pass it as the model's cache (``cache=`` in
    transformers 5.x, ``past_key_values=`` before). Under a plain ``DynamicCache``,
    ``RetrievalAttention`` keeps one state of its own (the last prefill's).

    ``reset`` and ``crop`` drop the indexes (a cropped cache has fewer keys than they hold):
    the next call must then be a prefill, and a decode step raises ``RuntimeError``.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.retrieval: Dict[int, List[Optional[AttentionIndex]]] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        _UPDATED.cache = self
        return out

    def reset(self) -> None:
        super().reset()
        self.retrieval.clear()

    def crop(self, max_length: int) -> None:
        super().crop(max_length)
        self.retrieval.clear()


def attention_layers(model) -> List[torch.nn.Module]:
    """The model's self-attention modules in layer order (modules with a ``layer_idx`` and a
    ``q_proj``)."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")]
    if not found:
        raise ValueError(f"{type(model).__name__}: no attention modules with layer_idx and q_proj "
                         "(Llama-family and Gemma 3 models are supported)")
    return sorted(found, key=lambda m: m.layer_idx)


def _is_sliding(module) -> bool:
    """Gemma 3's local layers attend a sliding window (nothing to retrieve there)."""
    return bool(getattr(module, "is_sliding", False)) or getattr(module, "sliding_window", None) is not None


class _Installed:
    """Attaches ``handler`` to the modules of ``layers`` and switches the model to the
    registered attention function; ``remove`` restores both."""

    def __init__(self, model, handler, modules: Iterable[torch.nn.Module]):
        self.model = model
        self.modules = list(modules)
        self.previous = model.config._attn_implementation
        for m in self.modules:
            setattr(m, _HANDLER, handler)
        model.set_attn_implementation(ATTENTION_NAME)

    def remove(self) -> None:
        for m in self.modules:
            if hasattr(m, _HANDLER):
                delattr(m, _HANDLER)
        self.model.set_attn_implementation(self.previous)


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, Mapping) and "rope_theta" not in params:
        # Gemma 3: one entry per attention kind; the global layers' base is the one that matters.
        params = params.get("full_attention", next(iter(params.values()), {})) if params else {}
    theta = params.get("rope_theta") if isinstance(params, Mapping) else None
    theta = theta if theta is not None else getattr(config, "rope_theta", None)
    if theta is None:
        raise ValueError("config: no rope_theta found (rope_parameters or rope_theta)")
    return float(theta)


def _token_ids(input_ids) -> torch.Tensor:
    ids = torch.as_tensor(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ValueError(f"input_ids: expected shape [n] or [1, n], got {list(ids.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"input_ids: expected integer token ids, got {ids.dtype}")
    if ids.shape[1] == 0:
        raise ValueError("input_ids: no tokens")
    return ids.to(torch.int64)


@torch.no_grad()
def capture(model, input_ids, layers: Optional[Sequence[int]] = None, *,
            out: Optional[os.PathLike] = None, dtype: str = "float32",
            source: str = "qkindex.hf.capture") -> Dump:
    """Runs ``model`` on ``input_ids`` (``[n]`` or ``[1, n]``) and writes the post-RoPE ``q``
    (``[heads, n, head_dim]``), ``k`` and ``v`` (``[kv_heads, n, head_dim]``) of ``layers``
    (None: every layer) as a dump at ``out`` (None: a new temporary directory), stored as
    ``dtype`` ("float32" or "float16"); returns it opened (``Dump``)."""
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype: expected 'float32' or 'float16', got {dtype!r}")
    ids = _token_ids(input_ids)
    modules = attention_layers(model)
    by_layer = {m.layer_idx: m for m in modules}
    wanted = sorted(by_layer) if layers is None else sorted(set(int(x) for x in layers))
    missing = [x for x in wanted if x not in by_layer]
    if missing:
        raise ValueError(f"layers: {missing} do not exist (the model has {len(by_layer)})")
    np_dtype = np.float32 if dtype == "float32" else np.float16
    got: Dict[int, Dict[str, np.ndarray]] = {}

    def record(module, query, key, value, attention_mask, **kw):
        got[module.layer_idx] = {
            name: t[0].detach().to(torch.float32).cpu().numpy().astype(np_dtype, copy=False)
            for name, t in (("q", query), ("k", key), ("v", value))
        }
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    installed = _Installed(model, record, (by_layer[x] for x in wanted))
    try:
        model(input_ids=ids.to(model.device), use_cache=False)
    finally:
        installed.remove()
    cfg = model.config
    fields = {
        "model": str(getattr(cfg, "name_or_path", "") or type(model).__name__),
        "n_layers": int(cfg.num_hidden_layers),
        "rope_theta": _rope_theta(cfg),
        "source": source,
    }
    if out is None:
        out = tempfile.mkdtemp(prefix="qkindex-capture-")
    return write_dump(out, fields, got)


class RetrievalAttention:
    """Retrieval attention for the decode steps of a ``transformers`` causal LM (batch 1).

    ``policy``: ``"static"`` (sinks + window only), ``"exact-topk"`` (plus the exact top-``k``
    of the rest, by a scan) or ``"index-topk"`` (plus the top-``k`` an ``AttentionIndex``
    returns, built after the prefill per layer and KV head from the keys of the rest and the
    group's prefill queries; ``ef`` for its searches). The index is the decode default, the
    driver's (``qkindex.decode_default_build()``: causal lists from each query's visible keys,
    1.25 queries per key, far-back queries' full lists, and each index's default ``ef``
    measured for recall@100 0.95 on the group's last prefill queries); ``build`` overrides its
    ``AttentionIndex.build`` keywords. ``measure``: also score every key each step (untimed) to report recall@k of the
    retrieved keys against the rest's exact top-k, the attended keys' softmax mass, and its
    ratio to the mass with the exact top-k in their place (the driver's statistics).

    Use as a context manager around ``model(...)`` / ``model.generate(...)``: a call whose
    queries cover the whole cache (a prefill) attends exactly and (re)builds the state; calls
    of one token are decode steps. The state lives in the model's cache when it is a
    :class:`RetrievalCache` (``ra.cache()``; one per sequence), else in this object. Every
    ``stats()`` figure sums over decode steps, layers and query heads.

        with qkindex.hf.RetrievalAttention(model, "index-topk") as ra:
            model.generate(ids, max_new_tokens=32, cache=ra.cache())
    """

    def __init__(self, model, policy: str = "index-topk", *, sink: int = 128, window: int = 512,
                 k: int = 100, ef: Optional[int] = None, measure: bool = True,
                 build: Optional[Mapping[str, Any]] = None, max_train: Optional[int] = 4096,
                 threads: Optional[int] = None):
        if policy not in POLICIES:
            raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        for name, v, least in (("sink", sink, 0), ("window", window, 1), ("k", k, 1)):
            if int(v) < least:
                raise ValueError(f"{name}: must be at least {least}, got {v}")
        if max_train is not None and max_train < 1:
            raise ValueError(f"max_train: must be at least 1 or None, got {max_train}")
        self.model = model
        self.policy = policy
        self.sink, self.window, self.k, self.ef = int(sink), int(window), int(k), ef
        self.measure = measure
        self.build_params = {**decode_default_build(), **dict(build or {})}
        self.max_train = max_train
        self.threads = threads or min(8, os.cpu_count() or 1)
        modules = attention_layers(model)
        self.layers = [m for m in modules if not _is_sliding(m)]
        # Per global layer, one index per KV head over its rest (id i = position sink + i);
        # None where the policy builds none. The state of the last prefill: a RetrievalCache's
        # own (``cache.retrieval``), or this object's under a plain cache.
        self.heads: Dict[int, List[Optional[AttentionIndex]]] = {}
        self._own: Dict[int, List[Optional[AttentionIndex]]] = self.heads
        self._installed: Optional[_Installed] = None
        self.reset_stats()

    def cache(self) -> RetrievalCache:
        """A new :class:`RetrievalCache` for this model: pass it as the model's cache so that the
        sequence keeps its own indexes."""
        return RetrievalCache(config=self.model.config)

    # -- installation -------------------------------------------------------------------
    def __enter__(self) -> "RetrievalAttention":
        self._installed = _Installed(self.model, self._attend, self.layers)
        return self

    def __exit__(self, *exc) -> None:
        if self._installed is not None:
            self._installed.remove()
            self._installed = None

    # -- statistics ---------------------------------------------------------------------
    def reset_stats(self) -> None:
        """Zeroes the counters (the indexes stay)."""
        self._s = {"selections": 0, "keys_attended": 0, "distance_computations": 0,
                   "measured": 0, "recall_measured": 0, "recall_sum": 0.0, "mass_sum": 0.0, "mass_ratio_sum": 0.0,
                   "steps": 0, "build_s": 0.0, "search_s": 0.0, "prefill_keys": 0}

    def stats(self) -> Dict[str, Any]:
        """``policy``, ``selections`` ((step, layer, query head) triples), ``keys_attended``
        (mean per selection), ``keys_scored`` (mean inner products of the selector per
        selection: the rest's size for a scan, the index's count for a search, 0 for static),
        ``recall``, ``mass``, ``mass_ratio`` (means over measured selections), ``build_s``
        (index builds), ``search_s`` (upkeep + selection)."""
        s = self._s
        sel, meas = max(s["selections"], 1), max(s["measured"], 1)
        # recall: NaN for static (nothing retrieved); mass figures: NaN without measure.
        return {
            "policy": self.policy,
            "selections": s["selections"],
            "keys_attended": s["keys_attended"] / sel,
            "keys_scored": s["distance_computations"] / sel,
            "recall": (s["recall_sum"] / s["recall_measured"] if s["recall_measured"]
                       else float("nan")),
            "mass": s["mass_sum"] / meas if s["measured"] else float("nan"),
            "mass_ratio": s["mass_ratio_sum"] / meas if s["measured"] else float("nan"),
            "build_s": s["build_s"],
            "search_s": s["search_s"],
        }

    # -- the attention function -----------------------------------------------------------
    def _attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        cache = getattr(_UPDATED, "current", None)
        state = cache.retrieval if isinstance(cache, RetrievalCache) else self._own
        q_len, n = query.shape[2], key.shape[2]
        if query.shape[0] != 1:
            raise ValueError(f"RetrievalAttention: batch size 1 only, got {query.shape[0]}")
        if q_len > 1 or n <= self.sink + self.window:
            # Prefill (or a context no longer than the static part): exact attention.
            out = sdpa_attention_forward(module, query, key, value, attention_mask,
                                         scaling=scaling, dropout=dropout, **kw)
            if q_len == n:
                self._prefill(state, module, query, key)
            return out
        return self._decode(state, module, query, key, value, scaling), None

    def _prefill(self, state, module, query, key) -> None:
        """Builds the (layer, KV head) indexes of ``state`` after a prefill of ``n``
        positions."""
        self.heads = state
        layer, n = module.layer_idx, key.shape[2]
        kvh, h = key.shape[1], query.shape[1]
        group = h // kvh
        rest_end = n - self.window
        if self.policy != "index-topk" or rest_end <= self.sink:
            state[layer] = [None] * kvh
            return
        t0 = time.perf_counter()
        keys = key[0, :, self.sink:rest_end].detach()
        queries = query[0].detach()
        # The rest keys the query at each position could attend to (rest id i is position
        # sink + i), alike for every query head of a group: what causal builds read.
        seen = np.clip(np.arange(1, n + 1) - self.sink, 0, rest_end - self.sink)
        seen = np.tile(seen, group).astype(np.int64)

        def build(j: int) -> AttentionIndex:
            # The group's prefill queries (head-major), evenly subsampled to max_train rows.
            train = queries[j * group:(j + 1) * group].reshape(-1, queries.shape[-1])
            visible = seen
            if self.max_train is not None and train.shape[0] > self.max_train:
                pick = torch.linspace(0, train.shape[0] - 1, self.max_train).round().long()
                train, visible = train[pick], seen[pick.numpy()]
            return AttentionIndex.build(keys[j], train, visible=visible, **self.build_params)

        with ThreadPoolExecutor(min(self.threads, kvh)) as pool:
            built = list(pool.map(build, range(kvh)))
        state[layer] = built
        self._s["build_s"] += time.perf_counter() - t0
        self._s["prefill_keys"] = n

    def _decode(self, state, module, query, key, value, scaling) -> torch.Tensor:
        """One decode position under ``state``: attention output ``[1, 1, heads, head_dim]``."""
        layer = module.layer_idx
        n, kvh, h, d = key.shape[2], key.shape[1], query.shape[1], query.shape[3]
        group = h // kvh
        scaling = float(scaling if scaling is not None else d ** -0.5)
        rest_end = n - self.window
        q = query[0, :, 0].to(torch.float32)  # [h, d]
        keys, vals = key[0], value[0]  # [kvh, n, d]
        heads = state.get(layer)
        t0 = time.perf_counter()
        picked: List[torch.Tensor] = []
        dcs = 0
        if self.policy == "index-topk":
            if heads is None:
                raise RuntimeError(f"layer {layer}: decode before a prefill under RetrievalAttention "
                                   "(or after the cache was reset or cropped)")
            for j, ix in enumerate(heads):
                qg = q[j * group:(j + 1) * group]
                if ix is None:
                    # The prefill left no rest (it fit in sink + window): the first key to
                    # leave the window starts the index, trained on this step's queries.
                    # Decode queries see every key of the rest.
                    seen = np.full(qg.shape[0], rest_end - self.sink, dtype=np.int64)
                    ix = heads[j] = AttentionIndex.build(keys[j, self.sink:rest_end], qg,
                                                         visible=seen, **self.build_params)
                # Upkeep: keys that left the window enter the index (ids follow positions).
                while self.sink + len(ix) < rest_end:
                    pos = self.sink + len(ix)
                    ix.insert(keys[j, pos], qg)
            # Every KV head's group searched in one call, in parallel ([kvh, group, d]).
            kk = min(self.k, min(len(ix) for ix in heads))
            res = search_many(heads, q.reshape(kvh, group, d), k=kk, ef=self.ef)
            ids = torch.from_numpy(res.ids).reshape(kvh * group, kk)
            picked.append(ids.clamp(min=0) + self.sink)
            dcs += int(res.distance_computations.sum())
        elif self.policy == "exact-topk":
            kk = min(self.k, rest_end - self.sink)
            for j in range(kvh):
                qg = q[j * group:(j + 1) * group]
                sc = qg @ keys[j, self.sink:rest_end].to(torch.float32).T
                picked.append(sc.topk(kk, dim=1).indices + self.sink)
                dcs += group * (rest_end - self.sink)
        self._s["search_s"] += time.perf_counter() - t0

        static = torch.cat([torch.arange(self.sink), torch.arange(rest_end, n)])
        if picked:
            chosen = torch.cat(picked, dim=0)  # [h, k]
            pos = torch.cat([static.expand(h, -1), chosen], dim=1)
        else:
            pos = static.expand(h, -1)
        kv_of = torch.arange(h) // group
        kg = keys[kv_of[:, None], pos].to(torch.float32)  # [h, s, d]
        vg = vals[kv_of[:, None], pos].to(torch.float32)
        scores = torch.einsum("hsd,hd->hs", kg, q) * scaling
        p = torch.softmax(scores, dim=1)
        out = torch.einsum("hs,hsd->hd", p, vg)

        s = self._s
        s["selections"] += h
        s["keys_attended"] += pos.numel()
        s["distance_computations"] += dcs
        if layer == self.layers[0].layer_idx:
            s["steps"] += 1
        if self.measure:
            self._measure(q, keys, pos, picked, scaling, group, rest_end)
        return out.to(query.dtype)[None, None]

    def _measure(self, q, keys, pos, picked, scaling, group, rest_end) -> None:
        """Recall, mass and mass ratio of this step's selections against every key."""
        h, n = q.shape[0], keys.shape[1]
        kall = keys.to(torch.float32).repeat_interleave(group, dim=0)  # [h, n, d]
        full = torch.softmax(torch.einsum("hnd,hd->hn", kall, q) * scaling, dim=1)
        mass = full.gather(1, pos).sum(1)
        n_static = self.sink + (n - rest_end)
        static_mass = full[:, :self.sink].sum(1) + full[:, rest_end:].sum(1)
        rest = full[:, self.sink:rest_end]
        kk = pos.shape[1] - n_static
        if kk > 0:
            top = rest.topk(kk, dim=1)
            exact_mass = static_mass + top.values.sum(1)
            chosen = torch.cat(picked, dim=0) - self.sink
            hits = (chosen[:, :, None] == top.indices[:, None, :]).any(2).sum(1)
            recall = hits.to(torch.float64) / kk
        else:
            exact_mass = static_mass
            recall = None  # nothing retrieved (static): no recall to report
        s = self._s
        s["measured"] += h
        s["mass_sum"] += float(mass.sum())
        s["mass_ratio_sum"] += float((mass / exact_mass).sum())
        if recall is not None:
            s["recall_measured"] += h
            s["recall_sum"] += float(recall.sum())


@torch.no_grad()
def perplexity(model, input_ids, prefill: int, attention: Optional[RetrievalAttention] = None
               ) -> Dict[str, float]:
    """Teacher-forced perplexity of ``input_ids[prefill:]``: one prefill of the first
    ``prefill`` tokens, then one decode step per token (under ``attention`` if given, else
    the model's own attention), each scoring the next token. Returns ``ppl``, ``nll`` (mean),
    ``tokens`` scored, ``prefill_s``, ``decode_s`` and ``tokens_per_s`` (decode steps)."""
    ids = _token_ids(input_ids).to(model.device)
    n = ids.shape[1]
    if not 0 < prefill < n - 1:
        raise ValueError(f"prefill: must be between 1 and {n - 2} (input_ids has {n} tokens), "
                         f"got {prefill}")
    def run() -> Dict[str, float]:
        cache = (attention.cache() if attention is not None
                 else DynamicCache(config=model.config))
        t0 = time.perf_counter()
        model(input_ids=ids[:, :prefill], cache=cache, use_cache=True, logits_to_keep=1)
        t1 = time.perf_counter()
        nll = 0.0
        for t in range(prefill, n - 1):
            out = model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            logp = torch.log_softmax(out.logits[0, -1].to(torch.float32), dim=-1)
            nll -= float(logp[ids[0, t + 1]])
        t2 = time.perf_counter()
        steps = n - 1 - prefill
        return {"ppl": math.exp(nll / steps), "nll": nll / steps, "tokens": steps,
                "prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens_per_s": steps / (t2 - t1)}

    if attention is None:
        return run()
    with attention:
        return run()
