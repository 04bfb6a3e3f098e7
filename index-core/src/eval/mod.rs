//! Quality metrics of retrieved keys (DESIGN.md §3): recall@k, softmax attention mass, and the
//! cosine between sparse and full attention outputs.

use crate::metric::dot;

/// `|found ∩ exact| / |exact|` (the recall@k of one query when `exact` is its exact top-k).
/// Returns 1 for an empty `exact`.
pub fn recall(found: &[u32], exact: &[u32]) -> f64 {
    if exact.is_empty() {
        return 1.0;
    }
    let hits = exact.iter().filter(|e| found.contains(e)).count();
    hits as f64 / exact.len() as f64
}

/// Softmax weights of `query` over all rows of `keys` (row-major, `dim` columns), with scale
/// `1/√dim`, computed stably in f64.
pub fn softmax_weights(query: &[f32], keys: &[f32], dim: usize) -> Vec<f64> {
    let scale = 1.0 / (dim as f64).sqrt();
    let logits: Vec<f64> = keys
        .chunks_exact(dim)
        .map(|k| dot(query, k) as f64 * scale)
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut w: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = w.iter().sum();
    w.iter_mut().for_each(|x| *x /= sum);
    w
}

/// Softmax mass (over all keys) of the keys `ids`, given the weights of [`softmax_weights`].
pub fn mass(weights: &[f64], ids: &[u32]) -> f64 {
    ids.iter().map(|&i| weights[i as usize]).sum()
}

/// Cosine between the attention output over `ids` only (renormalised) and the full output,
/// with `values` row-major `n × dim_v`.
pub fn output_cosine(weights: &[f64], ids: &[u32], values: &[f32], dim_v: usize) -> f64 {
    let mut full = vec![0.0f64; dim_v];
    for (w, v) in weights.iter().zip(values.chunks_exact(dim_v)) {
        for (o, &x) in full.iter_mut().zip(v) {
            *o += w * x as f64;
        }
    }
    let mut part = vec![0.0f64; dim_v];
    for &i in ids {
        let w = weights[i as usize];
        let v = &values[i as usize * dim_v..(i as usize + 1) * dim_v];
        for (o, &x) in part.iter_mut().zip(v) {
            *o += w * x as f64;
        }
    }
    let dot: f64 = full.iter().zip(&part).map(|(a, b)| a * b).sum();
    let na: f64 = full.iter().map(|a| a * a).sum::<f64>().sqrt();
    let nb: f64 = part.iter().map(|b| b * b).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_counts_overlap() {
        assert_eq!(recall(&[1, 2, 3], &[3, 4, 1, 9]), 0.5);
        assert_eq!(recall(&[], &[]), 1.0);
    }

    #[test]
    fn mass_of_all_keys_is_one_and_full_output_has_cosine_one() {
        let keys = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let w = softmax_weights(&[2.0, -1.0], &keys, 2);
        assert!((mass(&w, &[0, 1, 2]) - 1.0).abs() < 1e-12);
        assert!(mass(&w, &[0]) > mass(&w, &[1]));
        let values = [1.0, 2.0, -1.0, 0.5, 3.0, 3.0];
        assert!((output_cosine(&w, &[0, 1, 2], &values, 2) - 1.0).abs() < 1e-12);
    }
}
