//! Query-aware insertion: a key that arrives after the build (a decode step's key leaving the
//! recent window) is linked the way the build links keys — through the queries that find it.
//!
//! The caller passes *guide* queries: queries known to rank the new key high (in decoding, the
//! recent decode queries that attended to it most while it sat in the window). Each guide is
//! searched in the current graph; the keys it finds are the keys "the same query finds close",
//! which is what the projection links. The new key takes them as out-edges (interleaved across
//! guides, best first, pruned by the index's rule) after its sequence neighbour; its neighbours
//! link back while their lists hold fewer than `2 · max_degree` edges (with the build's bound of
//! `max_degree` a grown index lost a quarter of its recall on synthetic data: old keys, all full,
//! never pointed at new ones); and the previous key (or, without sequence edges, the best
//! candidate) always links to it, so every key stays reachable from the entry points. Without
//! guides the key itself is the query (a key–key fallback).

use super::{Adjacency, AttentionIndex, Prune};
use crate::error::{check_finite, Error, Result};
use crate::graph::{beam_search, prune, BeamSettings};
use crate::scratch::Scratch;
use crate::search::SearchOutput;
use crate::store::KeyStore;
use std::sync::Arc;

/// Guides used at most (the first ones given).
pub const MAX_GUIDES: usize = 4;

/// Full neighbours (best candidates first) that may give a slot to the new key.
const REPLACE_CANDIDATES: usize = 8;

impl AttentionIndex {
    /// Appends `key` (its id is the previous [`crate::AnnIndex::len`]) and links it into the
    /// graph, guided by `guides` (row-major queries, a multiple of `dim` values; the first
    /// `MAX_GUIDES` (4) are used; may be empty). Returns the new id.
    ///
    /// The key store is copied first when other handles share it (copy-on-write), so indexes
    /// built on the same store keep their own keys. After inserts, with sequence edges, the
    /// out-degree is at most `2 · max_degree + 1` (room for links back to new keys, plus the link
    /// from the previous key that keeps the new one reachable); without them a neighbour may
    /// take such reachability links above that bound.
    ///
    /// Errors: wrong dimension, non-finite values.
    pub fn insert(&mut self, key: &[f32], guides: &[f32], scratch: &mut Scratch) -> Result<u32> {
        let dim = self.keys.dim();
        if !guides.len().is_multiple_of(dim) {
            return Err(Error::DimensionMismatch {
                what: "guide queries (a multiple of dim values)",
                expected: dim * (guides.len() / dim + 1),
                got: guides.len(),
            });
        }
        check_finite("guide queries", guides, dim)?;
        let n = self.keys.len();
        let id = u32::try_from(n)
            .ok()
            .filter(|&id| id < u32::MAX)
            .ok_or_else(|| Error::invalid_param("n", n, "more than u32::MAX keys"))?;
        if key.len() != dim {
            return Err(Error::DimensionMismatch {
                what: "key",
                expected: dim,
                got: key.len(),
            });
        }
        check_finite("key", key, dim)?;

        let mut cands = self.guided_candidates(key, guides, scratch);
        cands.truncate(2 * self.params.max_degree);
        Arc::make_mut(&mut self.keys).push(key)?;
        if let Some(codes) = &mut self.codes {
            codes.push(key)?;
        }
        if let Some(scan) = &mut self.scan {
            scan.push(key)?;
        }

        let max_degree = self.params.max_degree;
        let sequence = self.params.sequence_edges > 0;
        let mut out: Vec<u32> = Vec::with_capacity(max_degree + 1);
        if sequence {
            out.push(id - 1);
        }
        let kept = prune_candidates(self.params.prune, key, &cands, &self.keys, max_degree);
        for c in kept {
            if out.len() >= max_degree {
                break;
            }
            if !out.contains(&c) {
                out.push(c);
            }
        }
        let mut lists = match std::mem::replace(&mut self.graph, Adjacency::Growing(Vec::new())) {
            Adjacency::Frozen(g) => (0..g.len() as u32)
                .map(|v| g.neighbors(v).to_vec())
                .collect(),
            Adjacency::Growing(l) => l,
        };
        let mut linked = false;
        for &c in &out {
            let l = &mut lists[c as usize];
            if l.len() < 2 * max_degree && !l.contains(&id) {
                l.push(id);
                linked |= !sequence || c == id - 1;
            }
        }
        // Full neighbours among the best candidates give the new key the slot of the inserted
        // key they point to that the guide likes least, when the guide likes the new key more:
        // without this, hubs fill up early and later keys are never linked from where searches
        // pass (recall decayed with every thousand inserts). Build edges and the sequence edge
        // `c → c + 1` are never replaced, so every key stays reachable.
        if sequence {
            let guide = if guides.is_empty() {
                key
            } else {
                &guides[..dim]
            };
            let scorer = self.keys.scorer();
            let new_score = scorer.score(guide, id);
            for &c in out
                .iter()
                .filter(|&&c| c != id - 1)
                .take(REPLACE_CANDIDATES)
            {
                let l = &mut lists[c as usize];
                if l.len() < 2 * max_degree || l.contains(&id) {
                    continue;
                }
                let worst = l
                    .iter()
                    .enumerate()
                    .filter(|&(_, &y)| y as usize >= self.built_len && y != c + 1)
                    .map(|(i, &y)| (scorer.score(guide, y), i))
                    .min_by(|a, b| a.0.total_cmp(&b.0));
                if let Some((score, i)) = worst {
                    if score < new_score {
                        l[i] = id;
                    }
                }
            }
        }
        // Reachability: unless a link back came from the previous key (reachable by induction)
        // or, without sequence edges, from any neighbour, the previous key (or the neighbour with
        // the shortest list) links in above the bound.
        let anchor = if linked {
            None
        } else if sequence {
            Some(id - 1)
        } else {
            out.iter().copied().min_by_key(|&c| lists[c as usize].len())
        };
        if let Some(a) = anchor {
            lists[a as usize].push(id);
        }
        if let (Some(inline), Some(codes)) = (&mut self.inline, &self.codes) {
            // Every list this insert may have changed: the new key's neighbours (linked back
            // or a slot replaced), the anchor of the reachability link, and the new key's own.
            for &c in out.iter().chain(anchor.iter()) {
                inline.set(c, &lists[c as usize], codes);
            }
            inline.set(id, &out, codes);
        }
        lists.push(out);
        self.graph = Adjacency::Growing(lists);
        self.update_recent_entries();
        Ok(id)
    }

