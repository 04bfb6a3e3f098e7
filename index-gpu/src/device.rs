//! Choosing where exact kNN runs: `--device auto | cpu | cuda[:N]` (CLI) or `device=` (Python).

use crate::{CudaKnn, GpuError, Result};
use qkindex::{CpuKnn, KeyStore, KnnBackend, KnnOptions, KnnResult};
use std::str::FromStr;

/// A device request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The first GPU if one is usable, else the CPU (with the reason recorded).
    Auto,
    Cpu,
    /// CUDA device with this ordinal; an error where it is not usable.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = GpuError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(Device::Cuda(i)),
                _ => Err(GpuError::Input(format!(
                    "device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got {other:?}"
                ))),
            },
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The backend a [`Device`] request resolved to.
#[derive(Debug)]
pub enum Selected {
    Cpu {
        /// Why `auto` did not take a GPU (`None` when the CPU was asked for).
        fallback: Option<String>,
    },
    Cuda(Box<CudaKnn>),
}

impl Selected {
    /// Why `auto` fell back to the CPU, if it did.
    pub fn fallback_reason(&self) -> Option<&str> {
        match self {
            Selected::Cpu { fallback } => fallback.as_deref(),
            Selected::Cuda(_) => None,
        }
    }

    /// A one-line description for logs: "cuda:0 (NVIDIA H200)", "cpu", or
    /// "cpu (auto: no usable GPU: …)".
    pub fn describe(&self) -> String {
        match self {
            Selected::Cuda(g) => g.name(),
            Selected::Cpu { fallback: None } => "cpu".to_string(),
            Selected::Cpu {
                fallback: Some(reason),
            } => format!("cpu (auto: {reason})"),
        }
    }
}

impl KnnBackend for Selected {
    fn name(&self) -> String {
        match self {
            Selected::Cpu { .. } => CpuKnn.name(),
            Selected::Cuda(g) => g.name(),
        }
    }

    fn topk(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        k: usize,
        options: &KnnOptions,
    ) -> qkindex::Result<KnnResult> {
        match self {
            Selected::Cpu { .. } => CpuKnn.topk(queries, keys, k, options),
            Selected::Cuda(g) => g.topk(queries, keys, k, options),
        }
    }

    fn topk_among(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        ids: &[u32],
        k: usize,
        options: &KnnOptions,
    ) -> qkindex::Result<KnnResult> {
        match self {
            Selected::Cpu { .. } => CpuKnn.topk_among(queries, keys, ids, k, options),
            Selected::Cuda(g) => g.topk_among(queries, keys, ids, k, options),
        }
    }
}

/// Resolves a device request. `auto` never fails: without a usable GPU it returns the CPU with
/// the reason ([`Selected::fallback_reason`]); `cuda` fails with the reason instead.
pub fn select(device: Device) -> Result<Selected> {
    match device {
        Device::Cpu => Ok(Selected::Cpu { fallback: None }),
        Device::Cuda(i) => Ok(Selected::Cuda(Box::new(CudaKnn::new(i)?))),
        Device::Auto => match CudaKnn::new(0) {
            Ok(g) => Ok(Selected::Cuda(Box::new(g))),
            Err(e) => Ok(Selected::Cpu {
                fallback: Some(e.to_string()),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_names_and_rejects_others() {
        assert_eq!("auto".parse::<Device>().ok(), Some(Device::Auto));
        assert_eq!("cpu".parse::<Device>().ok(), Some(Device::Cpu));
        assert_eq!("cuda".parse::<Device>().ok(), Some(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>().ok(), Some(Device::Cuda(3)));
        for bad in ["", "CUDA", "cuda:", "cuda:x", "tpu"] {
            assert!(bad.parse::<Device>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn auto_always_yields_a_backend() {
        let s = select(Device::Auto).expect("auto never fails");
        match &s {
            Selected::Cpu { fallback } => {
                let reason = fallback.as_deref().expect("auto on the CPU says why");
                println!("auto chose the CPU: {reason}");
                assert!(!reason.is_empty());
            }
            Selected::Cuda(g) => println!("auto chose {}", g.name()),
        }
        let keys = KeyStore::from_f32(vec![1.0, 0.0, 0.0, 1.0, 2.0, 2.0], 2).expect("keys");
        let r = s
            .topk(&[1.0, 0.5], &keys, 2, &KnnOptions::default())
            .expect("topk");
        assert_eq!(r.row(0), &[2, 0]);
    }
}
