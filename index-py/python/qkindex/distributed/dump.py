"""Whole dumps as Ray tasks: :func:`build_dump` builds every (layer, KV head, shard) index as
one task (retried where its worker dies) and :class:`DumpBuild` records where they are (files
and ``manifest.json``, or object refs)."""

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import ray

import qkindex

MANIFEST_FORMAT = "qkindex-shards/1"


def _split_bounds(n: int, shards: int) -> List[Tuple[int, int]]:
    edges = np.linspace(0, n, shards + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(shards)]


@dataclass
class DumpBuild:
    """The result of :func:`build_dump`: per (layer, KV head), its shards in position order,
    each a ``.qki`` path (``out`` given) or an object ref holding the file's bytes."""

    spec: str
    shard_bounds: Dict[Tuple[int, int], List[Tuple[int, int]]]
    outputs: Dict[Tuple[int, int], List[Any]]
    build_s: Dict[Tuple[int, int], List[float]]
    out: Optional[str] = None
    n_q_heads: Optional[int] = None  # of the dump (query head h reads KV head h / group)
    n_kv_heads: Optional[int] = None

    def shards(self, layer: Optional[int], kv_head: Optional[int]) -> List[Any]:
        if (layer, kv_head) not in self.outputs:
            have = sorted(self.outputs)
            raise KeyError(f"no shards for layer {layer}, KV head {kv_head} (have {have})")
        return self.outputs[(layer, kv_head)]

    @staticmethod
    def read(out: Union[str, os.PathLike]) -> "DumpBuild":
        """Reads ``OUT/manifest.json`` written by :func:`build_dump`."""
        path = Path(out) / "manifest.json"
        try:
            man = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise qkindex.FormatError(f"{path}: not a sharded build manifest ({e})") from e
        if man.get("format") != MANIFEST_FORMAT:
            raise qkindex.FormatError(f"{path}: format {man.get('format')!r}, "
                                      f"expected {MANIFEST_FORMAT!r}")
        bounds, outputs, times = {}, {}, {}
        for e in man["indexes"]:
            key = (e["layer"], e["kv_head"])
            bounds[key] = [tuple(s["keys"]) for s in e["shards"]]
            outputs[key] = [str(Path(out) / s["file"]) for s in e["shards"]]
            times[key] = [s["build_s"] for s in e["shards"]]
        return DumpBuild(man["spec"], bounds, outputs, times, str(out),
                         man.get("n_q_heads"), man.get("n_kv_heads"))


def _build_shard_task(dump_dir: str, layer: int, kv_head: int, lo: int, hi: int, spec: str,
                      options: Dict[str, Any], out_path: Optional[str]):
    """One (layer, KV head, shard) build: reads the dump from shared storage, builds ``spec``
    over keys ``[lo, hi)`` of the KV head with the prefill queries of its query heads as the
    training queries, and writes ``out_path`` (atomic) or returns the file's bytes."""
    t0 = time.perf_counter()
    dump = qkindex.load_dump(dump_dir)
    keys = dump.k(layer)[kv_head, lo:hi]
    man = dump.manifest
    group = man["n_q_heads"] // man["n_kv_heads"]
    train = dump.q(layer)[kv_head * group:(kv_head + 1) * group].reshape(-1, keys.shape[1])
    index = qkindex.build(spec, np.ascontiguousarray(keys), np.ascontiguousarray(train), **options)
    if out_path is not None:
        index.save(out_path)
        return out_path, time.perf_counter() - t0
    fd, tmp = tempfile.mkstemp(suffix=".qki")
    os.close(fd)
    try:
        index.save(tmp)
        data = Path(tmp).read_bytes()
    finally:
        os.unlink(tmp)
    return data, time.perf_counter() - t0


