//! The devices of a run, chosen once by `--device auto|cpu|cuda[:N]` and passed explicitly (as
//! candle passes a `Device` to `Cache::new`): the exact-kNN backend of index builds
//! ([`Devices::knn`]) and the device of the model's forward passes ([`Devices::model_device`]).
//!
//! The `qkindex` binary builds one [`Devices`] from its flag in `main`; library users and tests
//! use [`Devices::cpu`] (also the [`Default`]), the reference backends. The GPU is probed on first
//! use, so commands that need neither never touch it. `auto` takes the first GPU when one is
//! usable and otherwise the CPU; either way each choice (and, for a fallback, the reason) is
//! logged once to stderr.

use std::sync::{Once, OnceLock};

use qkindex::{KeyStore, KnnBackend, KnnOptions, KnnResult};
use qkindex_gpu::{Device, GpuError, Selected};

use qkindex_model::cuda::CudaBackend;
use qkindex_model::{ModelDevice, ModelError};

/// Where index builds and forward passes run.
#[derive(Debug)]
pub struct Devices {
    requested: Device,
    knn: LazyKnn,
    model_logged: Once,
}

impl Default for Devices {
    fn default() -> Self {
        Devices::cpu()
    }
}

impl Devices {
    /// The devices of a `--device` request.
    pub fn from_flag(device: Device) -> Self {
        Devices {
            requested: device,
            knn: LazyKnn {
                requested: device,
                selected: OnceLock::new(),
            },
            model_logged: Once::new(),
        }
    }

    /// The CPU for everything.
    pub fn cpu() -> Self {
        Devices::from_flag(Device::Cpu)
    }

    /// The request these devices were built from.
    pub fn requested(&self) -> Device {
        self.requested
    }

    /// The backend for exact top-k in index builds. It selects its device at its first use
    /// (logging the choice); an explicit `cuda` request that cannot be met makes every call an
    /// error ([`qkindex::Error::Backend`]), `auto` never fails.
    pub fn knn(&self) -> &dyn KnnBackend {
        &self.knn
    }

    /// The device for model forward passes. An explicit `cuda` request that cannot be met is an
    /// error; `auto` falls back to the CPU.
    pub fn model_device(&self) -> Result<ModelDevice, ModelError> {
        let log = |what: String| {
            self.model_logged
                .call_once(|| eprintln!("model forward passes: {what}"))
        };
        let ordinal = match self.requested {
            Device::Cpu => {
                log("cpu".to_string());
                return Ok(ModelDevice::Cpu);
            }
            Device::Auto => None,
            Device::Cuda(i) => Some(i),
        };
        match CudaBackend::new(ordinal.unwrap_or(0)) {
            Ok(b) => {
                log(b.name());
                Ok(ModelDevice::Cuda(Box::new(b)))
            }
            Err(e) if ordinal.is_none() => {
                log(format!("cpu (auto: {e})"));
                Ok(ModelDevice::Cpu)
            }
            Err(e) => Err(e),
        }
    }
}

/// The kNN backend of a request, selected at its first use.
#[derive(Debug)]
struct LazyKnn {
    requested: Device,
    selected: OnceLock<Selected>,
}

impl LazyKnn {
    /// The selected backend (selecting and logging it on the first successful call).
    fn get(&self) -> Result<&Selected, GpuError> {
        if let Some(s) = self.selected.get() {
            return Ok(s);
        }
        let selected = qkindex_gpu::select(self.requested)?;
        Ok(self.selected.get_or_init(|| {
            eprintln!("exact kNN for index builds: {}", selected.describe());
            selected
        }))
    }
}

impl LazyKnn {
    /// [`LazyKnn::get`] as the library's error.
    fn backend(&self) -> qkindex::Result<&Selected> {
        self.get().map_err(|e| qkindex::Error::Backend {
            backend: self.requested.to_string(),
            reason: e.to_string(),
        })
    }
}

impl KnnBackend for LazyKnn {
    fn name(&self) -> String {
        match self.get() {
            Ok(s) => s.name(),
            Err(_) => format!("{} (unavailable)", self.requested),
        }
    }

    fn topk(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        k: usize,
        options: &KnnOptions,
    ) -> qkindex::Result<KnnResult> {
        self.backend()?.topk(queries, keys, k, options)
    }

    fn topk_among(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        ids: &[u32],
        k: usize,
        options: &KnnOptions,
    ) -> qkindex::Result<KnnResult> {
        self.backend()?.topk_among(queries, keys, ids, k, options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_cpu_for_builds_and_forward_passes() {
        let d = Devices::default();
        assert_eq!(d.requested(), Device::Cpu);
        assert_eq!(d.knn().name(), "cpu");
        assert!(matches!(d.model_device(), Ok(ModelDevice::Cpu)));
    }

    #[test]
    fn an_unmet_cuda_request_fails_at_use_not_at_construction() {
        let d = Devices::from_flag(Device::Cuda(7));
        let keys = KeyStore::from_f32(vec![1.0, 0.0, 0.0, 1.0], 2).expect("keys");
        match d.knn().topk(&[1.0, 0.0], &keys, 1, &KnnOptions::default()) {
            Ok(r) => println!("GPU present: {}", r.ids.len()),
            Err(e) => assert!(e.to_string().contains("cuda:7"), "{e}"),
        }
    }
}
