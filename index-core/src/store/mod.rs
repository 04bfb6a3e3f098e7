//! Key storage: `n × dim` keys, row-major, in f16, f32 or int8.
//!
//! Int8 ([`Dtype::I8`], issue 26) stores each key as `dim` signed bytes and one f32 scale,
//! normalised per dimension first ([`Affine`]: `key ≈ offset + range ⊙ (scale · code)`, with
//! `scale = max|normalised key| / 127`, [`crate::metric::int8::quantize_row`]): a quarter of
//! f32's bytes plus 4 per key (and `8 · dim` per store), with every normalised element off by at
//! most half a step. The offsets and ranges are fitted on the keys a store is made from; keys
//! pushed later keep them (their own scale absorbs a larger magnitude), and an empty store
//! starts from the identity (plain per-key scales). Its scores are
//! `q · offset + scale · ((q ⊙ range) · code)` with the query in f32: searches of an int8 store
//! rank by those scores, and they are what its results report.
//!
//! One [`KeyStore`] holds the keys of one KV head. The query heads of a GQA group share it
//! through an `Arc<KeyStore>`: every index of those heads points at the same memory. Decode
//! appends keys ([`KeyStore::push`]); ids are `u32` row numbers and never change.
//!
//! Rows are owned or borrowed from a read-only file mapping ([`crate::io`]); both are read
//! through the same accessors, so searching a mapped store copies nothing.

use crate::error::{check_finite, Error, Result};
use crate::metric::affine::Affine;
use half::f16;
use half::slice::HalfFloatSliceExt;

pub mod buf;
mod scorer;
pub use buf::{Backing, Buf, Mapped};
pub use scorer::{Estimate, QueryScorer, Scorer};

/// Element type of stored keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F16,
    F32,
    /// Signed bytes with one f32 scale per key, normalised per dimension ([`Affine`]; serde
    /// and files: `i8`).
    I8,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F16 => 2,
            Dtype::F32 => 4,
            Dtype::I8 => 1,
        }
    }

    /// Bytes per key of `dim` elements (int8 adds its f32 scale).
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            Dtype::I8 => dim + 4,
            _ => dim * self.size(),
        }
    }

    /// The name (`f16`, `f32`, `i8`), as files, index specs and the command line spell it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
            Dtype::I8 => "i8",
        }
    }

    /// The name numpy gives the type (`float16`, `float32`, `int8`).
    pub fn numpy_name(self) -> &'static str {
        match self {
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::I8 => "int8",
        }
    }
}

/// [`Dtype::name`].
impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `f16`, `f32` or `i8` (what [`Dtype`]'s `Display` prints).
impl std::str::FromStr for Dtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        [Dtype::F16, Dtype::F32, Dtype::I8]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| Error::invalid_param("dtype", s, "expected f16, f32 or i8"))
    }
}

/// Typed view of the key rows: `n × dim`, row-major.
#[derive(Clone, Copy, Debug)]
pub enum KeysRef<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
    /// `n × dim` codes, `n` scales and the store's [`Affine`]: key `i` is
    /// `affine.decode(scales[i], codes[i·dim..(i+1)·dim])`.
    I8 {
        codes: &'a [i8],
        scales: &'a [f32],
        affine: &'a Affine,
    },
}

#[derive(Clone, Debug)]
enum KeyData {
    F16(Buf<f16>),
    F32(Buf<f32>),
    I8 {
        codes: Buf<i8>,
        scales: Buf<f32>,
        affine: Affine,
    },
}

/// `n × dim` keys of one head, row-major, f16, f32 or int8.
#[derive(Clone, Debug)]
pub struct KeyStore {
    dim: usize,
    len: usize,
    data: KeyData,
}

