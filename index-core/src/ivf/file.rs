//! The file sections of [`IvfIndex`] (docs/FORMAT.md, "ivf"): the centroids, the list offsets
//! and ids, the list-ordered keys and PARAMS (with the `nlist` the build chose). IVF files are
//! always self-contained.

use super::{IvfIndex, IvfParams};
use crate::error::Result;
use crate::file::format::SectionKind;
use crate::file::persist::{
    add_own_sections, header_writer, key_bytes, save_inline, KeysPlacement,
};
use crate::file::persist::{Decode, KeyResolver, Persist};
use crate::file::reader::RawFile;
use crate::file::sections::{check_ends, params_json, params_of, stored_keys, Section};
use crate::file::writer::FileWriter;
use crate::store::KeyStore;
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

impl Persist for IvfIndex {
    /// The keys in list order (the index does not keep the caller's id-ordered store).
    fn key_store(&self) -> &Arc<KeyStore> {
        self.list_keys()
    }
    fn add_sections<'a>(&'a self, w: &mut FileWriter<'a>) -> Result<()> {
        w.section_cow(SectionKind::IVF_LIST_KEYS, key_bytes(self.list_keys()));
        for (kind, bytes) in [
            (SectionKind::IVF_CENTROIDS, key_bytes(self.centroids())),
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

impl Decode for IvfIndex {
    /// The keys are the file's own list-ordered copy: `resolve` is never called.
    fn decode(raw: &RawFile, _resolve: &mut KeyResolver<'_>) -> Result<Self> {
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

    /// The lists a permutation with offsets in order, finite keys and centroids.
    fn deep_check(&self, raw: &RawFile) -> Result<()> {
        self.validate().map_err(|reason| {
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
        })
    }
}

impl IvfIndex {
    /// Writes the index (centroids, lists and its list-ordered keys) to one self-contained
    /// file at `path`, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        save_inline(self, path.as_ref())
    }
}
