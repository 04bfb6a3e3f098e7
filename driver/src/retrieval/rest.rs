//! The searchable "rest" of one KV head: keys that are neither attention sinks nor in the recent
//! window, under an index of any kind ([`IndexSpec`]). Ids are `position − sink`.
//!
//! Kinds that link new keys in place ([`IndexSpec::inserts`]: `attention`, query-aware
//! insertion; `flat`, an append) take the keys that leave the window directly. The others
//! (`hnsw`, `ivf`, `vamana`, `robust-vamana`, ...) are not rebuilt during decoding: their keys
//! from the prefill stay under the index and later keys go to an exact tail scan whose results
//! are merged (so a long decode drifts towards the exact scan's cost, never away from its
//! answers).

use std::sync::Arc;

use qkindex::attention::BuildStats;
use qkindex::io::AnyIndex;
use qkindex::{
    AnnIndex, AttentionIndex, Cancel, Dtype, FlatIndex, IndexSpec, KeyStore, KnnBackend, Scratch,
    SearchOutput, SearchParams,
};

/// One KV head's rest index (one per layer and KV head: the size difference of the variants
/// does not matter).
#[allow(clippy::large_enum_variant)]
pub enum RestIndex {
    Attention(AttentionIndex),
    Flat(FlatIndex),
    /// A kind without insertion: the prefill's keys under `index`, later keys in `tail`, and
    /// the two searches' results before they are merged (kept, so that a search allocates
    /// nothing once they have grown).
    Frozen {
        index: AnyIndex,
        tail: FlatIndex,
        found: SearchOutput,
        tail_found: SearchOutput,
    },
}

