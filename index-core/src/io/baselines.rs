//! Sections of the baseline kinds (docs/FORMAT.md, "hnsw", "ivf", "vamana"): [`Persist`] for
//! [`HnswIndex`], [`IvfIndex`] and [`VamanaIndex`], their decoders and their full checks.
//!
//! Every array comes back borrowed from the mapping ([`crate::io::Buf::Mapped`]). Decoders check every count,
//! length and bound that is O(1) (or O(levels)) before building anything; the scans (ids `< n`,
//! offsets in order, a permutation, finite values) are in [`deep_check`], which opening runs
//! by default.

use super::format::{FileKind, SectionKind};
use super::kinds::{index_keys, json_bytes, KeyResolver, KeysPlacement, Persist};
use super::reader::RawFile;
use super::writer::FileWriter;
use super::AnyIndex;
use crate::error::{Error, Result};
use crate::graph::Csr;
use crate::hnsw::{HnswIndex, HnswParams, UpperLevels};
use crate::ivf::{IvfIndex, IvfParams};
use crate::search::IndexKind;
use crate::store::{Dtype, KeyStore};
use crate::vamana::{VamanaIndex, VamanaParams};
use half::f16;
use std::path::Path;
use std::sync::Arc;

/// Most HNSW levels above 0 a file may declare (the build caps levels at 64).
const MAX_UPPER_LEVELS: u64 = 255;

/// The PARAMS section of a baseline kind: `{"index": name, "params": {...}}` plus, for IVF,
/// the number of lists the build chose.
#[derive(serde::Serialize, serde::Deserialize)]
struct Section<P> {
    index: String,
    params: P,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nlist: Option<usize>,
}

fn params_json<P: serde::Serialize>(
    index: &str,
    params: &P,
    nlist: Option<usize>,
) -> Result<Vec<u8>> {
    json_bytes(&Section {
        index: index.into(),
        params,
        nlist,
    })
}

fn params_of<P: serde::de::DeserializeOwned>(raw: &RawFile, index: &str) -> Result<Section<P>> {
    let p: Section<P> = raw.json(SectionKind::PARAMS)?;
    if p.index != index {
        return Err(raw.error(
            SectionKind::PARAMS,
            format!("names index {:?} but the header says {index}", p.index),
        ));
    }
    Ok(p)
}

fn add_graph<'a>(w: &mut FileWriter<'a>, g: &'a Csr, entry: u32) {
    w.section(SectionKind::CSR_OFFSETS, bytemuck::cast_slice(g.offsets()));
    w.section(
        SectionKind::CSR_NEIGHBORS,
        bytemuck::cast_slice(g.neighbor_array()),
    );
    w.section_owned(SectionKind::ENTRY_POINTS, entry.to_le_bytes().to_vec());
}

impl Persist for HnswIndex {
    fn file_kind(&self) -> FileKind {
        FileKind::Index(IndexKind::Hnsw)
    }
    fn key_store(&self) -> &Arc<KeyStore> {
        self.keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        add_graph(w, self.level0(), self.entry());
        let u = self.upper();
        if !u.is_empty() {
            w.section(
                SectionKind::HNSW_LEVEL_STARTS,
                bytemuck::cast_slice(u.starts()),
            );
            w.section(
                SectionKind::HNSW_UPPER_NODES,
                bytemuck::cast_slice(u.nodes()),
            );
            w.section(
                SectionKind::HNSW_UPPER_OFFSETS,
                bytemuck::cast_slice(u.offsets()),
            );
            w.section(
                SectionKind::HNSW_UPPER_NEIGHBORS,
                bytemuck::cast_slice(u.neighbor_array()),
            );
        }
        w.section_owned(
            SectionKind::PARAMS,
            params_json("hnsw", self.params(), None)?,
        );
        Ok(())
    }
}

impl Persist for VamanaIndex {
    fn file_kind(&self) -> FileKind {
        FileKind::Index(IndexKind::Vamana)
    }
    fn key_store(&self) -> &Arc<KeyStore> {
        self.keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        add_graph(w, self.graph(), self.medoid());
        w.section_owned(
            SectionKind::PARAMS,
            params_json("vamana", self.params(), None)?,
        );
        Ok(())
    }
}

impl Persist for IvfIndex {
    fn file_kind(&self) -> FileKind {
        FileKind::Index(IndexKind::Ivf)
    }
    /// The keys in list order (the index does not keep the caller's id-ordered store).
    fn key_store(&self) -> &Arc<KeyStore> {
        self.list_keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        w.section(
            SectionKind::IVF_LIST_KEYS,
            super::key_bytes(self.list_keys()),
        );
        w.section(
            SectionKind::IVF_CENTROIDS,
            super::key_bytes(self.centroids()),
        );
        w.section(
            SectionKind::IVF_LIST_OFFSETS,
            bytemuck::cast_slice(self.offsets()),
        );
        w.section(
            SectionKind::IVF_LIST_IDS,
            bytemuck::cast_slice(self.list_ids()),
        );
        w.section_owned(
            SectionKind::PARAMS,
            params_json("ivf", self.params(), Some(self.nlist()))?,
        );
        Ok(())
    }
    /// IVF files are always self-contained: the index scans its own list-ordered copy of the
    /// keys (`ivf_list_keys`), so neither `keys` nor `keys_ref` is written, whatever the
    /// placement (in a bundle the manifest still names the KV head's key file).
    fn writer<'a>(&'a self, _keys: KeysPlacement<'_>) -> Result<FileWriter<'a>> {
        let store = self.list_keys();
        let mut w = FileWriter::new(
            self.file_kind(),
            Some(store.dtype()),
            store.len(),
            store.dim(),
        )?;
        self.add_sections(&mut w)?;
        Ok(w)
    }
}

