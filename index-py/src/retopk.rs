//! `ReTopK`: the selector of [`qkindex::retopk`] over one head's keys, stepped one decode
//! query at a time (DESIGN.md §4).
//!
//! The object owns its keys (a copy, in the input's element type) and, unless `index=` names
//! another index, takes the exact path through a `FlatIndex` over those same keys. The state
//! (cache, keys, buffers) sits behind a mutex, so calls from several Python threads take turns;
//! the GIL is released while a call works.

use crate::arrays::{count, float_array, id_array, shape_str, Shape};
use crate::errors::{to_py, value_error};
use crate::index::{any_index, to_py_json};
use numpy::{PyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use qkindex::{
    AnnIndex, FlatIndex, KeyStore, ReTopKParams, Scratch, SearchOutput, SearchParams, StepStats,
};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where the exact path goes.
#[derive(Clone)]
enum Exact {
    /// A flat scan over the selector's own keys (built per step from the shared `Arc`, so
    /// `append` can grow the keys in place).
    Flat,
    /// An index the caller built over the same key ids (fixed: `append` is refused).
    Index(Arc<dyn AnnIndex>),
}

impl std::fmt::Debug for Exact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exact::Flat => f.write_str("Flat"),
            Exact::Index(i) => write!(f, "Index({})", i.kind().name()),
        }
    }
}

#[derive(Debug)]
struct State {
    selector: qkindex::ReTopK,
    /// Reference count 1 between calls, so `append` pushes without copying.
    keys: Arc<KeyStore>,
    exact: Exact,
    exact_params: SearchParams,
    scratch: Scratch,
    out: SearchOutput,
}

/// ReTopK over one head's keys: reuse the top-k sets of similar past queries, with an exact
/// path every `refresh` steps or when no cached query is `tau`-similar.
#[derive(Debug)]
#[pyclass(frozen, module = "qkindex")]
pub struct ReTopK {
    /// Key and query dimension (fixed; read without the lock).
    dim: usize,
    state: Mutex<State>,
}

impl ReTopK {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The stats of a step as a dict.
fn stats_dict<'py>(py: Python<'py>, s: &StepStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("path", s.path.name())?;
    d.set_item("candidates", s.candidates)?;
    d.set_item("best_similarity", s.best_similarity)?;
    d.set_item("similarity_computations", s.similarity_computations)?;
    d.set_item("distance_computations", s.search.distance_computations)?;
    d.set_item("hops", s.search.hops)?;
    Ok(d)
}

