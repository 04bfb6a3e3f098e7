//! Construction of the query-aware graph.
//!
//! 1. Bipartite kNN: each training query's exact top-`kq` keys ([`KnnBackend`]); the keys
//!    themselves are the queries with [`TrainOn::Keys`].
//! 2. Projection: per key, candidate neighbours from the lists it appears in ([`Projection`]).
//! 3. Pruning to `max_degree` ([`crate::graph::prune()`]), then reverse edges where a key has
//!    room.
//! 4. Connectivity ([`crate::graph::repair`]): every key not reachable from the entry points is
//!    searched for (with its own vector as the query) and linked from the best reachable key
//!    with room, so no key is lost.

use super::params::{AttentionParams, EntryRule, Projection, TrainOn};
use super::AttentionIndex;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::graph::repair::{self, Repair, WhenFull};
use crate::graph::{beam_search, prune, BeamSettings, Csr};
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
    let key_queries = (params.train_on == TrainOn::Keys).then(|| keys.to_f32());
    let lists = knn.topk(
        key_queries.as_deref().unwrap_or(train_queries),
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
    let keys32 = key_queries.unwrap_or_else(|| keys.to_f32());
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

    let graph = Csr::from_lists(&adj)?;
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

/// Cuts candidates (weighted, best first) down to `max_degree` out-edges by the params' rule,
/// with `v`'s own row as the pivot.
pub(super) fn select(
    v: u32,
    cands: Vec<(f32, u32)>,
    params: &AttentionParams,
    keys: &[f32],
    dim: usize,
) -> Vec<u32> {
    let row = |i: u32| &keys[i as usize * dim..(i as usize + 1) * dim];
    prune(
        params.prune,
        row(v),
        cands.into_iter().map(|c| c.1),
        params.max_degree,
        row,
    )
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

/// Links every key that the entry points cannot reach ([`repair::connect`]); returns how many
/// were linked.
///
/// A key `u` that is not reachable is searched for with its own vector as the query; the best
/// reachable result with a free slot (else any reachable key with one) gets the edge `r → u`,
/// and `u` gets edges to the results if it has none. When every reachable key is full, `u` is
/// spliced into the list of the best reachable result ([`WhenFull::Splice`]).
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
    let ef = params.build_ef.min(n);
    let rule = Repair {
        entries,
        max_degree: m,
        any_with_room: true,
        when_full: WhenFull::Splice,
        own_edges: m.div_ceil(2),
        degree_name: "max_degree",
        what: "AttentionIndex build",
    };
    let near = |adj: &[Vec<u32>], _reached: &[bool], u: u32, found: &mut Vec<u32>| {
        keys.row_into(u, &mut query);
        let settings = BeamSettings::new(ef, ef);
        beam_search(
            adj,
            &scorer,
            &query,
            &[entries],
            &settings,
            &mut scratch,
            &mut out,
        );
        found.extend_from_slice(&out.ids);
    };
    repair::connect(adj, &rule, near, cancel)
}
