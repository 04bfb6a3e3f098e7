//! Scoring a query against a store's keys ([`Scorer`]), and a scorer bound to one query
//! ([`QueryScorer`]) for the many calls of one search.

use super::KeysRef;
use crate::metric::int8::{i8_kernels, I8Kernels};
use crate::metric::{kernels, Kernels};

/// Computes `q · key` for ids of one store with kernels chosen once.
#[derive(Clone, Copy, Debug)]
pub struct Scorer<'a> {
    keys: KeysRef<'a>,
    dim: usize,
    kernels: &'a Kernels,
    i8_kernels: &'a I8Kernels,
}

impl<'a> Scorer<'a> {
    /// A scorer of `keys` (`dim` columns) with the CPU's best kernels.
    pub(super) fn new(keys: KeysRef<'a>, dim: usize) -> Self {
        Scorer {
            keys,
            dim,
            kernels: kernels(),
            i8_kernels: i8_kernels(),
        }
    }

    /// `q · key[id]`.
    #[inline]
    pub fn score(&self, q: &[f32], id: u32) -> f32 {
        self.with_query(q, |q, bias| bias + self.raw_score(q, id))
    }

    /// `out[i] = q · key[ids[i]]` (`out.len() == ids.len()`), prefetching the next row.
    #[inline]
    pub fn score_ids(&self, q: &[f32], ids: &[u32], out: &mut [f32]) {
        self.with_query(q, |q, bias| {
            self.raw_ids(q, ids, out);
            add_bias(out, bias);
        })
    }

    /// `out[i] = q · key[start + i]` for a contiguous range of rows.
    pub fn score_range(&self, q: &[f32], start: usize, out: &mut [f32]) {
        self.with_query(q, |q, bias| {
            self.raw_range(q, start, out);
            add_bias(out, bias);
        })
    }

    /// This scorer bound to `query`, for the many calls of one search: an int8 store's
    /// per-dimension transform ([`Affine::prepare`]) is done once, into `buf`.
    ///
    /// [`Affine::prepare`]: crate::metric::affine::Affine::prepare
    pub fn bind<'b>(&self, query: &'b [f32], buf: &'b mut Vec<f32>) -> QueryScorer<'b>
    where
        'a: 'b,
    {
        let (query, bias) = match self.keys {
            KeysRef::I8 { affine, .. } if !affine.is_identity() => {
                buf.resize(query.len(), 0.0);
                let bias = affine.prepare(query, buf);
                (&buf[..], bias)
            }
            _ => (query, 0.0),
        };
        QueryScorer {
            scorer: *self,
            query,
            bias,
        }
    }

    /// `f(q, 0)`, or for int8 keys `f(q ⊙ range, q · offset)` ([`Affine::with_query`]).
    ///
    /// [`Affine::with_query`]: crate::metric::affine::Affine::with_query
    #[inline]
    fn with_query<R>(&self, q: &[f32], f: impl FnOnce(&[f32], f32) -> R) -> R {
        match self.keys {
            KeysRef::I8 { affine, .. } => affine.with_query(q, f),
            _ => f(q, 0.0),
        }
    }

    /// [`Scorer::score`] of a transformed query, without the bias.
    #[inline]
    fn raw_score(&self, q: &[f32], id: u32) -> f32 {
        let s = id as usize * self.dim;
        match self.keys {
            KeysRef::F16(k) => (self.kernels.dot_f16)(q, &k[s..s + self.dim]),
            KeysRef::F32(k) => (self.kernels.dot_f32)(q, &k[s..s + self.dim]),
            KeysRef::I8 { codes, scales, .. } => {
                scales[id as usize] * (self.i8_kernels.dot)(q, &codes[s..s + self.dim])
            }
        }
    }

    /// [`Scorer::score_ids`] of a transformed query, without the bias.
    #[inline]
    fn raw_ids(&self, q: &[f32], ids: &[u32], out: &mut [f32]) {
        match self.keys {
            KeysRef::F16(k) => (self.kernels.gather_f16)(q, k, self.dim, ids, out),
            KeysRef::F32(k) => (self.kernels.gather_f32)(q, k, self.dim, ids, out),
            KeysRef::I8 { codes, scales, .. } => {
                (self.i8_kernels.gather)(q, codes, scales, self.dim, ids, out)
            }
        }
    }

    /// [`Scorer::score_range`] of a transformed query, without the bias.
    fn raw_range(&self, q: &[f32], start: usize, out: &mut [f32]) {
        let (d, end) = (self.dim, start + out.len());
        match self.keys {
            KeysRef::F16(k) => (self.kernels.range_f16)(q, &k[start * d..end * d], d, out),
            KeysRef::F32(k) => (self.kernels.range_f32)(q, &k[start * d..end * d], d, out),
            KeysRef::I8 { codes, scales, .. } => {
                (self.i8_kernels.range)(q, &codes[start * d..end * d], &scales[start..end], d, out)
            }
        }
    }
}

/// A [`Scorer`] bound to one query ([`Scorer::bind`]): the same scores, bit for bit, without
/// repeating an int8 store's per-query transform on every call.
#[derive(Clone, Copy, Debug)]
pub struct QueryScorer<'a> {
    scorer: Scorer<'a>,
    query: &'a [f32],
    bias: f32,
}

impl QueryScorer<'_> {
    /// `query · key[id]`.
    #[inline]
    pub fn score(&self, id: u32) -> f32 {
        self.bias + self.scorer.raw_score(self.query, id)
    }

    /// `out[i] = query · key[ids[i]]`.
    #[inline]
    pub fn score_ids(&self, ids: &[u32], out: &mut [f32]) {
        self.scorer.raw_ids(self.query, ids, out);
        add_bias(out, self.bias);
    }

    /// `out[i] = query · key[start + i]`.
    pub fn score_range(&self, start: usize, out: &mut [f32]) {
        self.scorer.raw_range(self.query, start, out);
        add_bias(out, self.bias);
    }
}

/// Adds the part of an affine int8 score common to every key (nothing for the identity).
#[inline]
fn add_bias(out: &mut [f32], bias: f32) {
    if bias != 0.0 {
        out.iter_mut().for_each(|o| *o += bias);
    }
}

/// What a beam search ranks candidates by: `out[i]` = the score of node `ids[i]` for the query
/// it was made for (exact inner products, [`QueryScorer`], or code estimates, [`crate::codes::CodeScorer`]).
pub trait Estimate {
    fn score_ids(&self, ids: &[u32], out: &mut [f32]);
}

/// Exact inner products of the query a [`QueryScorer`] was bound to.
impl Estimate for QueryScorer<'_> {
    #[inline]
    fn score_ids(&self, ids: &[u32], out: &mut [f32]) {
        QueryScorer::score_ids(self, ids, out)
    }
}
