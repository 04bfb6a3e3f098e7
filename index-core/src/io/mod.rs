//! Index files: versioned, checksummed, memory-mapped (docs/FORMAT.md).
//!
//! The layers under it: [`crate::file`] (header, table, reader, writer, the section codecs,
//! [`Persist`] and [`Decode`]), each kind's `file.rs` (its sections), and
//! [`crate::spec::AnyIndex`] (the dispatch on the header's kind). This module opens and checks
//! files and bundles:
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`load`], [`load_bytes`], [`load_keys`], [`verify`], [`inspect`], [`LoadOptions`] |
//! | `bundle.rs` | bundles: keys stored once per KV head, one index file per query head |
//!
//! Opening checks the header, the table, every bound, alignment and count, before any byte is
//! cast. By default ([`LoadOptions::default`]) it also checks every section checksum and scans
//! the graph (neighbour ids `< n`, offsets in order) and the keys (finite): a damaged file is
//! an [`Error::Format`] naming the path and the section. For huge files,
//! `LoadOptions { verify: false }` opens in O(1) (header and table only) and [`verify`] (or
//! [`AnyIndex`]'s file-level check) runs the rest later; until then a damaged section can give
//! poor results but no panic and no out-of-bounds read (graph accessors are total and searches
//! skip ids `≥ n`). A loaded index searches the mapped pages: nothing is copied (unless
//! [`LoadOptions::resident`] asks for a copy in huge pages).

pub mod bundle;

pub use crate::file::format;
pub use crate::file::format::{FileKind, SectionKind, FORMAT_VERSION};
pub use crate::file::persist::{key_bytes, Decode, KeyRef, KeysPlacement, Persist};
pub use crate::file::reader::RawFile;
pub use crate::file::writer::{write_atomic, FileWriter};
pub use crate::spec::AnyIndex;
pub use crate::store::{Backing, Buf, Mapped};

use crate::error::{Error, Result};
use crate::file::persist::{keys_from, KeyResolver};
use crate::store::KeyStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How files are opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Check every section checksum, the zero padding, the graph (ids `< n`, offsets in order)
    /// and the keys (finite) on open: reads the whole file. `false` checks only the header, the
    /// table and O(1) facts, so opening takes the same time at any size; call [`verify`] later.
    pub verify: bool,
    /// Read files into anonymous memory (advised for transparent huge pages) instead of
    /// mapping them. Costs the files' size in RAM up front; in exchange, random reads — a graph
    /// search's keys and neighbour lists — hit 2 MiB pages instead of missing the TLB on most
    /// reads of a large index (a beam search over 512K keys spent about 20 % less time per
    /// visited key, `docs/BENCHMARKS.md` §3). The default maps files (opening copies nothing).
    pub resident: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            verify: true,
            resident: false,
        }
    }
}

impl LoadOptions {
    /// Options that skip the full-file checks (see [`LoadOptions::verify`]).
    pub fn no_verify() -> Self {
        LoadOptions {
            verify: false,
            ..Self::default()
        }
    }

    /// These options with [`LoadOptions::resident`] set.
    pub fn resident(self) -> Self {
        LoadOptions {
            resident: true,
            ..self
        }
    }
}

/// Opens the index file at `path` by mapping it; its searches read the mapping (no copy).
/// An index file of a bundle finds its key file next to it (and checks the key file's
/// checksum against the reference).
///
/// Errors: [`Error::Io`] when the file cannot be read, [`Error::Format`] (naming the path and
/// the section) for anything wrong in it.
pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<AnyIndex> {
    let raw = RawFile::open(path.as_ref(), opts.resident)?;
    load_raw(&raw, opts, &mut |raw, r| resolve_beside(raw, r, opts))
}

/// [`load`] from bytes in memory (copied once into an anonymous mapping); `name` names them in
/// errors. Indexes whose keys are in a separate file cannot be loaded this way.
pub fn load_bytes(bytes: &[u8], name: impl AsRef<Path>, opts: &LoadOptions) -> Result<AnyIndex> {
    let raw = RawFile::from_bytes(name.as_ref(), bytes)?;
    load_raw(&raw, opts, &mut |raw, _| {
        Err(raw.error(
            SectionKind::KEYS_REF,
            "keys are in a separate file, which an in-memory load cannot open",
        ))
    })
}

