//! Build parameters of [`super::IvfIndex`].

use crate::cluster::Assignment;
use crate::codes::Codes;
use crate::error::{at_least_one, Error, Result};

/// Build parameters of the IVF index.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IvfParams {
    /// Number of lists (k-means clusters). `None` takes [`IvfParams::nlist_for`]
    /// (`round(4·√n)`, the middle of faiss's `4·√n … 16·√n` guideline at its cheap end: at 8K
    /// keys it gives 361 lists of ~22 keys, so one probe costs ~0.3% of a scan). Capped at `n`.
    pub nlist: Option<usize>,
    /// Lloyd iterations after k-means++ (faiss's default is 10 for IVF training as well).
    pub iters: usize,
    /// Spherical by default: faiss's `IndexIVF` sets `cp.spherical = true` for
    /// `METRIC_INNER_PRODUCT` (checked on faiss 1.15.1), so faiss IVF-Flat IP normalises its
    /// centroids. Plain inner-product centroids let a few long centroids win most probes (on
    /// the real dump their best lists hold a handful of keys) and need more of the keys scanned.
    pub assignment: Assignment,
    /// Training uses at most `max_train_per_list · nlist` keys, evenly strided (faiss samples
    /// at most 256 points per centroid); every key is assigned to a list afterwards.
    pub max_train_per_list: usize,
    /// Seed of k-means++ and empty-cluster re-seeding.
    pub seed: u64,
    /// `nprobe` of searches that do not set one.
    pub default_nprobe: usize,
    /// Scan the lists on int8 (`i8`) or 4-bit (`i4`) codes and re-rank the best candidates on
    /// the keys, or scan the keys (`none`, the default). `i8-inline` has no meaning here.
    #[serde(default, skip_serializing_if = "Codes::is_none")]
    pub codes: Codes,
    /// Candidates re-ranked after a scan on codes when a search does not set `ef` (at least
    /// `k`; 0: `k + k / 4`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rerank: usize,
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

impl Default for IvfParams {
    fn default() -> Self {
        IvfParams {
            nlist: None,
            iters: 10,
            assignment: Assignment::Spherical,
            max_train_per_list: 256,
            seed: 0,
            default_nprobe: 8,
            codes: Codes::None,
            rerank: 0,
        }
    }
}

impl IvfParams {
    /// `round(4·√n)`, at least 1 and at most `n`.
    pub fn default_nlist(n: usize) -> usize {
        crate::cluster::default_k(n)
    }

    /// The lists of a build over `n` keys: `nlist` when set, else [`IvfParams::default_nlist`],
    /// or `round(√n)` with codes: a key's estimate costs a fraction of an f16 product, so fewer,
    /// longer lists (a quarter as many centroids to score per search) pay off
    /// (`docs/bench/codes/scan/README.md`, "List count").
    pub fn nlist_for(&self, n: usize) -> usize {
        self.nlist.unwrap_or_else(|| {
            if self.codes.is_none() {
                Self::default_nlist(n)
            } else {
                ((n as f64).sqrt().round() as usize).clamp(1, n.max(1))
            }
        })
    }

    /// Checks ranges that do not depend on the data.
    pub fn validate(&self) -> Result<()> {
        if self.nlist == Some(0) {
            return Err(Error::invalid_param("nlist", 0, "must be at least 1"));
        }
        at_least_one("max_train_per_list", self.max_train_per_list)?;
        at_least_one("default_nprobe", self.default_nprobe)?;
        if self.codes == Codes::I8Inline {
            return Err(Error::invalid_param(
                "codes",
                self.codes.name(),
                "an IVF index has no adjacency: expected none, i8 or i4",
            ));
        }
        if self.rerank > 0 && self.codes.is_none() {
            return Err(Error::invalid_param(
                "rerank",
                self.rerank,
                "applies to codes=i8 only",
            ));
        }
        Ok(())
    }
}
