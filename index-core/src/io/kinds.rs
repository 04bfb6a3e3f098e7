//! Per-kind encoding and decoding. Adding an index kind to the format takes an impl of
//! [`Persist`] (which sections it writes) and an arm in [`decode`] (how they come back), plus a
//! variant of [`AnyIndex`].

use super::format::{FileKind, SectionKind};
use super::reader::RawFile;
use super::writer::FileWriter;
use super::{AnyIndex, LoadOptions};
use crate::attention::{AttentionIndex, AttentionParams};
use crate::error::{Error, Result};
use crate::flat::FlatIndex;
use crate::graph::Csr;
use crate::search::IndexKind;
use crate::store::{Dtype, KeyStore, KeysRef};
use half::f16;
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

/// Where an index file finds its keys.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyRef {
    /// Key file name, relative to the directory of the index file.
    pub file: String,
    /// The key file's header checksum (hex), which covers its section table and so every
    /// section checksum: a different key file cannot match.
    pub checksum: String,
    pub n: u64,
    pub d: u64,
    pub dtype: Dtype,
}

/// How [`Persist::writer`] stores the keys.
#[derive(Clone, Copy, Debug)]
pub enum KeysPlacement<'a> {
    /// Inside the file (a self-contained `save`).
    Inline,
    /// In a separate key file (a bundle).
    Ref(&'a KeyRef),
}

/// An index kind that can be written to a file.
pub trait Persist {
    /// The header kind.
    fn file_kind(&self) -> FileKind;
    /// The keys it searches.
    fn key_store(&self) -> &Arc<KeyStore>;
    /// Adds the kind's own sections (graph, entry points, parameters...) to `w`.
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()>;

    /// A writer holding the whole file: header fields, keys (inline or a reference), then the
    /// kind's sections.
    fn writer<'a>(&'a self, keys: KeysPlacement<'_>) -> Result<FileWriter<'a>> {
        let store = self.key_store();
        let mut w = FileWriter::new(
            self.file_kind(),
            Some(store.dtype()),
            store.len(),
            store.dim(),
        )?;
        match keys {
            KeysPlacement::Inline => {
                w.section(SectionKind::KEYS, key_bytes(store));
            }
            KeysPlacement::Ref(r) => {
                w.section_owned(SectionKind::KEYS_REF, json_bytes(r)?);
            }
        }
        self.add_sections(&mut w)?;
        Ok(w)
    }
}

/// The key rows as bytes (no copy).
pub fn key_bytes(store: &KeyStore) -> &[u8] {
    match store.rows() {
        KeysRef::F16(v) => bytemuck::cast_slice(v),
        KeysRef::F32(v) => bytemuck::cast_slice(v),
    }
}

pub(crate) fn json_bytes<T: serde::Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(v)
        .map_err(|e| Error::invalid_param("params", "json", format!("cannot serialize: {e}")))
}

/// The PARAMS section of an attention index.
#[derive(serde::Serialize, serde::Deserialize)]
struct AttentionSection {
    index: String,
    params: AttentionParams,
}

impl Persist for AttentionIndex {
    fn file_kind(&self) -> FileKind {
        FileKind::Index(IndexKind::Attention)
    }
    fn key_store(&self) -> &Arc<KeyStore> {
        self.keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        match self.graph()? {
            Cow::Borrowed(g) => {
                w.section(SectionKind::CSR_OFFSETS, bytemuck::cast_slice(g.offsets()));
                w.section(
                    SectionKind::CSR_NEIGHBORS,
                    bytemuck::cast_slice(g.neighbor_array()),
                );
            }
            // After inserts the CSR is assembled for the file.
            Cow::Owned(g) => {
                w.section_owned(
                    SectionKind::CSR_OFFSETS,
                    bytemuck::cast_slice(g.offsets()).to_vec(),
                );
                w.section_owned(
                    SectionKind::CSR_NEIGHBORS,
                    bytemuck::cast_slice(g.neighbor_array()).to_vec(),
                );
            }
        }
        w.section(
            SectionKind::ENTRY_POINTS,
            bytemuck::cast_slice(self.entries()),
        );
        let params = AttentionSection {
            index: "attention".into(),
            params: self.params().clone(),
        };
        w.section_owned(SectionKind::PARAMS, json_bytes(&params)?);
        Ok(())
    }
}

