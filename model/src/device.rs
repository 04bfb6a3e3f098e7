//! Where a model's forward passes run: [`ModelDevice`], the CPU or one CUDA device. It sits
//! above the backends (it holds one) and below the layer loop (`llama.rs` dispatches on it).

use super::cuda::CudaBackend;

/// Where a model's forward passes run.
#[derive(Debug, Default)]
pub enum ModelDevice {
    /// The CPU code (`cpu.rs` over `ops.rs`), the reference every device is checked against.
    #[default]
    Cpu,
    /// One CUDA device.
    Cuda(Box<CudaBackend>),
}

impl ModelDevice {
    /// A short name for logs: "cpu", "cuda:0 (NVIDIA H200)".
    pub fn name(&self) -> String {
        match self {
            ModelDevice::Cpu => "cpu".to_string(),
            ModelDevice::Cuda(b) => b.name(),
        }
    }

    /// Counters of the device (time split, uploads) as JSON; `null` on the CPU.
    pub fn stats(&self) -> serde_json::Value {
        match self {
            ModelDevice::Cpu => serde_json::Value::Null,
            ModelDevice::Cuda(b) => serde_json::to_value(b.stats()).unwrap_or_default(),
        }
    }
}
