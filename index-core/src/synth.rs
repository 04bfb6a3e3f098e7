//! A small seeded generator of attention-like out-of-distribution data, for unit tests.
//!
//! It follows the model of `shared/tools/synth_ood.py` in miniature: hidden states from a
//! low-rank Gaussian mixture, keys and queries from two independent projections with different
//! per-channel scales, a large shared key offset on the slow RoPE pairs, then rotate-half RoPE.
//! Performance targets never use it: they run on that script's output through a dump.

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

/// A seeded random source (a thin wrapper so tests need no `rand` imports).
#[derive(Debug)]
pub struct Rng(StdRng);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(StdRng::seed_from_u64(seed))
    }

    /// A standard normal sample.
    pub fn normal(&mut self) -> f32 {
        StandardNormal.sample(&mut self.0)
    }

    /// A uniform sample in `[0, 1)`.
    pub fn uniform(&mut self) -> f32 {
        self.0.random::<f32>()
    }

    /// A uniform index in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n)
    }
}

/// Synthetic keys and queries of one head; all matrices row-major with `dim` columns.
#[derive(Clone, Debug)]
pub struct SynthData {
    pub dim: usize,
    /// `n × dim` indexed keys.
    pub keys: Vec<f32>,
    /// `n × dim` training queries (same tokens as the keys).
    pub train_queries: Vec<f32>,
    /// `m × dim` test queries (new tokens).
    pub test_queries: Vec<f32>,
    /// `m × dim` keys of the test tokens (not indexed; K→K queries).
    pub heldout_keys: Vec<f32>,
}

/// Generates `n` keys/training queries and `m` test queries of dimension `dim` (even).
pub fn ood(n: usize, m: usize, dim: usize, seed: u64) -> SynthData {
    let dim = dim.max(2) & !1;
    let (hidden, rank, clusters) = (48usize, 8usize, 12usize);
    let mut rng = Rng::new(seed);
    let mat = |rows: usize, cols: usize, scale: f32, rng: &mut Rng| -> Vec<f32> {
        (0..rows * cols).map(|_| rng.normal() * scale).collect()
    };
    let basis = mat(rank, hidden, 1.0 / (hidden as f32).sqrt(), &mut rng);
    let centres = mat(clusters, rank, 2.0, &mut rng);
    let half = dim / 2;
    let chan = |rng: &mut Rng| -> Vec<f32> {
        let s: Vec<f32> = (0..half).map(|_| rng.normal().exp()).collect();
        (0..dim).map(|j| s[j % half]).collect()
    };
    let (sk, sq) = (chan(&mut rng), chan(&mut rng));
    let wk = mat(hidden, dim, 1.0 / (rank as f32).sqrt(), &mut rng);
    let wq = mat(hidden, dim, 1.0 / (rank as f32).sqrt(), &mut rng);
    let mut bias = vec![0.0f32; dim];
    for b in bias.iter_mut() {
        *b = 0.3 * rng.normal();
    }
    for p in half.saturating_sub(2)..half {
        bias[p] += 4.0 * if rng.uniform() < 0.5 { -1.0 } else { 1.0 };
        bias[p + half] += 4.0 * if rng.uniform() < 0.5 { -1.0 } else { 1.0 };
    }
    let token = |pos: usize, rng: &mut Rng| -> (Vec<f32>, Vec<f32>) {
        let c = rng.below(clusters);
        let z: Vec<f32> = (0..rank)
            .map(|r| centres[c * rank + r] + rng.normal())
            .collect();
        let mut h = vec![0.0f32; hidden];
        for (r, zr) in z.iter().enumerate() {
            for (j, hj) in h.iter_mut().enumerate() {
                *hj += zr * basis[r * hidden + j];
            }
        }
        for hj in h.iter_mut() {
            *hj += 0.05 * rng.normal();
        }
        let project = |w: &[f32], scale: &[f32], b: Option<&[f32]>| -> Vec<f32> {
            let mut v: Vec<f32> = (0..dim)
                .map(|j| {
                    let mut s = 0.0;
                    for (i, hi) in h.iter().enumerate() {
                        s += hi * w[i * dim + j];
                    }
                    s * scale[j] + b.map_or(0.0, |b| b[j])
                })
                .collect();
            rope(&mut v, pos, 10_000.0);
            v
        };
        (project(&wk, &sk, Some(&bias)), project(&wq, &sq, None))
    };
    let mut data = SynthData {
        dim,
        keys: Vec::with_capacity(n * dim),
        train_queries: Vec::with_capacity(n * dim),
        test_queries: Vec::with_capacity(m * dim),
        heldout_keys: Vec::with_capacity(m * dim),
    };
    for pos in 0..n {
        let (k, q) = token(pos, &mut rng);
        data.keys.extend(k);
        data.train_queries.extend(q);
    }
    for _ in 0..m {
        let pos = rng.below(n.max(1));
        let (k, q) = token(pos, &mut rng);
        data.heldout_keys.extend(k);
        data.test_queries.extend(q);
    }
    data
}

/// Rotate-half RoPE in place: dims `i` and `i + dim/2` rotate by `pos · base^(−2i/dim)`.
pub fn rope(v: &mut [f32], pos: usize, base: f64) {
    let half = v.len() / 2;
    for i in 0..half {
        let theta = pos as f64 * base.powf(-2.0 * i as f64 / v.len() as f64);
        let (s, c) = theta.sin_cos();
        let (a, b) = (v[i] as f64, v[i + half] as f64);
        v[i] = (a * c - b * s) as f32;
        v[i + half] = (a * s + b * c) as f32;
    }
}
