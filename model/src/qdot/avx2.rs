//! The AVX2 kernels of [`super`] (ggml's `arch/x86/quants.c` scheme), with F16C for the block
//! scales.

use std::arch::x86_64::*;

use super::*;

pub fn detected() -> bool {
    use std::sync::OnceLock;
    static DETECTED: OnceLock<bool> = OnceLock::new();
    *DETECTED.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

row_kernels!();

/// The f16 at `b[at..at + 2]` as f32, inline (`half`'s conversion detects F16C per call,
/// which cost as much as the integer work of a block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn h2f(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// 32 bytes of `s` from `at` (bounds checked by the slice index).
#[inline(always)]
fn load32(s: &[u8], at: usize) -> __m256i {
    let b: &[u8; 32] = s[at..at + 32].try_into().expect("32 bytes");
    // SAFETY: `b` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline(always)]
fn load16(s: &[u8], at: usize) -> __m128i {
    let b: &[u8; 16] = s[at..at + 16].try_into().expect("16 bytes");
    // SAFETY: `b` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The activation codes of block `b`.
#[inline(always)]
fn act(a: &Q8Act, b: usize) -> __m256i {
    let q = &a.qs[b * QK..(b + 1) * QK];
    // SAFETY: `q` is 32 readable `i8`; the load is unaligned.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

/// Eight i32 lanes of `Σ u·s` over pairs of unsigned `u` and signed `s` bytes, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_us8(u: __m256i, s: __m256i) -> __m256 {
    let p = _mm256_maddubs_epi16(u, s);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The 32 nibbles of 16 bytes in weight order: low nibbles then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles16(b: __m128i) -> __m256i {
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(b, m);
    let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    _mm256_set_m128i(hi, lo)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0(w: &[u8], a: &Q8Act) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, blk) in w.chunks_exact(34).enumerate() {
        prefetch_ahead(w, 34 * b, 1);
        let x = load32(blk, 2);
        let y = act(a, b);
        // |x| × (y with x's sign): unsigned × signed, as maddubs needs.
        let p = mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        let d = _mm256_set1_ps(h2f(blk, 0) * a.d[b]);
        acc = _mm256_fmadd_ps(d, p, acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1(w: &[u8], a: &Q8Act) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (b, blk) in w.chunks_exact(20).enumerate() {
        prefetch_ahead(w, 20 * b, 1);
        let x = nibbles16(load16(blk, 4));
        let p = mul_sum_us8(x, act(a, b));
        let da = a.d[b];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(blk, 0) * da), p, acc);
        let [s0, s1] = a.sums[b];
        mins += h2f(blk, 2) * da * (s0 + s1) as f32;
    }
    hsum(acc) + mins
}

/// [`q8_0`] of one row with `R` activations at once: the row's blocks are loaded and their
/// signs taken once; each activation's sum is the one [`q8_0`] computes for it.
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_many<const R: usize>(w: &[u8], acts: &[Q8Act], out: &mut [f32]) {
    let acts: &[Q8Act; R] = acts[..R].try_into().expect("R activations");
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, blk) in w.chunks_exact(34).enumerate() {
        prefetch_ahead(w, 34 * b, 1);
        let x = load32(blk, 2);
        let ax = _mm256_sign_epi8(x, x);
        let dw = h2f(blk, 0);
        for (acc, a) in acc.iter_mut().zip(acts) {
            let y = act(a, b);
            let p = mul_sum_us8(ax, _mm256_sign_epi8(y, x));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d[b]), p, *acc);
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = hsum(acc);
    }
}

/// [`q4_1`] of one row with `R` activations at once (the nibbles unpacked once).
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1_many<const R: usize>(w: &[u8], acts: &[Q8Act], out: &mut [f32]) {
    let acts: &[Q8Act; R] = acts[..R].try_into().expect("R activations");
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins = [0f32; R];
    for (b, blk) in w.chunks_exact(20).enumerate() {
        prefetch_ahead(w, 20 * b, 1);
        let x = nibbles16(load16(blk, 4));
        let (dw, mw) = (h2f(blk, 0), h2f(blk, 2));
        for ((acc, mins), a) in acc.iter_mut().zip(&mut mins).zip(acts) {
            let p = mul_sum_us8(x, act(a, b));
            let da = a.d[b];
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), p, *acc);
            let [s0, s1] = a.sums[b];
            *mins += mw * da * (s0 + s1) as f32;
        }
    }
    for ((o, acc), mins) in out.iter_mut().zip(acc).zip(mins) {
        *o = hsum(acc) + mins;
    }
}

