//! Parameters of [`super::ReTopK`] and their presets (names as in the paper, "Recall Before You
//! Rank", arXiv 2607.27692, §3: `C`, `R`, `W`, `τ`, `T_r`, `K`).

use crate::error::{at_least_one, Error, Result};

/// Parameters of the ReTopK selector of one (layer, query head).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReTopKParams {
    /// Cached (normalized query, chosen ids) pairs, evicted oldest first (`C` in the paper).
    pub c: usize,
    /// Most similar cached queries whose sets are recalled (`R`; `1 ≤ r ≤ c`).
    pub r: usize,
    /// Most recent keys (ids `n − w .. n`) always added to the candidates (`W`; 0 adds none).
    pub w: usize,
    /// Cosine similarity the best cached query must reach for the set to be reused (`τ`, in
    /// `[−1, 1]`); below it the step takes the exact path.
    pub tau: f32,
    /// Every `refresh`-th step takes the exact path whatever the similarity (`T_r`).
    pub refresh: usize,
    /// Ids selected per step (`K`; capped at the number of keys).
    pub k: usize,
    /// On the exact path, hand the recalled sets to the exact index as extra entry points
    /// ([`crate::AnnIndex::search_seeded`]). Graph indexes start from them; a flat scan ignores
    /// them.
    /// Not in the paper: DESIGN.md §1 composes the two ideas this way.
    pub seed_fallback: bool,
}

impl Default for ReTopKParams {
    /// The paper's defaults: C = 32, R = 4, W = 32, τ = 0.85, T_r = 128, K = 512.
    fn default() -> Self {
        ReTopKParams {
            c: 32,
            r: 4,
            w: 32,
            tau: 0.85,
            refresh: 128,
            k: 512,
            seed_fallback: true,
        }
    }
}

impl ReTopKParams {
    /// The paper's quality preset: the defaults with τ = 0.90 (more exact steps).
    pub fn quality() -> Self {
        ReTopKParams {
            tau: 0.90,
            ..ReTopKParams::default()
        }
    }

    /// Checks ranges: `c ≥ 1`, `1 ≤ r ≤ c`, `k ≥ 1`, `refresh ≥ 1`, `τ` finite in `[−1, 1]`.
    pub fn validate(&self) -> Result<()> {
        at_least_one("c", self.c)?;
        at_least_one("r", self.r)?;
        if self.r > self.c {
            return Err(Error::invalid_param(
                "r",
                self.r,
                format!("must be at most c = {}", self.c),
            ));
        }
        at_least_one("k", self.k)?;
        if !self.tau.is_finite() || !(-1.0..=1.0).contains(&self.tau) {
            return Err(Error::invalid_param(
                "tau",
                self.tau,
                "must be a cosine similarity in [-1, 1]",
            ));
        }
        at_least_one("refresh", self.refresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_differ_only_in_tau() {
        let d = ReTopKParams::default();
        d.validate().expect("default");
        assert_eq!((d.c, d.r, d.w, d.refresh, d.k), (32, 4, 32, 128, 512));
        assert_eq!(d.tau, 0.85);
        let q = ReTopKParams::quality();
        q.validate().expect("quality");
        assert_eq!(q.tau, 0.90);
        assert_eq!(ReTopKParams { tau: 0.85, ..q }, d);
    }

    #[test]
    fn out_of_range_params_name_themselves() {
        let d = ReTopKParams::default();
        let bad = [
            (ReTopKParams { c: 0, ..d.clone() }, "c"),
            (ReTopKParams { r: 0, ..d.clone() }, "r"),
            (ReTopKParams { r: 33, ..d.clone() }, "r"),
            (ReTopKParams { k: 0, ..d.clone() }, "k"),
            (
                ReTopKParams {
                    refresh: 0,
                    ..d.clone()
                },
                "refresh",
            ),
            (
                ReTopKParams {
                    tau: f32::NAN,
                    ..d.clone()
                },
                "tau",
            ),
            (
                ReTopKParams {
                    tau: f32::INFINITY,
                    ..d.clone()
                },
                "tau",
            ),
            (
                ReTopKParams {
                    tau: 1.5,
                    ..d.clone()
                },
                "tau",
            ),
            (
                ReTopKParams {
                    tau: -1.01,
                    ..d.clone()
                },
                "tau",
            ),
        ];
        for (p, want) in bad {
            match p.validate() {
                Err(Error::InvalidParam { name, .. }) => assert_eq!(name, want, "{p:?}"),
                other => panic!("{p:?}: expected InvalidParam({want}), got {other:?}"),
            }
        }
        // The edges of the ranges are valid.
        for p in [
            ReTopKParams { r: 32, ..d.clone() },
            ReTopKParams {
                tau: -1.0,
                ..d.clone()
            },
            ReTopKParams {
                tau: 1.0,
                ..d.clone()
            },
            ReTopKParams { w: 0, ..d.clone() },
            ReTopKParams {
                c: 1,
                r: 1,
                refresh: 1,
                k: 1,
                ..d
            },
        ] {
            p.validate().expect("edge of range");
        }
    }
}