impl RestIndex {
    /// Builds the index `spec` names over `keys` (`n × dim` row-major, stored as `dtype`), with
    /// `train_queries` for the kinds that learn from queries and `knn` for their exact top-k.
    /// `visible`: for each training query, the keys its position could attend to (read by
    /// causal builds, [`IndexSpec::build_visible`]). Also returns the build figures of an
    /// attention graph that the spec's scan check replaced by the int8 scan
    /// ([`qkindex::spec::BuiltIndex::replaced_graph`]).
    pub fn build(
        spec: &IndexSpec,
        keys: Vec<f32>,
        dim: usize,
        train: (&[f32], Option<&[u32]>),
        dtype: Dtype,
        knn: &dyn KnnBackend,
    ) -> qkindex::Result<(Self, Option<BuildStats>)> {
        let store = Arc::new(KeyStore::from_f32_as(keys, dim, dtype)?);
        let (queries, visible) = train;
        let built = spec.build_visible(store, queries, visible, knn, &Cancel::new())?;
        let rest = match built.index {
            AnyIndex::Attention(a) => RestIndex::Attention(a),
            AnyIndex::Flat(f) => RestIndex::Flat(f),
            index => RestIndex::Frozen {
                index,
                tail: FlatIndex::new(Arc::new(KeyStore::empty(dtype, dim)?)),
                found: SearchOutput::default(),
                tail_found: SearchOutput::default(),
            },
        };
        Ok((rest, built.replaced_graph))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        match self {
            RestIndex::Attention(a) => a.len(),
            RestIndex::Flat(f) => f.len(),
            RestIndex::Frozen { index, tail, .. } => index.len() + tail.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the key of the next position; `guides` are queries that attended to it.
    pub fn insert(
        &mut self,
        key: &[f32],
        guides: &[f32],
        scratch: &mut Scratch,
    ) -> qkindex::Result<()> {
        match self {
            RestIndex::Attention(a) => a.insert(key, guides, scratch).map(drop),
            RestIndex::Flat(f) => f.insert(key).map(drop),
            RestIndex::Frozen { tail, .. } => tail.insert(key).map(drop),
        }
    }

    /// The `k` best keys for `query` (fewer when the index holds fewer), best first. Allocates
    /// nothing once `scratch`, `out` and the index's own buffers have grown.
    pub fn search(
        &mut self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> qkindex::Result<()> {
        self.search_seeded(query, k, params, &[], scratch, out)
    }

    /// [`RestIndex::search`] that also starts graph searches from `seeds` (rest ids; see
    /// [`AnnIndex::search_seeded`]).
    pub fn search_seeded(
        &mut self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> qkindex::Result<()> {
        let k = k.min(self.len());
        out.clear();
        if k == 0 {
            return Ok(());
        }
        match self {
            RestIndex::Attention(a) => a.search_seeded(query, k, params, seeds, scratch, out),
            RestIndex::Flat(f) => f.search_seeded(query, k, params, seeds, scratch, out),
            RestIndex::Frozen {
                index,
                tail,
                found,
                tail_found,
            } => {
                let base = index.len();
                if tail.is_empty() {
                    return index.search_seeded(query, k.min(base), params, seeds, scratch, out);
                }
                index.search_seeded(query, k.min(base), params, seeds, scratch, found)?;
                tail.search_into(query, k.min(tail.len()), params, scratch, tail_found)?;
                merge(found, tail_found, base as u32, k, out);
                Ok(())
            }
        }
    }

    /// Bytes held: `(structure, keys)`, the index's own structure (graph, lists, codes) and
    /// the keys it holds a copy of.
    pub fn memory(&self) -> (usize, usize) {
        match self {
            RestIndex::Attention(a) => (a.memory_bytes(), a.keys().bytes()),
            RestIndex::Flat(f) => (f.memory_bytes(), f.keys().bytes()),
            RestIndex::Frozen { index, tail, .. } => (
                index.memory_bytes() + tail.memory_bytes(),
                index.key_store().bytes() + tail.keys().bytes(),
            ),
        }
    }

    /// The keys of the kinds that serve ids `0..len()` exactly as they are.
    pub fn keys(&self) -> Option<&KeyStore> {
        match self {
            RestIndex::Attention(a) => Some(a.keys()),
            RestIndex::Flat(f) => Some(f.keys()),
            RestIndex::Frozen { .. } => None,
        }
    }

    /// The index that serves ids `0..len()` exactly as they are, for selectors that take
    /// `&dyn AnnIndex` (None for the frozen kinds, whose ids are split).
    pub fn as_ann(&self) -> Option<&dyn AnnIndex> {
        match self {
            RestIndex::Attention(a) => Some(a),
            RestIndex::Flat(f) => Some(f),
            RestIndex::Frozen { .. } => None,
        }
    }
}

impl std::fmt::Debug for RestIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            RestIndex::Attention(_) => "attention".to_string(),
            RestIndex::Flat(_) => "flat".to_string(),
            RestIndex::Frozen { index, tail, .. } => {
                format!("{} + tail of {}", index.kind().name(), tail.len())
            }
        };
        f.debug_struct("RestIndex")
            .field("kind", &kind)
            .field("len", &self.len())
            .finish()
    }
}

/// The best `k` of two result lists (each best first) into `out`, the ids of `tail` shifted by
/// `base`: on equal scores the first list's items come first, as a stable sort of both would
/// order them.
fn merge(first: &SearchOutput, tail: &SearchOutput, base: u32, k: usize, out: &mut SearchOutput) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    while out.ids.len() < k {
        let take_first = match (first.scores.get(i), tail.scores.get(j)) {
            (Some(a), Some(b)) => a.total_cmp(b).is_ge(),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if take_first {
            out.ids.push(first.ids[i]);
            out.scores.push(first.scores[i]);
            i += 1;
        } else {
            out.ids.push(tail.ids[j] + base);
            out.scores.push(tail.scores[j]);
            j += 1;
        }
    }
    out.stats = first.stats;
    out.stats += tail.stats;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(ids: &[u32], scores: &[f32], dc: u64) -> SearchOutput {
        SearchOutput {
            ids: ids.to_vec(),
            scores: scores.to_vec(),
            stats: qkindex::SearchStats {
                distance_computations: dc,
                hops: 1,
                ..Default::default()
            },
        }
    }

    #[test]
    fn merge_keeps_the_order_of_a_stable_sort() {
        let first = output(&[4, 1, 7], &[3.0, 2.0, 2.0], 10);
        let tail = output(&[0, 2], &[2.0, 1.0], 5);
        let mut out = SearchOutput::default();
        for k in 0..=6 {
            merge(&first, &tail, 100, k, &mut out);
            // What the frozen kinds did before: both lists concatenated, sorted (stable) by
            // descending score, truncated to k.
            let mut all: Vec<(f32, u32)> =
                [(3.0, 4), (2.0, 1), (2.0, 7), (2.0, 100), (1.0, 102)].to_vec();
            all.sort_by(|a, b| b.0.total_cmp(&a.0));
            all.truncate(k);
            assert_eq!(
                out.ids,
                all.iter().map(|x| x.1).collect::<Vec<_>>(),
                "k = {k}"
            );
            assert_eq!(out.scores, all.iter().map(|x| x.0).collect::<Vec<_>>());
            assert_eq!(out.stats.distance_computations, 15);
            assert_eq!(out.stats.hops, 2);
        }
    }
}
