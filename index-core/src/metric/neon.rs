//! aarch64 kernels: Advanced SIMD (NEON), four f32 lanes per register.
//!
//! The kernels sum in exactly the order of the AVX-512 ones (`x86.rs`): a 16-lane AVX-512
//! register is four NEON registers here, so each kernel keeps two accumulators of 4 × 4 lanes,
//! steps 32 values at a time, then one 16-value step into the first, adds the two, and reduces
//! the 16 lanes in [`hsum16`]'s tree, the AVX-512 `hsum512` tree. Both fuse each multiply-add
//! (FMLA here, VFMADD there) and convert f16 exactly, so an inner product is the same bits on an
//! AVX-512 CPU and an ARM one, and indexes built and searched on either return the same ids. The
//! f32 tail (below 16 values) is the AVX-512 masked step: one more step into the second
//! accumulator on zero-padded copies; the f16 tail is the same scalar loop.
//!
//! NEON is part of every aarch64 CPU that runs Linux, but the set is still handed out only after
//! `is_aarch64_feature_detected!("neon")`, as the x86 sets are after their checks. f16 keys are
//! widened by FCVTL/FCVTL2 (base Advanced SIMD, no FEAT_FP16 needed) through inline assembly,
//! because Rust's f16 NEON intrinsics are not stable.

use super::loops::{gather_rows, range_rows};
use super::Kernels;
use half::f16;
use std::arch::aarch64::*;
use std::arch::asm;

/// The SIMD kernel sets this CPU supports, best first.
pub(super) fn available() -> Vec<Kernels> {
    let mut out = Vec::new();
    if std::arch::is_aarch64_feature_detected!("neon") {
        // SAFETY: neon was just detected.
        out.push(unsafe { neon_kernels() });
    }
    out
}

kernel_set!(
    /// The NEON kernels (4 lanes per register, 16 per step; the AVX-512 summation order).
    neon_kernels, "neon", "neon",
    f32: (dot_f32_neon, range: single),
    f16: (dot_f16_neon, range: single),
);

/// Sixteen f32 lanes as four NEON registers: the shape of one AVX-512 register.
type V16 = [float32x4_t; 4];

