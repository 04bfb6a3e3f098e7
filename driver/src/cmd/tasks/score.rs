//! Scoring as RULER does: a sample scores the percentage of its expected strings found in the
//! generated text (`string_match_all`, case-insensitive); a task the mean over its samples,
//! with Wilson's 95 % interval on `p = mean / 100` over the `n` samples.
//!
//! Wilson's interval is exact-binomial-like for 0/100 scores, and it stays honest for the
//! partial scores of vt, cwe or multi-value: a score in [0, 1] with mean `p` has variance at
//! most `p (1 − p)`, the Bernoulli's, so the interval Wilson draws for `p` with that variance is
//! never narrower than the data allow. A normal interval on the sample variance is not: five
//! equal partial scores (vt's 20, 20, 20, 20, 20) gave it zero width.

/// z of a two-sided 95 % interval.
const Z95: f64 = 1.959963984540054;

/// 100 × the fraction of `expected` that occur in `generated`, ignoring case.
pub fn string_match_all(generated: &str, expected: &[String]) -> f64 {
    if expected.is_empty() {
        return 0.0;
    }
    let g = generated.to_lowercase();
    let found = expected
        .iter()
        .filter(|e| g.contains(&e.to_lowercase()))
        .count();
    100.0 * found as f64 / expected.len() as f64
}

/// A task's score over its samples.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Score {
    pub mean: f64,
    pub lo: f64,
    pub hi: f64,
    /// `wilson` (`none` when there is no sample).
    pub interval: &'static str,
    pub n: usize,
}

/// The mean of `scores` (each in [0, 100]) and its 95 % interval.
pub fn summarize(scores: &[f64]) -> Score {
    let n = scores.len();
    if n == 0 {
        return Score {
            mean: 0.0,
            lo: 0.0,
            hi: 100.0,
            interval: "none",
            n,
        };
    }
    let mean = scores.iter().sum::<f64>() / n as f64;
    let (lo, hi) = wilson(mean / 100.0, n);
    Score {
        mean,
        lo: 100.0 * lo,
        hi: 100.0 * hi,
        interval: "wilson",
        n,
    }
}

/// Wilson's 95 % score interval of a proportion `p` (in [0, 1]; `k / n` for `k` successes)
/// observed over `n` samples.
pub fn wilson(p: f64, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (nf, p, z2) = (n as f64, p.clamp(0.0, 1.0), Z95 * Z95);
    let centre = (p + z2 / (2.0 * nf)) / (1.0 + z2 / nf);
    let half = Z95 / (1.0 + z2 / nf) * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn string_match_all_cases() {
        assert_eq!(string_match_all(" 1234567.", &s(&["1234567"])), 100.0);
        assert_eq!(string_match_all(" 123456", &s(&["1234567"])), 0.0);
        assert_eq!(
            string_match_all("Apple, RIVER and", &s(&["apple", "river", "lemon", "oak"])),
            50.0
        );
        assert_eq!(
            string_match_all("QZKRT MLPAE", &s(&["qzkrt", "mlpae"])),
            100.0
        );
        assert_eq!(string_match_all("anything", &[]), 0.0);
        assert_eq!(string_match_all("", &s(&["x"])), 0.0);
    }

    #[test]
    fn wilson_known_values() {
        // k = 8 of n = 10: [0.4902, 0.9433]; 0 of 10: [0, 0.2775]; 10 of 10: [0.7225, 1].
        let (lo, hi) = wilson(0.8, 10);
        assert!(
            (lo - 0.4902).abs() < 1e-4 && (hi - 0.9433).abs() < 1e-4,
            "{lo} {hi}"
        );
        let (lo, hi) = wilson(0.0, 10);
        assert!(lo.abs() < 1e-12 && (hi - 0.2775).abs() < 1e-4, "{lo} {hi}");
        let (lo, hi) = wilson(1.0, 10);
        assert!(
            (lo - 0.7225).abs() < 1e-4 && (hi - 1.0).abs() < 1e-12,
            "{lo} {hi}"
        );
        assert_eq!(wilson(0.0, 0), (0.0, 1.0));
    }

    #[test]
    fn summaries_use_wilson_for_binary_and_partial_scores() {
        let b = summarize(&[100.0, 0.0, 100.0, 100.0]);
        assert_eq!((b.mean, b.interval, b.n), (75.0, "wilson", 4));
        let (lo, hi) = wilson(0.75, 4);
        assert!((b.lo - 100.0 * lo).abs() < 1e-9 && (b.hi - 100.0 * hi).abs() < 1e-9);
        // Five equal partial scores: the interval of p = 0.2 over 5 samples, not zero width.
        let p = summarize(&[20.0; 5]);
        let (lo, hi) = wilson(0.2, 5);
        assert!((p.lo - 100.0 * lo).abs() < 1e-9 && (p.hi - 100.0 * hi).abs() < 1e-9);
        assert!(p.lo < 5.0 && p.hi > 60.0, "{p:?}");
        // Partial scores are never given a narrower interval than 0/100 scores of the same
        // mean and count (the Bernoulli has the largest variance of a bounded score).
        let binary = summarize(&[100.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!((p.lo, p.hi), (binary.lo, binary.hi));
        let one = summarize(&[50.0]);
        assert!(one.lo < 10.0 && one.hi > 90.0, "{one:?}");
        assert_eq!(summarize(&[]).interval, "none");
    }
}
