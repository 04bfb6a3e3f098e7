//! `exact-topk`: the exact top-k of the rest by a scan of its keys in f32 (the reference the
//! other selectors are measured against).

use std::sync::Arc;

use qkindex::{AnnIndex, FlatIndex, KeyStore, Scratch, SearchOutput, SearchParams};

use super::{HeadPrefill, Selection, Selector};
use qkindex_model::ModelError;

/// A scan over the rest's keys; keys leaving the window are appended.
#[derive(Debug)]
pub struct Scan {
    keys: FlatIndex,
    k: usize,
    scratch: Scratch,
    found: SearchOutput,
}

impl Scan {
    pub fn build(prefill: &HeadPrefill<'_>) -> Result<Self, ModelError> {
        let store = KeyStore::from_f32(prefill.rest_keys().to_vec(), prefill.head_dim)?;
        let keys = FlatIndex::new(Arc::new(store));
        Ok(Scan {
            scratch: Scratch::new(keys.len()),
            keys,
            k: prefill.cfg.k,
            found: SearchOutput::default(),
        })
    }
}

impl Selector for Scan {
    fn n_keys(&self) -> usize {
        self.keys.len()
    }

    fn upkeep(&mut self, key: &[f32], _guide: &[f32]) -> Result<(), ModelError> {
        self.keys.insert(key)?;
        Ok(())
    }

    fn select(&mut self, _j: usize, query: &[f32], out: &mut Selection) -> Result<(), ModelError> {
        // A scan takes no search parameters.
        let k = self.k.min(self.keys.len());
        let params = SearchParams::default();
        self.keys
            .search_into(query, k, &params, &mut self.scratch, &mut self.found)?;
        out.fill(&self.found.ids, self.found.stats.distance_computations);
        Ok(())
    }
}
