//! Construction of the query-aware graph.
//!
//! 1. Bipartite kNN: each training query's exact top-`kq` keys ([`KnnBackend`]), or with
//!    `knn_probe` its best keys in that many lists of a coarse IVF ([`super::coarse`]), or with
//!    `knn_graph` its keys searched in a graph built first ([`super::graph_knn`]), or with
//!    `knn_pool` its best keys in a pool shared by similar queries ([`super::pool_knn`]); the
//!    keys themselves are the queries with [`TrainOn::Keys`]. `queries_per_key` thins the
//!    training queries first.
//! 2. Projection: per key, candidate neighbours from the lists it appears in ([`Projection`]).
//! 3. Pruning to `max_degree` ([`crate::graph::prune()`]), then reverse edges where a key has
//!    room.
//! 4. Connectivity ([`crate::graph::repair`]): every key not reachable from the entry points is
//!    searched for (with its own vector as the query) and linked from the best reachable key
//!    with room, so no key is lost.

use super::auto_ef::calibrate;
use super::far_check::{keep_better_lists, FarCheck};
use super::params::{AttentionParams, EntryRule, Projection, TrainOn};
use super::pool_knn::{self, PooledKnn};
use super::train_lists::{far_rows, thin, unmask_rows};
use super::{coarse, graph_knn};
use super::{AttentionIndex, AutoEf};
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
    /// Keys in no training query's top-`kq` list: they get no query-side edges, only sequence,
    /// reverse and connectivity ones.
    pub unlisted_keys: usize,
    /// Causal lists replaced by full ones ([`AttentionParams::global_full`]).
    pub unmasked_lists: usize,
    /// The far check's figures when it ran ([`AttentionParams::far_check`]); the other phase
    /// times are those of the graph kept, `total_s` covers both builds and the check.
    pub far_check: Option<FarCheck>,
    /// The `ef` calibration's figures when it ran ([`AttentionParams::auto_ef`]; in
    /// `total_s`).
    pub auto_ef: Option<AutoEf>,
    /// The pooled kNN's figures when it ran ([`AttentionParams::knn_pool`]; in `knn_s`).
    pub pooled_knn: Option<PooledKnn>,
    pub edges: usize,
    /// Name of the kNN backend used.
    pub knn_backend: String,
}

