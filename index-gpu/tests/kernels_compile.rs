//! `kernels/topk.cu` and `kernels/llama.cu` compile with NVRTC to PTX for the GPUs the crate targets. Needs only the
//! NVRTC library (the PyPI package `nvidia-cuda-nvrtc` ships it), not a GPU: CI installs it and
//! sets `QKINDEX_REQUIRE_NVRTC=1`, so there a missing library fails instead of skipping.

use qkindex_gpu::kernels::{
    compile_llama, compile_topk, nvrtc_present, LLAMA_FUNCTIONS, TOPK_FUNCTIONS,
};

#[path = "../../tests/support/skip.rs"]
mod skip;

#[test]
fn topk_kernels_compile_to_ptx() {
    if !nvrtc_present() {
        let required = std::env::var("QKINDEX_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "QKINDEX_REQUIRE_NVRTC=1 but libnvrtc.so.13 is not on LD_LIBRARY_PATH"
        );
        skip::skip(
            "libnvrtc.so.13 is not on the library path (set QKINDEX_REQUIRE_NVRTC=1 to require it)",
        );
        return;
    }
    // sm_90 (H100/H200), the target; sm_80 (A100), the oldest the mma.sync kernels support.
    for capability in [(9, 0), (8, 0)] {
        let ptx = compile_topk(capability)
            .unwrap_or_else(|e| panic!("compute_{}{}: {e}", capability.0, capability.1))
            .to_src();
        let target = format!(".target sm_{}{}", capability.0, capability.1);
        assert!(ptx.contains(&target), "PTX lacks `{target}`");
        for f in TOPK_FUNCTIONS {
            assert!(ptx.contains(&format!(".entry {f}(")), "PTX lacks entry {f}");
        }
        assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
        println!(
            "compute_{}{}: {} bytes of PTX",
            capability.0,
            capability.1,
            ptx.len()
        );
        let ptx = compile_llama(capability)
            .unwrap_or_else(|e| panic!("llama.cu, compute_{}{}: {e}", capability.0, capability.1))
            .to_src();
        for f in LLAMA_FUNCTIONS {
            assert!(
                ptx.contains(&format!(".entry {f}(")),
                "llama.cu PTX lacks entry {f}"
            );
        }
        println!(
            "llama.cu, compute_{}{}: {} bytes of PTX",
            capability.0,
            capability.1,
            ptx.len()
        );
    }
}
