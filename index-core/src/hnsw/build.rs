//! Construction of the HNSW layers (Malkov & Yashunin, Algorithms 1 and 4), as hnswlib builds
//! them, with parallel insertion in deterministic batches.
//!
//! 1. Build vectors: the keys as f32, with the MIPS→L2 coordinate appended when
//!    [`HnswParams::l2_reduction`] is set (a temporary copy, dropped after the build; searches
//!    score the shared [`KeyStore`]). Key–key similarity is their inner product, so "closer" is
//!    "larger similarity" in both modes (hnswlib's `ip` distance is `1 − ip`, its `l2` distance on
//!    the reduction is `2R² − 2·similarity`: the same orders).
//! 2. Levels: `⌊−ln(u)·m_L⌋`, `u` uniform in (0, 1], from a seeded generator, in id order.
//! 3. Insertion in id order: greedy descent (`ef = 1`) through the levels above the key's level,
//!    then at each level from `min(level, top)` down to 0 a beam search with `ef_construction`
//!    from the closest key found so far; the key links to `m` of the results picked by the
//!    heuristic (Algorithm 4), and each picked key links back, re-running the heuristic over its
//!    list when it would exceed `2m` (level 0) or `m` (above).
//!
//! **Batches.** Keys are inserted in batches that search the graph as it stood when the batch
//! began (in parallel), then link in id order; back-links to one key are merged and pruned once.
//! A key's batch mates of lower id are not in that graph, so they are scored exactly and join its
//! candidates: the key sees every key inserted before it, as in sequential insertion. (Without
//! this, recall on real attention keys collapses: keys of neighbouring positions are each other's
//! nearest neighbours and share a batch.) Batches grow with the graph (`inserted / 32`, at most
//! 1,024 keys; the first 32 keys go one by one). The output depends only on keys and params, not
//! on the thread count; hnswlib's own parallel build (per-node locks) is not deterministic.

use super::params::HnswParams;
use super::upper::UpperLevels;
use super::HnswIndex;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::graph::{beam_search, BeamSettings, Csr, Neighbors};
use crate::metric::kernels;
use crate::scratch::{Scored, Scratch};
use crate::search::{SearchOutput, SearchStats};
use crate::store::{KeyStore, Scorer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::sync::Arc;
use std::time::Instant;

/// A batch holds at most `inserted / BATCH_DIVISOR` keys.
const BATCH_DIVISOR: usize = 32;
/// Upper bound of a batch.
const MAX_BATCH: usize = 1024;
/// Levels above this are clamped (a draw above 64 needs `u < e^(−64·ln m)`; never seen).
const MAX_LEVEL: usize = 64;

/// What a build did, and the wall time of each phase in seconds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct BuildStats {
    /// Build vectors (reduction) and level draws.
    pub prepare_s: f64,
    /// Insertion of every key.
    pub insert_s: f64,
    /// Flattening to CSR and the statistics below.
    pub finalize_s: f64,
    pub total_s: f64,
    /// Highest level (the entry point's).
    pub max_level: usize,
    /// `nodes_per_level[l]`: keys present at level `l` (level ≥ `l`); `[0]` is `n`.
    pub nodes_per_level: Vec<usize>,
    /// Directed edges at level 0.
    pub edges_level0: usize,
    /// Directed edges above level 0, all levels together.
    pub edges_upper: usize,
    /// Keys with no incoming level-0 edge: a search reaches them only when the descent through
    /// the upper levels ends on them. Inner-product HNSW strands many on attention keys.
    pub stranded: usize,
    /// Keys the level-0 graph cannot reach from the entry point.
    pub unreachable: usize,
    /// Insertion batches.
    pub batches: usize,
}

/// The f32 vectors the build compares: `n × dim` row-major (the keys, plus the reduction's
/// coordinate).
struct BuildVectors {
    store: KeyStore,
    data: Vec<f32>,
    dim: usize,
}

impl BuildVectors {
    fn new(keys: &KeyStore, l2_reduction: bool) -> Result<Self> {
        let d = keys.dim();
        let keys32 = keys.to_f32();
        let (data, dim) = if l2_reduction {
            let norms: Vec<f64> = keys32
                .chunks_exact(d)
                .map(|r| r.iter().map(|&x| f64::from(x) * f64::from(x)).sum())
                .collect();
            let r2 = norms.iter().copied().fold(0.0, f64::max);
            let mut data = Vec::with_capacity(keys32.len() + norms.len());
            for (row, &nn) in keys32.chunks_exact(d).zip(&norms) {
                data.extend_from_slice(row);
                data.push((r2 - nn).max(0.0).sqrt() as f32);
            }
            (data, d + 1)
        } else {
            (keys32, d)
        };
        let store = KeyStore::from_f32(data.clone(), dim)?;
        Ok(BuildVectors { store, data, dim })
    }

