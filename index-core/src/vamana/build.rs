//! Construction of the Vamana graph (DiskANN, Subramanya et al. 2019) and OOD-DiskANN's
//! RobustStitch (Jaiswal et al. 2022).
//!
//! 1. MIPS→L2 reduction: every key `k` becomes `k' = (k, √(M² − |k|²))` with `M` the largest
//!    key norm, so all `k'` have norm `M` and `|a' − b'|² = 2M² − 2·a'·b'`. A query `q` becomes
//!    `(q, 0)`, for which `|q' − k'|²` ranks keys exactly as `−q·k`: searching the graph by inner
//!    product on the original keys is searching it by L2 in the space it was built in. The
//!    augmented copy lives only during the build.
//! 2. A random `R`-regular graph, the medoid (the key nearest to the mean, in the augmented
//!    space) as entry point.
//! 3. Two passes over the keys in a seeded random order, the first with `α = 1`, the second
//!    with `α`: greedy search for the key from the medoid with a list of `L`, then
//!    RobustPrune(visited ∪ current neighbours) to `R`, then a reverse edge from each new
//!    neighbour, pruned with RobustPrune when it overflows `R`. Insertions run in parallel
//!    batches (rayon) that see the graph as it stood before the batch; batch sizes double from
//!    1 up to `max_batch_fraction · n` (ParlayANN's scheme), so the result does not depend on
//!    the thread count.
//! 4. RobustVamana only: RobustStitch. Then connectivity ([`crate::graph::repair`]): every key
//!    reachable from the medoid.
//!
//! Distances are squared L2, and α multiplies squared distances, as in DiskANN's code.

use super::params::VamanaParams;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::graph::repair::{self, Repair, WhenFull};
use crate::knn::{KnnBackend, KnnOptions, KnnResult};
use crate::metric::kernels;
use crate::scratch::Scratch;
use crate::store::KeyStore;
use crate::synth::Rng;
use rayon::prelude::*;
use std::time::Instant;

/// What a build did, and the wall time of each phase in seconds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct BuildStats {
    /// Degree bound of the Vamana passes (`r − stitch_reserve` for RobustVamana).
    pub build_degree: usize,
    pub pass1_s: f64,
    pub pass2_s: f64,
    /// Training queries used by RobustStitch (0 for plain Vamana).
    pub train_queries: usize,
    pub knn_s: f64,
    pub stitch_s: f64,
    /// Edges RobustStitch added.
    pub stitched_edges: usize,
    pub connectivity_s: f64,
    /// Keys the connectivity pass had to link in.
    pub linked_unreachable: usize,
    pub total_s: f64,
    pub edges: usize,
    /// Name of the kNN backend (RobustStitch only).
    pub knn_backend: String,
}

/// Keys in the augmented space of the MIPS→L2 reduction: `n × dim` row-major, all of norm
/// `√norm2`.
pub(super) struct Augmented {
    pub data: Vec<f32>,
    pub dim: usize,
    pub norm2: f32,
}

impl Augmented {
    pub fn new(keys: &KeyStore) -> Self {
        let d = keys.dim();
        let raw = keys.to_f32();
        let norms: Vec<f64> = raw
            .chunks_exact(d)
            .map(|r| r.iter().map(|&x| x as f64 * x as f64).sum())
            .collect();
        let max = norms.iter().copied().fold(0.0f64, f64::max);
        let mut data = Vec::with_capacity(keys.len() * (d + 1));
        for (row, &n2) in raw.chunks_exact(d).zip(&norms) {
            data.extend_from_slice(row);
            data.push((max - n2).max(0.0).sqrt() as f32);
        }
        Augmented {
            data,
            dim: d + 1,
            norm2: max as f32,
        }
    }

    pub fn len(&self) -> usize {
        self.data.len() / self.dim
    }

    #[inline]
    pub fn row(&self, i: u32) -> &[f32] {
        &self.data[i as usize * self.dim..(i as usize + 1) * self.dim]
    }

