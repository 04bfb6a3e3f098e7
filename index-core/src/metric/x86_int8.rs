//! x86-64 int8 kernels ([`super::int8`]): AVX2+FMA and AVX-512 (F, BW) for f32 queries against
//! int8 rows, and for the integer code estimates AVX-512 VNNI (`vpdpbusd`, 64 bytes per
//! instruction) or AVX-VNNI (32 bytes), else `vpmaddwd` on widened values.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes: the key codes are flipped to `c + 128`
//! (`c ^ 0x80`) and the query stays signed, so the sum is `Σ c_i q_i + 128 Σ q_i`; the caller's
//! [`QuantQuery::sum`] removes the second term. Every set is handed out by [`available`] only
//! after `is_x86_feature_detected!` confirmed its features.

use super::int8::{I8Kernels, QuantQuery};
use super::x86_groups::{
    group_q8_avx2, group_q8_vnni256, group_q8_vnni512, scan_q4_vnni512, scan_q8_avx2,
    scan_q8_many_avx2, scan_q8_vnni256, scan_q8_vnni512,
};
use std::arch::x86_64::*;

/// An [`I8Kernels`] of the named functions. The closures call `#[target_feature]` functions, so
/// it may only be used after detecting their features (each use says which were detected).
macro_rules! kernel_set {
    ($isa:literal, $dot:ident, $gather:ident, $range:ident, $dot_q8:ident, $gather_q8:ident, $group_q8:ident, $scan_q8:ident, $scan_q4:path) => {
        I8Kernels {
            isa: $isa,
            // SAFETY: the macro is used only after detecting the functions' features.
            dot: |a, b| unsafe { $dot(a, b) },
            // SAFETY: the macro is used only after detecting the functions' features.
            gather: |q, c, s, d, ids, o| unsafe { $gather(q, c, s, d, ids, o) },
            // SAFETY: the macro is used only after detecting the functions' features.
            range: |q, c, s, d, o| unsafe { $range(q, c, s, d, o) },
            // SAFETY: the macro is used only after detecting the functions' features.
            dot_q8: |a, b| unsafe { $dot_q8(a, b) },
            // SAFETY: the macro is used only after detecting the functions' features.
            gather_q8: |q, c, s, d, ids, o| unsafe { $gather_q8(q, c, s, d, ids, o) },
            // SAFETY: the macro is used only after detecting the functions' features.
            group_q8: |q, g, o| unsafe { $group_q8(q, g, o) },
            // SAFETY: the macro is used only after detecting the functions' features.
            scan_q8: |q, g, quads, o| unsafe { $scan_q8(q, g, quads, o) },
            // SAFETY: the macro is used only after detecting the functions' features.
            #[allow(unused_unsafe)]
            scan_q4: |q, g, octets, o| unsafe { $scan_q4(q, g, octets, o) },
            scan_q8_many: None,
        }
    };
}

/// The int8 kernel sets this CPU supports, best first.
pub(super) fn available() -> Vec<I8Kernels> {
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    let avx512 =
        avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
    let mut out = Vec::new();
    if avx512 && is_x86_feature_detected!("avx512vnni") {
        // The features of this set: avx512f, avx512bw, avx512vnni, avx2 and fma, detected just now.
        out.push(kernel_set!(
            "avx512-vnni",
            dot_i8_avx512,
            gather_i8_avx512,
            range_i8_avx512,
            dot_q8_vnni512,
            gather_q8_vnni512,
            group_q8_vnni512,
            scan_q8_vnni512,
            scan_q4_vnni512
        ));
    }
    if avx512 {
        // The features of this set: avx512f, avx512bw, avx2 and fma, detected just now.
        let mut set = kernel_set!(
            "avx512",
            dot_i8_avx512,
            gather_i8_avx512,
            range_i8_avx512,
            dot_q8_avx2,
            gather_q8_avx2,
            group_q8_avx2,
            scan_q8_avx2,
            super::int8::scan_q4
        );
        // SAFETY: avx2 and fma were detected just now.
        set.scan_q8_many = Some(|qs, g, quads, o| unsafe { scan_q8_many_avx2(qs, g, quads, o) });
        out.push(set);
    }
    if avx2 && is_x86_feature_detected!("avxvnni") {
        // The features of this set: avx2, fma and avxvnni, detected just now.
        out.push(kernel_set!(
            "avx2-vnni",
            dot_i8_avx2,
            gather_i8_avx2,
            range_i8_avx2,
            dot_q8_vnni256,
            gather_q8_vnni256,
            group_q8_vnni256,
            scan_q8_vnni256,
            super::int8::scan_q4
        ));
    }
    if avx2 {
        // The features of this set: avx2 and fma, detected just now.
        let mut set = kernel_set!(
            "avx2",
            dot_i8_avx2,
            gather_i8_avx2,
            range_i8_avx2,
            dot_q8_avx2,
            gather_q8_avx2,
            group_q8_avx2,
            scan_q8_avx2,
            super::int8::scan_q4
        );
        // SAFETY: avx2 and fma were detected just now.
        set.scan_q8_many = Some(|qs, g, quads, o| unsafe { scan_q8_many_avx2(qs, g, quads, o) });
        out.push(set);
    }
    out
}

