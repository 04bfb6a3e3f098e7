//! The CUDA backend: the operations of the forward pass (`block.rs`, written once over
//! [`Backend`](crate::backend::Backend)) on a GPU.
//!
//! - Weights are uploaded once (f32, dequantized on the host at load) with the RoPE tables.
//! - Linear layers are cuBLAS SGEMMs; RMSNorm, RoPE, SwiGLU, the embedding gather, the residual
//!   adds, the KV-cache writes and attention are the kernels of `kernels/llama.cu` (NVRTC).
//! - The host [`KvCache`](crate::KvCache) stays canonical: every forward call downloads
//!   the new keys and values into it (policies and captures read it), and the device mirrors it,
//!   re-uploading when the host cache is another one or was changed elsewhere.
//! - A decode step with a retrieval policy: the GPU computes q/k/v and the attention over the
//!   policy's static positions (sink and window) as online-softmax parts, while the CPU searches
//!   the layer's indexes (the policy, rayon over heads); the policy then takes the GPU's parts
//!   ([`DecodeAttention::attend_split`](crate::DecodeAttention::attend_split)), attends
//!   the retrieved keys and merges exactly.
//!   [`CudaStats`] records how the two overlapped.
//!
//! Opening the device, loading the kernels, streams, cuBLAS, events and launch shapes are
//! [`qkindex_gpu::runtime`]'s, shared with the index builds' [`qkindex_gpu::CudaKnn`].
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`CudaBackend`]: the device and the forward and logits entry points |
//! | `call.rs` | the device's state (uploaded weights, cache mirrors, [`CudaStats`]) and `CudaCall`: the `Backend` of one forward call |
//! | `kernels.rs` | one launch per kernel of `kernels/llama.cu` and the cuBLAS SGEMM; [`KvView`](kernels::KvView); the cudarc error mapping |
//! | `probe.rs` | the attention kernels alone, for timing and checks (`qkindex gpu-check`) |

mod call;
mod kernels;
mod probe;

use std::sync::Mutex;
use std::time::Instant;

use qkindex_gpu::cudarc::driver::CudaSlice;
use qkindex_gpu::{runtime, GpuError};

use super::block::Pass;
use super::error::{ModelError, Result};
use super::weights::Weights;
pub use call::CudaStats;
use call::Inner;
pub(crate) use call::{CudaCall, DeviceModel};
use kernels::{Dev, Kernels};

/// One CUDA device running a model's forward passes (`ModelDevice::Cuda`); each call runs the
/// forward pass over a `CudaCall`, the [`Backend`](crate::backend::Backend) of that call.
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

    /// A forward call on this device (checked by the caller): uploads `model`'s weights on
    /// first use, mirrors `pass.cache`, and hands `run` (the layer loop) a [`CudaCall`], the
    /// device's copy of the weights and the pass.
    pub(crate) fn forward<'a, 'c>(
        &self,
        model: DeviceModel<'_>,
        pass: Pass<'a, 'c>,
        run: impl FnOnce(&mut CudaCall<'_>, &Weights<CudaSlice<f32>>, Pass<'a, 'c>) -> Result<Vec<f32>>,
    ) -> Result<Vec<f32>> {
        let wall = Instant::now();
        let mut guard = self.lock()?;
        guard.upload_weights(model)?;
        let ci = guard.mirror(pass.cache, model.cfg.n_layers)?;
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
            run(&mut call, &w.weights, pass)?
        };
        // The GPU queue is synchronous at the downloads: host intervals are real.
        stats.forward_calls += 1;
        stats.forward_ms += wall.elapsed().as_secs_f64() * 1e3;
        Ok(hidden)
    }

    /// The logits on this device: `run` (the layer loop's output head) on a [`CudaCall`]
    /// without a cache.
    pub(crate) fn logits(
        &self,
        model: DeviceModel<'_>,
        run: impl FnOnce(&mut CudaCall<'_>, &Weights<CudaSlice<f32>>) -> Result<Vec<f32>>,
    ) -> Result<Vec<f32>> {
        let mut guard = self.lock()?;
        guard.upload_weights(model)?;
        let Inner { dev, w, stats, .. } = &mut *guard;
        let w = w
            .as_ref()
            .ok_or_else(|| ModelError::DeviceState("weights not uploaded".into()))?;
        let mut call = CudaCall::new(dev, &w.ropes, None, stats, (0, 0), model.cfg.heads())?;
        run(&mut call, &w.weights)
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
