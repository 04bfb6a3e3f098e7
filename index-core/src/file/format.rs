//! The byte layout of qkindex files (docs/FORMAT.md): the 64-byte header, the section table,
//! section kinds, and the checksum. Fields are parsed with explicit little-endian reads; only
//! section payloads are cast (with `bytemuck`, after every bound and alignment check).
//!
//! ```text
//! offset  size  field
//!      0     8  magic "QKINDEX\0"
//!      8     4  format_version (3; versions 1 and 2 still load: see docs/FORMAT.md)
//!     12     4  file kind (0 keys, 1 attention, 2 flat, 3 hnsw, 4 ivf, 5 vamana)
//!     16     4  dtype of stored vectors (0 none, 1 f16, 2 f32, 3 i8 from version 2)
//!     20     4  d
//!     24     8  n
//!     32     4  section_count
//!     36     4  reserved (0)
//!     40     8  file_len
//!     48     8  table_checksum  (xxh3-64 of the section table)
//!     56     8  header_checksum (xxh3-64 of bytes 0..56)
//!     64  32·c  section table: kind u32, reserved u32, offset u64, len u64, checksum u64
//! ```

use crate::error::{Error, Result};
use crate::search::IndexKind;
use crate::store::Dtype;
use std::path::Path;

/// The first 8 bytes of every qkindex file.
pub const MAGIC: [u8; 8] = *b"QKINDEX\0";
/// The format version this crate writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 3;
/// The first format version whose files may hold int8 keys (dtype code 3).
pub const I8_SINCE_VERSION: u32 = 2;
/// The first format version whose int8 keys carry per-dimension offsets and ranges
/// ([`crate::metric::affine::Affine`]); version 2's are scaled per key only.
pub const I8_AFFINE_SINCE_VERSION: u32 = 3;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 64;
/// Bytes of one section table entry.
pub const ENTRY_LEN: usize = 32;
/// Alignment of every section's offset.
pub const ALIGN: u64 = 64;
/// The most sections a file may declare (a cap so that a bad count fails before any work).
pub const MAX_SECTIONS: u32 = 1024;

/// xxh3-64 of `bytes`: the checksum of headers, tables and sections.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// What a file holds (header field `kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// Only keys: the key file of a bundle, shared by the indexes of a GQA group.
    Keys,
    /// An index of the given kind.
    Index(IndexKind),
}

impl FileKind {
    /// The header code.
    pub fn code(self) -> u32 {
        match self {
            FileKind::Keys => 0,
            FileKind::Index(IndexKind::Attention) => 1,
            FileKind::Index(IndexKind::Flat) => 2,
            FileKind::Index(IndexKind::Hnsw) => 3,
            FileKind::Index(IndexKind::Ivf) => 4,
            FileKind::Index(IndexKind::Vamana) => 5,
        }
    }

    /// The kind of a header code.
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => FileKind::Keys,
            1 => FileKind::Index(IndexKind::Attention),
            2 => FileKind::Index(IndexKind::Flat),
            3 => FileKind::Index(IndexKind::Hnsw),
            4 => FileKind::Index(IndexKind::Ivf),
            5 => FileKind::Index(IndexKind::Vamana),
            _ => return None,
        })
    }

    /// Name for messages and `inspect`.
    pub fn name(self) -> &'static str {
        match self {
            FileKind::Keys => "keys",
            FileKind::Index(k) => k.name(),
        }
    }
}

/// Header code of a dtype (0 = no stored vectors).
pub fn dtype_code(dtype: Option<Dtype>) -> u32 {
    match dtype {
        None => 0,
        Some(Dtype::F16) => 1,
        Some(Dtype::F32) => 2,
        Some(Dtype::I8) => 3,
    }
}

fn dtype_from_code(code: u32) -> Option<Option<Dtype>> {
    match code {
        0 => Some(None),
        1 => Some(Some(Dtype::F16)),
        2 => Some(Some(Dtype::F32)),
        3 => Some(Some(Dtype::I8)),
        _ => None,
    }
}

/// A section kind (table field `kind`). Kinds with the top bit set are optional: a reader that
/// does not know one skips it; any other unknown kind is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SectionKind(pub u32);

