//! One k-means for every clustering of the crate (faiss's `Clustering` with its
//! `ClusteringParameters`): IVF's coarse quantizer, the build's coarse lists over the keys
//! (`knn_probe`) and the pooled kNN's clusters of training queries (`knn_pool`).
//!
//! ```text
//!  points ──evenly strided sample (≤ max_points_per_centroid · k)──► training points
//!         ──Init: k-means++ (seeded) | evenly strided points──► k centroids
//!         ──iters × [Assign (top-1 by inner product) → means → re-seed empty → unit rows]──► Trained
//! ```
//!
//! Points go to the centroid with the largest inner product through an [`Assign`]: the tiled
//! matrix product of [`ArgmaxAssign`] (`faer`, rayon over row tiles), or the crate's
//! [`crate::knn::KnnBackend`] (its top-1; a GPU backend serves it), so a clustering runs where
//! the caller's kNN runs.

use crate::cancel::Cancel;
use crate::error::Result;
use crate::synth::Rng;
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// Rows per assignment tile of [`ArgmaxAssign`] (one rayon task each).
const ROW_TILE: usize = 256;

/// How points are assigned to centroids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assignment {
    /// `argmax_c c · x` with centroids the plain means of their points.
    InnerProduct,
    /// `argmax_c c · x` with centroids renormalised to unit length after each update
    /// (spherical k-means; faiss IVF-Flat with inner product).
    Spherical,
}

/// Where the first centroids come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// k-means++ (Arthur & Vassilvitskii 2007) on the training points, seeded.
    PlusPlus,
    /// Evenly strided training points: no sequential passes (k-means++ costs `k` passes over
    /// the points, more than a cheap clustering saves at large sizes).
    Strided,
}

/// The parameters of one clustering (faiss's `ClusteringParameters`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClusteringParams {
    /// Clusters (`1 ≤ k ≤` points).
    pub k: usize,
    /// Lloyd iterations.
    pub iters: usize,
    pub assignment: Assignment,
    pub init: Init,
    /// Training uses at most `max_points_per_centroid · k` points, evenly strided (faiss
    /// samples at random; a stride keeps it deterministic without a seed).
    pub max_points_per_centroid: usize,
    /// Re-seed empty clusters by splitting a large one (faiss's rule); `false` keeps an empty
    /// cluster's centroid where it was.
    pub reseed_empty: bool,
    /// Seed of k-means++ and of the re-seeding.
    pub seed: u64,
}

/// The default number of clusters for `n` points, `round(4·√n)` (at least 1, at most `n`): IVF's
/// default `nlist`, and the coarse lists and query clusters of the build.
pub fn default_k(n: usize) -> usize {
    ((4.0 * (n as f64).sqrt()).round() as usize).clamp(1, n.max(1))
}

/// Result of [`train`]: `k × dim` centroids, row-major.
#[derive(Clone, Debug)]
pub struct Trained {
    pub centroids: Vec<f32>,
    /// Empty clusters re-seeded over all iterations.
    pub reseeded: usize,
    /// Points trained on (the strided sample).
    pub points: usize,
}

/// Assigns each of `points` (`m × dim`, f32) to the centroid (`k × dim`) with the largest
/// inner product.
pub trait Assign {
    fn assign(&self, points: &[f32], centroids: &[f32], dim: usize) -> Result<Vec<u32>>;
}

/// [`Assign`] by a tiled matrix product and a per-row argmax on the CPU (ties: the first).
#[derive(Clone, Copy, Debug, Default)]
pub struct ArgmaxAssign;

impl Assign for ArgmaxAssign {
    fn assign(&self, points: &[f32], centroids: &[f32], dim: usize) -> Result<Vec<u32>> {
        Ok(argmax_assign(points, centroids, dim))
    }
}

/// At most `count` rows of `rows` (`dim` values each), evenly strided: all of them when there
/// are no more than `count`.
pub fn strided_rows(rows: &[f32], dim: usize, count: usize) -> std::borrow::Cow<'_, [f32]> {
    let n = rows.len() / dim;
    if n <= count {
        return std::borrow::Cow::Borrowed(rows);
    }
    let step = n as f64 / count as f64;
    std::borrow::Cow::Owned(
        (0..count)
            .flat_map(|i| {
                let r = (i as f64 * step) as usize;
                rows[r * dim..(r + 1) * dim].iter().copied()
            })
            .collect(),
    )
}

