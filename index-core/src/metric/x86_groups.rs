//! x86-64 kernels of the interleaved int8 and 4-bit groups ([`super::int8::group_q8`],
//! [`super::int8::scan_q8`], [`super::int8::ScanQ8Many`], [`super::int8::scan_q4`]): AVX-512 VNNI,
//! AVX-VNNI and AVX2, handed out by [`super::x86_int8::available`] after detecting their
//! features (the conventions of `vpdpbusd` are that module's).

use super::int8::{scan_groups_with, QuantQuery, GROUP};
use std::arch::x86_64::*;

/// [`super::int8::group_q8`] with AVX-512 VNNI: one `vpdpbusd` adds 4 dimensions of all 16 rows
/// (the group's codes are the unsigned operand, flipped; the query's 4 bytes are broadcast), in
/// two accumulators; the `128 Σ q` the flip adds is subtracted at the end.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn group_q8_vnni512(q: &[i8], group: &[u8], out: &mut [i32; GROUP]) {
    let quads = (q.len() / 4).min(group.len() / (4 * GROUP));
    let (pq, pg) = (q.as_ptr(), group.as_ptr());
    let (mut acc0, mut acc1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    let mut sum = 0i32;
    let mut j = 0;
    // SAFETY: quad j reads q[4j..4j+4] and group[64j..64j+64], inside both slices for j < quads.
    unsafe {
        while j + 2 <= quads {
            let x0 = std::ptr::read_unaligned(pq.add(4 * j).cast::<i32>());
            let x1 = std::ptr::read_unaligned(pq.add(4 * j + 4).cast::<i32>());
            let g0 = _mm512_loadu_si512(pg.add(64 * j).cast());
            let g1 = _mm512_loadu_si512(pg.add(64 * j + 64).cast());
            acc0 = _mm512_dpbusd_epi32(acc0, g0, _mm512_set1_epi32(x0));
            acc1 = _mm512_dpbusd_epi32(acc1, g1, _mm512_set1_epi32(x1));
            j += 2;
        }
        if j < quads {
            let x0 = std::ptr::read_unaligned(pq.add(4 * j).cast::<i32>());
            let g0 = _mm512_loadu_si512(pg.add(64 * j).cast());
            acc0 = _mm512_dpbusd_epi32(acc0, g0, _mm512_set1_epi32(x0));
        }
        for &x in &q[..4 * quads] {
            sum += i32::from(x);
        }
        let acc = _mm512_sub_epi32(_mm512_add_epi32(acc0, acc1), _mm512_set1_epi32(128 * sum));
        _mm512_storeu_si512(out.as_mut_ptr().cast(), acc);
    }
}

/// [`super::int8::scan_q8`] with AVX-512 VNNI: four accumulators per group (the `vpdpbusd`
/// chains overlap), then the estimates of all 16 rows in one register.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn scan_q8_vnni512(
    query: &QuantQuery,
    groups: &[u8],
    quads: usize,
    out: &mut [f32],
) {
    let bytes = (quads + 2) * 64;
    let count = (groups.len() / bytes).min(out.len() / GROUP);
    let q = &query.codes[..(4 * quads).min(query.codes.len())];
    let quads = q.len() / 4;
    let sum: i32 = q.iter().map(|&x| i32::from(x)).sum();
    let pq = q.as_ptr();
    let bias = _mm512_set1_epi32(128 * sum);
    let qscale = _mm512_set1_ps(query.scale);
    let qbias = _mm512_set1_ps(query.bias);
    // SAFETY: group g spans groups[g·bytes..(g+1)·bytes] (g < count ≤ groups.len() / bytes):
    // its codes are the first `quads` lines and its scales the next; quad j reads q[4j..4j+4]
    // (j < quads = q.len() / 4); the store writes out[16g..16g+16] (g < out.len() / 16).
    unsafe {
        for g in 0..count {
            let pg = groups.as_ptr().add(g * bytes);
            let mut acc = [_mm512_setzero_si512(); 4];
            let mut j = 0;
            while j + 4 <= quads {
                for (a, acc) in acc.iter_mut().enumerate() {
                    let x = std::ptr::read_unaligned(pq.add(4 * (j + a)).cast::<i32>());
                    let c = _mm512_loadu_si512(pg.add(64 * (j + a)).cast());
                    *acc = _mm512_dpbusd_epi32(*acc, c, _mm512_set1_epi32(x));
                }
                j += 4;
            }
            while j < quads {
                let x = std::ptr::read_unaligned(pq.add(4 * j).cast::<i32>());
                let c = _mm512_loadu_si512(pg.add(64 * j).cast());
                acc[0] = _mm512_dpbusd_epi32(acc[0], c, _mm512_set1_epi32(x));
                j += 1;
            }
            let dots = _mm512_sub_epi32(
                _mm512_add_epi32(
                    _mm512_add_epi32(acc[0], acc[1]),
                    _mm512_add_epi32(acc[2], acc[3]),
                ),
                bias,
            );
            let scales = _mm512_loadu_ps(pg.add(64 * quads).cast());
            let est = _mm512_fmadd_ps(
                _mm512_mul_ps(qscale, scales),
                _mm512_cvtepi32_ps(dots),
                qbias,
            );
            _mm512_storeu_ps(out.as_mut_ptr().add(GROUP * g), est);
        }
    }
}

