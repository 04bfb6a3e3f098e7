//! x86-64 kernels: AVX2+FMA+F16C (8 lanes) and AVX-512F (16 lanes).
//!
//! Each instruction set's inner products are `#[target_feature]` functions, written once by
//! `dot_kernel!` (and, for the four-row range blocks of AVX-512, `dot4_kernel!`);
//! `kernel_set!` (in `loops.rs`) builds a [`Kernels`] from them, with the gather and range loops compiled for
//! the same features. Those sets are only handed out by [`available`] after
//! `is_x86_feature_detected!` confirmed the features, so they never run on a CPU that lacks them.
//! Loads are unaligned and stay inside the slices (tails go scalar or masked).

use super::loops::{gather_blocks, gather_rows, range_rows};
use super::Kernels;
use half::f16;
use std::arch::x86_64::*;

/// The SIMD kernel sets this CPU supports, best first.
pub(super) fn available() -> Vec<Kernels> {
    let mut out = Vec::new();
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c") {
        // SAFETY: avx512f and f16c were just detected (avx512f implies avx2 and fma).
        out.push(unsafe { avx512_kernels() });
    }
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        // SAFETY: avx2, fma and f16c were just detected.
        out.push(unsafe { avx2_kernels() });
    }
    out
}

/// Defines `unsafe fn $name(a: &[f32], b: &[$t]) -> f32`, `a · b` in `$w`-lane vectors: two
/// accumulators over steps of `2·$w` lanes, one more `$w`-lane step into the first, the two
/// added and reduced by `$hsum`, then the scalar tail. With `masked: $fma`, the tail is instead
/// one masked step `$fma` into the second accumulator before the reduction.
macro_rules! dot_kernel {
    (
        $(#[$doc:meta])*
        $name:ident($t:ty), $features:literal, lanes $w:literal,
        $zero:ident, $fmadd:ident, $add:ident, $hsum:ident, $load_a:ident, $load_b:ident
        $(, masked: $masked:ident)?
    ) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        unsafe fn $name(a: &[f32], b: &[$t]) -> f32 {
            let n = a.len().min(b.len());
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            let mut acc0 = $zero();
            let mut acc1 = $zero();
            let mut i = 0;
            // SAFETY: every full load reads `$w` values at i..i+$w <= n of both slices; the masked
            // tail reads only the lanes below n - i.
            unsafe {
                while i + 2 * $w <= n {
                    acc0 = $fmadd($load_a(pa.add(i)), $load_b(pb.add(i)), acc0);
                    acc1 = $fmadd($load_a(pa.add(i + $w)), $load_b(pb.add(i + $w)), acc1);
                    i += 2 * $w;
                }
                if i + $w <= n {
                    acc0 = $fmadd($load_a(pa.add(i)), $load_b(pb.add(i)), acc0);
                    i += $w;
                }
                $(
                    if i < n {
                        acc1 = $masked(pa.add(i), pb.add(i), n - i, acc1);
                        i = n;
                    }
                )?
            }
            let mut s = $hsum($add(acc0, acc1));
            while i < n {
                s += a[i] * f32::from(b[i]);
                i += 1;
            }
            s
        }
    };
}

