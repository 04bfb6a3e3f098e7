//! [`AnyIndex`]: an index of any kind, and the one registration of the kinds: each variant,
//! the header kind that decodes to it, and its conversions. Adding a kind: its folder (with a
//! `file.rs` implementing [`Persist`] and [`Decode`]), a variant here, and its presets in
//! `spec/mod.rs`.

use crate::attention::AttentionIndex;
use crate::error::{Error, Result};
use crate::file::format::{FileKind, SectionKind};
use crate::file::persist::{Decode, KeyResolver, KeysPlacement, Persist};
use crate::file::reader::RawFile;
use crate::flat::FlatIndex;
use crate::hnsw::HnswIndex;
use crate::ivf::IvfIndex;
use crate::scratch::Scratch;
use crate::search::{AnnIndex, IndexKind, SearchOutput, SearchParams};
use crate::store::KeyStore;
use crate::vamana::VamanaIndex;
use std::path::Path;
use std::sync::Arc;

/// An index of any kind, as [`crate::io::load`] returns it. Searches go through [`AnnIndex`]; the
/// accessors give the concrete kind.
#[derive(Clone, Debug)]
#[non_exhaustive]
// One value per opened file, never stored in bulk: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum AnyIndex {
    Attention(AttentionIndex),
    Flat(FlatIndex),
    Hnsw(HnswIndex),
    Ivf(IvfIndex),
    /// Vamana or RobustVamana (`params().robust`).
    Vamana(VamanaIndex),
}

/// A `match` on the kind of an [`AnyIndex`] with one arm for every variant: `$e` with `$i`
/// bound to the variant's index.
macro_rules! each_kind {
    ($any:expr, $i:ident => $e:expr) => {
        match $any {
            AnyIndex::Attention($i) => $e,
            AnyIndex::Flat($i) => $e,
            AnyIndex::Hnsw($i) => $e,
            AnyIndex::Ivf($i) => $e,
            AnyIndex::Vamana($i) => $e,
        }
    };
}

impl AnyIndex {
    /// The attention index, if this is one.
    pub fn as_attention(&self) -> Option<&AttentionIndex> {
        match self {
            AnyIndex::Attention(a) => Some(a),
            _ => None,
        }
    }

    /// The flat index, if this is one.
    pub fn as_flat(&self) -> Option<&FlatIndex> {
        match self {
            AnyIndex::Flat(f) => Some(f),
            _ => None,
        }
    }

    /// The HNSW index, if this is one.
    pub fn as_hnsw(&self) -> Option<&HnswIndex> {
        match self {
            AnyIndex::Hnsw(h) => Some(h),
            _ => None,
        }
    }

    /// The IVF index, if this is one.
    pub fn as_ivf(&self) -> Option<&IvfIndex> {
        match self {
            AnyIndex::Ivf(i) => Some(i),
            _ => None,
        }
    }

    /// The Vamana (or RobustVamana) index, if this is one.
    pub fn as_vamana(&self) -> Option<&VamanaIndex> {
        match self {
            AnyIndex::Vamana(v) => Some(v),
            _ => None,
        }
    }

    /// The index as a trait object.
    pub fn as_dyn(&self) -> &dyn AnnIndex {
        each_kind!(self, index => index)
    }

    /// The index as a boxed trait object.
    pub fn into_box(self) -> Box<dyn AnnIndex> {
        each_kind!(self, index => Box::new(index))
    }

    /// The keys it searches. For IVF these are its own copy in list order (row `p` is key
    /// `list_ids()[p]`), as it keeps no id-ordered store.
    pub fn key_store(&self) -> &Arc<KeyStore> {
        self.as_persist().key_store()
    }

    /// The index as something [`Persist`] can write.
    pub fn as_persist(&self) -> &dyn Persist {
        each_kind!(self, index => index)
    }

    /// Writes the index with its keys to one self-contained file, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.as_persist()
            .writer(KeysPlacement::Inline)?
            .write(path.as_ref())
    }
}

/// `From` each kind into [`AnyIndex`], and `TryFrom` back (an [`Error::InvalidParam`] named
/// `kind` for another kind).
macro_rules! any_index_conversions {
    ($($variant:ident($ty:ty)),* $(,)?) => {$(
        impl From<$ty> for AnyIndex {
            fn from(index: $ty) -> Self {
                AnyIndex::$variant(index)
            }
        }

        impl TryFrom<AnyIndex> for $ty {
            type Error = Error;

            fn try_from(any: AnyIndex) -> Result<Self> {
                match any {
                    AnyIndex::$variant(index) => Ok(index),
                    other => Err(Error::invalid_param(
                        "kind",
                        other.kind().name(),
                        concat!("expected ", stringify!($ty)),
                    )),
                }
            }
        }
    )*};
}

any_index_conversions!(
    Attention(AttentionIndex),
    Flat(FlatIndex),
    Hnsw(HnswIndex),
    Ivf(IvfIndex),
    Vamana(VamanaIndex),
);

impl AnnIndex for AnyIndex {
    fn kind(&self) -> IndexKind {
        self.as_dyn().kind()
    }
    fn len(&self) -> usize {
        self.as_dyn().len()
    }
    fn dim(&self) -> usize {
        self.as_dyn().dim()
    }
    fn memory_bytes(&self) -> usize {
        self.as_dyn().memory_bytes()
    }
    fn search_seeded(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<()> {
        self.as_dyn()
            .search_seeded(query, k, params, seeds, scratch, out)
    }
    fn batches(&self) -> bool {
        self.as_dyn().batches()
    }
    fn search_rows<'s>(
        &self,
        queries: &[f32],
        k: usize,
        params: &dyn Fn(usize) -> SearchParams,
        seeds: &dyn Fn(usize) -> &'s [u32],
        scratch: &mut Scratch,
        outs: &mut [SearchOutput],
    ) -> Result<()> {
        self.as_dyn()
            .search_rows(queries, k, params, seeds, scratch, outs)
    }
}

/// Decodes the index in `raw`, dispatching on the header's kind. With `verify`, also runs the
/// scans that [`deep_check`] does (the caller has checked the section checksums first).
pub fn decode(raw: &RawFile, verify: bool, resolve: &mut KeyResolver<'_>) -> Result<AnyIndex> {
    let index = match raw.header().kind {
        FileKind::Keys => {
            return Err(Error::format(
                raw.path(),
                "header",
                "this is a key file, not an index (load it with io::load_keys)",
            ))
        }
        FileKind::Index(IndexKind::Attention) => {
            AnyIndex::Attention(AttentionIndex::decode(raw, resolve)?)
        }
        FileKind::Index(IndexKind::Flat) => AnyIndex::Flat(FlatIndex::decode(raw, resolve)?),
        FileKind::Index(IndexKind::Hnsw) => AnyIndex::Hnsw(HnswIndex::decode(raw, resolve)?),
        FileKind::Index(IndexKind::Ivf) => AnyIndex::Ivf(IvfIndex::decode(raw, resolve)?),
        FileKind::Index(IndexKind::Vamana) => AnyIndex::Vamana(VamanaIndex::decode(raw, resolve)?),
    };
    if verify {
        deep_check(raw, &index)?;
    }
    Ok(index)
}

/// The scans that opening without verification skips: every key finite, then the kind's own
/// ([`Decode::deep_check`]: neighbour ids `< n`, offsets in order, permutations). Section
/// checksums are checked separately ([`RawFile::verify_checksums`]).
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
    each_kind!(index, i => i.deep_check(raw))
}
