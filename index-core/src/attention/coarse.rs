//! Approximate top-`kq` lists for the build (issue 27): the projection only needs good
//! neighbours of each training query, not its exact ones, so instead of scoring every query
//! against every key (`m × n` inner products) each query scores the centroids of a coarse IVF
//! over the keys and then the keys of its `nprobe` best lists.
//!
//! ```text
//!  keys ──spherical k-means, round(4·√n) lists ([`Partition`])──► centroids, keys by list
//!         (every assignment a top-1 search of the KnnBackend)
//!  queries ──KnnBackend::topk(queries, centroids, nprobe)──► each query's lists
//!  per query (rayon over tiles): scan its lists' keys ──TopK──► its best kq keys found
//! ```
//!
//! The centroid search goes through [`KnnBackend`], so a GPU backend serves it as it serves the
//! exact kNN; the list scans run on the CPU with the store's SIMD kernels. A query sees about
//! `nlist + nprobe · n / nlist` keys and centroids, `O(√n)` for fixed `nprobe`.

use crate::cancel::Cancel;
use crate::cluster::{self, Assignment, ClusteringParams, Init};
use crate::error::{Error, Result};
use crate::knn::{check_knn_args, BackendAssign, KnnBackend, KnnOptions, KnnResult};
use crate::scratch::TopK;
use crate::store::{KeyStore, KeysRef};
use rayon::prelude::*;

/// Query rows per rayon task of the list scans.
const QUERY_TILE: usize = 64;
/// Lloyd iterations of the coarse quantizer.
const ITERS: usize = 4;
/// Training points per list of the coarse quantizer (evenly strided keys).
const TRAIN_PER_LIST: usize = 32;

/// Each query's best `k` keys among those of its `nprobe` nearest lists (by inner product with
/// the spherical k-means centroids), best first; rows that found fewer than `k` keys are padded
/// as [`KnnResult`] pads. `queries` is row-major `m × keys.dim()`.
///
/// Errors: those of [`check_knn_args`] and of `knn`; [`Error::Cancelled`] once `cancel` is set
/// (checked per Lloyd iteration and per tile).
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
    let part = Partition::new(keys, knn, cancel)?;
    let nprobe = nprobe.min(part.centroids.len());
    let options = KnnOptions {
        causal: false,
        cancel: cancel.clone(),
        visible: None,
    };
    let probes = knn.topk(queries, &part.centroids, nprobe, &options)?;
    let d = keys.dim();
    let scorer = part.lists.scorer();
    let (offsets, list_ids) = (&part.offsets, &part.ids);
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

/// The keys split into `round(4·√n)` lists by [`spherical_kmeans`] (as IVF's default
/// `nlist`). The lists only have to gather near keys; the scans are exact.
struct Partition {
    /// `nlist × dim`, unit rows (f32).
    centroids: KeyStore,
    /// The keys in list order, in the element type of the input.
    lists: KeyStore,
    /// `ids[p]`: the key at list-order position `p`.
    ids: Vec<u32>,
    /// List `l` holds positions `offsets[l]..offsets[l + 1]`.
    offsets: Vec<u32>,
}

impl Partition {
    fn new(keys: &KeyStore, knn: &dyn KnnBackend, cancel: &Cancel) -> Result<Self> {
        let (n, d) = (keys.len(), keys.dim());
        let nlist = cluster::default_k(n);
        let keys32 = keys.to_f32();
        let (centroids, labels) = spherical_kmeans(&keys32, d, nlist, knn, cancel)?;
        let mut offsets = vec![0u32; nlist + 1];
        for &l in &labels {
            offsets[l as usize + 1] += 1;
        }
        for l in 0..nlist {
            offsets[l + 1] += offsets[l];
        }
        let mut fill = offsets[..nlist].to_vec();
        let mut ids = vec![0u32; n];
        for (id, &l) in labels.iter().enumerate() {
            ids[fill[l as usize] as usize] = id as u32;
            fill[l as usize] += 1;
        }
        let lists = match keys.rows() {
            KeysRef::F16(v) => KeyStore::from_f16(gather(v, &ids, d), d)?,
            KeysRef::F32(v) => KeyStore::from_f32(gather(v, &ids, d), d)?,
            // The coarse lists only rank candidates: the codes of the gathered rows, re-derived.
            KeysRef::I8 { .. } => KeyStore::quantize_i8(&gather(&keys32, &ids, d), d)?,
        };
        Ok(Partition {
            centroids,
            lists,
            ids,
            offsets,
        })
    }
}

/// Spherical k-means of `rows` (`dim` values each, f32) into `nlist` clusters, trained cheaply
/// ([`cluster::train`]): evenly strided initial centroids instead of k-means++ (whose `nlist`
/// sequential passes cost more than the kNN they save at large sizes), [`ITERS`] Lloyd
/// iterations on [`TRAIN_PER_LIST`] strided rows per cluster, empty clusters left where they
/// were, every assignment a top-1 search of the backend. Returns the unit centroids
/// (`nlist × dim`) and each row's cluster. `nlist` must be at least 1 and at most the number of
/// rows.
pub(super) fn spherical_kmeans(
    rows: &[f32],
    d: usize,
    nlist: usize,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<(KeyStore, Vec<u32>)> {
    let options = KnnOptions {
        causal: false,
        cancel: cancel.clone(),
        visible: None,
    };
    let params = ClusteringParams {
        k: nlist,
        iters: ITERS,
        assignment: Assignment::Spherical,
        init: Init::Strided,
        max_points_per_centroid: TRAIN_PER_LIST,
        reseed_empty: false,
        seed: 0,
    };
    let assign = BackendAssign {
        knn,
        options: options.clone(),
    };
    let trained = cluster::train(rows, d, &params, &assign, cancel)?;
    let centroids = KeyStore::from_f32(trained.centroids, d)?;
    let labels = knn.topk(rows, &centroids, 1, &options)?.ids;
    Ok((centroids, labels))
}

/// The rows `ids` of `rows` (`dim` values each), in that order.
pub(super) fn gather<T: Copy>(rows: &[T], ids: &[u32], dim: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(ids.len() * dim);
    for &i in ids {
        out.extend_from_slice(&rows[i as usize * dim..(i as usize + 1) * dim]);
    }
    out
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
            // The list scans' SIMD dot products and the exact kNN's matrix products round
            // differently in the last bits.
            for (a, b) in all.row_scores(r).iter().zip(exact.row_scores(r)) {
                assert!(
                    (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                    "row {r}: {a} vs {b}"
                );
            }
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
