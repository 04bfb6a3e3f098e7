//! Construction of the query-aware graph.
//!
//! 1. Bipartite kNN: each training query's exact top-`kq` keys ([`KnnBackend`]).
//! 2. Projection: per key, candidate neighbours from the lists it appears in ([`Projection`]).
//! 3. Pruning to `max_degree` ([`Prune`]), then reverse edges where a key has room.
//! 4. Connectivity: every key not reachable from the entry points is searched for (with its own
//!    vector as the query) and linked from the best reachable key with room, so no key is lost.

use super::params::{AttentionParams, EntryRule, Projection, Prune};
use super::AttentionIndex;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::graph::{beam_search, Csr};
use crate::knn::{KnnBackend, KnnOptions, KnnResult};
use crate::metric::kernels;
use crate::scratch::Scratch;
use crate::search::SearchOutput;
use crate::store::KeyStore;
use rayon::prelude::*;
use std::sync::Arc;
use std::time::Instant;

/// What a build did, and the wall time of each phase in seconds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct BuildStats {
    pub train_queries: usize,
    pub kq: usize,
    pub knn_s: f64,
    pub projection_s: f64,
    pub connectivity_s: f64,
    pub total_s: f64,
    /// Keys the connectivity pass had to link in.
    pub linked_unreachable: usize,
    pub edges: usize,
    /// Name of the kNN backend used.
    pub knn_backend: String,
}

