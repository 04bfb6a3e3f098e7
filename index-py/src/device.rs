//! The `device` argument of builds: which exact-kNN backend a build runs its top-k lists on,
//! opened once per process and device.

use crate::errors::value_error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use qkindex_gpu::{Device, GpuError, Selected};
use std::sync::{Arc, Mutex};

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