    #[inline]
    fn row(&self, id: u32) -> &[f32] {
        &self.data[id as usize * self.dim..(id as usize + 1) * self.dim]
    }

    #[inline]
    fn sim(&self, a: u32, b: u32) -> f32 {
        (kernels().dot_f32)(self.row(a), self.row(b))
    }
}

/// Adjacency lists while building: `lists[level][node]` (empty for nodes below `level`).
type Layers = Vec<Vec<Vec<u32>>>;

pub(super) fn build(
    keys: Arc<KeyStore>,
    params: &HnswParams,
    cancel: &Cancel,
) -> Result<HnswIndex> {
    params.validate()?;
    let start = Instant::now();
    let n = keys.len();
    if n == 0 {
        return Err(Error::Empty { what: "keys" });
    }
    let vectors = BuildVectors::new(&keys, params.l2_reduction)?;
    let levels = draw_levels(n, params);
    let top = levels.iter().copied().max().unwrap_or(0) as usize;
    let prepare_s = start.elapsed().as_secs_f64();
    cancel.check("HnswIndex build")?;

    let t = Instant::now();
    let mut layers: Layers = (0..=top).map(|_| vec![Vec::new(); n]).collect();
    let mut entry = 0u32;
    let mut max_level = levels[0] as usize;
    let mut inserted = 1usize;
    let mut batches = 0usize;
    let efc = params.ef_construction.max(params.m);
    while inserted < n {
        cancel.check("HnswIndex build")?;
        let size = (inserted / BATCH_DIVISOR).clamp(1, MAX_BATCH);
        let batch = inserted..(inserted + size).min(n);
        let frozen = &layers;
        let plans: Vec<Vec<Vec<u32>>> = batch
            .clone()
            .into_par_iter()
            .map_init(
                || (Scratch::new(n), SearchOutput::default()),
                |(scratch, out), u| {
                    let plan = Planner {
                        layers: frozen,
                        vectors: &vectors,
                        levels: &levels,
                        entry,
                        max_level,
                        efc,
                        params,
                    };
                    plan.links(u as u32, batch.start as u32, scratch, out)
                },
            )
            .collect();
        let mut back: Vec<(u8, u32, u32)> = Vec::new();
        for (u, links) in batch.clone().zip(plans) {
            for (level, list) in links.into_iter().enumerate() {
                back.extend(list.iter().map(|&v| (level as u8, v, u as u32)));
                layers[level][u] = list;
            }
        }
        // Back-links, grouped by the key that receives them (batch mates included, their own
        // lists set above).
        back.sort_unstable();
        let groups: Vec<&[(u8, u32, u32)]> =
            back.chunk_by(|a, b| a.0 == b.0 && a.1 == b.1).collect();
        let updates: Vec<Option<Vec<u32>>> = groups
            .par_iter()
            .map(|g| {
                let (level, v) = (g[0].0 as usize, g[0].1);
                let incoming = g.iter().map(|x| x.2);
                merge_back_links(
                    &layers[level][v as usize],
                    v,
                    incoming,
                    level,
                    params,
                    &vectors,
                )
            })
            .collect();
        for (g, update) in groups.iter().zip(updates) {
            let (level, v) = (g[0].0 as usize, g[0].1 as usize);
            match update {
                Some(list) => layers[level][v] = list,
                None => layers[level][v].extend(g.iter().map(|x| x.2)),
            }
        }
        for u in batch.clone() {
            if levels[u] as usize > max_level {
                max_level = levels[u] as usize;
                entry = u as u32;
            }
        }
        inserted = batch.end;
        batches += 1;
    }
    let insert_s = t.elapsed().as_secs_f64();
    cancel.check("HnswIndex build")?;

    let t = Instant::now();
    let too_many = || Error::invalid_param("n", n, "too many edges for u32 offsets");
    let mut lists = layers.into_iter();
    let level0 = Csr::from_lists(&lists.next().unwrap_or_default())?;
    let upper_lists: Vec<Vec<Vec<u32>>> = lists.collect();
    let upper = UpperLevels::from_layers(&levels, &upper_lists).ok_or_else(too_many)?;
    drop(upper_lists);
    let mut indegree = vec![0u32; n];
    for &v in level0.neighbor_array() {
        indegree[v as usize] += 1;
    }
    let reach = level0.reachable(&[entry]);
    let nodes_per_level = (0..=top)
        .map(|l| levels.iter().filter(|&&x| x as usize >= l).count())
        .collect();
    let mut stats = BuildStats {
        prepare_s,
        insert_s,
        finalize_s: 0.0,
        total_s: 0.0,
        max_level: top,
        nodes_per_level,
        edges_level0: level0.edges(),
        edges_upper: upper.edges(),
        stranded: indegree.iter().filter(|&&d| d == 0).count(),
        unreachable: reach.iter().filter(|&&r| !r).count(),
        batches,
    };
    stats.finalize_s = t.elapsed().as_secs_f64();
    stats.total_s = start.elapsed().as_secs_f64();
    let mut index = HnswIndex::from_parts(keys, level0, upper, entry, params)?;
    index.stats = stats;
    Ok(index)
}

