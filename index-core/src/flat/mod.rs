//! `FlatIndex`: the exact scan. Every search scores every key (`scanned = 1`) and keeps the
//! top k with a bounded heap; it is the yardstick for recall and speed.

use crate::error::Result;
use crate::scratch::Scratch;
use crate::search::{check_query, AnnIndex, IndexKind, SearchOutput, SearchParams};
use crate::store::KeyStore;
use std::sync::Arc;

/// Keys scored per kernel call (bounded scratch, cache-friendly).
const CHUNK: usize = 512;

/// Exact top-k by scanning all keys.
#[derive(Clone, Debug)]
pub struct FlatIndex {
    keys: Arc<KeyStore>,
}

impl FlatIndex {
    /// A flat index over shared keys.
    pub fn new(keys: Arc<KeyStore>) -> Self {
        FlatIndex { keys }
    }

    /// The indexed keys.
    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.keys
    }

    /// Appends a key (its id is the previous length); the store is copied first when other
    /// handles share it (copy-on-write). Errors: wrong dimension, non-finite values.
    pub fn insert(&mut self, key: &[f32]) -> Result<u32> {
        Arc::make_mut(&mut self.keys).push(key)
    }
}

impl AnnIndex for FlatIndex {
    fn kind(&self) -> IndexKind {
        IndexKind::Flat
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    fn dim(&self) -> usize {
        self.keys.dim()
    }

    fn memory_bytes(&self) -> usize {
        0
    }

    fn search_seeded(
        &self,
        query: &[f32],
        k: usize,
        _params: &SearchParams,
        _seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<()> {
        let n = self.keys.len();
        check_query(query, self.keys.dim(), k, n)?;
        out.clear();
        let keys = self.keys.scorer();
        let scorer = keys.bind(query, &mut scratch.query);
        let best = &mut scratch.best;
        best.reset(k);
        scratch.scores.resize(CHUNK, 0.0);
        let mut start = 0;
        while start < n {
            let len = CHUNK.min(n - start);
            let chunk = &mut scratch.scores[..len];
            scorer.score_range(start, chunk);
            best.push_block(chunk, start as u32);
            start += len;
        }
        best.drain_sorted(&mut out.ids, &mut out.scores);
        out.stats.distance_computations = n as u64;
        Ok(())
    }
}
