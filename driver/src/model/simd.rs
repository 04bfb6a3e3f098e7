//! Hot f32 loops written so that LLVM vectorizes them, each compiled twice on x86-64: portable
//! (SSE2) and with AVX2+FMA enabled, chosen at run time by CPU feature detection (done once).
//! On aarch64 there is one build, and it is the NEON one: Advanced SIMD is part of the aarch64
//! baseline (the `aarch64-unknown-linux-gnu` target enables it), so the portable code already
//! vectorizes to 4-lane NEON and no wider instruction set exists to select at run time (SVE is
//! not in Rust's stable intrinsics and LLVM does not auto-vectorize these loops for it without a
//! `target-cpu`). No intrinsics: the same source gives the same results on every path (no FMA
//! contraction), so the choice never changes outputs. See STYLE.md §4 (`target_feature`, detect
//! once).

use super::ops::exp_f32;

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

dispatch! {
    /// Scores of a few query rows against a key tile: `scores[i · w + j] = scale · q_i · k_j`, with
    /// `q` row-major `rows × hd`, `keys` row-major `w × hd`, `scores` `rows × w`. One call per tile
    /// keeps the dot products inlined (decode, where a GEMM call per tile costs more than it saves).
    fn scores_small(q: &[f32], keys: &[f32], hd: usize, scale: f32, scores: &mut [f32]) -> () {
        let w = keys.len() / hd;
        for (sr, qr) in scores.chunks_exact_mut(w).zip(q.chunks_exact(hd)) {
            for (sv, kr) in sr.iter_mut().zip(keys.chunks_exact(hd)) {
                *sv = dot_impl(qr, kr) * scale;
            }
        }
    }
}

dispatch! {
    /// `out_i += Σ_j p[i · w + j] · v_j` for a few rows: `p` row-major `rows × w`, `values`
    /// row-major `w × hd`, `out` `rows × hd`.
    fn weighted_sum_small(p: &[f32], values: &[f32], hd: usize, out: &mut [f32]) -> () {
        let w = values.len() / hd;
        for (pr, or) in p.chunks_exact(w).zip(out.chunks_exact_mut(hd)) {
            for (&pv, vr) in pr.iter().zip(values.chunks_exact(hd)) {
                axpy_impl(or, pv, vr);
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
