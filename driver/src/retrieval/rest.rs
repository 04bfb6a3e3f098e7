//! The searchable "rest" of one KV head: keys that are neither attention sinks nor in the recent
//! window, under an index of any kind. Ids are `position − sink`.
//!
//! Kinds that link new keys in place (`attention`: query-aware insertion; `flat`: an append) take
//! the keys that leave the window directly. The others (`hnsw`, `ivf`, `vamana`,
//! `robust-vamana`) are not rebuilt during decoding: their keys from the prefill stay under the
//! index and later keys go to an exact tail scan whose results are merged (so a long decode
//! drifts towards the exact scan's cost, never away from its answers).

use std::sync::Arc;

use half::f16;

use qkindex::{
    AnnIndex, AttentionIndex, AttentionParams, Dtype, FlatIndex, HnswIndex, HnswParams, IvfIndex,
    IvfParams, KeyStore, KnnBackend, Scratch, SearchOutput, SearchParams, VamanaIndex,
    VamanaParams,
};

/// Index kinds that a retrieval policy can search.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestKind {
    Attention,
    Flat,
    Hnsw,
    Ivf,
    Vamana,
    RobustVamana,
}

impl RestKind {
    /// True for kinds that take new keys in place.
    pub fn inserts(self) -> bool {
        matches!(self, RestKind::Attention | RestKind::Flat)
    }
}

/// One KV head's rest index (one per layer and KV head: the size difference of the variants
/// does not matter).
#[allow(clippy::large_enum_variant)]
pub enum RestIndex {
    Attention(AttentionIndex),
    Flat(FlatIndex),
    /// A kind without insertion: the prefill's keys under `index`, later keys in `tail`.
    Frozen {
        index: Box<dyn AnnIndex>,
        tail: FlatIndex,
    },
}

impl RestIndex {
    /// Builds an index of `kind` over `keys` (`n × dim` row-major), with `train_queries` for the
    /// kinds that learn from queries (`attention`: the AttentionIndex's build parameters), the
    /// exact kNN of builds on `knn`.
    pub fn build(
        kind: RestKind,
        keys: Vec<f32>,
        dim: usize,
        train_queries: &[f32],
        dtype: Dtype,
        attention: &AttentionParams,
        knn: &dyn KnnBackend,
    ) -> qkindex::Result<Self> {
        let store = Arc::new(match dtype {
            Dtype::F32 => KeyStore::from_f32(keys, dim)?,
            Dtype::F16 => {
                KeyStore::from_f16(keys.iter().map(|&x| f16::from_f32(x)).collect(), dim)?
            }
        });
        let frozen = |index: Box<dyn AnnIndex>| -> qkindex::Result<RestIndex> {
            let empty = KeyStore::empty(dtype, dim)?;
            Ok(RestIndex::Frozen {
                index,
                tail: FlatIndex::new(Arc::new(empty)),
            })
        };
        match kind {
            RestKind::Attention => Ok(RestIndex::Attention(AttentionIndex::build(
                store,
                train_queries,
                attention,
                knn,
            )?)),
            RestKind::Flat => Ok(RestIndex::Flat(FlatIndex::new(store))),
            RestKind::Hnsw => frozen(Box::new(HnswIndex::build(store, &HnswParams::default())?)),
            RestKind::Ivf => frozen(Box::new(IvfIndex::build(&store, &IvfParams::default())?)),
            RestKind::Vamana | RestKind::RobustVamana => {
                let robust = kind == RestKind::RobustVamana;
                let params = VamanaParams {
                    robust,
                    ..VamanaParams::default()
                };
                let train = robust.then_some(train_queries);
                frozen(Box::new(VamanaIndex::build(store, train, &params, knn)?))
            }
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        match self {
            RestIndex::Attention(a) => a.len(),
            RestIndex::Flat(f) => f.len(),
            RestIndex::Frozen { index, tail } => index.len() + tail.len(),
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

    /// The `k` best keys for `query` (fewer when the index holds fewer), best first.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> qkindex::Result<()> {
        let k = k.min(self.len());
        out.clear();
        if k == 0 {
            return Ok(());
        }
        match self {
            RestIndex::Attention(a) => a.search_into(query, k, params, scratch, out),
            RestIndex::Flat(f) => f.search_into(query, k, params, scratch, out),
            RestIndex::Frozen { index, tail } => {
                let base = index.len();
                index.search_into(query, k.min(base), params, scratch, out)?;
                if tail.is_empty() {
                    return Ok(());
                }
                let t = tail.search(query, k.min(tail.len()), params, scratch)?;
                let mut merged: Vec<(f32, u32)> = out
                    .scores
                    .iter()
                    .copied()
                    .zip(out.ids.iter().copied())
                    .chain(
                        t.scores
                            .iter()
                            .copied()
                            .zip(t.ids.iter().map(|&i| i + base as u32)),
                    )
                    .collect();
                merged.sort_by(|a, b| b.0.total_cmp(&a.0));
                merged.truncate(k);
                out.ids = merged.iter().map(|m| m.1).collect();
                out.scores = merged.iter().map(|m| m.0).collect();
                out.stats += t.stats;
                Ok(())
            }
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
            RestIndex::Frozen { index, tail } => {
                format!("{} + tail of {}", index.kind().name(), tail.len())
            }
        };
        f.debug_struct("RestIndex")
            .field("kind", &kind)
            .field("len", &self.len())
            .finish()
    }
}