    /// Squared L2 distance from a dot product of two augmented rows.
    #[inline]
    pub fn dist(&self, dot: f32) -> f32 {
        (2.0 * self.norm2 - 2.0 * dot).max(0.0)
    }
}

pub(super) struct Built {
    pub adj: Vec<Vec<u32>>,
    pub medoid: u32,
    pub stats: BuildStats,
}

pub(super) fn build(
    keys: &KeyStore,
    train_queries: Option<&[f32]>,
    params: &VamanaParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<Built> {
    params.validate()?;
    let start = Instant::now();
    let n = keys.len();
    if n == 0 {
        return Err(Error::Empty { what: "keys" });
    }
    let train = match (params.robust, train_queries) {
        (true, None) => {
            return Err(Error::invalid_param(
                "train_queries",
                "none",
                "robust = true needs training queries",
            ))
        }
        (true, Some(q)) => {
            crate::knn::check_knn_args(q, keys, 1)?;
            Some(q)
        }
        (false, _) => None,
    };
    let r = params.r;
    let build_degree = if params.robust {
        r - params.stitch_reserve
    } else {
        r
    };
    let aug = Augmented::new(keys);
    let mut rng = Rng::new(params.seed);
    let mut adj = random_graph(n, build_degree, &mut rng);
    let medoid = medoid(&aug);
    let max_batch = ((params.max_batch_fraction * n as f64).ceil() as usize).max(1);

    let mut pass_s = [0.0f64; 2];
    for (pass, alpha) in [1.0f32, params.alpha].into_iter().enumerate() {
        let t = Instant::now();
        let order = permutation(n, &mut rng);
        insert_pass(
            &aug,
            &mut adj,
            medoid,
            &order,
            &PassParams {
                alpha,
                r: build_degree,
                l: params.l,
                max_batch,
            },
            cancel,
        )?;
        pass_s[pass] = t.elapsed().as_secs_f64();
    }

    let mut stats = BuildStats {
        build_degree,
        pass1_s: pass_s[0],
        pass2_s: pass_s[1],
        ..Default::default()
    };
    if let Some(q) = train {
        let t = Instant::now();
        let lists = knn.topk(
            q,
            keys,
            params.stitch_t.min(n),
            &KnnOptions {
                causal: false,
                cancel: cancel.clone(),
                visible: None,
            },
        )?;
        stats.knn_s = t.elapsed().as_secs_f64();
        stats.train_queries = lists.rows();
        stats.knn_backend = knn.name();
        let t = Instant::now();
        stats.stitched_edges = robust_stitch(&mut adj, &lists, r);
        stats.stitch_s = t.elapsed().as_secs_f64();
    }
    cancel.check("Vamana build")?;
    let t = Instant::now();
    stats.linked_unreachable = connect(&aug, &mut adj, medoid, r, params.l, cancel)?;
    stats.connectivity_s = t.elapsed().as_secs_f64();
    stats.edges = adj.iter().map(Vec::len).sum();
    stats.total_s = start.elapsed().as_secs_f64();
    Ok(Built { adj, medoid, stats })
}

/// Each node gets `min(r, n − 1)` distinct random out-neighbours other than itself.
pub(super) fn random_graph(n: usize, r: usize, rng: &mut Rng) -> Vec<Vec<u32>> {
    let deg = r.min(n.saturating_sub(1));
    (0..n as u32)
        .map(|v| {
            if deg == n - 1 {
                return (0..n as u32).filter(|&x| x != v).collect();
            }
            let mut out = Vec::with_capacity(deg);
            while out.len() < deg {
                let x = rng.below(n) as u32;
                if x != v && !out.contains(&x) {
                    out.push(x);
                }
            }
            out
        })
        .collect()
}

/// A seeded random order of `0..n` (Fisher–Yates).
fn permutation(n: usize, rng: &mut Rng) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
}

