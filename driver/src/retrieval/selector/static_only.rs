//! `static`: the static set only (StreamingLLM); nothing is selected from the rest.

use super::{Selection, Selector};
use qkindex_model::ModelError;

/// Selects nothing and keeps no keys.
#[derive(Debug)]
pub struct StaticOnly;

impl Selector for StaticOnly {
    fn upkeep(&mut self, _key: &[f32], _guide: &[f32]) -> Result<(), ModelError> {
        Ok(())
    }

    fn select(&mut self, _j: usize, _query: &[f32], out: &mut Selection) -> Result<(), ModelError> {
        out.clear();
        Ok(())
    }
}
