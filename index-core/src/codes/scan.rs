//! The scan on int8 codes with an exact re-rank (`flat:codes=i8`, issue 26).
//!
//! Every key's estimate is computed from codes laid out in interleaved groups of [`GROUP`] keys
//! (one `vpdpbusd` per 4 dimensions of 16 keys, [`crate::metric::int8::I8Kernels::group_q8`],
//! reading `dim + 8` bytes per key in one stream), the best `candidates` estimates are kept,
//! and those are scored on the stored keys: the result keeps the contract of every search
//! (exact scores, best first). At short contexts, where the codes of a head fit in cache, this
//! costs less per query than any walk or list probe; at long ones it reads every code, and the
//! graph's walk wins.

use crate::codes::{rerank_exact, top_ids, KeyCodes, Line, Width};
use crate::error::Result;
use crate::metric::int8::{i8_kernels, GROUP};
use crate::scratch::Scratch;
use crate::search::SearchOutput;
use crate::store::{KeyStore, Scorer};

/// The codes of every key in interleaved groups of [`GROUP`], in id order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScanCodes {
    codes: KeyCodes,
    width: Width,
    lines: Vec<Line>,
}

impl ScanCodes {
    /// The codes of every key of `keys` in groups of width `width`.
    pub(crate) fn new(keys: &KeyStore, width: Width) -> Self {
        let codes = KeyCodes::new(keys);
        let lines = codes.empty_groups(width, codes.len().div_ceil(GROUP));
        let mut scan = ScanCodes {
            codes,
            width,
            lines,
        };
        for id in 0..scan.codes.len() {
            scan.write(id);
        }
        scan
    }

    /// Writes key `id`'s slot (its group exists).
    fn write(&mut self, id: usize) {
        let per = self.codes.lines_per_group(self.width);
        let at = (id / GROUP) * per;
        self.codes.write_slot_as(
            self.width,
            &mut self.lines[at..at + per],
            id % GROUP,
            id as u32,
        );
    }

    /// Appends the code of one more key. Errors: wrong dimension.
    pub fn push(&mut self, key: &[f32]) -> Result<()> {
        self.codes.push(key)?;
        let id = self.codes.len() - 1;
        if id.is_multiple_of(GROUP) {
            self.lines.extend(self.codes.empty_groups(self.width, 1));
        }
        self.write(id);
        Ok(())
    }

    /// Bytes held: the groups (`dim` rounded up to 4, plus 8, per key at int8; half the codes
    /// at int4) and the int8 key codes they are made from (`dim + 4` per key).
    pub fn bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>() + self.codes.bytes()
    }

    /// The best `k` keys for `query` by exact score (`exact` scores the same ids), from the best
    /// `candidates` (at least `k`) by code estimate. `out.stats.code_estimates` counts the
    /// estimates (every key), `distance_computations` the exact products.
    pub fn search(
        &self,
        exact: &Scorer<'_>,
        query: &[f32],
        k: usize,
        candidates: usize,
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) {
        out.clear();
        if k == 0 {
            return;
        }
        let mut quant = std::mem::take(&mut scratch.quant);
        self.codes.quantize_query_as(self.width, query, &mut quant);
        let n = self.codes.len();
        let Scratch {
            estimates,
            sample,
            picked,
            ..
        } = scratch;
        let per = self.codes.lines_per_group(self.width);
        estimates.resize(self.lines.len() / per * GROUP, 0.0);
        self.codes
            .scan_as(self.width, &quant, &self.lines, estimates);
        top_ids(
            &estimates[..n],
            candidates.max(k),
            sample,
            picked,
            &mut out.ids,
        );
        scratch.quant = quant;
        out.stats.distance_computations = self.codes.len() as u64;
        rerank_exact(exact, query, k, scratch, out);
    }
}

impl ScanCodes {
    /// Whether [`ScanCodes::search_rows`] reads the codes once per batch (int8 groups with
    /// a batched kernel on this CPU) rather than once per query.
    pub fn batches(&self) -> bool {
        self.width == Width::I8 && i8_kernels().scan_q8_many.is_some()
    }

