//! Reading files: [`RawFile`] maps a file (or copies caller bytes into an anonymous mapping),
//! checks the header and section table, and hands out typed, bounds-checked section views.

use super::format::{checksum, parse_table, Header, SectionEntry, SectionKind};
use crate::error::{Error, Result};
use crate::store::{Backing, Buf};
use bytemuck::Pod;
use memmap2::Mmap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A mapped qkindex file whose header and table passed every check.
#[derive(Clone, Debug)]
pub struct RawFile {
    path: PathBuf,
    backing: Arc<Backing>,
    header: Header,
    sections: Vec<SectionEntry>,
}

impl RawFile {
    /// Maps `path` read-only and checks its header and table (not the section checksums);
    /// with `resident`, reads it into anonymous memory instead ([`LoadOptions::resident`]).
    ///
    /// [`LoadOptions::resident`]: super::LoadOptions::resident
    pub fn open(path: &Path, resident: bool) -> Result<Self> {
        if cfg!(target_endian = "big") {
            return Err(Error::format(
                path,
                "header",
                "qkindex files are little-endian; this host is big-endian",
            ));
        }
        let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len < super::format::HEADER_LEN as u64 {
            return Err(short(path, len));
        }
        if resident {
            let len = usize::try_from(len).map_err(|_| short(path, len))?;
            let map = anon_copy(path, len, |buf| {
                std::io::Read::read_exact(&mut file, buf).map_err(|e| Error::io(path, e))
            })?;
            return Self::from_backing(path, Arc::new(Backing::new(map)));
        }
        // SAFETY: the mapping is read-only and private to this process's view of the file. It
        // is undefined behaviour only if the file is truncated or written in place while
        // mapped; qkindex never does that (writers replace files by rename, which leaves this
        // inode untouched), and docs/FORMAT.md tells other tools not to either. Every byte is
        // validated before it is interpreted, so arbitrary content is safe.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::from_backing(path, Arc::new(Backing::new(map)))
    }

