//! Codes inline with the adjacency (issue 26, SymphonyQG's layout with int8 codes): each node's
//! block holds its neighbours' ids, scales and int8 codes, in groups of [`GROUP`] neighbours
//! interleaved by 4 dimensions, so expanding a node reads one contiguous block and estimates all
//! its neighbours with one `vpdpbusd` per 4 dimensions ([`crate::metric::int8::I8Kernels::group_q8`]).
//!
//! ```text
//!  node v's block: group 0                                   group 1 …
//!   ┌─────────────────────────────┬──────────────┬──────────┐┌────
//!   │ codes: ⌈dim/4⌉ lines of 64 B │ 16 f32 scales │ 16 u32 ids ││ …
//!   │ (4 dims × 16 neighbours)     │              │          ││
//!   └─────────────────────────────┴──────────────┴──────────┘└────
//! ```
//!
//! The walk (run by [`super::codes::search_codes`] when given the blocks) scores every
//! neighbour of an expanded node from the block, and
//! only those that beat the list's worst entry are checked against the visited set and inserted:
//! no gather, and no visited check for the many neighbours that could not enter. The final list
//! is re-ranked on the stored keys like [`super::codes::search_codes`], so results keep the
//! contract of every search (exact scores of the store, best first).
//!
//! The cost is memory: `⌈degree/16⌉ · (16 · dim + 128)` bytes per node, about the degree times
//! a key's code. Blocks are derived from the graph and the key codes at build and load (never
//! saved). A node whose list changes (an insert) gets a new block at the end; the old one is
//! reclaimed when dead blocks outgrow live ones.

use super::search::Walk;
use super::Neighbors;
use crate::codes::{scan_groups, CodeScorer, GroupSink, KeyCodes, Line, EMPTY_LINE};
use crate::metric::int8::{i8_kernels, GroupQ8, QuantQuery, GROUP};
use crate::scratch::{BeamList, VisitedSet};

/// Every node's block of neighbour codes (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InlineCodes {
    /// Lines of codes per group (`⌈dim / 4⌉`).
    quads: usize,
    /// First line of each node's block.
    start: Vec<usize>,
    /// Neighbours in each node's block.
    count: Vec<u32>,
    lines: Vec<Line>,
    /// Lines of current blocks (the rest belong to blocks an update replaced).
    live: usize,
}

impl InlineCodes {
    /// The blocks of every node of `graph`, from the codes of its keys (ids `≥ codes.len()`,
    /// which only an unverified file holds, are left out).
    pub fn new<G: Neighbors + ?Sized>(graph: &G, codes: &KeyCodes) -> Self {
        let n = graph.node_count();
        let quads = codes.quads();
        let mut inline = InlineCodes {
            quads,
            start: Vec::with_capacity(n),
            count: Vec::with_capacity(n),
            lines: Vec::new(),
            live: 0,
        };
        let edges: usize = (0..n as u32)
            .map(|v| graph.neighbors_of(v).len().div_ceil(GROUP))
            .sum();
        inline.lines.reserve(edges * inline.group_lines());
        for v in 0..n as u32 {
            inline.set(v, graph.neighbors_of(v), codes);
        }
        inline
    }

    /// Lines per group: the codes, then the scales, then the ids.
    fn group_lines(&self) -> usize {
        self.quads + 2
    }

    /// Writes the block of node `v` (`v ≤ node_count()`: an existing node, or the next one)
    /// from its neighbour list `list`.
    pub fn set(&mut self, v: u32, list: &[u32], codes: &KeyCodes) {
        let valid: Vec<u32> = list
            .iter()
            .copied()
            .filter(|&id| (id as usize) < codes.len())
            .collect();
        let at = self.lines.len();
        let groups = valid.len().div_ceil(GROUP);
        let per = self.group_lines();
        self.lines.resize(at + groups * per, EMPTY_LINE);
        for (s, &id) in valid.iter().enumerate() {
            let base = at + (s / GROUP) * per;
            codes.write_slot(&mut self.lines[base..base + per], s % GROUP, id);
        }
        let lines = groups * per;
        let v = v as usize;
        if v < self.start.len() {
            self.live -= (self.count[v] as usize).div_ceil(GROUP) * per;
            self.start[v] = at;
            self.count[v] = valid.len() as u32;
        } else {
            debug_assert_eq!(v, self.start.len(), "blocks are appended in id order");
            self.start.push(at);
            self.count.push(valid.len() as u32);
        }
        self.live += lines;
        // Reclaim the blocks updates replaced once they outweigh the live ones.
        if self.lines.len() > 2 * self.live.max(1024) {
            self.compact();
        }
    }

    /// Copies the current blocks into a fresh buffer, in node order.
    fn compact(&mut self) {
        let per = self.group_lines();
        let mut lines = Vec::with_capacity(self.live);
        for (start, &count) in self.start.iter_mut().zip(&self.count) {
            let len = (count as usize).div_ceil(GROUP) * per;
            let from = *start;
            *start = lines.len();
            lines.extend_from_slice(&self.lines[from..from + len]);
        }
        self.lines = lines;
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.start.len()
    }