pub(super) fn build(
    keys: Arc<KeyStore>,
    train_queries: &[f32],
    params: &AttentionParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<AttentionIndex> {
    params.validate()?;
    let start = Instant::now();
    let n = keys.len();
    if n == 0 {
        return Err(Error::Empty { what: "keys" });
    }
    let kq = params.kq.min(n);
    let lists = knn.topk(
        train_queries,
        &keys,
        kq,
        &KnnOptions {
            causal: params.causal,
            cancel: cancel.clone(),
        },
    )?;
    cancel.check("AttentionIndex build")?;
    let knn_s = start.elapsed().as_secs_f64();

    let t = Instant::now();
    let occurrences = Occurrences::new(&lists, n);
    let keys32 = keys.to_f32();
    let dim = keys.dim();
    let mut adj: Vec<Vec<u32>> = (0..n as u32)
        .into_par_iter()
        .map(|v| {
            let cands = candidates(v, &lists, &occurrences, params, &keys32, dim);
            let mut out = sequence_neighbors(v, n, params.sequence_edges, params.max_degree);
            for c in select(v, cands, params, &keys32, dim) {
                if out.len() >= params.max_degree {
                    break;
                }
                if !out.contains(&c) {
                    out.push(c);
                }
            }
            out
        })
        .collect();
    add_reverse_edges(&mut adj, params.max_degree);
    let mut entries = choose_entries(params, &occurrences, &lists, &keys32, dim);
    for v in (n.saturating_sub(params.recent_entries)..n).rev() {
        if !entries.contains(&(v as u32)) {
            entries.push(v as u32);
        }
    }
    let projection_s = t.elapsed().as_secs_f64();
    cancel.check("AttentionIndex build")?;

    let t = Instant::now();
    let linked = connect(&mut adj, &entries, &keys, params, cancel)?;
    let connectivity_s = t.elapsed().as_secs_f64();

    let graph = Csr::from_lists(&adj)
        .ok_or_else(|| Error::invalid_param("n", n, "too many edges for u32 offsets"))?;
    let stats = BuildStats {
        train_queries: lists.rows(),
        kq,
        knn_s,
        projection_s,
        connectivity_s,
        total_s: start.elapsed().as_secs_f64(),
        linked_unreachable: linked,
        edges: graph.edges(),
        knn_backend: knn.name(),
    };
    let mut index = AttentionIndex::from_parts(keys, graph, entries, params)?;
    index.stats = stats;
    Ok(index)
}

/// For each key, the (query row, rank) pairs of the training-query lists it appears in
/// (an inverted index of the bipartite graph, CSR-packed).
struct Occurrences {
    offsets: Vec<u32>,
    entries: Vec<(u32, u32)>,
}

impl Occurrences {
    fn new(lists: &KnnResult, n: usize) -> Self {
        let mut counts = vec![0u32; n + 1];
        for r in 0..lists.rows() {
            for &id in lists.row(r) {
                counts[id as usize + 1] += 1;
            }
        }
        for i in 0..n {
            counts[i + 1] += counts[i];
        }
        let mut fill = counts.clone();
        let mut entries = vec![(0u32, 0u32); counts[n] as usize];
        for r in 0..lists.rows() {
            for (rank, &id) in lists.row(r).iter().enumerate() {
                let slot = &mut fill[id as usize];
                entries[*slot as usize] = (r as u32, rank as u32);
                *slot += 1;
            }
        }
        Occurrences {
            offsets: counts,
            entries,
        }
    }

    fn of(&self, v: u32) -> &[(u32, u32)] {
        &self.entries[self.offsets[v as usize] as usize..self.offsets[v as usize + 1] as usize]
    }

    fn count(&self, v: u32) -> usize {
        self.of(v).len()
    }
}

/// Candidate neighbours of `v` with a weight (higher is better), deduplicated, best first.
fn candidates(
    v: u32,
    lists: &KnnResult,
    occ: &Occurrences,
    params: &AttentionParams,
    keys: &[f32],
    dim: usize,
) -> Vec<(f32, u32)> {
    let mut raw: Vec<(u32, f32)> = Vec::new();
    match params.projection {
        Projection::Pivot => {
            for &(row, rank) in occ.of(v) {
                if rank == 0 {
                    raw.extend(lists.row(row as usize)[1..].iter().map(|&c| (c, 0.0)));
                }
            }
        }
        Projection::Rank { window } => {
            for &(row, rank) in occ.of(v) {
                let list = lists.row(row as usize);
                let (rank, w) = (rank as usize, window);
                let lo = rank.saturating_sub(w);
                let hi = (rank + w + 1).min(list.len());
                for (j, &c) in list.iter().enumerate().take(hi).skip(lo) {
                    if j != rank {
                        raw.push((c, (w + 1 - rank.abs_diff(j)) as f32));
                    }
                }
            }
        }
    }
    raw.sort_unstable_by_key(|x| x.0);
    let mut out: Vec<(f32, u32)> = Vec::new();
    for (c, w) in raw {
        if c == v {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == c => last.0 += w,
            _ => out.push((w, c)),
        }
    }
    if let Projection::Rank { .. } = params.projection {
        // Co-occurrence counts favour keys that every query retrieves (attention sinks, hot
        // keys), which search finds anyway; normalise like a cosine of occurrence vectors so
        // that edges join keys retrieved by the *same* queries.
        let cu = (occ.count(v).max(1) as f32).sqrt();
        for cand in out.iter_mut() {
            let cc = (occ.count(cand.1).max(1) as f32).sqrt();
            cand.0 /= cu * cc;
        }
    }
    if let Projection::Pivot = params.projection {
        // RoarGraph orders a pivot's candidates by closeness to the pivot itself.
        let dot = kernels().dot_f32;
        let kv = &keys[v as usize * dim..(v as usize + 1) * dim];
        for cand in out.iter_mut() {
            let c = cand.1 as usize;
            cand.0 = dot(kv, &keys[c * dim..(c + 1) * dim]);
        }
    }
    out.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    out
}

/// Cuts candidates down to `max_degree` out-edges.
fn select(
    v: u32,
    cands: Vec<(f32, u32)>,
    params: &AttentionParams,
    keys: &[f32],
    dim: usize,
) -> Vec<u32> {
    let m = params.max_degree;
    match params.prune {
        Prune::Top => cands.into_iter().take(m).map(|c| c.1).collect(),
        Prune::Occlusion | Prune::OcclusionFill => {
            let dot = kernels().dot_f32;
            let row = |i: u32| &keys[i as usize * dim..(i as usize + 1) * dim];
            let kv = row(v);
            let mut kept: Vec<u32> = Vec::with_capacity(m);
            let mut dropped: Vec<u32> = Vec::new();
            for (_, c) in cands {
                if kept.len() >= m {
                    break;
                }
                let vc = dot(kv, row(c));
                if kept.iter().all(|&s| dot(row(s), row(c)) <= vc) {
                    kept.push(c);
                } else {
                    dropped.push(c);
                }
            }
            if params.prune == Prune::OcclusionFill {
                let room = m - kept.len();
                kept.extend(dropped.into_iter().take(room));
            }
            kept
        }
    }
}

/// The keys within `s` positions of `v` (nearest first), at most `max` of them.
fn sequence_neighbors(v: u32, n: usize, s: usize, max: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(2 * s);
    for dist in 1..=s as u32 {
        if let Some(before) = v.checked_sub(dist) {
            out.push(before);
        }
        if ((v + dist) as usize) < n {
            out.push(v + dist);
        }
    }
    out.truncate(max);
    out
}

/// Adds `c → v` for every edge `v → c` where `c` has fewer than `max_degree` out-edges.
fn add_reverse_edges(adj: &mut [Vec<u32>], max_degree: usize) {
    let forward: Vec<(u32, u32)> = adj
        .iter()
        .enumerate()
        .flat_map(|(v, l)| l.iter().map(move |&c| (c, v as u32)))
        .collect();
    for (c, v) in forward {
        let list = &mut adj[c as usize];
        if list.len() < max_degree && !list.contains(&v) {
            list.push(v);
        }
    }
}

fn choose_entries(
    params: &AttentionParams,
    occ: &Occurrences,
    lists: &KnnResult,
    keys: &[f32],
    dim: usize,
) -> Vec<u32> {
    let n = keys.len() / dim;
    let count = params.entry_count.min(n);
    match params.entry {
        EntryRule::L2Medoid => {
            let mut mean = vec![0.0f64; dim];
            for row in keys.chunks_exact(dim) {
                for (m, &x) in mean.iter_mut().zip(row) {
                    *m += x as f64;
                }
            }
            mean.iter_mut().for_each(|m| *m /= n as f64);
            let mut dist: Vec<(f64, u32)> = keys
                .chunks_exact(dim)
                .enumerate()
                .map(|(i, row)| {
                    let d2 = row
                        .iter()
                        .zip(&mean)
                        .map(|(&x, m)| (x as f64 - m).powi(2))
                        .sum::<f64>();
                    (d2, i as u32)
                })
                .collect();
            dist.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            dist.into_iter().take(count).map(|x| x.1).collect()
        }
        EntryRule::Hub => {
            let mut by_count: Vec<(usize, u32)> =
                (0..n as u32).map(|v| (occ.count(v), v)).collect();
            by_count.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            by_count.into_iter().take(count).map(|x| x.1).collect()
        }
        EntryRule::RecentHub { queries } => {
            let mut counts = vec![0usize; n];
            let rows = lists.rows();
            for r in rows.saturating_sub(queries)..rows {
                for &id in lists.row(r) {
                    counts[id as usize] += 1;
                }
            }
            let mut by_count: Vec<(usize, u32)> = counts
                .iter()
                .enumerate()
                .filter(|x| *x.1 > 0)
                .map(|(v, &c)| (c, v as u32))
                .collect();
            by_count.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut out: Vec<u32> = by_count.into_iter().take(count).map(|x| x.1).collect();
            if out.is_empty() {
                out.push(0);
            }
            out
        }
    }
}

/// Links every key that the entry points cannot reach; returns how many were linked.
///
/// A key `u` that is not reachable is searched for with its own vector as the query; the best
/// reachable result with a free slot gets the edge `r → u`, and `u` gets edges to the results
/// if it has none. When every reachable result is full, an edge `r → x` is redirected to `u`
/// only where `x` keeps another in-edge; should a key still be cut off, the pass repeats.
fn connect(
    adj: &mut [Vec<u32>],
    entries: &[u32],
    keys: &KeyStore,
    params: &AttentionParams,
    cancel: &Cancel,
) -> Result<usize> {
    let n = adj.len();
    let m = params.max_degree;
    let scorer = keys.scorer();
    let mut scratch = Scratch::new(n);
    let mut out = SearchOutput::default();
    let mut query = vec![0.0f32; keys.dim()];
    let mut stack = Vec::new();
    let mut indeg = vec![0u32; n];
    for list in adj.iter() {
        for &x in list {
            indeg[x as usize] += 1;
        }
    }
    let mut linked = 0;
    for _pass in 0..4 {
        cancel.check("AttentionIndex build")?;
        let mut reached = vec![false; n];
        for &e in entries {
            mark_from(adj, e, &mut reached, &mut stack);
        }
        if reached.iter().all(|&r| r) {
            return Ok(linked);
        }
        for u in 0..n as u32 {
            if reached[u as usize] {
                continue;
            }
            keys.row_into(u, &mut query);
            let ef = params.build_ef.min(n);
            beam_search(
                &*adj,
                &scorer,
                &query,
                &[entries],
                ef,
                ef,
                None,
                &mut scratch,
                &mut out,
            );
            let with_room = out
                .ids
                .iter()
                .copied()
                .find(|&r| r != u && reached[r as usize] && adj[r as usize].len() < m)
                .or_else(|| {
                    (0..n as u32).find(|&r| reached[r as usize] && adj[r as usize].len() < m)
                });
            match with_room {
                Some(from) => adj[from as usize].push(u),
                None => {
                    // Every reachable list is full: splice `u` into one, r → w becomes
                    // r → u → w. Whatever was reachable stays reachable (through `u`), and no
                    // path used `u`'s own edges (it was unreachable), so nothing is cut off.
                    let r = out
                        .ids
                        .iter()
                        .copied()
                        .find(|&r| r != u && reached[r as usize])
                        .or_else(|| entries.first().copied());
                    let Some(r) = r else {
                        continue;
                    };
                    let Some(w) = adj[r as usize].pop() else {
                        continue;
                    };
                    adj[r as usize].push(u);
                    let own = &mut adj[u as usize];
                    if own.contains(&w) {
                        indeg[w as usize] -= 1;
                    } else if own.len() < m {
                        own.push(w);
                    } else if let Some(last) = own.last_mut() {
                        indeg[*last as usize] -= 1;
                        *last = w;
                    }
                }
            }
            indeg[u as usize] += 1;
            if adj[u as usize].is_empty() {
                let own: Vec<u32> = out
                    .ids
                    .iter()
                    .copied()
                    .filter(|&r| r != u)
                    .take(m.div_ceil(2))
                    .collect();
                for &x in &own {
                    indeg[x as usize] += 1;
                }
                adj[u as usize] = own;
            }
            linked += 1;
            mark_from(adj, u, &mut reached, &mut stack);
        }
    }
    let mut seen = vec![false; n];
    for &e in entries {
        mark_from(adj, e, &mut seen, &mut stack);
    }
    match seen.iter().position(|&s| !s) {
        Some(lost) => Err(Error::invalid_param(
            "max_degree",
            m,
            format!("too small to keep key {lost} reachable"),
        )),
        None => Ok(linked),
    }
}

/// Marks everything reachable from `v` (including `v`).
fn mark_from(adj: &[Vec<u32>], v: u32, reached: &mut [bool], stack: &mut Vec<u32>) {
    if reached[v as usize] {
        return;
    }
    reached[v as usize] = true;
    stack.push(v);
    while let Some(x) = stack.pop() {
        for &w in &adj[x as usize] {
            if !reached[w as usize] {
                reached[w as usize] = true;
                stack.push(w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Key 0 is `v`; 1 and 2 point almost the same way (2 is occluded by 1), 3 points
    /// elsewhere. Candidates come best-ranked first: 1, 2, 3.
    fn occluded_case(prune: Prune, max_degree: usize) -> Vec<u32> {
        let keys = [1.0, 0.0, 1.0, 0.1, 1.0, 0.2, 0.5, -1.0];
        let params = AttentionParams {
            prune,
            max_degree,
            ..AttentionParams::default()
        };
        select(0, vec![(3.0, 1), (2.0, 2), (1.0, 3)], &params, &keys, 2)
    }

    #[test]
    fn occlusion_fill_keeps_the_diverse_edges_then_fills_by_rank() {
        assert_eq!(occluded_case(Prune::Top, 2), vec![1, 2]);
        assert_eq!(occluded_case(Prune::Occlusion, 3), vec![1, 3]);
        assert_eq!(occluded_case(Prune::OcclusionFill, 3), vec![1, 3, 2]);
        // With room for two, the occluded candidate is the one left out (Top would drop 3).
        assert_eq!(occluded_case(Prune::OcclusionFill, 2), vec![1, 3]);
        assert_eq!(occluded_case(Prune::OcclusionFill, 1), vec![1]);
    }
}
