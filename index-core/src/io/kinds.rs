//! Per-kind encoding and decoding. Adding an index kind to the format takes an impl of
//! [`Persist`] (which sections it writes, and its PARAMS) and an arm in [`decode`] (how they
//! come back), plus a variant of [`AnyIndex`].

use super::format::{FileKind, SectionKind};
use super::reader::RawFile;
use super::sections::{
    add_csr, check_entries, graph_error, json_bytes, mapped_csr, params_json, stored_keys, Section,
};
use super::writer::FileWriter;
use super::{AnyIndex, LoadOptions};
use crate::attention::{AttentionIndex, AttentionParams};
use crate::error::{Error, Result};
use crate::flat::{FlatIndex, FlatParams};
use crate::hnsw::HnswIndex;
use crate::ivf::IvfIndex;
use crate::search::{AnnIndex, IndexKind};
use crate::store::{Dtype, KeyStore, KeysRef};
use crate::vamana::VamanaIndex;
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
pub trait Persist: AnnIndex {
    /// The header kind: the index's [`AnnIndex::kind`].
    fn file_kind(&self) -> FileKind {
        FileKind::Index(self.kind())
    }
    /// The keys it searches.
    fn key_store(&self) -> &Arc<KeyStore>;
    /// Adds the kind's own sections (graph, entry points, lists...) to `w`; none by default.
    fn add_sections<'a>(&'a self, _w: &mut FileWriter<'a>) -> Result<()> {
        Ok(())
    }
    /// The PARAMS section (JSON naming the kind, with its build parameters), written last.
    fn params_section(&self) -> Result<Vec<u8>>;

    /// A writer holding the whole file: header fields, keys (inline or a reference), then the
    /// kind's sections and PARAMS.
    fn writer<'a>(&'a self, keys: KeysPlacement<'_>) -> Result<FileWriter<'a>> {
        let store = self.key_store();
        let mut w = header_writer(self.file_kind(), store)?;
        match keys {
            KeysPlacement::Inline => {
                w.section_cow(SectionKind::KEYS, key_bytes(store));
            }
            KeysPlacement::Ref(r) => {
                w.section_owned(SectionKind::KEYS_REF, json_bytes(r)?);
            }
        }
        add_own_sections(self, w)
    }
}

/// A writer whose header describes `kind` over the keys of `store`.
pub(super) fn header_writer<'a>(kind: FileKind, store: &KeyStore) -> Result<FileWriter<'a>> {
    FileWriter::new(kind, Some(store.dtype()), store.len(), store.dim())
}

/// `w` with the sections of `index` ([`Persist::add_sections`]) and its PARAMS added.
pub(super) fn add_own_sections<'a, P: Persist + ?Sized>(
    index: &'a P,
    mut w: FileWriter<'a>,
) -> Result<FileWriter<'a>> {
    index.add_sections(&mut w)?;
    w.section_owned(SectionKind::PARAMS, index.params_section()?);
    Ok(w)
}

/// The key rows as the bytes of a `keys` section: f16 and f32 rows as they are (no copy); int8
/// keys as `d` f32 offsets, `d` f32 ranges, `n` f32 scales and the `n × d` codes (format
/// version 3, copied into one buffer).
pub fn key_bytes(store: &KeyStore) -> Cow<'_, [u8]> {
    match store.rows() {
        KeysRef::F16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
        KeysRef::F32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
        KeysRef::I8 {
            codes,
            scales,
            affine,
        } => {
            let mut b = Vec::with_capacity(affine.bytes() + 4 * scales.len() + codes.len());
            b.extend_from_slice(bytemuck::cast_slice(affine.offset()));
            b.extend_from_slice(bytemuck::cast_slice(affine.range()));
            b.extend_from_slice(bytemuck::cast_slice(scales));
            b.extend_from_slice(bytemuck::cast_slice(codes));
            Cow::Owned(b)
        }
    }
}

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

/// The inherent `save` of each kind (callers need not import [`Persist`]).
macro_rules! save_inline {
    ($($(#[$doc:meta])* $kind:ty;)*) => {$(
        impl $kind {
            $(#[$doc])*
            pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
                self.writer(KeysPlacement::Inline)?.write(path.as_ref())
            }
        }
    )*};
}

save_inline! {
    /// Writes the index with its keys to one self-contained file at `path` (docs/FORMAT.md),
    /// atomically: a failure leaves any old file at `path` as it was.
    AttentionIndex;
    /// Writes the index with its keys to one self-contained file at `path`, atomically.
    FlatIndex;
    /// Writes the index with its keys to one self-contained file at `path` (docs/FORMAT.md),
    /// atomically: a failure leaves any old file at `path` as it was.
    HnswIndex;
    /// Writes the index (centroids, lists and its list-ordered keys) to one self-contained
    /// file at `path`, atomically.
    IvfIndex;
    /// Writes the index with its keys to one self-contained file at `path`, atomically.
    VamanaIndex;
}

/// Keys stored in `raw` (a key file or a self-contained index), borrowed from its mapping.
pub fn keys_from(raw: &RawFile) -> Result<Arc<KeyStore>> {
    Ok(Arc::new(stored_keys(raw, SectionKind::KEYS)?))
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
            let p: FlatSection = raw.json(SectionKind::PARAMS)?;
            let idx = FlatIndex::with_params(keys, &p.params)
                .map_err(|e| raw.error(SectionKind::PARAMS, e.to_string()))?;
            AnyIndex::Flat(idx)
        }
        FileKind::Index(IndexKind::Attention) => {
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
        a.graph()?
            .validate()
            .map_err(|reason| graph_error(raw, reason))?;
    }
    super::baselines::deep_check(raw, index)?;
    Ok(())
}