/// Defines `unsafe fn $name(a: &[f32], b: &[$t]) -> f32`, `a · b` in the AVX-512 order (module
/// doc): `$load` reads 16 values of `b` as f32; with `masked`, the tail below 16 values is one
/// zero-padded step into the second accumulator, else a scalar loop after the reduction.
macro_rules! dot_kernel {
    ($(#[$doc:meta])* $name:ident($t:ty), $load:ident $(, $masked:ident)?) => {
        $(#[$doc])*
        #[target_feature(enable = "neon")]
        unsafe fn $name(a: &[f32], b: &[$t]) -> f32 {
            let n = a.len().min(b.len());
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            let zero = [vdupq_n_f32(0.0); 4];
            let (mut acc0, mut acc1) = (zero, zero);
            let mut i = 0;
            // SAFETY: every load reads 16 values at i..i+16 <= n of both slices.
            unsafe {
                while i + 32 <= n {
                    acc0 = fma16(acc0, load16_f32(pa.add(i)), $load(pb.add(i)));
                    acc1 = fma16(acc1, load16_f32(pa.add(i + 16)), $load(pb.add(i + 16)));
                    i += 32;
                }
                if i + 16 <= n {
                    acc0 = fma16(acc0, load16_f32(pa.add(i)), $load(pb.add(i)));
                    i += 16;
                }
            }
            $(
                if i < n {
                    acc1 = $masked(&a[i..n], &b[i..n], acc1);
                    i = n;
                }
            )?
            let mut s = hsum16(add16(acc0, acc1));
            while i < n {
                s += a[i] * f32::from(b[i]);
                i += 1;
            }
            s
        }
    };
}

dot_kernel!(
    /// `a · b` for f32 slices (AVX-512 order, f32 tail as its masked step).
    dot_f32_neon(f32), load16_f32, fma16_padded
);
dot_kernel!(
    /// `a · b` with `b` in f16 (AVX-512 order, scalar tail as there).
    dot_f16_neon(f16), load16_f16
);

/// `acc + x · y`, lane by lane, each a fused multiply-add (FMLA).
#[target_feature(enable = "neon")]
#[inline]
fn fma16(acc: V16, x: V16, y: V16) -> V16 {
    [
        vfmaq_f32(acc[0], x[0], y[0]),
        vfmaq_f32(acc[1], x[1], y[1]),
        vfmaq_f32(acc[2], x[2], y[2]),
        vfmaq_f32(acc[3], x[3], y[3]),
    ]
}

#[target_feature(enable = "neon")]
#[inline]
fn add16(x: V16, y: V16) -> V16 {
    [
        vaddq_f32(x[0], y[0]),
        vaddq_f32(x[1], y[1]),
        vaddq_f32(x[2], y[2]),
        vaddq_f32(x[3], y[3]),
    ]
}

/// `acc + a · b` over the first `a.len()` (< 16) lanes, the others adding `0 · 0` (as the
/// AVX-512 masked loads give zeros there).
#[target_feature(enable = "neon")]
#[inline]
fn fma16_padded(a: &[f32], b: &[f32], acc: V16) -> V16 {
    let (mut x, mut y) = ([0.0f32; 16], [0.0f32; 16]);
    let len = a.len().min(b.len()).min(16);
    x[..len].copy_from_slice(&a[..len]);
    y[..len].copy_from_slice(&b[..len]);
    // SAFETY: `x` and `y` hold 16 floats each.
    unsafe { fma16(acc, load16_f32(x.as_ptr()), load16_f32(y.as_ptr())) }
}

/// Sixteen floats at `p`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn load16_f32(p: *const f32) -> V16 {
    // SAFETY: the caller vouches for 16 floats at `p`; the loads are unaligned.
    unsafe {
        [
            vld1q_f32(p),
            vld1q_f32(p.add(4)),
            vld1q_f32(p.add(8)),
            vld1q_f32(p.add(12)),
        ]
    }
}

/// Sixteen halves at `p`, converted exactly to f32.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn load16_f16(p: *const f16) -> V16 {
    // SAFETY: the caller vouches for 16 halves (32 bytes) at `p`; f16 is a 2-byte plain value.
    let (lo, hi) = unsafe { (vld1q_u16(p.cast()), vld1q_u16(p.add(8).cast())) };
    [widen_low(lo), widen_high(lo), widen_low(hi), widen_high(hi)]
}

/// Halves 0–3 of `h` (f16 bit patterns) as f32 (FCVTL).
#[target_feature(enable = "neon")]
#[inline]
fn widen_low(h: uint16x8_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: FCVTL reads and writes only the named vector registers.
    unsafe {
        asm!(
            "fcvtl {out:v}.4s, {h:v}.4h",
            out = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    out
}

/// Halves 4–7 of `h` (f16 bit patterns) as f32 (FCVTL2).
#[target_feature(enable = "neon")]
#[inline]
fn widen_high(h: uint16x8_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: FCVTL2 reads and writes only the named vector registers.
    unsafe {
        asm!(
            "fcvtl2 {out:v}.4s, {h:v}.8h",
            out = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    out
}

/// Sum of the 16 lanes in the AVX-512 `hsum512` tree: lane j + lane j+8, then j + j+4, then
/// (0 + 2) + (1 + 3).
#[target_feature(enable = "neon")]
#[inline]
fn hsum16(v: V16) -> f32 {
    let t = vaddq_f32(vaddq_f32(v[0], v[2]), vaddq_f32(v[1], v[3]));
    let p = vadd_f32(vget_low_f32(t), vget_high_f32(t));
    vget_lane_f32::<0>(p) + vget_lane_f32::<1>(p)
}
