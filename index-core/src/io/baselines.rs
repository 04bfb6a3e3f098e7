//! Sections of the baseline kinds (docs/FORMAT.md, "hnsw", "ivf", "vamana"): [`Persist`] for
//! [`HnswIndex`], [`IvfIndex`] and [`VamanaIndex`], their decoders and their full checks.
//!
//! Every array comes back borrowed from the mapping ([`crate::io::Buf::Mapped`]). Decoders check every count,
//! length and bound that is O(1) (or O(levels)) before building anything; the scans (ids `< n`,
//! offsets in order, a permutation, finite values) are in [`deep_check`], which opening runs
//! by default.

use super::format::{FileKind, SectionKind};
use super::kinds::{
    add_own_sections, header_writer, index_keys, KeyResolver, KeysPlacement, Persist,
};
use super::reader::RawFile;
use super::sections::{
    add_csr, check_ends, check_entries, graph_error, mapped_csr, params_json, params_of,
    stored_keys, Section,
};
use super::writer::FileWriter;
use super::AnyIndex;
use crate::error::Result;
use crate::graph::Csr;
use crate::hnsw::{HnswIndex, HnswParams, UpperLevels};
use crate::ivf::{IvfIndex, IvfParams};
use crate::search::IndexKind;
use crate::store::KeyStore;
use crate::vamana::{VamanaIndex, VamanaParams};
use std::borrow::Cow;
use std::sync::Arc;

/// Most HNSW levels above 0 a file may declare (the build caps levels at 64).
const MAX_UPPER_LEVELS: u64 = 255;

/// Level 0 (or Vamana's graph) and its one entry point.
fn add_graph<'a>(w: &mut FileWriter<'a>, g: &'a Csr, entry: u32) {
    add_csr(w, Cow::Borrowed(g));
    w.section_owned(SectionKind::ENTRY_POINTS, entry.to_le_bytes().to_vec());
}

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

impl Persist for IvfIndex {
    /// The keys in list order (the index does not keep the caller's id-ordered store).
    fn key_store(&self) -> &Arc<KeyStore> {
        self.list_keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        w.section_cow(
            SectionKind::IVF_LIST_KEYS,
            super::key_bytes(self.list_keys()),
        );
        for (kind, bytes) in [
            (
                SectionKind::IVF_CENTROIDS,
                super::key_bytes(self.centroids()),
            ),
            (
                SectionKind::IVF_LIST_OFFSETS,
                Cow::Borrowed(bytemuck::cast_slice(self.offsets())),
            ),
            (
                SectionKind::IVF_LIST_IDS,
                Cow::Borrowed(bytemuck::cast_slice(self.list_ids())),
            ),
        ] {
            w.section_cow(kind, bytes);
        }
        Ok(())
    }
    fn params_section(&self) -> Result<Vec<u8>> {
        params_json("ivf", self.params(), Some(self.nlist()))
    }
    /// IVF files are always self-contained: the index scans its own list-ordered copy of the
    /// keys (`ivf_list_keys`), so neither `keys` nor `keys_ref` is written, whatever the
    /// placement (in a bundle the manifest still names the KV head's key file).
    fn writer<'a>(&'a self, _keys: KeysPlacement<'_>) -> Result<FileWriter<'a>> {
        add_own_sections(self, header_writer(self.file_kind(), self.list_keys())?)
    }
}

