//! [`CudaKnn`]: exact batched top-k on an NVIDIA GPU.
//!
//! Three paths, chosen per call ([`KernelPath`]):
//! - **fused** (`fused_score_topk`): each block scores 64 queries against all keys with
//!   tensor-core `mma.sync` and filters the scores in registers against each row's running k-th
//!   score, so the `m × n` score matrix never goes through memory. Needs `dim ≤ 128`.
//! - **gemm**: cuBLAS `GemmEx` (f16 inputs, f32 accumulate and output) writes a tile of scores,
//!   `topk_select_tile` filters it and merges into the running lists. Any dimension.
//! - **radix**: cuBLAS writes whole rows of scores (every visible key), `radix_select_rows` finds
//!   each row's k-th best by a byte-wise radix select and compacts the k, `sort_rows_desc` sorts
//!   them. Any k ≤ n (the two paths above keep running lists of at most
//!   [`LIST_MAX_K`](crate::kernels::LIST_MAX_K)), in the CPU's exact order, ties by id.
//!
//! Queries run in chunks on two streams: while the GPU computes chunk c, the next chunk's queries
//! are uploaded and the previous chunk's lists come back. Tiles are sized from free device memory.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`KernelPath`], [`CudaKnnOptions`], [`Timings`]; [`CudaKnn`]: options, the [`KnnBackend`] impl |
//! | `setup.rs` | compiling and loading the kernels, streams and cuBLAS ([`crate::runtime`]); path choice, chunk and tile sizes |
//! | `run.rs` | [`CudaKnn::run`]: the chunk loop over the two streams, downloads of finished chunks |
//! | `fused.rs` | [`Chunk`](fused::Chunk), a chunk of queries against the keys; launches of `topk_init` and `fused_score_topk` |
//! | `gemm.rs` | cuBLAS `GemmEx` tiles each followed by `topk_select_tile`; the GEMM rate probe |
//! | `radix.rs` | whole-row GEMM, then `radix_select_rows` and `sort_rows_desc` (any k ≤ n) |
//! | `plan.rs` | what runs, without a GPU: the GEMM's cuBLAS parameters, chunk and key-tile sizes, the radix path's buffers (pure, unit-tested) |
//! | `host.rs` | host side: padded f16 rows with range scaling, exact f32 rescoring, unscaling |
//!
//! ```text
//!  queries, keys ──host::pad_*──► f16 rows ──copy stream──► device
//!                                     │ per chunk of queries, on the compute stream:
//!                                     ▼ fused::launch_init, then fused::launch_fused | gemm::run_gemm_select
//!                                     │                          | radix::run_radix_select
//!                                     │ (the previous chunk's lists download meanwhile)
//!                                     ▼
//!                     host::rescore (exact f32) | host::unscale ──► KnnResult
//! ```

mod fused;
mod gemm;
mod host;
mod plan;
mod radix;
mod run;
mod setup;
mod timer;

use crate::runtime::record;
use crate::{GpuError, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use qkindex::{KeyStore, KnnBackend, KnnOptions, KnnResult};
use std::sync::{Arc, Mutex};

/// Which kernels compute the top-k.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelPath {
    /// Radix when k exceeds [`LIST_MAX_K`](crate::kernels::LIST_MAX_K); else fused when the
    /// dimension allows it (≤ 128), else GEMM.
    Auto,
    /// Scores and selection in one kernel (k ≤ 1,024, dim ≤ 128).
    Fused,
    /// cuBLAS GEMM tiles, then selection into running lists (k ≤ 1,024).
    Gemm,
    /// cuBLAS GEMM of whole rows, then a radix select and a sort: any k ≤ n.
    Radix,
}

/// Options of [`CudaKnn`].
#[derive(Clone, Debug)]
pub struct CudaKnnOptions {
    pub path: KernelPath,
    /// Rescore the chosen ids exactly in f32 on the host and re-sort them (default true). Without
    /// it the scores are the GPU's f16-input products.
    pub rescore: bool,
    /// Queries per chunk (0: chosen from the problem and free memory).
    pub query_chunk: usize,
}

