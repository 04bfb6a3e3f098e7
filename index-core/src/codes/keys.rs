//! [`KeyCodes`]: the int8 codes of a key store (affine per dimension, scaled per key), the
//! encoder every code type starts from, and [`CodeScorer`], their estimates for a beam search.

use super::{Line, Width};
use crate::error::{Error, Result};
use crate::metric::affine::Affine;
use crate::metric::int8::{I8Kernels, QuantQuery, GROUP};
use crate::store::{Estimate, KeyStore};

/// Int8 codes of a key store for traversal, affine per dimension and scaled per key
/// ([`Affine`]: `key ≈ offset + range ⊙ (scale · code)`, fitted on the keys of the build).
/// `n × dim` codes, row-major, `n` scales, `dim` offsets and ranges. Keys pushed after the
/// build keep the build's offsets and ranges; their own scale absorbs a larger magnitude.
///
/// Derived from the keys (never saved: an index file stores the keys, and loading codes them
/// again in one pass).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyCodes {
    dim: usize,
    codes: Vec<i8>,
    scales: Vec<f32>,
    affine: Affine,
}

impl KeyCodes {
    /// The codes of every key of `keys`.
    pub fn new(keys: &KeyStore) -> Self {
        let dim = keys.dim();
        let all = keys.to_f32();
        let mut c = KeyCodes {
            dim,
            codes: Vec::with_capacity(keys.len() * dim),
            scales: Vec::with_capacity(keys.len()),
            affine: Affine::fit(dim, all.chunks_exact(dim)),
        };
        let mut row = vec![0.0f32; dim];
        for key in all.chunks_exact(dim) {
            row.copy_from_slice(key);
            c.push_row(&mut row);
        }
        c
    }

    /// Appends the code of one key (`dim` values); the caller has checked its length.
    pub fn push(&mut self, key: &[f32]) -> Result<()> {
        if key.len() != self.dim {
            return Err(Error::DimensionMismatch {
                what: "key",
                expected: self.dim,
                got: key.len(),
            });
        }
        let mut row = key.to_vec();
        self.push_row(&mut row);
        Ok(())
    }

    /// Normalises `row` in place and appends its code.
    fn push_row(&mut self, row: &mut [f32]) {
        let at = self.codes.len();
        self.codes.resize(at + self.dim, 0);
        let scale = self.affine.encode(row, &mut self.codes[at..]);
        self.scales.push(scale);
    }

    /// Number of coded keys.
    pub fn len(&self) -> usize {
        self.scales.len()
    }

    /// True when no key is coded.
    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }

    /// Bytes of codes and scales (`dim + 4` per key, and `8 · dim` for offsets and ranges).
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len() + self.affine.bytes()
    }

    /// Dimension of the coded keys.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The code and scale of key `id` (`id < len()`).
    pub(crate) fn code(&self, id: u32) -> (&[i8], f32) {
        let at = id as usize * self.dim;
        (&self.codes[at..at + self.dim], self.scales[id as usize])
    }

    /// Quantizes `query` for estimates against these codes.
    pub(crate) fn quantize_query(&self, query: &[f32], quant: &mut QuantQuery) {
        quant.set_affine(query, self.affine.offset(), self.affine.range());
    }

    /// The estimates of `query` (quantized by [`KeyCodes::quantize_query`]) with `kernels`.
    pub(crate) fn scorer<'a>(
        &'a self,
        query: &'a QuantQuery,
        kernels: &'a I8Kernels,
    ) -> CodeScorer<'a> {
        CodeScorer {
            codes: self,
            query,
            kernels,
        }
    }
}

impl KeyCodes {
    /// Lines of codes per group at width `w`.
    pub(crate) fn code_lines(&self, w: Width) -> usize {
        w.code_lines(self.dim)
    }

    /// Lines per group at width `w`: the codes, the [`GROUP`] scales, the [`GROUP`] ids.
    pub(crate) fn lines_per_group(&self, w: Width) -> usize {
        self.code_lines(w) + 2
    }

