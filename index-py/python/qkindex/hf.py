"""``qkindex.hf``: Hugging Face ``transformers`` models (optional: ``pip install qkindex[hf]``).

Both tools plug into ``transformers``' attention-function registry (``AttentionInterface``,
with ``sdpa_mask`` registered for the same name in ``AttentionMaskInterface`` so that masks,
sliding windows included, are built as for ``sdpa``). Inside the registered function the
model's attention module hands over its post-RoPE (and, for Gemma 3, post-QK-norm) queries
``[batch, heads, q_len, head_dim]`` and the cache's keys and values
``[batch, kv_heads, n, head_dim]``; what the function does depends on the handler attached to
that module:

- :func:`capture` records them per layer into a dump (``write_dump``), then attends with sdpa;
- :class:`RetrievalAttention` attends exactly during the prefill, builds one
  ``AttentionIndex`` per (sequence, layer, KV head) over the keys between the sinks and the
  window, and at each decode step attends to sinks + window + the top-k keys of the rest
  (``static``: none, ``exact-topk``: a scan, ``index-topk``: the index), merged exactly with
  one softmax. Keys leaving the window are inserted into the index, guided by the step's
  queries of their group.

Models: Llama-family (SmolLM2, Llama 3), Qwen2 (Qwen2.5: its q/k/v biases are inside the
projections, before RoPE, so the function sees them applied; GQA groups of any size; layers
made sliding by ``use_sliding_window`` keep sdpa) and Gemma 3 (its sliding-window layers keep
sdpa with their mask: nothing to retrieve there), on any device (``cpu``, ``cuda``,
``cuda:N``): every tensor is made on the model's device, and only what the index needs
crosses to host memory (``TRANSFERS`` counts each crossing). Batches of sequences of
different lengths (left padding, as ``generate`` pads them) keep one index set per sequence;
padded positions never enter an index.

Where the keys and values live:

- default: in the model's cache, on the model's device. ``index-topk`` copies the rest's keys
  to host memory once at the prefill (pinned buffers on a GPU, copied while the prefill goes
  on and indexed by background threads), and each key as it leaves the window; per decode step
  the queries go to the host and the chosen ids come back;
- ``offload=True`` (needs the cache of :meth:`RetrievalAttention.cache`): the rest's keys and
  values live only in host memory; the device holds the sinks, the window and a small buffer.
  Per step the retrieved rows' partial attention is computed on the host and merged exactly
  with the device's part by their log-sum-exp (``offload="merge"``: a ``[heads, head_dim + 1]``
  tensor comes back per sequence and layer), or the rows themselves go to the device
  (``offload="gather"``).

    model = AutoModelForCausalLM.from_pretrained(dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    dump = qkindex.hf.capture(model, ids, layers=[9], out="dump")
    with qkindex.hf.RetrievalAttention(model, "index-topk", k=100) as ra:
        model.generate(ids, max_new_tokens=32, past_key_values=ra.cache())
    print(ra.stats())

``past_key_values=`` is the ``generate`` argument that every transformers 5.x takes (5.0 has
no ``cache=``; later versions accept both).
"""

from __future__ import annotations

import inspect
import math
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ._native import AttentionIndex, Dump, decode_default_build, search_many
from ._write import write_dump

#: The name registered in ``AttentionInterface`` (and ``AttentionMaskInterface``).
ATTENTION_NAME = "qkindex"
POLICIES = ("static", "exact-topk", "index-topk")
OFFLOAD_MODES = ("merge", "gather")
#: The transformers versions this module is tested with (lowest and highest, both 5.x).
TESTED_TRANSFORMERS = ("5.0.0", "5.25.0")
_HANDLER = "_qkindex_handler"
_HOST = torch.device("cpu")


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


def cache_kwarg(model) -> str:
    """The name under which this transformers version's ``model.forward`` takes a cache:
    ``"cache"`` (later 5.x) or ``"past_key_values"`` (5.0). ``generate`` takes
    ``past_key_values`` in every 5.x."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class Transfers:
    """Counts the copies ``qkindex.hf`` makes between the model's side and host memory:
    ``to_host`` / ``to_model`` copies and bytes, and the largest single copy (``largest``).
    Counted for every crossing the code makes, even when the model is on the CPU (where the
    copy is within host memory), so that tests on a CPU check what a GPU would move."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.to_host = self.to_host_bytes = 0
        self.to_model = self.to_model_bytes = 0
        self.largest = 0

    def count(self, direction: str, t: torch.Tensor) -> None:
        size = t.numel() * t.element_size()
        with self._lock:
            if direction == "to_host":
                self.to_host += 1
                self.to_host_bytes += size
            else:
                self.to_model += 1
                self.to_model_bytes += size
            self.largest = max(self.largest, size)

    def snapshot(self) -> Dict[str, int]:
        return {"to_host": self.to_host, "to_host_bytes": self.to_host_bytes,
                "to_model": self.to_model, "to_model_bytes": self.to_model_bytes,
                "largest": self.largest}


#: Every host <-> model-device copy of ``qkindex.hf`` (see :class:`Transfers`).
TRANSFERS = Transfers()


