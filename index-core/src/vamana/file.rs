//! The file sections of [`VamanaIndex`] (docs/FORMAT.md, "vamana"): the CSR graph with its
//! medoid, the keys and PARAMS.

use super::{VamanaIndex, VamanaParams};
use crate::error::Result;
use crate::file::format::SectionKind;
use crate::file::persist::{index_keys, save_inline};
use crate::file::persist::{Decode, KeyResolver, Persist};
use crate::file::reader::RawFile;
use crate::file::sections::{
    add_graph, graph_error, mapped_csr, params_json, params_of, single_entry, Section,
};
use crate::file::writer::FileWriter;
use crate::store::KeyStore;
use std::path::Path;
use std::sync::Arc;

impl Persist for VamanaIndex {
    fn key_store(&self) -> &Arc<KeyStore> {
        self.keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        add_graph(w, self.graph(), self.medoid());
        Ok(())
    }
    fn params_section(&self) -> Result<Vec<u8>> {
        params_json("vamana", self.params(), None)
    }
}

impl Decode for VamanaIndex {
    fn decode(raw: &RawFile, resolve: &mut KeyResolver<'_>) -> Result<Self> {
        let keys = index_keys(raw, resolve)?;
        let graph = mapped_csr(raw)?;
        let medoid = single_entry(raw)?;
        let p: Section<VamanaParams> = params_of(raw, "vamana")?;
        p.params
            .validate()
            .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
        let idx = VamanaIndex::from_parts(keys, graph, medoid, &p.params)
            .map_err(|e| raw.error(SectionKind::CSR_OFFSETS, e.to_string()))?;
        Ok(idx)
    }

    fn deep_check(&self, raw: &RawFile) -> Result<()> {
        self.graph()
            .validate()
            .map_err(|reason| graph_error(raw, reason))
    }
}

impl VamanaIndex {
    /// Writes the index with its keys to one self-contained file at `path`, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        save_inline(self, path.as_ref())
    }
}