    /// Checks bytes already in memory (copied into an anonymous mapping so that sections are
    /// aligned as in a mapped file); `path` only names them in errors.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        if bytes.len() < super::format::HEADER_LEN {
            return Err(short(path, bytes.len() as u64));
        }
        let map = anon_copy(path, bytes.len(), |buf| {
            buf.copy_from_slice(bytes);
            Ok(())
        })?;
        Self::from_backing(path, Arc::new(Backing::new(map)))
    }

    fn from_backing(path: &Path, backing: Arc<Backing>) -> Result<Self> {
        let bytes = backing.bytes();
        let header = Header::parse(path, bytes)?;
        let sections = parse_table(path, &header, bytes)?;
        Ok(RawFile {
            path: path.to_path_buf(),
            backing,
            header,
            sections,
        })
    }

    /// The file's path (as given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The section table.
    pub fn sections(&self) -> &[SectionEntry] {
        &self.sections
    }

    /// The entry of section `kind`, if present.
    pub fn entry(&self, kind: SectionKind) -> Option<&SectionEntry> {
        self.sections.iter().find(|e| e.kind == kind)
    }

    /// A [`Error::Format`] naming this file and `section`.
    pub fn error(&self, section: SectionKind, reason: impl Into<String>) -> Error {
        Error::format(&self.path, section.name(), reason)
    }

    /// The entry of a section the file must have.
    pub fn required(&self, kind: SectionKind) -> Result<&SectionEntry> {
        self.entry(kind).ok_or_else(|| {
            Error::format(
                &self.path,
                kind.name(),
                format!("missing (required in a {} file)", self.header.kind.name()),
            )
        })
    }

    /// The bytes of a section (its range was checked when the table was parsed).
    pub fn bytes(&self, e: &SectionEntry) -> &[u8] {
        self.backing
            .bytes()
            .get(e.offset as usize..e.end() as usize)
            .unwrap_or(&[])
    }

    /// Section `kind` as `count` values of `T`, borrowed from the mapping. Errors name the
    /// section when it is missing or its length is not `count × size_of::<T>()`.
    pub fn array<T: Pod>(&self, kind: SectionKind, count: u64) -> Result<Buf<T>> {
        let e = self.required(kind)?;
        let size = std::mem::size_of::<T>() as u64;
        let want = count.checked_mul(size).ok_or_else(|| {
            self.error(kind, format!("{count} values of {size} bytes overflow u64"))
        })?;
        if e.len != want {
            return Err(self.error(
                kind,
                format!(
                    "{} bytes, expected {want} ({count} values of {size} bytes)",
                    e.len
                ),
            ));
        }
        self.array_of(e)
    }

    /// Section `e` as values of `T`, however many it holds (its length must be a multiple of
    /// the size of `T`).
    pub fn array_of<T: Pod>(&self, e: &SectionEntry) -> Result<Buf<T>> {
        let size = std::mem::size_of::<T>() as u64;
        if !e.len.is_multiple_of(size) {
            return Err(self.error(
                e.kind,
                format!(
                    "{} bytes is not a whole number of {size}-byte values",
                    e.len
                ),
            ));
        }
        let count = usize::try_from(e.len / size)
            .map_err(|_| self.error(e.kind, "too large for this platform"))?;
        Buf::mapped(self.backing.clone(), e.offset as usize, count)
            .ok_or_else(|| self.error(e.kind, "range or alignment out of bounds"))
    }

    /// `count` values of `T` at byte `at` of section `e` (which must hold them), borrowed from
    /// the mapping: one part of a section that packs two arrays.
    pub fn array_at<T: Pod>(&self, e: &SectionEntry, at: u64, count: u64) -> Result<Buf<T>> {
        let size = std::mem::size_of::<T>() as u64;
        let end = count
            .checked_mul(size)
            .and_then(|b| b.checked_add(at))
            .filter(|&end| end <= e.len)
            .ok_or_else(|| {
                self.error(
                    e.kind,
                    format!(
                        "{count} values of {size} bytes at byte {at} do not fit in its {} bytes",
                        e.len
                    ),
                )
            })?;
        let count = usize::try_from(count)
            .map_err(|_| self.error(e.kind, "too large for this platform"))?;
        debug_assert!(end <= e.len);
        Buf::mapped(self.backing.clone(), (e.offset + at) as usize, count)
            .ok_or_else(|| self.error(e.kind, "range or alignment out of bounds"))
    }

    /// A JSON section parsed into `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self, kind: SectionKind) -> Result<T> {
        let e = self.required(kind)?;
        serde_json::from_slice(self.bytes(e))
            .map_err(|err| self.error(kind, format!("bad JSON: {err}")))
    }

    /// Checks every section checksum and that the padding between sections is zero. Reads the
    /// whole file.
    pub fn verify_checksums(&self) -> Result<()> {
        let all = self.backing.bytes();
        let mut pos = self.header.table_end() as usize;
        for e in &self.sections {
            let pad = all.get(pos..e.offset as usize).unwrap_or(&[]);
            if pad.iter().any(|&b| b != 0) {
                return Err(self.error(e.kind, "padding before the section is not zero"));
            }
            let computed = checksum(self.bytes(e));
            if computed != e.checksum {
                return Err(self.error(
                    e.kind,
                    format!(
                        "checksum mismatch (stored {:016x}, computed {computed:016x})",
                        e.checksum
                    ),
                ));
            }
            pos = e.end() as usize;
        }
        Ok(())
    }

    /// Bytes of the whole file.
    pub fn len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// True for an empty file (never: a valid file has at least a header).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn short(path: &Path, len: u64) -> Error {
    Error::format(
        path,
        "header",
        format!(
            "file is {len} bytes, shorter than the {}-byte header",
            super::format::HEADER_LEN
        ),
    )
}

/// A read-only anonymous mapping of `len` bytes written by `fill`, advised for transparent huge
/// pages where the kernel has them: a graph search reads keys and neighbour lists at random,
/// and with 4 KiB pages nearly every such read of a large index also misses the TLB.
fn anon_copy(path: &Path, len: usize, fill: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<Mmap> {
    let mut anon = memmap2::MmapMut::map_anon(len).map_err(|e| Error::io(path, e))?;
    // A hint: kernels without transparent huge pages refuse it, which changes nothing else.
    #[cfg(target_os = "linux")]
    let _ = anon.advise(memmap2::Advice::HugePage);
    fill(&mut anon)?;
    anon.make_read_only().map_err(|e| Error::io(path, e))
}
