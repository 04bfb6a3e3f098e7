//! Numeric kernels of the forward pass, f32 throughout: RMSNorm, RoPE, linear layers (faer matmul for
//! batches, a rayon matvec for single rows), SwiGLU, and causal grouped-query attention.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// `x[r] = x[r] / rms(x[r]) * weight` for each row `r` of `x` (row-major `rows × weight.len()`).
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    x.par_chunks_mut(dim).for_each(|row| {
        let ss = simd::dot(row, row) / dim as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * scale * w;
        }
    });
}

use super::simd;
pub use super::simd::{dot, exp_f32};

/// `y = x · wᵀ`: `x` is row-major `n × in_dim`, `w` row-major `out_dim × in_dim` (a PyTorch
/// `Linear` weight), `y` row-major `n × out_dim`. Batches go through faer; a single row is a
/// rayon-parallel matvec (one dot product per output row).
pub fn linear(x: &[f32], n: usize, w: &[f32], out_dim: usize, in_dim: usize, y: &mut [f32]) {
    debug_assert_eq!(x.len(), n * in_dim);
    debug_assert_eq!(w.len(), out_dim * in_dim);
    debug_assert_eq!(y.len(), n * out_dim);
    if n == 1 {
        y.par_chunks_mut(64).enumerate().for_each(|(c, ys)| {
            for (j, yv) in ys.iter_mut().enumerate() {
                let o = c * 64 + j;
                *yv = dot(x, &w[o * in_dim..(o + 1) * in_dim]);
            }
        });
        return;
    }
    let xm = MatRef::from_row_major_slice(x, n, in_dim);
    let wt = MatRef::from_row_major_slice(w, out_dim, in_dim).transpose();
    let ym = MatMut::from_row_major_slice_mut(y, n, out_dim);
    matmul(ym, Accum::Replace, xm, wt, 1.0f32, Par::rayon(0));
}

/// [`linear`] as `n` matvecs (a decode step of `n` sequences): each weight row is read once
/// for all rows, and each row's result is the one [`linear`] gives it alone.
pub fn linear_matvecs(
    x: &[f32],
    n: usize,
    w: &[f32],
    out_dim: usize,
    in_dim: usize,
    y: &mut [f32],
) {
    if n <= 1 {
        return linear(x, n, w, out_dim, in_dim, y);
    }
    // Row-major `out_dim × n`, then transposed.
    let mut yt = vec![0f32; out_dim * n];
    yt.par_chunks_mut(64 * n).enumerate().for_each(|(c, ys)| {
        for (j, yr) in ys.chunks_exact_mut(n).enumerate() {
            let o = c * 64 + j;
            let wr = &w[o * in_dim..(o + 1) * in_dim];
            for (yv, xr) in yr.iter_mut().zip(x.chunks_exact(in_dim)) {
                *yv = dot(xr, wr);
            }
        }
    });
    for (o, yr) in yt.chunks_exact(n).enumerate() {
        for (r, &v) in yr.iter().enumerate() {
            y[r * out_dim + o] = v;
        }
    }
}

/// Rotary embedding tables: `cos[p * half + i]`, `sin[..]` for position `p` and pair `i`, with
/// frequency `theta^(-2i / head_dim)` (angles computed in f64, stored as f32).
#[derive(Debug)]
pub struct Rope {
    pub half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, max_pos: usize) -> Self {
        Self::scaled(head_dim, theta, 1.0, max_pos)
    }

    /// [`Rope::new`] with positions divided by `linear` (linear scaling, position
    /// interpolation; `Config::with_rope_scaling`).
    pub fn scaled(head_dim: usize, theta: f64, linear: f64, max_pos: usize) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for i in 0..half {
                let inv = theta.powf(-(2.0 * i as f64) / head_dim as f64);
                let a = p as f64 / linear * inv;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Self { half, cos, sin }
    }

    /// Rotates each head of each row in place, Hugging Face rotate-half layout (dims `i` and
    /// `i + half` form a pair). `x` is row-major `n × (n_heads · 2·half)`, row `r` at position `pos0 + r`.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, pos0: usize) {
        let hd = 2 * self.half;
        let width = n_heads * hd;
        x.par_chunks_mut(width).enumerate().for_each(|(r, row)| {
            let p = pos0 + r;
            let c = &self.cos[p * self.half..(p + 1) * self.half];
            let s = &self.sin[p * self.half..(p + 1) * self.half];
            for head in row.chunks_exact_mut(hd) {
                let (a, b) = head.split_at_mut(self.half);
                for i in 0..self.half {
                    let (x0, x1) = (a[i], b[i]);
                    a[i] = x0 * c[i] - x1 * s[i];
                    b[i] = x1 * c[i] + x0 * s[i];
                }
            }
        });
    }

    /// The tables: `cos` and `sin`, each `max_pos × half`.
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// Largest position + 1 the tables cover.
    pub fn max_pos(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    gate.par_chunks_mut(4096)
        .zip(up.par_chunks(4096))
        .for_each(|(g, u)| simd::swiglu(g, u));
}

/// `gate[i] = gelu_tanh(gate[i]) * up[i]` (GeGLU, Gemma 3).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    gate.par_chunks_mut(4096)
        .zip(up.par_chunks(4096))
        .for_each(|(g, u)| simd::geglu(g, u));
}

/// `x[i] *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    x.par_chunks_mut(4096).for_each(|c| {
        for v in c {
            *v *= s;
        }
    });
}

pub use super::attend::{attention, AttnShape, KvElem};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_f32_is_accurate() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let rel = ((exp_f32(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 5e-7, "worst relative error {worst:e}");
        assert!(exp_f32(f32::NEG_INFINITY) < 1e-37);
        assert!(exp_f32(-1000.0) < 1e-37 && exp_f32(0.0) == 1.0);
    }

    #[test]
    fn linear_batch_matches_matvec() {
        // A GEMM, equal up to rounding; as matvecs, each row's exactly.
        for n in [3, 11] {
            linear_rows_match_matvec(n);
        }
    }

    fn linear_rows_match_matvec(n: usize) {
        let (i, o) = (37, 70);
        let x: Vec<f32> = (0..n * i).map(|v| (v as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..o * i).map(|v| (v as f32 * 0.11).cos()).collect();
        let mut y = vec![0f32; n * o];
        linear(&x, n, &w, o, i, &mut y);
        let mut ym = vec![0f32; n * o];
        linear_matvecs(&x, n, &w, o, i, &mut ym);
        for r in 0..n {
            let mut y1 = vec![0f32; o];
            linear(&x[r * i..(r + 1) * i], 1, &w, o, i, &mut y1);
            for c in 0..o {
                assert!((y[r * o + c] - y1[c]).abs() < 1e-4);
                assert_eq!(ym[r * o + c], y1[c]);
            }
        }
    }
}
