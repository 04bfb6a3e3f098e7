//! Writing files: [`FileWriter`] lays sections out (64-byte aligned, zero padding, checksums
//! computed from the caller's slices without copying them) and [`write_atomic`] replaces a file
//! so that a crash or an error at any point leaves the old file as it was.

use super::format::{
    align_up, checksum, table_to_bytes, FileKind, Header, SectionEntry, SectionKind,
    FORMAT_VERSION, HEADER_LEN,
};
use crate::error::{Error, Result};
use crate::store::Dtype;
use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

/// A file being assembled: header fields and sections in the order they will be written.
#[derive(Debug)]
pub struct FileWriter<'a> {
    kind: FileKind,
    dtype: Option<Dtype>,
    n: u64,
    d: u32,
    sections: Vec<(SectionKind, Cow<'a, [u8]>)>,
}

impl<'a> FileWriter<'a> {
    /// A file of `kind` over `n` vectors of dimension `d` (`dtype`: of the stored vectors, if
    /// the file stores any).
    pub fn new(kind: FileKind, dtype: Option<Dtype>, n: usize, d: usize) -> Result<Self> {
        let d = u32::try_from(d).map_err(|_| Error::invalid_param("d", d, "above u32::MAX"))?;
        Ok(FileWriter {
            kind,
            dtype,
            n: n as u64,
            d,
            sections: Vec::new(),
        })
    }

    /// Adds a section that borrows `bytes` (for example `bytemuck::cast_slice` of key rows).
    pub fn section(&mut self, kind: SectionKind, bytes: &'a [u8]) -> &mut Self {
        self.sections.push((kind, Cow::Borrowed(bytes)));
        self
    }

    /// Adds a section whose bytes are borrowed or owned ([`super::key_bytes`]).
    pub fn section_cow(&mut self, kind: SectionKind, bytes: Cow<'a, [u8]>) -> &mut Self {
        self.sections.push((kind, bytes));
        self
    }

    /// Adds a section that owns its bytes (JSON parameters, small arrays).
    pub fn section_owned(&mut self, kind: SectionKind, bytes: Vec<u8>) -> &mut Self {
        self.sections.push((kind, Cow::Owned(bytes)));
        self
    }

    /// Header and table of the laid-out file (checksums of every section computed here).
    fn layout(&self) -> Result<(Header, Vec<SectionEntry>)> {
        let count = u32::try_from(self.sections.len())
            .map_err(|_| Error::invalid_param("sections", self.sections.len(), "too many"))?;
        let overflow = || Error::invalid_param("file", "size", "overflows u64");
        let mut at = align_up(HEADER_LEN as u64 + u64::from(count) * 32).ok_or_else(overflow)?;
        let mut entries = Vec::with_capacity(self.sections.len());
        let mut end = at;
        for (kind, bytes) in &self.sections {
            let len = bytes.len() as u64;
            entries.push(SectionEntry {
                kind: *kind,
                offset: at,
                len,
                checksum: checksum(bytes),
            });
            end = at.checked_add(len).ok_or_else(overflow)?;
            at = align_up(end).ok_or_else(overflow)?;
        }
        let table = table_to_bytes(&entries);
        let header = Header {
            version: FORMAT_VERSION,
            kind: self.kind,
            dtype: self.dtype,
            d: self.d,
            n: self.n,
            section_count: count,
            file_len: if entries.is_empty() {
                HEADER_LEN as u64 + table.len() as u64
            } else {
                end
            },
            table_checksum: checksum(&table),
            header_checksum: 0,
        };
        Ok((header, entries))
    }

    /// Writes the whole file to `out` (a stream; nothing is seeked).
    pub fn write_to(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let (header, entries) = self.layout().map_err(std::io::Error::other)?;
        out.write_all(&header.to_bytes())?;
        let table = table_to_bytes(&entries);
        out.write_all(&table)?;
        let mut pos = (HEADER_LEN + table.len()) as u64;
        let zeros = [0u8; 64];
        for (e, (_, bytes)) in entries.iter().zip(&self.sections) {
            out.write_all(&zeros[..(e.offset - pos) as usize])?;
            out.write_all(bytes)?;
            pos = e.end();
        }
        Ok(())
    }

    /// The header checksum the file will carry (bundle indexes name their key file by it).
    pub fn header_checksum(&self) -> Result<u64> {
        let (header, _) = self.layout()?;
        let b = header.to_bytes();
        let mut c = [0u8; 8];
        c.copy_from_slice(&b[56..64]);
        Ok(u64::from_le_bytes(c))
    }

    /// Writes the file to `path` atomically ([`write_atomic`]).
    pub fn write(&self, path: &Path) -> Result<()> {
        write_atomic(path, |out| self.write_to(out))
    }
}

/// Replaces `path` with what `fill` writes, atomically: the bytes go to a temporary file in the
/// same directory, which is flushed and fsynced, renamed over `path`, and then the directory is
/// fsynced. If `fill` fails (or the process dies) before the rename, `path` keeps its old
/// content; on an error the temporary file is removed.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid_param("path", path.display(), "has no file name"))?;
    let io = |e| Error::io(path, e);
    let prefix = format!(".{}.", name.to_string_lossy());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    // Temporary files are created 0600; index files are shared between processes and users,
    // so ask for 0666 and let the umask decide, as a plain `File::create` would.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir).map_err(|e| Error::io(dir, e))?;
    {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
        fill(&mut w).map_err(io)?;
        w.flush().map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    // The rename is durable only once the directory entry is on disk.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    Ok(())
}
