//! The GEMM path: cuBLAS `GemmEx` (f16 inputs, f32 accumulate and output) writes a tile of
//! scores, `topk_select_tile` merges it into the running lists; and the GEMM rate probe.

use super::fused::{Chunk, Lists};
use super::plan::{key_end, score_gemm, spans, Gemm, Op};
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
        let g = score_gemm(size, (0, size), size);
        for rep in 0..=reps {
            let ms = gemm_f16_f32(&gpu, blas, &g, &a, &a, &mut c)?;
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
    let mut gemm_ms = 0.0;
    for (k0, cols) in spans(key_end(n, row0, rows, causal), key_tile) {
        let g = score_gemm(rows, (k0, cols), dp);
        gemm_ms += gemm_f16_f32(gpu, blas, &g, keys, q, &mut *tile)?;
        let (ld, rows_i, cols_i) = (g.ldc as i64, rows as i32, cols as i32);
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
        // best_i)`: the tile holds rows × ld f32 (ld = cols, checked by the GEMM), the lists
        // rows × k.
        unsafe { b.launch(cfg) }.map_err(|e| GpuError::cuda("launching topk_select_tile", e))?;
    }
    Ok(gemm_ms)
}

/// Runs `g` ([`score_gemm`]: its parameters, checked against the buffers) with f16 A and B
/// (as bits) and f32 C: C = op(A)·op(B) column-major, f32 accumulate. Returns the GEMM's time
/// (CUDA events, ms).
pub(super) fn gemm_f16_f32(
    gpu: &Gpu,
    blas: &CudaBlas,
    g: &Gemm,
    a: &CudaSlice<u16>,
    b: &CudaSlice<u16>,
    c: &mut CudaSlice<f32>,
) -> Result<f64> {
    use cudarc::cublas::sys::cudaDataType;
    use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
    let [m, n, k, lda, ldb, ldc] = g.checked((a.len(), b.len(), c.len()))?;
    let op = |o: Op| match o {
        Op::N => cublasOperation_t::CUBLAS_OP_N,
        Op::T => cublasOperation_t::CUBLAS_OP_T,
    };
    let e0 = record(&gpu.compute)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    {
        let (ap, _ra) = a.device_ptr(&gpu.compute);
        let (bp, _rb) = b.device_ptr(&gpu.compute);
        let (cp, _rc) = c.device_ptr_mut(&gpu.compute);
        let ap = ap + (g.a_offset * 2) as u64;
        let bp = bp + (g.b_offset * 2) as u64;
        // SAFETY: A, B and C hold the elements `g` reads and writes (`Gemm::checked` above);
        // alpha and beta are host f32 as CUBLAS_COMPUTE_32F expects.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                op(g.transa),
                op(g.transb),
                m,
                n,
                k,
                (&alpha as *const f32).cast(),
                ap as *const std::ffi::c_void,
                cudaDataType::CUDA_R_16F,
                lda,
                bp as *const std::ffi::c_void,
                cudaDataType::CUDA_R_16F,
                ldb,
                (&beta as *const f32).cast(),
                cp as *mut std::ffi::c_void,
                cudaDataType::CUDA_R_32F,
                ldc,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
        .map_err(|e| GpuError::cuda("cublasGemmEx", e))?;
    }
    let e1 = record(&gpu.compute)?;
    elapsed_ms(&e0, &e1)
}
