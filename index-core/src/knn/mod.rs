//! Exact batched top-k by inner product: many queries against all keys of a store.
//!
//! Building the query-aware graph needs every training query's exact top-`kq` keys. The
//! operation sits behind [`KnnBackend`] so that a GPU backend (`qkindex-gpu`) can provide it;
//! [`CpuKnn`] is the reference (tiled matrix products with `faer`, rayon over query tiles).

mod cpu;

pub use cpu::CpuKnn;

use crate::cancel::Cancel;
use crate::error::{check_finite, Error, Result};
use crate::store::KeyStore;

/// Options of an exact top-k computation.
#[derive(Clone, Debug, Default)]
pub struct KnnOptions {
    /// Query `i` only sees keys `0..=i` (queries and keys of the same prefill positions).
    pub causal: bool,
    /// Query `i` only sees keys `0..visible[i]` (one entry per query; overrides `causal`):
    /// causal masks of queries that are not one per key position, such as a GQA group's
    /// pooled queries over a key range that starts after the sinks. Backends that cannot mask
    /// per row return [`Error::Backend`].
    pub visible: Option<std::sync::Arc<[u32]>>,
    /// Checked between tiles; a set flag ends the computation with [`Error::Cancelled`].
    pub cancel: Cancel,
}

impl KnnOptions {
    /// Options with only `causal` set.
    pub fn causal(causal: bool) -> Self {
        KnnOptions {
            causal,
            ..Default::default()
        }
    }
}

/// Exact top-k of `m` queries: row `i` holds query `i`'s best keys, best first.
///
/// `ids` and `scores` are `m × k`, row-major. A row with fewer than `k` visible keys (causal
/// rows near the start) is padded with id [`KnnResult::PAD`] and score −∞.
#[derive(Clone, Debug, PartialEq)]
pub struct KnnResult {
    pub k: usize,
    pub ids: Vec<u32>,
    pub scores: Vec<f32>,
}

impl KnnResult {
    /// Id used to pad rows with fewer than `k` results.
    pub const PAD: u32 = u32::MAX;

    /// Number of query rows.
    pub fn rows(&self) -> usize {
        self.ids.len().checked_div(self.k).unwrap_or(0)
    }

    /// The valid ids of row `i` (padding removed), best first.
    pub fn row(&self, i: usize) -> &[u32] {
        let r = &self.ids[i * self.k..(i + 1) * self.k];
        // Padding only ever trails a row, and most rows are full: one look at the last id
        // (the projection reads a row per occurrence of each key, millions of times).
        if r.last().is_none_or(|&x| x != Self::PAD) {
            return r;
        }
        let valid = r.iter().position(|&x| x == Self::PAD).unwrap_or(self.k);
        &r[..valid]
    }

    /// The scores of [`KnnResult::row`].
    pub fn row_scores(&self, i: usize) -> &[f32] {
        let n = self.row(i).len();
        &self.scores[i * self.k..i * self.k + n]
    }
}

/// A provider of exact batched top-k (CPU here, GPU in `qkindex-gpu`).
pub trait KnnBackend: Send + Sync {
    /// A short name for logs and reports (`"cpu"`, `"cuda:0"`).
    fn name(&self) -> String;

    /// Exact top-`k` keys of each query. `queries` is row-major `m × keys.dim()` f32.
    fn topk(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        k: usize,
        options: &KnnOptions,
    ) -> Result<KnnResult>;

    /// Exact top-`k` of each query among the keys `ids` of `keys` (in that order; returned
    /// ids are key ids). `options.visible` and `causal` count positions in `ids`, so with
    /// ascending ids a count masks keys by position. The default gathers the rows into a store
    /// and calls [`KnnBackend::topk`]; a backend may score them where they lie.
    ///
    /// Errors: those of [`KnnBackend::topk`]; an id `≥ keys.len()` ([`Error::InvalidParam`]
    /// named `ids`); `k` above `ids.len()`.
    fn topk_among(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        ids: &[u32],
        k: usize,
        options: &KnnOptions,
    ) -> Result<KnnResult> {
        check_among(queries, keys, ids, k)?;
        let mut found = self.topk(queries, &keys.gather(ids)?, k, options)?;
        map_positions(&mut found, ids);
        Ok(found)
    }
}

/// Validates the arguments of [`KnnBackend::topk_among`]; returns the number of queries.
pub fn check_among(queries: &[f32], keys: &KeyStore, ids: &[u32], k: usize) -> Result<usize> {
    let m = check_knn_args(queries, keys, k)?;
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= keys.len()) {
        return Err(Error::invalid_param(
            "ids",
            bad,
            format!("must be below the number of keys, {}", keys.len()),
        ));
    }
    if k > ids.len() {
        return Err(Error::invalid_param(
            "k",
            k,
            format!("must be in 1..={} (the number of ids)", ids.len()),
        ));
    }
    Ok(m)
}

/// Turns the positions in `ids` that a top-k over gathered rows returned into the ids.
pub fn map_positions(found: &mut KnnResult, ids: &[u32]) {
    for id in found.ids.iter_mut().filter(|id| **id != KnnResult::PAD) {
        *id = ids[*id as usize];
    }
}

/// Validates `options.visible` against `m` queries (one entry each).
pub fn check_visible(options: &KnnOptions, m: usize) -> Result<()> {
    match &options.visible {
        Some(v) if v.len() != m => Err(Error::DimensionMismatch {
            what: "visible key counts (one per query)",
            expected: m,
            got: v.len(),
        }),
        _ => Ok(()),
    }
}

/// Validates the arguments of [`KnnBackend::topk`]; returns the number of queries.
pub fn check_knn_args(queries: &[f32], keys: &KeyStore, k: usize) -> Result<usize> {
    let d = keys.dim();
    if queries.is_empty() {
        return Err(Error::Empty { what: "queries" });
    }
    if !queries.len().is_multiple_of(d) {
        return Err(Error::DimensionMismatch {
            what: "queries (row-major, key dimension columns)",
            expected: d * (queries.len() / d + 1),
            got: queries.len(),
        });
    }
    check_finite("queries", queries, d)?;
    if k == 0 || k > keys.len() {
        return Err(Error::invalid_param(
            "k",
            k,
            format!("must be in 1..={} (the number of keys)", keys.len()),
        ));
    }
    Ok(queries.len() / d)
}
/// [`crate::cluster::Assign`] through a backend's top-1 search: a clustering assigns where the
/// caller's kNN runs (a GPU backend serves it).
pub struct BackendAssign<'a> {
    pub knn: &'a dyn KnnBackend,
    pub options: KnnOptions,
}

impl std::fmt::Debug for BackendAssign<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendAssign")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl crate::cluster::Assign for BackendAssign<'_> {
    fn assign(&self, points: &[f32], centroids: &[f32], dim: usize) -> Result<Vec<u32>> {
        let store = KeyStore::from_f32(centroids.to_vec(), dim)?;
        Ok(self.knn.topk(points, &store, 1, &self.options)?.ids)
    }
}
