//! Module-level functions: exact top-k, the metrics of DESIGN.md §3, and timing helpers.

use crate::arrays::{count, float_array, id_array, neighbours, py_id, shape_str, to_numpy, Shape};
use crate::device::knn_backend;
use crate::errors::value_error;
use crate::index::{any_index, to_py_json};
use crate::run::interruptible;
use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use qkindex::{AttentionParams, KnnBackend, KnnOptions, SearchOutput, SearchParams};
use std::time::Instant;

/// Exact top-`k` keys by inner product (f32 accumulation) of each query: `(ids, scores)`,
/// int64 and float32, `[b, k]` (`[k]` for a 1-D query). Runs without the GIL on all cores;
/// Ctrl-C interrupts it.
#[pyfunction]
#[pyo3(signature = (queries, keys, k, device="auto"))]
pub fn exact_topk<'py>(
    py: Python<'py>,
    queries: &Bound<'py, PyAny>,
    keys: &Bound<'py, PyAny>,
    k: i64,
    device: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let knn = knn_backend(device)?;
    let store = float_array(keys, "keys")?.key_store("keys", None)?;
    let k = neighbours(k, store.len())?;
    let qa = float_array(queries, "queries")?;
    let q = qa.rows_f32("queries", Shape::Vectors, Some(store.dim()))?;
    if q.rows == 0 {
        let ids = to_numpy::<i64>(py, Vec::new(), 0, k, false)?;
        let scores = to_numpy::<f32>(py, Vec::new(), 0, k, false)?;
        return Ok((ids, scores));
    }
    let data: &[f32] = &q.data;
    let store = &store;
    let result = interruptible(py, |cancel| {
        let options = KnnOptions {
            cancel: cancel.clone(),
            ..KnnOptions::default()
        };
        knn.topk(data, store, k, &options)
    })?;
    let ids: Vec<i64> = result.ids.iter().map(|&i| py_id(i)).collect();
    Ok((
        to_numpy(py, ids, q.rows, k, q.one_d)?,
        to_numpy(py, result.scores, q.rows, k, q.one_d)?,
    ))
}

/// Rows of an id array: `[k]` is one row, `[b, k]` is b rows.
fn id_rows(a: &PyReadonlyArrayDyn<'_, i64>, name: &str) -> PyResult<(usize, usize, Vec<i64>)> {
    let (rows, cols) = match a.shape() {
        [k] => (1, *k),
        [b, k] => (*b, *k),
        other => {
            return Err(value_error(format!(
                "{name}: expected shape [b, k] or [k], got {}",
                shape_str(other)
            )))
        }
    };
    Ok((rows, cols, a.as_array().iter().copied().collect()))
}

/// Keeps valid ids (drops −1 padding) of one row as `u32`.
fn valid(row: &[i64]) -> Vec<u32> {
    row.iter().filter_map(|&i| u32::try_from(i).ok()).collect()
}

/// Mean recall@k: `|found ∩ exact| / |exact|` per row (−1 padding ignored), averaged over rows.
/// `found_ids` and `exact_ids` are `[b, k']` and `[b, k]`, or 1-D for one query.
#[pyfunction]
#[pyo3(signature = (found_ids, exact_ids))]
pub fn recall(found_ids: &Bound<'_, PyAny>, exact_ids: &Bound<'_, PyAny>) -> PyResult<f64> {
    let fa = id_array(found_ids, "found_ids")?;
    let ea = id_array(exact_ids, "exact_ids")?;
    if fa.ndim() != ea.ndim() {
        return Err(value_error(format!(
            "found_ids: expected as many dimensions as exact_ids {}, got {}",
            shape_str(ea.shape()),
            shape_str(fa.shape())
        )));
    }
    let (fb, fk, found) = id_rows(&fa, "found_ids")?;
    let (eb, ek, exact) = id_rows(&ea, "exact_ids")?;
    if fb != eb {
        return Err(value_error(format!(
            "found_ids: expected {eb} rows (one per row of exact_ids), got {fb}"
        )));
    }
    if eb == 0 || ek == 0 {
        return Err(value_error(format!(
            "exact_ids: expected at least one id, got shape {}",
            shape_str(ea.shape())
        )));
    }
    let total: f64 = (0..eb)
        .map(|r| {
            let f = if fk == 0 {
                Vec::new()
            } else {
                valid(&found[r * fk..(r + 1) * fk])
            };
            qkindex::eval::recall(&f, &valid(&exact[r * ek..(r + 1) * ek]))
        })
        .sum();
    Ok(total / eb as f64)
}

