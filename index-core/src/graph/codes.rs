//! Graph traversal on int8 key codes with an exact re-rank (issue 26).
//!
//! ```text
//!  query ──quantize──► QuantQuery ──beam_search_by(CodeScorer)──► best `rerank` by estimate
//!                                   (integer dot products, VNNI)          │
//!                                                                         ▼
//!            SearchOutput (exact scores, best first) ◄──top k── exact scores (Scorer, f16/f32)
//! ```
//!
//! The traversal reads `dim + 4` bytes per scored key instead of `2·dim` (f16) and scores it
//! with an integer kernel; only the final candidates are scored on the stored keys, so results
//! keep the contract of every search (exact scores of the store, best first). Stats count the
//! estimates in `code_estimates` and the exact products in `distance_computations`.

use super::inline::InlineCodes;
use super::search::{beam_search_by, walk, BeamSettings, Estimate};
use super::Neighbors;
use crate::error::{Error, Result};
use crate::metric::affine::Affine;
use crate::metric::int8::{i8_kernels, GroupQ8, I8Kernels, QuantQuery, GROUP};
use crate::scratch::Scratch;
use crate::search::SearchOutput;
use crate::store::{KeyStore, Scorer};

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

// ---------------------------------------------------------------- interleaved groups

/// The width of the codes in interleaved groups: int8 (4 dimensions per line,
/// [`crate::metric::int8::group_q8`]) or int4 (8 per line, [`crate::metric::int8::scan_q4`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Width {
    #[default]
    I8,
    I4,
}

/// A line of empty int4 slots: code 0 (nibble 8) in every dimension.
const EMPTY_LINE4: Line = Line([0x88; 64]);

impl KeyCodes {
    /// Lines of codes per group at width `w`.
    pub(crate) fn code_lines(&self, w: Width) -> usize {
        match w {
            Width::I8 => self.dim.div_ceil(4),
            Width::I4 => self.dim.div_ceil(8),
        }
    }

    /// Lines per group at width `w`: the codes, the [`GROUP`] scales, the [`GROUP`] ids.
    pub(crate) fn lines_per_group(&self, w: Width) -> usize {
        self.code_lines(w) + 2
    }

    /// `groups` empty groups at width `w` (every slot code 0).
    pub(crate) fn empty_groups(&self, w: Width, groups: usize) -> Vec<Line> {
        let (codes, per) = (self.code_lines(w), self.lines_per_group(w));
        let empty = if w == Width::I4 {
            EMPTY_LINE4
        } else {
            EMPTY_LINE
        };
        let mut lines = vec![empty; groups * per];
        for g in 0..groups {
            lines[g * per + codes..(g + 1) * per].fill(Line([0; 64]));
        }
        lines
    }

    /// [`KeyCodes::write_slot`] at width `w`. At int4 a key's int8 code `c` becomes
    /// `round(7c / 127)` (in `-7..=7`, stored as `+ 8`) and its scale `127 / 7` times larger.
    pub(crate) fn write_slot_as(&self, w: Width, group: &mut [Line], slot: usize, id: u32) {
        if w == Width::I8 {
            return self.write_slot(group, slot, id);
        }
        let octets = self.code_lines(w);
        let (code, scale) = self.code(id);
        for (i, &c) in code.iter().enumerate() {
            let n = ((f32::from(c) * 7.0 / 127.0).round() as i32 + 8) as u8;
            let byte = &mut group[i / 8].0[4 * slot + i % 4];
            if i % 8 < 4 {
                *byte = (*byte & 0xf0) | n;
            } else {
                *byte = (*byte & 0x0f) | (n << 4);
            }
        }
        let scales: &mut [f32; GROUP] = bytemuck::cast_mut(&mut group[octets]);
        scales[slot] = scale * (127.0 / 7.0);
        let ids: &mut [u32; GROUP] = bytemuck::cast_mut(&mut group[octets + 1]);
        ids[slot] = id;
    }

    /// Quantizes `query` for groups at width `w` (padded to their dimensions).
    pub(crate) fn quantize_query_as(&self, w: Width, query: &[f32], quant: &mut QuantQuery) {
        self.quantize_query(query, quant);
        let per_line = if w == Width::I4 { 8 } else { 4 };
        quant.codes.resize(per_line * self.code_lines(w), 0);
    }