/// The kernel of `ty` for up to [`MANY`] activations at once, where there is one.
pub fn many_kernel(ty: GgmlType) -> Option<ManyKernel> {
    macro_rules! by_count {
        ($f:ident) => {{
            fn k(w: &[u8], acts: &[Q8Act], out: &mut [f32]) {
                // SAFETY: handed out only where AVX2, FMA and F16C were detected; each arm
                // passes at least its count of activations (a fifth and later are not read).
                unsafe {
                    match acts.len() {
                        0 => {}
                        1 => $f::<1>(w, acts, out),
                        2 => $f::<2>(w, acts, out),
                        3 => $f::<3>(w, acts, out),
                        _ => $f::<4>(w, acts, out),
                    }
                }
            }
            k as ManyKernel
        }};
    }
    Some(match ty {
        GgmlType::Q8_0 => by_count!(q8_0_many),
        GgmlType::Q4_1 => by_count!(q4_1_many),
        _ => return None,
    })
}

/// Byte `j` of the result is `0x10` where bit `j` of `qh` is set, else 0 (ggml's
/// `bytes_from_bits_32`, shifted to the fifth bit).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits(qh: u32) -> __m256i {
    let t = _mm256_set1_epi32(qh as i32);
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(t, shuf);
    // Every bit but bit j%8 set in byte j: the byte is all ones iff bit j%8 of qh's byte is.
    let bit_mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0(w: &[u8], a: &Q8Act) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offs = 0f32;
    for (b, blk) in w.chunks_exact(22).enumerate() {
        prefetch_ahead(w, 22 * b, 1);
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        let x = _mm256_or_si256(nibbles16(load16(blk, 6)), fifth_bits(qh));
        let p = mul_sum_us8(x, act(a, b));
        let dd = h2f(blk, 0) * a.d[b];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), p, acc);
        let [s0, s1] = a.sums[b];
        offs += dd * (16 * (s0 + s1)) as f32;
    }
    hsum(acc) - offs
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k(w: &[u8], a: &Q8Act) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    let m4 = _mm256_set1_epi8(0x0F);
    for (sb, blk) in w.chunks_exact(144).enumerate() {
        prefetch_ahead(w, 144 * sb, 3);
        let (d, dmin) = (h2f(blk, 0), h2f(blk, 2));
        let packed = &blk[4..16];
        for i in 0..4 {
            let q = load32(blk, 16 + 32 * i);
            let halves = [
                _mm256_and_si256(q, m4),
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
            ];
            for (h, x) in halves.into_iter().enumerate() {
                let j = 2 * i + h;
                let b = sb * 8 + j;
                let (sc, m) = q4k_scale_min(j, packed);
                let p = mul_sum_us8(x, act(a, b));
                let da = a.d[b];
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * f32::from(sc) * da), p, acc);
                let [s0, s1] = a.sums[b];
                mins += dmin * f32::from(m) * da * (s0 + s1) as f32;
            }
        }
    }
    hsum(acc) - mins
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k(w: &[u8], a: &Q8Act) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offs = 0f32;
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    for (sb, blk) in w.chunks_exact(210).enumerate() {
        prefetch_ahead(w, 210 * sb, 4);
        let d = h2f(blk, 208);
        for half in 0..2 {
            let ql0 = load32(blk, half * 64);
            let ql1 = load32(blk, half * 64 + 32);
            let qh = load32(blk, 128 + half * 32);
            let sc = &blk[192 + half * 8..192 + half * 8 + 8];
            let lows = [
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            ];
            let highs = [
                _mm256_and_si256(qh, m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 4), m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 6), m2),
            ];
            for r in 0..4 {
                let b = sb * 8 + half * 4 + r;
                let x = _mm256_or_si256(lows[r], _mm256_slli_epi16(highs[r], 4));
                // i16 lanes 0..8 hold weights 0..16 (scale 2r), lanes 8..16 the rest.
                let p16 = _mm256_maddubs_epi16(x, act(a, b));
                let (sa, sb_) = (i16::from(sc[2 * r] as i8), i16::from(sc[2 * r + 1] as i8));
                let scales = _mm256_set_m128i(_mm_set1_epi16(sb_), _mm_set1_epi16(sa));
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, scales));
                let dd = d * a.d[b];
                acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), p, acc);
                let [s0, s1] = a.sums[b];
                offs += dd * (32 * (i32::from(sa) * s0 + i32::from(sb_) * s1)) as f32;
            }
        }
    }
    hsum(acc) - offs
}
