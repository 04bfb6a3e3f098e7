//! Approximate top-`kq` lists for the build (issue 27): the projection only needs good
//! neighbours of each training query, not its exact ones, so instead of scoring every query
//! against every key (`m × n` inner products) each query scores the centroids of a coarse IVF
//! over the keys and then the keys of its `nprobe` best lists.
//!
//! ```text
//!  keys ──k-means (IvfIndex, round(4·√n) spherical lists, [`COARSE`])──► centroids, keys in list order
//!  queries ──KnnBackend::topk(queries, centroids, nprobe)──► each query's lists
//!  per query (rayon over tiles): scan its lists' keys ──TopK──► its best kq keys found
//! ```
//!
//! The centroid search goes through [`KnnBackend`], so a GPU backend serves it as it serves the
//! exact kNN; the list scans run on the CPU with the store's SIMD kernels. A query sees about
//! `nlist + nprobe · n / nlist` keys and centroids, `O(√n)` for fixed `nprobe`.

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::ivf::{IvfIndex, IvfParams};
use crate::knn::{check_knn_args, KnnBackend, KnnOptions, KnnResult};
use crate::scratch::TopK;
use crate::store::KeyStore;
use rayon::prelude::*;

/// Query rows per rayon task of the list scans.
const QUERY_TILE: usize = 64;

/// The coarse quantizer: the IVF defaults (`round(4·√n)` spherical lists) trained on fewer
/// points for fewer iterations — the lists only need to gather near keys, and the full
/// k-means (256 points per list, 10 iterations) would cost more than the kNN it replaces at
/// large `n` (`nlist² · 256 · 10 · d`).
const COARSE: IvfParams = IvfParams {
    nlist: None,
    iters: 4,
    assignment: crate::ivf::Assignment::Spherical,
    max_train_per_list: 32,
    seed: 0,
    default_nprobe: 8,
};

/// Each query's best `k` keys among those of its `nprobe` nearest lists (by inner product with
/// the spherical k-means centroids), best first; rows that found fewer than `k` keys are padded
/// as [`KnnResult`] pads. `queries` is row-major `m × keys.dim()`.
///
/// Errors: those of [`check_knn_args`], of the IVF build and of `knn`; [`Error::Cancelled`]
/// once `cancel` is set (checked per tile).
pub(super) fn topk(
    queries: &[f32],
    keys: &KeyStore,
    k: usize,
    nprobe: usize,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<KnnResult> {
    let m = check_knn_args(queries, keys, k)?;
    if nprobe == 0 {
        return Err(Error::invalid_param("nprobe", 0, "must be at least 1"));
    }
    let ivf = IvfIndex::build_with(keys, &COARSE, cancel)?;
    let nprobe = nprobe.min(ivf.nlist());
    let probes = knn.topk(
        queries,
        ivf.centroids(),
        nprobe,
        &KnnOptions {
            causal: false,
            cancel: cancel.clone(),
        },
    )?;
    let d = keys.dim();
    let lists = ivf.list_keys();
    let scorer = lists.scorer();
    let (offsets, list_ids) = (ivf.offsets(), ivf.list_ids());
    let mut ids = vec![KnnResult::PAD; m * k];
    let mut scores = vec![f32::NEG_INFINITY; m * k];
    ids.par_chunks_mut(QUERY_TILE * k)
        .zip(scores.par_chunks_mut(QUERY_TILE * k))
        .enumerate()
        .try_for_each_init(
            || (TopK::default(), Vec::<f32>::new(), Vec::new(), Vec::new()),
            |(heap, buf, row_ids, row_scores), (t, (ids_out, scores_out))| {
                cancel.check("approximate top-k")?;
                for r in 0..ids_out.len() / k {
                    let q = t * QUERY_TILE + r;
                    let query = &queries[q * d..(q + 1) * d];
                    heap.reset(k);
                    for &l in probes.row(q) {
                        let (s, e) = (
                            offsets[l as usize] as usize,
                            offsets[l as usize + 1] as usize,
                        );
                        buf.resize(e - s, 0.0);
                        scorer.score_range(query, s, buf);
                        heap.push_block(buf, s as u32);
                    }
                    row_ids.clear();
                    row_scores.clear();
                    heap.drain_sorted(row_ids, row_scores);
                    for (j, (&p, &sc)) in row_ids.iter().zip(row_scores.iter()).enumerate() {
                        ids_out[r * k + j] = list_ids[p as usize];
                        scores_out[r * k + j] = sc;
                    }
                }
                Ok::<(), Error>(())
            },
        )?;
    Ok(KnnResult { k, ids, scores })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knn::CpuKnn;

    fn data(n: usize, m: usize, d: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = crate::synth::Rng::new(seed);
        let keys = (0..n * d).map(|_| rng.normal()).collect();
        let queries = (0..m * d).map(|_| rng.normal()).collect();
        (keys, queries)
    }

    #[test]
    fn probing_every_list_is_the_exact_top_k() {
        let (n, m, d, k) = (600, 40, 16, 10);
        let (keys, queries) = data(n, m, d, 5);
        let store = KeyStore::from_f32(keys, d).expect("store");
        let exact = CpuKnn
            .topk(&queries, &store, k, &KnnOptions::default())
            .expect("exact");
        let all = topk(&queries, &store, k, n, &CpuKnn, &Cancel::new()).expect("coarse");
        assert_eq!(all.rows(), m);
        for r in 0..m {
            assert_eq!(all.row(r), exact.row(r), "row {r}");
            assert_eq!(all.row_scores(r), exact.row_scores(r), "row {r}");
        }
    }

    #[test]
    fn few_probes_find_most_of_the_exact_top_k_and_report_true_scores() {
        let (n, m, d, k) = (4000, 50, 16, 20);
        let (keys, queries) = data(n, m, d, 9);
        let store = KeyStore::from_f32(keys.clone(), d).expect("store");
        let exact = CpuKnn
            .topk(&queries, &store, k, &KnnOptions::default())
            .expect("exact");
        let found = topk(&queries, &store, k, 32, &CpuKnn, &Cancel::new()).expect("coarse");
        let mut hits = 0;
        for r in 0..m {
            let row = found.row(r);
            assert_eq!(row.len(), k);
            let sc = found.row_scores(r);
            assert!(sc.windows(2).all(|w| w[0] >= w[1]));
            for (&id, &s) in row.iter().zip(sc) {
                let key = &keys[id as usize * d..(id as usize + 1) * d];
                let q = &queries[r * d..(r + 1) * d];
                let dot: f32 = key.iter().zip(q).map(|(a, b)| a * b).sum();
                assert!(
                    (dot - s).abs() < 1e-3,
                    "row {r}: score {s} of key {id} is {dot}"
                );
            }
            hits += row.iter().filter(|id| exact.row(r).contains(id)).count();
        }
        let recall = hits as f64 / (m * k) as f64;
        assert!(recall > 0.6, "recall {recall} with 32 of 253 lists");
        assert!(recall < 1.0, "32 of 253 lists should miss some keys");
    }

    #[test]
    fn bad_arguments_are_errors() {
        let store = KeyStore::from_f32(vec![1.0; 8], 4).expect("store");
        let c = Cancel::new();
        assert!(topk(&[1.0; 4], &store, 1, 0, &CpuKnn, &c).is_err());
        assert!(topk(&[1.0; 5], &store, 1, 1, &CpuKnn, &c).is_err());
        assert!(topk(&[f32::NAN; 4], &store, 1, 1, &CpuKnn, &c).is_err());
        assert!(topk(&[1.0; 4], &store, 3, 1, &CpuKnn, &c).is_err());
    }
}
