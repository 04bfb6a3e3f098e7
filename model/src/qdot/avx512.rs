//! The AVX-512 kernels of [`super`] (AVX-512 F/BW/DQ and VNNI): `vpdpbusd` multiplies 64
//! unsigned weight codes by 64 signed activation codes and sums each four into an `i32` lane in
//! one instruction, so a 512-bit register covers two 32-weight blocks (or two sub-blocks of a
//! k-quant super-block) where the AVX2 kernels take one, with two instructions fewer per block.
//! The block scales are applied per lane in f32 (each lane's four products share a scale), and
//! the weights' offsets (mins, −16, −32) through the activation sums, as in the AVX2 kernels.
//!
//! Measured (`cargo bench -p qkindex-model --bench matvec`, 256 MiB of weights, 2 threads):
//! `docs/bench/model-step/README.md`, "AVX-512 matvecs".

use std::arch::x86_64::*;

use super::*;

pub fn detected() -> bool {
    use std::sync::OnceLock;
    static DETECTED: OnceLock<bool> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && std::env::var_os("QKINDEX_NO_AVX512").is_none()
    })
}

row_kernels!();

/// The f16 at `b[at..at + 2]` as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn h2f(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// `N` bytes of `s` from `at` as a pointer (bounds checked by the slice index).
#[inline(always)]
fn bytes<const N: usize>(s: &[u8], at: usize) -> *const u8 {
    let b: &[u8; N] = s[at..at + N].try_into().expect("N bytes");
    b.as_ptr()
}

#[inline(always)]
fn load64(s: &[u8], at: usize) -> __m512i {
    // SAFETY: 64 readable bytes (checked by `bytes`); the load is unaligned.
    unsafe { _mm512_loadu_si512(bytes::<64>(s, at).cast()) }
}

#[inline(always)]
fn load32(s: &[u8], at: usize) -> __m256i {
    // SAFETY: 32 readable bytes (checked by `bytes`); the load is unaligned.
    unsafe { _mm256_loadu_si256(bytes::<32>(s, at).cast()) }
}

#[inline(always)]
fn load16(s: &[u8], at: usize) -> __m128i {
    // SAFETY: 16 readable bytes (checked by `bytes`); the load is unaligned.
    unsafe { _mm_loadu_si128(bytes::<16>(s, at).cast()) }
}

/// The activation codes of blocks `b` and `b + 1` (64 bytes).
#[inline(always)]
fn act2(a: &Q8Act, b: usize) -> __m512i {
    let q = &a.qs[b * QK..(b + 2) * QK];
    // SAFETY: `q` is 64 readable `i8`; the load is unaligned.
    unsafe { _mm512_loadu_si512(q.as_ptr().cast()) }
}

/// Eight `f32` of `a.d` from block `b` (the scales of one k-quant super-block's sub-blocks).
#[inline(always)]
fn act_scales8(a: &Q8Act, b: usize) -> __m256 {
    let d = &a.d[b..b + 8];
    // SAFETY: `d` is 8 readable f32; the load is unaligned.
    unsafe { _mm256_loadu_ps(d.as_ptr()) }
}

/// The 16 `i32` of `a.sums[b..b + 8]` (first and last 16 codes' sums of 8 blocks, in order).
#[inline(always)]
fn act_sums8(a: &Q8Act, b: usize) -> __m512i {
    let s = &a.sums[b..b + 8];
    // SAFETY: eight `[i32; 2]` are 16 contiguous readable i32; the load is unaligned.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// The 32 nibbles of each of two 16-byte blocks in weight order: `[lo0, hi0, lo1, hi1]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn nibbles2(b0: __m128i, b1: __m128i) -> __m512i {
    let v = _mm256_set_m128i(b1, b0);
    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v), _mm256_srli_epi16::<4>(v));
    let m = _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
    // [lo0, lo1, hi0, hi1] -> [lo0, hi0, lo1, hi1]
    _mm512_shuffle_i64x2::<0xD8>(m, m)
}

/// The f16 bits at `at` of each of the `N ≤ 4` blocks of `s` bytes in `g` (`N · s` bytes;
/// zeros past `N`). Inlined with `s` a type's constant, every index is a constant and the
/// bounds checks fold into the slicing of `g`.
#[inline(always)]
fn f16x4<const N: usize>(g: &[u8], s: usize, at: usize) -> [u16; 4] {
    let mut h = [0u16; 4];
    for (i, h) in h.iter_mut().enumerate().take(N) {
        *h = u16::from_le_bytes([g[s * i + at], g[s * i + at + 1]]);
    }
    h
}

