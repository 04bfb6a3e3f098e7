//! Build parameters of [`super::VamanaIndex`].

use crate::error::{Error, Result};

/// Build parameters of Vamana (DiskANN) and RobustVamana (OOD-DiskANN).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VamanaParams {
    /// Out-degree bound (`R` in the paper).
    pub r: usize,
    /// Candidate list size of the build's greedy searches (`L`).
    pub l: usize,
    /// Pruning factor of the second pass (`α`; the first pass uses 1).
    pub alpha: f32,
    /// RobustVamana: after the build, stitch each training query's nearest keys together in
    /// the spare adjacency slots (needs training queries).
    pub robust: bool,
    /// RobustStitch: nearest keys per training query that are linked to one another (`T`).
    pub stitch_t: usize,
    /// RobustStitch: degree slots held back from the Vamana passes (which then prune to
    /// `r − stitch_reserve`) so that stitched edges find room; 0 uses only the slots pruning
    /// left free.
    pub stitch_reserve: usize,
    /// Seed of the random initial graph and of the insertion order.
    pub seed: u64,
    /// Largest parallel batch of insertions, as a fraction of `n` (batches grow by doubling
    /// from 1, as in ParlayANN; each batch searches the graph as it stood before the batch).
    pub max_batch_fraction: f64,
    /// `ef` of searches that do not set one (raised to `k` when smaller).
    pub default_ef: usize,
}

impl Default for VamanaParams {
    fn default() -> Self {
        VamanaParams {
            r: 64,
            l: 100,
            alpha: 1.2,
            robust: false,
            stitch_t: 16,
            stitch_reserve: 0,
            seed: 0,
            max_batch_fraction: 0.02,
            default_ef: 128,
        }
    }
}

impl VamanaParams {
    /// The RobustVamana defaults (`robust = true`, otherwise [`VamanaParams::default`]).
    pub fn robust() -> Self {
        VamanaParams {
            robust: true,
            ..Default::default()
        }
    }

    /// Checks ranges that do not depend on the data.
    pub fn validate(&self) -> Result<()> {
        if self.r == 0 {
            return Err(Error::invalid_param("r", 0, "must be at least 1"));
        }
        if self.l == 0 {
            return Err(Error::invalid_param("l", 0, "must be at least 1"));
        }
        if !(self.alpha.is_finite() && self.alpha >= 1.0) {
            return Err(Error::invalid_param(
                "alpha",
                self.alpha,
                "must be a finite number ≥ 1",
            ));
        }
        if self.robust && self.stitch_t < 2 {
            return Err(Error::invalid_param(
                "stitch_t",
                self.stitch_t,
                "must be at least 2 (keys stitched to one another)",
            ));
        }
        if self.robust && self.stitch_reserve >= self.r {
            return Err(Error::invalid_param(
                "stitch_reserve",
                self.stitch_reserve,
                format!("must be below r = {}", self.r),
            ));
        }
        if !(self.max_batch_fraction > 0.0 && self.max_batch_fraction <= 1.0) {
            return Err(Error::invalid_param(
                "max_batch_fraction",
                self.max_batch_fraction,
                "must be in (0, 1]",
            ));
        }
        if self.default_ef == 0 {
            return Err(Error::invalid_param("default_ef", 0, "must be at least 1"));
        }
        Ok(())
    }
}