    /// Bytes held (blocks, including replaced ones not yet reclaimed, and the node table).
    pub fn bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>()
            + self.start.len() * (std::mem::size_of::<usize>() + 4)
    }

    /// True when every node's block holds the same neighbours, scales and codes in both (their
    /// places in the buffer may differ).
    #[cfg(test)]
    pub(crate) fn same_blocks(&self, other: &InlineCodes) -> bool {
        self.quads == other.quads
            && self.node_count() == other.node_count()
            && (0..self.node_count() as u32).all(|v| self.block(v) == other.block(v))
    }

    /// The walk of a search for `query` (quantized by `codes`, the key codes these blocks were
    /// made from, and padded to the groups' dimensions).
    pub(crate) fn walk<'a>(&'a self, codes: &'a KeyCodes, query: &'a QuantQuery) -> InlineWalk<'a> {
        let kernels = i8_kernels();
        InlineWalk {
            inline: self,
            entries: codes.scorer(query, kernels),
            query,
            group_q8: kernels.group_q8,
        }
    }

    /// The lines of node `v`'s block and its neighbour count.
    #[inline(always)]
    fn block(&self, v: u32) -> (&[Line], usize) {
        let (v, per) = (v as usize, self.group_lines());
        let count = self.count[v] as usize;
        let start = self.start[v];
        (
            &self.lines[start..start + count.div_ceil(GROUP) * per],
            count,
        )
    }
}

/// The walk over inline blocks: entry points estimated from the key codes, neighbours from the
/// expanded node's block.
pub(crate) struct InlineWalk<'a> {
    inline: &'a InlineCodes,
    entries: CodeScorer<'a>,
    query: &'a QuantQuery,
    group_q8: GroupQ8,
}

impl Walk for InlineWalk<'_> {
    #[inline(always)]
    fn node_count(&self) -> usize {
        self.inline.node_count()
    }

    #[inline(always)]
    fn prefetch(&self, v: u32) {
        if (v as usize) < self.inline.node_count() {
            crate::metric::prefetch(self.inline.block(v).0);
        }
    }

    #[inline(always)]
    fn score_ids(&self, ids: &[u32], out: &mut [f32]) {
        use crate::store::Estimate;
        self.entries.score_ids(ids, out)
    }

    #[inline(always)]
    fn expand(
        &self,
        c: u32,
        visited: &mut VisitedSet,
        beam: &mut BeamList,
        _ids: &mut Vec<u32>,
        _scores: &mut Vec<f32>,
    ) -> u64 {
        let (lines, count) = self.inline.block(c);
        let mut sink = Expansion {
            visited,
            beam,
            n: self.inline.node_count() as u32,
        };
        scan_groups(
            lines,
            self.inline.quads,
            count,
            self.query,
            self.group_q8,
            &mut sink,
        );
        count as u64
    }
}

/// The neighbours of one expansion that enter the list: unvisited ones above its worst.
struct Expansion<'a> {
    visited: &'a mut VisitedSet,
    beam: &'a mut BeamList,
    n: u32,
}

impl GroupSink for Expansion<'_> {
    #[inline(always)]
    fn floor(&self) -> f32 {
        self.beam.floor()
    }

    #[inline(always)]
    fn take(&mut self, mut mask: u32, ids: &[u32; GROUP], est: &[f32; GROUP]) {
        while mask != 0 {
            let s = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let id = ids[s];
            if id < self.n && self.visited.insert(id) {
                self.beam.insert(est[s], id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyStore;

    fn ring(n: u32, hops: &[u32]) -> Vec<Vec<u32>> {
        (0..n)
            .map(|v| hops.iter().map(|h| (v + h) % n).collect())
            .collect()
    }

    #[test]
    fn blocks_hold_every_neighbour_code_and_updates_keep_them() {
        let (n, d) = (120usize, 10usize);
        let data = crate::synth::ood(n, 4, d, 7);
        let keys = KeyStore::from_f32(data.keys.clone(), d).expect("keys");
        let codes = KeyCodes::new(&keys);
        // 17 neighbours: one full group and one slot of a second.
        let hops: Vec<u32> = (1..=17).collect();
        let mut lists = ring(n as u32, &hops);
        lists[3].push(n as u32 + 5); // out of range (only an unverified file has one): left out
        let mut inline = InlineCodes::new(lists.as_slice(), &codes);
        let check = |inline: &InlineCodes, lists: &[Vec<u32>]| {
            for (v, list) in lists.iter().enumerate() {
                let list: Vec<u32> = list.iter().copied().filter(|&i| i < n as u32).collect();
                let (lines, count) = inline.block(v as u32);
                assert_eq!(count, list.len());
                for (s, &id) in list.iter().enumerate() {
                    let group = &lines[(s / GROUP) * (inline.quads + 2)..];
                    let slot = s % GROUP;
                    let ids: &[u32; GROUP] = bytemuck::cast_ref(&group[inline.quads + 1]);
                    let scales: &[f32; GROUP] = bytemuck::cast_ref(&group[inline.quads]);
                    let (code, scale) = codes.code(id);
                    assert_eq!((ids[slot], scales[slot]), (id, scale));
                    for (i, &c) in code.iter().enumerate() {
                        assert_eq!(group[i / 4].0[4 * slot + i % 4] ^ 0x80, c as u8);
                    }
                }
            }
        };
        check(&inline, &lists);
        // Rewrite every node many times: dead blocks are reclaimed, the live ones stay right.
        for round in 0..6u32 {
            let next = ring(n as u32, &[1 + round, 2 + round, 40]);
            for (v, (list, new)) in lists.iter_mut().zip(next).enumerate() {
                *list = new;
                inline.set(v as u32, list, &codes);
            }
            assert!(inline.lines.len() <= 2 * inline.live.max(1024));
        }
        check(&inline, &lists);
    }
}
