//! The file sections of [`AttentionIndex`] (docs/FORMAT.md, "attention"): the keys (inline or a
//! reference), the CSR graph, the entry points and PARAMS.

use super::{AttentionIndex, AttentionParams};
use crate::error::Result;
use crate::file::format::SectionKind;
use crate::file::persist::{index_keys, save_inline};
use crate::file::persist::{Decode, KeyResolver, Persist};
use crate::file::reader::RawFile;
use crate::file::sections::{
    add_csr, check_entries, graph_error, mapped_csr, params_json, Section,
};
use crate::file::writer::FileWriter;
use crate::store::KeyStore;
use std::path::Path;
use std::sync::Arc;

impl Persist for AttentionIndex {
    fn key_store(&self) -> &Arc<KeyStore> {
        self.keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        // After inserts the CSR is assembled for the file (owned).
        add_csr(w, self.graph()?);
        w.section(
            SectionKind::ENTRY_POINTS,
            bytemuck::cast_slice(self.entries()),
        );
        Ok(())
    }
    fn params_section(&self) -> Result<Vec<u8>> {
        params_json("attention", self.params(), None)
    }
}

impl Decode for AttentionIndex {
    fn decode(raw: &RawFile, resolve: &mut KeyResolver<'_>) -> Result<Self> {
        let keys = index_keys(raw, resolve)?;
        // O(1) checks that hold for every file; the scan of all ids is in `deep_check`.
        let graph = mapped_csr(raw)?;
        let entries = raw
            .array_of::<u32>(raw.required(SectionKind::ENTRY_POINTS)?)?
            .as_slice()
            .to_vec();
        if entries.is_empty() {
            return Err(raw.error(SectionKind::ENTRY_POINTS, "no entry point"));
        }
        check_entries(raw, &entries)?;
        let p: Section<AttentionParams> = raw.json(SectionKind::PARAMS)?;
        p.params
            .validate()
            .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
        let idx = AttentionIndex::from_parts(keys, graph, entries, &p.params)
            .map_err(|e| raw.error(SectionKind::CSR_OFFSETS, e.to_string()))?;
        Ok(idx)
    }

    fn deep_check(&self, raw: &RawFile) -> Result<()> {
        self.graph()?
            .validate()
            .map_err(|reason| graph_error(raw, reason))
    }
}

impl AttentionIndex {
    /// Writes the index with its keys to one self-contained file at `path` (docs/FORMAT.md),
    /// atomically: a failure leaves any old file at `path` as it was.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        save_inline(self, path.as_ref())
    }
}
