//! The projection step of the build: the training queries' top-`kq` lists become each key's
//! ranked candidate neighbours ([`Projection`]), pruned to `max_degree` out-edges
//! ([`crate::graph::prune()`]) after the sequence edges, then reverse edges where a key has
//! room.

use super::params::{AttentionParams, Projection};
use crate::graph::prune;
use crate::knn::KnnResult;
use crate::metric::kernels;
use rayon::prelude::*;

/// The adjacency lists of the projection: per key its sequence edges, then its pruned
/// candidates up to `max_degree`, then reverse edges where a key has room.
pub(super) fn project(
    lists: &KnnResult,
    occurrences: &Occurrences,
    params: &AttentionParams,
    keys: &[f32],
    dim: usize,
) -> Vec<Vec<u32>> {
    let n = keys.len() / dim.max(1);
    let mut adj: Vec<Vec<u32>> = (0..n as u32)
        .into_par_iter()
        .map_init(
            || Tally::new(n),
            |tally, v| {
                let cands = candidates(v, lists, occurrences, params, keys, dim, tally);
                let cap = match params.prune_candidates {
                    0 => usize::MAX,
                    cap => cap,
                };
                let ranked = BestFirst::new(cands).take(cap);
                let mut out = sequence_neighbors(v, n, params.sequence_edges, params.max_degree);
                for c in select(v, ranked, params, keys, dim) {
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
    adj
}

/// For each key, the (query row, rank) pairs of the training-query lists it appears in
/// (an inverted index of the bipartite graph, CSR-packed).
pub(super) struct Occurrences {
    offsets: Vec<u32>,
    entries: Vec<(u32, u32)>,
}

impl Occurrences {
    pub(super) fn new(lists: &KnnResult, n: usize) -> Self {
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

    pub(super) fn count(&self, v: u32) -> usize {
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
pub(super) fn sort_best_first(cands: &mut [(f32, u32)]) {
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