/// The augmented key nearest (L2) to the mean of the augmented keys. All augmented keys have
/// the same norm, so that is the one with the largest inner product with the mean.
fn medoid(aug: &Augmented) -> u32 {
    let mut mean = vec![0.0f64; aug.dim];
    for row in aug.data.chunks_exact(aug.dim) {
        for (m, &x) in mean.iter_mut().zip(row) {
            *m += x as f64;
        }
    }
    let mean: Vec<f32> = mean
        .iter()
        .map(|&m| (m / aug.len() as f64) as f32)
        .collect();
    let dot = kernels().dot_f32;
    let mut best = (f32::NEG_INFINITY, 0u32);
    for (i, row) in aug.data.chunks_exact(aug.dim).enumerate() {
        let s = dot(&mean, row);
        if s > best.0 {
            best = (s, i as u32);
        }
    }
    best.1
}

struct PassParams {
    alpha: f32,
    r: usize,
    l: usize,
    max_batch: usize,
}

/// One Vamana pass: every key of `order` is searched for, pruned and reverse-linked.
fn insert_pass(
    aug: &Augmented,
    adj: &mut [Vec<u32>],
    medoid: u32,
    order: &[u32],
    p: &PassParams,
    cancel: &Cancel,
) -> Result<()> {
    let n = adj.len();
    let mut done = 0;
    let mut batch = 1;
    while done < order.len() {
        cancel.check("Vamana build")?;
        let nodes = &order[done..(done + batch).min(order.len())];
        let shared: &[Vec<u32>] = adj;
        let lists: Vec<Vec<u32>> = nodes
            .par_iter()
            .map_init(
                || (Scratch::new(n), Vec::new()),
                |(scratch, visited), &v| {
                    greedy_search(aug, shared, aug.row(v), medoid, p.l, scratch, visited);
                    let mut cands = std::mem::take(visited);
                    cands.extend_from_slice(&shared[v as usize]);
                    let out = robust_prune(aug, v, &cands, p.alpha, p.r);
                    *visited = cands;
                    out
                },
            )
            .collect();
        for (&v, list) in nodes.iter().zip(lists) {
            adj[v as usize] = list;
        }
        // Reverse edges: (target, source) pairs grouped by target.
        let mut rev: Vec<(u32, u32)> = nodes
            .iter()
            .flat_map(|&v| adj[v as usize].iter().map(move |&c| (c, v)))
            .collect();
        rev.sort_unstable();
        rev.dedup();
        let mut groups: Vec<(u32, Vec<u32>)> = Vec::new();
        for (c, v) in rev {
            match groups.last_mut() {
                Some((last, srcs)) if *last == c => srcs.push(v),
                _ => groups.push((c, vec![v])),
            }
        }
        let shared: &[Vec<u32>] = adj;
        let updates: Vec<(u32, Vec<u32>)> = groups
            .into_par_iter()
            .map(|(c, srcs)| {
                let mut merged = shared[c as usize].clone();
                for s in srcs {
                    if s != c && !merged.contains(&s) {
                        merged.push(s);
                    }
                }
                if merged.len() > p.r {
                    merged = robust_prune(aug, c, &merged, p.alpha, p.r);
                }
                (c, merged)
            })
            .collect();
        for (c, list) in updates {
            adj[c as usize] = list;
        }
        done += nodes.len();
        batch = (batch * 2).min(p.max_batch);
    }
    Ok(())
}

/// DiskANN's GreedySearch in the augmented space from `start` with a list of `l`: writes the
/// expanded ("visited", `V` in the paper) nodes into `visited`, in expansion order.
pub(super) fn greedy_search(
    aug: &Augmented,
    adj: &[Vec<u32>],
    query: &[f32],
    start: u32,
    l: usize,
    scratch: &mut Scratch,
    visited: &mut Vec<u32>,
) {
    let gather = kernels().gather_f32;
    let Scratch {
        visited: seen,
        beam,
        ids,
        scores,
        ..
    } = scratch;
    seen.reset(adj.len());
    beam.reset(l.max(1));
    visited.clear();
    seen.insert(start);
    let s = (kernels().dot_f32)(query, aug.row(start));
    beam.insert(s, start);
    while let Some(c) = beam.next_unexpanded() {
        visited.push(c.id);
        ids.clear();
        seen.filter_new(&adj[c.id as usize], ids);
        if ids.is_empty() {
            continue;
        }
        scores.resize(ids.len(), 0.0);
        gather(query, &aug.data, aug.dim, ids, scores);
        for (&id, &sc) in ids.iter().zip(scores.iter()) {
            beam.insert(sc, id);
        }
    }
}