/// Defines `unsafe fn $name(q: &[f32], rows: &[$t], dim: usize, out: &mut [f32])`: the AVX-512
/// scores of four consecutive rows (`rows` holds `4 · dim` values, `dim` a multiple of 16), each
/// summed exactly as the one-row kernel sums it (the same steps, and [`hsum512x4`]'s tree).
macro_rules! dot4_kernel {
    ($(#[$doc:meta])* $name:ident($t:ty), $load:ident) => {
        $(#[$doc])*
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $name(q: &[f32], rows: &[$t], dim: usize, out: &mut [f32]) {
            debug_assert!(dim.is_multiple_of(16) && rows.len() >= 4 * dim && q.len() >= dim);
            let (pq, pr) = (q.as_ptr(), rows.as_ptr());
            let z = _mm512_setzero_ps();
            let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
            let (mut b0, mut b1, mut b2, mut b3) = (z, z, z, z);
            let mut i = 0;
            // SAFETY: every load reads 16 values at i..i+16 <= dim of q and of one of the four
            // rows.
            unsafe {
                let k = |j: usize| $load(pr.add(j));
                while i + 32 <= dim {
                    let (x, y) = (_mm512_loadu_ps(pq.add(i)), _mm512_loadu_ps(pq.add(i + 16)));
                    a0 = _mm512_fmadd_ps(x, k(i), a0);
                    b0 = _mm512_fmadd_ps(y, k(i + 16), b0);
                    a1 = _mm512_fmadd_ps(x, k(dim + i), a1);
                    b1 = _mm512_fmadd_ps(y, k(dim + i + 16), b1);
                    a2 = _mm512_fmadd_ps(x, k(2 * dim + i), a2);
                    b2 = _mm512_fmadd_ps(y, k(2 * dim + i + 16), b2);
                    a3 = _mm512_fmadd_ps(x, k(3 * dim + i), a3);
                    b3 = _mm512_fmadd_ps(y, k(3 * dim + i + 16), b3);
                    i += 32;
                }
                if i + 16 <= dim {
                    let x = _mm512_loadu_ps(pq.add(i));
                    a0 = _mm512_fmadd_ps(x, k(i), a0);
                    a1 = _mm512_fmadd_ps(x, k(dim + i), a1);
                    a2 = _mm512_fmadd_ps(x, k(2 * dim + i), a2);
                    a3 = _mm512_fmadd_ps(x, k(3 * dim + i), a3);
                }
            }
            hsum512x4(
                _mm512_add_ps(a0, b0),
                _mm512_add_ps(a1, b1),
                _mm512_add_ps(a2, b2),
                _mm512_add_ps(a3, b3),
                out,
            );
        }
    };
}

/// Defines `unsafe fn $name(q: &[f32], rows: [&[$t]; 4], out: &mut [f32])`: the AVX2 scores
/// of four rows of `q.len()` values (a multiple of 8; each row at least as long), written to
/// `out[..4]`, each summed exactly as the one-row kernel (`dot_kernel!` with 8 lanes) sums it:
/// the same steps into the same two accumulators, and [`hsum256x4`]'s tree. One query load
/// serves four rows, and one reduction four scores.
macro_rules! dot4_avx2_kernel {
    ($name:ident($t:ty), $load:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(q: &[f32], rows: [&[$t]; 4], out: &mut [f32]) {
            let dim = q.len();
            assert!(dim.is_multiple_of(8) && rows.iter().all(|r| r.len() >= dim) && out.len() >= 4);
            let pq = q.as_ptr();
            let [p0, p1, p2, p3] = rows.map(|r| r.as_ptr());
            let z = _mm256_setzero_ps();
            let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
            let (mut b0, mut b1, mut b2, mut b3) = (z, z, z, z);
            let mut i = 0;
            // SAFETY: every load reads 8 values at i..i+8 <= dim of q and of one of the four
            // rows (each holds at least dim values, asserted above).
            unsafe {
                while i + 16 <= dim {
                    let (x, y) = (_mm256_loadu_ps(pq.add(i)), _mm256_loadu_ps(pq.add(i + 8)));
                    a0 = _mm256_fmadd_ps(x, $load(p0.add(i)), a0);
                    b0 = _mm256_fmadd_ps(y, $load(p0.add(i + 8)), b0);
                    a1 = _mm256_fmadd_ps(x, $load(p1.add(i)), a1);
                    b1 = _mm256_fmadd_ps(y, $load(p1.add(i + 8)), b1);
                    a2 = _mm256_fmadd_ps(x, $load(p2.add(i)), a2);
                    b2 = _mm256_fmadd_ps(y, $load(p2.add(i + 8)), b2);
                    a3 = _mm256_fmadd_ps(x, $load(p3.add(i)), a3);
                    b3 = _mm256_fmadd_ps(y, $load(p3.add(i + 8)), b3);
                    i += 16;
                }
                if i + 8 <= dim {
                    let x = _mm256_loadu_ps(pq.add(i));
                    a0 = _mm256_fmadd_ps(x, $load(p0.add(i)), a0);
                    a1 = _mm256_fmadd_ps(x, $load(p1.add(i)), a1);
                    a2 = _mm256_fmadd_ps(x, $load(p2.add(i)), a2);
                    a3 = _mm256_fmadd_ps(x, $load(p3.add(i)), a3);
                }
            }
            hsum256x4(
                _mm256_add_ps(a0, b0),
                _mm256_add_ps(a1, b1),
                _mm256_add_ps(a2, b2),
                _mm256_add_ps(a3, b3),
                out,
            );
        }
    };
}

// ---------------------------------------------------------------- AVX2 + FMA + F16C

kernel_set!(
    /// The AVX2 + FMA + F16C kernels (8 lanes).
    avx2_kernels, "avx2", "avx2,fma,f16c",
    f32: (dot_f32_avx2, range: single, gather: rows4(dot4_f32_avx2)),
    f16: (dot_f16_avx2, range: single, gather: rows4(dot4_f16_avx2)),
);

dot_kernel!(
    dot_f32_avx2(f32), "avx2,fma,f16c", lanes 8,
    _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_add_ps, hsum256, _mm256_loadu_ps, _mm256_loadu_ps
);
dot_kernel!(
    dot_f16_avx2(f16), "avx2,fma,f16c", lanes 8,
    _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_add_ps, hsum256, _mm256_loadu_ps, load8_f16
);

dot4_avx2_kernel!(dot4_f32_avx2(f32), _mm256_loadu_ps);
dot4_avx2_kernel!(dot4_f16_avx2(f16), load8_f16);

/// Eight halves at `p`, converted to f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8_f16(p: *const f16) -> __m256 {
    // SAFETY: the caller vouches for 8 halves (16 bytes) at `p`; f16 is a 2-byte plain value.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn hsum256(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// [`hsum256`] of four vectors at once, written to `out[..4]`: per row `s = lo + hi` (four
/// lanes), then `(s0 + s2) + (s1 + s3)`, the one-row tree (additions commute exactly).
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum256x4(v0: __m256, v1: __m256, v2: __m256, v3: __m256, out: &mut [f32]) {
    // [s0 | s1] and [s2 | s3]: each 128-bit half is one row's lo + hi.
    let x01 = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(v0, v1),
        _mm256_permute2f128_ps::<0x31>(v0, v1),
    );
    let x23 = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(v2, v3),
        _mm256_permute2f128_ps::<0x31>(v2, v3),
    );
    // Half 0: (s0[0] + s0[2], s0[1] + s0[3], s2[0] + s2[2], s2[1] + s2[3]); half 1: rows 1, 3.
    let t = _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(x01, x23),
        _mm256_shuffle_ps::<0b11_10_11_10>(x01, x23),
    );
    // Half 0: (row 0, row 2, ..); half 1: (row 1, row 3, ..).
    let u = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(t, t),
        _mm256_shuffle_ps::<0b11_01_11_01>(t, t),
    );
    let picked = _mm256_permutevar8x32_ps(u, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
    let mut four = [0.0f32; 4];
    // SAFETY: `four` holds 4 floats, the width of one unaligned 128-bit store.
    unsafe { _mm_storeu_ps(four.as_mut_ptr(), _mm256_castps256_ps128(picked)) };
    out[..4].copy_from_slice(&four);
}