    /// Keys found by beam searches for the guides (or for the key itself), interleaved across
    /// searches, best first, without repeats.
    fn guided_candidates(&self, key: &[f32], guides: &[f32], scratch: &mut Scratch) -> Vec<u32> {
        let dim = self.keys.dim();
        let n = self.keys.len();
        let k = (2 * self.params.max_degree).min(n);
        let ef = k.max(self.params.max_degree * 2);
        let scorer = self.keys.scorer();
        let mut searches: Vec<Vec<u32>> = Vec::new();
        let queries: Vec<&[f32]> = if guides.is_empty() {
            vec![key]
        } else {
            guides.chunks_exact(dim).take(MAX_GUIDES).collect()
        };
        let mut out = SearchOutput::default();
        let settings = BeamSettings::new(ef, k);
        for q in queries {
            beam_search(
                &self.graph,
                &scorer,
                q,
                &[&self.entries],
                &settings,
                scratch,
                &mut out,
            );
            searches.push(std::mem::take(&mut out.ids));
        }
        let mut merged = Vec::with_capacity(k * searches.len());
        let longest = searches.iter().map(Vec::len).max().unwrap_or(0);
        for rank in 0..longest {
            for s in &searches {
                if let Some(&c) = s.get(rank) {
                    if !merged.contains(&c) {
                        merged.push(c);
                    }
                }
            }
        }
        merged
    }

    /// Entry points: those of the build (kept: the build made every key reachable from them)
    /// plus the `recent_entries` last keys.
    fn update_recent_entries(&mut self) {
        self.entries.truncate(self.built_entries);
        let n = self.keys.len();
        for v in (n.saturating_sub(self.params.recent_entries)..n).rev() {
            if !self.entries.contains(&(v as u32)) {
                self.entries.push(v as u32);
            }
        }
    }
}

