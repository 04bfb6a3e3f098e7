//! Numeric kernels of the forward pass, f32 throughout: RMSNorm, RoPE, linear layers (faer matmul for
//! batches, a rayon matvec for single rows), SwiGLU, and causal grouped-query attention.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// `x[r] = x[r] / rms(x[r]) * weight` for each row `r` of `x` (row-major `rows × weight.len()`).
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    x.par_chunks_mut(dim).for_each(|row| {
        let ss: f32 = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * scale * w;
        }
    });
}

/// Dot product with 16 independent accumulators so that the compiler can vectorize it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
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
    acc.iter().sum::<f32>() + tail
}

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
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for i in 0..half {
                let inv = theta.powf(-(2.0 * i as f64) / head_dim as f64);
                let a = p as f64 * inv;
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

    /// Largest position + 1 the tables cover.
    pub fn max_pos(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    gate.par_chunks_mut(4096)
        .zip(up.par_chunks(4096))
        .for_each(|(g, u)| {
            for (gv, uv) in g.iter_mut().zip(u) {
                *gv = *gv / (1.0 + (-*gv).exp()) * uv;
            }
        });
}

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Row stride (positions) of each KV head's block in the cache.
    pub capacity: usize,
}

/// Query rows per attention task (times the GQA group size).
const QUERY_BLOCK: usize = 64;

/// Causal grouped-query attention of `n` new queries at positions `pos0..pos0 + n` against the cached
/// keys/values `0..pos0 + n`.
///
/// `q` and `out`: row-major `n × (n_heads · head_dim)`. `k_cache`, `v_cache`: `n_kv_heads` blocks of
/// row-major `capacity × head_dim`, positions `0..pos0 + n` filled. Query head `h` reads KV head
/// `h / (n_heads / n_kv_heads)`. One task per (KV head, block of queries) stacks the group's query
/// heads, so each key block is read once per group; scores are `block × keys`, never `n × n × heads`.
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    s: AttnShape,
    pos0: usize,
    n: usize,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let width = s.n_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let n_blocks = n.div_ceil(QUERY_BLOCK);
    let tasks: Vec<(usize, usize)> = (0..s.n_kv_heads)
        .flat_map(|g| (0..n_blocks).map(move |b| (g, b)))
        .collect();
    let results: Vec<(usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(g, b)| {
            let r0 = b * QUERY_BLOCK;
            let r1 = (r0 + QUERY_BLOCK).min(n);
            let rows = (r1 - r0) * group;
            let keys = pos0 + r1;
            // Stack the group's heads: row (r - r0) * group + j is query r of head g * group + j.
            let mut qb = vec![0f32; rows * hd];
            for r in r0..r1 {
                for j in 0..group {
                    let h = g * group + j;
                    let src = &q[r * width + h * hd..r * width + (h + 1) * hd];
                    let row = (r - r0) * group + j;
                    qb[row * hd..(row + 1) * hd].copy_from_slice(src);
                }
            }
            let kb = &k_cache[g * s.capacity * hd..(g * s.capacity + keys) * hd];
            let vb = &v_cache[g * s.capacity * hd..(g * s.capacity + keys) * hd];
            let mut scores = vec![0f32; rows * keys];
            matmul(
                MatMut::from_row_major_slice_mut(&mut scores, rows, keys),
                Accum::Replace,
                MatRef::from_row_major_slice(&qb, rows, hd),
                MatRef::from_row_major_slice(kb, keys, hd).transpose(),
                scale,
                Par::Seq,
            );
            for (row, sr) in scores.chunks_exact_mut(keys).enumerate() {
                let valid = pos0 + r0 + row / group + 1;
                softmax_prefix(sr, valid);
            }
            let mut ob = vec![0f32; rows * hd];
            matmul(
                MatMut::from_row_major_slice_mut(&mut ob, rows, hd),
                Accum::Replace,
                MatRef::from_row_major_slice(&scores, rows, keys),
                MatRef::from_row_major_slice(vb, keys, hd),
                1.0f32,
                Par::Seq,
            );
            (g, b, ob)
        })
        .collect();
    for (g, b, ob) in results {
        let r0 = b * QUERY_BLOCK;
        for (row, src) in ob.chunks_exact(hd).enumerate() {
            let r = r0 + row / group;
            let h = g * group + row % group;
            out[r * width + h * hd..r * width + (h + 1) * hd].copy_from_slice(src);
        }
    }
}

/// Softmax over `x[..valid]` in place; `x[valid..]` (future positions) set to zero.
pub fn softmax_prefix(x: &mut [f32], valid: usize) {
    let (live, dead) = x.split_at_mut(valid.min(x.len()));
    dead.fill(0.0);
    let max = live.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in live.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in live.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_batch_matches_matvec() {
        let (n, i, o) = (3, 37, 5);
        let x: Vec<f32> = (0..n * i).map(|v| (v as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..o * i).map(|v| (v as f32 * 0.11).cos()).collect();
        let mut y = vec![0f32; n * o];
        linear(&x, n, &w, o, i, &mut y);
        for r in 0..n {
            let mut y1 = vec![0f32; o];
            linear(&x[r * i..(r + 1) * i], 1, &w, o, i, &mut y1);
            for c in 0..o {
                assert!((y[r * o + c] - y1[c]).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn attention_matches_naive() {
        let s = AttnShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            capacity: 150,
        };
        let n = 130;
        let width = s.n_heads * s.head_dim;
        let q: Vec<f32> = (0..n * width).map(|v| (v as f32 * 0.013).sin()).collect();
        let kc: Vec<f32> = (0..s.n_kv_heads * s.capacity * s.head_dim)
            .map(|v| (v as f32 * 0.029).cos())
            .collect();
        let vc: Vec<f32> = (0..kc.len()).map(|v| (v as f32 * 0.007).sin()).collect();
        // Prefill of all n at once vs. the last 3 one by one (decode), vs. a naive loop.
        let mut out = vec![0f32; n * width];
        attention(&q, &kc, &vc, s, 0, n, &mut out);
        let mut out_dec = vec![0f32; width];
        attention(&q[(n - 1) * width..], &kc, &vc, s, n - 1, 1, &mut out_dec);
        let hd = s.head_dim;
        for r in [0, 63, 64, n - 1] {
            for h in 0..s.n_heads {
                let g = h / 2;
                let qh = &q[r * width + h * hd..r * width + (h + 1) * hd];
                let sc: Vec<f32> = (0..=r)
                    .map(|t| dot(qh, &kc[(g * s.capacity + t) * hd..][..hd]) / (hd as f32).sqrt())
                    .collect();
                let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = sc.iter().map(|v| (v - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..hd {
                    let o: f32 = (0..=r)
                        .map(|t| e[t] / z * vc[(g * s.capacity + t) * hd + d])
                        .sum();
                    assert!(
                        (out[r * width + h * hd + d] - o).abs() < 1e-5,
                        "r {r} h {h} d {d}"
                    );
                    if r == n - 1 {
                        assert!((out_dec[h * hd + d] - o).abs() < 1e-5);
                    }
                }
            }
        }
    }
}
