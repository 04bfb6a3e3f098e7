//! Approximate top-`kq` lists from query-side pools (`knn_pool`, issue 27): the training
//! queries are clustered, each cluster gets a pool of candidate keys (the exact top-`P` of its
//! mean query), and each query's list is its exact top-`kq` within its cluster's pool.
//!
//! ```text
//!  m queries ──spherical k-means, round(4·√m) clusters──► clusters of similar queries
//!  each cluster's mean query ──KnnBackend::topk(·, keys, P)──► its pool of P keys
//!  each cluster: its queries ──KnnBackend::topk(·, pool, kq)──► lists (exact scores)
//! ```
//!
//! Why the pools come from the queries' side: decode and prefill queries lie away from the keys
//! (out of distribution), so a partition of the *keys* ranks the lists a query should probe
//! poorly (`knn_probe` loses most of each list past 32K synthetic keys), while queries that
//! point the same way share most of their best keys, and the mean query's exact top keys hold
//! them. Every step is a matrix product through the backend, so the kNN costs
//! `m·P + C·n + m·C` inner products instead of `m·n`, at matrix-product speed (a GPU backend
//! serves it as it serves the exact kNN), where the graph kNN ([`super::graph_knn`]) pays a
//! random row read per key it scores.

use super::coarse::{gather, spherical_kmeans};
use crate::cancel::Cancel;
use crate::cluster;
use crate::error::{Error, Result};
use crate::knn::{check_knn_args, KnnBackend, KnnOptions, KnnResult};
use crate::store::KeyStore;
use rayon::prelude::*;
use std::time::Instant;

/// The kNN stays exact while the pools would hold at least this share of the keys (`n ≤
/// POOL_SHARE · P`): the pooled kNN then saves little and its clustering costs more.
pub(super) const POOL_SHARE: usize = 4;

/// What the pooled kNN did, and the wall time of each step in seconds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PooledKnn {
    /// Non-empty clusters of training queries (one pool each).
    pub clusters: usize,
    /// Keys per pool.
    pub pool: usize,
    /// The clustering of the queries.
    pub kmeans_s: f64,
    /// The pools: each cluster mean's exact top keys.
    pub pools_s: f64,
    /// Each query's list from its pool.
    pub lists_s: f64,
}

impl std::fmt::Display for PooledKnn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pooled kNN ({} clusters, pools of {} keys: k-means {:.2} s, pools {:.2} s, lists {:.2} s)",
            self.clusters, self.pool, self.kmeans_s, self.pools_s, self.lists_s
        )
    }
}

/// Each training query's best `k` keys among the exact top-`pool` keys of its cluster's mean
/// query (clusters: spherical k-means of the queries into `round(4·√m)`), best first with exact
/// scores, and what that took; the exact kNN (and `None`) when `POOL_SHARE · pool ≥ n`.
/// `queries` is row-major `m × keys.dim()`.
///
/// Errors: those of [`check_knn_args`] and of `knn`; `pool < k` ([`Error::InvalidParam`] named
/// `knn_pool`); [`Error::Cancelled`] once `cancel` is set (checked per cluster).
pub(super) fn pool_topk(
    queries: &[f32],
    keys: &KeyStore,
    k: usize,
    pool: usize,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<(KnnResult, Option<PooledKnn>)> {
    let m = check_knn_args(queries, keys, k)?;
    if pool < k {
        return Err(Error::invalid_param(
            "knn_pool",
            pool,
            format!("must be at least kq = {k} (each list is chosen from its pool)"),
        ));
    }
    let (n, d) = (keys.len(), keys.dim());
    let nlist = cluster::default_k(m).min(m);
    let options = KnnOptions {
        causal: false,
        cancel: cancel.clone(),
        visible: None,
    };
    if POOL_SHARE.saturating_mul(pool) >= n || nlist < 2 {
        return Ok((knn.topk(queries, keys, k, &options)?, None));
    }
    let t = Instant::now();
    let (_, labels) = spherical_kmeans(queries, d, nlist, knn, cancel)?;
    let clusters = Clusters::new(&labels, nlist);
    let kmeans_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    // Each cluster's pool query is the mean of its queries (not the unit centroid): the mean of
    // q · key over the cluster is exactly mean(q) · key, so the pool holds the keys the cluster
    // scores highest on average.
    let means: Vec<f32> = clusters
        .iter()
        .flat_map(|members| mean_row(queries, d, members))
        .collect();
    let pools = knn.topk(&means, keys, pool, &options)?;
    let pools_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let lists: Vec<KnnResult> = clusters
        .iter()
        .enumerate()
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|(c, members)| {
            cancel.check("pooled kNN")?;
            let mut ids = pools.row(c).to_vec();
            // In key order, so that the rows are read forwards.
            ids.sort_unstable();
            let rows = gather(queries, members, d);
            knn.topk_among(&rows, keys, &ids, k.min(ids.len()), &options)
        })
        .collect::<Result<_>>()?;
    let mut ids = vec![KnnResult::PAD; m * k];
    let mut scores = vec![f32::NEG_INFINITY; m * k];
    for (members, found) in clusters.iter().zip(&lists) {
        for (j, &q) in members.iter().enumerate() {
            let row = q as usize * k;
            let (got, got_scores) = (found.row(j), found.row_scores(j));
            ids[row..row + got.len()].copy_from_slice(got);
            scores[row..row + got.len()].copy_from_slice(got_scores);
        }
    }
    let stats = PooledKnn {
        clusters: clusters.len(),
        pool,
        kmeans_s,
        pools_s,
        lists_s: t.elapsed().as_secs_f64(),
    };
    Ok((KnnResult { k, ids, scores }, Some(stats)))
}