    /// The estimates of whole consecutive groups at width `w` into `out` (16 per group).
    pub(crate) fn scan_as(&self, w: Width, quant: &QuantQuery, groups: &[Line], out: &mut [f32]) {
        let k = i8_kernels();
        let bytes = bytemuck::cast_slice(groups);
        match w {
            Width::I8 => (k.scan_q8)(quant, bytes, self.code_lines(w), out),
            Width::I4 => (k.scan_q4)(quant, bytes, self.code_lines(w), out),
        }
    }
}

/// Where [`scan_groups`] sends the estimates of each group.
pub(crate) trait GroupSink {
    /// Estimates at or below this are not wanted (read once per group).
    fn floor(&self) -> f32;
    /// The estimates of one group: `mask` has the bits of the valid slots above the floor
    /// (never 0), `ids` the group's ids.
    fn take(&mut self, mask: u32, ids: &[u32; GROUP], est: &[f32; GROUP]);
}

/// One cache line of interleaved groups ([`KeyCodes::write_slot`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// A line of empty slots: code 0 (byte `0x80`) in every dimension.
pub(crate) const EMPTY_LINE: Line = Line([0x80; 64]);
const _: () = assert!(4 * GROUP == 64, "a line holds 4 dimensions of a group");

impl KeyCodes {
    /// Lines of codes per group (`⌈dim / 4⌉`).
    pub(crate) fn quads(&self) -> usize {
        self.dim.div_ceil(4)
    }

    /// Writes key `id` (`< len()`) into slot `slot` of `group` (`group_lines()` lines, made of
    /// [`EMPTY_LINE`]s for the slots not written): its code interleaved by 4 dimensions as
    /// [`crate::metric::int8::group_q8`] reads it, its scale, its id.
    pub(crate) fn write_slot(&self, group: &mut [Line], slot: usize, id: u32) {
        let quads = self.quads();
        let (code, scale) = self.code(id);
        for (i, &c) in code.iter().enumerate() {
            group[i / 4].0[4 * slot + i % 4] = (c as u8) ^ 0x80;
        }
        let scales: &mut [f32; GROUP] = bytemuck::cast_mut(&mut group[quads]);
        scales[slot] = scale;
        let ids: &mut [u32; GROUP] = bytemuck::cast_mut(&mut group[quads + 1]);
        ids[slot] = id;
    }
}

