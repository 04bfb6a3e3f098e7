//! Per-dimension affine normalisation of int8 key codes (issue 26):
//! `key_i ≈ offset_i + range_i · scale · code_i`, with `offset` and `range` the middle and
//! half-width of each dimension over the keys it was fitted on, and `scale` the per-key scale
//! of [`super::int8::quantize_row`] applied to the normalised key.
//!
//! Per-key scales alone lose the small dimensions beside the outlier channels of LLM keys
//! (flat-scan recall@100 against the f32 truth, docs/bench/codes: Gemma 3 q2k 0.932 per key,
//! 0.9925 affine and per key; SmolLM2 0.9918 and 0.9935). Keys coded after the fit keep its
//! offsets and ranges; their own scale absorbs a larger magnitude, so nothing is clipped.
//!
//! Scoring an f32 query against such codes: `q · key = q · offset + scale · ((q ⊙ range) · code)`,
//! so one transformed query ([`Affine::with_query`]) serves every key.

use crate::error::{Error, Result};

/// Stack room for the transformed query of [`Affine::with_query`] (longer queries allocate).
const STACK_DIM: usize = 512;

/// Per-dimension offsets and ranges of int8 codes (both `dim` long, every range positive).
/// The identity (`offset = 0`, `range = 1`) gives plain per-key codes.
#[derive(Clone, Debug, PartialEq)]
pub struct Affine {
    offset: Vec<f32>,
    range: Vec<f32>,
    identity: bool,
}

impl Affine {
    /// Offsets 0 and ranges 1: codes scaled per key only.
    pub fn identity(dim: usize) -> Self {
        Affine {
            offset: vec![0.0; dim],
            range: vec![1.0; dim],
            identity: true,
        }
    }

    /// The middle and half-width of each dimension over `rows` (each `dim` long; a constant or
    /// empty dimension gets range 1). No rows: the identity.
    pub fn fit<'a>(dim: usize, rows: impl IntoIterator<Item = &'a [f32]>) -> Self {
        let mut lo = vec![f32::INFINITY; dim];
        let mut hi = vec![f32::NEG_INFINITY; dim];
        for row in rows {
            for ((l, h), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(row) {
                *l = l.min(x);
                *h = h.max(x);
            }
        }
        let (offset, range): (Vec<f32>, Vec<f32>) = lo
            .iter()
            .zip(&hi)
            .map(|(&l, &h)| {
                let half = (h - l) / 2.0;
                let range = if half > 0.0 && half.is_finite() {
                    half
                } else {
                    1.0
                };
                let mid = if l.is_finite() {
                    l + half.max(0.0)
                } else {
                    0.0
                };
                (mid, range)
            })
            .unzip();
        let identity = is_identity(&offset, &range);
        Affine {
            offset,
            range,
            identity,
        }
    }

    /// Offsets and ranges read back (from a file): equal lengths, finite offsets, finite
    /// positive ranges.
    pub fn from_parts(offset: Vec<f32>, range: Vec<f32>) -> Result<Self> {
        if offset.len() != range.len() {
            return Err(Error::DimensionMismatch {
                what: "int8 key ranges (one per dimension)",
                expected: offset.len(),
                got: range.len(),
            });
        }
        if let Some(i) = offset.iter().position(|o| !o.is_finite()) {
            return Err(Error::invalid_param(
                "int8 key offset",
                offset[i],
                format!("dimension {i}: must be finite"),
            ));
        }
        if let Some(i) = range.iter().position(|r| !(r.is_finite() && *r > 0.0)) {
            return Err(Error::invalid_param(
                "int8 key range",
                range[i],
                format!("dimension {i}: must be finite and positive"),
            ));
        }
        let identity = is_identity(&offset, &range);
        Ok(Affine {
            offset,
            range,
            identity,
        })
    }

    /// Dimension count.
    pub fn dim(&self) -> usize {
        self.offset.len()
    }

    /// Per-dimension offsets.
    pub fn offset(&self) -> &[f32] {
        &self.offset
    }

    /// Per-dimension ranges.
    pub fn range(&self) -> &[f32] {
        &self.range
    }

    /// True for offsets 0 and ranges 1 (plain per-key codes).
    pub fn is_identity(&self) -> bool {
        self.identity
    }

    /// Normalises `row` in place and codes it into `codes` (both `dim` long); returns the
    /// key's scale.
    pub fn encode(&self, row: &mut [f32], codes: &mut [i8]) -> f32 {
        if !self.identity {
            for ((x, o), r) in row.iter_mut().zip(&self.offset).zip(&self.range) {
                *x = (*x - o) / r;
            }
        }
        super::int8::quantize_row(row, codes)
    }

    /// The key that `scale` and `codes` stand for, written into `out` (`dim` long).
    pub fn decode(&self, scale: f32, codes: &[i8], out: &mut [f32]) {
        for (((o, &c), off), r) in out.iter_mut().zip(codes).zip(&self.offset).zip(&self.range) {
            *o = off + r * scale * f32::from(c);
        }
    }

    /// Calls `f(q ⊙ range, q · offset)`: scoring a key against the first and adding the second
    /// gives `q · key` (the identity passes `q` and 0 without a copy).
    #[inline]
    pub fn with_query<R>(&self, q: &[f32], f: impl FnOnce(&[f32], f32) -> R) -> R {
        if self.identity {
            return f(q, 0.0);
        }
        if q.len() <= STACK_DIM {
            let mut buf = [0.0f32; STACK_DIM];
            let buf = &mut buf[..q.len()];
            let bias = self.prepare(q, buf);
            f(buf, bias)
        } else {
            let mut buf = vec![0.0f32; q.len()];
            let bias = self.prepare(q, &mut buf);
            f(&buf, bias)
        }
    }

    /// Writes `q ⊙ range` into `out` (the length of `q`) and returns `q · offset`.
    #[inline]
    pub fn prepare(&self, q: &[f32], out: &mut [f32]) -> f32 {
        for ((b, a), r) in out.iter_mut().zip(q).zip(&self.range) {
            *b = a * r;
        }
        q.iter().zip(&self.offset).map(|(a, b)| a * b).sum()
    }

    /// Bytes of offsets and ranges.
    pub fn bytes(&self) -> usize {
        4 * (self.offset.len() + self.range.len())
    }
}