/// [`super::int8::scan_q4`] with AVX-512 VNNI: each line's low and high nibbles are 4
/// dimensions of all 16 keys (`code + 8`, unsigned), one `vpdpbusd` each; the `8 Σ q` the
/// offset adds is subtracted at the end.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn scan_q4_vnni512(
    query: &QuantQuery,
    groups: &[u8],
    octets: usize,
    out: &mut [f32],
) {
    let bytes = (octets + 2) * 64;
    let count = (groups.len() / bytes).min(out.len() / GROUP);
    let q = &query.codes[..(8 * octets).min(query.codes.len())];
    let octets = q.len() / 8;
    let sum: i32 = q.iter().map(|&x| i32::from(x)).sum();
    let pq = q.as_ptr();
    let bias = _mm512_set1_epi32(8 * sum);
    let low = _mm512_set1_epi8(15);
    let qscale = _mm512_set1_ps(query.scale);
    let qbias = _mm512_set1_ps(query.bias);
    // SAFETY: group g spans groups[g·bytes..(g+1)·bytes] (g < count ≤ groups.len() / bytes):
    // its codes are the first `octets` lines and its scales the next; octet j reads
    // q[8j..8j+8] (j < octets = q.len() / 8); the store writes out[16g..16g+16]
    // (g < out.len() / 16).
    unsafe {
        for g in 0..count {
            let pg = groups.as_ptr().add(g * bytes);
            let (mut a0, mut a1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for j in 0..octets {
                let line = _mm512_loadu_si512(pg.add(64 * j).cast());
                let lo = _mm512_and_si512(line, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(line), low);
                let x0 = std::ptr::read_unaligned(pq.add(8 * j).cast::<i32>());
                let x1 = std::ptr::read_unaligned(pq.add(8 * j + 4).cast::<i32>());
                a0 = _mm512_dpbusd_epi32(a0, lo, _mm512_set1_epi32(x0));
                a1 = _mm512_dpbusd_epi32(a1, hi, _mm512_set1_epi32(x1));
            }
            let dots = _mm512_sub_epi32(_mm512_add_epi32(a0, a1), bias);
            let scales = _mm512_loadu_ps(pg.add(64 * octets).cast());
            let est = _mm512_fmadd_ps(
                _mm512_mul_ps(qscale, scales),
                _mm512_cvtepi32_ps(dots),
                qbias,
            );
            _mm512_storeu_ps(out.as_mut_ptr().add(GROUP * g), est);
        }
    }
}

/// [`super::int8::scan_q8`] with AVX-VNNI (per-group kernel, then the estimates).
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn scan_q8_vnni256(
    query: &QuantQuery,
    groups: &[u8],
    quads: usize,
    out: &mut [f32],
) {
    // SAFETY: same target features as this function.
    scan_groups_with(
        |q, g, o| unsafe { group_q8_vnni256(q, g, o) },
        query,
        groups,
        quads,
        out,
    )
}

/// [`super::int8::scan_q8`] with AVX2 (per-group kernel, then the estimates).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scan_q8_avx2(
    query: &QuantQuery,
    groups: &[u8],
    quads: usize,
    out: &mut [f32],
) {
    // SAFETY: same target features as this function.
    scan_groups_with(
        |q, g, o| unsafe { group_q8_avx2(q, g, o) },
        query,
        groups,
        quads,
        out,
    )
}

