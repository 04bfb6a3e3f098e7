//! Comparing a GPU top-k with the CPU reference, allowing for f16 rounding at rank k.
//!
//! The GPU ranks by f16 inputs with f32 accumulation, so where the k-th and (k+1)-th scores are
//! closer than that rounding the two backends may keep different keys. A GPU id that the CPU did
//! not keep is a *near-tie* when its exact score is within `tolerance · |q|·max|k|` of the CPU's
//! k-th score, and an *error* otherwise. Padding (causal rows) must agree exactly.

use qkindex::{KeyStore, KnnResult};

/// Relative tolerance for near-ties: a few f16 roundings of each operand (2⁻¹¹ each).
pub const NEAR_TIE_TOLERANCE: f32 = 2e-3;

/// How a GPU result compares with the CPU's, over all rows.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Comparison {
    pub rows: usize,
    /// Rows whose id sets are equal.
    pub identical_rows: usize,
    /// |gpu ∩ cpu| / |cpu|, over all valid entries.
    pub recall: f64,
    /// GPU ids outside the CPU set that are near-ties (allowed).
    pub near_ties: usize,
    /// GPU ids outside the CPU set that score clearly below the CPU's k-th (wrong answers).
    pub errors: usize,
    /// Rows whose count of valid (non-padding) entries differs.
    pub padding_mismatches: usize,
    /// The largest (CPU k-th − GPU score) / (|q|·max|k|) among the GPU ids outside the CPU set.
    pub worst_gap: f32,
}

impl Comparison {
    /// True when every difference is a near-tie.
    pub fn ok(&self) -> bool {
        self.errors == 0 && self.padding_mismatches == 0
    }
}

/// Compares `gpu` with the reference `cpu` for the same queries (row-major, `keys.dim()` columns).
pub fn compare(queries: &[f32], keys: &KeyStore, gpu: &KnnResult, cpu: &KnnResult) -> Comparison {
    let d = keys.dim();
    let scorer = keys.scorer();
    let mut row = vec![0.0f32; d];
    let key_norm = (0..keys.len() as u32)
        .map(|id| {
            keys.row_into(id, &mut row);
            row.iter().map(|x| x * x).sum::<f32>().sqrt()
        })
        .fold(0.0f32, f32::max);
    let mut c = Comparison {
        rows: cpu.rows(),
        ..Default::default()
    };
    let (mut found, mut total) = (0usize, 0usize);
    for i in 0..cpu.rows().min(gpu.rows()) {
        let (g, r) = (gpu.row(i), cpu.row(i));
        if g.len() != r.len() {
            c.padding_mismatches += 1;
        }
        let q = &queries[i * d..(i + 1) * d];
        let scale = q.iter().map(|x| x * x).sum::<f32>().sqrt() * key_norm;
        let kth = cpu
            .row_scores(i)
            .last()
            .copied()
            .unwrap_or(f32::NEG_INFINITY);
        let mut same = g.len() == r.len();
        total += r.len();
        for &id in g {
            if r.contains(&id) {
                found += 1;
                continue;
            }
            same = false;
            let gap = (kth - scorer.score(q, id)) / scale.max(f32::MIN_POSITIVE);
            c.worst_gap = c.worst_gap.max(gap);
            if gap <= NEAR_TIE_TOLERANCE {
                c.near_ties += 1;
            } else {
                c.errors += 1;
            }
        }
        c.identical_rows += usize::from(same);
    }
    c.padding_mismatches += cpu.rows().abs_diff(gpu.rows());
    c.recall = if total == 0 {
        1.0
    } else {
        found as f64 / total as f64
    };
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> KeyStore {
        KeyStore::from_f32(vec![1.0, 0.0, 0.999, 0.0, 0.0, 1.0, -1.0, 0.0], 2).expect("keys")
    }

    #[test]
    fn near_ties_pass_and_clear_misses_fail() {
        let q = [1.0f32, 0.0];
        let cpu = KnnResult {
            k: 1,
            ids: vec![0],
            scores: vec![1.0],
        };
        let tie = KnnResult {
            k: 1,
            ids: vec![1],
            scores: vec![0.999],
        };
        let miss = KnnResult {
            k: 1,
            ids: vec![2],
            scores: vec![0.0],
        };
        let c = compare(&q, &keys(), &tie, &cpu);
        assert!(c.ok() && c.near_ties == 1 && c.identical_rows == 0, "{c:?}");
        let c = compare(&q, &keys(), &miss, &cpu);
        assert!(!c.ok() && c.errors == 1, "{c:?}");
        let c = compare(&q, &keys(), &cpu, &cpu);
        assert!(c.ok() && c.identical_rows == 1 && c.recall == 1.0, "{c:?}");
    }

    #[test]
    fn padding_must_agree() {
        let q = [1.0f32, 0.0];
        let cpu = KnnResult {
            k: 2,
            ids: vec![0, KnnResult::PAD],
            scores: vec![1.0, f32::NEG_INFINITY],
        };
        let gpu = KnnResult {
            k: 2,
            ids: vec![0, 1],
            scores: vec![1.0, 0.999],
        };
        assert_eq!(compare(&q, &keys(), &gpu, &cpu).padding_mismatches, 1);
    }
}
