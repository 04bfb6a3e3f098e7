//! What every kind implements to live in a file: [`Persist`] (which sections it writes, and
//! its PARAMS) and [`Decode`] (how they come back, and the scans a full check runs), with the
//! key sections they share (inline keys or a reference to a key file).

use super::format::{FileKind, SectionKind};
use super::reader::RawFile;
use super::sections::{json_bytes, stored_keys};
use super::writer::FileWriter;
use crate::error::Result;
use crate::search::AnnIndex;
use crate::store::{Dtype, KeyStore, KeysRef};
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
pub(crate) fn header_writer<'a>(kind: FileKind, store: &KeyStore) -> Result<FileWriter<'a>> {
    FileWriter::new(kind, Some(store.dtype()), store.len(), store.dim())
}

/// `w` with the sections of `index` ([`Persist::add_sections`]) and its PARAMS added.
pub(crate) fn add_own_sections<'a, P: Persist + ?Sized>(
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

/// Keys stored in `raw` (a key file or a self-contained index), borrowed from its mapping.
pub fn keys_from(raw: &RawFile) -> Result<Arc<KeyStore>> {
    Ok(Arc::new(stored_keys(raw, SectionKind::KEYS)?))
}

/// Finds the keys of an index file whose keys live elsewhere.
pub type KeyResolver<'a> = dyn FnMut(&RawFile, &KeyRef) -> Result<Arc<KeyStore>> + 'a;

/// The keys of index file `raw`: inline, or through its reference and `resolve`; checked
/// against the header's `n`, `d` and dtype.
pub(crate) fn index_keys(raw: &RawFile, resolve: &mut KeyResolver<'_>) -> Result<Arc<KeyStore>> {
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

/// A kind that opens from its file: the other half of [`Persist`]. Each kind's `file.rs`
/// implements both; `crate::spec::AnyIndex` dispatches on the header's kind.
pub trait Decode: Sized {
    /// Decodes the index in `raw` after the O(1) checks of every count, length and bound
    /// (nothing is cast before they pass); its keys come inline or through `resolve`.
    fn decode(raw: &RawFile, resolve: &mut KeyResolver<'_>) -> Result<Self>;
    /// The scans that opening without verification skips (graph ids `< n`, offsets in order,
    /// permutations), naming the section at fault; none by default.
    fn deep_check(&self, _raw: &RawFile) -> Result<()> {
        Ok(())
    }
}

/// Writes `index` with its keys to one self-contained file at `path`, atomically: a failure
/// leaves any old file at `path` as it was (each kind's inherent `save`).
pub(crate) fn save_inline<P: Persist + ?Sized>(index: &P, path: &Path) -> Result<()> {
    index.writer(KeysPlacement::Inline)?.write(path)
}
