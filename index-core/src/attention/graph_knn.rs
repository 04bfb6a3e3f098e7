//! Approximate top-`kq` lists for the build searched in the graph built so far (`knn_graph`,
//! issue 27): the projection only needs good neighbours of each training query, and the index
//! itself is the structure built to find a query's best keys.
//!
//! ```text
//!  m queries ──every 4th──► m/4 queries ──…──► ≤ 8,192 queries ──exact kNN──► lists
//!      ▲                        │                                         │
//!      └── search (ef) ◄── index over the keys ◄── build ◄────────────────┘
//! ```

use super::params::AttentionParams;
use super::AttentionIndex;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::knn::{KnnBackend, KnnOptions, KnnResult};
use crate::scratch::Scratch;
use crate::search::{AnnIndex, SearchOutput, SearchParams};
use crate::store::KeyStore;
use rayon::prelude::*;
use std::sync::Arc;

/// Rows of the smallest level of [`graph_topk`], whose lists are exact.
const GRAPH_KNN_FLOOR: usize = 8192;
/// Each level of [`graph_topk`] is built from one row in this many of the level above.
const GRAPH_KNN_SHARE: usize = 4;
/// Below this many keys per unit of `ef` the graph kNN is the exact kNN: on the CPU one search
/// at `ef = 128` cost what an exact scan of ~40K keys costs (the scan runs as a matrix product),
/// so the graph only pays past ~64K keys (synthetic OOD, `docs/bench/build-cost/graph-knn/`).
const GRAPH_KNN_KEYS_PER_EF: usize = 512;
/// Query rows per rayon task of the graph kNN's searches.
const GRAPH_KNN_TILE: usize = 64;

/// Approximate top-`k` lists (`knn_graph`): each row of `queries` searched (`ef`) in an index
/// over `keys` built from one row in [`GRAPH_KNN_SHARE`] (evenly strided), which is built the
/// same way, down to a level of at most [`GRAPH_KNN_FLOOR`] rows whose lists are exact; the
/// exact kNN throughout below [`GRAPH_KNN_KEYS_PER_EF`]` · ef` keys, where it is cheaper. With
/// `m` rows the exact part costs `GRAPH_KNN_FLOOR · n` inner products and each level's
/// searches `rows · (what one search scores)`, so the kNN grows with `m` times a search's
/// cost instead of `m · n`. Scores are exact; rows that found fewer than `k` keys are padded
/// as [`KnnResult`] pads. `build_seed(rows, params)` builds a level's index over `keys` (the
/// builder, handed in: this file does not call it).
#[allow(clippy::too_many_arguments)]
pub(super) fn graph_topk(
    keys: &Arc<KeyStore>,
    queries: &[f32],
    k: usize,
    ef: usize,
    params: &AttentionParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
    build_seed: &BuildSeed<'_>,
) -> Result<KnnResult> {
    graph_topk_from(
        keys,
        queries,
        k,
        ef,
        GRAPH_KNN_KEYS_PER_EF.saturating_mul(ef),
        params,
        knn,
        cancel,
        build_seed,
    )
}

/// Builds an index over the keys from training rows (row-major) and params: a level of
/// [`graph_topk`].
pub(super) type BuildSeed<'a> = dyn Fn(&[f32], &AttentionParams) -> Result<AttentionIndex> + 'a;

