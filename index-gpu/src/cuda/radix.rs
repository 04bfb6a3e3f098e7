//! The radix path, any k ≤ n: cuBLAS `GemmEx` writes whole rows of scores (every key a row
//! sees), `radix_select_rows` keeps each row's best k (unordered, as packed 64-bit keys) and
//! `sort_rows_desc` sorts them into the result lists, in the CPU's order (ties by id). What runs
//! (the keys each chunk sees, the GEMM, the buffer sizes, where the sort runs) is a
//! [`RadixPlan`], tested without a GPU.

use super::fused::{Chunk, Lists};
use super::gemm::gemm_f16_f32;
use super::plan::RadixPlan;
use super::Gpu;
use crate::kernels::RADIX_THREADS;
use crate::runtime::launch_config;
use crate::{GpuError, Result};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Scores `chunk`'s rows against every key they see into `tile` (capacity ≥ the plan's rows ×
/// cols f32, row-major with leading dimension cols), selects each row's top k through `packed`
/// (capacity ≥ rows × [`radix_slots`](crate::kernels::radix_slots)`(k)`) into `best` (rows × k).
/// Returns the GEMM time (ms).
pub(super) fn run_radix_select(
    gpu: &Gpu,
    chunk: &Chunk<'_>,
    tile: &mut CudaSlice<f32>,
    packed: &mut CudaSlice<u64>,
    best: Lists<'_>,
) -> Result<f64> {
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
    let blas = gpu
        .blas
        .as_ref()
        .ok_or_else(|| GpuError::Unavailable("cuBLAS is not loaded".to_string()))?;
    let plan = RadixPlan::new(rows, n, dp, row0, causal, k);
    plan.check_buffers(tile.len(), packed.len())?;
    let gemm_ms = gemm_f16_f32(gpu, blas, &plan.gemm, keys, q, &mut *tile)?;

    let (ld, rows_i, cols_i, row0_i) = (plan.ld as i64, rows as i32, plan.cols as i32, row0 as i32);
    let (causal_i, k_i, slots_i) = (causal as i32, k as i32, plan.slots as i32);
    let cfg = launch_config((rows as u32, 1), RADIX_THREADS, 0);
    let mut l = gpu.compute.launch_builder(&gpu.radix_select);
    l.arg(&*tile)
        .arg(&ld)
        .arg(&rows_i)
        .arg(&cols_i)
        .arg(&row0_i)
        .arg(&causal_i)
        .arg(&k_i)
        .arg(&slots_i)
        .arg(&mut *packed);
    // SAFETY: `radix_select_rows(scores, ld, rows, cols, row0, causal, k, kp, packed)`: the tile
    // holds rows × ld f32 (ld = cols), packed rows × kp u64 (`check_buffers` above).
    unsafe { l.launch(cfg) }.map_err(|e| GpuError::cuda("launching radix_select_rows", e))?;

    // Sorted in shared memory when a row's slots fit the block's opt-in limit, else in place.
    let sort_smem = plan.sort_smem(gpu.smem_optin);
    if let Some(smem) = sort_smem {
        gpu.radix_sort
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(|e| GpuError::cuda("setting the sort kernel's shared memory", e))?;
    }
    let in_smem_i = sort_smem.is_some() as i32;
    let cfg = launch_config(
        (rows as u32, 1),
        RADIX_THREADS,
        sort_smem.unwrap_or(0) as u32,
    );
    let mut l = gpu.compute.launch_builder(&gpu.radix_sort);
    l.arg(&mut *packed)
        .arg(&rows_i)
        .arg(&slots_i)
        .arg(&k_i)
        .arg(&in_smem_i)
        .arg(best.0)
        .arg(best.1);
    // SAFETY: `sort_rows_desc(packed, rows, kp, k, in_smem, best_s, best_i)`: packed holds rows ×
    // kp u64, the lists rows × k; with in_smem the block has kp × 8 bytes of dynamic shared memory.
    unsafe { l.launch(cfg) }.map_err(|e| GpuError::cuda("launching sort_rows_desc", e))?;
    Ok(gemm_ms)
}
