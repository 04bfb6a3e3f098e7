//! The CUDA plumbing both GPU backends share, this crate's [`CudaKnn`](crate::CudaKnn) and the
//! driver's model backend: opening a device, loading a compiled module's kernels, streams,
//! cuBLAS, timing events and launch shapes. Each helper wraps one cudarc call (or a few) and
//! returns [`GpuError`], so neither backend spells out the error mapping again.
//!
//! ```text
//!  open_device(ordinal) ──► context ──► kernels::compile(..) ──► load_kernels(ctx, ptx, names)
//!                              │
//!                              └──► new_stream ──► cublas(stream) (when cublas_present())
//!  per launch: launch_config(grid, block, smem), grid_1d(n, block); record(stream) … elapsed_ms
//! ```

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;

use crate::{GpuError, Result};

/// Opens CUDA device `ordinal` for this crate's kernels (compute capability 8.0 or newer);
/// returns the context and the compute capability. Fails with [`GpuError::Unavailable`] and the
/// reason where there is no usable GPU.
pub fn open_device(ordinal: usize) -> Result<(Arc<CudaContext>, (i32, i32))> {
    // SAFETY: probes whether the driver library loads; no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::Unavailable(
            "the CUDA driver library (libcuda.so) is not installed".to_string(),
        ));
    }
    let count = CudaContext::device_count()
        .map_err(|e| GpuError::Unavailable(format!("the CUDA driver reports {e:?}")))?;
    if ordinal >= count.max(0) as usize {
        return Err(GpuError::Unavailable(format!(
            "device cuda:{ordinal} requested, {count} CUDA device(s) present"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::cuda("opening the device", e))?;
    let capability = ctx
        .compute_capability()
        .map_err(|e| GpuError::cuda("reading the compute capability", e))?;
    if capability.0 < 8 {
        return Err(GpuError::Unavailable(format!(
            "compute capability {}.{}: the kernels need 8.0 or newer (mma.sync m16n8k16)",
            capability.0, capability.1
        )));
    }
    Ok((ctx, capability))
}

/// The GPU's name as the driver reports it ("NVIDIA H200"; "unknown" when it will not say).
pub fn device_name(ctx: &CudaContext) -> String {
    ctx.name().unwrap_or_else(|_| "unknown".to_string())
}

/// Loads `ptx` (compiled from `file`, for the error messages) into `ctx` and returns its entry
/// points `names`, in order.
pub fn load_kernels<const N: usize>(
    ctx: &Arc<CudaContext>,
    ptx: Ptx,
    file: &'static str,
    names: [&'static str; N],
) -> Result<[CudaFunction; N]> {
    let module = ctx
        .load_module(ptx)
        .map_err(|e| GpuError::cuda("loading a kernel module", (file, e)))?;
    let mut functions = Vec::with_capacity(N);
    for name in names {
        let f = module
            .load_function(name)
            .map_err(|e| GpuError::cuda("loading a kernel", (file, name, e)))?;
        functions.push(f);
    }
    functions.try_into().map_err(|_| GpuError::Cuda {
        what: "loading a kernel",
        reason: format!("{file}: expected {N} kernels"),
    })
}

/// A new stream on `ctx`.
pub fn new_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    ctx.new_stream()
        .map_err(|e| GpuError::cuda("creating a stream", e))
}

/// Whether the cuBLAS library can be loaded (from `LD_LIBRARY_PATH` or the system).
pub fn cublas_present() -> bool {
    // SAFETY: probes whether the cuBLAS library loads; no symbol is called.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// A cuBLAS handle whose calls run on `stream` (check [`cublas_present`] first: without the
/// library cudarc cannot load its symbols).
pub fn cublas(stream: &Arc<CudaStream>) -> Result<CudaBlas> {
    CudaBlas::new(stream.clone()).map_err(|e| GpuError::cuda("cuBLAS init", e))
}

/// Records a timed event on `stream`.
pub fn record(stream: &CudaStream) -> Result<CudaEvent> {
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| GpuError::cuda("recording an event", e))
}

/// Milliseconds between two recorded events.
pub fn elapsed_ms(a: &CudaEvent, b: &CudaEvent) -> Result<f64> {
    a.elapsed_ms(b)
        .map(f64::from)
        .map_err(|e| GpuError::cuda("reading an event", e))
}

/// A launch of `grid` blocks (x, y; each at least 1) of `block` threads with
/// `shared_mem_bytes` of dynamic shared memory.
pub fn launch_config(grid: (u32, u32), block: u32, shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0.max(1), grid.1.max(1), 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes,
    }
}

/// Blocks of `block` threads for `n` items, one item per thread (1 to 65,535 blocks; kernels
/// launched so loop over the items a grid does not cover).
pub fn grid_1d(n: usize, block: usize) -> u32 {
    n.div_ceil(block.max(1)).clamp(1, 65_535) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_the_items_within_the_limit() {
        assert_eq!(grid_1d(0, 256), 1);
        assert_eq!(grid_1d(256, 256), 1);
        assert_eq!(grid_1d(257, 256), 2);
        assert_eq!(grid_1d(usize::MAX / 2, 256), 65_535);
        let cfg = launch_config((0, 3), 128, 64);
        assert_eq!(
            (cfg.grid_dim, cfg.block_dim, cfg.shared_mem_bytes),
            ((1, 3, 1), (128, 1, 1), 64)
        );
    }

    #[test]
    fn without_a_gpu_open_device_says_why() {
        match open_device(0) {
            Ok((ctx, cc)) => println!("GPU present: {} (sm_{}{})", device_name(&ctx), cc.0, cc.1),
            Err(e) => {
                println!("skipped: {e}");
                assert!(matches!(e, GpuError::Unavailable(_)), "{e}");
            }
        }
    }
}
