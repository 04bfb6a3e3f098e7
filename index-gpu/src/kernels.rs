//! The CUDA C kernels and their compilation by NVRTC.
//!
//! `kernels/topk.cu` is embedded with `include_str!` and compiled once per [`crate::CudaKnn`] for
//! the device's compute capability. It needs no CUDA header, so NVRTC alone compiles it: CI
//! compiles it to PTX on a machine without a GPU (`tests/kernels_compile.rs`).

use crate::{GpuError, Result};

/// Source of the top-k kernels (`kernels/topk.cu`).
pub const TOPK_SOURCE: &str = include_str!("../../kernels/topk.cu");

/// Source of the transformer kernels of the driver's CUDA backend (`kernels/llama.cu`).
pub const LLAMA_SOURCE: &str = include_str!("../../kernels/llama.cu");

/// Entry points of [`LLAMA_SOURCE`].
pub const LLAMA_FUNCTIONS: [&str; 11] = [
    "embed_gather",
    "rms_norm",
    "rope",
    "swiglu",
    "add_inplace",
    "kv_write",
    "attention_causal",
    "attention_partial_range",
    "attention_partial_ids",
    "partial_merge",
    "partial_merge2",
];

/// Entry points of [`TOPK_SOURCE`].
pub const TOPK_FUNCTIONS: [&str; 5] = [
    "topk_init",
    "topk_select_tile",
    "fused_score_topk",
    "radix_select_rows",
    "sort_rows_desc",
];

/// Query rows per block of the fused kernel (`FUSED_BM`); the host pads query rows to it.
pub const FUSED_BM: usize = 64;
/// Keys per step of the fused kernel (`FUSED_BN`); the host pads key rows to it.
pub const FUSED_BN: usize = 64;
/// Threads per block of the fused kernel (`FUSED_WARPS` warps).
pub const FUSED_THREADS: u32 = 4 * 32;
/// Candidates buffered per row in the fused kernel (`FUSED_CAP`).
const FUSED_CAP: usize = 128;
/// Rows (one warp each) per block of `topk_select_tile` (`SEL_WARPS`).
pub const SELECT_ROWS_PER_BLOCK: u32 = 8;
/// Largest k of the running-list kernels (`fused_score_topk`, `topk_select_tile`: the lists live
/// in global memory and the merge reads them with binary searches, so k is bounded only to keep
/// memory use predictable). Larger k runs on the radix path (`radix_select_rows`), any k ≤ n.
pub const LIST_MAX_K: usize = 1024;
/// Threads per block (one block per query row) of `radix_select_rows` and `sort_rows_desc`
/// (`RADIX_THREADS`).
pub const RADIX_THREADS: u32 = 256;

/// Slots per row of the radix path's packed keys: k rounded up to a power of two (the bitonic
/// sort's length).
pub fn radix_slots(k: usize) -> usize {
    k.max(1).next_power_of_two()
}

/// Dynamic shared memory of `sort_rows_desc` when a row of `slots` keys is sorted in shared
/// memory (else 0, sorted in place in device memory).
pub fn radix_sort_smem_bytes(slots: usize) -> usize {
    slots * 8
}

/// Dynamic shared memory of `fused_score_topk` for padded dimension `dp`.
pub fn fused_smem_bytes(dp: usize) -> usize {
    let tiles = (FUSED_BM + FUSED_BN) * (dp + 8) * 2;
    let candidates = FUSED_BM * FUSED_CAP * (4 + 4);
    let positions = 4 * FUSED_CAP * 4;
    let row_state = FUSED_BM * (4 + 4);
    tiles + candidates + positions + row_state
}

/// Whether the NVRTC library can be loaded (from `LD_LIBRARY_PATH` or the system).
pub fn nvrtc_present() -> bool {
    // SAFETY: loads the library by name to probe it; no symbol is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles [`TOPK_SOURCE`] to PTX for `compute_{major}{minor}` (for example `(9, 0)`).
pub fn compile_topk(capability: (i32, i32)) -> Result<cudarc::nvrtc::Ptx> {
    compile(TOPK_SOURCE, "kernels/topk.cu", capability)
}

/// Compiles [`LLAMA_SOURCE`] to PTX for `compute_{major}{minor}`.
pub fn compile_llama(capability: (i32, i32)) -> Result<cudarc::nvrtc::Ptx> {
    compile(LLAMA_SOURCE, "kernels/llama.cu", capability)
}

/// Compiles a kernel source (no headers) to PTX for `compute_{major}{minor}`.
pub fn compile(
    source: &str,
    name: &'static str,
    capability: (i32, i32),
) -> Result<cudarc::nvrtc::Ptx> {
    if !nvrtc_present() {
        return Err(GpuError::Unavailable(
            "the NVRTC library (libnvrtc.so.13) is not on the library path".to_string(),
        ));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![
            format!(
                "--gpu-architecture=compute_{}{}",
                capability.0, capability.1
            ),
            "-lineinfo".to_string(),
        ],
        name: Some(name.to_string()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| GpuError::Compile {
        name,
        log: compile_log(&e),
    })
}

fn compile_log(e: &cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_shared_memory_fits_an_sm90_block() {
        // sm_90 allows 227 KB of dynamic shared memory per block; the fused path runs for dp ≤ 128.
        assert!(fused_smem_bytes(128) <= 227 * 1024);
        assert!(fused_smem_bytes(64) < fused_smem_bytes(128));
    }

    #[test]
    fn radix_slots_are_the_next_power_of_two() {
        assert_eq!(radix_slots(1), 1);
        assert_eq!(radix_slots(1024), 1024);
        assert_eq!(radix_slots(16_000), 16_384);
        // A pooled kNN's 16,000 (16,384 slots) sorts in shared memory on sm_80 and sm_90.
        assert!(radix_sort_smem_bytes(radix_slots(16_000)) <= 163 * 1024);
    }

    #[test]
    fn source_defines_every_entry_point_and_matching_constants() {
        for f in TOPK_FUNCTIONS {
            assert!(
                TOPK_SOURCE.contains(&format!("{f}(")),
                "kernels/topk.cu lacks {f}"
            );
        }
        for (name, value) in [
            ("FUSED_BM", FUSED_BM),
            ("FUSED_BN", FUSED_BN),
            ("FUSED_CAP", FUSED_CAP),
            ("SEL_WARPS", SELECT_ROWS_PER_BLOCK as usize),
            ("RADIX_THREADS", RADIX_THREADS as usize),
        ] {
            let line = format!("#define {name} {value}");
            assert!(
                TOPK_SOURCE.contains(&line),
                "kernels/topk.cu: expected `{line}`"
            );
        }
    }
}
