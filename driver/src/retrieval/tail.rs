//! A sampled estimate of the attention that top-k retrieval leaves out.
//!
//! Top-k attention renormalises over the keys it kept, so it overweights them by the mass of
//! the keys it dropped (about 6 % on SmolLM2 at 8K with k = 100). Scoring a stratified sample of
//! `m` of the dropped keys and weighting each by `dropped / m` estimates that missing part of
//! the softmax sum and of the output: the sampled part enters the exact merge of
//! [`Partial::merge`] scaled by that weight (MagicPIG and vAttention make the same correction
//! with other samplers). With `m = 0` nothing is added.

use super::ids::Pos;
use super::softmax::Partial;

/// Reusable buffers of the sampler.
#[derive(Clone, Debug, Default)]
pub struct TailScratch {
    retrieved: Vec<usize>,
    sampled: Vec<usize>,
}

/// The sampled part for query `q` over the rest `sink..rest_end` without the `retrieved`
/// positions: `m` strata of equal width, one position per stratum at the same offset (drawn
/// from `seed`), those retrieved dropped, the rest weighted by `dropped / sampled`. Empty when
/// nothing is left out or `m == 0`.
#[allow(clippy::too_many_arguments)]
pub fn tail_part(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    rest: std::ops::Range<usize>,
    retrieved: &[Pos],
    m: usize,
    seed: u64,
    scale: f32,
    scores: &mut Vec<f32>,
    scratch: &mut TailScratch,
) -> Partial {
    let d = q.len();
    let len = rest.len();
    let dropped = len.saturating_sub(retrieved.len());
    scratch.sampled.clear();
    if m == 0 || dropped == 0 {
        return Partial::empty(d);
    }
    scratch.retrieved.clear();
    scratch.retrieved.extend(retrieved.iter().map(|p| p.0));
    scratch.retrieved.sort_unstable();
    if dropped <= m {
        // Fewer left-out keys than samples: take them all, with weight 1.
        scratch
            .sampled
            .extend(rest.filter(|p| scratch.retrieved.binary_search(p).is_err()));
    } else {
        let stride = len as f64 / m as f64;
        let offset = unit(seed) * stride;
        scratch.sampled.extend(
            (0..m)
                .map(|i| rest.start + ((i as f64 * stride + offset) as usize).min(len - 1))
                .filter(|p| scratch.retrieved.binary_search(p).is_err()),
        );
    }
    if scratch.sampled.is_empty() {
        return Partial::empty(d);
    }
    let weight = dropped as f32 / scratch.sampled.len() as f32;
    let mut part = Partial::over(q, k, v, scratch.sampled.iter().copied(), scale, scores);
    part.scale_by(weight);
    part
}

/// Number of positions [`tail_part`] scored last.
pub fn sampled(scratch: &TailScratch) -> usize {
    scratch.sampled.len()
}

/// A uniform number in `[0, 1)` from a seed (SplitMix64).
fn unit(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let f = |i: usize| ((i as f32) * 0.618).sin();
        let q: Vec<f32> = (0..d).map(|i| f(i + 7)).collect();
        let k: Vec<f32> = (0..n * d).map(|i| f(3 * i + 1)).collect();
        let v: Vec<f32> = (0..n * d).map(|i| f(5 * i + 2)).collect();
        (q, k, v)
    }

    #[test]
    fn every_left_out_key_once_when_samples_cover_them() {
        let (q, k, v) = data(40, 8);
        let retrieved = [Pos(12), Pos(3), Pos(30)];
        let mut scores = Vec::new();
        let mut scratch = TailScratch::default();
        let part = tail_part(
            &q,
            &k,
            &v,
            2..40,
            &retrieved,
            64,
            1,
            0.5,
            &mut scores,
            &mut scratch,
        );
        let expect: Vec<usize> = (2..40).filter(|&p| !retrieved.contains(&Pos(p))).collect();
        assert_eq!(scratch.sampled, expect);
        let exact = Partial::over(&q, &k, &v, expect.iter().copied(), 0.5, &mut scores);
        assert_eq!(part.max, exact.max);
        assert_eq!(part.sum, exact.sum);
    }

    #[test]
    fn sampled_sum_is_weighted_to_the_left_out_count() {
        let (q, k, v) = data(1000, 8);
        let mut scores = Vec::new();
        let mut scratch = TailScratch::default();
        let retrieved: Vec<Pos> = (100..200).map(Pos).collect();
        // With q = 0 every score is 0: the estimate of Σ exp(0) must be the left-out count.
        let zero = vec![0.0; 8];
        let part = tail_part(
            &zero,
            &k,
            &v,
            0..1000,
            &retrieved,
            50,
            9,
            1.0,
            &mut scores,
            &mut scratch,
        );
        assert!(sampled(&scratch) > 0 && sampled(&scratch) <= 50);
        assert!(scratch.sampled.iter().all(|p| !(100..200).contains(p)));
        let total = part.sum * part.max.exp();
        assert!((total - 900.0).abs() < 1e-2, "{total}");
        let none = tail_part(
            &q,
            &k,
            &v,
            0..1000,
            &retrieved,
            0,
            9,
            1.0,
            &mut scores,
            &mut scratch,
        );
        assert_eq!(none.max, f32::NEG_INFINITY);
    }
}
