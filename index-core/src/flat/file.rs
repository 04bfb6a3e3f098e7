//! The file sections of [`FlatIndex`] (docs/FORMAT.md, "flat"): the keys and PARAMS (the
//! codes of `codes=i8`/`i4` are derived from the keys on load, never stored).

use super::{FlatIndex, FlatParams};
use crate::error::Result;
use crate::file::format::SectionKind;
use crate::file::persist::{index_keys, save_inline};
use crate::file::persist::{Decode, KeyResolver, Persist};
use crate::file::reader::RawFile;
use crate::file::sections::{json_bytes, params_json};
use crate::store::KeyStore;
use std::path::Path;
use std::sync::Arc;

impl Persist for FlatIndex {
    fn key_store(&self) -> &Arc<KeyStore> {
        self.keys()
    }
    /// `{"index": "flat"}` for the exact scan (as every file before the scan on codes), with
    /// `params` otherwise.
    fn params_section(&self) -> Result<Vec<u8>> {
        if *self.params() == FlatParams::default() {
            json_bytes(&serde_json::json!({"index": "flat"}))
        } else {
            params_json("flat", self.params(), None)
        }
    }
}

/// The PARAMS of a flat file (`params` absent: the exact scan).
#[derive(serde::Deserialize)]
struct FlatSection {
    #[serde(default)]
    params: FlatParams,
}

impl Decode for FlatIndex {
    fn decode(raw: &RawFile, resolve: &mut KeyResolver<'_>) -> Result<Self> {
        let keys = index_keys(raw, resolve)?;
        let p: FlatSection = raw.json(SectionKind::PARAMS)?;
        let idx = FlatIndex::with_params(keys, &p.params)
            .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
        Ok(idx)
    }
}

impl FlatIndex {
    /// Writes the index with its keys to one self-contained file at `path`, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        save_inline(self, path.as_ref())
    }
}
