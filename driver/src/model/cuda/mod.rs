//! The CUDA backend: the operations of the forward pass (`block.rs`, written once over
//! [`Backend`](crate::model::backend::Backend)) on a GPU.
//!
//! - Weights are uploaded once (f32, dequantized on the host at load) with the RoPE tables.
//! - Linear layers are cuBLAS SGEMMs; RMSNorm, RoPE, SwiGLU, the embedding gather, the residual
//!   adds, the KV-cache writes and attention are the kernels of `kernels/llama.cu` (NVRTC).
//! - The host [`KvCache`](crate::model::KvCache) stays canonical: every forward call downloads
//!   the new keys and values into it (policies and captures read it), and the device mirrors it,
//!   re-uploading when the host cache is another one or was changed elsewhere.
//! - A decode step with a retrieval policy: the GPU computes q/k/v and the attention over the
//!   policy's static positions (sink and window) as online-softmax parts, while the CPU searches
//!   the layer's indexes (the policy, rayon over heads); the policy then takes the GPU's parts
//!   ([`DecodeAttention::attend_split`](crate::model::DecodeAttention::attend_split)), attends
//!   the retrieved keys and merges exactly.
//!   [`CudaStats`] records how the two overlapped.
//!
//! Opening the device, loading the kernels, streams, cuBLAS, events and launch shapes are
//! [`qkindex_gpu::runtime`]'s, shared with the index builds' [`qkindex_gpu::CudaKnn`].
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`CudaBackend`]: the device, its state, the forward and logits entry points; [`CudaStats`] |
//! | `kernels.rs` | one launch per kernel of `kernels/llama.cu` and the cuBLAS SGEMM; [`KvView`](kernels::KvView) |
//! | `call.rs` | weight upload, cache mirrors, and `CudaCall`: the `Backend` of one forward call |
//! | `probe.rs` | the attention kernels alone, for timing and checks (`qkindex gpu-check`) |

mod call;
mod kernels;
mod probe;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use qkindex_gpu::cudarc::driver::{CudaContext, CudaSlice, DriverError};
use qkindex_gpu::{runtime, GpuError};

use super::backend::Timings;
use super::error::{ModelError, Result};
use super::llama::{Llama, Pass};
use super::weights::Weights;
use call::CudaCall;
use kernels::{Dev, Kernels};

/// Keys per block of the split decode attention (`attention_partial_range`).
pub(super) const DECODE_CHUNK: usize = 256;
/// Device KV caches kept at once (distinct host caches, e.g. `full` and a policy side by side).
pub(super) const CACHES_KEPT: usize = 4;

/// Time split of decode steps on the CUDA backend (accumulated).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CudaStats {
    /// Decode steps with a retrieval policy (counted per layer).
    pub split_layer_steps: u64,
    /// GPU time of the static-part attention kernels (CUDA events), ms.
    pub gpu_static_ms: f64,
    /// Host time in the policy up to the moment it asked for the static parts (the search), ms.
    pub cpu_before_wait_ms: f64,
    /// Host time blocked waiting for the static parts, ms.
    pub wait_ms: f64,
    /// Host time of whole policy calls (search, wait, retrieved attention, merge), ms.
    pub policy_ms: f64,
    /// Forward calls and their host wall time, ms.
    pub forward_calls: u64,
    pub forward_ms: f64,
    /// Full uploads of a host cache to the device.
    pub cache_uploads: u64,
}

/// One CUDA device running a model's forward passes (`ModelDevice::Cuda`); each call runs the
/// forward pass over a `CudaCall`, the [`Backend`](crate::model::backend::Backend) of that call.
pub struct CudaBackend {
    name: String,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("name", &self.name)
            .finish()
    }
}

/// The model on the device: its weights and RoPE tables `(cos, sin)`.
struct DeviceWeights {
    weights: Weights<CudaSlice<f32>>,
    ropes: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
}

/// The device copy of a host cache: per layer, keys and values as the host holds them.
struct DevCache {
    id: u64,
    capacity: usize,
    len: usize,
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
}