impl SectionKind {
    /// `n × d` key rows in the header's dtype, row-major; int8: `d` f32 offsets and `d` f32
    /// ranges (from version 3), `n` f32 scales, then the `n × d` i8 codes.
    pub const KEYS: Self = Self(1);
    /// JSON naming the key file of a bundle index: `{"file", "checksum", "n", "d", "dtype"}`.
    pub const KEYS_REF: Self = Self(2);
    /// Build parameters and metadata, a UTF-8 JSON object.
    pub const PARAMS: Self = Self(3);
    /// `n + 1` u32 CSR offsets (level 0 of HNSW; the graph of attention and Vamana).
    pub const CSR_OFFSETS: Self = Self(4);
    /// u32 CSR neighbour ids, each `< n`.
    pub const CSR_NEIGHBORS: Self = Self(5);
    /// u32 entry points of graph searches (Vamana: the medoid), each `< n`.
    pub const ENTRY_POINTS: Self = Self(6);
    /// Reserved (not written by v1 writers): HNSW, one u8 level per node.
    pub const HNSW_LEVELS: Self = Self(16);
    /// HNSW levels `1..=L`: `P + 1` u32 CSR offsets over the `P` (level ≥ 1, node) pairs,
    /// ordered by level, then node id.
    pub const HNSW_UPPER_OFFSETS: Self = Self(17);
    /// HNSW levels `1..=L`: u32 neighbour ids of every pair's list.
    pub const HNSW_UPPER_NEIGHBORS: Self = Self(18);
    /// HNSW levels `1..=L`: the node id of each of the `P` pairs (increasing within a level).
    pub const HNSW_UPPER_NODES: Self = Self(19);
    /// HNSW levels `1..=L`: `L + 1` u32 positions; level `l`'s pairs are `[s[l-1], s[l])`.
    pub const HNSW_LEVEL_STARTS: Self = Self(20);
    /// IVF: `nlist × d` f32 centroids, row-major.
    pub const IVF_CENTROIDS: Self = Self(32);
    /// IVF: `nlist + 1` u32 list offsets into the list-order positions.
    pub const IVF_LIST_OFFSETS: Self = Self(33);
    /// IVF: `n` u32 key ids in list order (the id of the key at each position).
    pub const IVF_LIST_IDS: Self = Self(34);
    /// IVF: the `n × d` keys in list order (row `p` is key `ivf_list_ids[p]`), in the header
    /// dtype: the index's own copy, scanned in place.
    pub const IVF_LIST_KEYS: Self = Self(35);

    /// The name used in errors and `inspect`.
    pub fn name(self) -> String {
        match self {
            Self::KEYS => "keys".into(),
            Self::KEYS_REF => "keys_ref".into(),
            Self::PARAMS => "params".into(),
            Self::CSR_OFFSETS => "csr_offsets".into(),
            Self::CSR_NEIGHBORS => "csr_neighbors".into(),
            Self::ENTRY_POINTS => "entry_points".into(),
            Self::HNSW_LEVELS => "hnsw_levels".into(),
            Self::HNSW_UPPER_OFFSETS => "hnsw_upper_offsets".into(),
            Self::HNSW_UPPER_NEIGHBORS => "hnsw_upper_neighbors".into(),
            Self::HNSW_UPPER_NODES => "hnsw_upper_nodes".into(),
            Self::HNSW_LEVEL_STARTS => "hnsw_level_starts".into(),
            Self::IVF_CENTROIDS => "ivf_centroids".into(),
            Self::IVF_LIST_OFFSETS => "ivf_list_offsets".into(),
            Self::IVF_LIST_IDS => "ivf_list_ids".into(),
            Self::IVF_LIST_KEYS => "ivf_list_keys".into(),
            Self(k) => format!("section kind {k}"),
        }
    }

    /// True for kinds a reader may skip when it does not know them.
    pub fn is_optional(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }
}

/// The parsed fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub kind: FileKind,
    pub dtype: Option<Dtype>,
    pub d: u32,
    pub n: u64,
    pub section_count: u32,
    pub file_len: u64,
    pub table_checksum: u64,
    pub header_checksum: u64,
}

/// One section table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SectionEntry {
    pub kind: SectionKind,
    pub offset: u64,
    pub len: u64,
    pub checksum: u64,
}