/// Trains `params.k` centroids on `points` (`m × dim`, f32; `k ≤ m`): a sample of at most
/// `max_points_per_centroid · k` strided points, the initial centroids of `params.init`, then
/// `params.iters` Lloyd iterations assigning through `assign`.
///
/// Errors: [`crate::Error::Cancelled`] once `cancel` is set (checked per iteration and per
/// k-means++ step); those of `assign`.
pub fn train(
    points: &[f32],
    dim: usize,
    params: &ClusteringParams,
    assign: &dyn Assign,
    cancel: &Cancel,
) -> Result<Trained> {
    let k = params.k;
    let points = strided_rows(
        points,
        dim,
        params.max_points_per_centroid.saturating_mul(k),
    );
    let points: &[f32] = &points;
    let mut rng = Rng::new(params.seed);
    let mut centroids = match params.init {
        Init::PlusPlus => kmeans_pp(points, dim, k, &mut rng, cancel)?,
        Init::Strided => strided_rows(points, dim, k).into_owned(),
    };
    let spherical = params.assignment == Assignment::Spherical;
    if spherical {
        normalise_rows(&mut centroids, dim);
    }
    let mut reseeded = 0;
    for _ in 0..params.iters {
        cancel.check("k-means")?;
        let labels = assign.assign(points, &centroids, dim)?;
        let mut sums = vec![0.0f64; k * dim];
        let mut counts = vec![0usize; k];
        for (row, &c) in points.chunks_exact(dim).zip(&labels) {
            let c = c as usize;
            counts[c] += 1;
            for (s, &x) in sums[c * dim..(c + 1) * dim].iter_mut().zip(row) {
                *s += x as f64;
            }
        }
        for c in 0..k {
            if counts[c] > 0 {
                let inv = 1.0 / counts[c] as f64;
                for (o, &s) in centroids[c * dim..(c + 1) * dim]
                    .iter_mut()
                    .zip(&sums[c * dim..(c + 1) * dim])
                {
                    *o = (s * inv) as f32;
                }
            }
        }
        if params.reseed_empty {
            reseeded += split_empty(&mut centroids, &mut counts, dim, &mut rng);
        }
        if spherical {
            normalise_rows(&mut centroids, dim);
        }
    }
    Ok(Trained {
        centroids,
        reseeded,
        points: points.len() / dim,
    })
}

/// Scales each row (`dim` values) to unit L2 norm (the norm summed in f64); zero rows stay
/// zero.
pub fn normalise_rows(rows: &mut [f32], dim: usize) {
    for row in rows.chunks_exact_mut(dim) {
        let norm = row.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        if norm > 0.0 {
            let inv = (1.0 / norm) as f32;
            row.iter_mut().for_each(|x| *x *= inv);
        }
    }
}

/// Squared L2 distance.
#[inline]
fn l2sq(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| (x - y) * (x - y)).sum()
}

/// k-means++ (Arthur & Vassilvitskii 2007): the first centroid uniform, each next one drawn with
/// probability proportional to the squared L2 distance to the nearest chosen centroid.
/// `points` is `m × dim`, `k ≤ m`.
pub(crate) fn kmeans_pp(
    points: &[f32],
    dim: usize,
    k: usize,
    rng: &mut Rng,
    cancel: &Cancel,
) -> Result<Vec<f32>> {
    let m = points.len() / dim;
    let row = |i: usize| &points[i * dim..(i + 1) * dim];
    let mut centroids = Vec::with_capacity(k * dim);
    let first = rng.below(m);
    centroids.extend_from_slice(row(first));
    let mut d2: Vec<f32> = (0..m)
        .into_par_iter()
        .map(|i| l2sq(row(i), row(first)))
        .collect();
    for _ in 1..k {
        cancel.check("k-means++")?;
        let total: f64 = d2.iter().map(|&x| x as f64).sum();
        let next = if total > 0.0 {
            let mut target = rng.uniform() as f64 * total;
            let mut pick = m - 1;
            for (i, &x) in d2.iter().enumerate() {
                target -= x as f64;
                if target < 0.0 {
                    pick = i;
                    break;
                }
            }
            pick
        } else {
            // Every point coincides with a centroid: any point will do.
            rng.below(m)
        };
        let c = row(next).to_vec();
        d2.par_iter_mut().enumerate().for_each(|(i, d)| {
            let x = l2sq(row(i), &c);
            if x < *d {
                *d = x;
            }
        });
        centroids.extend_from_slice(&c);
    }
    Ok(centroids)
}