impl Persist for FlatIndex {
    fn file_kind(&self) -> FileKind {
        FileKind::Index(IndexKind::Flat)
    }
    fn key_store(&self) -> &Arc<KeyStore> {
        self.keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        w.section_owned(
            SectionKind::PARAMS,
            json_bytes(&serde_json::json!({"index": "flat"}))?,
        );
        Ok(())
    }
}

impl AttentionIndex {
    /// Writes the index with its keys to one self-contained file at `path` (docs/FORMAT.md),
    /// atomically: a failure leaves any old file at `path` as it was.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.writer(KeysPlacement::Inline)?.write(path.as_ref())
    }
}

impl FlatIndex {
    /// Writes the index with its keys to one self-contained file at `path`, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.writer(KeysPlacement::Inline)?.write(path.as_ref())
    }
}

/// Keys stored in `raw` (a key file or a self-contained index), borrowed from its mapping.
pub fn keys_from(raw: &RawFile) -> Result<Arc<KeyStore>> {
    let h = raw.header();
    let dtype = h.dtype.ok_or_else(|| {
        Error::format(raw.path(), "header", "dtype is 0 but the file stores keys")
    })?;
    let count = h.n.checked_mul(u64::from(h.d)).ok_or_else(|| {
        raw.error(
            SectionKind::KEYS,
            format!("n × d = {} × {} overflows", h.n, h.d),
        )
    })?;
    let d = h.d as usize;
    let store = match dtype {
        Dtype::F16 => KeyStore::from_buf_f16(raw.array::<f16>(SectionKind::KEYS, count)?, d),
        Dtype::F32 => KeyStore::from_buf_f32(raw.array::<f32>(SectionKind::KEYS, count)?, d),
    }
    .map_err(|e| raw.error(SectionKind::KEYS, e.to_string()))?;
    Ok(Arc::new(store))
}

/// Finds the keys of an index file whose keys live elsewhere.
pub type KeyResolver<'a> = dyn FnMut(&RawFile, &KeyRef) -> Result<Arc<KeyStore>> + 'a;

/// The keys of index file `raw`: inline, or through its reference and `resolve`; checked
/// against the header's `n`, `d` and dtype.
pub(super) fn index_keys(raw: &RawFile, resolve: &mut KeyResolver<'_>) -> Result<Arc<KeyStore>> {
    let h = raw.header();
    let keys = if raw.entry(SectionKind::KEYS).is_some() {
        keys_from(raw)?
    } else if raw.entry(SectionKind::KEYS_REF).is_some() {
        let r: KeyRef = raw.json(SectionKind::KEYS_REF)?;
        if r.n != h.n || r.d != u64::from(h.d) || Some(r.dtype) != h.dtype {
            return Err(raw.error(
                SectionKind::KEYS_REF,
                format!(
                    "names {} × {} {} keys but the header says {} × {} {:?}",
                    r.n, r.d, r.dtype, h.n, h.d, h.dtype
                ),
            ));
        }
        let keys = resolve(raw, &r)?;
        if keys.len() as u64 != h.n || keys.dim() != h.d as usize || Some(keys.dtype()) != h.dtype {
            return Err(raw.error(
                SectionKind::KEYS_REF,
                format!(
                    "key file {} holds {} × {} {} keys, expected {} × {}",
                    r.file,
                    keys.len(),
                    keys.dim(),
                    keys.dtype(),
                    h.n,
                    h.d
                ),
            ));
        }
        keys
    } else {
        return Err(raw.error(SectionKind::KEYS, "missing (and no keys_ref either)"));
    };
    Ok(keys)
}