/// Levels of keys `0..n`, drawn in id order: `⌊−ln(u)·m_L⌋` with `u` uniform in (0, 1].
fn draw_levels(n: usize, params: &HnswParams) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(params.seed);
    let ml = params.level_multiplier();
    (0..n)
        .map(|_| {
            let u = 1.0 - rng.random::<f64>();
            ((-u.ln() * ml).floor() as usize).min(MAX_LEVEL) as u8
        })
        .collect()
}

/// Greedy descent (`ef = 1`) through `graph`: moves to the best unvisited neighbour while it
/// beats the current key. Skipping visited keys changes nothing — a key scored earlier scored
/// at most what the current key scores, as the current score only rises — and saves their
/// inner products. Counts every inner product and every expanded key in `stats`. Ids `≥ n` (the
/// number of keys) are skipped.
/// Uses the visited set (not reset: the caller marks the entry) and the id and score buffers of
/// `scratch`.
pub(super) fn greedy<G: Neighbors + ?Sized>(
    graph: &G,
    n: u32,
    scorer: &Scorer<'_>,
    query: &[f32],
    mut cur: Scored,
    scratch: &mut Scratch,
    stats: &mut SearchStats,
) -> Scored {
    let Scratch {
        visited,
        ids,
        scores,
        ..
    } = scratch;
    loop {
        stats.hops += 1;
        ids.clear();
        // `_below`: an upper level read from an unverified file may hold ids `≥ n`.
        visited.filter_new_below(graph.neighbors_of(cur.id), n, ids);
        if ids.is_empty() {
            return cur;
        }
        scores.resize(ids.len(), 0.0);
        scorer.score_ids(query, ids, scores);
        stats.distance_computations += ids.len() as u64;
        let mut best = cur;
        for (&id, &score) in ids.iter().zip(scores.iter()) {
            if score > best.score {
                best = Scored { score, id };
            }
        }
        if best.id == cur.id {
            return cur;
        }
        cur = best;
    }
}

/// What the link planning of one batch reads: the layers frozen before the batch, the vectors,
/// every key's level, the entry point and top level, the build's `ef` and parameters.
struct Planner<'a> {
    layers: &'a Layers,
    vectors: &'a BuildVectors,
    levels: &'a [u8],
    entry: u32,
    max_level: usize,
    efc: usize,
    params: &'a HnswParams,
}

impl Planner<'_> {
    /// The links key `u` gets at each of its levels `0..=min(level, max_level)`: candidates are
    /// found on the frozen layers from the entry, plus the keys `batch_start..u` (its batch mates
    /// of lower id, not in the layers yet) present at that level, scored exactly.
    fn links(
        &self,
        u: u32,
        batch_start: u32,
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Vec<Vec<u32>> {
        let n = self.layers[0].len();
        let level = self.levels[u as usize] as usize;
        let scorer = self.vectors.store.scorer();
        let query = self.vectors.row(u);
        let mut stats = SearchStats::default();
        scratch.visited.reset(n);
        scratch.visited.insert(self.entry);
        let mut cur = Scored {
            score: scorer.score(query, self.entry),
            id: self.entry,
        };
        for l in (level + 1..=self.max_level).rev() {
            cur = greedy(
                &self.layers[l][..],
                self.layers[l].len() as u32,
                &scorer,
                query,
                cur,
                scratch,
                &mut stats,
            );
        }
        let top = level.min(self.max_level);
        let mut links = vec![Vec::new(); top + 1];
        for l in (0..=top).rev() {
            beam_search(
                &self.layers[l][..],
                &scorer,
                query,
                &[&[cur.id]],
                &BeamSettings::new(self.efc, self.efc),
                scratch,
                out,
            );
            let mut cands: Vec<(f32, u32)> = out
                .scores
                .iter()
                .zip(&out.ids)
                .filter(|x| *x.1 != u)
                .map(|(&s, &id)| (s, id))
                .collect();
            // The next level down starts from the best key of the frozen graph (batch mates have
            // no links there yet).
            if let Some(&(score, id)) = cands.first() {
                cur = Scored { score, id };
            }
            let before = cands.len();
            cands.extend(
                (batch_start..u)
                    .filter(|&w| self.levels[w as usize] as usize >= l)
                    .map(|w| (self.vectors.sim(u, w), w)),
            );
            if cands.len() > before {
                cands.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                cands.truncate(self.efc);
            }
            links[l] =
                select_neighbors(&cands, self.params.m, self.params.keep_pruned, self.vectors);
        }
        links
    }
}

