//! The seam through which a decode step picks the keys of the rest (keys that are neither
//! sinks nor in the recent window) to attend for one query head.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the [`Selector`] trait, [`Selection`], the prefill a selector builds from ([`HeadPrefill`]), the policy → selector factory ([`build`]) |
//! | `static_only.rs` | `static`: selects nothing |
//! | `scan.rs` | `exact-topk`: the exact top-k by a scan of the rest (f32) |
//! | `index.rs` | `index-topk`: the top-k a [`RestIndex`] returns (any kind), seeded by the previous step's keys on request |
//! | `retopk.rs` | `retopk`: ReTopK per query head, its index as the exact path |
//! | `quest.rs` | `quest`: Quest's pages of 16 keys, ranked by a min/max bound on q·k |
//! | `infllm.rs` | `infllm`: InfLLM's blocks of 128 keys, ranked by 4 representative keys each |
//! | `snapkv.rs` | `snapkv`: SnapKV's per-head set voted by the last 32 prompt queries, fixed |
//!
//! One selector serves one (layer, KV head): the query heads of its GQA group share what it
//! built (an index over the head's rest, trained on all their prefill queries) and select one
//! at a time ([`Selector::select`] takes the query head's index in the group). Its life:
//!
//! ```text
//!  end of prefill ── build(&HeadPrefill) ──► Box<dyn Selector>     (prefill keys, the group's
//!                                                                    queries, the kNN backend)
//!  each decode step, per layer:
//!    keys leaving the window ── upkeep(key, guide) ──► selector     (one call per key, in order)
//!    per query head j ────────── select(j, query) ──► Selection     (rest ids, inner products;
//!                                                                    select_group: all at once)
//!    after the layer ─────────── fold_stats ────────► RetrievalStats (selector-specific counters)
//! ```
//!
//! Adding a selector is one file here and one arm in [`build`].

mod index;
mod infllm;
mod quest;
mod retopk;
mod scan;
mod snapkv;
mod static_only;

pub use index::{build_tally, BuildTally};

use std::cell::OnceCell;

use qkindex::scratch::TopK;
use qkindex::{KnnBackend, SearchStats};

use super::ids::{RestId, Split};
use super::policy::{PolicyConfig, PolicyKind};
use super::rest::RestIndex;
use super::shape::Shape;
use super::stats::RetrievalStats;
use qkindex_model::ModelError;

/// Picks keys of one (layer, KV head)'s rest for the query heads of its group.
pub trait Selector: Send + std::fmt::Debug {
    /// Keys under the selector (rest ids `0..n_keys()`; 0 for selectors that keep none).
    /// Default: the keys of [`Selector::index`], 0 without one.
    fn n_keys(&self) -> usize {
        self.index().map_or(0, RestIndex::len)
    }

    /// True when [`Selector::upkeep`] wants each key's guide (the query-aware insertion of
    /// `qkindex::AttentionIndex::insert`); the step then tracks them. Default: when
    /// [`Selector::index`] is an attention index.
    fn wants_guides(&self) -> bool {
        matches!(self.index(), Some(RestIndex::Attention(_)))
    }

    /// Takes the key (`head_dim` values) that just left the window: the next rest id. `guide`
    /// is the query of the group that scored it highest while it was in the window (empty
    /// unless [`Selector::wants_guides`]).
    fn upkeep(&mut self, key: &[f32], guide: &[f32]) -> Result<(), ModelError>;

    /// Selects keys of the rest for query head `j` of the group (`query`: `head_dim` values)
    /// into `out`, best first: at most the policy's `k` for the top-k selectors; the others
    /// (pages, blocks, fixed sets) document how `k` maps to what they return. The step calls
    /// it once per query head per step, `j` in order.
    fn select(&mut self, j: usize, query: &[f32], out: &mut Selection) -> Result<(), ModelError>;