/// DiskANN's RobustPrune(p, V, α, R): candidates (duplicates and `p` itself dropped) sorted by
/// distance to `p`; the nearest is kept and every candidate `c` with `α · d(kept, c) ≤ d(p, c)`
/// is dropped, until `r` are kept or none is left. Returns the kept ids, nearest first.
pub(super) fn robust_prune(
    aug: &Augmented,
    p: u32,
    cands: &[u32],
    alpha: f32,
    r: usize,
) -> Vec<u32> {
    let dot = kernels().dot_f32;
    let mut c: Vec<u32> = cands.iter().copied().filter(|&x| x != p).collect();
    c.sort_unstable();
    c.dedup();
    let mut scores = vec![0.0f32; c.len()];
    (kernels().gather_f32)(aug.row(p), &aug.data, aug.dim, &c, &mut scores);
    let mut by_dist: Vec<(f32, u32)> = scores
        .iter()
        .zip(&c)
        .map(|(&s, &id)| (aug.dist(s), id))
        .collect();
    by_dist.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut removed = vec![false; by_dist.len()];
    let mut kept = Vec::with_capacity(r);
    for i in 0..by_dist.len() {
        if removed[i] {
            continue;
        }
        let (_, star) = by_dist[i];
        kept.push(star);
        if kept.len() >= r {
            break;
        }
        let row = aug.row(star);
        for j in i + 1..by_dist.len() {
            if !removed[j] {
                let d = aug.dist(dot(row, aug.row(by_dist[j].1)));
                if alpha * d <= by_dist[j].0 {
                    removed[j] = true;
                }
            }
        }
    }
    kept
}

/// OOD-DiskANN's RobustStitch: for every training query, its exact nearest keys (best first)
/// are linked to one another — `a → b` for every ordered pair of the list, nearer `b` first —
/// wherever `a` still has a free slot below `r`. Returns the number of edges added.
pub(super) fn robust_stitch(adj: &mut [Vec<u32>], lists: &KnnResult, r: usize) -> usize {
    let mut added = 0;
    for row in 0..lists.rows() {
        let ids = lists.row(row);
        for &a in ids {
            for &b in ids {
                let list = &mut adj[a as usize];
                if list.len() >= r {
                    break;
                }
                if a != b && !list.contains(&b) {
                    list.push(b);
                    added += 1;
                }
            }
        }
    }
    added
}

