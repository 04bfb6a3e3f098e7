//! `qkindex._native`: the compiled half of the `qkindex` Python package (DESIGN.md §4).
//!
//! | file | job |
//! |---|---|
//! | `errors.rs` | `FormatError` and the mapping of [`qkindex::Error`] to Python exceptions |
//! | `arrays.rs` | numpy / tensor inputs (dtype, shape, strides, finiteness) and numpy outputs |
//! | `run.rs` | running long work off the GIL, interruptible with Ctrl-C |
//! | `index.rs` | `AttentionIndex`, `FlatIndex`; what every kind's build and `save` share; `load` |
//! | `search.rs` | `SearchResult`, the batched search of every kind, the pooled search buffers, `search_many` |
//! | `build.rs` | `build(spec, keys, ...)`: any kind from one spec string |
//! | `device.rs` | the `device` argument of builds: the exact-kNN backend, `knn_device` |
//! | `kinds.rs` | `HnswIndex`, `IvfIndex`, `VamanaIndex` |
//! | `retopk.rs` | `ReTopK`, the selector that reuses similar past queries' top-k sets |
//! | `functions.rs` | `exact_topk`, `recall`, `attention_mass`, timing helpers |
//! | `dump.rs` | `Dump`, `load_dump`, `validate_dump` |
//!
//! The pure-Python package `qkindex/` re-exports these names and adds `write_dump`.
//! Every entry point takes its arguments under the GIL (checks, and a copy only where the input
//! is not a C-contiguous float16/float32 array or must be owned), then releases the GIL for the
//! work itself.

mod arrays;
mod build;
mod device;
mod dump;
mod errors;
mod functions;
mod index;
mod kinds;
mod retopk;
mod run;
mod search;

use pyo3::prelude::*;

/// The native module. Python users import `qkindex`, which re-exports everything here.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FormatError", py.get_type::<errors::FormatError>())?;
    m.add_class::<index::AttentionIndex>()?;
    m.add_class::<index::FlatIndex>()?;
    m.add_class::<kinds::HnswIndex>()?;
    m.add_class::<kinds::IvfIndex>()?;
    m.add_class::<kinds::VamanaIndex>()?;
    m.add_class::<search::SearchResult>()?;
    m.add_class::<retopk::ReTopK>()?;
    m.add_function(wrap_pyfunction!(index::load, m)?)?;
    m.add_function(wrap_pyfunction!(build::build, m)?)?;
    m.add_function(wrap_pyfunction!(search::search_many, m)?)?;
    m.add_class::<dump::Dump>()?;
    m.add_function(wrap_pyfunction!(functions::exact_topk, m)?)?;
    m.add_function(wrap_pyfunction!(device::knn_device, m)?)?;
    m.add_function(wrap_pyfunction!(functions::recall, m)?)?;
    m.add_function(wrap_pyfunction!(functions::attention_mass, m)?)?;
    m.add_function(wrap_pyfunction!(functions::search_latency_ns, m)?)?;
    m.add_function(wrap_pyfunction!(functions::attention_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(index::decode_default_build, m)?)?;
    m.add_function(wrap_pyfunction!(dump::load_dump, m)?)?;
    m.add_function(wrap_pyfunction!(dump::validate_dump, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