impl SectionEntry {
    /// One past the last byte (checked against overflow when the table is parsed).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Rounds `x` up to a multiple of [`ALIGN`] (`None` on overflow).
pub fn align_up(x: u64) -> Option<u64> {
    x.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

impl Header {
    /// Serializes the header; the header checksum is computed here.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.code().to_le_bytes());
        b[16..20].copy_from_slice(&dtype_code(self.dtype).to_le_bytes());
        b[20..24].copy_from_slice(&self.d.to_le_bytes());
        b[24..32].copy_from_slice(&self.n.to_le_bytes());
        b[32..36].copy_from_slice(&self.section_count.to_le_bytes());
        b[40..48].copy_from_slice(&self.file_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.table_checksum.to_le_bytes());
        let c = checksum(&b[..56]);
        b[56..64].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Parses and checks the header at the start of `bytes` (the whole file): length, magic,
    /// version, header checksum, known kind and dtype, reserved zero, `n` and `d` in range.
    /// `file_len` is not compared with the file here (see [`parse_table`]).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self> {
        let bad = |reason: String| Error::format(path, "header", reason);
        let Some(b) = bytes.get(..HEADER_LEN) else {
            return Err(bad(format!(
                "file is {} bytes, shorter than the {HEADER_LEN}-byte header",
                bytes.len()
            )));
        };
        if b[0..8] != MAGIC {
            return Err(bad(format!(
                "not a qkindex file (magic {:?}, expected {:?})",
                String::from_utf8_lossy(&b[0..8]),
                String::from_utf8_lossy(&MAGIC)
            )));
        }
        let version = u32_at(b, 8);
        if version == 0 || version > FORMAT_VERSION {
            return Err(bad(format!(
                "format version {version} is not supported (this reader reads 1..={FORMAT_VERSION}; a newer qkindex wrote it?)"
            )));
        }
        let header_checksum = u64_at(b, 56);
        let computed = checksum(&b[..56]);
        if computed != header_checksum {
            return Err(bad(format!(
                "header checksum mismatch (stored {header_checksum:016x}, computed {computed:016x})"
            )));
        }
        let kind = FileKind::from_code(u32_at(b, 12))
            .ok_or_else(|| bad(format!("unknown file kind {}", u32_at(b, 12))))?;
        let dtype = dtype_from_code(u32_at(b, 16))
            .ok_or_else(|| bad(format!("unknown dtype code {}", u32_at(b, 16))))?;
        if dtype == Some(Dtype::I8) && version < I8_SINCE_VERSION {
            return Err(bad(format!(
                "dtype i8 in a version {version} file (int8 keys exist from version {I8_SINCE_VERSION})"
            )));
        }
        if u32_at(b, 36) != 0 {
            return Err(bad("reserved field is not zero".into()));
        }
        let (d, n) = (u32_at(b, 20), u64_at(b, 24));
        if d == 0 {
            return Err(bad("d is 0".into()));
        }
        if n == 0 || n > u64::from(u32::MAX) {
            return Err(bad(format!("n = {n} is outside 1..=2^32-1")));
        }
        let section_count = u32_at(b, 32);
        if section_count > MAX_SECTIONS {
            return Err(Error::format(
                path,
                "section table",
                format!("section count {section_count} exceeds the limit {MAX_SECTIONS}"),
            ));
        }
        Ok(Header {
            version,
            kind,
            dtype,
            d,
            n,
            section_count,
            file_len: u64_at(b, 40),
            table_checksum: u64_at(b, 48),
            header_checksum,
        })
    }

    /// One past the end of the section table.
    pub fn table_end(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.section_count) * ENTRY_LEN as u64
    }
}

