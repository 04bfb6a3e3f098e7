//! The GEMM path: cuBLAS `GemmEx` (f16 inputs, f32 accumulate and output) writes a tile of
//! scores, `topk_select_tile` merges it into the running lists; and the GEMM rate probe.

use super::fused::{Chunk, Lists};
use super::{CudaKnn, Gpu};
use crate::kernels::SELECT_ROWS_PER_BLOCK;
use crate::runtime::{elapsed_ms, launch_config, record};
use crate::{GpuError, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::f16;

impl CudaKnn {
    /// Measured tensor-core rate of cuBLAS f16 GEMM (f32 accumulate and output) on `size³`,
    /// in TFLOP/s: the median of `reps` timed runs after one warm-up.
    pub fn gemm_tflops(&self, size: usize, reps: usize) -> Result<f64> {
        let gpu = self.lock()?;
        let blas = gpu.blas.as_ref().ok_or_else(|| {
            GpuError::Unavailable("cuBLAS (libcublas.so.13) is not on the library path".into())
        })?;
        let host: Vec<u16> = (0..size * size)
            .map(|i| f16::from_f32(((i * 7919 % 2003) as f32 / 2003.0) - 0.5).to_bits())
            .collect();
        let a = gpu
            .compute
            .clone_htod(&host)
            .map_err(|e| GpuError::cuda("uploading", e))?;
        let mut c = gpu.zeros::<f32>(size * size, "allocating")?;
        let mut times = Vec::with_capacity(reps);
        for rep in 0..=reps {
            let a = F16Rows { buf: &a, offset: 0 };
            let ms = gemm_f16_f32(&gpu, blas, (size, size, size), a, a, (&mut c, size))?;
            if rep > 0 {
                times.push(ms);
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
        Ok(2.0 * (size as f64).powi(3) / (median * 1e-3) / 1e12)
    }
}

/// GEMM tiles over the keys of `chunk`, each followed by the selection kernel into `best`;
/// `tile` is the score buffer and the keys per tile (its capacity holds `rows × keys` f32).
/// Returns the GEMM time (ms).
pub(super) fn run_gemm_select(
    gpu: &Gpu,
    chunk: &Chunk<'_>,
    (tile, key_tile): (&mut CudaSlice<f32>, usize),
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
    let key_end = if causal { n.min(row0 + rows) } else { n };
    let mut gemm_ms = 0.0;
    let mut k0 = 0;
    while k0 < key_end {
        let cols = key_tile.min(key_end - k0);
        let a = F16Rows {
            buf: keys,
            offset: k0 * dp,
        };
        let b = F16Rows { buf: q, offset: 0 };
        gemm_ms += gemm_f16_f32(gpu, blas, (cols, rows, dp), a, b, (&mut *tile, cols))?;
        let (ld, rows_i, cols_i) = (cols as i64, rows as i32, cols as i32);
        let (row0_i, col0_i, causal_i, k_i) = (row0 as i32, k0 as i32, causal as i32, k as i32);
        let cfg = launch_config(
            ((rows as u32).div_ceil(SELECT_ROWS_PER_BLOCK), 1),
            SELECT_ROWS_PER_BLOCK * 32,
            0,
        );
        let mut b = gpu.compute.launch_builder(&gpu.select);
        b.arg(&*tile)
            .arg(&ld)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(&row0_i)
            .arg(&col0_i)
            .arg(&causal_i)
            .arg(&k_i)
            .arg(&mut *best.0)
            .arg(&mut *best.1);
        // SAFETY: `topk_select_tile(scores, ld, rows, cols, row0, col0, causal, k, best_s,
        // best_i)`: the tile holds rows × ld f32 (ld = cols), the lists rows × k.
        unsafe { b.launch(cfg) }.map_err(|e| GpuError::cuda("launching topk_select_tile", e))?;
        k0 += cols;
    }
    Ok(gemm_ms)
}

/// Row-major f16 rows (as bits) in a device buffer, from element `offset`: a GEMM operand.
#[derive(Clone, Copy)]
pub(super) struct F16Rows<'a> {
    pub(super) buf: &'a CudaSlice<u16>,
    pub(super) offset: usize,
}

/// Column-major C (`m × n`, leading dimension `ldc`) = Aᵀ·B where A holds `m` rows of `k` halves
/// (row-major, i.e. column-major `k × m`), and B `n` rows of `k` halves. In row-major terms:
/// C (as `n × m`) = B·Aᵀ, the scores of B's rows against A's rows. Returns the GEMM's time
/// (CUDA events, ms).
pub(super) fn gemm_f16_f32(
    gpu: &Gpu,
    blas: &CudaBlas,
    (m, n, k): (usize, usize, usize),
    a: F16Rows<'_>,
    b: F16Rows<'_>,
    (c, ldc): (&mut CudaSlice<f32>, usize),
) -> Result<f64> {
    use cudarc::cublas::sys::cudaDataType;
    use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
    let e0 = record(&gpu.compute)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    {
        let (ap, _ra) = a.buf.device_ptr(&gpu.compute);
        let (bp, _rb) = b.buf.device_ptr(&gpu.compute);
        let (cp, _rc) = c.device_ptr_mut(&gpu.compute);
        let ap = ap + (a.offset * 2) as u64;
        let bp = bp + (b.offset * 2) as u64;
        // SAFETY: A holds ≥ a.offset + m·k halves, B ≥ b.offset + n·k, C ≥ ldc·n floats (by
        // the callers' tile sizes); alpha and beta are host f32 as CUBLAS_COMPUTE_32F expects.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                n as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                ap as *const std::ffi::c_void,
                cudaDataType::CUDA_R_16F,
                k as i32,
                bp as *const std::ffi::c_void,
                cudaDataType::CUDA_R_16F,
                k as i32,
                (&beta as *const f32).cast(),
                cp as *mut std::ffi::c_void,
                cudaDataType::CUDA_R_32F,
                ldc as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
        .map_err(|e| GpuError::cuda("cublasGemmEx", e))?;
    }
    let e1 = record(&gpu.compute)?;
    elapsed_ms(&e0, &e1)
}
