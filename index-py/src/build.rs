//! `build(spec, keys, ...)`: any index kind from one spec string (the core's [`IndexSpec`],
//! codes kinds included), returned as the typed class of its kind.

use crate::arrays::{float_array, Shape};
use crate::device::knn_backend;
use crate::errors::{to_py, value_error};
use crate::index::{keys_as, visible_counts, wrap_any};
use crate::run::interruptible;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};
use qkindex::IndexSpec;
use std::sync::Arc;

/// `spec` with `options` (keyword arguments named as spec keys, `_` for `-`) appended as
/// `key=value` pairs: `("ivf", {nlist: 361})` → `"ivf:nlist=361"`.
fn spec_with(spec: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let mut text = spec.trim().to_string();
    let Some(options) = options else {
        return Ok(text);
    };
    for (i, (name, value)) in options.iter().enumerate() {
        let name: String = name.extract()?;
        let value = if value.is_instance_of::<PyBool>() {
            if value.is_truthy()? { "true" } else { "false" }.to_string()
        } else {
            value.str()?.to_string()
        };
        let sep = match (i, text.contains(':')) {
            (0, false) => ':',
            _ => ',',
        };
        text.push(sep);
        text.push_str(&format!("{name}={value}"));
    }
    Ok(text)
}

/// Builds the index `spec` names (`"attention"`, `"ivf:codes=i8"`, `"hnsw-ip:m=32"`, ...; the
/// kinds and keys of the core's `IndexSpec`) over `keys` (`[n, d]`; stored as given, or as
/// `dtype`), from `train_queries` (`[m, d]`) for the kinds that learn from queries. Keyword
/// `options` are more spec keys (`nlist=361` is `"ivf:nlist=361"`). `visible` (one count per
/// training query) is read by causal attention builds; `device` runs their exact kNN. Returns
/// the index as its kind's class (`AttentionIndex`, `FlatIndex`, `HnswIndex`, `IvfIndex`,
/// `VamanaIndex`), whose `search` takes that kind's parameters. The GIL is released; Ctrl-C
/// interrupts.
#[pyfunction]
#[pyo3(signature = (spec, keys, train_queries=None, *, device="auto", dtype=None, visible=None, **options))]
#[allow(clippy::too_many_arguments)]
pub fn build(
    py: Python<'_>,
    spec: &str,
    keys: &Bound<'_, PyAny>,
    train_queries: Option<&Bound<'_, PyAny>>,
    device: &str,
    dtype: Option<&str>,
    visible: Option<Vec<i64>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let text = spec_with(spec, options)?;
    let spec: IndexSpec = text.parse().map_err(to_py)?;
    let knn = knn_backend(device)?;
    let visible = visible.map(visible_counts).transpose()?;
    let store = Arc::new(keys_as(keys, dtype)?);
    let tq = train_queries
        .map(|t| float_array(t, "train_queries"))
        .transpose()?;
    let train = tq
        .as_ref()
        .map(|t| t.rows_f32("train_queries", Shape::Matrix, Some(store.dim())))
        .transpose()?;
    let train: &[f32] = train.as_ref().map_or(&[], |t| &*t.data);
    if spec.needs_queries() && train.is_empty() {
        return Err(value_error(format!(
            "train_queries: {spec} builds from queries: expected [m, {}] with m ≥ 1",
            store.dim()
        )));
    }
    let index = interruptible(py, |cancel| {
        Ok(spec
            .build_visible(store, train, visible.as_deref(), &*knn, cancel)?
            .index)
    })?;
    wrap_any(py, index, &spec.to_string())
}
