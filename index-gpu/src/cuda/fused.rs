//! A chunk of queries against the keys ([`Chunk`]), what both paths launch over; launches of the
//! list initialisation (`topk_init`) and of the fused score-and-select kernel
//! (`fused_score_topk`, tensor-core `mma.sync`, `dim ≤ 128`).

use super::Gpu;
use crate::kernels::{self, FUSED_BM, FUSED_THREADS};
use crate::runtime::{grid_1d, launch_config};
use crate::{GpuError, Result};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, PushKernelArg};

/// One chunk of queries scored against every key: the shape both paths' kernels take.
pub(super) struct Chunk<'a> {
    /// The chunk's query rows, f16 bits, padded to `dp` halves and to a multiple of
    /// [`FUSED_BM`] rows.
    pub q: &'a CudaSlice<u16>,
    /// Every key, f16 bits, padded likewise (rows to a multiple of `FUSED_BN`).
    pub keys: &'a CudaSlice<u16>,
    /// Query rows in the chunk.
    pub rows: usize,
    /// Keys.
    pub n: usize,
    /// Padded dimension.
    pub dp: usize,
    /// Global index of the chunk's first query (its position, for the causal mask).
    pub row0: usize,
    /// Query `i` sees keys `0..=i` only.
    pub causal: bool,
    pub k: usize,
}

/// The running top-k lists of a chunk's rows (`rows × k` scores and ids).
pub(super) type Lists<'a> = (&'a mut CudaSlice<f32>, &'a mut CudaSlice<u32>);

pub(super) fn launch_init(
    gpu: &Gpu,
    best_s: &mut CudaSlice<f32>,
    best_i: &mut CudaSlice<u32>,
) -> Result<()> {
    let count = best_s.len() as i64;
    let cfg = launch_config((grid_1d(best_s.len(), 256), 1), 256, 0);
    let mut b = gpu.compute.launch_builder(&gpu.init);
    b.arg(best_s).arg(best_i).arg(&count);
    // SAFETY: `topk_init(float*, unsigned*, long long)`: both lists hold `count` elements.
    unsafe { b.launch(cfg) }.map_err(|e| GpuError::cuda("launching topk_init", e))?;
    Ok(())
}

/// Scores `chunk` and keeps each row's top-k in `best` (initialised by [`launch_init`]).
pub(super) fn launch_fused(gpu: &Gpu, chunk: &Chunk<'_>, best: Lists<'_>) -> Result<()> {
    let Chunk {
        q,
        keys,
        rows,
        n,
        dp,
        row0,
        causal,
        k,
    } = *chunk;
    let smem = kernels::fused_smem_bytes(dp);
    gpu.fused
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| GpuError::cuda("setting the fused kernel's shared memory", e))?;
    let (m_i, n_i, dp_i, row0_i) = (rows as i32, n as i32, dp as i32, row0 as i32);
    let (causal_i, k_i) = (causal as i32, k as i32);
    let cfg = launch_config(
        (rows.div_ceil(FUSED_BM) as u32, 1),
        FUSED_THREADS,
        smem as u32,
    );
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
