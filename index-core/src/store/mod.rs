//! Key storage: `n × dim` keys, row-major, in f16 or f32.
//!
//! One [`KeyStore`] holds the keys of one KV head. The query heads of a GQA group share it
//! through an `Arc<KeyStore>`: every index of those heads points at the same memory. Decode
//! appends keys ([`KeyStore::push`]); ids are `u32` row numbers and never change.
//!
//! Rows are owned or borrowed from a read-only file mapping ([`crate::io`]); both are read
//! through the same accessors, so searching a mapped store copies nothing.

use crate::error::{check_finite, Error, Result};
use crate::io::Buf;
use crate::metric::{kernels, Kernels};
use half::f16;

/// Element type of stored keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F16,
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }

    /// The name (`f16`, `f32`), as files, index specs and the command line spell it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
        }
    }

    /// The name numpy gives the type (`float16`, `float32`).
    pub fn numpy_name(self) -> &'static str {
        match self {
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
        }
    }
}

/// [`Dtype::name`].
impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `f16` or `f32` (what [`Dtype`]'s `Display` prints).
impl std::str::FromStr for Dtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        [Dtype::F16, Dtype::F32]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| Error::invalid_param("dtype", s, "expected f16 or f32"))
    }
}

/// Typed view of the key rows: `n × dim`, row-major.
#[derive(Clone, Copy, Debug)]
pub enum KeysRef<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

#[derive(Clone, Debug)]
enum KeyData {
    F16(Buf<f16>),
    F32(Buf<f32>),
}

/// `n × dim` keys of one head, row-major, f16 or f32.
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

    /// An empty store of the given element type, to be filled by [`KeyStore::push`].
    pub fn empty(dtype: Dtype, dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::invalid_param("dim", 0, "must be positive"));
        }
        let data = match dtype {
            Dtype::F16 => KeyData::F16(Buf::default()),
            Dtype::F32 => KeyData::F32(Buf::default()),
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

    /// Row of the first non-finite value, if any (a full scan; file verification uses it).
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
        };
        Some(i / self.dim)
    }

    /// True when the rows are borrowed from a file mapping rather than owned.
    pub fn is_mapped(&self) -> bool {
        match &self.data {
            KeyData::F16(b) => b.is_mapped(),
            KeyData::F32(b) => b.is_mapped(),
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
        }
    }

    /// Bytes held by the key rows.
    pub fn bytes(&self) -> usize {
        self.len * self.dim * self.dtype().size()
    }

    /// Typed view of all rows.
    pub fn rows(&self) -> KeysRef<'_> {
        match &self.data {
            KeyData::F16(v) => KeysRef::F16(v.as_slice()),
            KeyData::F32(v) => KeysRef::F32(v.as_slice()),
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
            KeysRef::F16(v) => {
                for (o, x) in out.iter_mut().zip(&v[s..s + self.dim]) {
                    *o = x.to_f32();
                }
            }
            KeysRef::F32(v) => out.copy_from_slice(&v[s..s + self.dim]),
        }
    }

    /// All keys converted to f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        match self.rows() {
            KeysRef::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            KeysRef::F32(v) => v.to_vec(),
        }
    }

    /// A scorer bound to this store and the CPU's best kernels.
    pub fn scorer(&self) -> Scorer<'_> {
        Scorer {
            keys: self.rows(),
            dim: self.dim,
            kernels: kernels(),
        }
    }
}

/// Computes `q · key` for ids of one store with kernels chosen once.
#[derive(Clone, Copy, Debug)]
pub struct Scorer<'a> {
    keys: KeysRef<'a>,
    dim: usize,
    kernels: &'a Kernels,
}

impl Scorer<'_> {
    /// `q · key[id]`.
    #[inline]
    pub fn score(&self, q: &[f32], id: u32) -> f32 {
        let s = id as usize * self.dim;
        match self.keys {
            KeysRef::F16(k) => (self.kernels.dot_f16)(q, &k[s..s + self.dim]),
            KeysRef::F32(k) => (self.kernels.dot_f32)(q, &k[s..s + self.dim]),
        }
    }

    /// `out[i] = q · key[ids[i]]` (`out.len() == ids.len()`), prefetching the next row.
    #[inline]
    pub fn score_ids(&self, q: &[f32], ids: &[u32], out: &mut [f32]) {
        match self.keys {
            KeysRef::F16(k) => (self.kernels.gather_f16)(q, k, self.dim, ids, out),
            KeysRef::F32(k) => (self.kernels.gather_f32)(q, k, self.dim, ids, out),
        }
    }

    /// `out[i] = q · key[start + i]` for a contiguous range of rows.
    pub fn score_range(&self, q: &[f32], start: usize, out: &mut [f32]) {
        let (d, end) = (self.dim, start + out.len());
        match self.keys {
            KeysRef::F16(k) => (self.kernels.range_f16)(q, &k[start * d..end * d], d, out),
            KeysRef::F32(k) => (self.kernels.range_f32)(q, &k[start * d..end * d], d, out),
        }
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