/// The one entry point (HNSW's top-level entry, Vamana's medoid), checked `< n`.
fn single_entry(raw: &RawFile) -> Result<u32> {
    let e = raw.array::<u32>(SectionKind::ENTRY_POINTS, 1)?;
    let entry = e.as_slice().first().copied().unwrap_or(u32::MAX);
    check_entries(raw, &[entry])?;
    Ok(entry)
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

/// Decodes a baseline kind's file (`None` for other kinds).
pub(super) fn decode(raw: &RawFile, resolve: &mut KeyResolver<'_>) -> Result<Option<AnyIndex>> {
    let index = match raw.header().kind {
        FileKind::Index(IndexKind::Hnsw) => {
            let keys = index_keys(raw, resolve)?;
            let level0 = mapped_csr(raw)?;
            let upper = upper_levels(raw)?;
            let entry = single_entry(raw)?;
            let p: Section<HnswParams> = params_of(raw, "hnsw")?;
            let idx = HnswIndex::from_parts(keys, level0, upper, entry, &p.params)
                .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
            AnyIndex::Hnsw(idx)
        }
        FileKind::Index(IndexKind::Vamana) => {
            let keys = index_keys(raw, resolve)?;
            let graph = mapped_csr(raw)?;
            let medoid = single_entry(raw)?;
            let p: Section<VamanaParams> = params_of(raw, "vamana")?;
            p.params
                .validate()
                .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
            let idx = VamanaIndex::from_parts(keys, graph, medoid, &p.params)
                .map_err(|e| raw.error(SectionKind::CSR_OFFSETS, e.to_string()))?;
            AnyIndex::Vamana(idx)
        }
        FileKind::Index(IndexKind::Ivf) => AnyIndex::Ivf(decode_ivf(raw)?),
        _ => return Ok(None),
    };
    Ok(Some(index))
}

fn decode_ivf(raw: &RawFile) -> Result<IvfIndex> {
    let h = raw.header();
    for kind in [SectionKind::KEYS, SectionKind::KEYS_REF] {
        if raw.entry(kind).is_some() {
            return Err(raw.error(
                kind,
                "an ivf file holds its keys in ivf_list_keys, not in this section",
            ));
        }
    }
    let (n, d) = (h.n, u64::from(h.d));
    let lists = stored_keys(raw, SectionKind::IVF_LIST_KEYS)?;
    let dim = h.d as usize;
    let centroids = raw.array_of::<f32>(raw.required(SectionKind::IVF_CENTROIDS)?)?;
    let values = centroids.as_slice().len() as u64;
    if values == 0 || !values.is_multiple_of(d) || values / d > n {
        return Err(raw.error(
            SectionKind::IVF_CENTROIDS,
            format!("{values} values is not nlist × d = nlist × {d} with nlist in 1..={n}"),
        ));
    }
    let nlist = values / d;
    let p: Section<IvfParams> = params_of(raw, "ivf")?;
    if p.nlist.is_some_and(|x| x as u64 != nlist) {
        return Err(raw.error(
            SectionKind::PARAMS,
            format!("nlist {:?} but ivf_centroids holds {nlist}", p.nlist),
        ));
    }
    let centroids = KeyStore::from_buf_f32(centroids, dim)
        .map_err(|e| raw.error(SectionKind::IVF_CENTROIDS, e.to_string()))?;
    let offsets = raw.array::<u32>(SectionKind::IVF_LIST_OFFSETS, nlist + 1)?;
    check_ends(
        raw,
        SectionKind::IVF_LIST_OFFSETS,
        offsets.as_slice(),
        n as usize,
    )?;
    let ids = raw.array::<u32>(SectionKind::IVF_LIST_IDS, n)?;
    IvfIndex::from_parts(centroids, Arc::new(lists), ids, offsets, &p.params)
        .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))
}

/// The scans of the baseline kinds: graphs (every level) valid, IVF lists a permutation with
/// offsets in order and finite keys and centroids.
pub(super) fn deep_check(raw: &RawFile, index: &AnyIndex) -> Result<()> {
    let graph_err = |reason| graph_error(raw, reason);
    let n = raw.header().n as usize;
    match index {
        AnyIndex::Hnsw(h) => {
            h.level0().validate().map_err(graph_err)?;
            h.upper().validate(n).map_err(|(array, reason)| {
                let kind = match array {
                    "starts" => SectionKind::HNSW_LEVEL_STARTS,
                    "nodes" => SectionKind::HNSW_UPPER_NODES,
                    "offsets" => SectionKind::HNSW_UPPER_OFFSETS,
                    _ => SectionKind::HNSW_UPPER_NEIGHBORS,
                };
                raw.error(kind, reason)
            })?;
        }
        AnyIndex::Vamana(v) => v.graph().validate().map_err(graph_err)?,
        AnyIndex::Ivf(i) => i.validate().map_err(|reason| {
            let section = if reason.contains("offsets") {
                SectionKind::IVF_LIST_OFFSETS
            } else if reason.contains("key id") {
                SectionKind::IVF_LIST_IDS
            } else if reason.contains("centroid") {
                SectionKind::IVF_CENTROIDS
            } else {
                SectionKind::IVF_LIST_KEYS
            };
            raw.error(section, reason)
        })?,
        _ => {}
    }
    Ok(())
}