#[pymethods]
impl ReTopK {
    /// A selector over `keys` (`[n, d]`, float16 or float32; copied, stored as given) with the
    /// paper's parameters (C, R, W, τ, T_r, K). The exact path is a flat scan of `keys`, or
    /// `index` (any qkindex index over the same `n` keys, searched with `ef`) when given.
    #[new]
    #[pyo3(signature = (keys, *, c=32, r=4, w=32, tau=0.85, refresh=128, k=512, seed_fallback=true, index=None, ef=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        keys: &Bound<'_, PyAny>,
        c: i64,
        r: i64,
        w: i64,
        tau: f64,
        refresh: i64,
        k: i64,
        seed_fallback: bool,
        index: Option<&Bound<'_, PyAny>>,
        ef: Option<i64>,
    ) -> PyResult<Self> {
        let params = ReTopKParams {
            c: count("c", c, 1)?,
            r: count("r", r, 1)?,
            w: count("w", w, 0)?,
            tau: tau as f32,
            refresh: count("refresh", refresh, 1)?,
            k: count("k", k, 1)?,
            seed_fallback,
        };
        let store = float_array(keys, "keys")?.key_store("keys", None)?;
        let exact = match index {
            None => Exact::Flat,
            Some(obj) => {
                let idx = any_index(obj)?;
                if idx.len() != store.len() || idx.dim() != store.dim() {
                    return Err(value_error(format!(
                        "index: must index the same keys, shape {}; it holds {} keys of \
                         dimension {}",
                        shape_str(&[store.len(), store.dim()]),
                        idx.len(),
                        idx.dim()
                    )));
                }
                Exact::Index(idx)
            }
        };
        let selector = qkindex::ReTopK::new(params, store.dim()).map_err(to_py)?;
        let scratch = Scratch::new(store.len());
        let exact_params = SearchParams {
            ef: ef.map(|e| count("ef", e, 1)).transpose()?,
            ..SearchParams::default()
        };
        Ok(ReTopK {
            dim: store.dim(),
            state: Mutex::new(State {
                selector,
                keys: Arc::new(store),
                exact,
                exact_params,
                scratch,
                out: SearchOutput::default(),
            }),
        })
    }

    /// Fills the cache from past `queries` (`[m, d]`): the last `c` of them that see a key,
    /// each with its exact top-k over keys `0..visible[i]` (`visible`: `m` ints, default `n`
    /// for every query; `visible[i] = i + 1` is causal prefill). Counts no step.
    #[pyo3(signature = (queries, visible=None))]
    fn prime(
        &self,
        py: Python<'_>,
        queries: &Bound<'_, PyAny>,
        visible: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let dim = self.dim;
        let qa = float_array(queries, "queries")?;
        let q = qa.rows_f32("queries", Shape::Matrix, Some(dim))?;
        let visible: Option<Vec<usize>> = match visible {
            None => None,
            Some(obj) => {
                let a = id_array(obj, "visible")?;
                if a.shape() != [q.rows] {
                    return Err(value_error(format!(
                        "visible: expected shape ({},) (one per query), got {}",
                        q.rows,
                        shape_str(a.shape())
                    )));
                }
                let v = a.as_array();
                Some(
                    v.iter()
                        .map(|&x| count("visible", x, 0))
                        .collect::<PyResult<_>>()?,
                )
            }
        };
        let data: &[f32] = &q.data;
        py.detach(|| {
            let mut guard = self.lock();
            let st = &mut *guard;
            let visible = visible.unwrap_or_else(|| vec![st.keys.len(); q.rows]);
            st.selector.prime(data, &visible, &st.keys)
        })
        .map_err(to_py)
    }

    /// One decode step for `query` (`[d]`): `(ids, stats)`. `ids` is int64 `[min(k, n)]`, best
    /// first, padded with −1 when a reuse step had fewer candidates; `stats` is a dict with
    /// `path` ("reuse", "low_similarity", "refresh" or "empty_cache"), `candidates`,
    /// `best_similarity` (−inf on an empty cache), `similarity_computations`,
    /// `distance_computations` and `hops`.
    fn step<'py>(
        &self,
        py: Python<'py>,
        query: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyDict>)> {
        let qa = float_array(query, "query")?;
        let q = qa.one_row("query", self.dim, " (one query per step)")?;
        let data: &[f32] = &q;
        let (ids, stats) = py
            .detach(|| -> qkindex::Result<(Vec<i64>, StepStats)> {
                let mut guard = self.lock();
                let st = &mut *guard;
                let flat;
                let exact: &dyn AnnIndex = match &st.exact {
                    Exact::Flat => {
                        flat = FlatIndex::new(st.keys.clone());
                        &flat
                    }
                    Exact::Index(i) => i.as_ref(),
                };
                let stats = st.selector.step(
                    data,
                    &st.keys,
                    exact,
                    &st.exact_params,
                    &mut st.scratch,
                    &mut st.out,
                )?;
                let k = st.selector.params().k.min(st.keys.len());
                let mut ids = vec![-1i64; k];
                for (slot, &id) in ids.iter_mut().zip(&st.out.ids) {
                    *slot = i64::from(id);
                }
                Ok((ids, stats))
            })
            .map_err(to_py)?;
        Ok((PyArray1::from_vec(py, ids), stats_dict(py, &stats)?))
    }

    /// Appends one decode key (`[d]`); its id is the previous `len(self)`. Refused when the
    /// exact path is an `index=` (it cannot grow with the keys).
    fn append(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let ka = float_array(key, "key")?;
        let row = ka.one_row("key", self.dim, "")?;
        let data: &[f32] = &row;
        let id = py.detach(|| -> PyResult<u32> {
            let mut st = self.lock();
            if let Exact::Index(i) = &st.exact {
                return Err(value_error(format!(
                    "append: the exact path is a fixed {} index over {} keys; build the \
                     ReTopK without index= to append keys",
                    i.kind().name(),
                    i.len()
                )));
            }
            // Between calls nothing else holds the Arc, so this pushes in place.
            Arc::make_mut(&mut st.keys).push(data).map_err(to_py)
        })?;
        Ok(i64::from(id))
    }

    /// Number of keys.
    fn __len__(&self) -> usize {
        self.lock().keys.len()
    }

    /// Key and query dimension.
    #[getter]
    fn dim(&self) -> usize {
        self.dim
    }

    /// Cached (query, ids) pairs (at most `c`).
    #[getter]
    fn cache_len(&self) -> usize {
        self.lock().selector.cache_len()
    }

    /// Steps taken so far (prime counts none).
    #[getter]
    fn steps(&self) -> u64 {
        self.lock().selector.steps()
    }

    /// The parameters, as a dict (`c`, `r`, `w`, `tau`, `refresh`, `k`, `seed_fallback`).
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let p = self.lock().selector.params().clone();
        to_py_json(py, &p)
    }

    fn __repr__(&self) -> String {
        let st = self.lock();
        let p = st.selector.params();
        format!(
            "ReTopK(n={}, dim={}, c={}, r={}, w={}, tau={}, refresh={}, k={}, exact={:?}, \
             cache_len={}, steps={})",
            st.keys.len(),
            st.selector.dim(),
            p.c,
            p.r,
            p.w,
            p.tau,
            p.refresh,
            p.k,
            st.exact,
            st.selector.cache_len(),
            st.selector.steps()
        )
    }
}