/// Softmax attention mass (scale `1/√d`, over all `keys`) of the keys `ids` (−1 padding
/// ignored), for one query (`query` `[d]`, `ids` `[k]`) or the mean over a batch (`[b, d]`,
/// `[b, k]`).
#[pyfunction]
#[pyo3(signature = (query, keys, ids))]
pub fn attention_mass(
    py: Python<'_>,
    query: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    ids: &Bound<'_, PyAny>,
) -> PyResult<f64> {
    let ka = float_array(keys, "keys")?;
    let keys = ka.rows_f32("keys", Shape::Matrix, None)?;
    if keys.rows == 0 {
        return Err(value_error(
            "keys: expected at least one row, got shape (0, d)",
        ));
    }
    let qa = float_array(query, "query")?;
    let q = qa.rows_f32("query", Shape::Vectors, Some(keys.dim))?;
    let ia = id_array(ids, "ids")?;
    let (ib, ik, ids) = id_rows(&ia, "ids")?;
    if ia.ndim() != if q.one_d { 1 } else { 2 } || ib != q.rows {
        return Err(value_error(format!(
            "ids: expected one row per query ({} {}), got shape {}",
            q.rows,
            if q.one_d {
                "query, 1-D"
            } else {
                "queries, 2-D"
            },
            shape_str(ia.shape())
        )));
    }
    if q.rows == 0 {
        return Err(value_error(
            "query: expected at least one row, got shape (0, d)",
        ));
    }
    if let Some(&bad) = ids.iter().find(|&&i| i < -1 || i >= keys.rows as i64) {
        return Err(value_error(format!(
            "ids: {bad} is out of range for {} keys (valid: 0..{}, −1 for padding)",
            keys.rows, keys.rows
        )));
    }
    let (d, kd): (usize, &[f32]) = (keys.dim, &keys.data);
    let qd: &[f32] = &q.data;
    let total: f64 = py.detach(|| {
        qd.chunks_exact(d)
            .enumerate()
            .map(|(r, query)| {
                let w = qkindex::eval::softmax_weights(query, kd, d);
                qkindex::eval::mass(&w, &valid(&ids[r * ik..(r + 1) * ik]))
            })
            .sum()
    });
    Ok(total / q.rows as f64)
}

/// Times single-query searches inside Rust: `rounds` passes over `queries` (`[b, d]` or
/// `[d]`), one scratch and output reused, no Python in the loop. Returns each call's wall time
/// in nanoseconds, in call order: the reference the Python call overhead is measured against.
#[pyfunction]
#[pyo3(name = "_search_latency_ns", signature = (index, queries, k=100, ef=None, rounds=1))]
pub fn search_latency_ns(
    py: Python<'_>,
    index: &Bound<'_, PyAny>,
    queries: &Bound<'_, PyAny>,
    k: i64,
    ef: Option<i64>,
    rounds: i64,
) -> PyResult<Vec<f64>> {
    let index = any_index(index)?;
    let k = count("k", k, 1)?;
    let rounds = count("rounds", rounds, 1)?;
    let params = SearchParams {
        ef: ef.map(|e| count("ef", e, 1)).transpose()?,
        ..SearchParams::default()
    };
    let qa = float_array(queries, "queries")?;
    let q = qa.rows_f32("queries", Shape::Vectors, Some(index.dim()))?;
    let (data, d): (&[f32], usize) = (&q.data, q.dim);
    py.detach(|| {
        let mut scratch = index.new_scratch();
        let mut out = SearchOutput::default();
        let mut times = Vec::with_capacity(rounds * q.rows);
        for _ in 0..rounds {
            for query in data.chunks_exact(d) {
                let t = Instant::now();
                index.search_into(query, k, &params, &mut scratch, &mut out)?;
                times.push(t.elapsed().as_nanos() as f64);
            }
        }
        Ok(times)
    })
    .map_err(crate::errors::to_py)
}

/// The default build parameters of `AttentionIndex` in the Rust core, as a dict (the Python
/// signature's defaults are tested against it).
#[pyfunction(name = "_attention_defaults")]
pub fn attention_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    to_py_json(py, &AttentionParams::default())
}