// ---------------------------------------------------------------- f32 query × int8 rows

/// `Σ a_i · b_i`, 16 lanes per step in two 8-lane accumulators, the rest scalar.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_i8_avx2(a: &[f32], b: &[i8]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    // SAFETY: every load reads at i..i+16 (or i..i+8) <= n of both slices.
    unsafe {
        while i + 16 <= n {
            let c = _mm_loadu_si128(pb.add(i).cast());
            let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
            let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(c)));
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), lo, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), hi, acc1);
            i += 16;
        }
        if i + 8 <= n {
            let c = _mm_loadl_epi64(pb.add(i).cast());
            let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), lo, acc0);
            i += 8;
        }
    }
    let mut s = hsum256(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += a[i] * f32::from(b[i]);
        i += 1;
    }
    s
}

/// `Σ a_i · b_i`, 32 lanes per step in two 16-lane accumulators, one masked tail step.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn dot_i8_avx512(a: &[f32], b: &[i8]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    // SAFETY: full loads read at i..i+32 (or i..i+16) <= n of both slices; the masked tail
    // reads only the lanes below n - i.
    unsafe {
        while i + 32 <= n {
            let c = _mm256_loadu_si256(pb.add(i).cast());
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(c)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256::<1>(c)));
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), lo, acc0);
            acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i + 16)), hi, acc1);
            i += 32;
        }
        if i + 16 <= n {
            let c = _mm_loadu_si128(pb.add(i).cast());
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), lo, acc0);
            i += 16;
        }
        if i < n {
            let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
            let c = _mm_maskz_loadu_epi8(m, pb.add(i));
            let x = _mm512_maskz_loadu_ps(m, pa.add(i));
            acc1 = _mm512_fmadd_ps(x, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c)), acc1);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}

#[target_feature(enable = "avx2,fma")]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s)))
}

/// The gather and range loops of one f32×int8 dot kernel, compiled with its features.
macro_rules! f32_loops {
    ($features:literal, $dot:ident, $gather:ident, $range:ident) => {
        #[target_feature(enable = $features)]
        fn $gather(
            q: &[f32],
            codes: &[i8],
            scales: &[f32],
            dim: usize,
            ids: &[u32],
            out: &mut [f32],
        ) {
            prefetch_rows(codes, dim, ids);
            for (o, &id) in out.iter_mut().zip(ids) {
                let s = id as usize * dim;
                // SAFETY: same target features as this function.
                *o = scales[id as usize] * unsafe { $dot(q, &codes[s..s + dim]) };
            }
        }
        #[target_feature(enable = $features)]
        fn $range(q: &[f32], rows: &[i8], scales: &[f32], dim: usize, out: &mut [f32]) {
            for ((o, row), &s) in out.iter_mut().zip(rows.chunks_exact(dim)).zip(scales) {
                // SAFETY: same target features as this function.
                *o = s * unsafe { $dot(q, row) };
            }
        }
    };
}

f32_loops!("avx2,fma", dot_i8_avx2, gather_i8_avx2, range_i8_avx2);
f32_loops!(
    "avx512f,avx512bw,avx2,fma",
    dot_i8_avx512,
    gather_i8_avx512,
    range_i8_avx512
);

// ---------------------------------------------------------------- int8 × int8 (code estimates)

