//! Bundles (DESIGN.md §4): a directory with `manifest.json`, one key file per (layer, KV head)
//! and one index file per (layer, query head) that names its key file (relative name +
//! checksum), so the query heads of a GQA group share one copy of the keys on disk and, once
//! opened, in memory (one mapping, one `Arc<KeyStore>`).
//!
//! The manifest is written last (atomically), so a bundle whose build stopped midway has no
//! manifest, or the previous one.

use super::{check_key_ref, inspect_file, key_path, AnyIndex, FileKind, Inspection, LoadOptions};
use super::{SectionKind, VerifyReport};
use crate::error::{Error, Result};
use crate::file::persist::{KeyRef, KeysPlacement, Persist};
use crate::file::reader::RawFile;
use crate::file::sections::json_bytes;
use crate::file::writer::{write_atomic, FileWriter};
use crate::store::KeyStore;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The `format` field of a bundle manifest.
pub const BUNDLE_FORMAT: &str = "qkindex-bundle/1";
/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";

/// One key file of a bundle.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyFileEntry {
    pub layer: usize,
    pub kv_head: usize,
    pub file: String,
    /// Header checksum of the key file (hex).
    pub checksum: String,
}

/// One index file of a bundle.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexFileEntry {
    pub layer: usize,
    /// Query head.
    pub head: usize,
    pub kv_head: usize,
    /// Index kind name.
    pub kind: String,
    pub file: String,
    /// The key file it reads.
    pub keys: String,
}

/// `manifest.json` of a bundle.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub format: String,
    pub keys: Vec<KeyFileEntry>,
    pub indexes: Vec<IndexFileEntry>,
    /// Free-form metadata (the dump it came from, build settings).
    #[serde(default)]
    pub meta: serde_json::Value,
}

/// Writes a bundle: key files first, then index files, then the manifest.
#[derive(Debug)]
pub struct BundleWriter {
    dir: PathBuf,
    keys: Vec<KeyFileEntry>,
    indexes: Vec<IndexFileEntry>,
}

impl BundleWriter {
    /// Starts a bundle in `dir` (created if missing).
    pub fn new(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(BundleWriter {
            dir,
            keys: Vec::new(),
            indexes: Vec::new(),
        })
    }

    /// Writes the key file of (`layer`, `kv_head`) and returns the reference index files use.
    pub fn write_keys(&mut self, layer: usize, kv_head: usize, keys: &KeyStore) -> Result<KeyRef> {
        let file = format!("keys-L{layer:02}-kv{kv_head}.qki");
        let mut w = FileWriter::new(FileKind::Keys, Some(keys.dtype()), keys.len(), keys.dim())?;
        w.section_cow(SectionKind::KEYS, super::key_bytes(keys));
        w.section_owned(
            SectionKind::PARAMS,
            json_bytes(&serde_json::json!({"layer": layer, "kv_head": kv_head}))?,
        );
        let checksum = format!("{:016x}", w.header_checksum()?);
        w.write(&self.dir.join(&file))?;
        self.keys.retain(|k| k.file != file);
        self.keys.push(KeyFileEntry {
            layer,
            kv_head,
            file: file.clone(),
            checksum: checksum.clone(),
        });
        Ok(KeyRef {
            file,
            checksum,
            n: keys.len() as u64,
            d: keys.dim() as u64,
            dtype: keys.dtype(),
        })
    }

    /// Writes the index of query head `head` of `layer`, whose keys are the key file `keys`
    /// (from [`BundleWriter::write_keys`]; the index's key store must hold those keys).
    pub fn write_index(
        &mut self,
        layer: usize,
        head: usize,
        kv_head: usize,
        index: &dyn Persist,
        keys: &KeyRef,
    ) -> Result<()> {
        let store = index.key_store();
        if store.len() as u64 != keys.n
            || store.dim() as u64 != keys.d
            || store.dtype() != keys.dtype
        {
            return Err(Error::invalid_param(
                "keys",
                &keys.file,
                "the index's keys differ in shape or dtype from this key file",
            ));
        }
        let kind = index.file_kind().name().to_string();
        let file = format!("index-L{layer:02}-h{head}.qki");
        index
            .writer(KeysPlacement::Ref(keys))?
            .write(&self.dir.join(&file))?;
        self.indexes.retain(|i| i.file != file);
        self.indexes.push(IndexFileEntry {
            layer,
            head,
            kv_head,
            kind,
            file,
            keys: keys.file.clone(),
        });
        Ok(())
    }

