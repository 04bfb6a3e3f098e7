//! x86-64 kernels: AVX2+FMA+F16C (8 lanes) and AVX-512F (16 lanes).
//!
//! The `unsafe` inner functions carry `#[target_feature]`; the safe wrappers are only handed out
//! by [`available`] after `is_x86_feature_detected!` confirmed the features, so they never run on
//! a CPU that lacks them. Loads are unaligned and stay inside the slices (tails go scalar).

use super::Kernels;
use half::f16;
use std::arch::x86_64::*;

/// The SIMD kernel sets this CPU supports, best first.
pub(super) fn available() -> Vec<Kernels> {
    let mut out = Vec::new();
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c") {
        out.push(Kernels {
            isa: "avx512",
            dot_f32: dot_f32_avx512,
            dot_f16: dot_f16_avx512,
            gather_f32: gather_f32_avx512,
            gather_f16: gather_f16_avx512,
            range_f32: range_f32_avx512,
            range_f16: range_f16_avx512,
        });
    }
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        out.push(Kernels {
            isa: "avx2",
            dot_f32: dot_f32_avx2,
            dot_f16: dot_f16_avx2,
            gather_f32: gather_f32_avx2,
            gather_f16: gather_f16_avx2,
            range_f32: range_f32_avx2,
            range_f16: range_f16_avx2,
        });
    }
    out
}

// ---------------------------------------------------------------- AVX2 + FMA + F16C

#[target_feature(enable = "avx2,fma,f16c")]
fn hsum256(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_avx2_inner(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: every load reads 8 floats at offsets i..i+8 <= n, inside both slices.
    unsafe {
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                acc1,
            );
            i += 16;
        }
        if i + 8 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
    }
    let mut s = hsum256(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2_inner(a: &[f32], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    let pa = a.as_ptr();
    let pb = b.as_ptr() as *const __m128i;
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: each f32 load reads a[i..i+8] and each f16 load reads 16 bytes = b[i..i+8], both
    // with i + 8 <= n; f16 is a 2-byte plain value, so the cast pointer reads valid memory.
    unsafe {
        while i + 16 <= n {
            let k0 = _mm256_cvtph_ps(_mm_loadu_si128(pb.byte_add(2 * i)));
            let k1 = _mm256_cvtph_ps(_mm_loadu_si128(pb.byte_add(2 * (i + 8))));
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), k0, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), k1, acc1);
            i += 16;
        }
        if i + 8 <= n {
            let k0 = _mm256_cvtph_ps(_mm_loadu_si128(pb.byte_add(2 * i)));
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), k0, acc0);
            i += 8;
        }
    }
    let mut s = hsum256(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += a[i] * b[i].to_f32();
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gather_f32_avx2_inner(q: &[f32], keys: &[f32], dim: usize, ids: &[u32], out: &mut [f32]) {
    // Request every row first so that their cache misses overlap.
    for &id in ids {
        prefetch_row(
            keys.as_ptr().cast(),
            id as usize * dim * 4,
            dim * 4,
            keys.len() * 4,
        );
    }
    for (o, &id) in out.iter_mut().zip(ids) {
        let start = id as usize * dim;
        // SAFETY: same target features as this function.
        *o = unsafe { dot_f32_avx2_inner(q, &keys[start..start + dim]) };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gather_f16_avx2_inner(q: &[f32], keys: &[f16], dim: usize, ids: &[u32], out: &mut [f32]) {
    // Request every row first so that their cache misses overlap.
    for &id in ids {
        prefetch_row(
            keys.as_ptr().cast(),
            id as usize * dim * 2,
            dim * 2,
            keys.len() * 2,
        );
    }
    for (o, &id) in out.iter_mut().zip(ids) {
        let start = id as usize * dim;
        // SAFETY: same target features as this function.
        *o = unsafe { dot_f16_avx2_inner(q, &keys[start..start + dim]) };
    }
}

fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: handed out by `available` only when avx2, fma and f16c are detected.
    unsafe { dot_f32_avx2_inner(a, b) }
}
fn dot_f16_avx2(a: &[f32], b: &[f16]) -> f32 {
    // SAFETY: handed out by `available` only when avx2, fma and f16c are detected.
    unsafe { dot_f16_avx2_inner(a, b) }
}
fn gather_f32_avx2(q: &[f32], keys: &[f32], dim: usize, ids: &[u32], out: &mut [f32]) {
    // SAFETY: handed out by `available` only when avx2, fma and f16c are detected.
    unsafe { gather_f32_avx2_inner(q, keys, dim, ids, out) }
}
fn gather_f16_avx2(q: &[f32], keys: &[f16], dim: usize, ids: &[u32], out: &mut [f32]) {
    // SAFETY: handed out by `available` only when avx2, fma and f16c are detected.
    unsafe { gather_f16_avx2_inner(q, keys, dim, ids, out) }
}

// ---------------------------------------------------------------- AVX-512F

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

/// Scores of four consecutive rows (`rows` holds `4 · dim` values, `dim` a multiple of 16),
/// summed exactly as [`dot_f32_avx512_inner`] sums one row.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot4_f32_avx512(q: &[f32], rows: &[f32], dim: usize, out: &mut [f32]) {
    debug_assert!(dim.is_multiple_of(16) && rows.len() >= 4 * dim && q.len() >= dim);
    let (pq, pr) = (q.as_ptr(), rows.as_ptr());
    let z = _mm512_setzero_ps();
    let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
    let (mut b0, mut b1, mut b2, mut b3) = (z, z, z, z);
    let mut i = 0;
    // SAFETY: every load reads 16 floats at i..i+16 <= dim of q and of one of the four rows.
    unsafe {
        while i + 32 <= dim {
            let (x, y) = (_mm512_loadu_ps(pq.add(i)), _mm512_loadu_ps(pq.add(i + 16)));
            a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(pr.add(i)), a0);
            b0 = _mm512_fmadd_ps(y, _mm512_loadu_ps(pr.add(i + 16)), b0);
            a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(pr.add(dim + i)), a1);
            b1 = _mm512_fmadd_ps(y, _mm512_loadu_ps(pr.add(dim + i + 16)), b1);
            a2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(pr.add(2 * dim + i)), a2);
            b2 = _mm512_fmadd_ps(y, _mm512_loadu_ps(pr.add(2 * dim + i + 16)), b2);
            a3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(pr.add(3 * dim + i)), a3);
            b3 = _mm512_fmadd_ps(y, _mm512_loadu_ps(pr.add(3 * dim + i + 16)), b3);
            i += 32;
        }
        if i + 16 <= dim {
            let x = _mm512_loadu_ps(pq.add(i));
            a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(pr.add(i)), a0);
            a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(pr.add(dim + i)), a1);
            a2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(pr.add(2 * dim + i)), a2);
            a3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(pr.add(3 * dim + i)), a3);
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