/// The activation's scales and code sums (`s0 + s1`) of `N ≤ 4` blocks (zeros past `N`).
#[inline(always)]
fn act4<const N: usize>(d: &[f32], sums: &[[i32; 2]]) -> ([f32; 4], [f32; 4]) {
    let (mut dd, mut ss) = ([0f32; 4], [0f32; 4]);
    for i in 0..N {
        dd[i] = d[i];
        ss[i] = (sums[i][0] + sums[i][1]) as f32;
    }
    (dd, ss)
}

/// The little-endian u32 at `w[at..at + 4]`, widened.
#[inline(always)]
fn word(w: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes([w[at], w[at + 1], w[at + 2], w[at + 3]]))
}

/// Four f16 (bits) as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn cvt4(h: [u16; 4]) -> __m128 {
    let bits =
        u64::from(h[0]) | u64::from(h[1]) << 16 | u64::from(h[2]) << 32 | u64::from(h[3]) << 48;
    _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
}

/// Lanes 0..8 take element `2p` of a 4-element vector, lanes 8..16 element `2p + 1`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn pair_index(p: i32) -> __m512i {
    let (i, j) = (2 * p, 2 * p + 1);
    _mm512_setr_epi32(i, i, i, i, i, i, i, i, j, j, j, j, j, j, j, j)
}

/// The running sums of [`blocks32`].
struct Sums32 {
    acc: [__m512; 2],
    off: __m128,
    idx: [__m512i; 2],
}

/// A 32-weight block type for [`blocks32`].
trait Block32 {
    /// Bytes per block.
    const S: usize;
    /// Whether the f16 at byte 2 is a min (Q4_1), added as `min · d_act · Σ y`.
    const MIN: bool;
    /// Subtracted per block: `OFFSET · d · d_act · Σ y` (Q8_0's 128, Q5_0's 16).
    const OFFSET: f32;
}

/// [`blocks32`]'s `N ≤ 4` blocks: `g` their `N · T::S` bytes, `qs` the activation codes from
/// the first (`32 · N`), `d` and `sums` its scales and sums.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn group32<T: Block32, const N: usize>(
    g: &[u8],
    qs: &[i8],
    d: &[f32],
    sums: &[[i32; 2]],
    acc: &mut Sums32,
    pair: &impl Fn(&[u8], usize, bool) -> __m512i,
) {
    let (da, ys) = act4::<N>(d, sums);
    // SAFETY: `da` and `ys` are 4 readable f32 each.
    let (da, ys) = unsafe { (_mm_loadu_ps(da.as_ptr()), _mm_loadu_ps(ys.as_ptr())) };
    let comb = _mm_mul_ps(cvt4(f16x4::<N>(g, T::S, 0)), da);
    let coef = if T::MIN {
        // The min enters with a plus sign: subtracting its negation.
        _mm_sub_ps(
            _mm_setzero_ps(),
            _mm_mul_ps(cvt4(f16x4::<N>(g, T::S, 2)), da),
        )
    } else {
        _mm_mul_ps(comb, _mm_set1_ps(T::OFFSET))
    };
    acc.off = _mm_fmadd_ps(coef, ys, acc.off);
    let comb = _mm512_castps128_ps512(comb);
    for p in 0..N.div_ceil(2) {
        let two = 2 * p + 1 < N;
        let y = if two {
            let q = &qs[64 * p..64 * p + 64];
            // SAFETY: `q` is 64 readable `i8`; the load is unaligned.
            unsafe { _mm512_loadu_si512(q.as_ptr().cast()) }
        } else {
            let q = &qs[64 * p..64 * p + 32];
            // SAFETY: `q` is 32 readable `i8`; the load is unaligned.
            unsafe { _mm512_zextsi256_si512(_mm256_loadu_si256(q.as_ptr().cast())) }
        };
        let dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair(g, 2 * p, two), y);
        let s = _mm512_permutexvar_ps(acc.idx[p], comb);
        acc.acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), s, acc.acc[p]);
    }
}