/// Opens a key file (the keys of one KV head in a bundle), mapped.
pub fn load_keys(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Arc<KeyStore>> {
    let raw = RawFile::open(path.as_ref(), opts.resident)?;
    keys_of_file(&raw, opts)
}

fn keys_of_file(raw: &RawFile, opts: &LoadOptions) -> Result<Arc<KeyStore>> {
    if raw.header().kind != FileKind::Keys {
        return Err(Error::format(
            raw.path(),
            "header",
            format!("a {} index file, not a key file", raw.header().kind.name()),
        ));
    }
    if opts.verify {
        raw.verify_checksums()?;
    }
    let keys = keys_from(raw)?;
    if opts.verify {
        if let Some(row) = keys.first_non_finite_row() {
            return Err(raw.error(
                SectionKind::KEYS,
                format!("key row {row} holds NaN or infinity"),
            ));
        }
    }
    Ok(keys)
}

fn load_raw(raw: &RawFile, opts: &LoadOptions, resolve: &mut KeyResolver<'_>) -> Result<AnyIndex> {
    if opts.verify {
        raw.verify_checksums()?;
    }
    crate::spec::any::decode(raw, opts.verify, resolve)
}

/// Opens the key file a reference names, next to the index file, and checks its checksum.
fn resolve_beside(raw: &RawFile, r: &KeyRef, opts: &LoadOptions) -> Result<Arc<KeyStore>> {
    let path = key_path(raw, r)?;
    let keys_raw = RawFile::open(&path, opts.resident)?;
    check_key_ref(raw, r, &keys_raw)?;
    keys_of_file(&keys_raw, opts)
}

/// The path of the key file `r` names, which must be a plain file name in the index file's
/// directory (no separators, no `..`).
pub(crate) fn key_path(raw: &RawFile, r: &KeyRef) -> Result<PathBuf> {
    let plain = Path::new(&r.file)
        .file_name()
        .is_some_and(|f| f == std::ffi::OsStr::new(&r.file));
    if !plain || r.file == ".." || r.file == "." {
        return Err(raw.error(
            SectionKind::KEYS_REF,
            format!("key file name {:?} is not a plain file name", r.file),
        ));
    }
    let dir = raw.path().parent().unwrap_or(Path::new("."));
    Ok(dir.join(&r.file))
}

/// Fails unless `keys_raw`'s header checksum is the one `r` records.
pub(crate) fn check_key_ref(raw: &RawFile, r: &KeyRef, keys_raw: &RawFile) -> Result<()> {
    let actual = format!("{:016x}", keys_raw.header().header_checksum);
    if actual != r.checksum {
        return Err(raw.error(
            SectionKind::KEYS_REF,
            format!(
                "key file {} has checksum {actual}, the index was built for {}",
                r.file, r.checksum
            ),
        ));
    }
    Ok(())
}

/// Fully checks a file (index or key file) or a bundle directory: header, table, every
/// section checksum, padding, graph ids and offsets, finite keys, key references. Returns what
/// was checked.
pub fn verify(path: impl AsRef<Path>) -> Result<VerifyReport> {
    let path = path.as_ref();
    if path.is_dir() {
        return bundle::verify_bundle(path);
    }
    let raw = RawFile::open(path, false)?;
    let opts = LoadOptions::default();
    if raw.header().kind == FileKind::Keys {
        keys_of_file(&raw, &opts)?;
    } else {
        load_raw(&raw, &opts, &mut |raw, r| resolve_beside(raw, r, &opts))?;
    }
    Ok(VerifyReport {
        files: 1,
        bytes: raw.len(),
    })
}

/// What [`verify`] checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Files checked.
    pub files: usize,
    /// Bytes read and checksummed.
    pub bytes: u64,
}

/// One section as [`inspect`] reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SectionInfo {
    pub kind: String,
    pub offset: u64,
    pub len: u64,
    pub checksum: String,
}

/// The header, sections and parameters of one file, without reading its sections' data.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FileInfo {
    pub path: PathBuf,
    pub format_version: u32,
    pub kind: String,
    pub dtype: Option<String>,
    pub n: u64,
    pub d: u32,
    pub file_len: u64,
    pub header_checksum: String,
    pub sections: Vec<SectionInfo>,
    /// The PARAMS section, parsed (when present and valid JSON).
    pub params: Option<serde_json::Value>,
    /// The KEYS_REF section, parsed (bundle index files).
    pub keys_ref: Option<serde_json::Value>,
}

/// What [`inspect`] found: a file, or a bundle with its manifest and files.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Inspection {
    File(FileInfo),
    Bundle {
        path: PathBuf,
        manifest: serde_json::Value,
        files: Vec<FileInfo>,
    },
}

/// Reads the header, table and small JSON sections of a file, or the manifest and every file
/// of a bundle directory. Does not check section checksums (see [`verify`]).
pub fn inspect(path: impl AsRef<Path>) -> Result<Inspection> {
    let path = path.as_ref();
    if path.is_dir() {
        return bundle::inspect_bundle(path);
    }
    inspect_file(path).map(Inspection::File)
}

pub(crate) fn inspect_file(path: &Path) -> Result<FileInfo> {
    let raw = RawFile::open(path, false)?;
    let h = raw.header();
    let json = |kind: SectionKind| -> Option<serde_json::Value> {
        raw.entry(kind).is_some().then(|| raw.json(kind).ok())?
    };
    Ok(FileInfo {
        path: path.to_path_buf(),
        format_version: h.version,
        kind: h.kind.name().into(),
        dtype: h.dtype.map(|d| d.numpy_name().to_string()),
        n: h.n,
        d: h.d,
        file_len: h.file_len,
        header_checksum: format!("{:016x}", h.header_checksum),
        sections: raw
            .sections()
            .iter()
            .map(|e| SectionInfo {
                kind: e.kind.name(),
                offset: e.offset,
                len: e.len,
                checksum: format!("{:016x}", e.checksum),
            })
            .collect(),
        params: json(SectionKind::PARAMS),
        keys_ref: json(SectionKind::KEYS_REF),
    })
}