/// Queries per pass of [`scan_q8_many_avx2`] (two accumulators each: 8 of the 16 registers).
const MANY_AVX2: usize = 4;

/// [`super::int8::ScanQ8Many`] with AVX2: the queries in passes of up to [`MANY_AVX2`]. Each
/// pass loads a line, flips it to signed codes and takes their absolute values once for all
/// its queries ([`group_q8_avx2`]'s `vpmaddubsw(|c|, sign(q, c))`, of which only the signs and
/// the products are per query); a lone query takes [`scan_q8_avx2`]. The estimates are
/// computed as there (same integer dots, same [`QuantQuery::estimate`]).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scan_q8_many_avx2(
    queries: &[QuantQuery],
    groups: &[u8],
    quads: usize,
    out: &mut [f32],
) {
    let Some(stride) = out.len().checked_div(queries.len()) else {
        return;
    };
    for (qs, rows) in queries
        .chunks(MANY_AVX2)
        .zip(out.chunks_mut(MANY_AVX2 * stride))
    {
        // SAFETY: every arm's callee needs this function's features (avx2, fma); `rows`
        // holds `qs.len()` rows of `stride`.
        unsafe {
            match qs.len() {
                1 => scan_q8_avx2(&qs[0], groups, quads, rows),
                2 => scan_q8_pass_avx2::<2>(qs, groups, quads, rows, stride),
                3 => scan_q8_pass_avx2::<3>(qs, groups, quads, rows, stride),
                _ => scan_q8_pass_avx2::<MANY_AVX2>(qs, groups, quads, rows, stride),
            }
        }
    }
}

/// One pass of [`scan_q8_many_avx2`] over `B` queries (`qs.len() == B`) into the rows of `out`
/// (`stride` apart, each at least `GROUP ·` the groups it writes).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scan_q8_pass_avx2<const B: usize>(
    qs: &[QuantQuery],
    groups: &[u8],
    quads: usize,
    out: &mut [f32],
    stride: usize,
) {
    // The scales follow the group's `lines` code lines; a query with fewer codes (never the
    // case for padded ones) stops its dots early, as `group_q8_avx2` does.
    let (lines, bytes) = (quads, (quads + 2) * 4 * GROUP);
    let quads = qs.iter().map(|q| q.codes.len() / 4).fold(quads, usize::min);
    let count = (groups.len() / bytes).min(stride / GROUP);
    if qs.len() != B || out.len() < B * stride {
        return;
    }
    let mut pq = [std::ptr::null::<i8>(); B];
    for (p, q) in pq.iter_mut().zip(qs) {
        *p = q.codes.as_ptr();
    }
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut dots = [0i32; GROUP];
    for g in 0..count {
        let group = &groups[g * bytes..(g + 1) * bytes];
        let pg = group.as_ptr();
        let mut lo = [_mm256_setzero_si256(); B];
        let mut hi = [_mm256_setzero_si256(); B];
        // SAFETY: quad j reads group[64j..64j+64] (j < quads ≤ the groups' code lines, so
        // inside `group`) and pq[b][4j..4j+4] (j < quads ≤ every query's codes.len() / 4).
        unsafe {
            for j in 0..quads {
                let c0 = _mm256_xor_si256(_mm256_loadu_si256(pg.add(64 * j).cast()), flip);
                let c1 = _mm256_xor_si256(_mm256_loadu_si256(pg.add(64 * j + 32).cast()), flip);
                let (a0, a1) = (_mm256_abs_epi8(c0), _mm256_abs_epi8(c1));
                for b in 0..B {
                    let x =
                        _mm256_set1_epi32(std::ptr::read_unaligned(pq[b].add(4 * j).cast::<i32>()));
                    let p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, c0));
                    let p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, c1));
                    lo[b] = _mm256_add_epi32(lo[b], _mm256_madd_epi16(p0, ones));
                    hi[b] = _mm256_add_epi32(hi[b], _mm256_madd_epi16(p1, ones));
                }
            }
        }
        let scales = &group[64 * lines..64 * lines + 4 * GROUP];
        for (b, q) in qs.iter().enumerate() {
            // SAFETY: `dots` holds 16 i32, two stores of 8.
            unsafe {
                _mm256_storeu_si256(dots.as_mut_ptr().cast(), lo[b]);
                _mm256_storeu_si256(dots.as_mut_ptr().add(8).cast(), hi[b]);
            }
            let row = &mut out[b * stride + GROUP * g..b * stride + GROUP * (g + 1)];
            for ((e, &dot), scale) in row.iter_mut().zip(&dots).zip(scales.chunks_exact(4)) {
                let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
                *e = q.estimate(dot, scale);
            }
        }
    }
}