    /// Writes `manifest.json` (atomically) with `meta`; the bundle is complete.
    pub fn finish(self, meta: serde_json::Value) -> Result<PathBuf> {
        let manifest = Manifest {
            format: BUNDLE_FORMAT.into(),
            keys: self.keys,
            indexes: self.indexes,
            meta,
        };
        let bytes = json_bytes(&manifest)?;
        write_atomic(&self.dir.join(MANIFEST), |w| w.write_all(&bytes))?;
        Ok(self.dir)
    }
}

/// An opened bundle: every index, with the key files mapped once and shared.
#[derive(Debug)]
pub struct Bundle {
    dir: PathBuf,
    manifest: Manifest,
    indexes: Vec<(IndexFileEntry, AnyIndex)>,
    bytes: u64,
}

impl Bundle {
    /// Opens every file of the bundle in `dir` (mapped; with `opts.verify`, fully checked).
    pub fn open(dir: impl AsRef<Path>, opts: &LoadOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let manifest = read_manifest(&dir)?;
        let mut bytes = 0u64;
        let mut keys: HashMap<String, (RawFile, Arc<KeyStore>)> = HashMap::new();
        for k in &manifest.keys {
            let path = plain_child(&dir, &k.file)?;
            let raw = RawFile::open(&path, opts.resident)?;
            let actual = format!("{:016x}", raw.header().header_checksum);
            if actual != k.checksum {
                return Err(Error::format(
                    dir.join(MANIFEST),
                    "keys",
                    format!(
                        "key file {} has checksum {actual}, the manifest records {}",
                        k.file, k.checksum
                    ),
                ));
            }
            let store = super::keys_of_file(&raw, opts)?;
            bytes += raw.len();
            keys.insert(k.file.clone(), (raw, store));
        }
        let mut indexes = Vec::with_capacity(manifest.indexes.len());
        for e in &manifest.indexes {
            let path = plain_child(&dir, &e.file)?;
            let raw = RawFile::open(&path, opts.resident)?;
            let index = super::load_raw(&raw, opts, &mut |raw, r| {
                // Only key files the manifest lists, opened once above.
                key_path(raw, r)?;
                let (keys_raw, store) = keys.get(&r.file).ok_or_else(|| {
                    raw.error(
                        SectionKind::KEYS_REF,
                        format!("key file {} is not listed in the manifest", r.file),
                    )
                })?;
                check_key_ref(raw, r, keys_raw)?;
                Ok(store.clone())
            })?;
            bytes += raw.len();
            indexes.push((e.clone(), index));
        }
        Ok(Bundle {
            dir,
            manifest,
            indexes,
            bytes,
        })
    }

    /// The bundle directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The index of query head `head` of `layer`.
    pub fn get(&self, layer: usize, head: usize) -> Option<&AnyIndex> {
        self.indexes
            .iter()
            .find(|(e, _)| e.layer == layer && e.head == head)
            .map(|(_, i)| i)
    }

    /// Every index with its manifest entry.
    pub fn indexes(&self) -> impl Iterator<Item = (&IndexFileEntry, &AnyIndex)> {
        self.indexes.iter().map(|(e, i)| (e, i))
    }

    /// Bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let m: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::format(&path, "manifest", format!("bad JSON: {e}")))?;
    if m.format != BUNDLE_FORMAT {
        return Err(Error::format(
            &path,
            "manifest",
            format!("format {:?} is not {BUNDLE_FORMAT:?}", m.format),
        ));
    }
    Ok(m)
}

/// `dir/name` for a plain file name (no separators, no `..`).
fn plain_child(dir: &Path, name: &str) -> Result<PathBuf> {
    let plain = Path::new(name)
        .file_name()
        .is_some_and(|f| f == std::ffi::OsStr::new(name));
    if !plain || name == ".." {
        return Err(Error::format(
            dir.join(MANIFEST),
            "manifest",
            format!("{name:?} is not a plain file name"),
        ));
    }
    Ok(dir.join(name))
}

pub(crate) fn verify_bundle(dir: &Path) -> Result<VerifyReport> {
    let b = Bundle::open(dir, &LoadOptions::default())?;
    Ok(VerifyReport {
        files: b.manifest.keys.len() + b.manifest.indexes.len() + 1,
        bytes: b.bytes,
    })
}

pub(crate) fn inspect_bundle(dir: &Path) -> Result<Inspection> {
    let m = read_manifest(dir)?;
    let manifest = serde_json::to_value(&m)
        .map_err(|e| Error::format(dir.join(MANIFEST), "manifest", e.to_string()))?;
    let mut files = Vec::new();
    for name in m
        .keys
        .iter()
        .map(|k| &k.file)
        .chain(m.indexes.iter().map(|i| &i.file))
    {
        files.push(inspect_file(&plain_child(dir, name)?)?);
    }
    Ok(Inspection::Bundle {
        path: dir.to_path_buf(),
        manifest,
        files,
    })
}
