//! The file sections of [`HnswIndex`] (docs/FORMAT.md, "hnsw"): level 0 as a CSR graph with
//! its entry point, the upper levels in four arrays, the keys and PARAMS. Every array comes back
//! borrowed from the mapping.

use super::{HnswIndex, HnswParams, UpperLevels};
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

/// Most HNSW levels above 0 a file may declare (the build caps levels at 64).
const MAX_UPPER_LEVELS: u64 = 255;

impl Persist for HnswIndex {
    fn key_store(&self) -> &Arc<KeyStore> {
        self.keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        add_graph(w, self.level0(), self.entry());
        let u = self.upper();
        if !u.is_empty() {
            for (kind, values) in [
                (SectionKind::HNSW_LEVEL_STARTS, u.starts()),
                (SectionKind::HNSW_UPPER_NODES, u.nodes()),
                (SectionKind::HNSW_UPPER_OFFSETS, u.offsets()),
                (SectionKind::HNSW_UPPER_NEIGHBORS, u.neighbor_array()),
            ] {
                w.section(kind, bytemuck::cast_slice(values));
            }
        }
        Ok(())
    }
    fn params_section(&self) -> Result<Vec<u8>> {
        params_json("hnsw", self.params(), None)
    }
}

/// HNSW levels `1..=L` ([`UpperLevels`]) borrowed from the mapping, after the O(1) checks.
/// The four `hnsw_*` sections are all present or all absent (level 0 only).
fn upper_levels(raw: &RawFile) -> Result<UpperLevels> {
    let kinds = [
        SectionKind::HNSW_LEVEL_STARTS,
        SectionKind::HNSW_UPPER_NODES,
        SectionKind::HNSW_UPPER_OFFSETS,
        SectionKind::HNSW_UPPER_NEIGHBORS,
    ];
    if kinds.iter().all(|&k| raw.entry(k).is_none()) {
        return Ok(UpperLevels::default());
    }
    let n = raw.header().n;
    let starts = raw.array_of::<u32>(raw.required(kinds[0])?)?;
    let levels = starts.as_slice().len() as u64;
    if !(2..=MAX_UPPER_LEVELS + 1).contains(&levels) {
        return Err(raw.error(
            kinds[0],
            format!("{levels} values is not L + 1 for a level count L in 1..={MAX_UPPER_LEVELS}"),
        ));
    }
    let nodes = raw.array_of::<u32>(raw.required(kinds[1])?)?;
    let pairs = nodes.as_slice().len() as u64;
    // Each level holds at most n nodes.
    if pairs > n.saturating_mul(levels - 1) {
        return Err(raw.error(
            kinds[1],
            format!("{pairs} nodes is more than n × L = {n} × {}", levels - 1),
        ));
    }
    let offsets = raw.array::<u32>(kinds[2], pairs + 1)?;
    let neighbors = raw.array_of::<u32>(raw.required(kinds[3])?)?;
    UpperLevels::from_bufs(starts, nodes, offsets, neighbors).map_err(|(array, reason)| {
        let kind = if array == "starts" {
            kinds[0]
        } else {
            kinds[2]
        };
        raw.error(kind, reason)
    })
}

impl Decode for HnswIndex {
    fn decode(raw: &RawFile, resolve: &mut KeyResolver<'_>) -> Result<Self> {
        let keys = index_keys(raw, resolve)?;
        let level0 = mapped_csr(raw)?;
        let upper = upper_levels(raw)?;
        let entry = single_entry(raw)?;
        let p: Section<HnswParams> = params_of(raw, "hnsw")?;
        let idx = HnswIndex::from_parts(keys, level0, upper, entry, &p.params)
            .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
        Ok(idx)
    }

    /// Every level's graph valid.
    fn deep_check(&self, raw: &RawFile) -> Result<()> {
        let n = raw.header().n as usize;

        self.level0()
            .validate()
            .map_err(|reason| graph_error(raw, reason))?;
        self.upper().validate(n).map_err(|(array, reason)| {
            let kind = match array {
                "starts" => SectionKind::HNSW_LEVEL_STARTS,
                "nodes" => SectionKind::HNSW_UPPER_NODES,
                "offsets" => SectionKind::HNSW_UPPER_OFFSETS,
                _ => SectionKind::HNSW_UPPER_NEIGHBORS,
            };
            raw.error(kind, reason)
        })?;
        Ok(())
    }
}

impl HnswIndex {
    /// Writes the index with its keys to one self-contained file at `path` (docs/FORMAT.md),
    /// atomically: a failure leaves any old file at `path` as it was.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        save_inline(self, path.as_ref())
    }
}
