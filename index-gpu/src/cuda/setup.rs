//! Setting a [`CudaKnn`] up on a device ([`crate::runtime`]): the kernels compiled by NVRTC and
//! loaded, the streams and cuBLAS; then per call the kernel path and the chunk and tile sizes.

use super::{CudaKnn, CudaKnnOptions, Gpu, KernelPath};
use crate::kernels::{self, FUSED_BM, FUSED_BN, TOPK_FUNCTIONS};
use crate::runtime;
use crate::{GpuError, Result};
use cudarc::driver::sys::CUdevice_attribute;
use std::sync::Mutex;

impl CudaKnn {
    /// Opens device `ordinal`, compiles the kernels with NVRTC and loads them. Fails with
    /// [`GpuError::Unavailable`] (and the reason) where there is no usable GPU.
    pub fn new(ordinal: usize) -> Result<Self> {
        let (ctx, capability) = runtime::open_device(ordinal)?;
        let device_name = runtime::device_name(&ctx);
        let ptx = kernels::compile_topk(capability)?;
        let [init, select, fused] =
            runtime::load_kernels(&ctx, ptx, "kernels/topk.cu", TOPK_FUNCTIONS)?;
        let smem_optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| GpuError::cuda("reading the shared-memory limit", e))?
            .max(0) as usize;
        let compute = runtime::new_stream(&ctx)?;
        let copy = runtime::new_stream(&ctx)?;
        // cuBLAS is only needed by the GEMM path; without it the fused path still runs.
        let blas = if runtime::cublas_present() {
            Some(runtime::cublas(&compute)?)
        } else {
            None
        };
        Ok(CudaKnn {
            name: format!("cuda:{ordinal}"),
            device_name,
            options: CudaKnnOptions::default(),
            gpu: Mutex::new(Gpu {
                ctx,
                compute,
                copy,
                blas,
                init,
                select,
                fused,
                smem_optin,
            }),
        })
    }

    pub(super) fn resolve_path(&self, gpu: &Gpu, dp: usize) -> Result<KernelPath> {
        let fused_fits = dp <= 128 && kernels::fused_smem_bytes(dp) <= gpu.smem_optin;
        match self.options.path {
            KernelPath::Fused if !fused_fits => Err(GpuError::Input(format!(
                "the fused kernel needs dim ≤ 128 (padded {dp}); use the gemm path"
            ))),
            KernelPath::Gemm if gpu.blas.is_none() => Err(GpuError::Unavailable(
                "the GEMM path needs cuBLAS (libcublas.so.13), which is not on the library path"
                    .to_string(),
            )),
            KernelPath::Auto if fused_fits => Ok(KernelPath::Fused),
            KernelPath::Auto if gpu.blas.is_none() => Err(GpuError::Unavailable(format!(
                "dim {dp} needs the GEMM path, and cuBLAS (libcublas.so.13) is not on the \
                 library path"
            ))),
            KernelPath::Auto => Ok(KernelPath::Gemm),
            p => Ok(p),
        }
    }

    /// Queries per chunk: a quarter of the queries (so that copies overlap), at least 4,096 and
    /// at most 32,768, bounded by memory for the result lists.
    pub(super) fn query_chunk(
        &self,
        gpu: &Gpu,
        path: KernelPath,
        m: usize,
        n: usize,
        dp: usize,
        k: usize,
    ) -> Result<usize> {
        if self.options.query_chunk > 0 {
            return Ok(self.options.query_chunk.next_multiple_of(FUSED_BM));
        }
        let (free, _) = gpu
            .ctx
            .mem_get_info()
            .map_err(|e| GpuError::cuda("reading free memory", e))?;
        let keys_bytes = n.next_multiple_of(FUSED_BN) * dp * 2;
        let budget = free.saturating_sub(keys_bytes) / 4;
        // Per query: its f16 row, its result lists, and (gemm) a row of the score tile.
        let tile_row = if path == KernelPath::Gemm {
            4 * n.min(65_536)
        } else {
            0
        };
        let per_query = 2 * dp + 8 * k + tile_row;
        let by_memory = (budget / per_query.max(1)).max(FUSED_BM);
        let target = m.div_ceil(4).clamp(4096, 32_768);
        Ok(target.min(by_memory).next_multiple_of(FUSED_BM))
    }

    /// Keys per GEMM tile: the score tile (chunk × tile f32) takes at most a quarter of free memory
    /// and 4 GiB.
    pub(super) fn key_tile(&self, gpu: &Gpu, chunk: usize, n: usize) -> Result<usize> {
        let (free, _) = gpu
            .ctx
            .mem_get_info()
            .map_err(|e| GpuError::cuda("reading free memory", e))?;
        let budget = (free / 4).min(4 << 30);
        let cols = (budget / (4 * chunk)).max(256) / 256 * 256;
        Ok(cols.min(n.next_multiple_of(256)))
    }
}