/// The rows of each non-empty cluster, in row order (CSR-packed).
struct Clusters {
    offsets: Vec<usize>,
    rows: Vec<u32>,
}

impl Clusters {
    fn new(labels: &[u32], nlist: usize) -> Self {
        let mut offsets = vec![0usize; nlist + 1];
        for &l in labels {
            offsets[l as usize + 1] += 1;
        }
        for c in 0..nlist {
            offsets[c + 1] += offsets[c];
        }
        let mut fill = offsets.clone();
        let mut rows = vec![0u32; labels.len()];
        for (r, &l) in labels.iter().enumerate() {
            rows[fill[l as usize]] = r as u32;
            fill[l as usize] += 1;
        }
        offsets.dedup();
        Clusters { offsets, rows }
    }

    /// Number of non-empty clusters.
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The rows of each non-empty cluster.
    fn iter(&self) -> impl Iterator<Item = &[u32]> + '_ {
        self.offsets.windows(2).map(|w| &self.rows[w[0]..w[1]])
    }
}

/// The mean of the rows `members` of `rows` (`d` values each).
fn mean_row(rows: &[f32], d: usize, members: &[u32]) -> Vec<f32> {
    let mut sum = vec![0.0f64; d];
    for &r in members {
        for (s, &x) in sum.iter_mut().zip(&rows[r as usize * d..][..d]) {
            *s += f64::from(x);
        }
    }
    let count = members.len().max(1) as f64;
    sum.into_iter().map(|s| (s / count) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knn::CpuKnn;

    #[test]
    fn clusters_skip_empty_labels_and_keep_row_order() {
        let c = Clusters::new(&[2, 0, 2, 2, 0], 4);
        let got: Vec<&[u32]> = c.iter().collect();
        assert_eq!(got, vec![&[1, 4][..], &[0, 2, 3][..]]);
    }

    #[test]
    fn large_pools_are_the_exact_knn_and_small_ones_an_error() {
        let data = crate::synth::ood(800, 300, 16, 4);
        let keys = KeyStore::from_f32(data.keys.clone(), 16).expect("keys");
        let q = &data.train_queries;
        let exact = CpuKnn
            .topk(q, &keys, 10, &KnnOptions::default())
            .expect("exact");
        let c = Cancel::new();
        assert_eq!(
            pool_topk(q, &keys, 10, 200, &CpuKnn, &c).expect("pool"),
            (exact, None)
        );
        assert!(matches!(
            pool_topk(q, &keys, 10, 9, &CpuKnn, &c),
            Err(Error::InvalidParam {
                name: "knn_pool",
                ..
            })
        ));
        assert!(pool_topk(&q[..15], &keys, 10, 50, &CpuKnn, &c).is_err());
    }

    /// Pools of an eighth of the keys: lists best first, scores exact, every row filled, and
    /// most of each exact list found.
    #[test]
    fn pooled_lists_hold_exact_scores_and_most_of_the_exact_lists() {
        let (n, m, dim, k) = (4000, 3000, 16, 20);
        let data = crate::synth::ood(n, m, dim, 11);
        let keys = KeyStore::from_f32(data.keys.clone(), dim).expect("keys");
        let q = &data.train_queries[..m * dim];
        let exact = CpuKnn
            .topk(q, &keys, k, &KnnOptions::default())
            .expect("exact");
        let (lists, stats) =
            pool_topk(q, &keys, k, n / 8, &CpuKnn, &Cancel::new()).expect("pooled");
        assert_eq!(lists.rows(), m);
        let stats = stats.expect("pooled, not exact");
        // round(4·√3000) = 219 clusters, less any left empty.
        assert!(
            stats.pool == n / 8 && (100..=219).contains(&stats.clusters),
            "{stats:?}"
        );
        let mut found = 0;
        for i in 0..m {
            let (row, scores) = (lists.row(i), lists.row_scores(i));
            assert_eq!(row.len(), k, "row {i}");
            assert!(scores.windows(2).all(|w| w[0] >= w[1]), "row {i}");
            let query = &q[i * dim..(i + 1) * dim];
            for (&id, &s) in row.iter().zip(scores) {
                let key = &data.keys[id as usize * dim..][..dim];
                let dot: f32 = query.iter().zip(key).map(|(a, b)| a * b).sum();
                assert!((dot - s).abs() <= 1e-4 * (1.0 + dot.abs()), "row {i}");
            }
            found += row.iter().filter(|id| exact.row(i).contains(id)).count();
        }
        let recall = found as f64 / (m * k) as f64;
        assert!(recall > 0.8 && recall < 1.0, "pooled kNN recall {recall}");
    }
}