/// For every row of `points` (`m × dim`), the centroid with the largest inner product.
pub(crate) fn argmax_assign(points: &[f32], centroids: &[f32], dim: usize) -> Vec<u32> {
    let k = centroids.len() / dim;
    let m = points.len() / dim;
    let mut out = vec![0u32; m];
    out.par_chunks_mut(ROW_TILE).enumerate().for_each_init(
        || vec![0.0f32; ROW_TILE * k],
        |tile, (t, chunk)| {
            let r0 = t * ROW_TILE;
            let rows = chunk.len();
            let lhs = MatRef::from_row_major_slice(&points[r0 * dim..(r0 + rows) * dim], rows, dim);
            let rhs = MatRef::from_row_major_slice(centroids, k, dim);
            let dst = MatMut::from_row_major_slice_mut(&mut tile[..rows * k], rows, k);
            matmul(dst, Accum::Replace, lhs, rhs.transpose(), 1.0f32, Par::Seq);
            for (r, slot) in chunk.iter_mut().enumerate() {
                let scores = &tile[r * k..(r + 1) * k];
                let mut best = 0usize;
                for (c, &s) in scores.iter().enumerate() {
                    if s > scores[best] {
                        best = c;
                    }
                }
                *slot = best as u32;
            }
        },
    );
    out
}

