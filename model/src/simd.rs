//! Hot f32 loops written so that LLVM vectorizes them, each compiled twice on x86-64: portable
//! (SSE2) and with AVX2+FMA enabled, chosen at run time by CPU feature detection (done once).
//! On aarch64 there is one build, and it is the NEON one: Advanced SIMD is part of the aarch64
//! baseline (the `aarch64-unknown-linux-gnu` target enables it), so the portable code already
//! vectorizes to 4-lane NEON and no wider instruction set exists to select at run time (SVE is
//! not in Rust's stable intrinsics and LLVM does not auto-vectorize these loops for it without a
//! `target-cpu`). No intrinsics: the same source gives the same results on every path (no FMA
//! contraction), so the choice never changes outputs. See STYLE.md §4 (`target_feature`, detect
//! once).

/// `e^x` in f32 without branches or libm calls, so that loops over it vectorize, with no slow path
/// for underflow (glibc's `expf` takes one for every `x < -103`, i.e. for most masked-out softmax
/// scores, which made it the top of the profile). Cephes' `expf` polynomial on `[-ln2/2, ln2/2]`
/// after `x = n·ln2 + r`; relative error about 2e-7. Inputs are clamped to `[-87, 88]`, so
/// `exp(-inf)` is `1.6e-38` (no effect in a softmax sum ≥ 1) rather than 0.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n from n's bits in t (n in [-126, 127] after the clamp).
    let ni = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    e * f32::from_bits(((ni + 127) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    use std::sync::OnceLock;
    static DETECTED: OnceLock<bool> = OnceLock::new();
    *DETECTED.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// Defines `pub fn $name` that runs `$body` compiled with AVX2+FMA when available.
macro_rules! dispatch {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn body($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                // A safe `#[target_feature]` function (Rust 1.86; `rust-version` is 1.89): only
                // calling it from code without the features is unsafe.
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) -> $ret {
                    body($($arg),*)
                }
                if has_avx2_fma() {
                    // SAFETY: the CPU supports AVX2 and FMA (run-time detection above).
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

#[inline(always)]
fn dot_impl(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    hsum16(acc) + tail
}

/// Tree sum of 16 lanes: whole-vector adds, instead of 16 dependent scalar adds (which made the
/// 64-long dot products of decode attention latency-bound).
#[inline(always)]
fn hsum16(mut a: [f32; 16]) -> f32 {
    for w in [8, 4, 2, 1] {
        for i in 0..w {
            a[i] += a[i + w];
        }
    }
    a[0]
}

#[inline(always)]
fn axpy_impl(y: &mut [f32], a: f32, x: &[f32]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

dispatch! {
    /// `y += a · x`.
    fn axpy(y: &mut [f32], a: f32, x: &[f32]) -> () {
        axpy_impl(y, a, x)
    }
}

dispatch! {
    /// `Σ a[i]·b[i]` with 16 independent accumulators (vectorizes).
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot_impl(a, b)
    }
}

/// [`scores_small`] for exactly `R` rows: each key is read once for all rows (the same dot
/// products, so the same results).
#[inline(always)]
fn scores_rows<const R: usize>(q: &[f32], keys: &[f32], hd: usize, scale: f32, scores: &mut [f32]) {
    let w = keys.len() / hd;
    let qs: [&[f32]; R] = std::array::from_fn(|r| &q[r * hd..(r + 1) * hd]);
    for (j, kr) in keys.chunks_exact(hd).enumerate() {
        for (r, qr) in qs.iter().enumerate() {
            scores[r * w + j] = dot_impl(qr, kr) * scale;
        }
    }
}

dispatch! {
    /// Scores of a few query rows against a key tile: `scores[i · w + j] = scale · q_i · k_j`, with
    /// `q` row-major `rows × hd`, `keys` row-major `w × hd`, `scores` `rows × w`. One call per tile
    /// keeps the dot products inlined (decode, where a GEMM call per tile costs more than it saves).
    fn scores_small(q: &[f32], keys: &[f32], hd: usize, scale: f32, scores: &mut [f32]) -> () {
        match q.len() / hd.max(1) {
            1 => scores_rows::<1>(q, keys, hd, scale, scores),
            2 => scores_rows::<2>(q, keys, hd, scale, scores),
            3 => scores_rows::<3>(q, keys, hd, scale, scores),
            4 => scores_rows::<4>(q, keys, hd, scale, scores),
            _ => {
                let w = keys.len() / hd;
                for (sr, qr) in scores.chunks_exact_mut(w).zip(q.chunks_exact(hd)) {
                    for (sv, kr) in sr.iter_mut().zip(keys.chunks_exact(hd)) {
                        *sv = dot_impl(qr, kr) * scale;
                    }
                }
            }
        }
    }
}

/// [`weighted_sum_small`] for exactly `R` rows: 16 columns of every row's output stay in
/// registers while the tile's values stream past once (the axpy per key loaded and stored the
/// output row for every key). Each output element sums the same products in the same order, so
/// the results are the same.
#[inline(always)]
fn weighted_sum_rows<const R: usize>(p: &[f32], values: &[f32], hd: usize, out: &mut [f32]) {
    let w = values.len() / hd;
    let full = hd - hd % 16;
    // Blocks of keys small enough to stay in L1 while each 16 columns pass over them (Gemma 3's
    // 1,024-key tile of 256-wide values is 1 MiB).
    for j0 in (0..w).step_by(WS_KEYS) {
        let j1 = (j0 + WS_KEYS).min(w);
        let vb = &values[j0 * hd..j1 * hd];
        let ps: [&[f32]; R] = std::array::from_fn(|r| &p[r * w + j0..r * w + j1]);
        for c in (0..full).step_by(16) {
            let mut acc = [[0f32; 16]; R];
            for (a, o) in acc.iter_mut().zip(out.chunks_exact(hd)) {
                a.copy_from_slice(&o[c..c + 16]);
            }
            for (j, vr) in vb.chunks_exact(hd).enumerate() {
                let v: &[f32; 16] = vr[c..c + 16].try_into().expect("16 columns");
                for (a, pr) in acc.iter_mut().zip(&ps) {
                    let pv = pr[j];
                    for i in 0..16 {
                        a[i] += pv * v[i];
                    }
                }
            }
            for (a, o) in acc.iter().zip(out.chunks_exact_mut(hd)) {
                o[c..c + 16].copy_from_slice(a);
            }
        }
        if full < hd {
            for (pr, or) in ps.iter().zip(out.chunks_exact_mut(hd)) {
                for (&pv, vr) in pr.iter().zip(vb.chunks_exact(hd)) {
                    axpy_impl(&mut or[full..], pv, &vr[full..]);
                }
            }
        }
    }
}

/// Keys per block of [`weighted_sum_rows`].
const WS_KEYS: usize = 32;

dispatch! {
    /// `out_i += Σ_j p[i · w + j] · v_j` for a few rows: `p` row-major `rows × w`, `values`
    /// row-major `w × hd`, `out` `rows × hd`.
    fn weighted_sum_small(p: &[f32], values: &[f32], hd: usize, out: &mut [f32]) -> () {
        match out.len() / hd.max(1) {
            1 => weighted_sum_rows::<1>(p, values, hd, out),
            2 => weighted_sum_rows::<2>(p, values, hd, out),
            3 => weighted_sum_rows::<3>(p, values, hd, out),
            4 => weighted_sum_rows::<4>(p, values, hd, out),
            _ => {
                let w = values.len() / hd;
                for (pr, or) in p.chunks_exact(w).zip(out.chunks_exact_mut(hd)) {
                    for (&pv, vr) in pr.iter().zip(values.chunks_exact(hd)) {
                        axpy_impl(or, pv, vr);
                    }
                }
            }
        }
    }
}

dispatch! {
    /// Largest element (`-inf` for an empty slice; NaNs are skipped).
    fn max(x: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; 16];
        let chunks = x.chunks_exact(16);
        let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
        for c in chunks {
            for i in 0..16 {
                acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
            }
        }
        acc.iter().fold(tail, |m, &v| if v > m { v } else { m })
    }
}

dispatch! {
    /// `x[i] = exp(x[i] - shift)` in place; returns `Σ x[i]` after.
    fn exp_shift_sum(x: &mut [f32], shift: f32) -> f32 {
        for v in x.iter_mut() {
            *v = exp_f32(*v - shift);
        }
        let mut acc = [0f32; 16];
        let chunks = x.chunks_exact(16);
        let tail: f32 = chunks.remainder().iter().sum();
        for c in chunks {
            for i in 0..16 {
                acc[i] += c[i];
            }
        }
        hsum16(acc) + tail
    }
}

dispatch! {
    /// `gate[i] = silu(gate[i]) · up[i]` (SwiGLU).
    fn swiglu(gate: &mut [f32], up: &[f32]) -> () {
        for (g, u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + exp_f32(-*g)) * u;
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    use std::sync::OnceLock;
    static DETECTED: OnceLock<bool> = OnceLock::new();
    *DETECTED.get_or_init(|| is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx"))
}

/// `dst[i] = src[i]` widened from f16 (exact), over the shorter of the two: F16C's 8-wide
/// conversion where the CPU has it (`half`'s slice conversion calls a function per 8 values,
/// which cost more than the bytes it saved in decode attention), `half`'s otherwise.
pub fn f16_to_f32(src: &[half::f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU supports F16C and AVX (run-time detection above).
        unsafe { f16_to_f32_f16c(&src[..n], &mut dst[..n]) };
        return;
    }
    use half::slice::HalfFloatSliceExt;
    src[..n].convert_to_f32_slice(&mut dst[..n]);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c,avx")]
fn f16_to_f32_f16c(src: &[half::f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 ≤ n ≤ both lengths, so the unaligned 16-byte load from src[i..] and
        // 32-byte store to dst[i..] stay inside the slices; f16 is a 2-byte plain value.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = s.to_f32();
    }
}

/// `2 · sqrt(2 / π)`: `gelu_tanh(x) = x · sigmoid(GELU_2C · (x + 0.044715 x³))`, which is
/// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))` written with one exponential.
const GELU_2C: f32 = 1.595_769;

dispatch! {
    /// `gate[i] = gelu_tanh(gate[i]) · up[i]` (GeGLU).
    fn geglu(gate: &mut [f32], up: &[f32]) -> () {
        for (g, u) in gate.iter_mut().zip(up) {
            let x = *g;
            let z = GELU_2C * (x + 0.044_715 * x * x * x);
            *g = x / (1.0 + exp_f32(-z)) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_is_exact_on_every_path() {
        let src: Vec<half::f16> = (0..1037)
            .map(|i| half::f16::from_f32((i as f32 - 500.0) * 0.731))
            .chain([
                half::f16::INFINITY,
                half::f16::MIN_POSITIVE_SUBNORMAL,
                half::f16::NAN,
            ])
            .collect();
        let mut dst = vec![0f32; src.len()];
        f16_to_f32(&src, &mut dst);
        for (s, d) in src.iter().zip(&dst) {
            assert!(s.to_f32() == *d || (s.is_nan() && d.is_nan()), "{s} -> {d}");
        }
    }

    #[test]
    fn row_blocked_attention_kernels_equal_the_row_by_row_loops() {
        for rows in 1..=6 {
            for hd in [16usize, 24, 64, 100] {
                let w = 77;
                let q: Vec<f32> = (0..rows * hd).map(|i| (i as f32 * 0.37).sin()).collect();
                let keys: Vec<f32> = (0..w * hd).map(|i| (i as f32 * 0.11).cos()).collect();
                let mut sc = vec![0f32; rows * w];
                scores_small(&q, &keys, hd, 0.125, &mut sc);
                let mut out: Vec<f32> = (0..rows * hd).map(|i| i as f32 * 0.01).collect();
                let mut want_out = out.clone();
                weighted_sum_small(&sc, &keys, hd, &mut out);
                for r in 0..rows {
                    for j in 0..w {
                        let want = dot(&q[r * hd..(r + 1) * hd], &keys[j * hd..(j + 1) * hd]);
                        assert_eq!(sc[r * w + j], want * 0.125, "rows {rows} hd {hd}");
                        let pv = sc[r * w + j];
                        axpy(
                            &mut want_out[r * hd..(r + 1) * hd],
                            pv,
                            &keys[j * hd..(j + 1) * hd],
                        );
                    }
                }
                assert_eq!(out, want_out, "rows {rows} hd {hd}");
            }
        }
    }

    #[test]
    fn kernels_match_scalar() {
        for n in [0usize, 1, 15, 16, 17, 64, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.31).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.17).cos()).collect();
            let d: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - d).abs() < 1e-4);
            let m = a.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&a), m);
            let mut e = a.clone();
            let s = exp_shift_sum(&mut e, 0.5);
            let want: f32 = a.iter().map(|x| (x - 0.5).exp()).sum();
            assert!((s - want).abs() <= 1e-5 * want.max(1.0));
            if n > 0 {
                let keys: Vec<f32> = (0..3 * n).map(|i| (i as f32 * 0.05).sin()).collect();
                let mut sc = vec![0f32; 2 * 3];
                let q2: Vec<f32> = a.iter().chain(&b).copied().collect();
                scores_small(&q2, &keys, n, 0.5, &mut sc);
                let want = dot(&b, &keys[2 * n..]) * 0.5;
                assert!((sc[5] - want).abs() < 1e-5);
                let mut o = vec![0f32; 2 * n];
                weighted_sum_small(&sc, &keys, n, &mut o);
                let want: f32 = (0..3).map(|j| sc[3 + j] * keys[j * n + 1 % n]).sum();
                assert!((o[n + 1 % n] - want).abs() < 1e-5);
            }
            let mut g = a.clone();
            swiglu(&mut g, &b);
            for i in 0..n {
                let want = a[i] / (1.0 + (-a[i]).exp()) * b[i];
                assert!((g[i] - want).abs() < 1e-6);
            }
            // GeGLU against the tanh form, on a wider range of inputs.
            let x: Vec<f32> = a.iter().map(|v| 6.0 * v).collect();
            let mut g = x.clone();
            geglu(&mut g, &b);
            for i in 0..n {
                let xi = x[i] as f64;
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let gelu = 0.5 * xi * (1.0 + (c * (xi + 0.044715 * xi.powi(3))).tanh());
                let want = (gelu * b[i] as f64) as f32;
                assert!((g[i] - want).abs() < 2e-6, "x {xi}: {} vs {want}", g[i]);
            }
        }
    }
}