/// Decodes the index in `raw`. With `opts.verify`, also runs the scans that [`deep_check`]
/// does (the caller has checked the section checksums first).
pub fn decode(
    raw: &RawFile,
    opts: &LoadOptions,
    resolve: &mut KeyResolver<'_>,
) -> Result<AnyIndex> {
    let h = raw.header();
    let index = match h.kind {
        FileKind::Keys => {
            return Err(Error::format(
                raw.path(),
                "header",
                "this is a key file, not an index (load it with io::load_keys)",
            ))
        }
        FileKind::Index(IndexKind::Flat) => {
            let keys = index_keys(raw, resolve)?;
            AnyIndex::Flat(FlatIndex::new(keys))
        }
        FileKind::Index(IndexKind::Attention) => {
            let keys = index_keys(raw, resolve)?;
            let n = h.n;
            let offsets = raw.array::<u32>(SectionKind::CSR_OFFSETS, n + 1)?;
            let neighbors = raw.array_of::<u32>(raw.required(SectionKind::CSR_NEIGHBORS)?)?;
            // O(1) checks that hold for every file; the scan of all ids is in `deep_check`.
            let (first, last) = (
                offsets.as_slice().first().copied(),
                offsets.as_slice().last().copied(),
            );
            if first != Some(0) {
                return Err(raw.error(SectionKind::CSR_OFFSETS, "offsets[0] is not 0"));
            }
            if last.map(|x| x as usize) != Some(neighbors.as_slice().len()) {
                return Err(raw.error(
                    SectionKind::CSR_OFFSETS,
                    format!(
                        "offsets end at {last:?} but csr_neighbors holds {} ids",
                        neighbors.as_slice().len()
                    ),
                ));
            }
            let graph = Csr::from_bufs_unchecked(offsets, neighbors);
            let entries = raw
                .array_of::<u32>(raw.required(SectionKind::ENTRY_POINTS)?)?
                .as_slice()
                .to_vec();
            if entries.is_empty() {
                return Err(raw.error(SectionKind::ENTRY_POINTS, "no entry point"));
            }
            if let Some(bad) = entries.iter().find(|&&e| u64::from(e) >= n) {
                return Err(raw.error(
                    SectionKind::ENTRY_POINTS,
                    format!("entry point {bad} is not below n = {n}"),
                ));
            }
            let p: AttentionSection = raw.json(SectionKind::PARAMS)?;
            p.params
                .validate()
                .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
            let idx = AttentionIndex::from_parts(keys, graph, entries, &p.params)
                .map_err(|e| raw.error(SectionKind::CSR_OFFSETS, e.to_string()))?;
            AnyIndex::Attention(idx)
        }
        FileKind::Index(other) => match super::baselines::decode(raw, resolve)? {
            Some(index) => index,
            None => {
                return Err(Error::format(
                    raw.path(),
                    "header",
                    format!(
                    "{} files are specified in docs/FORMAT.md but this build cannot load them yet",
                    other.name()
                ),
                ))
            }
        },
    };
    if opts.verify {
        deep_check(raw, &index)?;
    }
    Ok(index)
}

/// The scans that opening without verification skips: every neighbour id `< n`, offsets in
/// order, every key finite. Section checksums are checked separately
/// ([`RawFile::verify_checksums`]).
pub fn deep_check(raw: &RawFile, index: &AnyIndex) -> Result<()> {
    let keys = index.key_store();
    if raw.entry(SectionKind::KEYS).is_some() {
        if let Some(row) = keys.first_non_finite_row() {
            return Err(raw.error(
                SectionKind::KEYS,
                format!("key row {row} holds NaN or infinity"),
            ));
        }
    }
    if let AnyIndex::Attention(a) = index {
        a.graph()?.validate().map_err(|reason| {
            let section = if reason.contains("neighbour id") {
                SectionKind::CSR_NEIGHBORS
            } else {
                SectionKind::CSR_OFFSETS
            };
            raw.error(section, reason)
        })?;
    }
    super::baselines::deep_check(raw, index)?;
    Ok(())
}