/// Re-seeds every empty cluster by splitting a large one, as faiss `Clustering` does: a
/// non-empty cluster is picked with probability proportional to its size beyond one point,
/// the empty centroid becomes a copy of it with coordinates scaled by `1 + ε` and `1 − ε`
/// alternately, the donor by the opposite factors, and the donor's count is shared. Returns
/// how many were re-seeded.
fn split_empty(centroids: &mut [f32], counts: &mut [usize], dim: usize, rng: &mut Rng) -> usize {
    const EPS: f32 = 1.0 / 1024.0;
    let k = counts.len();
    let m: usize = counts.iter().sum();
    let mut reseeded = 0;
    for c in 0..k {
        if counts[c] != 0 {
            continue;
        }
        let spare = m.saturating_sub(k);
        if spare == 0 {
            break;
        }
        // Pick a donor with probability (size − 1) / (m − k), as faiss does.
        let mut donor = 0;
        loop {
            let r = rng.uniform() * spare as f32;
            let mut acc = 0.0f32;
            for (j, &cnt) in counts.iter().enumerate() {
                acc += cnt.saturating_sub(1) as f32;
                if r < acc {
                    donor = j;
                    break;
                }
            }
            if counts[donor] > 1 {
                break;
            }
        }
        let (lo, hi) = (c.min(donor), c.max(donor));
        let (a, b) = centroids.split_at_mut(hi * dim);
        let (target, source) = if c < donor {
            (&mut a[lo * dim..(lo + 1) * dim], &mut b[..dim])
        } else {
            (&mut b[..dim], &mut a[lo * dim..(lo + 1) * dim])
        };
        for (j, (t, s)) in target.iter_mut().zip(source.iter_mut()).enumerate() {
            let sign = if j % 2 == 0 { 1.0 } else { -1.0 };
            *t = *s * (1.0 + sign * EPS);
            *s *= 1.0 - sign * EPS;
        }
        counts[c] = counts[donor] / 2;
        counts[donor] -= counts[c];
        reseeded += 1;
    }
    reseeded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(m: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..m * dim).map(|_| rng.normal()).collect()
    }

    fn ivf_like(k: usize, iters: usize, assignment: Assignment, seed: u64) -> ClusteringParams {
        ClusteringParams {
            k,
            iters,
            assignment,
            init: Init::PlusPlus,
            max_points_per_centroid: usize::MAX,
            reseed_empty: true,
            seed,
        }
    }

    #[test]
    fn strided_init_without_reseeding_keeps_empty_centroids_and_unit_rows() {
        let p = points(200, 5, 11);
        let params = ClusteringParams {
            init: Init::Strided,
            reseed_empty: false,
            max_points_per_centroid: 8,
            ..ivf_like(10, 3, Assignment::Spherical, 0)
        };
        let t = train(&p, 5, &params, &ArgmaxAssign, &Cancel::new()).expect("train");
        assert_eq!(t.reseeded, 0);
        assert_eq!(t.centroids.len(), 50);
        for row in t.centroids.chunks_exact(5) {
            let norm: f32 = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4);
        }
        // The sample: 80 of 200 rows, evenly strided; a stride of 2.5 rows.
        let sample = strided_rows(&p, 5, 80);
        assert_eq!(sample.len(), 80 * 5);
        assert_eq!(&sample[5..10], &p[10..15]);
        assert!(matches!(
            strided_rows(&p, 5, 500),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn kmeans_pp_is_seeded_and_picks_distinct_points() {
        let p = points(500, 8, 1);
        let a = kmeans_pp(&p, 8, 20, &mut Rng::new(7), &Cancel::new()).expect("a");
        let b = kmeans_pp(&p, 8, 20, &mut Rng::new(7), &Cancel::new()).expect("b");
        let c = kmeans_pp(&p, 8, 20, &mut Rng::new(8), &Cancel::new()).expect("c");
        assert_eq!(a, b, "same seed, same centroids");
        assert_ne!(a, c, "another seed, other centroids");
        let mut rows: Vec<&[f32]> = a.chunks_exact(8).collect();
        rows.sort_by(|x, y| x.partial_cmp(y).expect("finite"));
        rows.dedup();
        assert_eq!(
            rows.len(),
            20,
            "k-means++ never repeats a point of positive weight"
        );
        for r in a.chunks_exact(8) {
            assert!(
                p.chunks_exact(8).any(|x| x == r),
                "centroids start at data points"
            );
        }
    }

    #[test]
    fn assign_matches_brute_force_argmax() {
        let (dim, k) = (12, 37);
        let p = points(1000, dim, 2);
        let c = points(k, dim, 3);
        let got = argmax_assign(&p, &c, dim);
        for (i, row) in p.chunks_exact(dim).enumerate() {
            let scores: Vec<f64> = c
                .chunks_exact(dim)
                .map(|cr| crate::metric::scalar::dot_f64(row, cr))
                .collect();
            let best = scores[got[i] as usize];
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert!(max - best <= 1e-4 * max.abs().max(1.0), "row {i}");
        }
    }

    #[test]
    fn spherical_kmeans_finds_separated_blobs_deterministically() {
        // Four well separated blobs: spherical k-means with k = 4 finds one per blob.
        let dim = 6;
        let mut rng = Rng::new(4);
        let mut p = Vec::new();
        for i in 0..400 {
            let blob = i % 4;
            for j in 0..dim {
                let centre = if j == blob { 10.0 } else { 0.0 };
                p.push(centre + 0.1 * rng.normal());
            }
        }
        let t = train(
            &p,
            dim,
            &ivf_like(4, 10, Assignment::Spherical, 5),
            &ArgmaxAssign,
            &Cancel::new(),
        )
        .expect("train");
        let labels = argmax_assign(&p, &t.centroids, dim);
        for blob in 0..4 {
            let first = labels[blob];
            assert!(
                (0..100).all(|i| labels[4 * i + blob] == first),
                "blob {blob} split"
            );
        }
        for row in t.centroids.chunks_exact(dim) {
            let norm: f32 = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!(
                (norm - 1.0).abs() < 1e-4,
                "spherical centroids have unit norm"
            );
        }
        let again = train(
            &p,
            dim,
            &ivf_like(4, 10, Assignment::Spherical, 5),
            &ArgmaxAssign,
            &Cancel::new(),
        )
        .expect("again");
        assert_eq!(
            t.centroids, again.centroids,
            "seeded training is deterministic"
        );
    }

    #[test]
    fn empty_clusters_are_reseeded() {
        let dim = 4;
        let mut centroids = vec![1.0f32; 3 * dim];
        centroids[dim..2 * dim].fill(100.0);
        let mut counts = vec![10, 0, 5];
        let n = split_empty(&mut centroids, &mut counts, dim, &mut Rng::new(1));
        assert_eq!(n, 1);
        assert!(counts[1] > 0);
        assert_eq!(counts.iter().sum::<usize>(), 15);
        assert!(
            centroids[dim..2 * dim].iter().all(|&x| x < 50.0),
            "moved next to a donor"
        );
    }

    #[test]
    fn cancelled_training_stops() {
        let p = points(300, 4, 9);
        let cancel = Cancel::new();
        cancel.cancel();
        assert!(train(
            &p,
            4,
            &ivf_like(10, 3, Assignment::InnerProduct, 0),
            &ArgmaxAssign,
            &cancel
        )
        .is_err());
    }
}
