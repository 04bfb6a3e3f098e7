//! The baseline index kinds: `HnswIndex`, `IvfIndex`, `VamanaIndex` (DESIGN.md §3). They share
//! `search_any` (batching, padding, GIL release) with the other kinds; their builds construct an
//! `IndexSpec` and run it interruptibly like `AttentionIndex.build`.

use crate::arrays::{count, float_array, Shape};
use crate::device::knn_backend;
use crate::errors::value_error;
use crate::index::{build_spec, to_py_json};
use crate::run::interruptible;
use crate::search::{search_any, Pool, SearchResult};
use pyo3::prelude::*;
use qkindex::{AnnIndex, CpuKnn, HnswParams, IndexSpec, IvfParams, SearchParams, VamanaParams};
use std::sync::Arc;

/// A Python class over a core index kind: the struct, `wrap`, and the methods every kind has
/// (`__len__`, `dim`, `save`, `__repr__` from `$repr`) around the kind's own methods; `graph`
/// kinds also get `search` with `ef` and `beam`, and `params`.
macro_rules! index_class {
    // A graph kind: also `search(queries, k, ef, beam)` and the `params` dict.
    (
        $(#[$doc:meta])*
        graph $name:ident($core:ty), repr = |$this:ident| $repr:expr,
        { $($methods:tt)* }
    ) => {
        index_class! {
            $(#[$doc])*
            $name($core), repr = |$this| $repr,
            {
                $($methods)*

                /// Top-`k` keys by inner product for each query (`[b, d]` or `[d]`), with a
                /// candidate list of `ef ≥ k` (None: the index default, raised to `k`), of which
                /// the best `beam` items are expanded (None: all; below `k`: a cheaper, narrower
                /// search).
                #[pyo3(signature = (queries, k=100, ef=None, beam=None))]
                fn search(
                    &self,
                    py: Python<'_>,
                    queries: &Bound<'_, PyAny>,
                    k: i64,
                    ef: Option<i64>,
                    beam: Option<i64>,
                ) -> PyResult<SearchResult> {
                    let params = crate::search::graph_search_params(ef, beam)?;
                    search_any(py, self.inner.as_ref(), &self.pool, queries, k, &params)
                }

                /// Build parameters, as a dict.
                #[getter]
                fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                    to_py_json(py, self.inner.params())
                }
            }
        }
    };
    (
        $(#[$doc:meta])*
        $name:ident($core:ty), repr = |$this:ident| $repr:expr,
        { $($methods:tt)* }
    ) => {
        $(#[$doc])*
        #[derive(Debug)]
        #[pyclass(frozen, module = "qkindex")]
        pub struct $name {
            pub inner: Arc<$core>,
            pool: Pool,
        }

        impl $name {
            /// Wraps a core index (for example one opened by `load`).
            pub fn wrap(inner: $core) -> Self {
                $name {
                    inner: Arc::new(inner),
                    pool: Pool::default(),
                }
            }
        }

        #[pymethods]
        impl $name {
            $($methods)*

            /// Number of keys.
            fn __len__(&self) -> usize {
                self.inner.len()
            }

            /// Key dimension.
            #[getter]
            fn dim(&self) -> usize {
                self.inner.dim()
            }

            /// Writes the index with its keys to one self-contained file (atomically;
            /// docs/FORMAT.md).
            fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
                py.detach(|| self.inner.save(&path))
                    .map_err(crate::errors::to_py)
            }

            fn __repr__(&self) -> String {
                let $this = &self.inner;
                $repr
            }
        }
    };
}

index_class! {
    /// HNSW over the keys: on the MIPS→L2 reduction (default) or plain inner product.
    graph HnswIndex(qkindex::HnswIndex),
    repr = |i| format!("HnswIndex(n={}, dim={})", i.len(), i.dim()),
    {
        /// Builds HNSW over `keys` (`[n, d]`, float16 or float32; stored as given).
        #[staticmethod]
        #[pyo3(signature = (keys, *, m=16, ef_construction=200, l2_reduction=true, seed=100))]
        fn build(
            py: Python<'_>,
            keys: &Bound<'_, PyAny>,
            m: i64,
            ef_construction: i64,
            l2_reduction: bool,
            seed: u64,
        ) -> PyResult<Self> {
            let spec = IndexSpec::Hnsw(HnswParams {
                m: count("m", m, 2)?,
                ef_construction: count("ef_construction", ef_construction, 1)?,
                l2_reduction,
                seed,
                ..HnswParams::default()
            });
            let store = Arc::new(float_array(keys, "keys")?.key_store("keys", None)?);
            let inner =
                interruptible(py, |cancel| build_spec(&spec, store, &[], &CpuKnn, cancel))?;
            Ok(HnswIndex::wrap(inner))
    }

    }
}

index_class! {
    /// IVF-Flat: k-means lists (spherical centroids), `nprobe` lists scanned per query.
    IvfIndex(qkindex::IvfIndex),
    repr = |i| format!("IvfIndex(n={}, dim={}, nlist={})", i.len(), i.dim(), i.nlist()),
    {
        /// Builds IVF over `keys` with `nlist` lists (None: `round(4·√n)`) and `iters` Lloyd
        /// iterations.
        #[staticmethod]
        #[pyo3(signature = (keys, *, nlist=None, iters=10, seed=0))]
        fn build(
            py: Python<'_>,
            keys: &Bound<'_, PyAny>,
            nlist: Option<i64>,
            iters: i64,
            seed: u64,
        ) -> PyResult<Self> {
            let spec = IndexSpec::Ivf(IvfParams {
                nlist: nlist.map(|n| count("nlist", n, 1)).transpose()?,
                iters: count("iters", iters, 0)?,
                seed,
                ..IvfParams::default()
            });
            let store = Arc::new(float_array(keys, "keys")?.key_store("keys", None)?);
            let inner =
                interruptible(py, |cancel| build_spec(&spec, store, &[], &CpuKnn, cancel))?;
            Ok(IvfIndex::wrap(inner))
    }

    /// Top-`k` keys by inner product for each query, scanning the `nprobe` lists whose
    /// centroids score highest (None: the index default); on codes (`ivf:codes=i8`), the
    /// best `ef ≥ k` of those lists by code estimate are re-ranked exactly (None: the index
    /// default).
    #[pyo3(signature = (queries, k=100, nprobe=None, ef=None))]
    fn search(
        &self,
        py: Python<'_>,
        queries: &Bound<'_, PyAny>,
        k: i64,
        nprobe: Option<i64>,
        ef: Option<i64>,
    ) -> PyResult<SearchResult> {
        let params = SearchParams {
            nprobe: nprobe.map(|e| count("nprobe", e, 1)).transpose()?,
            ..crate::search::graph_search_params(ef, None)?
        };
        search_any(py, self.inner.as_ref(), &self.pool, queries, k, &params)
    }

    /// Number of lists.
    #[getter]
    fn nlist(&self) -> usize {
        self.inner.nlist()
    }

    /// Build parameters, as a dict.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py_json(py, self.inner.params())
    }
    }
}

index_class! {
    /// Vamana (DiskANN) graph; `robust=True` builds RobustVamana (OOD-DiskANN), which needs
    /// `train_queries`.
    graph VamanaIndex(qkindex::VamanaIndex),
    repr = |i| format!(
        "VamanaIndex(n={}, dim={}, robust={})",
        i.len(),
        i.dim(),
        i.params().robust
    ),
    {
        /// Builds Vamana over `keys` with degree bound `r`, build list size `l` and pruning
        /// factor `alpha`.
        #[staticmethod]
        #[pyo3(signature = (keys, *, r=64, l=100, alpha=1.2, train_queries=None, robust=false, seed=0, device="auto"))]
        #[allow(clippy::too_many_arguments)]
        fn build(
            py: Python<'_>,
            keys: &Bound<'_, PyAny>,
            r: i64,
            l: i64,
            alpha: f32,
            train_queries: Option<&Bound<'_, PyAny>>,
            robust: bool,
            seed: u64,
            device: &str,
        ) -> PyResult<Self> {
            let knn = knn_backend(device)?;
            let spec = IndexSpec::Vamana(VamanaParams {
                r: count("r", r, 1)?,
                l: count("l", l, 1)?,
                alpha,
                robust,
                seed,
                ..VamanaParams::default()
            });
            let store = Arc::new(float_array(keys, "keys")?.key_store("keys", None)?);
            let tq = train_queries
                .map(|t| float_array(t, "train_queries"))
                .transpose()?;
            let train = tq
                .as_ref()
                .map(|t| t.rows_f32("train_queries", Shape::Matrix, Some(store.dim())))
                .transpose()?;
            if robust && train.is_none() {
                return Err(value_error(
                    "train_queries: robust=True needs training queries [m, d]",
                ));
            }
            let train: &[f32] = train.as_ref().map_or(&[], |t| &*t.data);
            let inner =
                interruptible(py, |cancel| build_spec(&spec, store, train, &*knn, cancel))?;
            Ok(VamanaIndex::wrap(inner))
    }

    }
}