impl Default for Affine {
    /// The identity of no dimension.
    fn default() -> Self {
        Affine::identity(0)
    }
}

fn is_identity(offset: &[f32], range: &[f32]) -> bool {
    offset.iter().all(|&o| o == 0.0) && range.iter().all(|&r| r == 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_and_query_agree_with_the_key() {
        let rows = [
            [10.0f32, 0.01, -0.02, 0.5],
            [12.0, -0.03, 0.01, -0.5],
            [11.0, 0.02, 0.0, 0.25],
        ];
        let a = Affine::fit(4, rows.iter().map(|r| &r[..]));
        assert!(!a.is_identity());
        assert_eq!(a.offset()[0], 11.0);
        assert_eq!(a.range()[0], 1.0);
        let q = [0.3f32, -2.0, 4.0, 1.0];
        for r in &rows {
            let mut x = *r;
            let mut codes = [0i8; 4];
            let scale = a.encode(&mut x, &mut codes);
            let mut back = [0.0f32; 4];
            a.decode(scale, &codes, &mut back);
            for (b, k) in back.iter().zip(r) {
                // Half a step of the normalised key, times the dimension's range.
                assert!((b - k).abs() <= 1.0 / 127.0 + 1e-6, "{b} vs {k}");
            }
            let exact: f32 = q.iter().zip(&back).map(|(x, y)| x * y).sum();
            let via = a.with_query(&q, |qr, bias| {
                bias + scale
                    * qr.iter()
                        .zip(&codes)
                        .map(|(x, &c)| x * f32::from(c))
                        .sum::<f32>()
            });
            assert!((via - exact).abs() < 1e-4, "{via} vs {exact}");
        }
        // The small dimensions keep their detail next to the outlier channel.
        let mut x = rows[0];
        let mut codes = [0i8; 4];
        a.encode(&mut x, &mut codes);
        assert!(codes[1].abs() > 30, "{codes:?}");
    }

    #[test]
    fn identity_and_bad_parts() {
        let a = Affine::fit(3, std::iter::empty());
        assert!(a.is_identity());
        assert_eq!(a, Affine::identity(3));
        let c = Affine::fit(2, [&[1.0f32, 2.0][..]]);
        assert_eq!(c.range(), &[1.0, 1.0]);
        assert_eq!(c.offset(), &[1.0, 2.0]);
        assert!(Affine::from_parts(vec![0.0; 2], vec![1.0; 3]).is_err());
        assert!(Affine::from_parts(vec![f32::NAN, 0.0], vec![1.0; 2]).is_err());
        assert!(Affine::from_parts(vec![0.0; 2], vec![1.0, 0.0]).is_err());
        assert!(Affine::from_parts(vec![0.0; 2], vec![1.0, -1.0]).is_err());
        assert!(Affine::from_parts(vec![0.0; 2], vec![1.0; 2])
            .expect("valid")
            .is_identity());
        let q = vec![1.0f32; 600];
        let big = Affine::from_parts(vec![1.0; 600], vec![2.0; 600]).expect("valid");
        assert_eq!(big.with_query(&q, |qr, b| (qr[599], b)), (2.0, 600.0));
    }
}
