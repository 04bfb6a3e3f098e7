//! Setting a [`CudaKnn`] up on a device ([`crate::runtime`]): the kernels compiled by NVRTC and
//! loaded, the streams and cuBLAS; then per call the kernel path, and the chunk and tile sizes
//! from free memory (the sizes themselves: [`super::plan`]).

use super::plan::{key_tile_cols, query_chunk_rows, Problem};
use super::{CudaKnn, CudaKnnOptions, Gpu, KernelPath};
use crate::kernels::{self, LIST_MAX_K, TOPK_FUNCTIONS};
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
        let [init, select, fused, radix_select, radix_sort] =
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
                radix_select,
                radix_sort,
                smem_optin,
            }),
        })
    }

    /// What the device can run for padded dimension `dp`.
    pub(super) fn capabilities(gpu: &Gpu, dp: usize) -> Capabilities {
        Capabilities {
            fused_fits: dp <= 128 && kernels::fused_smem_bytes(dp) <= gpu.smem_optin,
            has_blas: gpu.blas.is_some(),
        }
    }

    /// Queries per chunk ([`query_chunk_rows`]): the one asked for in the options, else from
    /// the problem and free device memory.
    pub(super) fn query_chunk(
        &self,
        gpu: &Gpu,
        path: KernelPath,
        m: usize,
        n: usize,
        dp: usize,
        k: usize,
    ) -> Result<usize> {
        let problem = Problem { path, m, n, dp, k };
        query_chunk_rows(&problem, self.options.query_chunk, || free_memory(gpu))
    }

    /// Keys per GEMM tile for chunks of `chunk` queries ([`key_tile_cols`]).
    pub(super) fn key_tile(&self, gpu: &Gpu, chunk: usize, n: usize) -> Result<usize> {
        Ok(key_tile_cols(free_memory(gpu)?, chunk, n))
    }
}

/// Free device memory, bytes.
fn free_memory(gpu: &Gpu) -> Result<usize> {
    let (free, _) = gpu
        .ctx
        .mem_get_info()
        .map_err(|e| GpuError::cuda("reading free memory", e))?;
    Ok(free)
}

/// What a device can run for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// The fused kernel's tiles fit the block's shared memory (and dim ≤ 128).
    pub fused_fits: bool,
    /// cuBLAS was found (the gemm and radix paths).
    pub has_blas: bool,
}

/// The paths a request allows for padded dimension `dp` and `k`: the one asked for (or an error
/// saying why it cannot run), or every path that can run for [`KernelPath::Auto`] (which then
/// measures them, [`crate::calibrate`]). The fused and gemm paths keep running lists of at most
/// [`LIST_MAX_K`]; the radix path takes any k.
pub(crate) fn candidates(
    requested: KernelPath,
    caps: Capabilities,
    dp: usize,
    k: usize,
) -> Result<Vec<KernelPath>> {
    let lists_fit = k <= LIST_MAX_K;
    let no_blas = |what: String| {
        GpuError::Unavailable(format!(
            "{what} needs cuBLAS (libcublas.so.13), which is not on the library path"
        ))
    };
    match requested {
        KernelPath::Fused | KernelPath::Gemm if !lists_fit => Err(GpuError::Input(format!(
            "k = {k} exceeds the {LIST_MAX_K} of the {} path's running lists; use the radix \
             (or auto) path",
            crate::calibrate::path_name(requested)
        ))),
        KernelPath::Fused if !caps.fused_fits => Err(GpuError::Input(format!(
            "the fused kernel needs dim ≤ 128 (padded {dp}); use the gemm path"
        ))),
        KernelPath::Gemm | KernelPath::Radix if !caps.has_blas => Err(no_blas(format!(
            "the {} path",
            crate::calibrate::path_name(requested)
        ))),
        KernelPath::Auto => {
            let mut paths = Vec::new();
            if lists_fit && caps.fused_fits {
                paths.push(KernelPath::Fused);
            }
            if caps.has_blas {
                if lists_fit {
                    paths.push(KernelPath::Gemm);
                }
                paths.push(KernelPath::Radix);
            }
            if paths.is_empty() {
                return Err(if lists_fit {
                    no_blas(format!("dim {dp}"))
                } else {
                    no_blas(format!("k = {k} (over {LIST_MAX_K}, the radix path)"))
                });
            }
            Ok(paths)
        }
        p => Ok(vec![p]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Capabilities = Capabilities {
        fused_fits: true,
        has_blas: true,
    };

    #[test]
    fn auto_measures_every_path_that_can_run() {
        use KernelPath::*;
        assert_eq!(
            candidates(Auto, ALL, 128, 100).expect("candidates"),
            [Fused, Gemm, Radix]
        );
        let wide = Capabilities {
            fused_fits: false,
            ..ALL
        };
        assert_eq!(
            candidates(Auto, wide, 208, 100).expect("candidates"),
            [Gemm, Radix]
        );
        // k over the running lists' limit: the radix path alone (no measurement needed).
        assert_eq!(
            candidates(Auto, ALL, 128, 16_000).expect("candidates"),
            [Radix]
        );
        assert_eq!(
            candidates(Auto, ALL, 128, 1025).expect("candidates"),
            [Radix]
        );
        assert_eq!(
            candidates(Auto, ALL, 128, 1024).expect("candidates"),
            [Fused, Gemm, Radix]
        );
        let no_blas = Capabilities {
            fused_fits: true,
            has_blas: false,
        };
        assert_eq!(
            candidates(Auto, no_blas, 64, 10).expect("candidates"),
            [Fused]
        );
    }

    #[test]
    fn explicit_paths_that_cannot_run_say_why() {
        use KernelPath::*;
        assert_eq!(candidates(Radix, ALL, 64, 5).expect("candidates"), [Radix]);
        assert_eq!(candidates(Gemm, ALL, 64, 1024).expect("candidates"), [Gemm]);
        let e = candidates(Fused, ALL, 64, 16_000)
            .expect_err("an error")
            .to_string();
        assert!(e.contains("radix"), "{e}");
        let e = candidates(Gemm, ALL, 64, 2000)
            .expect_err("an error")
            .to_string();
        assert!(e.contains("1024"), "{e}");
        let wide = Capabilities {
            fused_fits: false,
            ..ALL
        };
        assert!(candidates(Fused, wide, 208, 10).is_err());
        let no_blas = Capabilities {
            fused_fits: true,
            has_blas: false,
        };
        for (p, k) in [(Gemm, 10), (Radix, 10), (Auto, 16_000)] {
            let e = candidates(p, no_blas, 64, k).expect_err("an error");
            assert!(matches!(e, GpuError::Unavailable(_)), "{p:?}: {e}");
        }
        let e = candidates(
            Auto,
            Capabilities {
                fused_fits: false,
                has_blas: false,
            },
            208,
            10,
        );
        assert!(matches!(e, Err(GpuError::Unavailable(_))));
    }
}
