//! `.npy` reading and writing (via `npyz`) for the element types dumps use: float16, float32
//! (read into f32) and integer ids (read into i64). Files are read from disk ([`read_f32`],
//! [`read_i64`]) or from their bytes in memory ([`parse_f32`], [`parse_i64`]), with the same
//! checks.

use crate::error::{Error, Result};
use half::f16;
use npyz::WriterBuilder;
use std::io::Read;
use std::path::Path;

/// A dense array read from a `.npy` file: its shape and its values in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub struct Array<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
    /// The file's element type as numpy spells it (`"float16"`, `"float32"`, ...).
    pub dtype: &'static str,
}

/// How many bytes of a file's start [`check_header_size`] looks at: a longer header is refused
/// (numpy writes 128 bytes for the arrays read here).
const HEADER_PEEK: u64 = 65_536;

/// How deep brackets may nest in a header (see [`check_header_size`]).
const MAX_HEADER_DEPTH: usize = 8;

/// Reads the header's shape and checks that it fits the file before `npyz` sees it (a crafted
/// shape whose product overflows must be an error, not a panic or a wrapped size). `head` is
/// the start of the file (its first [`HEADER_PEEK`] bytes, or all of it), `len` its length.
///
/// The header is parsed as `npyz` parses it (the Python literal parser it uses, the last of
/// repeated keys wins), so that both see the same shape. Checked: the header length fits in
/// the file (`npyz` allocates it before reading), the shape's element count is at most the
/// file's length in bytes, and the product of its non-zero dims does not overflow (`npyz`
/// multiplies them unchecked, for the element count and for the strides).
fn check_header_size(path: &Path, head: &[u8], len: u64) -> Result<()> {
    let bad = |reason: String| Error::format(path, "npy header", reason);
    // Magic (6 bytes), version (2), header length (u16 in version 1, u32 in 2 and 3).
    let Some(rest) = head.strip_prefix(b"\x93NUMPY") else {
        return Err(bad("magic not found for NPY file".into()));
    };
    let width = match rest.first() {
        Some(1) => 2,
        Some(2 | 3) => 4,
        Some(v) => return Err(bad(format!("unsupported version {v}"))),
        None => return Err(bad("no version".into())),
    };
    let Some(size) = rest.get(2..2 + width) else {
        return Err(bad("no header length".into()));
    };
    let size = size
        .iter()
        .rev()
        .fold(0u64, |a, &b| (a << 8) | u64::from(b));
    let start = 8 + width as u64;
    if start + size > len {
        return Err(bad(format!(
            "header of {size} bytes runs past the end of the file ({len} bytes)"
        )));
    }
    let Some(header) = head.get(start as usize..(start + size) as usize) else {
        return Err(bad(format!(
            "header of {size} bytes is longer than {HEADER_PEEK}"
        )));
    };
    let header = header.strip_suffix(b"\n").unwrap_or(header);
    // The Python literal parser (`npyz` parses with it too) backtracks exponentially in the
    // depth of unclosed brackets: a 300-byte header holding 57 `{` ran for minutes (found by
    // fuzzing). numpy's headers of the dtypes read here nest 2 deep.
    let (mut depth, mut deepest) = (0usize, 0usize);
    for b in header {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > MAX_HEADER_DEPTH {
        return Err(bad(format!(
            "brackets nested {deepest} deep (at most {MAX_HEADER_DEPTH})"
        )));
    }
    let text = std::str::from_utf8(header).map_err(|_| bad("header is not UTF-8".into()))?;
    let value: py_literal::Value = text
        .parse()
        .map_err(|e: py_literal::ParseError| bad(format!("not a Python literal: {e}")))?;
    let py_literal::Value::Dict(entries) = value else {
        return Err(bad("expected a python dict literal".into()));
    };
    let mut shape = None;
    for (key, value) in &entries {
        match key {
            py_literal::Value::String(k) if k == "shape" => shape = Some(value),
            py_literal::Value::String(_) => {}
            _ => return Err(bad("key is not string".into())),
        }
    }
    let dims = match shape {
        Some(py_literal::Value::Tuple(d) | py_literal::Value::List(d)) => d,
        Some(_) => return Err(bad("shape must be list or tuple".into())),
        None => return Err(bad("no 'shape' in the header".into())),
    };
    let (mut elements, mut nonzero) = (1u64, 1u64);
    for dim in dims {
        let dim = match dim {
            py_literal::Value::Integer(n) => n.to_string().parse::<u64>().ok(),
            _ => None,
        }
        .ok_or_else(|| bad("shape entry is not an integer in u64".into()))?;
        elements = elements.saturating_mul(dim);
        if dim != 0 {
            nonzero = nonzero
                .checked_mul(dim)
                .ok_or_else(|| bad("shape product overflows".into()))?;
        }
    }
    if elements > len {
        return Err(bad(format!(
            "shape claims {elements} elements but the file has {len} bytes"
        )));
    }
    Ok(())
}

/// A file's first [`HEADER_PEEK`] bytes, its length and a reader from its start.
fn open_file(path: &Path) -> Result<(Vec<u8>, u64, std::io::BufReader<std::fs::File>)> {
    use std::io::Seek;
    let io = |e: std::io::Error| Error::io(path, e);
    let mut file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut head = Vec::new();
    file.by_ref()
        .take(HEADER_PEEK)
        .read_to_end(&mut head)
        .map_err(io)?;
    file.rewind().map_err(io)?;
    Ok((head, len, std::io::BufReader::new(file)))
}

/// The start (at most [`HEADER_PEEK`] bytes) of a file held in memory.
fn peek(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.len().min(HEADER_PEEK as usize)]
}