    /// Selects for every query head of the group at once: `queries` holds one query per
    /// element of `outs` (`outs.len() × head_dim`, row-major; query head `j` in row `j`), and
    /// `outs[j]` gets query head `j`'s selection, as [`Selector::select`] would give it. The
    /// step calls this once per step. Default: `select` for each `j` in order; `index-topk`
    /// searches the group's queries in parallel ([`qkindex::search_many`]).
    fn select_group(&mut self, queries: &[f32], outs: &mut [Selection]) -> Result<(), ModelError> {
        let hd = queries.len() / outs.len().max(1);
        for (j, (query, out)) in queries.chunks_exact(hd.max(1)).zip(outs).enumerate() {
            self.select(j, query, out)?;
        }
        Ok(())
    }

    /// Moves the counters of the selections since the last call into `stats` (after each
    /// layer step).
    fn fold_stats(&mut self, _stats: &mut RetrievalStats) {}

    /// The index under the selector, for probes that search it again.
    fn index(&self) -> Option<&RestIndex> {
        None
    }
}

/// What one [`Selector::select`] returned.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Keys to attend, best first.
    pub ids: Vec<RestId>,
    /// Inner products of any kind the selection computed (keys, cached queries, bounds...).
    pub distance_computations: u64,
    /// Set when the selection was a graph search started from recalled seeds (ReTopK's exact
    /// path into an AttentionIndex): that search's statistics, for the probes that search
    /// again without the seeds.
    pub seeded: Option<SearchStats>,
}

impl Selection {
    /// Clears the selection (no keys, no cost).
    pub fn clear(&mut self) {
        self.ids.clear();
        self.distance_computations = 0;
        self.seeded = None;
    }

    /// The selection of index ids `ids` (rest ids as they are) at a cost of
    /// `distance_computations`.
    pub fn fill(&mut self, ids: &[u32], distance_computations: u64) {
        self.clear();
        self.ids.extend(ids.iter().map(|&id| RestId(id)));
        self.distance_computations = distance_computations;
    }
}

/// What a selector of one (layer, KV head) builds from at the end of the prefill.
pub struct HeadPrefill<'a> {
    pub cfg: &'a PolicyConfig,
    pub layer: usize,
    /// The KV head.
    pub kv_head: usize,
    pub head_dim: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// The split at the end of the prefill (`split.n` positions).
    pub split: Split,
    /// The prefill's keys of this KV head: `split.n × head_dim`, row-major.
    pub keys: &'a [f32],
    /// The exact kNN of index builds.
    pub knn: &'a dyn KnnBackend,
    /// Query values per position (`n_heads · head_dim`).
    width: usize,
    /// The layer's prefill queries (row-major `n × width`), if captured.
    layer_queries: Option<&'a [f32]>,
    group_queries: OnceCell<Vec<f32>>,
}

impl<'a> HeadPrefill<'a> {
    /// The prefill of `(layer, kv_head)` in a model of `shape`: `keys` holds its `split.n`
    /// keys, `layer_queries` the layer's queries (row-major `split.n × (n_heads · head_dim)`;
    /// None or any size for policies without an index).
    pub fn new(
        cfg: &'a PolicyConfig,
        shape: Shape,
        (layer, kv_head): (usize, usize),
        split: Split,
        keys: &'a [f32],
        layer_queries: Option<&'a [f32]>,
        knn: &'a dyn KnnBackend,
    ) -> Self {
        HeadPrefill {
            cfg,
            layer,
            kv_head,
            head_dim: shape.head_dim,
            group: shape.n_heads / shape.n_kv_heads,
            split,
            keys,
            knn,
            width: shape.n_heads * shape.head_dim,
            layer_queries,
            group_queries: OnceCell::new(),
        }
    }