impl KeyStore {
    /// Keys from a row-major f32 buffer of `n × dim` values, stored as f32.
    ///
    /// Errors: `dim == 0`, a length that is not a multiple of `dim`, non-finite values.
    pub fn from_f32(data: Vec<f32>, dim: usize) -> Result<Self> {
        let len = check_shape("keys", data.len(), dim)?;
        check_finite("keys", &data, dim)?;
        Ok(KeyStore {
            dim,
            len,
            data: KeyData::F32(Buf::Owned(data)),
        })
    }

    /// Keys from a row-major f16 buffer of `n × dim` values, stored as f16.
    pub fn from_f16(data: Vec<f16>, dim: usize) -> Result<Self> {
        let len = check_shape("keys", data.len(), dim)?;
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(Error::NonFinite {
                what: "keys",
                row: i / dim,
            });
        }
        Ok(KeyStore {
            dim,
            len,
            data: KeyData::F16(Buf::Owned(data)),
        })
    }

    /// Keys from a row-major f32 buffer of `n × dim` values, stored as `dtype` (int8: coded
    /// as [`KeyStore::quantize_i8`] codes).
    ///
    /// Errors: as [`KeyStore::from_f32`].
    pub fn from_f32_as(data: Vec<f32>, dim: usize, dtype: Dtype) -> Result<Self> {
        match dtype {
            Dtype::F32 => Self::from_f32(data, dim),
            Dtype::F16 => {
                check_finite("keys", &data, dim)?;
                Self::from_f16(data.iter().map(|&x| f16::from_f32(x)).collect(), dim)
            }
            Dtype::I8 => Self::quantize_i8(&data, dim),
        }
    }

    /// Keys from a row-major f32 buffer of `n × dim` values, coded as int8 ([`Dtype::I8`]):
    /// normalised by the offsets and ranges of these keys ([`Affine::fit`]), then one scale
    /// per key.
    ///
    /// Errors: as [`KeyStore::from_f32`].
    pub fn quantize_i8(data: &[f32], dim: usize) -> Result<Self> {
        let len = check_shape("keys", data.len(), dim)?;
        check_finite("keys", data, dim)?;
        let affine = Affine::fit(dim, data.chunks_exact(dim));
        let mut codes = vec![0i8; data.len()];
        let mut row = vec![0.0f32; dim];
        let scales = data
            .chunks_exact(dim)
            .zip(codes.chunks_exact_mut(dim))
            .map(|(key, c)| {
                row.copy_from_slice(key);
                affine.encode(&mut row, c)
            })
            .collect();
        Ok(KeyStore {
            dim,
            len,
            data: KeyData::I8 {
                codes: Buf::Owned(codes),
                scales: Buf::Owned(scales),
                affine,
            },
        })
    }

    /// An int8 store coding the keys of `self` (dequantized to f32 first; an int8 store is
    /// copied).
    pub fn to_i8(&self) -> Result<Self> {
        match self.data {
            KeyData::I8 { .. } => Ok(self.clone()),
            _ => Self::quantize_i8(&self.to_f32(), self.dim),
        }
    }

    /// An empty store of the given element type, to be filled by [`KeyStore::push`].
    pub fn empty(dtype: Dtype, dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::invalid_param("dim", 0, "must be positive"));
        }
        let data = match dtype {
            Dtype::F16 => KeyData::F16(Buf::default()),
            Dtype::F32 => KeyData::F32(Buf::default()),
            Dtype::I8 => KeyData::I8 {
                codes: Buf::default(),
                scales: Buf::default(),
                affine: Affine::identity(dim),
            },
        };
        Ok(KeyStore { dim, len: 0, data })
    }

    /// Keys whose rows live in a file mapping (from [`crate::io`]): `buf` holds `len × dim`
    /// values. The loader has checked sizes; finiteness is checked by verification.
    pub(crate) fn from_buf_f16(buf: Buf<f16>, dim: usize) -> Result<Self> {
        let len = check_shape("keys", buf.as_slice().len(), dim)?;
        Ok(KeyStore {
            dim,
            len,
            data: KeyData::F16(buf),
        })
    }

    /// [`KeyStore::from_buf_f16`] for f32 rows.
    pub(crate) fn from_buf_f32(buf: Buf<f32>, dim: usize) -> Result<Self> {
        let len = check_shape("keys", buf.as_slice().len(), dim)?;
        Ok(KeyStore {
            dim,
            len,
            data: KeyData::F32(buf),
        })
    }

    /// Int8 keys whose codes (`len × dim`) and scales (`len`) live in a file mapping, with
    /// their offsets and ranges; the loader has checked sizes.
    pub(crate) fn from_bufs_i8(
        codes: Buf<i8>,
        scales: Buf<f32>,
        affine: Affine,
        dim: usize,
    ) -> Result<Self> {
        let len = check_shape("keys", codes.as_slice().len(), dim)?;
        if affine.dim() != dim {
            return Err(Error::DimensionMismatch {
                what: "int8 key offsets (one per dimension)",
                expected: dim,
                got: affine.dim(),
            });
        }
        if scales.as_slice().len() != len {
            return Err(Error::DimensionMismatch {
                what: "key scales (one per key)",
                expected: len,
                got: scales.as_slice().len(),
            });
        }
        Ok(KeyStore {
            dim,
            len,
            data: KeyData::I8 {
                codes,
                scales,
                affine,
            },
        })
    }

    /// Row of the first non-finite value, if any (a full scan; file verification uses it; for
    /// int8 keys, the first non-finite or negative scale).
    pub fn first_non_finite_row(&self) -> Option<usize> {
        // Branch-free OR over blocks (vectorizes), then the exact position in the bad block.
        const BLOCK: usize = 4096;
        let i = match self.rows() {
            KeysRef::F16(v) => {
                // f16 is NaN or infinite when its exponent bits are all ones.
                let bits: &[u16] = bytemuck::cast_slice(v);
                let bad = |b: &u16| b & 0x7C00 == 0x7C00;
                let block = bits
                    .chunks(BLOCK)
                    .position(|c| c.iter().fold(false, |acc, b| acc | bad(b)))?;
                block * BLOCK + bits[block * BLOCK..].iter().position(bad)?
            }
            KeysRef::F32(v) => {
                let bad = |x: &f32| !x.is_finite();
                let block = v
                    .chunks(BLOCK)
                    .position(|c| c.iter().fold(false, |acc, x| acc | bad(x)))?;
                block * BLOCK + v[block * BLOCK..].iter().position(bad)?
            }
            KeysRef::I8 { scales, .. } => {
                return scales.iter().position(|s| !(s.is_finite() && *s >= 0.0));
            }
        };
        Some(i / self.dim)
    }

    /// True when the rows are borrowed from a file mapping rather than owned.
    pub fn is_mapped(&self) -> bool {
        match &self.data {
            KeyData::F16(b) => b.is_mapped(),
            KeyData::F32(b) => b.is_mapped(),
            KeyData::I8 { codes, .. } => codes.is_mapped(),
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Dimension of each key.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        match self.data {
            KeyData::F16(_) => Dtype::F16,
            KeyData::F32(_) => Dtype::F32,
            KeyData::I8 { .. } => Dtype::I8,
        }
    }

    /// Bytes held by the key rows (int8: codes, scales, offsets and ranges).
    pub fn bytes(&self) -> usize {
        let affine = match &self.data {
            KeyData::I8 { affine, .. } => affine.bytes(),
            _ => 0,
        };
        self.len * self.dtype().row_bytes(self.dim) + affine
    }

    /// Typed view of all rows.
    pub fn rows(&self) -> KeysRef<'_> {
        match &self.data {
            KeyData::F16(v) => KeysRef::F16(v.as_slice()),
            KeyData::F32(v) => KeysRef::F32(v.as_slice()),
            KeyData::I8 {
                codes,
                scales,
                affine,
            } => KeysRef::I8 {
                codes: codes.as_slice(),
                scales: scales.as_slice(),
                affine,
            },
        }
    }

    /// Appends one key (converted to the store's element type); returns its id.
    ///
    /// A store whose rows are mapped from a file copies them into owned memory first (the
    /// mapping is read-only); later pushes append to that copy.
    pub fn push(&mut self, key: &[f32]) -> Result<u32> {
        if key.len() != self.dim {
            return Err(Error::DimensionMismatch {
                what: "key",
                expected: self.dim,
                got: key.len(),
            });
        }
        check_finite("key", key, self.dim)?;
        let id = u32::try_from(self.len)
            .map_err(|_| Error::invalid_param("n", self.len, "more than u32::MAX keys"))?;
        match &mut self.data {
            KeyData::F16(v) => v.to_mut().extend(key.iter().map(|&x| f16::from_f32(x))),
            KeyData::F32(v) => v.to_mut().extend_from_slice(key),
            KeyData::I8 {
                codes,
                scales,
                affine,
            } => {
                let codes = codes.to_mut();
                let at = codes.len();
                codes.resize(at + self.dim, 0);
                let mut row = key.to_vec();
                let scale = affine.encode(&mut row, &mut codes[at..]);
                scales.to_mut().push(scale);
            }
        }
        self.len += 1;
        Ok(id)
    }

    /// Key `id` as f32, written into `out` (length `dim`).
    ///
    /// # Panics
    /// If `id >= len` or `out.len() != dim` (internal callers guarantee both).
    pub fn row_into(&self, id: u32, out: &mut [f32]) {
        let s = id as usize * self.dim;
        match self.rows() {
            // The slice conversion runs F16C eight values at a time where the CPU has it.
            KeysRef::F16(v) => v[s..s + self.dim].convert_to_f32_slice(out),
            KeysRef::F32(v) => out.copy_from_slice(&v[s..s + self.dim]),
            KeysRef::I8 {
                codes,
                scales,
                affine,
            } => affine.decode(scales[id as usize], &codes[s..s + self.dim], out),
        }
    }

    /// All keys converted to f32, row-major (int8: decoded, [`Affine::decode`]).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.rows() {
            KeysRef::F16(v) => {
                let mut out = vec![0.0f32; v.len()];
                v.convert_to_f32_slice(&mut out);
                out
            }
            KeysRef::F32(v) => v.to_vec(),
            KeysRef::I8 {
                codes,
                scales,
                affine,
            } => {
                let mut out = vec![0.0f32; codes.len()];
                for ((o, row), &s) in out
                    .chunks_exact_mut(self.dim)
                    .zip(codes.chunks_exact(self.dim))
                    .zip(scales)
                {
                    affine.decode(s, row, o);
                }
                out
            }
        }
    }

    /// All keys as f32, row-major: borrowed from an f32 store, else converted ([`KeyStore::to_f32`]).
    pub fn f32_rows(&self) -> std::borrow::Cow<'_, [f32]> {
        match self.rows() {
            KeysRef::F32(v) => std::borrow::Cow::Borrowed(v),
            _ => std::borrow::Cow::Owned(self.to_f32()),
        }
    }

    /// The rows `ids` in order, as a new store of the same element type (int8 keeps its codes,
    /// scales, offsets and ranges exactly).
    ///
    /// # Panics
    /// If an id is `>= len` (internal callers pass ids of this store).
    pub fn gather(&self, ids: &[u32]) -> Result<Self> {
        let d = self.dim;
        let pick = |i: &u32| *i as usize * d..(*i as usize + 1) * d;
        match self.rows() {
            KeysRef::F16(v) => {
                Self::from_f16(ids.iter().flat_map(|i| &v[pick(i)]).copied().collect(), d)
            }
            KeysRef::F32(v) => {
                Self::from_f32(ids.iter().flat_map(|i| &v[pick(i)]).copied().collect(), d)
            }
            KeysRef::I8 {
                codes,
                scales,
                affine,
            } => Self::from_bufs_i8(
                Buf::Owned(ids.iter().flat_map(|i| &codes[pick(i)]).copied().collect()),
                Buf::Owned(ids.iter().map(|&i| scales[i as usize]).collect()),
                affine.clone(),
                d,
            ),
        }
    }

    /// A scorer bound to this store and the CPU's best kernels.
    pub fn scorer(&self) -> Scorer<'_> {
        Scorer::new(self.rows(), self.dim)
    }
}

