//! `.npy` reading and writing (via `npyz`) for the element types dumps use: float16, float32
//! (read into f32) and integer ids (read into i64).

use crate::error::{Error, Result};
use half::f16;
use npyz::WriterBuilder;
use std::path::Path;

/// A dense array read from a `.npy` file: its shape and its values in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub struct Array<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
    /// The file's element type as numpy spells it (`"float16"`, `"float32"`, ...).
    pub dtype: &'static str,
}

/// Reads the header's shape and checks that it fits the file before `npyz` sees it (a crafted
/// shape whose product overflows must be an error, not a panic or a wrapped size).
fn check_header_size(path: &Path, file: &mut std::fs::File) -> Result<()> {
    use std::io::{Read, Seek};
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut head = Vec::new();
    file.by_ref()
        .take(65_536)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    file.rewind().map_err(|e| Error::io(path, e))?;
    let text = String::from_utf8_lossy(&head);
    let bad = |reason: &str| Error::format(path, "npy header", reason.to_string());
    let Some(at) = text.find("'shape'") else {
        return Err(bad("no 'shape' in the header"));
    };
    let rest = &text[at..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else {
        return Err(bad("malformed shape"));
    };
    if close < open {
        return Err(bad("malformed shape"));
    }
    let mut elements: u64 = 1;
    for part in rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let dim: u64 = part.parse().map_err(|_| bad("non-integer shape entry"))?;
        elements = elements
            .checked_mul(dim)
            .ok_or_else(|| bad("shape product overflows"))?;
    }
    if elements > len {
        return Err(bad(&format!(
            "shape claims {elements} elements but the file has {len} bytes"
        )));
    }
    Ok(())
}

type Reader = npyz::NpyFile<std::io::BufReader<std::fs::File>>;

fn open(path: &Path) -> Result<(Reader, String)> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    check_header_size(path, &mut file)?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(file))
        .map_err(|e| Error::format(path, "npy header", e.to_string()))?;
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

/// Reads the array at `path`: `convert` turns the data of the dtypes it knows (by their
/// `descr` without the byte-order mark) into `T` values and the numpy name of the dtype, and
/// returns `None` for the others, which are an error naming `expected`.
fn read_as<T>(
    path: &Path,
    expected: &str,
    convert: impl FnOnce(&str, Reader) -> Option<Result<(Vec<T>, &'static str)>>,
) -> Result<Array<T>> {
    let (npy, descr) = open(path)?;
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
fn values<S: npyz::Deserialize, T: From<S>>(
    path: &Path,
    npy: Reader,
    dtype: &'static str,
) -> Result<(Vec<T>, &'static str)> {
    let data = npy
        .into_vec::<S>()
        .map_err(|e| Error::format(path, "npy data", e.to_string()))?;
    Ok((data.into_iter().map(T::from).collect(), dtype))
}

/// Reads a float16 or float32 array as f32.
pub fn read_f32(path: &Path) -> Result<Array<f32>> {
    read_as(path, "float16 or float32", |descr, npy| match descr {
        "f2" => Some(values::<f16, f32>(path, npy, "float16")),
        "f4" => Some(values::<f32, f32>(path, npy, "float32")),
        _ => None,
    })
}

/// Reads an integer array (int32/int64/uint32) as i64.
pub fn read_i64(path: &Path) -> Result<Array<i64>> {
    read_as(path, "an integer array", |descr, npy| match descr {
        "i8" => Some(values::<i64, i64>(path, npy, "int64")),
        "i4" => Some(values::<i32, i64>(path, npy, "int32")),
        "u4" => Some(values::<u32, i64>(path, npy, "uint32")),
        _ => None,
    })
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