/// [`super::int8::group_q8`] with AVX-VNNI: rows 0–7 and 8–15 of each quad in two 256-bit halves.
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn group_q8_vnni256(q: &[i8], group: &[u8], out: &mut [i32; GROUP]) {
    let quads = (q.len() / 4).min(group.len() / (4 * GROUP));
    let (pq, pg) = (q.as_ptr(), group.as_ptr());
    let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    // SAFETY: quad j reads q[4j..4j+4] and group[64j..64j+64], inside both slices for j < quads.
    unsafe {
        for j in 0..quads {
            let x = _mm256_set1_epi32(std::ptr::read_unaligned(pq.add(4 * j).cast::<i32>()));
            let g0 = _mm256_loadu_si256(pg.add(64 * j).cast());
            let g1 = _mm256_loadu_si256(pg.add(64 * j + 32).cast());
            lo = _mm256_dpbusd_avx_epi32(lo, g0, x);
            hi = _mm256_dpbusd_avx_epi32(hi, g1, x);
        }
        let sum: i32 = q[..4 * quads].iter().map(|&x| i32::from(x)).sum();
        let bias = _mm256_set1_epi32(128 * sum);
        _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_sub_epi32(lo, bias));
        _mm256_storeu_si256(out.as_mut_ptr().add(8).cast(), _mm256_sub_epi32(hi, bias));
    }
}

/// [`super::int8::group_q8`] with AVX2: the codes are flipped back to signed, and
/// `vpmaddubsw(|c|, sign(q, c))` multiplies pairs without saturating (|c|, |q| ≤ 127 after the
/// flip of a code in `-127..=127`; the byte `0x00`, code −128, is never written), then
/// `vpmaddwd` with ones sums each row's 4 products.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn group_q8_avx2(q: &[i8], group: &[u8], out: &mut [i32; GROUP]) {
    let quads = (q.len() / 4).min(group.len() / (4 * GROUP));
    let (pq, pg) = (q.as_ptr(), group.as_ptr());
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    // SAFETY: quad j reads q[4j..4j+4] and group[64j..64j+64], inside both slices for j < quads.
    unsafe {
        for j in 0..quads {
            let x = _mm256_set1_epi32(std::ptr::read_unaligned(pq.add(4 * j).cast::<i32>()));
            let c0 = _mm256_xor_si256(_mm256_loadu_si256(pg.add(64 * j).cast()), flip);
            let c1 = _mm256_xor_si256(_mm256_loadu_si256(pg.add(64 * j + 32).cast()), flip);
            let p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(c0), _mm256_sign_epi8(x, c0));
            let p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(c1), _mm256_sign_epi8(x, c1));
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(p0, ones));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(p1, ones));
        }
        _mm256_storeu_si256(out.as_mut_ptr().cast(), lo);
        _mm256_storeu_si256(out.as_mut_ptr().add(8).cast(), hi);
    }
}