    /// [`ScanCodes::search`] of every query of `queries` (whole rows of the keys' dimension)
    /// into `outs` (one per query), query `r` re-ranking its best `candidates(r)` estimates:
    /// the same results and counts as one search per query. At int8 the estimates of all the
    /// queries come from one pass over the codes ([`crate::metric::int8::I8Kernels::scan_q8_rows`]).
    pub fn search_rows(
        &self,
        exact: &Scorer<'_>,
        queries: &[f32],
        k: usize,
        candidates: &dyn Fn(usize) -> usize,
        scratch: &mut Scratch,
        outs: &mut [SearchOutput],
    ) {
        let dim = self.codes.dim();
        if self.width != Width::I8 || dim == 0 {
            for (r, (query, out)) in queries.chunks_exact(dim.max(1)).zip(outs).enumerate() {
                self.search(exact, query, k, candidates(r), scratch, out);
            }
            return;
        }
        let rows = outs.len().min(queries.len() / dim);
        let mut quants = std::mem::take(&mut scratch.quants);
        quants.resize_with(rows, Default::default);
        for (query, quant) in queries.chunks_exact(dim).zip(quants.iter_mut()) {
            self.codes.quantize_query_as(self.width, query, quant);
        }
        let n = self.codes.len();
        let per = self.codes.lines_per_group(self.width);
        let stride = self.lines.len() / per * GROUP;
        let mut estimates = std::mem::take(&mut scratch.estimates);
        estimates.resize(rows * stride, 0.0);
        i8_kernels().scan_q8_rows(
            &quants,
            bytemuck::cast_slice(&self.lines),
            self.codes.code_lines(self.width),
            &mut estimates,
        );
        for (r, (query, out)) in queries.chunks_exact(dim).zip(outs).take(rows).enumerate() {
            out.clear();
            if k == 0 {
                continue;
            }
            let Scratch { sample, picked, .. } = &mut *scratch;
            let row = &estimates[r * stride..r * stride + n];
            top_ids(row, candidates(r).max(k), sample, picked, &mut out.ids);
            out.stats.distance_computations = n as u64;
            rerank_exact(exact, query, k, scratch, out);
        }
        scratch.estimates = estimates;
        scratch.quants = quants;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flat::FlatIndex;
    use crate::search::{AnnIndex, SearchParams};
    use std::sync::Arc;

    #[test]
    fn scan_with_every_candidate_is_the_exact_top_k_and_pushes_extend_it() {
        for width in [Width::I8, Width::I4] {
            scan_at(width);
        }
    }

    fn scan_at(width: Width) {
        let (n, d) = (250usize, 12usize);
        let data = crate::synth::ood(n + 40, 4, d, 5);
        let keys = KeyStore::from_f32(data.keys[..n * d].to_vec(), d).expect("keys");
        let mut scan = ScanCodes::new(&keys, width);
        let mut all = keys.clone();
        // 40 pushes: the last group fills, new ones open.
        for key in data.keys[n * d..].chunks_exact(d) {
            scan.push(key).expect("push");
            all.push(key).expect("push");
        }
        assert!(scan.push(&[0.0; 3]).is_err());
        // Every slot holds its own id, and nothing after the last key.
        let per = scan.codes.lines_per_group(width);
        assert_eq!(scan.lines.len(), (n + 40).div_ceil(GROUP) * per);
        for id in 0..n + 40 {
            let group = &scan.lines[(id / GROUP) * per..];
            let ids: &[u32; GROUP] = bytemuck::cast_ref(&group[per - 1]);
            assert_eq!(ids[id % GROUP], id as u32);
        }
        let flat = FlatIndex::new(Arc::new(all.clone()));
        let scorer = all.scorer();
        let mut scratch = Scratch::new(n + 40);
        let mut out = SearchOutput::default();
        for q in data.test_queries.chunks_exact(d).take(5) {
            scan.search(&scorer, q, 10, n + 40, &mut scratch, &mut out);
            let want = flat
                .search(q, 10, &SearchParams::default(), &mut scratch)
                .expect("flat");
            assert_eq!(out.ids, want.ids);
            assert_eq!(out.scores, want.scores);
            assert_eq!(out.stats.code_estimates, (n + 40) as u64);
            assert_eq!(out.stats.distance_computations, (n + 40) as u64);
            scan.search(&scorer, q, 10, 30, &mut scratch, &mut out);
            assert_eq!(out.stats.distance_computations, 30);
            assert_eq!(out.ids.len(), 10);
            assert!(out.scores.windows(2).all(|w| w[0] >= w[1]));
        }
    }

    /// 4-bit estimates differ from the int8 ones by at most the 4-bit rounding: half a step of
    /// 127/7 int8 units (plus the int8 code's own half unit) per dimension, weighted by |q'_i|.
    #[test]
    fn int4_estimates_stay_within_the_rounding_bound_of_int8() {
        let (n, d) = (100usize, 20usize);
        let data = crate::synth::ood(n, 4, d, 11);
        let keys = KeyStore::from_f32(data.keys.clone(), d).expect("keys");
        let (s8, s4) = (
            ScanCodes::new(&keys, Width::I8),
            ScanCodes::new(&keys, Width::I4),
        );
        for q in data.test_queries.chunks_exact(d) {
            let (mut q8, mut q4) = (Default::default(), Default::default());
            s8.codes.quantize_query_as(Width::I8, q, &mut q8);
            s4.codes.quantize_query_as(Width::I4, q, &mut q4);
            let mut e8 = vec![0.0; s8.lines.len() / s8.codes.lines_per_group(Width::I8) * GROUP];
            let mut e4 = vec![0.0; s4.lines.len() / s4.codes.lines_per_group(Width::I4) * GROUP];
            s8.codes.scan_as(Width::I8, &q8, &s8.lines, &mut e8);
            s4.codes.scan_as(Width::I4, &q4, &s4.lines, &mut e4);
            let weight: f32 = q8.codes.iter().map(|&c| f32::from(c).abs()).sum();
            for id in 0..n {
                let (_, scale) = s8.codes.code(id as u32);
                let bound = q8.scale * scale * weight * (127.0 / 14.0 + 0.5) * 1.001 + 1e-4;
                assert!(
                    (e4[id] - e8[id]).abs() <= bound,
                    "key {id}: {} vs {} (bound {bound})",
                    e4[id],
                    e8[id]
                );
            }
        }
    }
}
