//! The index classes and their search.
//!
//! `search` accepts one query (1-D `[d]`, results 1-D) or a batch (2-D `[b, d]`, results
//! `[b, k]`). A batch of two or more queries is split over rayon's global thread pool (size:
//! `RAYON_NUM_THREADS`, default the number of CPUs); one query runs on the calling thread. The
//! GIL is released while searching, so searches from several Python threads run in parallel.
//! Results shorter than `k` are padded with id −1 and score −inf.

use crate::arrays::{count, float_array, neighbours, to_numpy, Shape};
use crate::errors::{to_py, value_error};
use crate::run::interruptible;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use qkindex::attention::Prune;
use qkindex::io::{AnyIndex, KeysPlacement, Persist};
use qkindex::{
    AnnIndex, AttentionParams, Cancel, Error, IndexSpec, KeyStore, KnnBackend, Scratch,
    SearchOutput, SearchParams,
};
use qkindex_gpu::{Device, GpuError, Selected};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// Scratches kept per index for reuse (more concurrent searches allocate their own).
const POOL_CAP: usize = 64;

/// Search buffers reused across calls, so a single-query search allocates only its results.
#[derive(Debug, Default)]
pub struct Pool(Mutex<Vec<(Scratch, SearchOutput)>>);

/// A pooled scratch that goes back to its pool when dropped.
struct Pooled<'a> {
    pool: &'a Pool,
    item: Option<(Scratch, SearchOutput)>,
}

impl Pool {
    fn take<'a>(&'a self, index: &dyn AnnIndex) -> Pooled<'a> {
        let got = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        Pooled {
            pool: self,
            item: Some(got.unwrap_or_else(|| (index.new_scratch(), SearchOutput::default()))),
        }
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            let mut free = self
                .pool
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if free.len() < POOL_CAP {
                free.push(item);
            }
        }
    }
}

impl Pooled<'_> {
    fn search(
        &mut self,
        index: &dyn AnnIndex,
        query: &[f32],
        k: usize,
        params: &SearchParams,
    ) -> qkindex::Result<&SearchOutput> {
        let (scratch, out) = self
            .item
            .get_or_insert_with(|| (index.new_scratch(), SearchOutput::default()));
        index.search_into(query, k, params, scratch, out)?;
        Ok(out)
    }
}

/// Results of `search`: `ids` (int64, −1 padding) and `scores` (float32, inner products,
/// descending, −inf padding) of shape `[b, k]` (`[k]` for a 1-D query), and
/// `distance_computations` (int64 `[b]`, a scalar for a 1-D query).
#[derive(Debug)]
#[pyclass(frozen, module = "qkindex")]
pub struct SearchResult {
    #[pyo3(get)]
    ids: Py<PyAny>,
    #[pyo3(get)]
    scores: Py<PyAny>,
    #[pyo3(get)]
    distance_computations: Py<PyAny>,
}

#[pymethods]
impl SearchResult {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "SearchResult(ids={}, scores={}, distance_computations={})",
            self.ids.bind(py).repr()?,
            self.scores.bind(py).repr()?,
            self.distance_computations.bind(py).repr()?
        ))
    }
}

/// Searches `queries` (1-D or 2-D) on `index`: the shared body of every kind's `search`.
pub fn search_any(
    py: Python<'_>,
    index: &dyn AnnIndex,
    pool: &Pool,
    queries: &Bound<'_, PyAny>,
    k: i64,
    params: &SearchParams,
) -> PyResult<SearchResult> {
    let k = neighbours(k, index.len())?;
    let arr = float_array(queries, "queries")?;
    let q = arr.rows_f32("queries", Shape::Vectors, Some(index.dim()))?;
    let (b, d) = (q.rows, q.dim);
    let mut ids = vec![-1i64; b * k];
    let mut scores = vec![f32::NEG_INFINITY; b * k];
    let mut dcs = vec![0i64; b];
    let data: &[f32] = &q.data;
    let write = |out: &SearchOutput, ids: &mut [i64], scores: &mut [f32], dc: &mut i64| {
        for (slot, &id) in ids.iter_mut().zip(&out.ids) {
            *slot = i64::from(id);
        }
        scores[..out.scores.len()].copy_from_slice(&out.scores);
        *dc = i64::try_from(out.stats.distance_computations).unwrap_or(i64::MAX);
    };
    py.detach(|| -> qkindex::Result<()> {
        if b <= 1 {
            let mut pooled = pool.take(index);
            for (((query, ids), scores), dc) in data
                .chunks_exact(d)
                .zip(ids.chunks_mut(k))
                .zip(scores.chunks_mut(k))
                .zip(dcs.iter_mut())
            {
                write(pooled.search(index, query, k, params)?, ids, scores, dc);
            }
            Ok(())
        } else {
            data.par_chunks_exact(d)
                .zip(ids.par_chunks_mut(k))
                .zip(scores.par_chunks_mut(k))
                .zip(dcs.par_iter_mut())
                .try_for_each_init(
                    || pool.take(index),
                    |pooled, (((query, ids), scores), dc)| {
                        write(pooled.search(index, query, k, params)?, ids, scores, dc);
                        Ok(())
                    },
                )
        }
    })
    .map_err(to_py)?;
    let dcs = to_numpy(py, dcs, b, 1, true)?;
    let distance_computations = if q.one_d { dcs.get_item(0)? } else { dcs };
    Ok(SearchResult {
        ids: to_numpy(py, ids, b, k, q.one_d)?.unbind(),
        scores: to_numpy(py, scores, b, k, q.one_d)?.unbind(),
        distance_computations: distance_computations.unbind(),
    })
}