    /// The rest's keys: `split.rest_len() × head_dim`, row-major.
    pub fn rest_keys(&self) -> &'a [f32] {
        let hd = self.head_dim;
        &self.keys[self.split.sink * hd..self.split.end * hd]
    }

    /// For each row of [`HeadPrefill::queries`], the rest keys its position could attend to:
    /// rest id `i` is position `sink + i`, so the query at position `t` sees
    /// `min(t + 1 − sink, rest)` of them (0 for the sinks' own queries).
    pub fn visible(&self) -> Vec<u32> {
        let Split { sink, end, n } = self.split;
        let rest = end - sink;
        let one: Vec<u32> = (0..n)
            .map(|t| (t + 1).saturating_sub(sink).min(rest) as u32)
            .collect();
        one.repeat(self.group)
    }

    /// The prefill queries of the group's query heads: `group × n × head_dim`, query head
    /// `j`'s `n` rows at `j · n · head_dim` (an error when the layer's were not captured or
    /// have the wrong size).
    pub fn queries(&self) -> Result<&[f32], ModelError> {
        if let Some(q) = self.group_queries.get() {
            return Ok(q);
        }
        let (n, hd, width) = (self.split.n, self.head_dim, self.width);
        let q = self
            .layer_queries
            .filter(|q| q.len() == n * width)
            .ok_or_else(|| {
                qkindex::Error::invalid_param(
                    "prefill queries",
                    self.layer,
                    "missing or of the wrong size for this layer",
                )
            })?;
        let mut gathered = Vec::with_capacity(self.group * n * hd);
        for j in 0..self.group {
            let h = self.kv_head * self.group + j;
            for p in 0..n {
                gathered.extend_from_slice(&q[p * width + h * hd..][..hd]);
            }
        }
        Ok(self.group_queries.get_or_init(|| gathered))
    }

    /// Query head `j`'s prefill query at position `p` (`head_dim` values), from
    /// [`HeadPrefill::queries`].
    pub fn query(&self, j: usize, p: usize) -> Result<&[f32], ModelError> {
        let (n, hd) = (self.split.n, self.head_dim);
        Ok(&self.queries()?[(j * n + p) * hd..][..hd])
    }
}

impl std::fmt::Debug for HeadPrefill<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadPrefill")
            .field("layer", &self.layer)
            .field("kv_head", &self.kv_head)
            .field("split", &self.split)
            .field("knn", &self.knn.name())
            .finish_non_exhaustive()
    }
}

/// The selector of `prefill.cfg`'s policy for one (layer, KV head).
pub fn build(prefill: &HeadPrefill<'_>) -> Result<Box<dyn Selector>, ModelError> {
    Ok(match prefill.cfg.kind {
        PolicyKind::Full | PolicyKind::Static => Box::new(static_only::StaticOnly),
        PolicyKind::ExactTopk => Box::new(scan::Scan::build(prefill)?),
        PolicyKind::IndexTopk => Box::new(index::Index::build(prefill, &prefill.cfg.index)?),
        PolicyKind::Retopk => Box::new(retopk::ReTopKSelector::build(prefill)?),
        PolicyKind::Quest => Box::new(quest::Quest::build(prefill)?),
        PolicyKind::Infllm => Box::new(infllm::InfLlm::build(prefill)?),
        PolicyKind::Snapkv => Box::new(snapkv::SnapKv::build(prefill)?),
    })
}

/// The ids of the largest of a list of scores (id = index), for the selectors that rank
/// pages, blocks or keys by a score of their own (allocations kept between calls).
#[derive(Clone, Debug, Default)]
pub(super) struct TopN {
    top: TopK,
    scores: Vec<f32>,
}

impl TopN {
    /// The ids of the `n` largest `scores` (all of them when fewer), best first, into `ids`
    /// (cleared first); ties go to the smaller id, NaN scores are never taken.
    pub fn ids_of(&mut self, scores: &[f32], n: usize, ids: &mut Vec<u32>) {
        ids.clear();
        self.scores.clear();
        self.top.reset(n.min(scores.len()));
        self.top.push_block(scores, 0);
        self.top.drain_sorted(ids, &mut self.scores);
    }
}

