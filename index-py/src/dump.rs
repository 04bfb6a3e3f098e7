//! Dumps (DESIGN.md §4): `load_dump` opens a dump directory, `validate_dump` says everything
//! that is wrong with one. The writer is pure Python (`qkindex.write_dump`), and checks what
//! it wrote with `validate_dump`.

use crate::arrays::to_numpy;
use crate::errors::{to_py, value_error};
use crate::index::to_py_json;
use pyo3::prelude::*;
use qkindex::dump::{Dump as CoreDump, Part};

const PARTS: [(Part, &str, bool); 6] = [
    (Part::Q, "q", true),
    (Part::K, "k", true),
    (Part::V, "v", false),
    (Part::QDec, "qdec", false),
    (Part::KDec, "kdec", false),
    (Part::VDec, "vdec", false),
];

/// An opened dump directory: `manifest` (dict) and per-layer tensors as float32 numpy arrays
/// `[heads, tokens, head_dim]` (`q`, `k`, `v`, `qdec`, `kdec`, `vdec`).
#[derive(Debug)]
#[pyclass(frozen, module = "qkindex")]
pub struct Dump {
    inner: CoreDump,
}

impl Dump {
    fn read<'py>(&self, py: Python<'py>, layer: i64, part: Part) -> PyResult<Bound<'py, PyAny>> {
        let layer = usize::try_from(layer).map_err(|_| {
            value_error(format!(
                "layer: {layer} is not in the dump (layers {:?})",
                self.inner.manifest.layers
            ))
        })?;
        let t = py.detach(|| self.inner.read(layer, part)).map_err(to_py)?;
        let a = to_numpy(py, t.data, 1, 1, true)?;
        a.call_method1("reshape", ((t.heads, t.rows, t.dim),))
    }
}

#[pymethods]
impl Dump {
    /// The manifest, as a dict.
    #[getter]
    fn manifest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py_json(py, &self.inner.manifest)
    }

    /// The dump directory.
    #[getter]
    fn path(&self) -> String {
        self.inner.dir.display().to_string()
    }

    /// Model layer numbers present in the dump.
    #[getter]
    fn layers(&self) -> Vec<usize> {
        self.inner.manifest.layers.clone()
    }

    /// The KV head that query head `q_head` reads (GQA grouping).
    fn kv_head_of(&self, q_head: usize) -> PyResult<usize> {
        if q_head >= self.inner.manifest.n_q_heads {
            return Err(value_error(format!(
                "q_head: must be below n_q_heads = {}, got {q_head}",
                self.inner.manifest.n_q_heads
            )));
        }
        Ok(self.inner.manifest.kv_head_of(q_head))
    }

    /// True when the layer has the tensor `part` ("q", "k", "v", "qdec", "kdec", "vdec").
    fn has(&self, layer: usize, part: &str) -> PyResult<bool> {
        let p = PARTS
            .iter()
            .find(|(_, name, _)| *name == part)
            .ok_or_else(|| {
                value_error(format!(
                    "part: expected one of q, k, v, qdec, kdec, vdec, got {part:?}"
                ))
            })?;
        Ok(self.inner.has(layer, p.0))
    }

    /// Prefill queries `[n_q_heads, n_prefill, d]`, float32.
    fn q<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        self.read(py, layer, Part::Q)
    }

    /// Prefill keys `[n_kv_heads, n_prefill, d]`, float32.
    fn k<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        self.read(py, layer, Part::K)
    }

    /// Prefill values `[n_kv_heads, n_prefill, d]`, float32.
    fn v<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        self.read(py, layer, Part::V)
    }

    /// Decode-step queries `[n_q_heads, n_decode, d]`, float32.
    fn qdec<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        self.read(py, layer, Part::QDec)
    }

    /// Decode-step (or held-out) keys `[n_kv_heads, rows, d]`, float32.
    fn kdec<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        self.read(py, layer, Part::KDec)
    }

    /// Decode-step values `[n_kv_heads, rows, d]`, float32.
    fn vdec<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        self.read(py, layer, Part::VDec)
    }

    fn __repr__(&self) -> String {
        let m = &self.inner.manifest;
        format!(
            "Dump({:?}, model={:?}, layers={:?}, n_q_heads={}, n_kv_heads={}, head_dim={}, \
             n_prefill={}, n_decode={})",
            self.inner.dir.display().to_string(),
            m.model,
            m.layers,
            m.n_q_heads,
            m.n_kv_heads,
            m.head_dim,
            m.n_prefill,
            m.n_decode
        )
    }
}

/// Opens a dump directory (its manifest is checked now, each tensor when read). Raises
/// `FormatError` for a bad manifest, `FileNotFoundError` when there is none.
#[pyfunction]
pub fn load_dump(dir: std::path::PathBuf) -> PyResult<Dump> {
    Ok(Dump {
        inner: CoreDump::open(dir).map_err(to_py)?,
    })
}

/// Checks a dump directory completely (manifest, every tensor's presence, dtype, shape and
/// finiteness) and returns the list of problems, empty when the dump is valid.
#[pyfunction]
pub fn validate_dump(py: Python<'_>, dir: std::path::PathBuf) -> Vec<String> {
    py.detach(|| {
        let dump = match CoreDump::open(&dir) {
            Ok(d) => d,
            Err(e) => return vec![e.to_string()],
        };
        let m = &dump.manifest;
        let mut problems = Vec::new();
        if m.layers.is_empty() {
            problems.push("manifest.json: \"layers\" is empty".to_string());
        }
        if let Some(&top) = m.layers.iter().max() {
            if top >= m.n_layers {
                problems.push(format!(
                    "manifest.json: layer {top} is not below n_layers = {}",
                    m.n_layers
                ));
            }
        }
        if m.n_prefill == 0 {
            problems.push("manifest.json: n_prefill is 0".to_string());
        }
        for &layer in &m.layers {
            for (part, name, required) in PARTS {
                let required = required || (part == Part::QDec && m.n_decode > 0);
                let file = format!("layer{layer:02}.{name}.npy");
                if !dump.has(layer, part) {
                    if required {
                        problems.push(format!("{file}: missing (required)"));
                    }
                    continue;
                }
                match dump.read(layer, part) {
                    Err(e) => problems.push(e.to_string()),
                    Ok(t) if part == Part::QDec && t.rows != m.n_decode => problems.push(format!(
                        "{file}: {} decode rows, but the manifest says n_decode = {}",
                        t.rows, m.n_decode
                    )),
                    Ok(_) => {}
                }
            }
        }
        problems
    })
}