impl HnswIndex {
    /// Writes the index with its keys to one self-contained file at `path` (docs/FORMAT.md),
    /// atomically: a failure leaves any old file at `path` as it was.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.writer(KeysPlacement::Inline)?.write(path.as_ref())
    }
}

impl IvfIndex {
    /// Writes the index (centroids, lists and its list-ordered keys) to one self-contained
    /// file at `path`, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.writer(KeysPlacement::Inline)?.write(path.as_ref())
    }
}

impl VamanaIndex {
    /// Writes the index with its keys to one self-contained file at `path`, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.writer(KeysPlacement::Inline)?.write(path.as_ref())
    }
}

/// Level 0 (`csr_*`) as a mapped CSR, after the O(1) checks: `n + 1` offsets, `offsets[0] = 0`,
/// `offsets[n]` = the number of neighbour ids.
fn mapped_graph(raw: &RawFile) -> Result<Csr> {
    let n = raw.header().n;
    let offsets = raw.array::<u32>(SectionKind::CSR_OFFSETS, n + 1)?;
    let neighbors = raw.array_of::<u32>(raw.required(SectionKind::CSR_NEIGHBORS)?)?;
    check_ends(
        raw,
        SectionKind::CSR_OFFSETS,
        offsets.as_slice(),
        neighbors.as_slice().len(),
    )?;
    Ok(Csr::from_bufs_unchecked(offsets, neighbors))
}

/// `offsets[0] = 0` and the last offset equals `total`.
fn check_ends(raw: &RawFile, kind: SectionKind, offsets: &[u32], total: usize) -> Result<()> {
    if offsets.first() != Some(&0) {
        return Err(raw.error(kind, "offsets[0] is not 0"));
    }
    let last = offsets.last().map(|&x| x as usize);
    if last != Some(total) {
        return Err(raw.error(
            kind,
            format!("offsets end at {last:?} but there are {total} ids"),
        ));
    }
    Ok(())
}

/// The one entry point (HNSW's top-level entry, Vamana's medoid), checked `< n`.
fn single_entry(raw: &RawFile) -> Result<u32> {
    let n = raw.header().n;
    let e = raw.array::<u32>(SectionKind::ENTRY_POINTS, 1)?;
    let entry = e.as_slice().first().copied().unwrap_or(u32::MAX);
    if u64::from(entry) >= n {
        return Err(raw.error(
            SectionKind::ENTRY_POINTS,
            format!("entry point {entry} is not below n = {n}"),
        ));
    }
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
            let level0 = mapped_graph(raw)?;
            let upper = upper_levels(raw)?;
            let entry = single_entry(raw)?;
            let p: Section<HnswParams> = params_of(raw, "hnsw")?;
            let idx = HnswIndex::from_parts(keys, level0, upper, entry, &p.params)
                .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
            AnyIndex::Hnsw(idx)
        }
        FileKind::Index(IndexKind::Vamana) => {
            let keys = index_keys(raw, resolve)?;
            let graph = mapped_graph(raw)?;
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
    let dtype = h.dtype.ok_or_else(|| {
        Error::format(raw.path(), "header", "dtype is 0 but the file stores keys")
    })?;
    let count = n.checked_mul(d).ok_or_else(|| {
        raw.error(
            SectionKind::IVF_LIST_KEYS,
            format!("n × d = {n} × {d} overflows"),
        )
    })?;
    let dim = h.d as usize;
    let lists = match dtype {
        Dtype::F16 => {
            KeyStore::from_buf_f16(raw.array::<f16>(SectionKind::IVF_LIST_KEYS, count)?, dim)
        }
        Dtype::F32 => {
            KeyStore::from_buf_f32(raw.array::<f32>(SectionKind::IVF_LIST_KEYS, count)?, dim)
        }
    }
    .map_err(|e| raw.error(SectionKind::IVF_LIST_KEYS, e.to_string()))?;
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
    let graph_err = |offsets, neighbors| {
        move |reason: String| {
            let section = if reason.contains("neighbour id") {
                neighbors
            } else {
                offsets
            };
            raw.error(section, reason)
        }
    };
    let n = raw.header().n as usize;
    match index {
        AnyIndex::Hnsw(h) => {
            h.level0().validate().map_err(graph_err(
                SectionKind::CSR_OFFSETS,
                SectionKind::CSR_NEIGHBORS,
            ))?;
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
        AnyIndex::Vamana(v) => v.graph().validate().map_err(graph_err(
            SectionKind::CSR_OFFSETS,
            SectionKind::CSR_NEIGHBORS,
        ))?,
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