/// The neighbour-selection heuristic (Algorithm 4, as hnswlib's `getNeighborsByHeuristic2`):
/// `cands` is sorted best first by similarity to the base key; a candidate is kept when no
/// kept key is more similar to it than the base is. Fewer than `m` candidates are all kept.
/// With `keep_pruned`, discarded candidates fill the list up to `m`.
fn select_neighbors(
    cands: &[(f32, u32)],
    m: usize,
    keep_pruned: bool,
    vectors: &BuildVectors,
) -> Vec<u32> {
    if cands.len() < m {
        return cands.iter().map(|c| c.1).collect();
    }
    let mut kept: Vec<u32> = Vec::with_capacity(m);
    let mut pruned: Vec<u32> = Vec::new();
    for &(base_sim, c) in cands {
        if kept.len() >= m {
            break;
        }
        if kept.iter().all(|&s| vectors.sim(s, c) <= base_sim) {
            kept.push(c);
        } else if keep_pruned {
            pruned.push(c);
        }
    }
    if keep_pruned {
        let room = m - kept.len();
        kept.extend(pruned.into_iter().take(room));
    }
    kept
}

/// Key `v`'s list at `level` after back-links from `incoming` (ids not yet in it): `None` when
/// they fit (append them), else the heuristic's pick among old and new ids.
fn merge_back_links(
    old: &[u32],
    v: u32,
    incoming: impl Iterator<Item = u32>,
    level: usize,
    params: &HnswParams,
    vectors: &BuildVectors,
) -> Option<Vec<u32>> {
    let cap = params.max_links(level);
    let incoming: Vec<u32> = incoming.collect();
    if old.len() + incoming.len() <= cap {
        return None;
    }
    let mut cands: Vec<(f32, u32)> = old
        .iter()
        .chain(&incoming)
        .map(|&x| (vectors.sim(v, x), x))
        .collect();
    cands.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    Some(select_neighbors(&cands, cap, params.keep_pruned, vectors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_the_multiplier() {
        let p = HnswParams::default();
        let levels = draw_levels(100_000, &p);
        let above = levels.iter().filter(|&&l| l >= 1).count() as f64 / 1e5;
        // P(level ≥ 1) = 1/m.
        assert!((above - 1.0 / 16.0).abs() < 0.005, "{above}");
        assert_eq!(levels, draw_levels(100_000, &p), "seeded");
    }

    #[test]
    fn reduction_gives_every_key_the_largest_norm() {
        let keys = KeyStore::from_f32(vec![3.0, 4.0, 1.0, 0.0, 0.0, 0.0], 2).expect("keys");
        let v = BuildVectors::new(&keys, true).expect("vectors");
        assert_eq!(v.dim, 3);
        for id in 0..3 {
            assert!((v.sim(id, id) - 25.0).abs() < 1e-4, "{id}");
        }
        assert_eq!(v.row(1), &[1.0, 0.0, 24f32.sqrt()]);
        let plain = BuildVectors::new(&keys, false).expect("vectors");
        assert_eq!(plain.dim, 2);
        assert_eq!(plain.sim(0, 1), 3.0);
    }

    #[test]
    fn heuristic_drops_candidates_closer_to_a_kept_key() {
        // Base 0 = (1, 0); candidates 1 = (0.9, 0.1), 2 = (0.8, 0.3), 3 = (0, 0.5). Base
        // similarities 0.9, 0.8, 0. Key 2 is kept: sim(1, 2) = 0.75 ≤ 0.8. Key 3 is pruned:
        // sim(1, 3) = 0.05 > 0.
        let keys =
            KeyStore::from_f32(vec![1.0, 0.0, 0.9, 0.1, 0.8, 0.3, 0.0, 0.5], 2).expect("keys");
        let v = BuildVectors::new(&keys, false).expect("vectors");
        let mut cands: Vec<(f32, u32)> = (1..4).map(|x| (v.sim(0, x), x)).collect();
        cands.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        assert_eq!(select_neighbors(&cands, 3, false, &v), vec![1, 2]);
        assert_eq!(select_neighbors(&cands, 3, true, &v), vec![1, 2, 3]);
        // Fewer candidates than m: all kept.
        assert_eq!(select_neighbors(&cands, 4, false, &v), vec![1, 2, 3]);
    }
}