def _to_host(t: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``t`` copied to host memory: into ``out`` (a pinned buffer on a GPU: the copy is
    asynchronous, see :func:`_copied`) or a new tensor. Always a copy, never a view of ``t``."""
    TRANSFERS.count("to_host", t)
    if out is None:
        out = torch.empty(t.shape, dtype=t.dtype, device=_HOST)
        out.copy_(t)
        return out
    out.copy_(t, non_blocking=out.is_pinned())
    return out


def _to_model(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (host memory) copied to the model's ``device``."""
    TRANSFERS.count("to_model", t)
    return t.to(device, copy=True)


def _copied(device: torch.device) -> Optional[Any]:
    """An event that completes when the asynchronous copies queued so far on ``device``'s
    current stream are done (None on the CPU: copies there are synchronous)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _host_buffer(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An empty host tensor, pinned when the model is on a GPU (asynchronous copies)."""
    return torch.empty(tuple(shape), dtype=dtype, device=_HOST,
                       pin_memory=device.type == "cuda")


class _HostRows:
    """Rows ``[kv_heads, n, head_dim]`` kept in host memory (a sequence's rest keys or values
    in one layer), in a buffer that grows by a quarter (at least 256 rows) when full."""

    def __init__(self, kvh: int, d: int, dtype: torch.dtype, device: torch.device, cap: int):
        self.model_device = device
        self.buf = _host_buffer((kvh, max(cap, 16), d), dtype, device)
        self.n = 0

    def _reserve(self, m: int) -> None:
        if self.n + m > self.buf.shape[1]:
            kvh, cap, d = self.buf.shape
            bigger = _host_buffer((kvh, max(cap + max(cap // 4, 256), self.n + m), d), self.buf.dtype,
                                  self.model_device)
            bigger[:, :self.n].copy_(self.buf[:, :self.n])
            self.buf = bigger

    def append_from_model(self, rows: torch.Tensor) -> None:
        """Copies ``rows`` ``[kv_heads, m, head_dim]`` from the model's device (one copy)."""
        m = rows.shape[1]
        self._reserve(m)
        _to_host(rows, self.buf[:, self.n:self.n + m])
        self.n += m

    def append_host(self, rows: torch.Tensor) -> None:
        """Appends ``rows`` already in host memory (no device copy)."""
        m = rows.shape[1]
        self._reserve(m)
        self.buf[:, self.n:self.n + m].copy_(rows)
        self.n += m

    @property
    def rows(self) -> torch.Tensor:
        return self.buf[:, :self.n]

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()


class _Seq:
    """One sequence's retrieval state in one global layer. Columns count cache positions
    (padding included): the sequence's tokens are ``[pad, n)``, its sinks ``[pad, sink_end)``,
    its rest ``[sink_end, rest_end)``, known to the host (``keys``/``values`` in host memory
    under offload, the indexes of ``index-topk``); the window is ``[rest_end, n)``."""

    def __init__(self, pad: int, sink_end: int):
        self.pad, self.sink_end, self.rest_end = pad, sink_end, sink_end
        self.indexes: List[Optional[AttentionIndex]] = []
        self.keys: Optional[_HostRows] = None
        self.values: Optional[_HostRows] = None
        self.pending: List[Future] = []

    def ready(self) -> float:
        """Waits for the background index builds; returns the seconds waited."""
        if not self.pending:
            return 0.0
        t0 = time.perf_counter()
        for j, f in enumerate(self.pending):
            self.indexes[j] = f.result()
        self.pending = []
        return time.perf_counter() - t0


class _OffloadLayer(DynamicLayer):
    """A global layer's cache under offload: after the prefill the device holds only the
    columns ``[0, head)`` (every sequence's padding and sinks) and a tail from ``tail_start``
    (the window and up to ``buffer`` newer columns), in preallocated tensors of
    ``head + window + buffer`` columns; the rest lives in host memory (:class:`_Seq`).
    ``get_seq_length`` is the logical length, so positions and masks are those of the whole
    sequence."""

    def __init__(self, window: int, buffer: int):
        super().__init__()
        self.window, self.buffer = window, buffer
        self.length = 0
        self.head: Optional[int] = None
        self.tail_start = 0
        self.fill = 0

    def update(self, key_states, value_states, *args, **kwargs):
        m = key_states.shape[-2]
        if self.head is None:  # the prefill: held whole until ``settle``
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            self.length = self.fill = keys.shape[-2]
            return keys, values
        if m > self.buffer:
            raise ValueError(f"RetrievalAttention(offload=True): {m} new positions in one call "
                             f"after the prefill, at most buffer={self.buffer}")
        if self.fill + m > self.keys.shape[-2]:
            self._compact()
        self.keys[:, :, self.fill:self.fill + m] = key_states
        self.values[:, :, self.fill:self.fill + m] = value_states
        self.fill += m
        self.length += m
        return self.keys[:, :, :self.fill], self.values[:, :, :self.fill]

    def settle(self, head: int) -> None:
        """After the prefill (whose rest has been copied to host memory): keeps the columns
        ``[0, head)`` and the window, in tensors with room for ``buffer`` more."""
        n = self.length
        head = min(head, n)
        keep = max(head, n - self.window)
        b, kvh, _, d = self.keys.shape
        cap = head + self.window + self.buffer
        keys = self.keys.new_empty((b, kvh, cap, d))
        values = self.values.new_empty((b, kvh, cap, d))
        for new, old in ((keys, self.keys), (values, self.values)):
            new[:, :, :head] = old[:, :, :head]
            new[:, :, head:head + n - keep] = old[:, :, keep:n]
        self.keys, self.values = keys, values
        self.head, self.tail_start, self.fill = head, keep, head + n - keep

    def _compact(self) -> None:
        """Drops the tail's columns that left the window (already in host memory)."""
        keep = max(self.length - self.window, self.tail_start)
        shift = keep - self.tail_start
        if shift > 0:
            for t in (self.keys, self.values):
                t[:, :, self.head:self.fill - shift] = t[:, :, self.head + shift:self.fill].clone()
            self.fill -= shift
            self.tail_start = keep

    def device_columns(self, cols: torch.Tensor) -> torch.Tensor:
        """The device columns of the logical columns ``cols`` (each in the head or tail)."""
        if self.head is None:
            return cols
        return torch.where(cols < self.head, cols, cols - self.tail_start + self.head)

    def get_seq_length(self, *args, **kwargs) -> int:
        return self.length

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("an offloaded RetrievalCache layer cannot be cropped, reordered "
                                  "or repeated (its rest is in host memory): use offload=False")

    crop = reorder_cache = batch_repeat_interleave = batch_select_indices = _unsupported

    def reset(self) -> None:
        super().reset()
        self.length = self.fill = self.tail_start = 0
        self.head = None


class RetrievalCache(DynamicCache):
    """A ``DynamicCache`` that also holds the retrieval state of its sequences: per global
    layer, per sequence of the batch, one ``AttentionIndex`` per KV head over the keys between
    the sinks and the window (``retrieval[layer][seq].indexes``), built by
    :class:`RetrievalAttention` at the prefill and grown at each decode step as keys leave the
    window; under offload also the rest's keys and values in host memory.

    With the state in the cache, each sequence has its own indexes: two generations whose
    calls interleave (or a cache kept for later turns) never read each other's. Make one with
    :meth:`RetrievalAttention.cache` and pass it as ``past_key_values=`` to ``generate``
    (every transformers 5.x takes it). Under a plain ``DynamicCache``, ``RetrievalAttention``
    keeps one state of its own (the last prefill's), and offload is not possible.

    ``reset`` and ``crop`` drop the indexes (a cropped cache has fewer keys than they hold):
    the next call must then be a prefill, and a decode step raises ``RuntimeError``.
    """

    def __init__(self, *args, offload_layers: Sequence[int] = (), window: int = 512,
                 buffer: int = 64, **kwargs):
        super().__init__(*args, **kwargs)
        self.retrieval: Dict[int, List[_Seq]] = {}
        self.offloaded = sorted(set(int(x) for x in offload_layers))
        for i in self.offloaded:
            if i >= len(self.layers):
                raise ValueError(f"offload_layers: layer {i} does not exist "
                                 f"(the cache has {len(self.layers)})")
            self.layers[i] = _OffloadLayer(window, buffer)

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

    def kv_bytes(self) -> Dict[str, int]:
        """Bytes of keys and values: ``model`` held by the cache's layers (on the model's
        device), ``host`` held in host memory under offload (the indexes' own copies of the
        keys not counted)."""
        model = sum(t.numel() * t.element_size() for layer in self.layers
                    for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                    if isinstance(t, torch.Tensor))
        host = sum(rows.nbytes for seqs in self.retrieval.values() for s in seqs
                   for rows in (s.keys, s.values) if rows is not None)
        return {"model": model, "host": host}


def attention_layers(model) -> List[torch.nn.Module]:
    """The model's self-attention modules in layer order (modules with a ``layer_idx`` and a
    ``q_proj``)."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")]
    if not found:
        raise ValueError(f"{type(model).__name__}: no attention modules with layer_idx and q_proj "
                         "(Llama-family, Qwen2 and Gemma 3 models are supported)")
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
            name: _to_host(t[0].detach()).to(torch.float32).numpy().astype(np_dtype, copy=False)
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


def _pads(attention_mask: Optional[torch.Tensor], batch: int, n: int) -> List[int]:
    """The left padding of each sequence (leading columns no query of it may attend), from the
    layer's mask ``[batch, 1, q_len, n]`` (its last query row); None (no mask) is no padding.
    One ``[batch]`` tensor crosses to the host."""
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor):
        return [0] * batch
    row = attention_mask[:, 0, -1, :n]
    valid = row if row.dtype == torch.bool else row == 0
    if valid.shape[0] != batch:  # a mask broadcast over the batch
        valid = valid.expand(batch, -1)
    first = valid.to(torch.int64).argmax(dim=1)
    count = valid.sum(dim=1)
    both = _to_host(torch.stack([first, count]))
    pads = [int(x) for x in both[0]]
    for b in range(batch):
        if int(both[1][b]) != n - pads[b]:
            raise ValueError(f"RetrievalAttention: sequence {b} of the batch has padding that is "
                             "not all on the left (left padding only: tokenizer.padding_side = "
                             "'left')")
    return pads


class RetrievalAttention:
    """Retrieval attention for the decode steps of a ``transformers`` causal LM.

    ``policy``: ``"static"`` (sinks + window only), ``"exact-topk"`` (plus the exact top-``k``
    of the rest, by a scan) or ``"index-topk"`` (plus the top-``k`` an ``AttentionIndex``
    returns, built after the prefill per sequence, layer and KV head from the keys of the rest
    and the group's prefill queries; ``ef`` for its searches, which stop once their best ``k``
    have not changed for ``patience`` expansions in a row, an int or ``"P%"`` of the head's
    ``ef``, as the driver's do; None: never).
    The index is the decode default, the driver's (``qkindex.decode_default_build()``: causal
    lists from each query's visible keys, 1.25 queries per key, far-back queries' full lists,
    the pooled kNN past 32,768 keys, and each index's default ``ef`` measured for recall@100
    0.95 on the group's last prefill queries; the driver's scan check is left out: this class
    searches graphs); ``build`` overrides its
    ``AttentionIndex.build`` keywords. ``measure``: also score every key each step (untimed)
    to report recall@k of the retrieved keys against the rest's exact top-k, the attended
    keys' softmax mass, and its ratio to the mass with the exact top-k in their place (the
    driver's statistics).

    ``offload``: False (the cache keeps every key and value on the model's device), True or
    ``"merge"`` (the rest's keys and values live in host memory only; the retrieved rows'
    attention is computed there and merged exactly with the device's part), ``"gather"``
    (likewise, but the retrieved rows are copied to the device each step). Offload needs
    the cache of :meth:`cache`; ``buffer`` is the number of columns past the window the device
    keeps before it drops those that left it.

    Use as a context manager around ``model(...)`` / ``model.generate(...)``: a call whose
    queries cover the whole cache (a prefill) attends exactly and (re)builds the state; calls
    of one token are decode steps. Batches: one state per sequence, left padding only (what
    ``generate`` does with ``padding_side="left"``). The state lives in the model's cache when
    it is a :class:`RetrievalCache` (``ra.cache()``; one per batch of sequences), else in this
    object. Every ``stats()`` figure sums over decode steps, sequences, layers and query heads.

        with qkindex.hf.RetrievalAttention(model, "index-topk") as ra:
            model.generate(ids, max_new_tokens=32, past_key_values=ra.cache())
    """

    def __init__(self, model, policy: str = "index-topk", *, sink: int = 128, window: int = 512,
                 k: int = 100, ef: Optional[int] = None, patience: Union[int, str, None] = "25%",
                 measure: bool = True,
                 build: Optional[Mapping[str, Any]] = None, max_train: Optional[int] = 4096,
                 threads: Optional[int] = None, offload: Union[bool, str] = False,
                 buffer: int = 64):
        if policy not in POLICIES:
            raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        for name, v, least in (("sink", sink, 0), ("window", window, 1), ("k", k, 1),
                               ("buffer", buffer, 1)):
            if int(v) < least:
                raise ValueError(f"{name}: must be at least {least}, got {v}")
        if max_train is not None and max_train < 1:
            raise ValueError(f"max_train: must be at least 1 or None, got {max_train}")
        if offload is True:
            offload = "merge"
        if offload is not False and offload not in OFFLOAD_MODES:
            raise ValueError(f"offload: expected False, True or one of {', '.join(OFFLOAD_MODES)}, "
                             f"got {offload!r}")
        self.model = model
        self.policy = policy
        if isinstance(patience, int) and patience < 1:
            raise ValueError(f"patience: must be at least 1 or None, got {patience}")
        self.sink, self.window, self.k, self.ef = int(sink), int(window), int(k), ef
        self.patience = patience
        self.measure = measure
        self.offload: Optional[str] = offload or None
        self.buffer = int(buffer)
        self.build_params = {**decode_default_build(), **dict(build or {})}
        self.max_train = max_train
        self.threads = threads or min(8, os.cpu_count() or 1)
        modules = attention_layers(model)
        self.layers = [m for m in modules if not _is_sliding(m)]
        self._first_layer = self.layers[0].layer_idx if self.layers else -1
        # Per global layer, per sequence: its state (_Seq). The state of the last prefill: a
        # RetrievalCache's own (``cache.retrieval``), or this object's under a plain cache.
        self.heads: Dict[int, List[_Seq]] = {}
        self._own: Dict[int, List[_Seq]] = self.heads
        self._installed: Optional[_Installed] = None
        self._pool: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self.reset_stats()

    def cache(self) -> RetrievalCache:
        """A new :class:`RetrievalCache` for this model (one per batch of sequences; offload's
        layers when ``offload`` is set): pass it to ``generate`` as ``past_key_values=``."""
        offloaded = [m.layer_idx for m in self.layers] if self.offload else []
        return RetrievalCache(config=self.model.config, offload_layers=offloaded,
                              window=self.window, buffer=self.buffer)

    def indexes(self, layer: int, seq: int = 0) -> List[Optional[AttentionIndex]]:
        """The indexes (one per KV head) of sequence ``seq`` in ``layer`` of the last prefill's
        state (waits for their builds)."""
        s = self.heads[layer][seq]
        s.ready()
        return list(s.indexes)

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
                   "measured": 0, "recall_measured": 0, "recall_sum": 0.0, "mass_sum": 0.0,
                   "mass_ratio_sum": 0.0, "steps": 0, "build_s": 0.0, "build_wait_s": 0.0,
                   "search_s": 0.0, "prefill_keys": 0}

    def stats(self) -> Dict[str, Any]:
        """``policy``, ``offload``, ``selections`` ((step, sequence, layer, query head)
        tuples), ``keys_attended`` (mean per selection), ``keys_scored`` (mean inner products
        of the selector per selection: the rest's size for a scan, the index's count for a
        search, 0 for static), ``recall``, ``mass``, ``mass_ratio`` (means over measured
        selections), ``build_s`` (index builds, summed over the threads that ran them),
        ``build_wait_s`` (time the calls waited for builds still running), ``search_s``
        (upkeep + selection)."""
        s = self._s
        sel, meas = max(s["selections"], 1), max(s["measured"], 1)
        # recall: NaN for static (nothing retrieved); mass figures: NaN without measure.
        return {
            "policy": self.policy,
            "offload": self.offload or False,
            "selections": s["selections"],
            "keys_attended": s["keys_attended"] / sel,
            "keys_scored": s["distance_computations"] / sel,
            "recall": (s["recall_sum"] / s["recall_measured"] if s["recall_measured"]
                       else float("nan")),
            "mass": s["mass_sum"] / meas if s["measured"] else float("nan"),
            "mass_ratio": s["mass_ratio_sum"] / meas if s["measured"] else float("nan"),
            "build_s": s["build_s"],
            "build_wait_s": s["build_wait_s"],
            "search_s": s["search_s"],
        }

    # -- the attention function -----------------------------------------------------------
    def _attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        cache = getattr(_UPDATED, "current", None)
        state = cache.retrieval if isinstance(cache, RetrievalCache) else self._own
        layer = cache.layers[module.layer_idx] if isinstance(cache, RetrievalCache) else None
        offloaded = isinstance(layer, _OffloadLayer)
        if self.offload and not offloaded:
            raise ValueError("RetrievalAttention(offload=...): pass the cache of ra.cache() "
                             "(model.generate(..., past_key_values=ra.cache()))")
        q_len = query.shape[2]
        n = layer.length if offloaded else key.shape[2]
        if q_len == n:  # a prefill: exact attention, then the state
            out = sdpa_attention_forward(module, query, key, value, attention_mask,
                                         scaling=scaling, dropout=dropout, **kw)
            self._prefill(state, module, query, key, value, attention_mask, layer)
            return out
        if q_len > 1:
            if offloaded:
                raise ValueError("RetrievalAttention(offload=...): after the prefill, one token "
                                 f"per call, got {q_len}")
            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          scaling=scaling, dropout=dropout, **kw)
        seqs = state.get(module.layer_idx)
        if seqs is None and (self.policy == "index-topk" or offloaded):
            raise RuntimeError(f"layer {module.layer_idx}: decode before a prefill under "
                               "RetrievalAttention (or after the cache was reset or cropped)")
        if seqs is None:
            seqs = [_Seq(p, p + self.sink) for p in _pads(attention_mask, query.shape[0], n)]
        if len(seqs) != query.shape[0]:
            raise RuntimeError(f"layer {module.layer_idx}: {query.shape[0]} sequences in the batch, "
                               f"{len(seqs)} at the prefill")
        if all(n - s.pad <= self.sink + self.window for s in seqs):
            # Every sequence fits in sink + window: exact attention (under offload too: then
            # nothing has left the device).
            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          scaling=scaling, dropout=dropout, **kw)
        return self._decode(seqs, module, query, key, value, scaling, n, layer), None

    def _pool_(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="qkindex-build")
        return self._pool

    def _prefill(self, state, module, query, key, value, attention_mask, layer) -> None:
        """The state of ``module``'s layer after a prefill of ``n`` positions: per sequence,
        its rest's keys (and values under offload) copied to host memory once, and (index-topk)
        its indexes built by background threads from them."""
        self.heads = state
        idx, device = module.layer_idx, query.device
        batch, h, n, d = query.shape
        kvh = key.shape[1]
        pads = _pads(attention_mask, batch, n)
        seqs = [_Seq(p, p + self.sink) for p in pads]
        build = self.policy == "index-topk"
        for b, s in enumerate(seqs):
            rest_end = max(s.sink_end, n - self.window)
            if self.offload:
                s.keys = _HostRows(kvh, d, key.dtype, device, rest_end - s.sink_end + self.buffer)
                s.values = _HostRows(kvh, d, value.dtype, device,
                                     rest_end - s.sink_end + self.buffer)
                if rest_end > s.sink_end:
                    s.keys.append_from_model(key[b, :, s.sink_end:rest_end])
                    s.values.append_from_model(value[b, :, s.sink_end:rest_end])
            s.indexes = [None] * kvh
            if build and rest_end > s.sink_end:
                self._start_builds(s, query[b], key[b], rest_end, n)
            s.rest_end = rest_end
        if isinstance(layer, _OffloadLayer):
            layer.settle(max(s.sink_end for s in seqs))
        state[idx] = seqs
        self._s["prefill_keys"] = n

    def _start_builds(self, s: _Seq, query, key, rest_end: int, n: int) -> None:
        """Copies the rest's keys and the training queries of one sequence to host memory (one
        copy each, asynchronous into pinned buffers on a GPU) and queues one index build per KV
        head; ``s.ready()`` collects them."""
        h, kvh, d = query.shape[0], key.shape[0], query.shape[-1]
        group = h // kvh
        device = query.device
        if s.keys is not None:  # offload: already in host memory
            keys = s.keys.rows
        else:
            keys = _to_host(key[:, s.sink_end:rest_end],
                            _host_buffer((kvh, rest_end - s.sink_end, d), key.dtype, device))
        # Training queries: the group's (head-major) queries at the sequence's positions,
        # evenly subsampled to max_train rows on the device before they cross.
        m = group * (n - s.pad)
        pick = torch.arange(m, device=device)
        if self.max_train is not None and m > self.max_train:
            pick = torch.linspace(0, m - 1, self.max_train, device=device).round().long()
        train_dev = query[:, s.pad:].reshape(kvh, m, d)[:, pick]
        train = _to_host(train_dev, _host_buffer(train_dev.shape, train_dev.dtype, device))
        # The rest keys the query at each position could attend to (rest id i is column
        # sink_end + i), alike for every query head of a group: what causal builds read.
        cols = np.tile(np.arange(s.pad, n), group)[_to_host(pick).numpy()]
        visible = np.clip(cols + 1 - s.sink_end, 0, rest_end - s.sink_end).astype(np.int64)
        event = _copied(device)
        params, stats, lock = self.build_params, self._s, self._lock

        def build(j: int) -> AttentionIndex:
            if event is not None:
                event.synchronize()
            t0 = time.perf_counter()
            ix = AttentionIndex.build(keys[j], train[j], visible=visible, **params)
            with lock:
                stats["build_s"] += time.perf_counter() - t0
            return ix

        pool = self._pool_()
        s.pending = [pool.submit(build, j) for j in range(kvh)]

    def _decode(self, seqs: List[_Seq], module, query, key, value, scaling, n: int,
                layer) -> torch.Tensor:
        """One decode position of every sequence: attention output ``[batch, 1, heads,
        head_dim]``. ``key``/``value`` are the cache's tensors on the model's device (under
        offload only its head and tail: ``layer.device_columns`` maps positions)."""
        device = query.device
        batch, h, _, d = query.shape
        kvh = key.shape[1]
        group = h // kvh
        scaling = float(scaling if scaling is not None else d ** -0.5)
        offloaded = isinstance(layer, _OffloadLayer)
        s_ = self._s
        for s in seqs:
            s_["build_wait_s"] += s.ready()
        q = query[:, :, 0].to(torch.float32)  # [batch, h, d], on the model's device
        # The queries cross to the host where the selection or the rest's attention runs there.
        on_host = self.policy == "index-topk" or (self.offload and self.policy != "static")
        q_host = _to_host(q) if on_host or (self.offload and self.measure) else None
        # Keys (and values under offload) that left the window since the last step: the
        # columns [first, n - window) of the batch, one copy each.
        first = min(s.rest_end for s in seqs)
        leaving = n - self.window
        new_k = new_v = None
        if leaving > first and (self.policy == "index-topk" or self.offload):
            cols = torch.arange(first, leaving, device=device)
            if offloaded:
                cols = layer.device_columns(cols)
            new_k = _to_host(key[:, :, cols])  # [batch, kvh, m, d]
            if self.offload:
                new_v = _to_host(value[:, :, cols])
        outs, dcs = [], 0
        for b, s in enumerate(seqs):
            lo = max(s.rest_end, s.sink_end)
            rows_k = None
            if leaving > lo:
                rows_k = new_k[b, :, lo - first:] if new_k is not None else None
                if self.offload:
                    s.keys.append_host(rows_k)
                    s.values.append_host(new_v[b, :, lo - first:])
                s.rest_end = leaving
            rest = s.rest_end - s.sink_end
            kk = min(self.k, rest) if self.policy != "static" else 0
            t1 = time.perf_counter()
            if self.policy == "index-topk":
                ids, dc = self._index_step(s, rows_k, q_host[b], group, kk)
            else:
                ids, dc = self._select(s, q[b], q_host[b] if q_host is not None else None,
                                       key[b], group, kk, layer)
            s_["search_s"] += time.perf_counter() - t1
            dcs += dc
            outs.append(self._attend_one(s, q[b], q_host[b] if q_host is not None else None,
                                         key[b], value[b], ids, scaling, group, n, layer))
        s_["selections"] += batch * h
        s_["distance_computations"] += dcs
        if module.layer_idx == self._first_layer:
            s_["steps"] += 1
        return torch.stack(outs).to(query.dtype)[:, None]

    def _index_step(self, s: _Seq, rows: Optional[torch.Tensor], q_host: torch.Tensor,
                    group: int, kk: int) -> Tuple[Optional[torch.Tensor], int]:
        """index-topk, one sequence: inserts the keys that left the window (host ``[kvh, m,
        d]``, or None) into its indexes (ids follow positions; an index the prefill could not
        start begins here; the KV heads' upkeep runs in parallel on the pool, the native calls
        releasing the GIL), then searches every KV head's group in one ``search_many`` call.
        The chosen ids ``[h, kk]`` (host) and the inner products the searches computed."""

        def upkeep(j: int) -> None:
            if rows is None:
                return
            qg = q_host[j * group:(j + 1) * group]
            ix, start = s.indexes[j], 0
            if ix is None:
                # The prefill left no rest (it fit in sink + window): the first keys to
                # leave the window start the index, trained on this step's queries, which
                # see every key of the rest.
                seen = np.full(qg.shape[0], rows.shape[1], dtype=np.int64)
                ix = s.indexes[j] = AttentionIndex.build(rows[j], qg, visible=seen,
                                                         **self.build_params)
                start = rows.shape[1]
            for i in range(start, rows.shape[1]):
                ix.insert(rows[j, i], qg)

        kvh = len(s.indexes)
        if kvh > 1 and self.threads > 1:
            list(self._pool_().map(upkeep, range(kvh)))
        else:
            for j in range(kvh):
                upkeep(j)
        if kk == 0:
            return None, 0
        # Every KV head's group searched in one call, in parallel ([kvh, group, d]).
        res = search_many(s.indexes, q_host.reshape(kvh, group, -1), k=kk, ef=self.ef,
                          patience=self.patience)
        ids = torch.from_numpy(res.ids).reshape(kvh * group, kk).clamp(min=0)
        return ids, int(res.distance_computations.sum())

    def _select(self, s: _Seq, q, q_host, key, group: int, kk: int, layer
                ) -> Tuple[Optional[torch.Tensor], int]:
        """static and exact-topk, one sequence: the chosen rest ids ``[h, kk]`` (relative to
        ``s.sink_end``; on the host under offload, else on the model's device) and the inner
        products the scan computed."""
        if kk == 0:
            return None, 0
        h, d = q.shape
        kvh = h // group
        rest = s.rest_end - s.sink_end
        if self.offload:  # exact-topk: a scan of the rest's keys in host memory
            scores = torch.bmm(q_host.view(kvh, group, d),
                               s.keys.rows.to(torch.float32).transpose(1, 2))
        else:  # exact-topk: a scan of the rest's keys on the model's device
            scores = torch.bmm(q.view(kvh, group, d),
                               _rest_keys(s, key, layer).to(torch.float32).transpose(1, 2))
        return scores.reshape(h, rest).topk(kk, dim=1).indices, h * rest

    def _attend_one(self, s: _Seq, q, q_host, key, value, ids, scaling: float, group: int,
                    n: int, layer) -> torch.Tensor:
        """Attention of one sequence's decode query ``q`` ``[h, d]`` (``q_host``: its host copy
        where one was made) over its sinks, window and the chosen rest ids: ``[h, d]``
        (float32) on the model's device."""
        device = q.device
        h = q.shape[0]
        kv_of = torch.arange(h, device=device) // group
        static = torch.cat([torch.arange(s.pad, s.sink_end, device=device),
                            torch.arange(max(s.rest_end, s.sink_end), n, device=device)])
        dev_static = layer.device_columns(static) if isinstance(layer, _OffloadLayer) else static
        n_chosen = 0 if ids is None else ids.shape[1]
        self._s["keys_attended"] += h * (static.numel() + n_chosen)
        if self.offload and ids is not None:
            if self.offload == "gather":
                # The chosen rows go to the device; one softmax over static + chosen.
                kv_host = torch.arange(h, device=_HOST) // group
                rows = torch.stack([s.keys.rows[kv_host[:, None], ids],
                                    s.values.rows[kv_host[:, None], ids]])
                rows = _to_model(rows, device)
                kg = torch.cat([key[kv_of[:, None], dev_static.expand(h, -1)], rows[0]], dim=1)
                vg = torch.cat([value[kv_of[:, None], dev_static.expand(h, -1)], rows[1]], dim=1)
                out = self._softmax_attend(q, kg, vg, scaling)
                self._measure_offload(s, q, q_host, kg[:, :static.numel()], ids, scaling, group)
                return out
            # merge: the device's part and the host's, combined by their log-sum-exp.
            ks = key[kv_of[:, None], dev_static.expand(h, -1)].to(torch.float32)
            vs = value[kv_of[:, None], dev_static.expand(h, -1)].to(torch.float32)
            o1, lse1 = _partial(q, ks, vs, scaling)
            kv_host = torch.arange(h, device=_HOST) // group
            kr = s.keys.rows[kv_host[:, None], ids].to(torch.float32)
            vr = s.values.rows[kv_host[:, None], ids].to(torch.float32)
            o2, lse2 = _partial(q_host, kr, vr, scaling)
            back = _to_model(torch.cat([o2, lse2[:, None]], dim=1), device)
            o2, lse2 = back[:, :-1], back[:, -1]
            top = torch.maximum(lse1, lse2)
            w1, w2 = torch.exp(lse1 - top)[:, None], torch.exp(lse2 - top)[:, None]
            self._measure_offload(s, q, q_host, ks, ids, scaling, group)
            return (o1 * w1 + o2 * w2) / (w1 + w2)
        if ids is not None:
            if self.policy == "index-topk":  # ids from the host's search
                ids = _to_model(ids, device)
            chosen = ids + s.sink_end
            if isinstance(layer, _OffloadLayer):
                chosen = layer.device_columns(chosen)
            pos = torch.cat([dev_static.expand(h, -1), chosen], dim=1)
        else:
            pos = dev_static.expand(h, -1)
        kg = key[kv_of[:, None], pos]
        vg = value[kv_of[:, None], pos]
        out = self._softmax_attend(q, kg, vg, scaling)
        if self.offload:  # static: nothing chosen, the rest's scores from the host
            self._measure_offload(s, q, q_host, kg[:, :static.numel()], ids, scaling, group)
        elif self.measure:
            rest_scores = torch.bmm(q.view(-1, group, q.shape[1]),
                                    _rest_keys(s, key, layer).to(torch.float32).transpose(1, 2))
            self._measure(_scores(q, kg[:, :static.numel()], scaling),
                          rest_scores.reshape(h, -1) * scaling, ids)
        return out

    @staticmethod
    def _softmax_attend(q, kg, vg, scaling: float) -> torch.Tensor:
        p = torch.softmax(_scores(q, kg, scaling), dim=1)
        return torch.einsum("hs,hsd->hd", p, vg.to(torch.float32))

    def _measure_offload(self, s: _Seq, q, q_host, ks, ids, scaling: float, group: int) -> None:
        """Under offload: the statistics of this step from the static scores (device) and the
        rest's scores (host keys)."""
        if not self.measure:
            return
        static = _to_host(_scores(q, ks, scaling))
        h, d = q.shape
        rest = torch.bmm(q_host.view(-1, group, d),
                         s.keys.rows.to(torch.float32).transpose(1, 2)).reshape(h, -1) * scaling
        self._measure(static, rest, ids)

    def _measure(self, static, rest, ids) -> None:
        """Recall, mass and mass ratio of one sequence's selections from the scaled scores of
        its static keys ``[h, s]`` and of its rest ``[h, R]`` (the chosen ``ids`` index the
        rest; None for static), whichever device they are on."""
        h = static.shape[0]
        ids = None if ids is None else ids.to(rest.device)
        top_all = torch.maximum(static.max(dim=1).values,
                                rest.max(dim=1).values if rest.shape[1] else static.max(dim=1).values)
        es, er = torch.exp(static - top_all[:, None]), torch.exp(rest - top_all[:, None])
        z = es.sum(1) + er.sum(1)
        static_mass = es.sum(1) / z
        s = self._s
        if ids is not None and ids.shape[1] > 0:
            kk = ids.shape[1]
            mass = static_mass + er.gather(1, ids).sum(1) / z
            top = er.topk(kk, dim=1)
            exact_mass = static_mass + top.values.sum(1) / z
            hits = (ids[:, :, None] == top.indices[:, None, :]).any(2).sum(1)
            s["recall_measured"] += h
            s["recall_sum"] += float((hits.to(torch.float64) / kk).sum())
        else:
            mass = exact_mass = static_mass
        s["measured"] += h
        s["mass_sum"] += float(mass.sum())
        s["mass_ratio_sum"] += float((mass / exact_mass).sum())


def _rest_keys(s: _Seq, key: torch.Tensor, layer) -> torch.Tensor:
    """The keys ``[kvh, R, d]`` of ``s``'s rest in the cache's tensor ``key`` of one sequence (a
    view; under offload the rest is in host memory, not here)."""
    if isinstance(layer, _OffloadLayer) and layer.head is not None:
        raise RuntimeError("the rest of an offloaded layer is in host memory")
    return key[:, s.sink_end:s.rest_end]


def _scores(q, kg, scaling: float) -> torch.Tensor:
    """Scaled inner products ``[h, s]`` of ``q`` ``[h, d]`` with ``kg`` ``[h, s, d]`` (f32)."""
    return torch.einsum("hsd,hd->hs", kg.to(torch.float32), q) * scaling


def _partial(q, kg, vg, scaling: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[h, d]`` over ``kg``/``vg`` ``[h, s, d]`` (f32) alone: the
    normalised output ``[h, d]`` and the log-sum-exp of the scores ``[h]``, which merge two
    parts exactly (``out = Σ exp(lse_i - max) o_i / Σ exp(lse_i - max)``)."""
    scores = _scores(q, kg, scaling)
    lse = torch.logsumexp(scores, dim=1)
    p = torch.exp(scores - lse[:, None])
    return torch.einsum("hs,hsd->hd", p, vg), lse


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
    kw = cache_kwarg(model)

    def run() -> Dict[str, float]:
        cache = (attention.cache() if attention is not None
                 else DynamicCache(config=model.config))
        t0 = time.perf_counter()
        model(input_ids=ids[:, :prefill], **{kw: cache}, use_cache=True, logits_to_keep=1)
        t1 = time.perf_counter()
        nll = 0.0
        for t in range(prefill, n - 1):
            out = model(input_ids=ids[:, t:t + 1], **{kw: cache}, use_cache=True)
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
