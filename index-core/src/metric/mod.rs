//! Inner-product kernels: an f32 query against f32 or f16 keys.
//!
//! | file | job |
//! |---|---|
//! | `scalar.rs` | portable reference kernels (the ground truth of the property tests) |
//! | `x86.rs` | AVX2+FMA+F16C and AVX-512 kernels |
//! | `affine.rs` | per-dimension offsets and ranges of int8 codes ([`affine::Affine`]) |
//! | `int8.rs` | int8 key codes: f32 × int8 rows, integer code estimates ([`int8::I8Kernels`]) |
//! | `x86_int8.rs` | their AVX2, AVX-512 and VNNI versions |
//! | `x86_groups.rs` | the x86 kernels of the interleaved code groups (scans, batched scans) |
//! | `neon.rs` | aarch64 Advanced SIMD (NEON) kernels, summing in the AVX-512 order |
//! | `loops.rs` | what the ISA files share: the kernel-set macro, gather and range loops, prefetch |
//!
//! The best kernel set is detected once per process ([`kernels`]) and kept as function pointers,
//! so a binary built for baseline x86-64 still uses AVX-512 where the CPU has it (and never
//! executes an instruction the CPU lacks). On aarch64 the NEON set is chosen the same way.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[macro_use]
mod loops;
pub mod affine;
pub mod int8;
pub mod isa;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_groups;
#[cfg(target_arch = "x86_64")]
mod x86_int8;

use half::f16;
use std::sync::OnceLock;

/// Inner product of an f32 query with one f32 key (both of the same length).
pub type DotF32 = fn(&[f32], &[f32]) -> f32;
/// Inner product of an f32 query with one f16 key (both of the same length).
pub type DotF16 = fn(&[f32], &[f16]) -> f32;
/// Scores of one query against the rows `ids` of a row-major key matrix (`dim` columns);
/// writes `out[i] = q · keys[ids[i]]`.
pub type GatherF32 = fn(&[f32], &[f32], usize, &[u32], &mut [f32]);
/// As [`GatherF32`] for f16 keys.
pub type GatherF16 = fn(&[f32], &[f16], usize, &[u32], &mut [f32]);
/// Scores of one query against consecutive rows: `out[i] = q · rows[i]` for a row-major
/// block of `out.len()` rows of `dim` columns.
pub type RangeF32 = fn(&[f32], &[f32], usize, &mut [f32]);
/// As [`RangeF32`] for f16 rows.
pub type RangeF16 = fn(&[f32], &[f16], usize, &mut [f32]);

/// One consistent set of kernels for the running CPU.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    /// Which instruction set the kernels use (`"avx512"`, `"avx2"`, `"neon"` or `"scalar"`).
    pub isa: &'static str,
    pub dot_f32: DotF32,
    pub dot_f16: DotF16,
    pub gather_f32: GatherF32,
    pub gather_f16: GatherF16,
    pub range_f32: RangeF32,
    pub range_f16: RangeF16,
}

impl Kernels {
    /// The portable reference kernels.
    pub fn scalar() -> Self {
        Kernels {
            isa: "scalar",
            dot_f32: scalar::dot_f32,
            dot_f16: scalar::dot_f16,
            gather_f32: scalar::gather_f32,
            gather_f16: scalar::gather_f16,
            range_f32: scalar::range_f32,
            range_f16: scalar::range_f16,
        }
    }

    /// Every kernel set the running CPU supports, best first (the scalar set last). Tests run
    /// each against the reference.
    pub fn available() -> Vec<Kernels> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        all.extend(x86::available());
        #[cfg(target_arch = "aarch64")]
        all.extend(neon::available());
        all.push(Kernels::scalar());
        all
    }
}

/// The best kernel set for this CPU, detected on first use.
pub fn kernels() -> &'static Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| {
        Kernels::available()
            .into_iter()
            .next()
            .unwrap_or_else(Kernels::scalar)
    })
}

/// Inner product of two f32 vectors with the best kernel.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    (kernels().dot_f32)(a, b)
}

/// Asks the CPU to bring the cache lines of `values` into L1 ahead of use (a hint: it never
/// faults and does nothing on targets without a prefetch instruction). Graph searches call it on
/// the neighbour list they will most likely read next, so that its miss overlaps current work.
#[inline(always)]
pub fn prefetch<T>(values: &[T]) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    loops::prefetch_slice(values);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = values;
}