// ---------------------------------------------------------------- AVX-512F

kernel_set!(
    /// The AVX-512F kernels (16 lanes; range scans four rows per step).
    avx512_kernels, "avx512", "avx512f,avx2,fma,f16c",
    f32: (dot_f32_avx512, range: blocks(dot4_f32_avx512)),
    f16: (dot_f16_avx512, range: blocks(dot4_f16_avx512)),
);

dot_kernel!(
    dot_f32_avx512(f32), "avx512f,avx2,fma,f16c", lanes 16,
    _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_add_ps, hsum512, _mm512_loadu_ps, _mm512_loadu_ps,
    masked: fma16_masked
);
dot_kernel!(
    dot_f16_avx512(f16), "avx512f,avx2,fma,f16c", lanes 16,
    _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_add_ps, hsum512, _mm512_loadu_ps, load16_f16
);
dot4_kernel!(dot4_f32_avx512(f32), _mm512_loadu_ps);
dot4_kernel!(dot4_f16_avx512(f16), load16_f16);

/// Sixteen halves at `p`, converted to f32.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn load16_f16(p: *const f16) -> __m512 {
    // SAFETY: the caller vouches for 16 halves (32 bytes) at `p`; f16 is a 2-byte plain value.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
}

/// `acc + a · b` over the first `len` (< 16) lanes at `pa` and `pb`; the other lanes read nothing.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn fma16_masked(pa: *const f32, pb: *const f32, len: usize, acc: __m512) -> __m512 {
    let m: __mmask16 = (1u32 << len) as u16 - 1;
    // SAFETY: the caller vouches for `len` floats at `pa` and at `pb`; the masked loads read no
    // other lane.
    let (x, y) = unsafe { (_mm512_maskz_loadu_ps(m, pa), _mm512_maskz_loadu_ps(m, pb)) };
    _mm512_fmadd_ps(x, y, acc)
}