/// Checks the header (see [`check_header_size`]) and opens the array that `reader` holds.
fn open<R: Read>(
    path: &Path,
    head: &[u8],
    len: u64,
    reader: R,
) -> Result<(npyz::NpyFile<R>, String)> {
    check_header_size(path, head, len)?;
    let npy =
        npyz::NpyFile::new(reader).map_err(|e| Error::format(path, "npy header", e.to_string()))?;
    if npy.order() != npyz::Order::C {
        return Err(Error::format(
            path,
            "npy header",
            "Fortran-ordered arrays are not supported (save with C order)",
        ));
    }
    let dtype = npy.dtype().descr().trim_matches(['\'', '"']).to_string();
    Ok((npy, dtype))
}

/// Reads the array of `npy`: `convert` turns the data of the dtypes it knows (by their
/// `descr` without the byte-order mark) into `T` values and the numpy name of the dtype, and
/// returns `None` for the others, which are an error naming `expected`.
fn read_as<T, R: Read>(
    path: &Path,
    (npy, descr): (npyz::NpyFile<R>, String),
    expected: &str,
    convert: impl FnOnce(&str, npyz::NpyFile<R>) -> Option<Result<(Vec<T>, &'static str)>>,
) -> Result<Array<T>> {
    let shape: Vec<usize> = npy.shape().iter().map(|&x| x as usize).collect();
    let descr = descr.trim_start_matches(['<', '=', '|']);
    let Some(read) = convert(descr, npy) else {
        return Err(Error::format(
            path,
            "npy dtype",
            format!("expected {expected}, found {descr:?}"),
        ));
    };
    let (data, dtype) = read?;
    let want = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if want != Some(data.len()) {
        return Err(Error::format(
            path,
            "npy data",
            format!("shape {shape:?} does not match {} elements", data.len()),
        ));
    }
    Ok(Array { shape, data, dtype })
}

/// The data of `npy`, stored as `S`, converted to `T` (exactly: widening conversions only).
fn values<S: npyz::Deserialize, T: From<S>, R: Read>(
    path: &Path,
    npy: npyz::NpyFile<R>,
    dtype: &'static str,
) -> Result<(Vec<T>, &'static str)> {
    let data = npy
        .into_vec::<S>()
        .map_err(|e| Error::format(path, "npy data", e.to_string()))?;
    Ok((data.into_iter().map(T::from).collect(), dtype))
}

/// A float16 or float32 array as f32.
fn f32_array<R: Read>(path: &Path, opened: (npyz::NpyFile<R>, String)) -> Result<Array<f32>> {
    read_as(
        path,
        opened,
        "float16 or float32",
        |descr, npy| match descr {
            "f2" => Some(values::<f16, f32, R>(path, npy, "float16")),
            "f4" => Some(values::<f32, f32, R>(path, npy, "float32")),
            _ => None,
        },
    )
}

/// An integer array (int32/int64/uint32) as i64.
fn i64_array<R: Read>(path: &Path, opened: (npyz::NpyFile<R>, String)) -> Result<Array<i64>> {
    read_as(path, opened, "an integer array", |descr, npy| match descr {
        "i8" => Some(values::<i64, i64, R>(path, npy, "int64")),
        "i4" => Some(values::<i32, i64, R>(path, npy, "int32")),
        "u4" => Some(values::<u32, i64, R>(path, npy, "uint32")),
        _ => None,
    })
}

/// Reads a float16 or float32 array as f32.
pub fn read_f32(path: &Path) -> Result<Array<f32>> {
    let (head, len, reader) = open_file(path)?;
    f32_array(path, open(path, &head, len, reader)?)
}

/// Reads an integer array (int32/int64/uint32) as i64.
pub fn read_i64(path: &Path) -> Result<Array<i64>> {
    let (head, len, reader) = open_file(path)?;
    i64_array(path, open(path, &head, len, reader)?)
}

/// [`read_f32`] of a file's bytes held in memory; `path` names it in errors.
pub fn parse_f32(path: &Path, bytes: &[u8]) -> Result<Array<f32>> {
    f32_array(path, open(path, peek(bytes), bytes.len() as u64, bytes)?)
}

/// [`read_i64`] of a file's bytes held in memory; `path` names it in errors.
pub fn parse_i64(path: &Path, bytes: &[u8]) -> Result<Array<i64>> {
    i64_array(path, open(path, peek(bytes), bytes.len() as u64, bytes)?)
}

/// Writes `data` (row-major, `shape`) as a float16 `.npy` file.
pub fn write_f16(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    write_with(path, shape, data.iter().map(|&x| f16::from_f32(x)))
}

/// Writes `data` (row-major, `shape`) as a float32 `.npy` file.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    write_with(path, shape, data.iter().copied())
}

