"""``write_dump``: writes Q/K/V tensors collected by PyTorch hooks in the dump layout of
docs/DESIGN.md §4, so that ``qkindex bench --dump DIR`` and ``load_dump`` read them."""

from __future__ import annotations

import json
import operator
import os
from typing import Any, Dict, Mapping, Union

import numpy as np

from ._native import Dump, FormatError, load_dump, validate_dump

FORMAT = "qkindex-dump/1"
PARTS = ("q", "k", "v", "qdec", "kdec", "vdec")
# Tensors indexed by query heads; the others by KV heads.
Q_PARTS = ("q", "qdec")
PREFILL_PARTS = ("q", "k", "v")
DERIVED = ("format", "head_dim", "n_q_heads", "n_kv_heads", "layers", "n_prefill", "n_decode")
REQUIRED = ("model", "rope_theta")


def _as_array(x: Any, name: str) -> np.ndarray:
    """``x`` as a float16/float32 numpy array (torch tensors too: one on a GPU is copied to host
    memory once), without casting, except bfloat16 (torch tensors, ``ml_dtypes`` arrays), which
    is widened to float32 exactly."""
    device = getattr(getattr(x, "device", None), "type", "cpu")
    if device != "cpu":
        dtype = str(getattr(x, "dtype", ""))
        if dtype.startswith("torch.") and dtype not in ("torch.float16", "torch.bfloat16",
                                                        "torch.float32"):
            raise TypeError(f"{name}: expected float16, bfloat16 or float32, got {dtype[6:]} (no "
                            "silent casts: convert it, e.g. .half())")
        try:
            x = x.cpu()
        except Exception as e:  # meta tensors have no data; other objects no .cpu()
            raise TypeError(f"{name}: a tensor on {x.device} could not be copied to host memory "
                            f"({e}): pass tensor.cpu()") from e
    if getattr(x, "requires_grad", False):
        x = x.detach()
    dtype = str(getattr(x, "dtype", ""))
    if dtype == "torch.bfloat16":
        x = x.float()  # exact: a bfloat16 is the top half of a float32
    try:
        a = np.asarray(x)
    except Exception as e:  # torch raises RuntimeError/TypeError for tensors it cannot share
        raise TypeError(f"{name}: cannot read a {type(x).__name__} as a numpy array "
                        f"(CPU tensors and arrays only): {e}") from e
    if a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:  # ml_dtypes
        a = a.astype(np.float32)
    if a.dtype not in (np.float16, np.float32):
        raise TypeError(f"{name}: expected float16, bfloat16 or float32, got {a.dtype} (no silent "
                        "casts: convert it, e.g. .astype(numpy.float16))")
    if a.ndim != 3:
        raise ValueError(f"{name}: expected shape [heads, tokens, head_dim], got {a.shape}")
    finite = np.isfinite(a).all(axis=2)
    if not finite.all():
        h, t = np.argwhere(~finite)[0]
        raise ValueError(f"{name}: non-finite value (NaN or infinity) in head {h}, row {t}")
    return a


def _save(path: str, a: np.ndarray) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(a))
    os.replace(tmp, path)


