"""Type stubs of the compiled module ``qkindex._native`` (checked against the module by
``tests/test_stubs.py``)."""

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

ArrayLike = Any  # numpy array, CPU torch tensor, or anything with __array__ / __dlpack__
PathLike = Union[str, "os.PathLike[str]"]

__version__: str

class FormatError(ValueError):
    """A file or dump directory whose content is not what its format says."""

class SearchResult:
    """Results of ``search``: ``[b, k]`` arrays (``[k]`` for a 1-D query); of ``search_many``:
    ``[n, b, k]`` (``distance_computations`` ``[n, b]``)."""

    @property
    def ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def distance_computations(self) -> Union[npt.NDArray[np.int64], np.int64]: ...

class ReTopK:
    """ReTopK selector over one head's keys: reuse the top-k sets of similar past queries."""

    def __init__(
        self,
        keys: ArrayLike,
        *,
        c: int = 32,
        r: int = 4,
        w: int = 32,
        tau: float = 0.85,
        refresh: int = 128,
        k: int = 512,
        seed_fallback: bool = True,
        index: Optional[Any] = None,
        ef: Optional[int] = None,
    ) -> None: ...
    def prime(self, queries: ArrayLike, visible: Optional[ArrayLike] = None) -> None: ...
    def step(self, query: ArrayLike) -> Tuple[npt.NDArray[np.int64], Dict[str, Any]]: ...
    def append(self, key: ArrayLike) -> int: ...
    def __len__(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def cache_len(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def params(self) -> Dict[str, Any]: ...

class AttentionIndex:
    """Query-aware graph index over one head's keys, built from training queries."""

    @staticmethod
    def build(
        keys: ArrayLike,
        train_queries: ArrayLike,
        *,
        kq: int = 100,
        max_degree: int = 32,
        build_ef: int = 200,
        default_ef: int = 128,
        causal: bool = False,
        prune: str = "occlusion-fill",
        device: str = "auto",
        dtype: Optional[str] = None,
        auto_ef: float = 0.0,
        knn_pool: int = 0,
        pool_above: int = 0,
        queries_per_key: float = 0.0,
        global_full: float = 0.0,
        far_check: float = 0.0,
        visible: Optional[Sequence[int]] = None,
    ) -> "AttentionIndex": ...
    def search(
        self,
        queries: ArrayLike,
        k: int = 100,
        ef: Optional[int] = None,
        beam: Optional[int] = None,
        patience: Union[int, str, None] = None,
    ) -> SearchResult: ...
    def insert(self, key: ArrayLike, guides: Optional[ArrayLike] = None) -> int: ...
    def __len__(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def params(self) -> Dict[str, Any]: ...
    @property
    def build_stats(self) -> Dict[str, Any]: ...
    def save(self, path: PathLike) -> None: ...

class FlatIndex:
    """Exact top-k by scanning every key; with ``flat:codes=i8`` (``qkindex.build``), a scan of
    int8 codes whose best ``ef`` candidates are re-ranked exactly."""

    @staticmethod
    def build(keys: ArrayLike, *, dtype: Optional[str] = None) -> "FlatIndex": ...
    def search(self, queries: ArrayLike, k: int = 100, ef: Optional[int] = None) -> SearchResult: ...
    def insert(self, key: ArrayLike) -> int: ...
    def __len__(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def params(self) -> Dict[str, Any]: ...
    def save(self, path: PathLike) -> None: ...

class HnswIndex:
    """HNSW over the keys: on the MIPS->L2 reduction (default) or plain inner product."""

    @staticmethod
    def build(
        keys: ArrayLike,
        *,
        m: int = 16,
        ef_construction: int = 200,
        l2_reduction: bool = True,
        seed: int = 100,
    ) -> "HnswIndex": ...
    def search(
        self, queries: ArrayLike, k: int = 100, ef: Optional[int] = None, beam: Optional[int] = None
    ) -> SearchResult: ...
    def save(self, path: PathLike) -> None: ...
    def __len__(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def params(self) -> Dict[str, Any]: ...

class IvfIndex:
    """IVF-Flat: k-means lists, nprobe lists scanned per query."""

    @staticmethod
    def build(
        keys: ArrayLike, *, nlist: Optional[int] = None, iters: int = 10, seed: int = 0
    ) -> "IvfIndex": ...
    def search(
        self, queries: ArrayLike, k: int = 100, nprobe: Optional[int] = None, ef: Optional[int] = None
    ) -> SearchResult: ...
    def save(self, path: PathLike) -> None: ...
    def __len__(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def nlist(self) -> int: ...
    @property
    def params(self) -> Dict[str, Any]: ...

class VamanaIndex:
    """Vamana (DiskANN); robust=True builds RobustVamana from training queries."""

    @staticmethod
    def build(
        keys: ArrayLike,
        *,
        r: int = 64,
        l: int = 100,
        alpha: float = 1.2,
        train_queries: Optional[ArrayLike] = None,
        robust: bool = False,
        seed: int = 0,
        device: str = "auto",
    ) -> "VamanaIndex": ...
    def search(
        self, queries: ArrayLike, k: int = 100, ef: Optional[int] = None, beam: Optional[int] = None
    ) -> SearchResult: ...
    def save(self, path: PathLike) -> None: ...
    def __len__(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def params(self) -> Dict[str, Any]: ...

class Dump:
    """An opened dump directory; tensors are float32 ``[heads, tokens, head_dim]``."""

    @property
    def manifest(self) -> Dict[str, Any]: ...
    @property
    def path(self) -> str: ...
    @property
    def layers(self) -> List[int]: ...
    def kv_head_of(self, q_head: int) -> int: ...
    def has(self, layer: int, part: str) -> bool: ...
    def q(self, layer: int) -> npt.NDArray[np.float32]: ...
    def k(self, layer: int) -> npt.NDArray[np.float32]: ...
    def v(self, layer: int) -> npt.NDArray[np.float32]: ...
    def qdec(self, layer: int) -> npt.NDArray[np.float32]: ...
    def kdec(self, layer: int) -> npt.NDArray[np.float32]: ...
    def vdec(self, layer: int) -> npt.NDArray[np.float32]: ...

def exact_topk(
    queries: ArrayLike, keys: ArrayLike, k: int, device: str = "auto"
) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
def knn_device(device: str = "auto") -> str:
    """Where exact kNN for builds runs for `device`: "cpu", "cuda:0 (NVIDIA H200)", or
    "cpu (auto: no usable GPU: ...)". Raises RuntimeError for "cuda" without a usable GPU."""
def decode_default_build() -> Dict[str, Any]:
    """The keywords of `AttentionIndex.build` that make the decode default (the driver's
    `--index` default, what `qkindex.hf` builds): its parameters that differ from the build's
    defaults. Its causal lists read `visible`, which the caller passes."""
def recall(found_ids: ArrayLike, exact_ids: ArrayLike) -> float: ...
def attention_mass(query: ArrayLike, keys: ArrayLike, ids: ArrayLike) -> float: ...
AnyIndex = Union[AttentionIndex, FlatIndex, HnswIndex, IvfIndex, VamanaIndex]

def load(path: PathLike, mmap: bool = True, verify: bool = True) -> AnyIndex:
    """Opens an index file of any kind, as its kind's class."""
def build(
    spec: str,
    keys: ArrayLike,
    train_queries: Optional[ArrayLike] = None,
    *,
    device: str = "auto",
    dtype: Optional[str] = None,
    visible: Optional[Sequence[int]] = None,
    **options: Any,
) -> AnyIndex:
    """Any index kind from one spec string, as its kind's class: ``build("ivf:codes=i8", keys)``,
    ``build("attention", keys, train_queries, kq=50)``; keyword ``options`` are more spec keys
    (``nlist=361`` is ``"ivf:nlist=361"``)."""
def search_many(
    indexes: Sequence[AnyIndex],
    queries: ArrayLike,
    k: int = 100,
    ef: Optional[int] = None,
    beam: Optional[int] = None,
    nprobe: Optional[int] = None,
    patience: Union[int, str, None] = None,
) -> SearchResult:
    """``queries[i]`` (``[n, b, d]``) searched on ``indexes[i]`` for every ``i`` in one call, in
    parallel with the GIL released: ``ids``/``scores`` ``[n, b, k]``, ``distance_computations``
    ``[n, b]`` (each index's stats per query). ``patience``: graph searches stop once their
    best ``k`` have not changed for that many expansions in a row, an int or ``"P%"`` of
    ``ef`` (None: no early stop)."""
def load_dump(dir: PathLike) -> Dump: ...
def validate_dump(dir: PathLike) -> List[str]: ...
def _search_latency_ns(
    index: Union[AttentionIndex, FlatIndex, HnswIndex, IvfIndex, VamanaIndex],
    queries: ArrayLike,
    k: int = 100,
    ef: Optional[int] = None,
    rounds: int = 1,
) -> List[float]: ...
def _attention_defaults() -> Dict[str, Any]: ...
