//! The instruction-set level that the hot loops compiled more than once (the graph's beam
//! search, the scans' candidate selection) run at on this CPU, detected once. Those loops are
//! plain Rust compiled with each level's features enabled; this only picks the version.

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopIsa {
    Baseline,
    Avx2,
    Avx512,
}

/// True when the loops compiled for AVX-512 ([`loop_isa`]) run on this CPU.
#[cfg(target_arch = "x86_64")]
pub fn avx512_loops() -> bool {
    loop_isa() == LoopIsa::Avx512
}

/// The best compiled version of the search loop for this CPU, detected once.
#[cfg(target_arch = "x86_64")]
pub fn loop_isa() -> LoopIsa {
    static ISA: std::sync::OnceLock<LoopIsa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
            && std::is_x86_feature_detected!("bmi1")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("popcnt")
            && std::is_x86_feature_detected!("lzcnt");
        let avx512 = avx2
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl");
        if avx512 {
            LoopIsa::Avx512
        } else if avx2 {
            LoopIsa::Avx2
        } else {
            LoopIsa::Baseline
        }
    })
}
