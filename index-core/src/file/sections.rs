//! Section encoders and decoders shared by the kinds (each kind's `file.rs`):
//! the PARAMS JSON, CSR graphs, entry points, key arrays and the errors of the graph scan.

use super::format::{SectionKind, I8_AFFINE_SINCE_VERSION};
use super::reader::RawFile;
use super::writer::FileWriter;
use crate::error::{Error, Result};
use crate::graph::Csr;
use crate::metric::affine::Affine;
use crate::store::{Dtype, KeyStore};
use half::f16;
use std::borrow::Cow;

pub(crate) fn json_bytes<T: serde::Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(v)
        .map_err(|e| Error::invalid_param("params", "json", format!("cannot serialize: {e}")))
}

/// The PARAMS section of an index kind: `{"index": name, "params": {...}}` plus, for IVF, the
/// number of lists the build chose.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Section<P> {
    pub index: String,
    pub params: P,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nlist: Option<usize>,
}

/// The PARAMS section's bytes.
pub(crate) fn params_json<P: serde::Serialize>(
    index: &str,
    params: &P,
    nlist: Option<usize>,
) -> Result<Vec<u8>> {
    json_bytes(&Section {
        index: index.into(),
        params,
        nlist,
    })
}

/// The PARAMS section, checked to name `index`.
pub(crate) fn params_of<P: serde::de::DeserializeOwned>(
    raw: &RawFile,
    index: &str,
) -> Result<Section<P>> {
    let p: Section<P> = raw.json(SectionKind::PARAMS)?;
    if p.index != index {
        return Err(raw.error(
            SectionKind::PARAMS,
            format!("names index {:?} but the header says {index}", p.index),
        ));
    }
    Ok(p)
}

/// Adds a CSR graph's `csr_offsets` and `csr_neighbors`: borrowed when the index holds the CSR,
/// owned when it was assembled for the file.
pub(crate) fn add_csr<'a>(w: &mut FileWriter<'a>, g: Cow<'a, Csr>) {
    match g {
        Cow::Borrowed(g) => {
            w.section(SectionKind::CSR_OFFSETS, bytemuck::cast_slice(g.offsets()));
            w.section(
                SectionKind::CSR_NEIGHBORS,
                bytemuck::cast_slice(g.neighbor_array()),
            );
        }
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
}

/// The `csr_*` graph as a mapped CSR, after the O(1) checks: `n + 1` offsets, `offsets[0] = 0`,
/// `offsets[n]` = the number of neighbour ids.
pub(crate) fn mapped_csr(raw: &RawFile) -> Result<Csr> {
    let n = raw.header().n;
    let offsets = raw.array::<u32>(SectionKind::CSR_OFFSETS, n + 1)?;
    let neighbors = raw.array_of::<u32>(raw.required(SectionKind::CSR_NEIGHBORS)?)?;
    check_ends(
        raw,
        SectionKind::CSR_OFFSETS,
        offsets.as_slice(),
        neighbors.as_slice().len(),
    )?;
    Ok(Csr::from_bufs_unchecked(offsets, neighbors))
}

/// `offsets[0] = 0` and the last offset equals `total`.
pub(crate) fn check_ends(
    raw: &RawFile,
    kind: SectionKind,
    offsets: &[u32],
    total: usize,
) -> Result<()> {
    if offsets.first() != Some(&0) {
        return Err(raw.error(kind, "offsets[0] is not 0"));
    }
    let last = offsets.last().map(|&x| x as usize);
    if last != Some(total) {
        return Err(raw.error(
            kind,
            format!("offsets end at {last:?} but there are {total} ids"),
        ));
    }
    Ok(())
}

/// Every entry point is below the header's `n`.
pub(crate) fn check_entries(raw: &RawFile, entries: &[u32]) -> Result<()> {
    let n = raw.header().n;
    if let Some(bad) = entries.iter().find(|&&e| u64::from(e) >= n) {
        return Err(raw.error(
            SectionKind::ENTRY_POINTS,
            format!("entry point {bad} is not below n = {n}"),
        ));
    }
    Ok(())
}

/// The header's `n × d` keys of its dtype in section `kind`, borrowed from the mapping.
pub(crate) fn stored_keys(raw: &RawFile, kind: SectionKind) -> Result<KeyStore> {
    let h = raw.header();
    let dtype = h.dtype.ok_or_else(|| {
        Error::format(raw.path(), "header", "dtype is 0 but the file stores keys")
    })?;
    let count =
        h.n.checked_mul(u64::from(h.d))
            .ok_or_else(|| raw.error(kind, format!("n × d = {} × {} overflows", h.n, h.d)))?;
    let d = h.d as usize;
    match dtype {
        Dtype::F16 => KeyStore::from_buf_f16(raw.array::<f16>(kind, count)?, d),
        Dtype::F32 => KeyStore::from_buf_f32(raw.array::<f32>(kind, count)?, d),
        Dtype::I8 => {
            // From version 3: `d` f32 offsets and `d` f32 ranges; then `n` f32 scales and
            // `n × d` codes (every f32 part starts 4-byte aligned).
            let e = raw.required(kind)?;
            let affine_len = if h.version >= I8_AFFINE_SINCE_VERSION {
                8 * u64::from(h.d)
            } else {
                0
            };
            let want = count
                .checked_add(4 * h.n)
                .and_then(|w| w.checked_add(affine_len));
            if want != Some(e.len) {
                return Err(raw.error(
                    kind,
                    format!(
                        "{} bytes, expected {} ({} bytes of offsets and ranges, n = {} scales \
                         of 4 bytes and n × d codes)",
                        e.len,
                        want.map_or("an overflow".into(), |w| w.to_string()),
                        affine_len,
                        h.n
                    ),
                ));
            }
            let affine = if affine_len > 0 {
                let offset = raw.array_at::<f32>(e, 0, u64::from(h.d))?;
                let range = raw.array_at::<f32>(e, 4 * u64::from(h.d), u64::from(h.d))?;
                Affine::from_parts(offset.as_slice().to_vec(), range.as_slice().to_vec())
                    .map_err(|err| raw.error(kind, err.to_string()))?
            } else {
                Affine::identity(d)
            };
            let scales = raw.array_at::<f32>(e, affine_len, h.n)?;
            let codes = raw.array_at::<i8>(e, affine_len + 4 * h.n, count)?;
            KeyStore::from_bufs_i8(codes, scales, affine, d)
        }
    }
    .map_err(|e| raw.error(kind, e.to_string()))
}

/// A failed scan of the `csr_*` graph, blamed on `csr_neighbors` when it names a neighbour id
/// and on `csr_offsets` otherwise.
pub(crate) fn graph_error(raw: &RawFile, reason: String) -> Error {
    let section = if reason.contains("neighbour id") {
        SectionKind::CSR_NEIGHBORS
    } else {
        SectionKind::CSR_OFFSETS
    };
    raw.error(section, reason)
}

/// Level 0 (or Vamana's graph) and its one entry point.
pub(crate) fn add_graph<'a>(w: &mut FileWriter<'a>, g: &'a Csr, entry: u32) {
    add_csr(w, Cow::Borrowed(g));
    w.section_owned(SectionKind::ENTRY_POINTS, entry.to_le_bytes().to_vec());
}

/// The one entry point (HNSW's top-level entry, Vamana's medoid), checked `< n`.
pub(crate) fn single_entry(raw: &RawFile) -> Result<u32> {
    let e = raw.array::<u32>(SectionKind::ENTRY_POINTS, 1)?;
    let entry = e.as_slice().first().copied().unwrap_or(u32::MAX);
    check_entries(raw, &[entry])?;
    Ok(entry)
}
