//! Minimal `.npy` (format 1.0) support for float16 arrays, which `ndarray-npy` cannot write:
//! a writer for the dump files (float16 or float32) and a reader (f16 or f32, C order) for tests and checks.
//! Integer arrays (token ids) go through `ndarray-npy`.

use std::io::{BufWriter, Write};
use std::path::Path;

use half::f16;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Errors of reading a `.npy` file.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Format { path: String, reason: String },
}

/// The header bytes (magic, version 1.0, length, dict padded to a multiple of 64 bytes).
pub fn npy_header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_str = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_str}, }}");
    let unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.div_ceil(64) * 64 - unpadded));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Storage type of written float arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatDtype {
    F16,
    F32,
}

/// Writes a C-order float array of `shape` from f32 values, stored as `dtype` (`data.len()` must
/// be the product of `shape`).
pub fn write_npy_float(
    path: &Path,
    shape: &[usize],
    data: &[f32],
    dtype: FloatDtype,
) -> std::io::Result<()> {
    if shape.iter().product::<usize>() != data.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("shape {shape:?} does not hold {} values", data.len()),
        ));
    }
    let descr = match dtype {
        FloatDtype::F16 => "<f2",
        FloatDtype::F32 => "<f4",
    };
    let mut w = BufWriter::new(std::fs::File::create(path)?);
    w.write_all(&npy_header(descr, shape))?;
    for chunk in data.chunks(1 << 16) {
        let bytes: Vec<u8> = match dtype {
            FloatDtype::F16 => chunk
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
            FloatDtype::F32 => chunk.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        w.write_all(&bytes)?;
    }
    w.flush()
}

/// Reads a C-order `<f2` or `<f4` array as f32: `(shape, values)`.
pub fn read_npy_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>), NpyError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io {
        path: p.clone(),
        source,
    })?;
    let bad = |reason: &str| NpyError::Format {
        path: p.clone(),
        reason: reason.into(),
    };
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("not a .npy file"));
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(bad("unsupported .npy version")),
    };
    let header = bytes
        .get(hstart..hstart + hlen)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| bad("truncated header"))?;
    if header.contains("'fortran_order': True") {
        return Err(bad("Fortran order is not supported"));
    }
    let width = if header.contains("'<f2'") {
        2
    } else if header.contains("'<f4'") {
        4
    } else {
        return Err(bad("dtype is not <f2 or <f4"));
    };
    let shape_src = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split('(').nth(1))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let shape = shape_src
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad("bad shape")))
        .collect::<Result<Vec<_>, _>>()?;
    let n: usize = shape.iter().product();
    let data = bytes
        .get(hstart + hlen..)
        .filter(|d| d.len() == n * width)
        .ok_or_else(|| bad("data length does not match the shape"))?;
    let values = if width == 2 {
        data.chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()
    } else {
        data.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    Ok((shape, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_64_aligned_and_parses_back() {
        for shape in [vec![3usize], vec![9, 8128, 64], vec![2, 3]] {
            let h = npy_header("<f2", &shape);
            assert_eq!(h.len() % 64, 0);
            assert_eq!(*h.last().unwrap_or(&0), b'\n');
        }
        assert!(String::from_utf8_lossy(&npy_header("<f2", &[4])).contains("'shape': (4,)"));
        let dir = std::env::temp_dir().join(format!("qkindex-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let p = dir.join("a.npy");
        let vals: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        for dtype in [FloatDtype::F16, FloatDtype::F32] {
            write_npy_float(&p, &[2, 3, 4], &vals, dtype).expect("write");
            let (shape, back) = read_npy_f32(&p).expect("read");
            assert_eq!(shape, vec![2, 3, 4]);
            assert_eq!(back, vals);
        }
        assert!(write_npy_float(&p, &[5], &vals, FloatDtype::F16).is_err());
        std::fs::write(&p, b"garbage").expect("write");
        assert!(read_npy_f32(&p).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