/// The kernels of the 32-weight block types, four blocks at a time: `pair(g, i, two)` gives the
/// unsigned codes of blocks `i` and `i + 1` of the group's bytes `g` (only `i`'s, zeros above,
/// where `two` is false). Each block's f32 factor is its scale (the f16 at byte 0) times the
/// activation's; the offset terms ([`Block32`]) are accumulated apart and subtracted at the end.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn blocks32<T: Block32>(w: &[u8], a: &Q8Act, pair: impl Fn(&[u8], usize, bool) -> __m512i) -> f32 {
    let s = T::S;
    let nb = w.len() / s;
    let mut acc = Sums32 {
        acc: [_mm512_setzero_ps(); 2],
        off: _mm_setzero_ps(),
        idx: [pair_index(0), pair_index(1)],
    };
    let mut b = 0;
    while b + 4 <= nb {
        // Ask for the bytes a few groups ahead (past this row: into the next rows, which the
        // matvec reads next); a prefetch never faults.
        prefetch_ahead(w, s * b, 3);
        let (g, qs) = (&w[s * b..s * (b + 4)], &a.qs[QK * b..QK * (b + 4)]);
        let (d, sums) = (&a.d[b..b + 4], &a.sums[b..b + 4]);
        group32::<T, 4>(g, qs, d, sums, &mut acc, &pair);
        b += 4;
    }
    let (g, qs) = (&w[s * b..], &a.qs[QK * b..]);
    let (d, sums) = (&a.d[b..], &a.sums[b..]);
    match nb - b {
        3 => group32::<T, 3>(g, qs, d, sums, &mut acc, &pair),
        2 => group32::<T, 2>(g, qs, d, sums, &mut acc, &pair),
        1 => group32::<T, 1>(g, qs, d, sums, &mut acc, &pair),
        _ => {}
    }
    let off = _mm_add_ps(acc.off, _mm_movehl_ps(acc.off, acc.off));
    let off = _mm_add_ss(off, _mm_movehdup_ps(off));
    _mm512_reduce_add_ps(_mm512_add_ps(acc.acc[0], acc.acc[1])) - _mm_cvtss_f32(off)
}

struct Q8_0;
impl Block32 for Q8_0 {
    const S: usize = 34;
    const MIN: bool = false;
    const OFFSET: f32 = 128.0;
}

struct Q4_1;
impl Block32 for Q4_1 {
    const S: usize = 20;
    const MIN: bool = true;
    const OFFSET: f32 = 0.0;
}