/// `Σ a_i · b_i` exact in i32: bytes widened to i16, pairs multiplied and added (`vpmaddwd`),
/// 16 per step, the rest scalar.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_avx2(a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = _mm256_setzero_si256();
    let mut i = 0;
    // SAFETY: every load reads at i..i+16 <= n of both slices.
    unsafe {
        while i + 16 <= n {
            let x = _mm256_cvtepi8_epi16(_mm_loadu_si128(pa.add(i).cast()));
            let y = _mm256_cvtepi8_epi16(_mm_loadu_si128(pb.add(i).cast()));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(x, y));
            i += 16;
        }
    }
    let mut s = hsum256_epi32(acc);
    while i < n {
        s += i32::from(a[i]) * i32::from(b[i]);
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma")]
fn hsum256_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `Σ (b_i + 128) · a_i` with AVX-VNNI, 32 bytes per step (scalar tail), for `b` the key codes:
/// the caller subtracts `128 Σ a_i`.
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn dot_q8_vnni256_biased(a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let flip = _mm256_set1_epi8(-128);
    let mut acc = _mm256_setzero_si256();
    let mut i = 0;
    // SAFETY: every load reads at i..i+32 <= n of both slices.
    unsafe {
        while i + 32 <= n {
            let k = _mm256_xor_si256(_mm256_loadu_si256(pb.add(i).cast()), flip);
            let q = _mm256_loadu_si256(pa.add(i).cast());
            acc = _mm256_dpbusd_avx_epi32(acc, k, q);
            i += 32;
        }
    }
    let mut s = hsum256_epi32(acc);
    while i < n {
        s += (i32::from(b[i]) + 128) * i32::from(a[i]);
        i += 1;
    }
    s
}

/// `Σ (b_i + 128) · a_i` with AVX-512 VNNI, 64 bytes per instruction, one masked tail step
/// (masked-off lanes load 0 into `a`, so they add nothing).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn dot_q8_vnni512_biased(a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let flip = _mm512_set1_epi8(-128);
    let mut acc = _mm512_setzero_si512();
    let mut i = 0;
    // SAFETY: full loads read at i..i+64 <= n of both slices; the masked tail reads only the
    // lanes below n - i.
    unsafe {
        while i + 64 <= n {
            let k = _mm512_xor_si512(_mm512_loadu_si512(pb.add(i).cast()), flip);
            let q = _mm512_loadu_si512(pa.add(i).cast());
            acc = _mm512_dpbusd_epi32(acc, k, q);
            i += 64;
        }
        if i < n {
            let m: __mmask64 = (1u64 << (n - i)) - 1;
            let k = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, pb.add(i)), flip);
            let q = _mm512_maskz_loadu_epi8(m, pa.add(i));
            acc = _mm512_dpbusd_epi32(acc, k, q);
        }
    }
    _mm512_reduce_add_epi32(acc)
}

/// The `dot_q8` and `gather_q8` entry points of one biased VNNI kernel, compiled with its
/// features: the bias `128 Σ a_i` is computed once (dot) or taken from the query (gather).
macro_rules! q8_vnni_loops {
    ($features:literal, $biased:ident, $dot:ident, $gather:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $dot(a: &[i8], b: &[i8]) -> i32 {
            let n = a.len().min(b.len());
            let bias: i32 = a[..n].iter().map(|&x| i32::from(x)).sum::<i32>() * 128;
            // SAFETY: same target features as this function.
            unsafe { $biased(a, b) - bias }
        }
        #[target_feature(enable = $features)]
        unsafe fn $gather(
            query: &QuantQuery,
            codes: &[i8],
            scales: &[f32],
            dim: usize,
            ids: &[u32],
            out: &mut [f32],
        ) {
            prefetch_rows(codes, dim, ids);
            let bias = 128 * query.sum;
            for (o, &id) in out.iter_mut().zip(ids) {
                let s = id as usize * dim;
                // SAFETY: same target features as this function.
                let dot = unsafe { $biased(&query.codes, &codes[s..s + dim]) } - bias;
                *o = query.estimate(dot, scales[id as usize]);
            }
        }
    };
}

q8_vnni_loops!(
    "avx2,fma,avxvnni",
    dot_q8_vnni256_biased,
    dot_q8_vnni256,
    gather_q8_vnni256
);
q8_vnni_loops!(
    "avx512f,avx512bw,avx512vnni,avx2,fma",
    dot_q8_vnni512_biased,
    dot_q8_vnni512,
    gather_q8_vnni512
);

/// [`dot_q8_avx2`] over a list of ids.
#[target_feature(enable = "avx2,fma")]
unsafe fn gather_q8_avx2(
    query: &QuantQuery,
    codes: &[i8],
    scales: &[f32],
    dim: usize,
    ids: &[u32],
    out: &mut [f32],
) {
    prefetch_rows(codes, dim, ids);
    for (o, &id) in out.iter_mut().zip(ids) {
        let s = id as usize * dim;
        // SAFETY: same target features as this function.
        let dot = unsafe { dot_q8_avx2(&query.codes, &codes[s..s + dim]) };
        *o = query.estimate(dot, scales[id as usize]);
    }
}

/// Requests the cache lines of rows `ids` of `codes` (`dim` bytes each) so that their misses
/// overlap; rows outside the slice are skipped.
#[inline(always)]
fn prefetch_rows(codes: &[i8], dim: usize, ids: &[u32]) {
    for &id in ids {
        let start = id as usize * dim;
        if start + dim > codes.len() {
            continue;
        }
        let mut line = 0;
        while line < dim {
            // SAFETY: prefetch never faults, and the address lies inside `codes` (checked above).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(codes.as_ptr().add(start + line)) };
            line += 64;
        }
    }
}