impl Default for CudaKnnOptions {
    fn default() -> Self {
        CudaKnnOptions {
            path: KernelPath::Auto,
            rescore: true,
            query_chunk: 0,
        }
    }
}

/// Where the time of one [`CudaKnn::run`] went, in milliseconds. GPU intervals are CUDA events.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    /// The path that ran (`fused`, `gemm` or `radix`).
    pub path: String,
    /// With [`KernelPath::Auto`] choosing among several paths: what it measured and chose
    /// ([`crate::calibrate::Calibration::summary`]; measured on the first such call only).
    pub auto: Option<String>,
    /// Host conversion of queries and keys to padded f16.
    pub prepare_ms: f64,
    /// Host-to-device copies (copy stream).
    pub upload_ms: f64,
    /// Kernels only: the sum over chunks of the compute stream's busy intervals.
    pub kernel_ms: f64,
    /// Of `kernel_ms`, the cuBLAS GEMMs (gemm and radix paths).
    pub gemm_ms: f64,
    /// Device-to-host copies of the results.
    pub download_ms: f64,
    /// Exact f32 rescoring and re-sorting on the host.
    pub rescore_ms: f64,
    /// The whole call, host clock.
    pub wall_ms: f64,
    pub chunks: usize,
}

/// Exact top-k by inner product on one CUDA device. Implements [`KnnBackend`].
pub struct CudaKnn {
    name: String,
    device_name: String,
    options: CudaKnnOptions,
    gpu: Mutex<Gpu>,
}

impl std::fmt::Debug for CudaKnn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKnn")
            .field("name", &self.name)
            .field("device", &self.device_name)
            .field("options", &self.options)
            .finish()
    }
}

/// The device side of a [`CudaKnn`]: context, the two streams, cuBLAS and the loaded kernels.
struct Gpu {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    blas: Option<CudaBlas>,
    init: CudaFunction,
    select: CudaFunction,
    fused: CudaFunction,
    radix_select: CudaFunction,
    radix_sort: CudaFunction,
    /// Dynamic shared memory a block may opt into.
    smem_optin: usize,
}

impl Gpu {
    /// Copies `host` to the device on the copy stream, between two timed events (returned).
    fn upload(
        &self,
        host: &[u16],
        what: &'static str,
    ) -> Result<(CudaSlice<u16>, CudaEvent, CudaEvent)> {
        let e0 = record(&self.copy)?;
        let device = self
            .copy
            .clone_htod(host)
            .map_err(|e| GpuError::cuda(what, e))?;
        let e1 = record(&self.copy)?;
        Ok((device, e0, e1))
    }

    /// `len` zeros on the device, allocated on the compute stream.
    fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &'static str,
    ) -> Result<CudaSlice<T>> {
        self.compute
            .alloc_zeros::<T>(len)
            .map_err(|e| GpuError::cuda(what, e))
    }
}

impl CudaKnn {
    /// The same backend with other options.
    pub fn with_options(mut self, options: CudaKnnOptions) -> Self {
        self.options = options;
        self
    }

    /// Changes the options (kept: the device, the compiled kernels, cuBLAS).
    pub fn set_options(&mut self, options: CudaKnnOptions) {
        self.options = options;
    }

    /// The GPU's name as the driver reports it (for example "NVIDIA H200").
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Whether cuBLAS was found (the GEMM path needs it).
    pub fn has_cublas(&self) -> bool {
        self.lock().map(|g| g.blas.is_some()).unwrap_or(false)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Gpu>> {
        self.gpu
            .lock()
            .map_err(|_| GpuError::Unavailable("a previous GPU call panicked".to_string()))
    }
}

impl KnnBackend for CudaKnn {
    fn name(&self) -> String {
        format!("{} ({})", self.name, self.device_name)
    }

    fn topk(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        k: usize,
        options: &KnnOptions,
    ) -> qkindex::Result<KnnResult> {
        // The kernels mask causally by row position only; per-row visible counts (pooled GQA
        // queries, a key range after the sinks) run on the CPU reference instead.
        if options.visible.is_some() {
            return qkindex::CpuKnn.topk(queries, keys, k, options);
        }
        Ok(self.run(queries, keys, k, options)?.0)
    }
}
