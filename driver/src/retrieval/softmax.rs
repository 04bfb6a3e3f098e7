//! Partial softmax attention over a set of positions, and the exact merge of parts
//! (docs/DESIGN.md §2): each part carries `(max, sum, o)` — the largest scaled score, the sum of
//! `exp(score − max)` and the unnormalised output `Σ exp(score − max) · v` — and parts merge by
//! rescaling with `exp(max_i − max)`. The split adds no error beyond which keys were chosen.

use qkindex_model::simd;

/// Attention over one part of the keys for one query head.
#[derive(Clone, Debug)]
pub struct Partial {
    /// Largest scaled score (−∞ for an empty part).
    pub max: f32,
    /// `Σ exp(score − max)`.
    pub sum: f32,
    /// `Σ exp(score − max) · v`, `head_dim` values.
    pub o: Vec<f32>,
}

impl Partial {
    /// The part of no keys.
    pub fn empty(head_dim: usize) -> Self {
        Partial {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            o: vec![0.0; head_dim],
        }
    }

    /// Attention of `q` over `positions` of one KV head's rows (`k`, `v`: row-major, `head_dim`
    /// wide), with scores `scale · q·k`. `scores` is a scratch buffer.
    pub fn over(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        positions: impl Iterator<Item = usize> + Clone,
        scale: f32,
        scores: &mut Vec<f32>,
    ) -> Self {
        let d = q.len();
        Self::scores_over(q, k, positions.clone(), scale, scores);
        let mut part = Partial::empty(d);
        part.max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if part.max == f32::NEG_INFINITY {
            return part;
        }
        for (p, s) in positions.zip(scores.iter()) {
            let w = (s - part.max).exp();
            part.sum += w;
            simd::axpy(&mut part.o, w, &v[p * d..(p + 1) * d]);
        }
        part
    }

    /// Only the scores of [`Partial::over`]: `scores[i] = scale · q·k[positions[i]]`.
    pub fn scores_over(
        q: &[f32],
        k: &[f32],
        positions: impl Iterator<Item = usize>,
        scale: f32,
        scores: &mut Vec<f32>,
    ) {
        let d = q.len();
        scores.clear();
        scores.extend(positions.map(|p| scale * simd::dot(q, &k[p * d..(p + 1) * d])));
    }

    /// Multiplies the part's weight in a merge by `w > 0` (its sum and output together).
    pub fn scale_by(&mut self, w: f32) {
        if self.max > f32::NEG_INFINITY {
            self.max += w.ln();
        }
    }

    /// Merges parts into the normalised attention output (`out`, `head_dim` values). With no
    /// keys in any part the output is zero.
    pub fn merge(parts: &[Partial], out: &mut [f32]) {
        out.fill(0.0);
        let max = parts
            .iter()
            .map(|p| p.max)
            .fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return;
        }
        let mut sum = 0.0f32;
        for p in parts.iter().filter(|p| p.max > f32::NEG_INFINITY) {
            let w = (p.max - max).exp();
            sum += p.sum * w;
            simd::axpy(out, w, &p.o);
        }
        let inv = 1.0 / sum;
        for x in out.iter_mut() {
            *x *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: softmax over `positions` in f64, then the weighted sum of values.
    fn full(q: &[f32], k: &[f32], v: &[f32], positions: &[usize], scale: f32) -> Vec<f64> {
        let d = q.len();
        let s: Vec<f64> = positions
            .iter()
            .map(|&p| {
                scale as f64
                    * (0..d)
                        .map(|i| q[i] as f64 * k[p * d + i] as f64)
                        .sum::<f64>()
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        (0..d)
            .map(|i| {
                positions
                    .iter()
                    .zip(&w)
                    .map(|(&p, wi)| wi * v[p * d + i] as f64)
                    .sum::<f64>()
                    / z
            })
            .collect()
    }

    fn data(n: usize, d: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut rng = qkindex::synth::Rng::new(seed);
        let q = (0..d).map(|_| 3.0 * rng.normal()).collect();
        let k = (0..n * d).map(|_| rng.normal()).collect();
        let v = (0..n * d).map(|_| rng.normal()).collect();
        (q, k, v)
    }

    #[test]
    fn merged_parts_equal_softmax_over_the_union() {
        let (n, d) = (300, 24);
        let (q, k, v) = data(n, d, 5);
        let scale = 1.0 / (d as f32).sqrt();
        let splits: [(Vec<usize>, Vec<usize>); 4] = [
            (
                (0..128).chain(250..300).collect(),
                vec![140, 7 + 128, 200, 201, 131],
            ),
            ((0..300).collect(), vec![]),
            (vec![], (0..300).step_by(3).collect()),
            ((0..10).collect(), (200..260).collect()),
        ];
        let mut scores = Vec::new();
        for (a, b) in splits {
            let pa = Partial::over(&q, &k, &v, a.iter().copied(), scale, &mut scores);
            let pb = Partial::over(&q, &k, &v, b.iter().copied(), scale, &mut scores);
            let mut out = vec![0f32; d];
            Partial::merge(&[pa, pb], &mut out);
            let union: Vec<usize> = a.iter().chain(&b).copied().collect();
            let want = full(&q, &k, &v, &union, scale);
            for (x, y) in out.iter().zip(&want) {
                assert!((*x as f64 - y).abs() < 1e-5, "{x} vs {y}");
            }
        }
    }

    #[test]
    fn empty_parts_give_zero_and_do_not_disturb() {
        let d = 8;
        let mut out = vec![1f32; d];
        Partial::merge(&[Partial::empty(d), Partial::empty(d)], &mut out);
        assert!(out.iter().all(|&x| x == 0.0));
        Partial::merge(&[], &mut out);
        assert!(out.iter().all(|&x| x == 0.0));
    }
}