/// The kNN backend for a `device` argument (`"auto"`, `"cpu"`, `"cuda"`, `"cuda:N"`), opened once
/// per process and device. `auto` without a usable GPU is the CPU; the reason goes to the
/// `qkindex` logger (INFO). `cuda` without one is a `RuntimeError` with the reason.
pub fn knn_backend(device: &str) -> PyResult<Arc<Selected>> {
    static OPENED: Mutex<Vec<(Device, Arc<Selected>)>> = Mutex::new(Vec::new());
    let device: Device = device
        .parse()
        .map_err(|e: GpuError| value_error(e.to_string()))?;
    let mut opened = OPENED
        .lock()
        .map_err(|_| PyRuntimeError::new_err("a previous device selection panicked"))?;
    if let Some((_, s)) = opened.iter().find(|(d, _)| *d == device) {
        return Ok(s.clone());
    }
    let selected =
        Arc::new(qkindex_gpu::select(device).map_err(|e| PyRuntimeError::new_err(e.to_string()))?);
    if let Some(reason) = selected.fallback_reason() {
        log_info(&format!("device=\"auto\": exact kNN on the CPU ({reason})"));
    }
    opened.push((device, selected.clone()));
    Ok(selected)
}

/// Where exact kNN runs for a `device` argument: "cpu", "cuda:0 (NVIDIA H200)", or
/// "cpu (auto: no usable GPU: …)".
#[pyfunction]
#[pyo3(signature = (device="auto"))]
pub fn knn_device(device: &str) -> PyResult<String> {
    Ok(knn_backend(device)?.describe())
}

fn log_info(msg: &str) {
    Python::attach(|py| {
        let logged = py
            .import("logging")
            .and_then(|l| l.call_method1("getLogger", ("qkindex",)))
            .and_then(|lg| lg.call_method1("info", (msg,)));
        if let Err(e) = logged {
            e.print(py);
        }
    });
}

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

/// `json.loads` of a serializable value (build stats, parameters).
pub fn to_py_json<'py>(
    py: Python<'py>,
    value: &impl serde::Serialize,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| value_error(format!("internal error: cannot serialize: {e}")))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// The search parameters of a graph kind's `search(ef=, beam=)`, both checked to be ≥ 1.
pub fn graph_search_params(ef: Option<i64>, beam: Option<i64>) -> PyResult<SearchParams> {
    Ok(SearchParams {
        ef: ef.map(|e| count("ef", e, 1)).transpose()?,
        beam: beam.map(|b| count("beam", b, 1)).transpose()?,
        ..SearchParams::default()
    })
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
    /// of the keys).
    #[staticmethod]
    #[pyo3(signature = (keys, train_queries, *, kq=100, max_degree=32, build_ef=200, default_ef=128, causal=false, prune="occlusion-fill", device="auto", dtype=None, auto_ef=0.0, knn_pool=0))]
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
            auto_ef,
            knn_pool: count("knn_pool", knn_pool, 0)?,
            ..AttentionParams::default()
        });
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
        let inner = interruptible(py, |cancel| build_spec(&spec, store, train, &*knn, cancel))?;
        Ok(AttentionIndex::wrap(inner))
    }

    /// Top-`k` keys by inner product for each query (`[b, d]` or `[d]`), with a candidate
    /// list of `ef ≥ k` (None: the index default, raised to `k`), of which the best `beam` items
    /// are expanded (None: all; below `k`: a cheaper, narrower search).
    #[pyo3(signature = (queries, k=100, ef=None, beam=None))]
    fn search(
        &self,
        py: Python<'_>,
        queries: &Bound<'_, PyAny>,
        k: i64,
        ef: Option<i64>,
        beam: Option<i64>,
    ) -> PyResult<SearchResult> {
        let params = graph_search_params(ef, beam)?;
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

/// Exact top-k by scanning every key (`scanned = 1`): the yardstick.
#[derive(Debug)]
#[pyclass(frozen, module = "qkindex")]
pub struct FlatIndex {
    pub inner: Arc<qkindex::FlatIndex>,
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
            inner: Arc::new(inner),
            pool: Pool::default(),
        }
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

    /// Exact top-`k` keys by inner product for each query (`[b, d]` or `[d]`).
    #[pyo3(signature = (queries, k=100))]
    fn search(&self, py: Python<'_>, queries: &Bound<'_, PyAny>, k: i64) -> PyResult<SearchResult> {
        search_any(
            py,
            self.inner.as_ref(),
            &self.pool,
            queries,
            k,
            &SearchParams::default(),
        )
    }

    /// Number of keys.
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Writes the index with its keys to one self-contained file (atomically; docs/FORMAT.md).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        save_inline(py, self.inner.as_ref(), &path)
    }

    fn __repr__(&self) -> String {
        format!(
            "FlatIndex(n={}, dim={}, dtype={})",
            self.inner.len(),
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
    Ok(match any {
        qkindex::io::AnyIndex::Attention(a) => Py::new(py, AttentionIndex::wrap(a))?.into_any(),
        qkindex::io::AnyIndex::Flat(f) => Py::new(py, FlatIndex::wrap(f))?.into_any(),
        qkindex::io::AnyIndex::Hnsw(h) => Py::new(py, crate::kinds::HnswIndex::wrap(h))?.into_any(),
        qkindex::io::AnyIndex::Ivf(i) => Py::new(py, crate::kinds::IvfIndex::wrap(i))?.into_any(),
        qkindex::io::AnyIndex::Vamana(v) => {
            Py::new(py, crate::kinds::VamanaIndex::wrap(v))?.into_any()
        }
        // Kinds the core learns to save later surface as a clear error until they are wrapped.
        other => {
            return Err(crate::errors::type_error(format!(
                "{}: a {} index, which these bindings cannot open yet",
                path.display(),
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
        return Ok(f.get().inner.clone());
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