/// [`dot4_f32_avx512`] for f16 rows, summed exactly as [`dot_f16_avx512_inner`] sums one row.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot4_f16_avx512(q: &[f32], rows: &[f16], dim: usize, out: &mut [f32]) {
    debug_assert!(dim.is_multiple_of(16) && rows.len() >= 4 * dim && q.len() >= dim);
    let pq = q.as_ptr();
    let pr = rows.as_ptr() as *const __m256i;
    let z = _mm512_setzero_ps();
    let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
    let (mut b0, mut b1, mut b2, mut b3) = (z, z, z, z);
    let mut i = 0;
    // SAFETY: every load reads 16 floats of q and 16 halves (32 bytes) of one of the four rows
    // at i..i+16 <= dim.
    unsafe {
        let k = |j: usize| _mm512_cvtph_ps(_mm256_loadu_si256(pr.byte_add(2 * j)));
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

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot_f32_avx512_inner(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY: every full load reads 16 floats at i..i+16 <= n; the masked tail load reads only
    // the lanes below n - i.
    unsafe {
        while i + 32 <= n {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i + 16)),
                _mm512_loadu_ps(pb.add(i + 16)),
                acc1,
            );
            i += 32;
        }
        if i + 16 <= n {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
            i += 16;
        }
        if i < n {
            let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
            let x = _mm512_maskz_loadu_ps(m, pa.add(i));
            let y = _mm512_maskz_loadu_ps(m, pb.add(i));
            acc1 = _mm512_fmadd_ps(x, y, acc1);
        }
    }
    hsum512(_mm512_add_ps(acc0, acc1))
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot_f16_avx512_inner(a: &[f32], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    let pa = a.as_ptr();
    let pb = b.as_ptr() as *const __m256i;
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY: each full step reads a[i..i+16] and 32 bytes = b[i..i+16] with i + 16 <= n; the
    // masked tail loads read only lanes below n - i.
    unsafe {
        while i + 32 <= n {
            let k0 = _mm512_cvtph_ps(_mm256_loadu_si256(pb.byte_add(2 * i)));
            let k1 = _mm512_cvtph_ps(_mm256_loadu_si256(pb.byte_add(2 * (i + 16))));
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), k0, acc0);
            acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i + 16)), k1, acc1);
            i += 32;
        }
        if i + 16 <= n {
            let k0 = _mm512_cvtph_ps(_mm256_loadu_si256(pb.byte_add(2 * i)));
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), k0, acc0);
            i += 16;
        }
    }
    let mut s = hsum512(_mm512_add_ps(acc0, acc1));
    while i < n {
        s += a[i] * b[i].to_f32();
        i += 1;
    }
    s
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn gather_f32_avx512_inner(
    q: &[f32],
    keys: &[f32],
    dim: usize,
    ids: &[u32],
    out: &mut [f32],
) {
    // Request every row first so that their cache misses overlap.
    for &id in ids {
        prefetch_row(
            keys.as_ptr().cast(),
            id as usize * dim * 4,
            dim * 4,
            keys.len() * 4,
        );
    }
    for (o, &id) in out.iter_mut().zip(ids) {
        let start = id as usize * dim;
        // SAFETY: same target features as this function.
        *o = unsafe { dot_f32_avx512_inner(q, &keys[start..start + dim]) };
    }
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn gather_f16_avx512_inner(
    q: &[f32],
    keys: &[f16],
    dim: usize,
    ids: &[u32],
    out: &mut [f32],
) {
    // Request every row first so that their cache misses overlap.
    for &id in ids {
        prefetch_row(
            keys.as_ptr().cast(),
            id as usize * dim * 2,
            dim * 2,
            keys.len() * 2,
        );
    }
    for (o, &id) in out.iter_mut().zip(ids) {
        let start = id as usize * dim;
        // SAFETY: same target features as this function.
        *o = unsafe { dot_f16_avx512_inner(q, &keys[start..start + dim]) };
    }
}

fn dot_f32_avx512(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: handed out by `available` only when avx512f and f16c are detected.
    unsafe { dot_f32_avx512_inner(a, b) }
}
fn dot_f16_avx512(a: &[f32], b: &[f16]) -> f32 {
    // SAFETY: handed out by `available` only when avx512f and f16c are detected.
    unsafe { dot_f16_avx512_inner(a, b) }
}
fn gather_f32_avx512(q: &[f32], keys: &[f32], dim: usize, ids: &[u32], out: &mut [f32]) {
    // SAFETY: handed out by `available` only when avx512f and f16c are detected.
    unsafe { gather_f32_avx512_inner(q, keys, dim, ids, out) }
}
fn gather_f16_avx512(q: &[f32], keys: &[f16], dim: usize, ids: &[u32], out: &mut [f32]) {
    // SAFETY: handed out by `available` only when avx512f and f16c are detected.
    unsafe { gather_f16_avx512_inner(q, keys, dim, ids, out) }
}

/// Prefetches the cache lines of one key row (`row_bytes` long at byte `offset` of a buffer of
/// `total_bytes`) into L1; does nothing when the row lies outside the buffer.
#[inline(always)]
fn prefetch_row(base: *const i8, offset: usize, row_bytes: usize, total_bytes: usize) {
    if offset + row_bytes > total_bytes {
        return;
    }
    let mut line = 0;
    while line < row_bytes {
        // SAFETY: prefetch never faults, and the address lies inside the buffer (checked above).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(offset + line)) };
        line += 64;
    }
}

/// Prefetches every cache line of `values` into L1.
#[inline(always)]
pub(super) fn prefetch_slice<T>(values: &[T]) {
    let bytes = std::mem::size_of_val(values);
    prefetch_row(values.as_ptr().cast(), 0, bytes, bytes);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn range_f32_avx2_inner(q: &[f32], rows: &[f32], dim: usize, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(dim)) {
        // SAFETY: same target features as this function.
        *o = unsafe { dot_f32_avx2_inner(q, row) };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn range_f16_avx2_inner(q: &[f32], rows: &[f16], dim: usize, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(dim)) {
        // SAFETY: same target features as this function.
        *o = unsafe { dot_f16_avx2_inner(q, row) };
    }
}

fn range_f32_avx2(q: &[f32], rows: &[f32], dim: usize, out: &mut [f32]) {
    // SAFETY: handed out by `available` only when the features are detected.
    unsafe { range_f32_avx2_inner(q, rows, dim, out) }
}

fn range_f16_avx2(q: &[f32], rows: &[f16], dim: usize, out: &mut [f32]) {
    // SAFETY: handed out by `available` only when the features are detected.
    unsafe { range_f16_avx2_inner(q, rows, dim, out) }
}

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
    for (o, row) in out[blocked..n]
        .iter_mut()
        .zip(rows[blocked * dim..].chunks_exact(dim))
    {
        *o = one(row);
    }
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn range_f32_avx512_inner(q: &[f32], rows: &[f32], dim: usize, out: &mut [f32]) {
    range_blocks(
        q,
        rows,
        dim,
        out,
        // SAFETY: same target features; `range_blocks` passes 4 rows of a `dim` that is a
        // multiple of 16.
        |block, o| unsafe { dot4_f32_avx512(q, block, dim, o) },
        // SAFETY: same target features as this function.
        |row| unsafe { dot_f32_avx512_inner(q, row) },
    )
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn range_f16_avx512_inner(q: &[f32], rows: &[f16], dim: usize, out: &mut [f32]) {
    range_blocks(
        q,
        rows,
        dim,
        out,
        // SAFETY: same target features; `range_blocks` passes 4 rows of a `dim` that is a
        // multiple of 16.
        |block, o| unsafe { dot4_f16_avx512(q, block, dim, o) },
        // SAFETY: same target features as this function.
        |row| unsafe { dot_f16_avx512_inner(q, row) },
    )
}

fn range_f32_avx512(q: &[f32], rows: &[f32], dim: usize, out: &mut [f32]) {
    // SAFETY: handed out by `available` only when the features are detected.
    unsafe { range_f32_avx512_inner(q, rows, dim, out) }
}

fn range_f16_avx512(q: &[f32], rows: &[f16], dim: usize, out: &mut [f32]) {
    // SAFETY: handed out by `available` only when the features are detected.
    unsafe { range_f16_avx512_inner(q, rows, dim, out) }
}
