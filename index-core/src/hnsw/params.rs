//! Build parameters of [`super::HnswIndex`].

use crate::error::{at_least_one, Error, Result};

/// Largest accepted `m` (level-0 lists hold `2m` ids; beyond this the graph is a scan).
pub const MAX_M: usize = 1 << 12;

/// Build parameters of HNSW (Malkov & Yashunin, "Efficient and robust approximate nearest
/// neighbor search using Hierarchical Navigable Small World graphs", 2016/2018).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HnswParams {
    /// Links a new key gets per level (`M` in the paper). Lists above level 0 hold at most `m`
    /// ids (`M_max`), level-0 lists at most `2m` (`M_max0`); levels are drawn with the
    /// multiplier `m_L = 1/ln(m)`.
    pub m: usize,
    /// Candidate list size of the searches that insert a key (`efConstruction`); raised to
    /// `m` when smaller, as hnswlib does.
    pub ef_construction: usize,
    /// Build on the MIPS→L2 reduction: each key gets the extra coordinate
    /// `e = sqrt(R² − |k|²)` (`R` the largest key norm), queries get 0, so that the build's
    /// key–key closeness (`k₁·k₂ + e₁e₂`) is a metric one. `false` builds plain inner-product
    /// HNSW (hnswlib `space='ip'`), which can leave keys without incoming edges.
    pub l2_reduction: bool,
    /// Algorithm 4's `keepPrunedConnections`: fill a list the heuristic left short with the
    /// best discarded candidates. hnswlib and faiss do not (default `false`).
    pub keep_pruned: bool,
    /// Seed of the level draws (hnswlib's default `random_seed` is 100).
    pub seed: u64,
    /// `ef` of searches that do not set one (raised to `k` when smaller).
    pub default_ef: usize,
}

impl Default for HnswParams {
    fn default() -> Self {
        HnswParams {
            m: 16,
            ef_construction: 200,
            l2_reduction: true,
            keep_pruned: false,
            seed: 100,
            default_ef: 128,
        }
    }
}

impl HnswParams {
    /// Plain inner-product HNSW (no reduction), as hnswlib `space='ip'` builds it.
    pub fn inner_product() -> Self {
        HnswParams {
            l2_reduction: false,
            ..HnswParams::default()
        }
    }

    /// Largest list size at `level`: `2m` at level 0, `m` above.
    pub fn max_links(&self, level: usize) -> usize {
        if level == 0 {
            2 * self.m
        } else {
            self.m
        }
    }

    /// The level multiplier `m_L = 1/ln(m)`.
    pub fn level_multiplier(&self) -> f64 {
        1.0 / (self.m as f64).ln()
    }

    /// Checks ranges that do not depend on the data.
    pub fn validate(&self) -> Result<()> {
        if self.m < 2 {
            return Err(Error::invalid_param(
                "m",
                self.m,
                "must be at least 2 (the level multiplier is 1/ln(m))",
            ));
        }
        if self.m > MAX_M {
            return Err(Error::invalid_param(
                "m",
                self.m,
                format!("must be at most {MAX_M}"),
            ));
        }
        at_least_one("ef_construction", self.ef_construction)?;
        at_least_one("default_ef", self.default_ef)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_typed_errors() {
        HnswParams::default().validate().expect("defaults");
        HnswParams::inner_product().validate().expect("ip");
        for (p, name) in [
            (
                HnswParams {
                    m: 1,
                    ..Default::default()
                },
                "m",
            ),
            (
                HnswParams {
                    m: 0,
                    ..Default::default()
                },
                "m",
            ),
            (
                HnswParams {
                    m: MAX_M + 1,
                    ..Default::default()
                },
                "m",
            ),
            (
                HnswParams {
                    ef_construction: 0,
                    ..Default::default()
                },
                "ef_construction",
            ),
            (
                HnswParams {
                    default_ef: 0,
                    ..Default::default()
                },
                "default_ef",
            ),
        ] {
            match p.validate() {
                Err(Error::InvalidParam { name: got, .. }) => assert_eq!(got, name),
                other => panic!("{name}: expected InvalidParam, got {other:?}"),
            }
        }
    }

    #[test]
    fn list_sizes_and_multiplier() {
        let p = HnswParams::default();
        assert_eq!(p.max_links(0), 32);
        assert_eq!(p.max_links(1), 16);
        assert_eq!(p.max_links(5), 16);
        assert!((p.level_multiplier() - 1.0 / 16f64.ln()).abs() < 1e-12);
    }
}
