//! The process's devices, chosen once by `--device auto|cpu|cuda[:N]`: the exact-kNN backend for
//! index builds, and the backend of the model's forward passes.
//!
//! The GPU is probed on first use, so commands that need neither never touch it. `auto` takes the
//! first GPU when one is usable and otherwise the CPU; either way the choice (and, for a fallback,
//! the reason) is logged once to stderr.

use qkindex::KnnBackend;
use qkindex_gpu::{Device, GpuError, Selected};
use std::sync::{Mutex, OnceLock};

/// The CPU until [`set_device`] says otherwise: library users and tests get the reference
/// backend; the `qkindex` binary sets its `--device` (default `auto`) at start.
static REQUESTED: Mutex<Device> = Mutex::new(Device::Cpu);
static SELECTED: OnceLock<Selected> = OnceLock::new();

/// Sets the device for later builds. Effective until the backend is first used.
pub fn set_device(device: Device) {
    if let Ok(mut d) = REQUESTED.lock() {
        *d = device;
    }
}

/// The backend for exact top-k in index builds. An explicit `cuda` request that cannot be met is
/// an error; `auto` never fails.
pub fn backend() -> Result<&'static dyn KnnBackend, GpuError> {
    if let Some(s) = SELECTED.get() {
        return Ok(s);
    }
    let device = REQUESTED.lock().map(|d| *d).unwrap_or(Device::Cpu);
    let selected = qkindex_gpu::select(device)?;
    let s = SELECTED.get_or_init(|| {
        eprintln!("exact kNN for index builds: {}", selected.describe());
        selected
    });
    Ok(s)
}

/// The backend for model forward passes under the requested device: `None` is the CPU. An
/// explicit `cuda` request that cannot be met is an error; `auto` falls back to the CPU.
pub fn model_backend() -> Result<Option<Box<dyn crate::model::Backend>>, crate::model::ModelError> {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    let device = REQUESTED.lock().map(|d| *d).unwrap_or(Device::Cpu);
    let log = |what: String| LOGGED.call_once(|| eprintln!("model forward passes: {what}"));
    let ordinal = match device {
        Device::Cpu => {
            log("cpu".to_string());
            return Ok(None);
        }
        Device::Auto => None,
        Device::Cuda(i) => Some(i),
    };
    match crate::model::cuda::CudaBackend::new(ordinal.unwrap_or(0)) {
        Ok(b) => {
            log(crate::model::Backend::name(&b));
            Ok(Some(Box::new(b)))
        }
        Err(e) if ordinal.is_none() => {
            log(format!("cpu (auto: {e})"));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