/// Serializes section table entries.
pub fn table_to_bytes(entries: &[SectionEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_LEN);
    for e in entries {
        out.extend_from_slice(&e.kind.0.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
        out.extend_from_slice(&e.checksum.to_le_bytes());
    }
    out
}

/// Parses and checks the section table of a file whose header parsed: the table fits, the
/// file is as long as the header says (a shorter file names the first section it cuts), the
/// table checksum matches, and every section is known (or optional), unique, 64-byte aligned,
/// after the table, inside the file, sorted and non-overlapping, with the last one ending the
/// file.
pub fn parse_table(path: &Path, header: &Header, bytes: &[u8]) -> Result<Vec<SectionEntry>> {
    let table = |reason: String| Error::format(path, "section table", reason);
    let actual = bytes.len() as u64;
    let table_end = header.table_end();
    let Some(t) = bytes.get(HEADER_LEN..table_end as usize) else {
        return Err(table(format!(
            "table of {} sections ends at byte {table_end}, past the end of the file ({actual} bytes)",
            header.section_count
        )));
    };
    let entries: Vec<SectionEntry> = t
        .chunks_exact(ENTRY_LEN)
        .map(|e| SectionEntry {
            kind: SectionKind(u32_at(e, 0)),
            offset: u64_at(e, 8),
            len: u64_at(e, 16),
            checksum: u64_at(e, 24),
        })
        .collect();
    if actual != header.file_len {
        // Name the first section the truncation (or extension) cuts, when the table can be read.
        let cut = entries
            .iter()
            .find(|e| e.end() > actual)
            .map(|e| e.kind.name());
        let section = cut.unwrap_or_else(|| "header".into());
        return Err(Error::format(
            path,
            section,
            format!(
                "file is {actual} bytes but its header says {} (truncated or appended to)",
                header.file_len
            ),
        ));
    }
    let computed = checksum(t);
    if computed != header.table_checksum {
        return Err(table(format!(
            "table checksum mismatch (stored {:016x}, computed {computed:016x})",
            header.table_checksum
        )));
    }
    let mut prev_end = table_end;
    let mut seen = std::collections::HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        let name = e.kind.name();
        let sect = |reason: String| Error::format(path, name.clone(), reason);
        if u32_at(t, i * ENTRY_LEN + 4) != 0 {
            return Err(table(format!(
                "entry {i} ({name}): reserved field is not zero"
            )));
        }
        if !seen.insert(e.kind) {
            return Err(table(format!("section {name} appears twice")));
        }
        let known = matches!(
            e.kind,
            SectionKind::KEYS
                | SectionKind::KEYS_REF
                | SectionKind::PARAMS
                | SectionKind::CSR_OFFSETS
                | SectionKind::CSR_NEIGHBORS
                | SectionKind::ENTRY_POINTS
                | SectionKind::HNSW_LEVELS
                | SectionKind::HNSW_UPPER_OFFSETS
                | SectionKind::HNSW_UPPER_NEIGHBORS
                | SectionKind::HNSW_UPPER_NODES
                | SectionKind::HNSW_LEVEL_STARTS
                | SectionKind::IVF_CENTROIDS
                | SectionKind::IVF_LIST_OFFSETS
                | SectionKind::IVF_LIST_IDS
                | SectionKind::IVF_LIST_KEYS
        );
        if !known && !e.kind.is_optional() {
            return Err(table(format!(
                "entry {i}: unknown required section kind {}",
                e.kind.0
            )));
        }
        if !e.offset.is_multiple_of(ALIGN) {
            return Err(sect(format!(
                "offset {} is not {ALIGN}-byte aligned",
                e.offset
            )));
        }
        let end = e
            .offset
            .checked_add(e.len)
            .ok_or_else(|| sect(format!("offset {} + length {} overflows", e.offset, e.len)))?;
        if e.offset < table_end {
            return Err(table(format!(
                "section {name} starts at {} inside the table of {} sections (which ends at {table_end})",
                e.offset, header.section_count
            )));
        }
        if e.offset < prev_end {
            return Err(sect(format!(
                "starts at {} inside the previous section (which ends at {prev_end})",
                e.offset
            )));
        }
        if end > actual {
            return Err(sect(format!(
                "ends at byte {end}, past the end of the file ({actual} bytes)"
            )));
        }
        prev_end = end;
    }
    if prev_end != actual {
        return Err(table(format!(
            "sections end at byte {prev_end} but the file has {actual} bytes"
        )));
    }
    Ok(entries)
}

/// Recomputes every checksum of a file in place (sections whose range lies in the file, the
/// table, the header), leaving everything else as it is. For tools and tests that edit files
/// on purpose (the fuzz target uses it to reach the checks behind the checksums).
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER_LEN {
        return;
    }
    let count = (u32_at(bytes, 32) as usize).min(MAX_SECTIONS as usize);
    let table_end = (HEADER_LEN + count * ENTRY_LEN).min(bytes.len());
    let count = (table_end - HEADER_LEN) / ENTRY_LEN;
    for i in 0..count {
        let at = HEADER_LEN + i * ENTRY_LEN;
        let (offset, len) = (u64_at(bytes, at + 8), u64_at(bytes, at + 16));
        let Some(end) = offset.checked_add(len) else {
            continue;
        };
        if end <= bytes.len() as u64 {
            let c = checksum(&bytes[offset as usize..end as usize]);
            bytes[at + 24..at + 32].copy_from_slice(&c.to_le_bytes());
        }
    }
    let t = checksum(&bytes[HEADER_LEN..HEADER_LEN + count * ENTRY_LEN]);
    bytes[48..56].copy_from_slice(&t.to_le_bytes());
    let h = checksum(&bytes[..56]);
    bytes[56..64].copy_from_slice(&h.to_le_bytes());
}
