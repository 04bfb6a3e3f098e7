//! The classes of the two kinds the decode path uses, `AttentionIndex` and `FlatIndex`, what
//! every kind's build and `save` share, and `load`, which opens a file of any kind.

use crate::arrays::{count, float_array, Shape};
use crate::device::knn_backend;
use crate::errors::{to_py, value_error};
use crate::run::interruptible;
use crate::search::{graph_search_params, search_any, Pool, SearchResult};
use pyo3::prelude::*;
use qkindex::attention::{off_at_zero, Prune, TrainKnn};
use qkindex::io::{AnyIndex, KeysPlacement, Persist};
use qkindex::{
    AnnIndex, AttentionParams, Cancel, Error, IndexSpec, KeyStore, KnnBackend, SearchParams,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// Builds `spec` (every kind's `build` goes through its [`IndexSpec`]) as the concrete kind `T`.
pub fn build_spec<T: TryFrom<AnyIndex, Error = Error>>(
    spec: &IndexSpec,
    keys: Arc<KeyStore>,
    train_queries: &[f32],
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> qkindex::Result<T> {
    spec.build_with(keys, train_queries, knn, cancel)?
        .index
        .try_into()
}

/// The keys of argument `keys` stored as `dtype` (`None`: as given; `"float16"`, `"float32"`,
/// or `"int8"`: offsets and ranges per dimension, one f32 scale per key, issue 26). Other names raise `ValueError`.
pub fn keys_as(keys: &Bound<'_, PyAny>, dtype: Option<&str>) -> PyResult<KeyStore> {
    let store = float_array(keys, "keys")?.key_store("keys", None)?;
    let Some(name) = dtype else {
        return Ok(store);
    };
    let want = [qkindex::Dtype::F16, qkindex::Dtype::F32, qkindex::Dtype::I8]
        .into_iter()
        .find(|d| d.numpy_name() == name)
        .ok_or_else(|| {
            value_error(format!(
                "dtype: expected None, \"float16\", \"float32\" or \"int8\", got {name:?}"
            ))
        })?;
    if want == store.dtype() {
        return Ok(store);
    }
    KeyStore::from_f32_as(store.to_f32(), store.dim(), want).map_err(to_py)
}

/// The `visible` argument as counts: each at least 0 and below 2³².
pub fn visible_counts(visible: Vec<i64>) -> PyResult<Vec<u32>> {
    visible
        .into_iter()
        .enumerate()
        .map(|(row, v)| {
            u32::try_from(v).map_err(|_| {
                value_error(format!(
                    "visible: expected counts from 0 to {}, got {v} at row {row}",
                    u32::MAX
                ))
            })
        })
        .collect()
}

/// The keywords of `AttentionIndex.build` that make the decode default
/// ([`qkindex::spec::DECODE_DEFAULT`]): its parameters that differ from the build's defaults.
/// `qkindex.hf` builds with them (and `visible`, which the causal default reads).
#[pyfunction]
pub fn decode_default_build(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let IndexSpec::Attention(params) = IndexSpec::decode_default() else {
        return Err(value_error(format!(
            "internal error: the decode default {} is not an attention index",
            qkindex::spec::DECODE_DEFAULT
        )));
    };
    let json = |p: &AttentionParams| {
        serde_json::to_value(p)
            .map_err(|e| value_error(format!("internal error: cannot serialize: {e}")))
    };
    let (ours, base) = (json(&params)?, json(&AttentionParams::default())?);
    let (Some(ours), Some(base)) = (ours.as_object(), base.as_object()) else {
        return Err(value_error("internal error: parameters are not an object"));
    };
    // `scan_check` may turn the graph into an int8 scan, which an `AttentionIndex` is not:
    // `qkindex.hf` decodes with the graph (its searches are `search_many` on graphs).
    let differ: serde_json::Map<String, serde_json::Value> = ours
        .iter()
        .filter(|(name, _)| name.as_str() != "scan_check")
        .filter(|(name, value)| base.get(*name) != Some(*value))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    for name in differ.keys() {
        if !BUILD_KEYWORDS.contains(&name.as_str()) {
            return Err(value_error(format!(
                "internal error: the decode default sets {name}, which AttentionIndex.build \
                 does not take"
            )));
        }
    }
    to_py_json(py, &differ)
}

/// The parameters `AttentionIndex.build` takes as keywords (named as in [`AttentionParams`]).
const BUILD_KEYWORDS: [&str; 12] = [
    "kq",
    "max_degree",
    "build_ef",
    "default_ef",
    "causal",
    "prune",
    "auto_ef",
    "knn_pool",
    "pool_above",
    "queries_per_key",
    "global_full",
    "far_check",
];

/// `json.loads` of a serializable value (build stats, parameters).
pub fn to_py_json<'py>(
    py: Python<'py>,
    value: &impl serde::Serialize,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| value_error(format!("internal error: cannot serialize: {e}")))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// `save` of any kind: writes `index` with its keys to one self-contained file (atomically),
/// the GIL released.
pub fn save_inline(py: Python<'_>, index: &dyn Persist, path: &Path) -> PyResult<()> {
    py.detach(|| index.writer(KeysPlacement::Inline)?.write(path))
        .map_err(to_py)
}

/// Query-aware graph index (DESIGN.md §1) over one head's keys, built from training queries.
#[derive(Debug)]
#[pyclass(frozen, module = "qkindex")]
pub struct AttentionIndex {
    /// The index. Searches read a snapshot (the `Arc`, cloned under the read lock); `insert`
    /// edits it under the write lock, in place, or on a copy while a search still holds the
    /// previous snapshot (`Arc::make_mut`), so a search never sees a half-linked key.
    inner: RwLock<Arc<qkindex::AttentionIndex>>,
    pool: Pool,
    /// Key dimension.
    #[pyo3(get)]
    dim: usize,
    /// Element type of the stored keys: "float16", "float32" or "int8".
    #[pyo3(get)]
    dtype: String,
}

impl AttentionIndex {
    /// Wraps a core index (for example one opened by `load`).
    pub fn wrap(inner: qkindex::AttentionIndex) -> Self {
        AttentionIndex {
            dim: inner.dim(),
            dtype: inner.keys().dtype().numpy_name().to_string(),
            inner: RwLock::new(Arc::new(inner)),
            pool: Pool::default(),
        }
    }

    /// The index as of now (inserts after this call do not change it).
    pub fn snapshot(&self) -> Arc<qkindex::AttentionIndex> {
        self.inner
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

#[pymethods]
impl AttentionIndex {
    /// Builds the index over `keys` (`[n, d]`, float16 or float32; stored as given, or as
    /// `dtype`: "float16", "float32" or "int8") from `train_queries` (`[m, d]`, the head's
    /// prefill queries). `prune`: `"occlusion-fill"` (default: the library's, also what the
    /// decode driver builds; more robust to queries unlike the training ones), `"top"` or
    /// `"occlusion"`. `auto_ef` (0 < R ≤ 1; 0: off): the build measures the `ef` at which the
    /// last 64 training queries (taken to see every key: put the most recent ones last) reach
    /// mean recall@100 R and raises `default_ef` to it (`build_stats["auto_ef"]` says what it
    /// measured). `knn_pool` (0: off): the training queries' top-`kq` lists come from pools of
    /// this many keys shared by clustered queries instead of the exact kNN over all keys, for
    /// builds past ~64K keys (at 512K synthetic keys 67 s instead of 435 s at the same recall;
    /// at least `kq`, not with `causal`; the kNN stays exact while a pool would hold a quarter
    /// of the keys). `pool_above` (0: off): the kNN chosen by length, the exact one up to this
    /// many keys and the pooled one (8,000 keys per pool, causal lists off) past it.
    ///
    /// `visible` (one count per training query): the keys each query's position could attend
    /// to; `causal` builds read it (without it, query row `i` sees keys `0..=i`). With it,
    /// `queries_per_key` (0: off) thins the training queries to that many per key,
    /// `global_full` (0: off) gives a query whose causal list lies mostly far back its full
    /// list, and `far_check` (0: off) also builds a group with that share of such queries from
    /// full lists and keeps the better graph. `decode_default_build()` gives the keywords of
    /// the decode default, the index the driver and `qkindex.hf` decode with.
    #[staticmethod]
    #[pyo3(signature = (keys, train_queries, *, kq=100, max_degree=32, build_ef=200, default_ef=128, causal=false, prune="occlusion-fill", device="auto", dtype=None, auto_ef=0.0, knn_pool=0, pool_above=0, queries_per_key=0.0, global_full=0.0, far_check=0.0, visible=None))]
    #[allow(clippy::too_many_arguments)]
    fn build(
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        train_queries: &Bound<'_, PyAny>,
        kq: i64,
        max_degree: i64,
        build_ef: i64,
        default_ef: i64,
        causal: bool,
        prune: &str,
        device: &str,
        dtype: Option<&str>,
        auto_ef: f64,
        knn_pool: i64,
        pool_above: i64,
        queries_per_key: f64,
        global_full: f64,
        far_check: f64,
        visible: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        let knn = knn_backend(device)?;
        let prune: Prune = prune.parse().map_err(|_| {
            value_error(format!(
                "prune: expected \"top\", \"occlusion\" or \"occlusion-fill\", got {prune:?}"
            ))
        })?;
        let spec = IndexSpec::Attention(AttentionParams {
            kq: count("kq", kq, 1)?,
            max_degree: count("max_degree", max_degree, 1)?,
            build_ef: count("build_ef", build_ef, 1)?,
            default_ef: count("default_ef", default_ef, 1)?,
            causal,
            prune,
            auto_ef: off_at_zero(auto_ef),
            knn: TrainKnn::from_field("knn_pool", count("knn_pool", knn_pool, 0)?)
                .unwrap_or_default(),
            pool_above: count("pool_above", pool_above, 0)?,
            queries_per_key,
            global_full: off_at_zero(global_full),
            far_check: off_at_zero(far_check),
            ..AttentionParams::default()
        });
        let visible = visible.map(visible_counts).transpose()?;
        let store = Arc::new(keys_as(keys, dtype)?);
        let tq = float_array(train_queries, "train_queries")?;
        let train = tq.rows_f32("train_queries", Shape::Matrix, Some(store.dim()))?;
        if train.rows == 0 {
            return Err(value_error(format!(
                "train_queries: expected at least one row, got shape (0, {})",
                store.dim()
            )));
        }
        let train: &[f32] = &train.data;
        let inner = interruptible(py, |cancel| {
            spec.build_visible(store, train, visible.as_deref(), &*knn, cancel)?
                .index
                .try_into()
        })?;
        Ok(AttentionIndex::wrap(inner))
    }

    /// Top-`k` keys by inner product for each query (`[b, d]` or `[d]`), with a candidate
    /// list of `ef ≥ k` (None: the index default, raised to `k`), of which the best `beam` items
    /// are expanded (None: all; below `k`: a cheaper, narrower search). `patience`: stop once
    /// the best `k` have not changed for this many expansions in a row, an int or `"P%"` of
    /// `ef` (None: no early stop).
    #[pyo3(signature = (queries, k=100, ef=None, beam=None, patience=None))]
    fn search(
        &self,
        py: Python<'_>,
        queries: &Bound<'_, PyAny>,
        k: i64,
        ef: Option<i64>,
        beam: Option<i64>,
        patience: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<SearchResult> {
        let params = SearchParams {
            patience: crate::search::patience_arg(patience)?,
            ..graph_search_params(ef, beam)?
        };
        search_any(py, &*self.snapshot(), &self.pool, queries, k, &params)
    }

    /// Appends `key` (`[d]`) and links it into the graph (query-aware insertion), guided by
    /// `guides` (`[g, d]` or `[d]`: queries known to rank the key high, such as the decode
    /// queries that attended to it most; the first 4 are used; None: the key itself guides).
    /// Returns the new key's id (the previous `len`). The GIL is released; searches running
    /// meanwhile in other threads see the index before or after the insert, never between.
    #[pyo3(signature = (key, guides=None))]
    fn insert(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        guides: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        let ka = float_array(key, "key")?;
        let key = ka.one_row("key", self.dim, "")?;
        let ga = guides.map(|g| float_array(g, "guides")).transpose()?;
        let guides = match &ga {
            Some(g) => g.rows_f32("guides", Shape::Vectors, Some(self.dim))?.data,
            None => std::borrow::Cow::Borrowed(&[][..]),
        };
        let id = py
            .detach(|| {
                let mut current = self
                    .inner
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let index = Arc::make_mut(&mut current);
                let mut scratch = index.new_scratch();
                index.insert(&key, &guides, &mut scratch)
            })
            .map_err(to_py)?;
        Ok(i64::from(id))
    }

    /// Number of keys.
    fn __len__(&self) -> usize {
        self.snapshot().len()
    }

    /// Build parameters, as a dict.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py_json(py, self.snapshot().params())
    }

    /// What the build did and how long each phase took (seconds), as a dict.
    #[getter]
    fn build_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py_json(py, self.snapshot().build_stats())
    }

    /// Writes the index with its keys to one self-contained file (atomically; docs/FORMAT.md).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        save_inline(py, &*self.snapshot(), &path)
    }

    fn __repr__(&self) -> String {
        let index = self.snapshot();
        format!(
            "AttentionIndex(n={}, dim={}, dtype={}, edges={})",
            index.len(),
            self.dim,
            self.dtype,
            index.edges()
        )
    }
}

/// Exact top-k by scanning every key (`scanned = 1`): the yardstick; with `flat:codes=i8`
/// (`qkindex.build`), a scan of int8 codes whose best `ef` candidates are re-ranked exactly.
#[derive(Debug)]
#[pyclass(frozen, module = "qkindex")]
pub struct FlatIndex {
    /// The index, as [`AttentionIndex::inner`]: searches read a snapshot, `insert` appends
    /// under the write lock (copying first while a search holds the previous snapshot).
    inner: RwLock<Arc<qkindex::FlatIndex>>,
    pool: Pool,
    /// Key dimension.
    #[pyo3(get)]
    dim: usize,
    /// Element type of the stored keys: "float16", "float32" or "int8".
    #[pyo3(get)]
    dtype: String,
}

impl FlatIndex {
    /// Wraps a core index (for example one opened by `load`).
    pub fn wrap(inner: qkindex::FlatIndex) -> Self {
        FlatIndex {
            dim: inner.dim(),
            dtype: inner.keys().dtype().numpy_name().to_string(),
            inner: RwLock::new(Arc::new(inner)),
            pool: Pool::default(),
        }
    }

    /// The index as of now (inserts after this call do not change it).
    pub fn snapshot(&self) -> Arc<qkindex::FlatIndex> {
        self.inner
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

#[pymethods]
impl FlatIndex {
    /// A flat index over `keys` (`[n, d]`, float16 or float32; stored as given, or as `dtype`:
    /// "float16", "float32" or "int8").
    #[staticmethod]
    #[pyo3(signature = (keys, *, dtype=None))]
    fn build(keys: &Bound<'_, PyAny>, dtype: Option<&str>) -> PyResult<Self> {
        let store = Arc::new(keys_as(keys, dtype)?);
        let inner = build_spec(
            &IndexSpec::Flat(qkindex::FlatParams::default()),
            store,
            &[],
            &qkindex::CpuKnn,
            &Cancel::new(),
        )
        .map_err(to_py)?;
        Ok(FlatIndex::wrap(inner))
    }

    /// Top-`k` keys by inner product for each query (`[b, d]` or `[d]`): exact; on codes
    /// (`flat:codes=i8`), the best `ef ≥ k` by code estimate re-ranked exactly (None: the
    /// index default).
    #[pyo3(signature = (queries, k=100, ef=None))]
    fn search(
        &self,
        py: Python<'_>,
        queries: &Bound<'_, PyAny>,
        k: i64,
        ef: Option<i64>,
    ) -> PyResult<SearchResult> {
        let params = graph_search_params(ef, None)?;
        search_any(py, &*self.snapshot(), &self.pool, queries, k, &params)
    }

    /// Appends `key` (`[d]`); returns its id (the previous `len`). The GIL is released;
    /// searches running meanwhile in other threads see the index before or after the insert.
    fn insert(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let ka = float_array(key, "key")?;
        let key = ka.one_row("key", self.dim, "")?;
        let id = py
            .detach(|| {
                let mut current = self
                    .inner
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                Arc::make_mut(&mut current).insert(&key)
            })
            .map_err(to_py)?;
        Ok(i64::from(id))
    }

    /// Number of keys.
    fn __len__(&self) -> usize {
        self.snapshot().len()
    }

    /// Build parameters, as a dict.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py_json(py, self.snapshot().params())
    }

    /// Writes the index with its keys to one self-contained file (atomically; docs/FORMAT.md).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        save_inline(py, &*self.snapshot(), &path)
    }

    fn __repr__(&self) -> String {
        format!(
            "FlatIndex(n={}, dim={}, dtype={})",
            self.snapshot().len(),
            self.dim,
            self.dtype
        )
    }
}

/// Opens an index file written by `save` (any kind that can be saved). With `mmap=True` the
/// index searches the file's mapped pages (opened without a copy); `mmap=False` reads the file
/// into memory first. `verify=True` checks every section checksum, the graph and the keys on
/// open; `False` opens in O(1). Raises `FormatError` for a damaged or foreign file.
#[pyfunction]
#[pyo3(signature = (path, mmap=true, verify=true))]
pub fn load(py: Python<'_>, path: PathBuf, mmap: bool, verify: bool) -> PyResult<Py<PyAny>> {
    let opts = qkindex::io::LoadOptions {
        verify,
        ..Default::default()
    };
    let any = py
        .detach(|| {
            if mmap {
                qkindex::io::load(&path, &opts)
            } else {
                let bytes = std::fs::read(&path).map_err(|e| qkindex::Error::io(&path, e))?;
                qkindex::io::load_bytes(&bytes, &path, &opts)
            }
        })
        .map_err(to_py)?;
    wrap_any(py, any, &path.display().to_string())
}

/// A core index of any kind as its Python class; `what` names it in the error for a kind these
/// bindings do not wrap yet.
pub fn wrap_any(py: Python<'_>, any: AnyIndex, what: &str) -> PyResult<Py<PyAny>> {
    Ok(match any {
        AnyIndex::Attention(a) => Py::new(py, AttentionIndex::wrap(a))?.into_any(),
        AnyIndex::Flat(f) => Py::new(py, FlatIndex::wrap(f))?.into_any(),
        AnyIndex::Hnsw(h) => Py::new(py, crate::kinds::HnswIndex::wrap(h))?.into_any(),
        AnyIndex::Ivf(i) => Py::new(py, crate::kinds::IvfIndex::wrap(i))?.into_any(),
        AnyIndex::Vamana(v) => Py::new(py, crate::kinds::VamanaIndex::wrap(v))?.into_any(),
        // Kinds the core learns later surface as a clear error until they are wrapped.
        other => {
            return Err(crate::errors::type_error(format!(
                "{what}: a {} index, which these bindings cannot wrap yet",
                other.kind().name()
            )))
        }
    })
}

/// The `AnnIndex` behind a Python index object of any kind.
pub fn any_index(obj: &Bound<'_, PyAny>) -> PyResult<Arc<dyn AnnIndex>> {
    use crate::kinds::{HnswIndex, IvfIndex, VamanaIndex};
    if let Ok(a) = obj.cast::<AttentionIndex>() {
        return Ok(a.get().snapshot());
    }
    if let Ok(f) = obj.cast::<FlatIndex>() {
        return Ok(f.get().snapshot());
    }
    if let Ok(h) = obj.cast::<HnswIndex>() {
        return Ok(h.get().inner.clone());
    }
    if let Ok(i) = obj.cast::<IvfIndex>() {
        return Ok(i.get().inner.clone());
    }
    if let Ok(v) = obj.cast::<VamanaIndex>() {
        return Ok(v.get().inner.clone());
    }
    Err(crate::errors::type_error(format!(
        "index: expected a qkindex index, got {}",
        obj.get_type().name()?
    )))
}