    /// `groups` empty groups at width `w` (every slot code 0).
    pub(crate) fn empty_groups(&self, w: Width, groups: usize) -> Vec<Line> {
        let (codes, per) = (self.code_lines(w), self.lines_per_group(w));
        let mut lines = vec![w.empty_line(); groups * per];
        for g in 0..groups {
            lines[g * per + codes..(g + 1) * per].fill(Line([0; 64]));
        }
        lines
    }

    /// Writes key `id` (`< len()`) into slot `slot` of `group` (`lines_per_group(w)` lines, made
    /// of empty lines for the slots not written) at width `w`: its code interleaved as that
    /// width's kernel reads it ([`super::I8`], [`super::I4`]), its scale, its id.
    pub(crate) fn write_slot_as(&self, w: Width, group: &mut [Line], slot: usize, id: u32) {
        let lines = self.code_lines(w);
        let (code, scale) = self.code(id);
        let scale = w.write_code(&mut group[..lines], slot, code, scale);
        let scales: &mut [f32; GROUP] = bytemuck::cast_mut(&mut group[lines]);
        scales[slot] = scale;
        let ids: &mut [u32; GROUP] = bytemuck::cast_mut(&mut group[lines + 1]);
        ids[slot] = id;
    }

    /// [`KeyCodes::write_slot_as`] at int8, the width of the walks' inline blocks.
    pub(crate) fn write_slot(&self, group: &mut [Line], slot: usize, id: u32) {
        self.write_slot_as(Width::I8, group, slot, id)
    }

    /// Lines of int8 codes per group (`⌈dim / 4⌉`).
    pub(crate) fn quads(&self) -> usize {
        self.code_lines(Width::I8)
    }

    /// Quantizes `query` for groups at width `w` (padded to their dimensions).
    pub(crate) fn quantize_query_as(&self, w: Width, query: &[f32], quant: &mut QuantQuery) {
        self.quantize_query(query, quant);
        quant
            .codes
            .resize(w.dims_per_line() * self.code_lines(w), 0);
    }

    /// The estimates of whole consecutive groups at width `w` into `out` (16 per group).
    pub(crate) fn scan_as(&self, w: Width, quant: &QuantQuery, groups: &[Line], out: &mut [f32]) {
        w.scan(quant, bytemuck::cast_slice(groups), self.code_lines(w), out)
    }
}

/// Code estimates of one quantized query against [`KeyCodes`], with the best int8 kernels.
#[derive(Debug)]
pub struct CodeScorer<'a> {
    codes: &'a KeyCodes,
    query: &'a QuantQuery,
    kernels: &'a I8Kernels,
}

impl Estimate for CodeScorer<'_> {
    #[inline]
    fn score_ids(&self, ids: &[u32], out: &mut [f32]) {
        let c = self.codes;
        (self.kernels.gather_q8)(self.query, &c.codes, &c.scales, c.dim, ids, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::int8::i8_kernels;

    #[test]
    fn affine_estimates_track_exact_scores_with_an_outlier_dimension() {
        let (n, d) = (300usize, 32usize);
        let mut rng = crate::synth::Rng::new(9);
        // Dimension 0 is an outlier channel with a large offset and spread.
        let keys: Vec<f32> = (0..n * d)
            .map(|i| {
                if i % d == 0 {
                    40.0 + 20.0 * rng.normal()
                } else {
                    rng.normal()
                }
            })
            .collect();
        let store = KeyStore::from_f32(keys.clone(), d).expect("keys");
        let mut codes = KeyCodes::new(&store);
        codes.push(&keys[..d]).expect("push");
        assert!(codes.push(&keys[..d - 1]).is_err());
        let q: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
        let mut quant = QuantQuery::default();
        quant.set_affine(&q, codes.affine.offset(), codes.affine.range());
        let ids: Vec<u32> = (0..=n as u32).collect();
        let mut est = vec![0.0; ids.len()];
        CodeScorer {
            codes: &codes,
            query: &quant,
            kernels: i8_kernels(),
        }
        .score_ids(&ids, &mut est);
        let scorer = store.scorer();
        let spread: f32 = 20.0 * q[0].abs() + 6.0;
        for (&id, &e) in ids.iter().zip(&est) {
            let exact = scorer.score(&q, id % n as u32);
            assert!((e - exact).abs() < 0.05 * spread, "id {id}: {e} vs {exact}");
        }
    }
}