/// [`graph_topk`] with the key count below which the kNN stays exact.
#[allow(clippy::too_many_arguments)]
fn graph_topk_from(
    keys: &Arc<KeyStore>,
    queries: &[f32],
    k: usize,
    ef: usize,
    min_keys: usize,
    params: &AttentionParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
    build_seed: &BuildSeed<'_>,
) -> Result<KnnResult> {
    let d = keys.dim();
    let m = crate::knn::check_knn_args(queries, keys, k)?;
    if m <= 2 * GRAPH_KNN_FLOOR || keys.len() < min_keys {
        let options = KnnOptions {
            cancel: cancel.clone(),
            ..KnnOptions::default()
        };
        return knn.topk(queries, keys, k, &options);
    }
    let seed_rows = (m / GRAPH_KNN_SHARE).max(GRAPH_KNN_FLOOR);
    let seed: Vec<f32> = (0..seed_rows)
        .flat_map(|i| queries[i * m / seed_rows * d..][..d].iter().copied())
        .collect();
    let seed_params = AttentionParams {
        queries_per_key: 0.0,
        ..params.clone()
    };
    let index = build_seed(&seed, &seed_params)?;
    let search = SearchParams::with_ef(ef.max(k));
    let mut ids = vec![KnnResult::PAD; m * k];
    let mut scores = vec![f32::NEG_INFINITY; m * k];
    ids.par_chunks_mut(GRAPH_KNN_TILE * k)
        .zip(scores.par_chunks_mut(GRAPH_KNN_TILE * k))
        .enumerate()
        .try_for_each_init(
            || (Scratch::default(), SearchOutput::default()),
            |(scratch, out), (t, (ids_out, scores_out))| {
                cancel.check("graph kNN")?;
                for r in 0..ids_out.len() / k {
                    let q = t * GRAPH_KNN_TILE + r;
                    index.search_into(&queries[q * d..(q + 1) * d], k, &search, scratch, out)?;
                    ids_out[r * k..][..out.ids.len()].copy_from_slice(&out.ids);
                    scores_out[r * k..][..out.scores.len()].copy_from_slice(&out.scores);
                }
                Ok::<(), Error>(())
            },
        )?;
    Ok(KnnResult { k, ids, scores })
}

#[cfg(test)]
mod tests {
    use super::{graph_topk, graph_topk_from, GRAPH_KNN_FLOOR};
    use crate::attention::{AttentionParams, TrainKnn};
    use crate::cancel::Cancel;
    use crate::knn::{CpuKnn, KnnBackend, KnnOptions};
    use crate::store::KeyStore;
    use std::sync::Arc;

    /// The graph kNN: up to `2 · GRAPH_KNN_FLOOR` rows, or below `512 · ef` keys, it is the
    /// exact kNN; past that (one level here) its lists hold exact scores, best first, and most of each exact list.
    #[test]
    fn graph_knn_finds_most_of_the_exact_lists_with_exact_scores() {
        let (n, dim, k) = (1500, 16, 20);
        let m = 2 * GRAPH_KNN_FLOOR + 4000;
        let data = crate::synth::ood(m, 4, dim, 7);
        let keys = Arc::new(KeyStore::from_f32(data.keys[..n * dim].to_vec(), dim).expect("keys"));
        let queries = &data.train_queries[..m * dim];
        let params = AttentionParams {
            knn: TrainKnn::Graph { ef: 64 },
            ..AttentionParams::default()
        };
        let cancel = Cancel::new();
        // The builder, as `build.rs` hands it in.
        let build = |rows: &[f32], p: &AttentionParams| {
            super::super::build::build(keys.clone(), rows, None, p, &CpuKnn, &cancel)
        };
        let exact = CpuKnn
            .topk(queries, &keys, k, &KnnOptions::default())
            .expect("exact");
        let few = &queries[..2 * GRAPH_KNN_FLOOR * dim];
        let small = graph_topk_from(&keys, few, k, 64, 0, &params, &CpuKnn, &cancel, &build)
            .expect("small");
        assert_eq!(small.ids, exact.ids[..few.len() / dim * k]);
        // Fewer keys than 512 · ef: exact whatever the rows.
        let below =
            graph_topk(&keys, queries, k, 64, &params, &CpuKnn, &cancel, &build).expect("below");
        assert_eq!(below, exact);
        let lists = graph_topk_from(&keys, queries, k, 64, 0, &params, &CpuKnn, &cancel, &build)
            .expect("graph");
        assert_eq!(lists.rows(), m);
        let keys32 = keys.to_f32();
        let mut found = 0;
        for i in 0..m {
            let (row, scores) = (lists.row(i), lists.row_scores(i));
            assert_eq!(row.len(), k, "row {i}");
            assert!(
                scores.windows(2).all(|w| w[0] >= w[1]),
                "row {i} not best first"
            );
            let q = &queries[i * dim..(i + 1) * dim];
            for (&id, &s) in row.iter().zip(scores) {
                let key = &keys32[id as usize * dim..][..dim];
                let dot: f32 = q.iter().zip(key).map(|(a, b)| a * b).sum();
                assert!(
                    (dot - s).abs() <= 1e-4 * (1.0 + dot.abs()),
                    "row {i} key {id}"
                );
            }
            found += row.iter().filter(|id| exact.row(i).contains(id)).count();
        }
        let recall = found as f64 / (m * k) as f64;
        assert!(recall > 0.9, "graph kNN recall {recall}");
    }
}