/// The out-edges `rule` keeps of `cands` (ids, best first) with the new key as the pivot: the
/// build's pruning ([`prune`]) on the candidates' rows as stored.
pub(super) fn prune_candidates(
    rule: Prune,
    key: &[f32],
    cands: &[u32],
    keys: &KeyStore,
    max_degree: usize,
) -> Vec<u32> {
    let dim = keys.dim();
    let mut rows = Vec::new();
    if rule != Prune::Top {
        rows.resize(cands.len() * dim, 0.0);
        for (&c, row) in cands.iter().zip(rows.chunks_exact_mut(dim)) {
            keys.row_into(c, row);
        }
    }
    let row = |i: u32| &rows[i as usize * dim..(i as usize + 1) * dim];
    prune(rule, key, 0..cands.len() as u32, max_degree, row)
        .into_iter()
        .map(|i| cands[i as usize])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::projection::select;
    use super::*;
    use crate::attention::AttentionParams;

    /// Inserts rewrite the inline blocks of every list they change: after 60 inserts the blocks
    /// equal those a fresh layout of the grown graph holds, and searches on them still return
    /// the exact top-k when the list takes every key.
    #[test]
    fn inserts_keep_inline_blocks_in_step_with_the_graph() {
        use crate::attention::Codes;
        use crate::graph::inline::InlineCodes;
        use crate::search::{AnnIndex, SearchParams};
        let dim = 16;
        let data = crate::synth::ood(360, 40, dim, 8);
        let keys =
            Arc::new(KeyStore::from_f32(data.keys[..300 * dim].to_vec(), dim).expect("keys"));
        let params = AttentionParams {
            kq: 20,
            max_degree: 8,
            codes: Codes::I8Inline,
            ..AttentionParams::default()
        };
        let mut index =
            AttentionIndex::build(keys, &data.train_queries, &params, &crate::knn::CpuKnn)
                .expect("build");
        let mut scratch = Scratch::new(360);
        for (i, key) in data.keys[300 * dim..].chunks_exact(dim).enumerate() {
            let guide = &data.test_queries[(i % 40) * dim..(i % 40 + 1) * dim];
            index.insert(key, guide, &mut scratch).expect("insert");
        }
        let graph = index.graph().expect("graph").into_owned();
        let fresh = InlineCodes::new(&graph, index.codes.as_ref().expect("codes"));
        assert!(index.inline.as_ref().expect("inline").same_blocks(&fresh));
        let flat = crate::flat::FlatIndex::new(index.keys().clone());
        for q in data.test_queries.chunks_exact(dim).take(5) {
            let got = index
                .search(q, 10, &SearchParams::with_ef(360), &mut scratch)
                .expect("search");
            let want = flat
                .search(q, 10, &SearchParams::default(), &mut scratch)
                .expect("flat");
            assert_eq!(got.ids, want.ids);
        }
    }

    /// Build and insertion prune through one function; the candidates reach it from a key's row
    /// of the build's f32 copy and from the stored rows respectively, which must not matter.
    #[test]
    fn build_and_insert_prune_the_same_candidates_to_the_same_edges() {
        let dim = 16;
        let data = crate::synth::ood(300, 10, dim, 3);
        let store = KeyStore::from_f16(
            data.keys.iter().map(|&x| half::f16::from_f32(x)).collect(),
            dim,
        )
        .expect("keys");
        let keys32 = store.to_f32();
        let scorer = store.scorer();
        for rule in Prune::ALL {
            for max_degree in [1, 4, 16, 64] {
                let params = AttentionParams {
                    prune: rule,
                    max_degree,
                    ..AttentionParams::default()
                };
                for v in [0u32, 17, 299] {
                    let pivot = &keys32[v as usize * dim..(v as usize + 1) * dim];
                    let mut cands: Vec<(f32, u32)> = (0..300u32)
                        .filter(|&c| c != v)
                        .map(|c| (scorer.score(pivot, c), c))
                        .collect();
                    cands.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                    cands.truncate(2 * max_degree);
                    let ids: Vec<u32> = cands.iter().map(|c| c.1).collect();
                    let at_build = select(v, ids.clone(), &params, &keys32, dim);
                    let at_insert = prune_candidates(rule, pivot, &ids, &store, max_degree);
                    assert_eq!(at_build, at_insert, "{rule} max_degree {max_degree} v {v}");
                    assert!(at_build.len() <= max_degree);
                    if rule == Prune::Top {
                        assert_eq!(at_build, ids[..max_degree.min(ids.len())]);
                    }
                }
            }
        }
    }
}