/// `key` when it holds `hd` values (a key given to [`Selector::upkeep`]), else a typed error.
fn check_key(key: &[f32], hd: usize) -> Result<(), ModelError> {
    if key.len() != hd {
        return Err(qkindex::Error::invalid_param("key", key.len(), "not head_dim values").into());
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod testing {
    //! Synthetic prefills for the selectors' unit tests.

    use qkindex::synth::Rng;

    use super::HeadPrefill;
    use crate::retrieval::ids::Split;
    use crate::retrieval::policy::{PolicyConfig, PolicyKind};
    use crate::retrieval::shape::Shape;

    /// `kind` with 4 sinks, a `window` and `k` (the selector tests' small splits).
    pub fn small_cfg(kind: PolicyKind, k: usize, window: usize) -> PolicyConfig {
        PolicyConfig {
            sink: 4,
            window,
            k,
            ..PolicyConfig::new(kind)
        }
    }

    /// Keys and queries of a synthetic prefill of one KV head (the model has one KV head of
    /// `group` query heads).
    pub struct Synth {
        pub cfg: PolicyConfig,
        pub shape: Shape,
        pub split: Split,
        pub keys: Vec<f32>,
        /// Row-major `n × (group · head_dim)`.
        pub queries: Vec<f32>,
    }

    impl Synth {
        /// `n` positions of normal keys and queries (seeded by `seed`) under `cfg`'s split.
        pub fn new(cfg: PolicyConfig, n: usize, head_dim: usize, group: usize, seed: u64) -> Self {
            let mut rng = Rng::new(seed);
            let keys = (0..n * head_dim).map(|_| rng.normal()).collect();
            let queries = (0..n * group * head_dim).map(|_| rng.normal()).collect();
            Synth {
                split: Split::at(n, cfg.sink, cfg.window),
                cfg,
                shape: Shape {
                    n_layers: 1,
                    n_heads: group,
                    n_kv_heads: 1,
                    head_dim,
                },
                keys,
                queries,
            }
        }

        /// The key at position `p`.
        pub fn key_mut(&mut self, p: usize) -> &mut [f32] {
            let hd = self.shape.head_dim;
            &mut self.keys[p * hd..(p + 1) * hd]
        }

        /// Query head `j`'s query at position `p`.
        pub fn query_mut(&mut self, j: usize, p: usize) -> &mut [f32] {
            let (hd, g) = (self.shape.head_dim, self.shape.n_heads);
            &mut self.queries[(p * g + j) * hd..][..hd]
        }

        pub fn prefill(&self) -> HeadPrefill<'_> {
            HeadPrefill::new(
                &self.cfg,
                self.shape,
                (0, 0),
                self.split,
                &self.keys,
                Some(&self.queries),
                &qkindex::CpuKnn,
            )
        }
    }

    /// Asserts that `ids` are distinct rest ids below `n_keys`.
    pub fn assert_valid(ids: &[crate::retrieval::ids::RestId], n_keys: usize) {
        let mut seen = std::collections::HashSet::new();
        for id in ids {
            assert!((id.0 as usize) < n_keys, "id {} of {n_keys} keys", id.0);
            assert!(seen.insert(id.0), "id {} twice", id.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{small_cfg, Synth};
    use super::PolicyKind;

    /// Rest id `i` is position `sink + i`: the query at position `t` sees `t + 1 − sink` rest
    /// keys (none for the sinks' own queries, all of them from the window on), alike for every
    /// query head of the group; a causal, thinned build reads them.
    #[test]
    fn visible_counts_follow_positions_and_train_causal_builds() {
        let mut cfg = small_cfg(PolicyKind::IndexTopk, 8, 8);
        cfg.index = "attention:causal=true,queries-per-key=1,kq=8"
            .parse()
            .expect("spec");
        let (n, group) = (40, 3);
        let s = Synth::new(cfg, n, 16, group, 7);
        let prefill = s.prefill();
        let rest = s.split.end - s.split.sink;
        assert_eq!((s.split.sink, rest), (4, 28));
        let visible = prefill.visible();
        assert_eq!(visible.len(), group * n);
        let want: Vec<u32> = (0..n)
            .map(|t| (t + 1).saturating_sub(4).min(rest) as u32)
            .collect();
        for j in 0..group {
            assert_eq!(visible[j * n..(j + 1) * n], want[..], "query head {j}");
        }
        assert_eq!((want[3], want[4], want[31], want[39]), (0, 1, 28, 28));
        let built = super::index::build_rest(&prefill, &prefill.cfg.index).expect("causal build");
        assert_eq!(built.len(), rest);
    }
}