/// Links every key that the medoid cannot reach ([`repair::connect`]); returns how many were
/// linked.
///
/// An unreachable key `u` is searched for from the medoid; the nearest expanded (hence
/// reachable) key with a free slot gets the edge to `u`. When none has room, the nearest
/// expanded key redirects an edge whose target keeps another in-edge ([`WhenFull::Redirect`]).
fn connect(
    aug: &Augmented,
    adj: &mut [Vec<u32>],
    medoid: u32,
    r: usize,
    l: usize,
    cancel: &Cancel,
) -> Result<usize> {
    let mut scratch = Scratch::new(adj.len());
    let mut visited = Vec::new();
    let mut by_dist: Vec<(f32, u32)> = Vec::new();
    let dot = kernels().dot_f32;
    let rule = Repair {
        entries: &[medoid],
        max_degree: r,
        any_with_room: false,
        when_full: WhenFull::Redirect,
        own_edges: 0,
        degree_name: "r",
        what: "Vamana build",
    };
    let near = |adj: &[Vec<u32>], reached: &[bool], u: u32, found: &mut Vec<u32>| {
        greedy_search(aug, adj, aug.row(u), medoid, l, &mut scratch, &mut visited);
        by_dist.clear();
        by_dist.extend(
            visited
                .iter()
                .filter(|&&x| reached[x as usize])
                .map(|&x| (aug.dist(dot(aug.row(u), aug.row(x))), x)),
        );
        by_dist.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        found.extend(by_dist.iter().map(|x| x.1));
    };
    repair::connect(adj, &rule, near, cancel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize, dim: usize, seed: u64) -> KeyStore {
        let mut rng = Rng::new(seed);
        let v: Vec<f32> = (0..n * dim)
            .map(|_| rng.normal() * (1.0 + rng.uniform()))
            .collect();
        KeyStore::from_f32(v, dim).expect("keys")
    }

    #[test]
    fn augmentation_preserves_inner_product_ranking() {
        let ks = keys(300, 8, 1);
        let aug = Augmented::new(&ks);
        for row in aug.data.chunks_exact(aug.dim) {
            let n2: f32 = row.iter().map(|x| x * x).sum();
            assert!((n2 - aug.norm2).abs() <= 1e-3 * aug.norm2);
        }
        // For q' = (q, 0): q'·k' = q·k, so the L2 order in augmented space is the IP order.
        let q: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut qa = q.clone();
        qa.push(0.0);
        let scorer = ks.scorer();
        for i in 0..300u32 {
            let ip = scorer.score(&q, i);
            let a = crate::metric::dot(&qa, aug.row(i));
            assert!((ip - a).abs() <= 1e-4 * ip.abs().max(1.0));
        }
    }

    #[test]
    fn random_graph_is_regular_without_self_loops() {
        let g = random_graph(100, 10, &mut Rng::new(3));
        for (v, l) in g.iter().enumerate() {
            assert_eq!(l.len(), 10);
            assert!(!l.contains(&(v as u32)));
            let mut s = l.clone();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), 10);
        }
        let small = random_graph(5, 10, &mut Rng::new(3));
        assert!(small.iter().all(|l| l.len() == 4));
    }

    #[test]
    fn robust_prune_bounds_degree_and_keeps_the_nearest() {
        let ks = keys(400, 6, 2);
        let aug = Augmented::new(&ks);
        let cands: Vec<u32> = (0..400).collect();
        for (alpha, r) in [(1.0f32, 8usize), (1.2, 8), (2.0, 32), (1.2, 400)] {
            let kept = robust_prune(&aug, 7, &cands, alpha, r);
            assert!(kept.len() <= r && !kept.is_empty());
            assert!(!kept.contains(&7));
            // The nearest candidate is always kept first.
            let nearest = (0..400u32)
                .filter(|&x| x != 7)
                .min_by(|&a, &b| {
                    let da = aug.dist(crate::metric::dot(aug.row(7), aug.row(a)));
                    let db = aug.dist(crate::metric::dot(aug.row(7), aug.row(b)));
                    da.total_cmp(&db).then(a.cmp(&b))
                })
                .expect("nearest");
            assert_eq!(kept[0], nearest);
        }
        // A larger α prunes less.
        let strict = robust_prune(&aug, 7, &cands, 1.0, 400).len();
        let loose = robust_prune(&aug, 7, &cands, 1.5, 400).len();
        assert!(
            loose >= strict,
            "α = 1.5 kept {loose} < α = 1 kept {strict}"
        );
        // Duplicates and p itself are dropped.
        assert_eq!(robust_prune(&aug, 3, &[3, 5, 5, 3], 1.2, 4), vec![5]);
    }

    #[test]
    fn stitch_fills_only_free_slots() {
        let mut adj = vec![vec![1u32], vec![], vec![0, 1, 3], vec![]];
        let lists = KnnResult {
            k: 3,
            ids: vec![2, 0, 1, 3, 2, KnnResult::PAD],
            scores: vec![3.0, 2.0, 1.0, 2.0, 1.0, f32::NEG_INFINITY],
        };
        let added = robust_stitch(&mut adj, &lists, 3);
        assert_eq!(adj[2], vec![0, 1, 3], "full list untouched");
        assert_eq!(adj[0], vec![1, 2]);
        assert_eq!(adj[1], vec![2, 0]);
        assert_eq!(adj[3], vec![2]);
        assert_eq!(added, 4);
        assert!(adj.iter().all(|l| l.len() <= 3));
    }
}