struct Inner {
    _ctx: Arc<CudaContext>,
    dev: Dev,
    /// Uploaded on the first forward call (the model is known then).
    w: Option<DeviceWeights>,
    caches: Vec<DevCache>,
    stats: CudaStats,
}

/// Maps a failed cudarc call `what` to the model's error (a typed [`GpuError::Cuda`]).
pub(super) fn cuda(what: &'static str) -> impl Fn(DriverError) -> ModelError {
    move |e| GpuError::cuda(what, e).into()
}

impl CudaBackend {
    /// Opens CUDA device `ordinal`, compiles `kernels/llama.cu` and prepares cuBLAS. Weights are
    /// uploaded at the first forward call.
    pub fn new(ordinal: usize) -> Result<Self> {
        let (ctx, capability) = runtime::open_device(ordinal)?;
        let device = runtime::device_name(&ctx);
        let ptx = qkindex_gpu::kernels::compile_llama(capability)?;
        let f = Kernels::load(&ctx, ptx)?;
        if !runtime::cublas_present() {
            return Err(GpuError::Unavailable(
                "cuBLAS (libcublas.so.13) is not on the library path".to_string(),
            )
            .into());
        }
        let stream = runtime::new_stream(&ctx)?;
        let blas = runtime::cublas(&stream)?;
        Ok(CudaBackend {
            name: format!("cuda:{ordinal} ({device})"),
            inner: Mutex::new(Inner {
                _ctx: ctx,
                dev: Dev { stream, blas, f },
                w: None,
                caches: Vec::new(),
                stats: CudaStats::default(),
            }),
        })
    }

    /// A short name for logs: "cuda:0 (NVIDIA H200)".
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// The accumulated time split.
    pub fn stats(&self) -> CudaStats {
        self.inner
            .lock()
            .map(|g| g.stats.clone())
            .unwrap_or_default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| ModelError::DeviceState("a previous GPU call panicked".to_string()))
    }

    /// [`Llama::forward_with`] on this device (a checked call): uploads the weights on first use,
    /// mirrors the cache, and runs the forward pass over a [`CudaCall`].
    pub(crate) fn forward(&self, model: &Llama, pass: Pass<'_, '_>) -> Result<Vec<f32>> {
        let wall = Instant::now();
        let mut guard = self.lock()?;
        guard.upload_weights(model)?;
        let ci = guard.mirror(pass.cache, model)?;
        let Inner {
            dev,
            w,
            caches,
            stats,
            ..
        } = &mut *guard;
        let w = w
            .as_ref()
            .ok_or_else(|| ModelError::DeviceState("weights not uploaded".into()))?;
        let hidden = {
            let mut call = CudaCall::new(
                dev,
                &w.ropes,
                Some(&mut caches[ci]),
                stats,
                (pass.tokens.len(), pass.cache.len()),
                model.cfg.heads(),
            )?;
            model.forward_on(&mut call, &w.weights, pass)?
        };
        // The GPU queue is synchronous at the downloads: host intervals are real.
        stats.forward_calls += 1;
        stats.forward_ms += wall.elapsed().as_secs_f64() * 1e3;
        Ok(hidden)
    }

    /// [`Llama::logits`] on this device.
    pub(crate) fn logits(
        &self,
        model: &Llama,
        hidden: &[f32],
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        let mut guard = self.lock()?;
        guard.upload_weights(model)?;
        let Inner { dev, w, stats, .. } = &mut *guard;
        let w = w
            .as_ref()
            .ok_or_else(|| ModelError::DeviceState("weights not uploaded".into()))?;
        let mut call = CudaCall::new(dev, &w.ropes, None, stats, (0, 0), model.cfg.heads())?;
        model.logits_on(&mut call, &w.weights, hidden, timings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_new_is_a_clean_error() {
        match CudaBackend::new(0) {
            Ok(b) => println!("GPU present: {}", b.name()),
            Err(e) => {
                println!("skipped: {e}");
                assert!(e.to_string().contains("no usable GPU"), "{e}");
            }
        }
    }
}
