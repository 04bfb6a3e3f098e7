//! The GGUF reader: every length and offset checked against the file size before anything is
//! allocated or sliced.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{MetaValue, DEFAULT_ALIGNMENT, MAGIC};
use crate::error::{ModelError, Result};
use crate::qtensor::HostTensor;
use crate::quant::{dequantize_into, GgmlType};

const MAX_DIMS: u32 = 4;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, fastest-varying first (ggml `ne`): a `[cols, rows]` matrix is row-major `rows × cols`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the tensor data in the file.
    pub start: u64,
    /// Byte length of the data; `None` for types whose layout we do not know.
    pub n_bytes: Option<u64>,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

#[derive(Debug)]
enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// An opened GGUF file: parsed metadata and tensor table, data accessed from the map.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    storage: Storage,
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, reason: impl Into<String>) -> ModelError {
        ModelError::Format {
            path: self.path.to_path_buf(),
            reason: format!("{} (at byte {})", reason.into(), self.pos),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err(format!(
                "truncated: need {n} bytes, {} left",
                self.bytes.len() - self.pos
            ))),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// A count read from the file, checked so that `count * min_item_bytes` fits in what is left.
    fn count(&mut self, min_item_bytes: usize, what: &str) -> Result<usize> {
        let n = self.u64()?;
        let need = n.checked_mul(min_item_bytes as u64);
        match need {
            Some(need) if need <= self.remaining() as u64 => Ok(n as usize),
            _ => Err(self.err(format!("{what} count {n} does not fit in the file"))),
        }
    }

    fn string(&mut self) -> Result<String> {
        let n = self.count(1, "string length")?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err("string is not UTF-8"))
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>()?[0]),
            1 => MetaValue::I8(self.array::<1>()?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array()?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array()?)),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array()?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(self.err(format!("bool byte {b}"))),
            },
            8 => MetaValue::Str(self.string()?),
            9 => {
                if depth > 0 {
                    return Err(self.err("nested arrays are not supported"));
                }
                let elem = self.u32()?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    _ => return Err(self.err(format!("array element type {elem}"))),
                };
                let n = self.count(min, "array")?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array()?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(self.err(format!("metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ModelError::ModelNotFound {
                    path: path.to_path_buf(),
                }
            } else {
                io(e)
            }
        })?;
        // SAFETY: the map is read-only and private to this process; we only read it through
        // bounds-checked slices. Another process truncating the file while it is mapped could
        // fault (SIGBUS), which memory maps cannot prevent; model files are not modified in place.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Storage::Mapped(map))
    }

    /// Parses GGUF bytes held in memory; `path` only names the source in errors.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self> {
        Self::parse(path, Storage::Owned(bytes))
    }

    fn parse(path: &Path, storage: Storage) -> Result<Self> {
        let bytes: &[u8] = match &storage {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        };
        let mut r = Reader {
            bytes,
            pos: 0,
            path,
        };
        if r.take(4)? != MAGIC {
            return Err(r.err("bad magic (expected \"GGUF\")"));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(r.err(format!("unsupported GGUF version {version}")));
        }
        // Each tensor entry takes at least 8 + 4 + 4 + 8 bytes, each key/value at least 8 + 4 + 1.
        let n_tensors = r.count(24, "tensor")?;
        let n_kv = r.count(13, "metadata")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => return Err(r.err("general.alignment is not a power of two")),
            },
        };
        let mut raw = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(r.err(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64()?);
            }
            let ggml_type = GgmlType::from_id(r.u32()?);
            let offset = r.u64()?;
            raw.push((name, dims, ggml_type, offset));
        }
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ggml_type, offset) in raw {
            let bad = |reason: String| ModelError::Format {
                path: path.to_path_buf(),
                reason: format!("tensor {name}: {reason}"),
            };
            let n_el = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| bad("element count overflows".into()))?;
            if offset % alignment != 0 {
                return Err(bad(format!("offset {offset} is not {alignment}-aligned")));
            }
            let start = data_start
                .checked_add(offset)
                .ok_or_else(|| bad("offset overflows".into()))?;
            let n_bytes = ggml_type.bytes_for(n_el);
            if ggml_type.block_layout().is_some() && n_bytes.is_none() {
                return Err(bad(format!(
                    "{n_el} elements are not whole {} blocks",
                    ggml_type.name()
                )));
            }
            let end = start.checked_add(n_bytes.unwrap_or(0));
            if end.is_none_or(|e| e > file_len) {
                return Err(bad(format!(
                    "data [{start}, +{}) runs past the end of the file ({file_len} bytes): truncated?",
                    n_bytes.unwrap_or(0)
                )));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                start,
                n_bytes,
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            storage,
            version,
            metadata,
            tensors,
        })
    }

    /// The path the file came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor table entry named `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ModelError::Tensor {
                tensor: name.to_string(),
                reason: "not in the file".into(),
            })
    }

    /// The tensor `name` dequantized to f32, in file order (row-major `dims[1] × dims[0]` for a
    /// matrix), after checking that its dims equal `expect_dims` (fastest first).
    pub fn dequantize(&self, name: &str, expect_dims: &[u64]) -> Result<Vec<f32>> {
        let info = self.tensor(name)?;
        if info.dims != expect_dims {
            return Err(ModelError::Tensor {
                tensor: name.into(),
                reason: format!("dims {:?}, expected {expect_dims:?}", info.dims),
            });
        }
        let unsupported = || ModelError::UnsupportedType {
            tensor: name.into(),
            type_id: info.ggml_type.id(),
            type_name: info.ggml_type.name(),
        };
        let n_bytes = info.n_bytes.ok_or_else(unsupported)?;
        // In bounds: checked against the file length in `parse`.
        let src = &self.bytes()[info.start as usize..(info.start + n_bytes) as usize];
        let mut out = vec![0f32; info.n_elements() as usize];
        if !dequantize_into(info.ggml_type, src, &mut out) {
            return Err(unsupported());
        }
        Ok(out)
    }

    /// The tensor `name` (dims checked as in [`GgufFile::dequantize`]) as a host tensor: a
    /// matrix of a type with an integer kernel stays in its blocks, anything else is dequantized
    /// to f32 (everything is, with `keep_blocks: false`).
    pub fn host_tensor(
        &self,
        name: &str,
        expect_dims: &[u64],
        keep_blocks: bool,
    ) -> Result<HostTensor> {
        let info = self.tensor(name)?;
        if !keep_blocks || info.dims.len() != 2 || info.dims != expect_dims {
            return self.dequantize(name, expect_dims).map(HostTensor::F32);
        }
        let unsupported = || ModelError::UnsupportedType {
            tensor: name.into(),
            type_id: info.ggml_type.id(),
            type_name: info.ggml_type.name(),
        };
        let n_bytes = info.n_bytes.ok_or_else(unsupported)?;
        // In bounds: checked against the file length in `parse`.
        let src = &self.bytes()[info.start as usize..(info.start + n_bytes) as usize];
        let (cols, rows) = (info.dims[0] as usize, info.dims[1] as usize);
        HostTensor::from_ggml(info.ggml_type, rows, cols, src).ok_or_else(unsupported)
    }

    /// The metadata value at `key`, or a `Metadata` error.
    pub fn meta(&self, key: &str) -> Result<&MetaValue> {
        self.metadata.get(key).ok_or_else(|| ModelError::Metadata {
            key: key.into(),
            reason: "missing".into(),
        })
    }

    /// An integer metadata value.
    pub fn meta_u64(&self, key: &str) -> Result<u64> {
        self.meta(key)?
            .as_u64()
            .ok_or_else(|| ModelError::Metadata {
                key: key.into(),
                reason: "not a non-negative integer".into(),
            })
    }

    /// A numeric metadata value as f64.
    pub fn meta_f64(&self, key: &str) -> Result<f64> {
        self.meta(key)?
            .as_f64()
            .ok_or_else(|| ModelError::Metadata {
                key: key.into(),
                reason: "not a number".into(),
            })
    }

    /// A string metadata value.
    pub fn meta_str(&self, key: &str) -> Result<&str> {
        self.meta(key)?
            .as_str()
            .ok_or_else(|| ModelError::Metadata {
                key: key.into(),
                reason: "not a string".into(),
            })
    }

    /// An array metadata value.
    pub fn meta_array(&self, key: &str) -> Result<&[MetaValue]> {
        self.meta(key)?
            .as_array()
            .ok_or_else(|| ModelError::Metadata {
                key: key.into(),
                reason: "not an array".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::write_gguf;

    fn sample() -> Vec<u8> {
        let f32s: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let mut q8 = half::f16::from_f32(0.5).to_le_bytes().to_vec();
        q8.extend((0..32).map(|i| i as u8));
        write_gguf(
            &[
                ("general.architecture", MetaValue::Str("llama".into())),
                ("llama.block_count", MetaValue::U32(2)),
                ("llama.rope.freq_base", MetaValue::F32(10000.0)),
                (
                    "tokenizer.ggml.tokens",
                    MetaValue::Array(vec![MetaValue::Str("a".into()), MetaValue::Str("b".into())]),
                ),
            ],
            &[
                ("m", &[3, 2], 0, &f32s),
                ("q", &[32], 8, &q8),
                ("k5", &[256], 13, &[0u8; 176]),
            ],
        )
    }

    #[test]
    fn round_trip_metadata_and_tensors() {
        let g = GgufFile::from_bytes(Path::new("mem"), sample()).expect("parse");
        assert_eq!(g.version, 3);
        assert_eq!(g.meta_str("general.architecture").ok(), Some("llama"));
        assert_eq!(g.meta_u64("llama.block_count").ok(), Some(2));
        assert_eq!(g.meta_f64("llama.rope.freq_base").ok(), Some(10000.0));
        assert_eq!(
            g.meta_array("tokenizer.ggml.tokens").map(|a| a.len()).ok(),
            Some(2)
        );
        let m = g.dequantize("m", &[3, 2]).expect("m");
        assert_eq!(m, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let q = g.dequantize("q", &[32]).expect("q");
        assert_eq!(q[3], 1.5);
        assert!(matches!(
            g.dequantize("m", &[2, 3]),
            Err(ModelError::Tensor { .. })
        ));
        assert!(matches!(
            g.dequantize("k5", &[256]),
            Err(ModelError::UnsupportedType { type_id: 13, .. })
        ));
        assert!(matches!(
            g.meta_u64("missing"),
            Err(ModelError::Metadata { .. })
        ));
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample();
        // The last tensor has an unknown layout, so its data is not needed: cut before the q8 data ends.
        let g = GgufFile::from_bytes(Path::new("mem"), bytes.clone()).expect("parse");
        let needed = g.tensor("q").map(|t| t.start + 34).expect("q") as usize;
        for cut in 0..needed {
            let r = GgufFile::from_bytes(Path::new("mem"), bytes[..cut].to_vec());
            assert!(matches!(r, Err(ModelError::Format { .. })), "cut at {cut}");
        }
    }

    #[test]
    fn bad_magic_version_and_counts() {
        let mut b = sample();
        b[0] = b'X';
        assert!(GgufFile::from_bytes(Path::new("mem"), b).is_err());
        let mut b = sample();
        b[4] = 9;
        assert!(GgufFile::from_bytes(Path::new("mem"), b).is_err());
        let mut b = sample();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(GgufFile::from_bytes(Path::new("mem"), b).is_err());
        // Flip every byte of the header region: never a panic.
        let base = sample();
        for i in 0..200 {
            let mut b = base.clone();
            b[i] ^= 0xFF;
            let _ = GgufFile::from_bytes(Path::new("mem"), b);
        }
    }
}