/// Checks that a buffer of `len` values is a whole number of rows of `dim`; returns the rows.
pub(crate) fn check_shape(what: &'static str, len: usize, dim: usize) -> Result<usize> {
    if dim == 0 {
        return Err(Error::invalid_param("dim", 0, "must be positive"));
    }
    if len == 0 {
        return Err(Error::Empty { what });
    }
    if !len.is_multiple_of(dim) {
        return Err(Error::DimensionMismatch {
            what,
            expected: dim * (len / dim + 1),
            got: len,
        });
    }
    let rows = len / dim;
    if rows > u32::MAX as usize {
        return Err(Error::invalid_param("n", rows, "more than u32::MAX rows"));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip_and_match_serde() {
        for d in [Dtype::F16, Dtype::F32] {
            assert_eq!(d.to_string().parse::<Dtype>().expect("parses"), d);
            let json = serde_json::to_string(&d).expect("serializes");
            assert_eq!(json, format!("\"{d}\""));
        }
        assert_eq!(Dtype::F16.numpy_name(), "float16");
        assert!(matches!(
            "float16".parse::<Dtype>(),
            Err(Error::InvalidParam { name: "dtype", .. })
        ));
    }

    #[test]
    fn push_and_read_back() {
        let mut s = KeyStore::empty(Dtype::F16, 3).expect("store");
        assert_eq!(s.push(&[1.0, 2.0, 3.0]).expect("push"), 0);
        assert_eq!(s.push(&[0.5, -1.0, 4.0]).expect("push"), 1);
        let mut row = [0.0; 3];
        s.row_into(1, &mut row);
        assert_eq!(row, [0.5, -1.0, 4.0]);
        assert!(s.push(&[1.0]).is_err());
        assert!(s.push(&[f32::NAN, 0.0, 0.0]).is_err());
        assert_eq!(s.scorer().score(&[1.0, 1.0, 1.0], 0), 6.0);
    }

    #[test]
    fn first_non_finite_row_finds_the_first_bad_row() {
        let dim = 3;
        let mut v = vec![0.5f32; 5000 * dim];
        let s = KeyStore::from_f32(v.clone(), dim).expect("store");
        assert_eq!(s.first_non_finite_row(), None);
        for (at, bad) in [(4500 * dim + 1, f32::NAN), (2 * dim, f32::INFINITY)] {
            v[at] = bad;
            // Stores reject non-finite input, so these are assembled directly.
            let f32s = KeyStore {
                dim,
                len: v.len() / dim,
                data: KeyData::F32(Buf::Owned(v.clone())),
            };
            let f16s = KeyStore {
                dim,
                len: v.len() / dim,
                data: KeyData::F16(Buf::Owned(v.iter().map(|&x| f16::from_f32(x)).collect())),
            };
            assert_eq!(f32s.first_non_finite_row(), Some(at / dim));
            assert_eq!(f16s.first_non_finite_row(), Some(at / dim));
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(KeyStore::from_f32(vec![], 4).is_err());
        assert!(KeyStore::from_f32(vec![1.0; 7], 4).is_err());
        assert!(KeyStore::from_f32(vec![1.0; 8], 0).is_err());
        assert!(matches!(
            KeyStore::from_f32(vec![1.0, 2.0, f32::INFINITY, 0.0], 2),
            Err(Error::NonFinite { row: 1, .. })
        ));
    }
}
