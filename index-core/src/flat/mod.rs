//! `FlatIndex`: the exact scan. Every search scores every key (`scanned = 1`) and keeps the
//! top k with a bounded heap; it is the yardstick for recall and speed. With `codes=i8`
//! ([`FlatParams`]) it scans int8 codes instead and scores only the best candidates exactly
//! ([`ScanCodes`], in `codes/scan.rs`: the graph routes query heads to it too).

mod file;

pub use crate::codes::ScanCodes;

use crate::codes::Codes;
use crate::error::{Error, Result};
use crate::scratch::Scratch;
use crate::search::{
    check_query, check_rows, search_each_row, AnnIndex, IndexKind, SearchOutput, SearchParams,
};
use crate::store::KeyStore;
use std::sync::Arc;

/// Build parameters of [`FlatIndex`]: the exact scan (the default), or the scan on codes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlatParams {
    /// Scan int8 (`i8`) or 4-bit (`i4`) codes and re-rank the best candidates on the stored
    /// keys, or scan the stored keys (`none`). `i8-inline` has no meaning here (no adjacency).
    #[serde(default, skip_serializing_if = "Codes::is_none")]
    pub codes: Codes,
    /// Candidates re-ranked after a scan on codes when a search does not set `ef` (at least
    /// `k`; 0: `k + k / 4`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rerank: usize,
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

impl FlatParams {
    /// Errors: `codes=i8-inline`, or `rerank` without codes ([`Error::InvalidParam`]).
    pub fn validate(&self) -> Result<()> {
        if self.codes == Codes::I8Inline {
            return Err(Error::invalid_param(
                "codes",
                self.codes.name(),
                "a flat index has no adjacency: expected none, i8 or i4",
            ));
        }
        if self.rerank > 0 && self.codes == Codes::None {
            return Err(Error::invalid_param(
                "rerank",
                self.rerank,
                "applies to codes=i8 only",
            ));
        }
        Ok(())
    }
}

/// Keys scored per kernel call (bounded scratch, cache-friendly).
const CHUNK: usize = 512;

/// Exact top-k by scanning all keys.
#[derive(Clone, Debug)]
pub struct FlatIndex {
    keys: Arc<KeyStore>,
    params: FlatParams,
    codes: Option<ScanCodes>,
}

impl FlatIndex {
    /// The exact scan over shared keys.
    pub fn new(keys: Arc<KeyStore>) -> Self {
        FlatIndex {
            keys,
            params: FlatParams::default(),
            codes: None,
        }
    }

    /// A flat index over shared keys with `params` (codes are computed here).
    ///
    /// Errors: invalid params ([`FlatParams::validate`]).
    pub fn with_params(keys: Arc<KeyStore>, params: &FlatParams) -> Result<Self> {
        params.validate()?;
        let codes = params.codes.scan_width().map(|w| ScanCodes::new(&keys, w));
        Ok(FlatIndex {
            keys,
            params: *params,
            codes,
        })
    }

    /// Candidates a scan on codes re-ranks for a search of `k` with `params`: `ef` when set,
    /// else the build's `rerank`, else `k + k / 4` (at least `k`).
    fn candidates(&self, k: usize, params: &SearchParams) -> usize {
        let default = if self.params.rerank == 0 {
            k + k / 4
        } else {
            self.params.rerank
        };
        params.ef.unwrap_or(default).max(k)
    }

    /// Build parameters.
    pub fn params(&self) -> &FlatParams {
        &self.params
    }

    /// The indexed keys.
    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.keys
    }

    /// Appends a key (its id is the previous length); the store is copied first when other
    /// handles share it (copy-on-write). Errors: wrong dimension, non-finite values.
    pub fn insert(&mut self, key: &[f32]) -> Result<u32> {
        let id = Arc::make_mut(&mut self.keys).push(key)?;
        if let Some(codes) = &mut self.codes {
            codes.push(key)?;
        }
        Ok(id)
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
        self.codes.as_ref().map_or(0, ScanCodes::bytes)
    }

    fn batches(&self) -> bool {
        self.codes.as_ref().is_some_and(ScanCodes::batches)
    }

    fn search_rows<'s>(
        &self,
        queries: &[f32],
        k: usize,
        params: &dyn Fn(usize) -> SearchParams,
        seeds: &dyn Fn(usize) -> &'s [u32],
        scratch: &mut Scratch,
        outs: &mut [SearchOutput],
    ) -> Result<()> {
        let Some(codes) = self.codes.as_ref().filter(|c| c.batches()) else {
            return search_each_row(self, queries, k, params, seeds, scratch, outs);
        };
        let (n, dim) = (self.keys.len(), self.keys.dim());
        check_rows(queries, dim, outs.len())?;
        for query in queries.chunks_exact(dim) {
            check_query(query, dim, k, n)?;
        }
        let candidates = |r: usize| self.candidates(k, &params(r));
        codes.search_rows(&self.keys.scorer(), queries, k, &candidates, scratch, outs);
        Ok(())
    }

    fn search_seeded(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        _seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<()> {
        let n = self.keys.len();
        check_query(query, self.keys.dim(), k, n)?;
        if let Some(codes) = &self.codes {
            let candidates = self.candidates(k, params);
            codes.search(&self.keys.scorer(), query, k, candidates, scratch, out);
            return Ok(());
        }
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
