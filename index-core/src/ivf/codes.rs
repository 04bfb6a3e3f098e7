//! IVF lists scanned on int8 codes with an exact re-rank (`ivf:codes=i8`, issue 26).
//!
//! Each list's keys are coded ([`KeyCodes`]) into interleaved groups of [`GROUP`] (the list
//! padded to whole groups, so a probe reads its groups as one stream), estimated with one
//! `vpdpbusd` per 4 dimensions of 16 keys ([`crate::metric::int8::I8Kernels::scan_q8`]); the
//! best candidates of all probed lists are then scored on the list-ordered keys. Results keep
//! the contract of every search: exact scores of the store, best first.

use crate::codes::{top_ids, KeyCodes, Line, Width};
use crate::metric::int8::GROUP;
use crate::scratch::Scratch;
use crate::store::KeyStore;

/// The codes of the list-ordered keys, list by list in whole groups.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListCodes {
    codes: KeyCodes,
    width: Width,
    lines: Vec<Line>,
    /// List `l` is groups `first[l]..first[l + 1]` (`nlist + 1` entries).
    first: Vec<u32>,
}

impl ListCodes {
    /// The codes of `lists` (the keys in list order) for the lists bounded by `offsets`
    /// (clamped as searches clamp them, so an unverified file's offsets stay inside `lists`).
    pub(crate) fn new(lists: &KeyStore, offsets: &[u32], width: Width) -> Self {
        let codes = KeyCodes::new(lists);
        let (n, per) = (codes.len(), codes.lines_per_group(width));
        let mut first = Vec::with_capacity(offsets.len());
        let mut lines = Vec::new();
        first.push(0u32);
        for l in 0..offsets.len().saturating_sub(1) {
            let (s, e) = list_range(offsets, l, n);
            let groups = (e - s).div_ceil(GROUP);
            let at = lines.len();
            lines.extend(codes.empty_groups(width, groups));
            for (i, p) in (s..e).enumerate() {
                let g = at + (i / GROUP) * per;
                codes.write_slot_as(width, &mut lines[g..g + per], i % GROUP, p as u32);
            }
            first.push((lines.len() / per) as u32);
        }
        ListCodes {
            codes,
            width,
            lines,
            first,
        }
    }

    /// Bytes held: the groups (`dim` rounded up to 4, plus 8, per key, and each list's last
    /// group padded), the per-key codes kept for their fit, and the group table.
    pub fn bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>() + self.codes.bytes() + 4 * self.first.len()
    }

    /// Estimates every key of the lists `probe` (list numbers; `offsets` as for
    /// the build) and writes into `out` the list positions of the best `candidates`
    /// (in no order). Returns the number of estimates (the keys of the probed lists).
    pub fn candidates(
        &self,
        query: &[f32],
        probe: &[u32],
        offsets: &[u32],
        candidates: usize,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) -> usize {
        let (n, per) = (self.codes.len(), self.codes.lines_per_group(self.width));
        let Scratch {
            quant,
            estimates,
            positions,
            sample,
            picked,
            ..
        } = scratch;
        self.codes.quantize_query_as(self.width, query, quant);
        estimates.clear();
        positions.clear();
        for &l in probe {
            let l = l as usize;
            if l + 1 >= self.first.len() {
                continue;
            }
            let (s, e) = list_range(offsets, l, n);
            let (g0, g1) = (self.first[l] as usize, self.first[l + 1] as usize);
            let at = estimates.len();
            estimates.resize(at + (g1 - g0) * GROUP, 0.0);
            self.codes.scan_as(
                self.width,
                quant,
                &self.lines[g0 * per..g1 * per],
                &mut estimates[at..],
            );
            // The padding of the list's last group goes.
            estimates.truncate(at + (e - s));
            positions.extend(s as u32..e as u32);
        }
        out.clear();
        top_ids(estimates, candidates, sample, picked, out);
        for p in out.iter_mut() {
            *p = positions[*p as usize];
        }
        estimates.len()
    }
}

/// Positions `s..e` of list `l`, clamped to `0..n` and to `s ≤ e`.
fn list_range(offsets: &[u32], l: usize, n: usize) -> (usize, usize) {
    let e = (offsets.get(l + 1).copied().unwrap_or(0) as usize).min(n);
    let s = (offsets.get(l).copied().unwrap_or(0) as usize).min(e);
    (s, e)
}
