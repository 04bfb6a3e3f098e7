//! GPU exact top-k by inner product for building `qkindex` indexes.
//!
//! Building the query-aware graph needs every training query's exact top-`kq` keys: an `m × n`
//! inner-product matrix and a row-wise top-k. [`CudaKnn`] computes it on an NVIDIA GPU and
//! implements [`qkindex::KnnBackend`], so any index builds with it unchanged.
//!
//! | module | contents |
//! |---|---|
//! | [`device`] | `--device auto\|cpu\|cuda[:N]`: [`Device`], [`select`] with the CPU fallback |
//! | [`cuda`] | [`CudaKnn`]: a fused tensor-core score+select kernel, cuBLAS GEMM tiles then select, or whole-row GEMM then radix select (any k) |
//! | [`calibrate`] | `auto`'s path choice: every runnable path timed once per (device, dimension, k class), the fastest cached |
//! | [`compare`] | GPU results against the CPU reference, allowing f16 near-ties at rank k |
//! | [`kernels`] | the CUDA C sources (`kernels/topk.cu`, `kernels/llama.cu`) and their NVRTC compilation |
//! | [`runtime`] | the CUDA plumbing shared with the driver's model backend: devices, kernels, streams, cuBLAS, events, launch shapes |
//!
//! cudarc loads the CUDA libraries at run time, so this crate builds and its tests run on machines
//! without CUDA; there "no GPU" is [`GpuError::Unavailable`] with the reason, never a crash.
//!
//! Results match [`qkindex::CpuKnn`]: ids best first, `KnnResult::PAD` padding for causal rows,
//! and f32 scores. The GPU ranks by f16 inputs with f32 accumulation; by default the chosen ids are
//! rescored exactly in f32 on the host and re-sorted ([`CudaKnnOptions::rescore`]), so the scores
//! equal the CPU's and the sets differ only where f16 rounding reorders near-ties at rank k.

pub mod calibrate;
pub mod compare;
pub mod cuda;
pub mod device;
pub mod kernels;
pub mod runtime;

pub use compare::{compare, Comparison};
pub use cuda::{CudaKnn, CudaKnnOptions, KernelPath, Timings};
/// The cudarc version this crate uses, for the driver's CUDA backend.
pub use cudarc;
pub use device::{select, Device, Selected};
pub use runtime::open_device;

/// Errors of the GPU backend.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable GPU: no driver library, no device, or a library the backend needs is missing.
    #[error("no usable GPU: {0}")]
    Unavailable(String),
    /// A CUDA driver, cuBLAS or launch call failed.
    #[error("CUDA error in {what}: {reason}")]
    Cuda { what: &'static str, reason: String },
    /// NVRTC could not compile the kernels (the log is included).
    #[error("NVRTC could not compile {name}: {log}")]
    Compile { name: &'static str, log: String },
    /// The input cannot run on the GPU as given (the message says what to do instead).
    #[error("invalid input for the GPU backend: {0}")]
    Input(String),
    /// The input failed the same checks as on the CPU.
    #[error(transparent)]
    Core(#[from] qkindex::Error),
}

impl GpuError {
    /// [`GpuError::Cuda`] for a failed call `what` (its error, a cudarc `DriverError` or
    /// cuBLAS status, goes into the reason).
    pub fn cuda(what: &'static str, e: impl std::fmt::Debug) -> Self {
        GpuError::Cuda {
            what,
            reason: format!("{e:?}"),
        }
    }
}

impl From<GpuError> for qkindex::Error {
    fn from(e: GpuError) -> Self {
        match e {
            GpuError::Core(e) => e,
            other => qkindex::Error::Backend {
                backend: "cuda".to_string(),
                reason: other.to_string(),
            },
        }
    }
}

/// `Result` with [`GpuError`].
pub type Result<T, E = GpuError> = std::result::Result<T, E>;