def build_dump(
    dump_dir: Union[str, os.PathLike],
    spec: str = "attention",
    *,
    shards: int = 2,
    layers: Optional[Sequence[int]] = None,
    kv_heads: Optional[Sequence[int]] = None,
    out: Optional[Union[str, os.PathLike]] = None,
    progress: Union[bool, Callable[[int, int, Dict[str, Any]], None]] = True,
    retries: int = 3,
    task_options: Optional[Dict[str, Any]] = None,
    **options: Any,
) -> DumpBuild:
    """Builds every (layer, KV head, shard) index of a dump as one Ray task each (retried up to
    ``retries`` times where its worker dies). The dump directory must be on storage every node
    sees; so must ``out``, which receives ``layer{L:02}.kv{H}.shard{S}.qki`` files and a
    ``manifest.json`` (format ``qkindex-shards/1``). Without ``out`` each shard's file bytes stay
    in the object store (the :class:`DumpBuild` holds the refs). ``progress``: ``True`` prints a
    line per finished task to stderr; a callable gets ``(done, total, info)``."""
    dump_dir = str(dump_dir)
    dump = qkindex.load_dump(dump_dir)
    man = dump.manifest
    layers = list(dump.layers if layers is None else layers)
    kv_heads = list(range(man["n_kv_heads"]) if kv_heads is None else kv_heads)
    n = int(man["n_prefill"])
    if shards < 1 or shards > n:
        raise ValueError(f"shards: expected 1..{n}, got {shards}")
    bounds = _split_bounds(n, shards)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
    # Two returns: the file (path or bytes) and the build seconds, so the bytes stay in the
    # object store while the client reads only the seconds.
    opts = {"max_retries": retries, "retry_exceptions": False, "num_returns": 2}
    opts.update(task_options or {})
    task = ray.remote(**opts)(_build_shard_task)
    pending: Dict[Any, Tuple[int, int, int, Any]] = {}
    for layer in layers:
        for h in kv_heads:
            for s, (lo, hi) in enumerate(bounds):
                path = None
                if out is not None:
                    path = str(Path(out).resolve() / f"layer{layer:02}.kv{h}.shard{s}.qki")
                file_ref, secs_ref = task.remote(dump_dir, layer, h, lo, hi, spec, options, path)
                pending[secs_ref] = (layer, h, s, file_ref)
    total = len(pending)
    outputs = {(l, h): [None] * shards for l in layers for h in kv_heads}
    times = {(l, h): [0.0] * shards for l in layers for h in kv_heads}
    t0 = time.perf_counter()
    waiting = list(pending)
    done = 0
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=1)
        layer, h, s, file_ref = pending[ready[0]]
        secs = ray.get(ready[0])
        outputs[(layer, h)][s] = ray.get(file_ref) if out is not None else file_ref
        times[(layer, h)][s] = secs
        done += 1
        info = {"layer": layer, "kv_head": h, "shard": s, "keys": bounds[s], "build_s": secs,
                "elapsed_s": time.perf_counter() - t0}
        if callable(progress):
            progress(done, total, info)
        elif progress:
            print(f"qkindex.distributed: built {done}/{total} (layer {layer}, KV head {h}, "
                  f"shard {s}: keys {bounds[s][0]}..{bounds[s][1]}) in {secs:.2f} s; "
                  f"{info['elapsed_s']:.1f} s elapsed", file=sys.stderr, flush=True)
    result = DumpBuild(spec, {key: list(bounds) for key in outputs}, outputs, times,
                       None if out is None else str(out), man["n_q_heads"], man["n_kv_heads"])
    if out is not None:
        man_out = {
            "format": MANIFEST_FORMAT,
            "dump": os.path.abspath(dump_dir),
            "spec": spec,
            "options": options,
            "n_prefill": n,
            "n_q_heads": man["n_q_heads"],
            "n_kv_heads": man["n_kv_heads"],
            "indexes": [
                {"layer": l, "kv_head": h, "shards": [
                    {"file": Path(outputs[(l, h)][s]).name, "keys": list(bounds[s]),
                     "build_s": times[(l, h)][s]} for s in range(shards)]}
                for (l, h) in sorted(outputs)
            ],
        }
        tmp = Path(out) / "manifest.json.tmp"
        tmp.write_text(json.dumps(man_out, indent=1))
        os.replace(tmp, Path(out) / "manifest.json")
    return result
