//! Scoring as RULER does: a sample scores the percentage of its expected strings found in the
//! generated text (`string_match_all`, case-insensitive); a task the mean over its samples,
//! with a 95 % interval: Wilson's when every sample scored 0 or 100, else the normal interval
//! on the mean (mean ± 1.96 s/√n, clamped to [0, 100]; a single sample's is [0, 100]).

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
    /// `wilson` or `normal`.
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
    let binary = scores.iter().all(|&s| s == 0.0 || s == 100.0);
    if binary {
        let k = scores.iter().filter(|&&s| s == 100.0).count();
        let (lo, hi) = wilson(k, n);
        return Score {
            mean,
            lo: 100.0 * lo,
            hi: 100.0 * hi,
            interval: "wilson",
            n,
        };
    }
    let (lo, hi) = if n < 2 {
        (0.0, 100.0)
    } else {
        let var = scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = Z95 * (var / n as f64).sqrt();
        ((mean - half).max(0.0), (mean + half).min(100.0))
    };
    Score {
        mean,
        lo,
        hi,
        interval: "normal",
        n,
    }
}

/// Wilson's 95 % score interval of `k` successes in `n` trials, as proportions.
pub fn wilson(k: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (nf, p, z2) = (n as f64, k as f64 / n as f64, Z95 * Z95);
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
        let (lo, hi) = wilson(8, 10);
        assert!(
            (lo - 0.4902).abs() < 1e-4 && (hi - 0.9433).abs() < 1e-4,
            "{lo} {hi}"
        );
        let (lo, hi) = wilson(0, 10);
        assert!(lo.abs() < 1e-12 && (hi - 0.2775).abs() < 1e-4, "{lo} {hi}");
        let (lo, hi) = wilson(10, 10);
        assert!(
            (lo - 0.7225).abs() < 1e-4 && (hi - 1.0).abs() < 1e-12,
            "{lo} {hi}"
        );
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }

    #[test]
    fn summaries_pick_their_interval() {
        let b = summarize(&[100.0, 0.0, 100.0, 100.0]);
        assert_eq!((b.mean, b.interval, b.n), (75.0, "wilson", 4));
        let (lo, hi) = wilson(3, 4);
        assert!((b.lo - 100.0 * lo).abs() < 1e-9 && (b.hi - 100.0 * hi).abs() < 1e-9);
        // 50, 75, 100: mean 75, s = 25, half = 1.96 · 25 / √3 = 28.29.
        let p = summarize(&[50.0, 75.0, 100.0]);
        assert_eq!(p.interval, "normal");
        assert!(
            (p.lo - 46.71).abs() < 0.01 && (p.hi - 100.0).abs() < 1e-9,
            "{p:?}"
        );
        let one = summarize(&[50.0]);
        assert_eq!((one.lo, one.hi), (0.0, 100.0));
    }
}