def write_dump(
    dir: Union[str, os.PathLike],
    manifest_fields: Mapping[str, Any],
    layers: Mapping[int, Mapping[str, Any]],
) -> Dump:
    """Writes a dump directory and returns it opened.

    ``layers`` maps a model layer number to its tensors ``{"q", "k", "v", "qdec", "kdec",
    "vdec"}`` (``q`` and ``k`` required), each ``[heads, tokens, head_dim]`` float16, float32 or
    bfloat16 (numpy, ``ml_dtypes`` or CPU torch; bfloat16 is stored as float32, exactly), post-RoPE: ``q``/``qdec`` over query heads, the rest over KV heads.
    ``manifest_fields`` must give ``model`` and ``rope_theta``; ``n_layers`` defaults to the
    largest layer + 1 and ``source`` to ""; other keys are kept. Shapes, head counts, token
    counts and ``head_dim`` are derived from the tensors (a given value must agree).

    Tensors are written first and ``manifest.json`` last (each by rename), then the directory
    is checked with ``validate_dump``; a problem raises ``FormatError``.
    """
    if not isinstance(layers, Mapping) or not layers:
        raise ValueError("layers: expected a non-empty dict {layer: {'q': ..., 'k': ...}}")
    fields: Dict[str, Any] = dict(manifest_fields)
    for key in REQUIRED:
        if key not in fields:
            raise ValueError(f"manifest_fields: missing {key!r} (required: {', '.join(REQUIRED)})")

    arrays: Dict[int, Dict[str, np.ndarray]] = {}
    for layer, parts in layers.items():
        try:
            layer = operator.index(layer)
        except TypeError:
            raise TypeError(f"layers: keys must be layer numbers (int), got {layer!r}") from None
        if layer < 0:
            raise ValueError(f"layers: layer numbers must be non-negative, got {layer}")
        if not isinstance(parts, Mapping):
            raise TypeError(f"layers[{layer}]: expected a dict of tensors, got {type(parts).__name__}")
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            raise ValueError(f"layers[{layer}]: unknown tensors {unknown} (expected {', '.join(PARTS)})")
        for need in ("q", "k"):
            if need not in parts:
                raise ValueError(f"layers[{layer}]: missing {need!r} (q and k are required)")
        arrays[layer] = {p: _as_array(x, f"layers[{layer}][{p!r}]") for p, x in parts.items()}

    first = arrays[min(arrays)]
    derived: Dict[str, Any] = {
        "format": FORMAT,
        "head_dim": int(first["q"].shape[2]),
        "n_q_heads": int(first["q"].shape[0]),
        "n_kv_heads": int(first["k"].shape[0]),
        "layers": sorted(arrays),
        "n_prefill": int(first["q"].shape[1]),
        "n_decode": int(first["qdec"].shape[1]) if "qdec" in first else 0,
    }
    has_qdec = {layer: "qdec" in parts for layer, parts in arrays.items()}
    if len(set(has_qdec.values())) > 1:
        raise ValueError(f"layers: 'qdec' must be given for every layer or none, got {has_qdec}")
    for layer, parts in arrays.items():
        for p, a in parts.items():
            name = f"layers[{layer}][{p!r}]"
            heads = derived["n_q_heads"] if p in Q_PARTS else derived["n_kv_heads"]
            tokens = derived["n_prefill"] if p in PREFILL_PARTS else (
                derived["n_decode"] if p == "qdec" else a.shape[1])
            want = (heads, tokens, derived["head_dim"])
            if a.shape != want:
                raise ValueError(f"{name}: expected shape {list(want)}, got {list(a.shape)}")
    if derived["n_q_heads"] % derived["n_kv_heads"]:
        raise ValueError(f"layers: query heads ({derived['n_q_heads']}) must be a multiple of "
                         f"KV heads ({derived['n_kv_heads']})")
    for key, value in derived.items():
        if key in fields and fields[key] != value:
            raise ValueError(f"manifest_fields: {key} = {fields[key]!r} disagrees with the tensors "
                             f"({value!r})")
    manifest: Dict[str, Any] = {
        **derived,
        "model": str(fields.pop("model")),
        "n_layers": int(fields.pop("n_layers", max(arrays) + 1)),
        "rope_theta": float(fields.pop("rope_theta")),
        "source": str(fields.pop("source", "")),
    }
    for key, value in fields.items():
        manifest.setdefault(key, value)

    os.makedirs(dir, exist_ok=True)
    for layer, parts in arrays.items():
        for p, a in parts.items():
            _save(os.path.join(dir, f"layer{layer:02d}.{p}.npy"), a)
    tmp = os.path.join(dir, "manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(dir, "manifest.json"))

    problems = validate_dump(dir)
    if problems:
        raise FormatError(f"{os.fspath(dir)}: the dump written is not valid:\n" + "\n".join(problems))
    return load_dump(dir)