/// The estimates of the first `count` slots of consecutive `groups` (of `quads + 2` lines) for
/// `query` (its codes padded to `4 · quads`), handed to `sink` ([`GroupSink`]) group by group.
#[inline(always)]
pub(crate) fn scan_groups<S: GroupSink + ?Sized>(
    groups: &[Line],
    quads: usize,
    count: usize,
    query: &QuantQuery,
    group_q8: GroupQ8,
    sink: &mut S,
) {
    let mut dots = [0i32; GROUP];
    let mut est = [0.0f32; GROUP];
    let mut left = count;
    for group in groups.chunks_exact(quads + 2) {
        if left == 0 {
            break;
        }
        let (codes, rest) = group.split_at(quads);
        group_q8(&query.codes, bytemuck::cast_slice(codes), &mut dots);
        let scales: &[f32; GROUP] = bytemuck::cast_ref(&rest[0]);
        let f = sink.floor();
        let mut mask = 0u32;
        for (s, e) in est.iter_mut().enumerate() {
            *e = query.estimate(dots[s], scales[s]);
            mask |= u32::from(*e > f) << s;
        }
        let valid = left.min(GROUP);
        left -= valid;
        mask &= ((1u64 << valid) - 1) as u32;
        if mask != 0 {
            sink.take(mask, bytemuck::cast_ref(&rest[1]), &est);
        }
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

/// A beam search over `graph` ranked by code estimates of `codes`, then the best `rerank`
/// candidates (at least `settings.k`; `0` takes the whole list of `settings.ef`) scored exactly
/// with `exact`; writes the best `settings.k` of them into `out`, exact scores best first.
/// `out.stats.code_estimates` counts the estimates, `distance_computations` the exact products.
///
/// With `inline` (the blocks of `graph` made from `codes`), each expanded node's neighbours are
/// estimated from its block ([`InlineCodes`]), every one counted; else the walk gathers the codes
/// of the unvisited ones.
///
/// `codes` must code the keys `exact` scores (the same ids); ids at or beyond either are
/// skipped by the traversal as in [`super::beam_search`].
#[allow(clippy::too_many_arguments)]
pub fn search_codes<G: Neighbors + ?Sized>(
    graph: &G,
    codes: &KeyCodes,
    inline: Option<&InlineCodes>,
    exact: &Scorer<'_>,
    query: &[f32],
    entries: &[&[u32]],
    settings: &BeamSettings,
    rerank: usize,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    let mut quant = std::mem::take(&mut scratch.quant);
    codes.quantize_query_as(Width::I8, query, &mut quant);
    let candidates = if rerank == 0 { settings.ef } else { rerank }.max(settings.k);
    let traversal = BeamSettings {
        k: candidates,
        ..*settings
    };
    match inline {
        Some(inline) => walk(
            &inline.walk(codes, &quant),
            entries,
            &traversal,
            scratch,
            out,
        ),
        None => {
            let est = codes.scorer(&quant, i8_kernels());
            beam_search_by(graph, &est, entries, &traversal, scratch, out)
        }
    }
    scratch.quant = quant;
    rerank_exact(exact, query, settings.k, scratch, out);
}

/// Replaces the candidates of a traversal on codes in `out` (ranked by estimate, every
/// estimate counted in `distance_computations`) with the best `k` of them by `exact` score,
/// best first; the estimates move to `code_estimates` and `distance_computations` counts the
/// exact products.
pub(crate) fn rerank_exact(
    exact: &Scorer<'_>,
    query: &[f32],
    k: usize,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    let estimates = out.stats.distance_computations;
    let Scratch { best, scores, .. } = scratch;
    scores.resize(out.ids.len(), 0.0);
    exact.score_ids(query, &out.ids, scores);
    best.reset(k);
    for (&id, &score) in out.ids.iter().zip(scores.iter()) {
        best.push(score, id);
    }
    let exact_products = out.ids.len() as u64;
    out.ids.clear();
    out.scores.clear();
    best.drain_sorted(&mut out.ids, &mut out.scores);
    out.stats.distance_computations = exact_products;
    out.stats.code_estimates = estimates;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{beam_search, Csr};

    #[test]
    fn codes_search_returns_exact_scores_best_first() {
        let data = crate::synth::ood(400, 4, 16, 3);
        let keys = KeyStore::from_f32(data.keys.clone(), 16).expect("keys");
        // A ring with chords: every node reachable.
        let lists: Vec<Vec<u32>> = (0..400u32)
            .map(|v| {
                vec![
                    (v + 1) % 400,
                    (v + 7) % 400,
                    (v + 53) % 400,
                    (v + 399) % 400,
                ]
            })
            .collect();
        let g = Csr::from_lists(&lists).expect("csr");
        let codes = KeyCodes::new(&keys);
        assert_eq!((codes.len(), codes.bytes()), (400, 400 * 20 + 8 * 16));
        let scorer = keys.scorer();
        let mut scratch = Scratch::new(400);
        let (mut out, mut plain) = (SearchOutput::default(), SearchOutput::default());
        let q = &data.test_queries[..16];
        let settings = BeamSettings::new(400, 10);
        let inline = InlineCodes::new(&g, &codes);
        beam_search(&g, &scorer, q, &[&[0]], &settings, &mut scratch, &mut plain);
        for layout in [None, Some(&inline)] {
            search_codes(
                &g,
                &codes,
                layout,
                &scorer,
                q,
                &[&[0]],
                &settings,
                0,
                &mut scratch,
                &mut out,
            );
            // ef = n: every key is estimated and re-ranked, so the result is the exact top-10.
            assert_eq!(out.ids, plain.ids);
            assert_eq!(out.scores, plain.scores);
            assert_eq!(out.stats.distance_computations, 400);
            for (&id, &s) in out.ids.iter().zip(&out.scores) {
                assert_eq!(s.to_bits(), scorer.score(q, id).to_bits());
            }
            // The gather walk estimates each key once; the inline walk estimates every
            // neighbour of every expanded node.
            match layout {
                None => assert_eq!(out.stats.code_estimates, 400),
                Some(_) => assert!(out.stats.code_estimates >= 399),
            }
            // A re-rank of 20 scores 20 keys exactly.
            search_codes(
                &g,
                &codes,
                layout,
                &scorer,
                q,
                &[&[0]],
                &settings,
                20,
                &mut scratch,
                &mut out,
            );
            assert_eq!(out.stats.distance_computations, 20);
            assert!(out.scores.windows(2).all(|w| w[0] >= w[1]));
        }
    }

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
