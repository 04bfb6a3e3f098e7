//! Launches of the list initialisation (`topk_init`) and of the fused score-and-select kernel
//! (`fused_score_topk`, tensor-core `mma.sync`, `dim ≤ 128`).

use super::Gpu;
use crate::kernels::{self, FUSED_BM, FUSED_THREADS};
use crate::{GpuError, Result};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

pub(super) fn launch_init(
    gpu: &Gpu,
    best_s: &mut CudaSlice<f32>,
    best_i: &mut CudaSlice<u32>,
) -> Result<()> {
    let count = best_s.len() as i64;
    let cfg = LaunchConfig {
        grid_dim: ((best_s.len().div_ceil(256)).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.compute.launch_builder(&gpu.init);
    b.arg(best_s).arg(best_i).arg(&count);
    // SAFETY: `topk_init(float*, unsigned*, long long)`: both lists hold `count` elements.
    unsafe { b.launch(cfg) }.map_err(|e| GpuError::cuda("launching topk_init", e))?;
    Ok(())
}

/// `shape` = (rows in the chunk, keys, padded dim, global index of the chunk's first query).
pub(super) fn launch_fused(
    gpu: &Gpu,
    q: &CudaSlice<u16>,
    keys: &CudaSlice<u16>,
    shape: (usize, usize, usize, usize),
    causal: bool,
    k: usize,
    best: (&mut CudaSlice<f32>, &mut CudaSlice<u32>),
) -> Result<()> {
    let (rows, n, dp, row0) = shape;
    let smem = kernels::fused_smem_bytes(dp);
    gpu.fused
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| GpuError::cuda("setting the fused kernel's shared memory", e))?;
    let (m_i, n_i, dp_i, row0_i) = (rows as i32, n as i32, dp as i32, row0 as i32);
    let (causal_i, k_i) = (causal as i32, k as i32);
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(FUSED_BM) as u32, 1, 1),
        block_dim: (FUSED_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let mut b = gpu.compute.launch_builder(&gpu.fused);
    b.arg(q)
        .arg(keys)
        .arg(&m_i)
        .arg(&n_i)
        .arg(&dp_i)
        .arg(&row0_i)
        .arg(&causal_i)
        .arg(&k_i)
        .arg(best.0)
        .arg(best.1);
    // SAFETY: `fused_score_topk(q, keys, m, n, dp, row0, causal, k, best_s, best_i)`: q holds
    // rows padded to a multiple of 64 × dp halves, keys n padded to 64 × dp, lists rows × k.
    unsafe { b.launch(cfg) }.map_err(|e| GpuError::cuda("launching fused_score_topk", e))?;
    Ok(())
}