struct Q5_0;
impl Block32 for Q5_0 {
    const S: usize = 22;
    const MIN: bool = false;
    const OFFSET: f32 = 16.0;
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn q8_0(w: &[u8], a: &Q8Act) -> f32 {
    // Signed codes made unsigned by adding 128 (flipping the sign bit); the 128 · Σ y it adds
    // is the offset term.
    let flip = _mm512_set1_epi8(-128);
    blocks32::<Q8_0>(w, a, |g, i, two| {
        let x0 = load32(g, 34 * i + 2);
        let x = if two {
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x0), load32(g, 34 * (i + 1) + 2))
        } else {
            _mm512_zextsi256_si512(x0)
        };
        _mm512_xor_si512(x, flip)
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn q4_1(w: &[u8], a: &Q8Act) -> f32 {
    blocks32::<Q4_1>(w, a, |g, i, two| {
        let q1 = if two {
            load16(g, 20 * (i + 1) + 4)
        } else {
            _mm_setzero_si128()
        };
        nibbles2(load16(g, 20 * i + 4), q1)
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn q5_0(w: &[u8], a: &Q8Act) -> f32 {
    blocks32::<Q5_0>(w, a, |g, i, two| {
        let (q1, h1) = if two {
            (load16(g, 22 * (i + 1) + 6), word(g, 22 * (i + 1) + 2))
        } else {
            (_mm_setzero_si128(), 0)
        };
        // Byte j of the pair gets its fifth bit from bit j of the two blocks' qh words.
        let fifth = _mm512_maskz_mov_epi8(word(g, 22 * i + 2) | (h1 << 32), _mm512_set1_epi8(0x10));
        _mm512_or_si512(nibbles2(load16(g, 22 * i + 6), q1), fifth)
    })
}

/// The sums `s0 + s1` of 8 blocks' codes as 8 `i32` (from [`act_sums8`]'s pairs).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn block_sums8(pairs: __m512i) -> __m256i {
    _mm512_cvtepi64_epi32(_mm512_add_epi64(pairs, _mm512_srli_epi64::<32>(pairs)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn q4_k(w: &[u8], a: &Q8Act) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut mins = _mm256_setzero_ps();
    let zero = _mm512_setzero_si512();
    let m4 = _mm512_set1_epi8(0x0F);
    // Lanes 0..8 take sub-block j's scale, lanes 8..16 sub-block j + 2's.
    let pick = |j: i32| {
        _mm512_setr_epi32(
            j,
            j,
            j,
            j,
            j,
            j,
            j,
            j,
            j + 2,
            j + 2,
            j + 2,
            j + 2,
            j + 2,
            j + 2,
            j + 2,
            j + 2,
        )
    };
    let idx = [pick(0), pick(1), pick(4), pick(5)];
    for (sb, blk) in w.chunks_exact(144).enumerate() {
        prefetch_ahead(w, 144 * sb, 3);
        let (d, dmin) = (h2f(blk, 0), h2f(blk, 2));
        let word = |i: usize| {
            u32::from_le_bytes([
                blk[4 + 4 * i],
                blk[5 + 4 * i],
                blk[6 + 4 * i],
                blk[7 + 4 * i],
            ])
        };
        let (w0, w1, w2) = (word(0), word(1), word(2));
        // The eight 6-bit scales and mins (`q4k_scale_min`, four at a time).
        let sc = u64::from(w0 & 0x3f3f_3f3f)
            | (u64::from((w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4)) << 32);
        let mn = u64::from(w1 & 0x3f3f_3f3f)
            | (u64::from(((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4)) << 32);
        let b0 = sb * 8;
        let da = act_scales8(a, b0);
        let u8x8 = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
        // Each sub-block's f32 factor d · scale · activation scale.
        let comb = _mm512_castps256_ps512(_mm256_mul_ps(
            _mm256_mul_ps(_mm256_set1_ps(d), u8x8(sc)),
            da,
        ));
        let sums = _mm256_cvtepi32_ps(block_sums8(act_sums8(a, b0)));
        mins = _mm256_fmadd_ps(
            _mm256_mul_ps(_mm256_set1_ps(dmin), u8x8(mn)),
            _mm256_mul_ps(da, sums),
            mins,
        );
        for k in 0..2 {
            let q = load64(blk, 16 + 64 * k);
            let lo = _mm512_and_si512(q, m4); // sub-blocks 4k, 4k + 2
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4); // 4k + 1, 4k + 3
            let ya = act2(a, b0 + 4 * k);
            let yb = act2(a, b0 + 4 * k + 2);
            let ylo = _mm512_shuffle_i64x2::<0x44>(ya, yb);
            let yhi = _mm512_shuffle_i64x2::<0xEE>(ya, yb);
            let plo = _mm512_dpbusd_epi32(zero, lo, ylo);
            let phi = _mm512_dpbusd_epi32(zero, hi, yhi);
            acc[0] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(plo),
                _mm512_permutexvar_ps(idx[2 * k], comb),
                acc[0],
            );
            acc[1] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(phi),
                _mm512_permutexvar_ps(idx[2 * k + 1], comb),
                acc[1],
            );
        }
    }
    let m = _mm512_castps256_ps512(mins);
    let m = _mm512_insertf32x8::<1>(m, _mm256_setzero_ps());
    _mm512_reduce_add_ps(_mm512_sub_ps(_mm512_add_ps(acc[0], acc[1]), m))
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
fn q6_k(w: &[u8], a: &Q8Act) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let zero = _mm512_setzero_si512();
    let m4 = _mm512_set1_epi8(0x0F);
    let m2 = _mm512_set1_epi8(3);
    // Lane l of the pair (half h, blocks 2p and 2p + 1) takes scale h·8 + 4p + l/4.
    let pick = |s: i32| {
        _mm512_setr_epi32(
            s,
            s,
            s,
            s,
            s + 1,
            s + 1,
            s + 1,
            s + 1,
            s + 2,
            s + 2,
            s + 2,
            s + 2,
            s + 3,
            s + 3,
            s + 3,
            s + 3,
        )
    };
    let idx = [pick(0), pick(4), pick(8), pick(12)];
    // Scale g (of 16 weights) belongs to block g / 2.
    let dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (sb, blk) in w.chunks_exact(210).enumerate() {
        prefetch_ahead(w, 210 * sb, 4);
        let d = h2f(blk, 208);
        let b0 = sb * 8;
        let scales = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(blk, 192)));
        let da = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(act_scales8(a, b0)));
        // Each 16-weight group's f32 factor d · scale · activation scale.
        let comb = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d), scales), da);
        // The codes' offset of 32: Σ_g comb[g] · 32 · (sum of the group's activation codes).
        let sums = _mm512_cvtepi32_ps(act_sums8(a, b0));
        acc[1] = _mm512_fnmadd_ps(comb, _mm512_mul_ps(sums, _mm512_set1_ps(32.0)), acc[1]);
        for h in 0..2 {
            let ql = load64(blk, 64 * h);
            let qh = load32(blk, 128 + 32 * h);
            let qh2 =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(qh), _mm256_srli_epi16::<2>(qh));
            let lows = [
                _mm512_and_si512(ql, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
            ];
            let highs = [
                _mm512_and_si512(qh2, m2),
                _mm512_and_si512(_mm512_srli_epi16::<4>(qh2), m2),
            ];
            for p in 0..2 {
                let x = _mm512_or_si512(lows[p], _mm512_slli_epi16::<4>(highs[p]));
                let y = act2(a, b0 + 4 * h + 2 * p);
                let dp = _mm512_dpbusd_epi32(zero, x, y);
                let s = _mm512_permutexvar_ps(idx[2 * h + p], comb);
                acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), s, acc[p]);
            }
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}