/// Sum of the 16 lanes in a fixed tree: halves (lane j + j+8), then quarters (j + j+4), then
/// pairs. [`hsum512x4`] adds four vectors in exactly this order, so that a row's score is
/// the same bits whether it was computed alone (gather) or in a block of four (range scans).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn hsum512(v: __m512) -> f32 {
    let hi = _mm512_castpd_ps(_mm512_shuffle_f64x2::<0b11_10_11_10>(
        _mm512_castps_pd(v),
        _mm512_castps_pd(v),
    ));
    let s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(hi));
    let t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let u = _mm_add_ps(t, _mm_permute_ps::<0b01_00_11_10>(t));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
}

/// [`hsum512`] of four vectors at once, written to `out[..4]`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn hsum512x4(v0: __m512, v1: __m512, v2: __m512, v3: __m512, out: &mut [f32]) {
    // Halves: [v0 lanes 0-7 | v1 lanes 0-7] + [v0 lanes 8-15 | v1 lanes 8-15].
    let x01 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(v0, v1),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(v0, v1),
    );
    let x23 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(v2, v3),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(v2, v3),
    );
    // Quarters: 128-bit lane r holds row r's four partial sums.
    let y = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(x01, x23),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(x01, x23),
    );
    let z = _mm512_add_ps(y, _mm512_permute_ps::<0b01_00_11_10>(y));
    let w = _mm512_add_ps(z, _mm512_movehdup_ps(z));
    let picked = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        w,
    );
    let mut four = [0.0f32; 4];
    // SAFETY: `four` holds 4 floats, the width of one unaligned 128-bit store.
    unsafe { _mm_storeu_ps(four.as_mut_ptr(), _mm512_castps512_ps128(picked)) };
    out[..4].copy_from_slice(&four);
}

// ---------------------------------------------------------------- the AVX-512 range loop

/// The loop of the AVX-512 range scans: four rows per step through `four` when `dim` is a
/// multiple of 16 (one query load and one horizontal reduction serve four rows), the rows left
/// over one at a time through `one`.
#[inline(always)]
fn range_blocks<T>(
    q: &[f32],
    rows: &[T],
    dim: usize,
    out: &mut [f32],
    four: impl Fn(&[T], &mut [f32]),
    one: impl Fn(&[T]) -> f32,
) {
    let n = out.len().min(rows.len() / dim);
    let blocked = if dim.is_multiple_of(16) && q.len() >= dim {
        n / 4 * 4
    } else {
        0
    };
    for (o, block) in out[..blocked]
        .chunks_exact_mut(4)
        .zip(rows.chunks_exact(4 * dim))
    {
        four(block, o);
    }
    range_rows(&rows[blocked * dim..], dim, &mut out[blocked..n], one);
}
