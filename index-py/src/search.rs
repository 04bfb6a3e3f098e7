//! Searching any index from Python: the batched search every kind's `search` calls, its
//! results, and the pool of search buffers each index object keeps.
//!
//! `search` accepts one query (1-D `[d]`, results 1-D) or a batch (2-D `[b, d]`, results
//! `[b, k]`). A batch of two or more queries is split over rayon's global thread pool (size:
//! `RAYON_NUM_THREADS`, default the number of CPUs); one query runs on the calling thread. The
//! GIL is released while searching, so searches from several Python threads run in parallel.
//! Results shorter than `k` are padded with id −1 and score −inf.

use crate::arrays::{count, float_array, neighbours, to_numpy, Shape};
use crate::errors::to_py;
use pyo3::prelude::*;
use qkindex::{AnnIndex, Scratch, SearchOutput, SearchParams};
use rayon::prelude::*;
use std::sync::Mutex;

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

/// The search parameters of a graph kind's `search(ef=, beam=)`, both checked to be ≥ 1.
/// `patience=`: an int (expansions, at least 1), a string `"25%"` (of `ef`) or `"32"`, or None.
pub fn patience_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<qkindex::Patience>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    if let Ok(n) = obj.extract::<i64>() {
        return Ok(Some(qkindex::Patience::Expansions(count(
            "patience", n, 1,
        )?)));
    }
    let text: String = obj.extract().map_err(|_| {
        crate::errors::type_error(format!(
            "patience: expected an int or a string such as \"25%\", got {}",
            obj.get_type().name().map_or("?".into(), |n| n.to_string())
        ))
    })?;
    text.parse().map(Some).map_err(to_py)
}

pub fn graph_search_params(ef: Option<i64>, beam: Option<i64>) -> PyResult<SearchParams> {
    Ok(SearchParams {
        ef: ef.map(|e| count("ef", e, 1)).transpose()?,
        beam: beam.map(|b| count("beam", b, 1)).transpose()?,
        ..SearchParams::default()
    })
}

/// Scratches of `search_many`, shared by every call (about one per thread that searched).
static MANY_SCRATCH: qkindex::ManyScratch = qkindex::ManyScratch::new();

/// Searches `queries[i]` (`[n, b, d]`: `b` queries per index) on `indexes[i]` for every `i` in
/// one call, all `n · b` searches spread over rayon's global thread pool with the GIL released,
/// as a serving engine searches the heads of a layer. `ef`, `beam` and `nprobe` go to every
/// index; each kind reads those that apply to it (unset: each index's default). `patience`:
/// graph searches stop once their best `k` have not changed for this many expansions in a row
/// or `"P%"` of `ef` (None: no early stop; `qkindex.hf` decodes with `"25%"`). Returns a
/// `SearchResult` with `ids` and `scores` of shape `[n, b, k]` (−1 / −inf padding) and
/// `distance_computations` of shape `[n, b]`: index `i`'s stats per query.
#[pyfunction]
#[pyo3(signature = (indexes, queries, k=100, ef=None, beam=None, nprobe=None, patience=None))]
#[allow(clippy::too_many_arguments)]
pub fn search_many(
    py: Python<'_>,
    indexes: Vec<Bound<'_, PyAny>>,
    queries: &Bound<'_, PyAny>,
    k: i64,
    ef: Option<i64>,
    beam: Option<i64>,
    nprobe: Option<i64>,
    patience: Option<&Bound<'_, PyAny>>,
) -> PyResult<SearchResult> {
    let arcs = indexes
        .iter()
        .enumerate()
        .map(|(i, obj)| {
            crate::index::any_index(obj)
                .map_err(|e| crate::errors::type_error(format!("indexes[{i}]: {e}")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let Some(first) = arcs.first() else {
        return Err(crate::errors::value_error(
            "indexes: expected at least one index, got none",
        ));
    };
    let dim = first.dim();
    let mut min_len = first.len();
    for (i, index) in arcs.iter().enumerate() {
        if index.dim() != dim {
            return Err(crate::errors::value_error(format!(
                "indexes[{i}]: key dimension {} differs from indexes[0]'s {dim}",
                index.dim()
            )));
        }
        min_len = min_len.min(index.len());
    }
    let k = neighbours(k, min_len)?;
    let params = SearchParams {
        nprobe: nprobe.map(|e| count("nprobe", e, 1)).transpose()?,
        patience: patience_arg(patience)?,
        ..graph_search_params(ef, beam)?
    };
    let arr = float_array(queries, "queries")?;
    let n = arcs.len();
    let shape = arr.shape().to_vec();
    let q = arr.rows_f32("queries", Shape::Stacked, Some(dim))?;
    if shape[0] != n {
        return Err(crate::errors::value_error(format!(
            "queries: expected shape [{n}, b, {dim}] (one block per index), got {}",
            crate::arrays::shape_str(&shape)
        )));
    }
    let b = shape[1];
    let data: &[f32] = &q.data;
    let blocks: Vec<&[f32]> = (0..n)
        .map(|i| &data[i * b * dim..(i + 1) * b * dim])
        .collect();
    let refs: Vec<&dyn AnnIndex> = arcs.iter().map(|a| a.as_ref()).collect();
    let mut outs = Vec::new();
    py.detach(|| {
        qkindex::search_many_into(
            &refs,
            &blocks,
            &qkindex::many::no_seeds,
            k,
            &|_, _| params,
            &MANY_SCRATCH,
            &mut outs,
        )
    })
    .map_err(to_py)?;
    let mut ids = vec![-1i64; n * b * k];
    let mut scores = vec![f32::NEG_INFINITY; n * b * k];
    let mut dcs = vec![0i64; n * b];
    for (((found, ids), scores), dc) in outs
        .iter()
        .flat_map(|o| &o.outputs)
        .zip(ids.chunks_mut(k))
        .zip(scores.chunks_mut(k))
        .zip(dcs.iter_mut())
    {
        for (slot, &id) in ids.iter_mut().zip(&found.ids) {
            *slot = i64::from(id);
        }
        scores[..found.scores.len()].copy_from_slice(&found.scores);
        *dc = i64::try_from(found.stats.distance_computations).unwrap_or(i64::MAX);
    }
    let stacked = |values: Bound<'_, PyAny>| -> PyResult<Py<PyAny>> {
        Ok(values.call_method1("reshape", ((n, b, k),))?.unbind())
    };
    Ok(SearchResult {
        ids: stacked(to_numpy(py, ids, n * b, k, false)?)?,
        scores: stacked(to_numpy(py, scores, n * b, k, false)?)?,
        distance_computations: to_numpy(py, dcs, n, b, false)?.unbind(),
    })
}