/// Writes `data` (row-major, `shape`) as an int32 `.npy` file (token ids).
pub fn write_i32(path: &Path, shape: &[usize], data: &[i32]) -> Result<()> {
    write_with(path, shape, data.iter().copied())
}

/// Writes `data` (row-major, `shape`) as an int64 `.npy` file.
pub fn write_i64(path: &Path, shape: &[usize], data: &[i64]) -> Result<()> {
    write_with(path, shape, data.iter().copied())
}

fn write_with<T: npyz::AutoSerialize>(
    path: &Path,
    shape: &[usize],
    values: impl ExactSizeIterator<Item = T>,
) -> Result<()> {
    let expected: usize = shape.iter().product();
    if values.len() != expected {
        return Err(Error::DimensionMismatch {
            what: "array elements (product of the shape)",
            expected,
            got: values.len(),
        });
    }
    let io = |e: std::io::Error| Error::io(path, e);
    let file = std::fs::File::create(path).map_err(io)?;
    let shape64: Vec<u64> = shape.iter().map(|&x| x as u64).collect();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&shape64)
        .writer(std::io::BufWriter::new(file))
        .begin_nd()
        .map_err(io)?;
    w.extend(values).map_err(io)?;
    w.finish().map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.npy` file of version `version` with header text `dict` and `payload`.
    fn npy_bytes(version: u8, dict: &str, payload: &[u8]) -> Vec<u8> {
        let header = format!("{dict}\n");
        let mut b = b"\x93NUMPY".to_vec();
        b.extend([version, 0]);
        if version == 1 {
            b.extend((header.len() as u16).to_le_bytes());
        } else {
            b.extend((header.len() as u32).to_le_bytes());
        }
        b.extend(header.as_bytes());
        b.extend(payload);
        b
    }

    fn header_error(bytes: &[u8]) -> String {
        match parse_f32(Path::new("x.npy"), bytes) {
            Err(Error::Format {
                section, reason, ..
            }) if section == "npy header" => reason,
            other => panic!("expected a header error, got {other:?}"),
        }
    }

    const OK: &str = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";

    #[test]
    fn well_formed_headers_read() {
        let payload: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        for version in [1, 2, 3] {
            let a = parse_f32(Path::new("x.npy"), &npy_bytes(version, OK, &payload))
                .expect("well-formed");
            assert_eq!((a.shape, a.data), (vec![2], vec![1.5, -2.0]), "v{version}");
        }
        // A list shape and a zero-sized array are numpy's too.
        let list = "{'descr': '<f4', 'fortran_order': False, 'shape': [1, 2], }";
        let a = parse_f32(Path::new("x.npy"), &npy_bytes(1, list, &payload)).expect("list");
        assert_eq!(a.shape, vec![1, 2]);
        let empty = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }";
        let a = parse_f32(Path::new("x.npy"), &npy_bytes(1, empty, &[])).expect("empty");
        assert_eq!((a.shape, a.data.len()), (vec![0, 3], 0));
    }

    /// A header length past the end of the file was allocated by `npyz` (4 GiB for 12 bytes).
    #[test]
    fn a_header_length_past_the_end_is_refused_before_npyz_allocates_it() {
        let mut b = npy_bytes(2, OK, &[0; 8]);
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(header_error(&b).contains("runs past the end"));
        assert!(header_error(&b[..12]).contains("runs past the end"));
    }

    /// The shape `npyz` reads is the one checked: a repeated `shape` key (the last wins), a key
    /// spelled with escapes, or a shape as a list after a decoy `(1,)`, used to pass the check
    /// with a small shape while `npyz` multiplied a huge one (an overflow panic).
    #[test]
    fn the_checked_shape_is_the_one_npyz_reads() {
        let huge = "(4294967296, 4294967296, 2)";
        for dict in [
            format!("{{'shape': (1,), 'descr': '<f4', 'fortran_order': False, 'shape': {huge}}}"),
            format!(
                "{{'descr': '<f4', 'fortran_order': False, 'a': \"'shape': (1,)\", \
                 '\\x73hape': {huge}}}"
            ),
            "{'descr': '<f4', 'fortran_order': False, 'shape': [4294967296, 4294967296, 2], \
             'a': (1,)}"
                .to_string(),
        ] {
            let reason = header_error(&npy_bytes(1, &dict, &[0; 4]));
            assert!(reason.contains("overflows"), "{dict}: {reason}");
        }
    }

    /// A zero dim makes the element count 0, but `npyz` also multiplies the other dims (the
    /// strides): their product must not overflow either.
    #[test]
    fn overflowing_strides_of_an_empty_array_are_refused() {
        let dict = "{'descr': '<f4', 'fortran_order': False, \
                    'shape': (0, 4294967296, 4294967296)}";
        assert!(header_error(&npy_bytes(1, dict, &[])).contains("overflows"));
    }

    /// Found by fuzzing: the parser backtracks exponentially in the nesting depth of unclosed
    /// brackets (this header ran for minutes); such headers are refused before any parse,
    /// in the shape or anywhere else (`npyz` parses the whole header).
    #[test]
    fn deeply_nested_headers_are_refused_before_parsing() {
        let braces = "{".repeat(57);
        for dict in [
            format!("{{'descr': '<f2', 'fortran_order': False, 'shape': (2, 5,{braces} 4), }}"),
            format!("{{'descr': {braces}, 'fortran_order': False, 'shape': (1,), }}"),
        ] {
            let reason = header_error(&npy_bytes(1, &dict, &[0; 4]));
            assert!(reason.contains("nested"), "{reason}");
        }
        // Eight levels still parse (and give the error of what they hold).
        let dict = format!(
            "{{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': {}{}}}",
            "[".repeat(7),
            "]".repeat(7)
        );
        let a = parse_f32(Path::new("x.npy"), &npy_bytes(1, &dict, &[0; 4])).expect("8 deep");
        assert_eq!(a.shape, vec![1]);
    }

    #[test]
    fn malformed_headers_are_errors() {
        for (dict, want) in [
            ("{'descr': '<f4', 'fortran_order': False}", "no 'shape'"),
            ("{'descr': '<f4', 'shape': (2,", "not a Python literal"),
            ("[1, 2]", "dict"),
            ("{1: 2, 'shape': (2,)}", "key is not string"),
            ("{'shape': 2}", "list or tuple"),
            ("{'shape': (-1,)}", "integer in u64"),
            ("{'shape': (18446744073709551616,)}", "integer in u64"),
            ("{'shape': (1000,)}", "claims 1000 elements"),
        ] {
            let reason = header_error(&npy_bytes(1, dict, &[]));
            assert!(reason.contains(want), "{dict}: {reason}");
        }
        assert!(header_error(b"\x93NUMPY\x07\x00").contains("version"));
        assert!(header_error(b"\x93NUMP").contains("magic"));
        assert!(header_error(b"\x93NUMPY\x01").contains("length"));
    }
}