pub(super) fn build(
    keys: Arc<KeyStore>,
    train_queries: &[f32],
    visible: Option<&[u32]>,
    params: &AttentionParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<AttentionIndex> {
    let start = Instant::now();
    let mut index = build_once(keys, train_queries, visible, params, knn, cancel)?;
    let stats = &index.stats;
    let far_share = stats.unmasked_lists as f64 / stats.train_queries.max(1) as f64;
    let far = visible.filter(|_| {
        params.far_check > 0.0
            && params.train_on == TrainOn::Queries
            && far_share >= params.far_check
    });
    if let Some(visible) = far {
        keep_better_lists(&mut index, far_share, train_queries, visible, knn, cancel)?;
    }
    if params.auto_ef > 0.0 && params.train_on == TrainOn::Queries {
        let target = params.auto_ef;
        let measured = calibrate(&mut index, train_queries, visible, target, knn, cancel)?;
        index.stats.auto_ef = Some(measured);
    }
    index.stats.total_s = start.elapsed().as_secs_f64();
    Ok(index)
}

/// One build with the lists `params` ask for ([`build`] without the far check).
pub(super) fn build_once(
    keys: Arc<KeyStore>,
    train_queries: &[f32],
    visible: Option<&[u32]>,
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
    let queries = key_queries.as_deref().unwrap_or(train_queries);
    // Causal with per-row counts: checked against the rows before thinning, then thinned alike.
    let visible = match visible.filter(|_| params.causal && key_queries.is_none()) {
        Some(v) => {
            let m = queries.len() / keys.dim().max(1);
            if v.len() != m {
                return Err(Error::DimensionMismatch {
                    what: "visible key counts (one per training query)",
                    expected: m,
                    got: v.len(),
                });
            }
            Some(thin(v, 1, params.queries_per_key, n).into_owned().into())
        }
        None if params.causal && params.queries_per_key > 0.0 => {
            return Err(Error::invalid_param(
                "queries_per_key",
                params.queries_per_key,
                "cannot thin causal training queries without their visible key counts \
                 (row i must be position i)",
            ));
        }
        None => None,
    };
    let queries = thin(queries, keys.dim(), params.queries_per_key, n);
    let row_visible = visible.clone();
    let mut pooled_knn = None;
    let mut lists = match (params.knn_probe, params.knn_graph) {
        _ if params.knn_pool > 0 => {
            let (lists, stats) =
                pool_knn::pool_topk(&queries, &keys, kq, params.knn_pool, knn, cancel)?;
            pooled_knn = stats;
            lists
        }
        (0, 0) => knn.topk(
            &queries,
            &keys,
            kq,
            &KnnOptions {
                causal: params.causal,
                visible,
                cancel: cancel.clone(),
            },
        )?,
        (0, ef) => graph_knn::graph_topk(&keys, &queries, kq, ef, params, knn, cancel)?,
        (nprobe, _) => coarse::topk(&queries, &keys, kq, nprobe, knn, cancel)?,
    };
    let mut unmasked_lists = 0;
    if params.causal && params.global_full > 0.0 {
        let rows = far_rows(&lists, row_visible.as_deref(), n, params.global_full);
        unmask_rows(&mut lists, &rows, &queries, &keys, knn, cancel)?;
        unmasked_lists = rows.len();
    }
    cancel.check("AttentionIndex build")?;
    let knn_s = start.elapsed().as_secs_f64();

    let t = Instant::now();
    let occurrences = Occurrences::new(&lists, n);
    let unlisted_keys = (0..n as u32).filter(|&v| occurrences.count(v) == 0).count();
    let keys32 = key_queries.unwrap_or_else(|| keys.to_f32());
    let dim = keys.dim();
    let mut adj: Vec<Vec<u32>> = (0..n as u32)
        .into_par_iter()
        .map_init(
            || Tally::new(n),
            |tally, v| {
                let cands = candidates(v, &lists, &occurrences, params, &keys32, dim, tally);
                let cap = match params.prune_candidates {
                    0 => usize::MAX,
                    cap => cap,
                };
                let ranked = BestFirst::new(cands).take(cap);
                let mut out = sequence_neighbors(v, n, params.sequence_edges, params.max_degree);
                for c in select(v, ranked, params, &keys32, dim) {
                    if out.len() >= params.max_degree {
                        break;
                    }
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
                out
            },
        )
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
        unlisted_keys,
        unmasked_lists,
        far_check: None,
        auto_ef: None,
        pooled_knn,
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

/// Per-thread sums of candidate weights over all keys (dense, so that a key's thousands of
/// (candidate, weight) pairs are summed in place instead of sorted); reset after each key by
/// the ids it touched.
struct Tally {
    weight: Vec<f32>,
    seen: Vec<bool>,
    touched: Vec<u32>,
}

impl Tally {
    fn new(n: usize) -> Self {
        Tally {
            weight: vec![0.0; n],
            seen: vec![false; n],
            touched: Vec::new(),
        }
    }

    fn add(&mut self, c: u32, w: f32) {
        let i = c as usize;
        if !self.seen[i] {
            self.seen[i] = true;
            self.touched.push(c);
        }
        self.weight[i] += w;
    }

    /// The `(weight, id)` of every touched id (in the order first touched), then cleared.
    fn drain(&mut self) -> Vec<(f32, u32)> {
        let out = self
            .touched
            .iter()
            .map(|&c| (self.weight[c as usize], c))
            .collect();
        for &c in &self.touched {
            self.weight[c as usize] = 0.0;
            self.seen[c as usize] = false;
        }
        self.touched.clear();
        out
    }
}

/// How many occurrences ahead the projection prefetches a list window.
const PREFETCH_OCCURRENCES: usize = 8;

/// Candidate neighbours of `v` with a weight (higher is better), deduplicated, in no order
/// ([`BestFirst`] ranks them).
///
/// Rank weights are small integers, so their f32 sums are exact in any order: the tally gives
/// the same weights as a sort by id would, and the ranking (by weight, then id) the same list.
fn candidates(
    v: u32,
    lists: &KnnResult,
    occ: &Occurrences,
    params: &AttentionParams,
    keys: &[f32],
    dim: usize,
    tally: &mut Tally,
) -> Vec<(f32, u32)> {
    match params.projection {
        Projection::Pivot => {
            for &(row, rank) in occ.of(v) {
                if rank == 0 {
                    for &c in &lists.row(row as usize)[1..] {
                        if c != v {
                            tally.add(c, 0.0);
                        }
                    }
                }
            }
        }
        Projection::Rank { window } => {
            let occurrences = occ.of(v);
            for (i, &(row, rank)) in occurrences.iter().enumerate() {
                // The lists a key occurs in lie anywhere in the kNN result (52 MB at 131K
                // queries): ask for the window a few occurrences ahead so that the misses
                // overlap.
                if let Some(&(ahead, at)) = occurrences.get(i + PREFETCH_OCCURRENCES) {
                    let (start, at) = (ahead as usize * lists.k, at as usize);
                    let lo = start + at.saturating_sub(window);
                    let hi = (start + at + window + 1).min(start + lists.k);
                    crate::metric::prefetch(&lists.ids[lo..hi]);
                }
                let list = lists.row(row as usize);
                let (rank, w) = (rank as usize, window);
                let lo = rank.saturating_sub(w);
                let hi = (rank + w + 1).min(list.len());
                for (j, &c) in list.iter().enumerate().take(hi).skip(lo) {
                    if j != rank && c != v {
                        tally.add(c, (w + 1 - rank.abs_diff(j)) as f32);
                    }
                }
            }
        }
    }
    let mut out = tally.drain();
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
    out
}

/// The order of `(weight, id)` pairs, weight highest first ([`f32::total_cmp`]), then id, as one
/// `u64` per pair: comparing those is about twice as fast as comparing the pairs.
fn best_first_key(&(w, id): &(f32, u32)) -> u64 {
    // `total_cmp`'s key: flip the magnitude bits of negatives, then the sign bit makes the
    // order unsigned; inverted for highest first.
    let b = w.to_bits();
    let ord = b ^ ((((b as i32) >> 31) as u32) >> 1) ^ 0x8000_0000;
    (u64::from(!ord) << 32) | u64::from(id)
}

/// Sorts `(weight, id)` pairs best first ([`best_first_key`]).
#[cfg(test)]
fn sort_best_first(cands: &mut [(f32, u32)]) {
    cands.sort_unstable_by_key(best_first_key);
}

/// Candidates sorted at first only as far as this many are read; each further chunk doubles.
const FIRST_RANKED: usize = 64;

/// The ids of `(weight, id)` pairs in [`best_first_key`] order, ranked lazily: each chunk is
/// selected from the rest in linear time and only that chunk sorted. Pruning usually reads a
/// few dozen of a key's thousands of candidates, so this replaces a full sort per key by a
/// selection, and yields exactly the order the full sort gives (the keys are distinct).
struct BestFirst {
    items: Vec<(f32, u32)>,
    next: usize,
    sorted: usize,
}

impl BestFirst {
    fn new(items: Vec<(f32, u32)>) -> Self {
        BestFirst {
            items,
            next: 0,
            sorted: 0,
        }
    }
}

impl Iterator for BestFirst {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.next == self.sorted {
            let rest = &mut self.items[self.next..];
            if rest.is_empty() {
                return None;
            }
            let chunk = FIRST_RANKED.max(self.sorted).min(rest.len());
            if chunk < rest.len() {
                rest.select_nth_unstable_by_key(chunk - 1, best_first_key);
            }
            rest[..chunk].sort_unstable_by_key(best_first_key);
            self.sorted += chunk;
        }
        self.next += 1;
        Some(self.items[self.next - 1].1)
    }
}

/// Cuts candidates (ids, best first) down to `max_degree` out-edges by the params' rule,
/// with `v`'s own row as the pivot.
pub(super) fn select(
    v: u32,
    cands: impl IntoIterator<Item = u32>,
    params: &AttentionParams,
    keys: &[f32],
    dim: usize,
) -> Vec<u32> {
    let row = |i: u32| &keys[i as usize * dim..(i as usize + 1) * dim];
    prune(params.prune, row(v), cands, params.max_degree, row)
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

#[cfg(test)]
mod tests {
    use super::{sort_best_first, BestFirst};
    use proptest::prelude::*;

    proptest! {
        /// The lazy ranking yields the full sort's order, whole or cut short, at any size
        /// around its chunk boundaries and with many tied weights.
        #[test]
        fn best_first_is_the_full_sort_read_lazily(
            weights in proptest::collection::vec(-8i32..8, 0..700),
            take in 0usize..800,
        ) {
            let items: Vec<(f32, u32)> = weights
                .iter()
                .enumerate()
                .map(|(i, &w)| (w as f32 / 4.0, (i as u32 * 7919) % 10_007))
                .collect();
            let mut want = items.clone();
            sort_best_first(&mut want);
            let want: Vec<u32> = want.iter().map(|x| x.1).take(take).collect();
            let got: Vec<u32> = BestFirst::new(items).take(take).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn packed_sort_matches_the_pair_comparison() {
        let specials = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-40,
            -1e-40,
        ];
        let mut x: Vec<(f32, u32)> = specials
            .iter()
            .enumerate()
            .map(|(i, &w)| (w, i as u32))
            .collect();
        let mut state = 0x9e37_79b9u32;
        for id in 0..500u32 {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            // Few distinct weights, so that ties are broken by id.
            let w = ((state >> 24) as i32 - 128) as f32 / 16.0;
            x.push((w, 1000 + (id * 7919) % 500));
        }
        let mut want = x.clone();
        want.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        sort_best_first(&mut x);
        let bits = |v: &[(f32, u32)]| v.iter().map(|c| (c.0.to_bits(), c.1)).collect::<Vec<_>>();
        assert_eq!(bits(&x), bits(&want));
    }
}
