//! [`UpperLevels`]: the levels above 0 of HNSW in one compact CSR over (level, node) pairs.
//!
//! A level holds only its own nodes (about `n / m^l` of them), so storing a full `n + 1` offsets
//! array per level would cost more than the lists themselves. Instead the pairs are ordered by
//! level, then node id: level `l`'s nodes are `nodes[starts[l-1]..starts[l]]` (increasing ids)
//! and the list of the pair at position `p` is `neighbors[offsets[p]..offsets[p+1]]`. A lookup
//! is a binary search among the level's nodes. The arrays are owned after a build and borrowed
//! from the mapping after a load (docs/FORMAT.md, `hnsw_*` sections); every accessor is total,
//! so an unverified, damaged file gives empty lists, never a panic.

use crate::graph::Neighbors;
use crate::store::Buf;

/// HNSW levels `1..=L`, compact (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct UpperLevels {
    /// `L + 1` positions: level `l`'s pairs are `starts[l-1]..starts[l]`.
    starts: Buf<u32>,
    /// Node id of each pair (`P` entries), increasing within a level.
    nodes: Buf<u32>,
    /// `P + 1` offsets into `neighbors`.
    offsets: Buf<u32>,
    /// Neighbour ids of every pair's list.
    neighbors: Buf<u32>,
}

impl PartialEq for UpperLevels {
    fn eq(&self, other: &Self) -> bool {
        self.starts() == other.starts()
            && self.nodes() == other.nodes()
            && self.offsets() == other.offsets()
            && self.neighbor_array() == other.neighbor_array()
    }
}

impl Eq for UpperLevels {}

impl UpperLevels {
    /// From the build's per-level lists: `layers[l - 1][v]` is node `v`'s list at level `l`;
    /// the nodes of level `l` are those with `levels[v] >= l`. `None` if a count overflows u32.
    pub(crate) fn from_layers(levels: &[u8], layers: &[Vec<Vec<u32>>]) -> Option<Self> {
        let mut starts = vec![0u32];
        let (mut nodes, mut offsets, mut neighbors) = (Vec::new(), vec![0u32], Vec::new());
        for (i, lists) in layers.iter().enumerate() {
            let l = i + 1;
            for (v, &top) in levels.iter().enumerate() {
                if top as usize >= l {
                    nodes.push(u32::try_from(v).ok()?);
                    neighbors.extend_from_slice(lists.get(v).map_or(&[][..], Vec::as_slice));
                    offsets.push(u32::try_from(neighbors.len()).ok()?);
                }
            }
            starts.push(u32::try_from(nodes.len()).ok()?);
        }
        Some(UpperLevels {
            starts: Buf::Owned(starts),
            nodes: Buf::Owned(nodes),
            offsets: Buf::Owned(offsets),
            neighbors: Buf::Owned(neighbors),
        })
    }

    /// From arrays borrowed from a mapping, after the O(1) checks: `starts` starts at 0 and
    /// ends at the node count, `offsets` holds one more value than there are nodes, starts at
    /// 0 and ends at the neighbour count. On failure returns `(array, reason)` with `array` one
    /// of `starts`, `offsets`. [`UpperLevels::validate`] scans the rest.
    pub(crate) fn from_bufs(
        starts: Buf<u32>,
        nodes: Buf<u32>,
        offsets: Buf<u32>,
        neighbors: Buf<u32>,
    ) -> Result<Self, (&'static str, String)> {
        let p = nodes.as_slice().len();
        check_span(
            "starts",
            "level starts",
            starts.as_slice(),
            p,
            "the node count",
        )?;
        let o = offsets.as_slice();
        if o.len() != p + 1 {
            return Err((
                "offsets",
                format!("{} offsets for {p} nodes (expected {})", o.len(), p + 1),
            ));
        }
        let total = neighbors.as_slice().len();
        check_span("offsets", "offsets", o, total, "the neighbour count")?;
        Ok(UpperLevels {
            starts,
            nodes,
            offsets,
            neighbors,
        })
    }

    /// The full scan: level starts never decrease, node ids increase within a level and are
    /// `< n`, offsets never decrease, neighbour ids are `< n`. On failure returns
    /// `(array, reason)`, `array` one of `starts`, `nodes`, `offsets`, `neighbors`.
    pub fn validate(&self, n: usize) -> Result<(), (&'static str, String)> {
        if let Some(l) = self.starts().windows(2).position(|w| w[0] > w[1]) {
            return Err((
                "starts",
                format!("level starts decrease at level {}", l + 1),
            ));
        }
        for (l, level) in self.iter().enumerate() {
            if let Some(i) = level.nodes.windows(2).position(|w| w[0] >= w[1]) {
                return Err((
                    "nodes",
                    format!("level {}: node ids do not increase at {i}", l + 1),
                ));
            }
            if let Some(&bad) = level.nodes.iter().find(|&&v| v as usize >= n) {
                return Err((
                    "nodes",
                    format!("level {}: node id {bad} is not below n = {n}", l + 1),
                ));
            }
        }
        if let Some(i) = self.offsets().windows(2).position(|w| w[0] > w[1]) {
            return Err(("offsets", format!("offsets decrease at pair {i}")));
        }
        if let Some(&bad) = self.neighbor_array().iter().find(|&&v| v as usize >= n) {
            return Err((
                "neighbors",
                format!("neighbour id {bad} is not below n = {n}"),
            ));
        }
        Ok(())
    }

    /// Number of levels above 0.
    pub fn len(&self) -> usize {
        self.starts().len().saturating_sub(1)
    }

    /// True when the graph has level 0 only.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Level `l` (`1..=len()`); an empty level when out of range.
    pub fn level(&self, l: usize) -> UpperLevel<'_> {
        let s = self.starts();
        let (a, b) = match (l.checked_sub(1).and_then(|i| s.get(i)), s.get(l)) {
            (Some(&a), Some(&b)) => (a as usize, b as usize),
            _ => (0, 0),
        };
        UpperLevel {
            nodes: self.nodes().get(a..b).unwrap_or(&[]),
            offsets: self.offsets().get(a..=b).unwrap_or(&[]),
            neighbors: self.neighbor_array(),
        }
    }

    /// Levels `1..=len()`, lowest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = UpperLevel<'_>> + '_ {
        (1..=self.len()).map(|l| self.level(l))
    }

    /// Level boundaries (`len() + 1` entries).
    pub fn starts(&self) -> &[u32] {
        self.starts.as_slice()
    }

    /// Node id of every (level, node) pair.
    pub fn nodes(&self) -> &[u32] {
        self.nodes.as_slice()
    }

    /// Offsets of every pair's list (pairs + 1 entries).
    pub fn offsets(&self) -> &[u32] {
        self.offsets.as_slice()
    }

    /// Every neighbour id, lists of all levels one after another.
    pub fn neighbor_array(&self) -> &[u32] {
        self.neighbors.as_slice()
    }

    /// Number of edges of all levels.
    pub fn edges(&self) -> usize {
        self.neighbor_array().len()
    }

    /// Distinct keys present above level 0 (the nodes of level 1, which contains every higher
    /// level's nodes).
    pub fn nodes_above_0(&self) -> usize {
        self.level(1).nodes.len()
    }

    /// True when the arrays are borrowed from a file mapping.
    pub fn is_mapped(&self) -> bool {
        self.nodes.is_mapped() && self.offsets.is_mapped() && self.neighbors.is_mapped()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        4 * (self.starts().len() + self.nodes().len() + self.offsets().len() + self.edges())
    }
}

/// One level of [`UpperLevels`].
#[derive(Clone, Copy, Debug)]
pub struct UpperLevel<'a> {
    /// The level's node ids, increasing.
    nodes: &'a [u32],
    /// `nodes.len() + 1` offsets into `neighbors`.
    offsets: &'a [u32],
    neighbors: &'a [u32],
}

impl<'a> UpperLevel<'a> {
    /// The level's node ids, increasing.
    pub fn nodes(&self) -> &'a [u32] {
        self.nodes
    }

    /// Out-neighbours of `v` at this level (empty when `v` is not on it).
    #[inline]
    pub fn neighbors(&self, v: u32) -> &'a [u32] {
        let Ok(i) = self.nodes.binary_search(&v) else {
            return &[];
        };
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&s), Some(&e)) => self.neighbors.get(s as usize..e as usize).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Number of edges on this level.
    pub fn edges(&self) -> usize {
        match (self.offsets.first(), self.offsets.last()) {
            (Some(&s), Some(&e)) => e.saturating_sub(s) as usize,
            _ => 0,
        }
    }

    /// Largest out-degree on this level.
    pub fn max_degree(&self) -> usize {
        self.offsets
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as usize)
            .max()
            .unwrap_or(0)
    }
}

impl Neighbors for UpperLevel<'_> {
    /// The ids a level may hold are all key ids: its node count is not a bound on them, so
    /// this returns `u32::MAX` (searches bound ids by the key count themselves).
    fn node_count(&self) -> usize {
        u32::MAX as usize
    }
    #[inline]
    fn neighbors_of(&self, v: u32) -> &[u32] {
        self.neighbors(v)
    }
}
/// `values` runs from 0 to `end` (`counted`), else `(array, reason)` naming them as `what`.
fn check_span(
    array: &'static str,
    what: &str,
    values: &[u32],
    end: usize,
    counted: &str,
) -> Result<(), (&'static str, String)> {
    let (first, last) = (values.first(), values.last());
    if first != Some(&0) || last.map(|&x| x as usize) != Some(end) {
        return Err((
            array,
            format!("{what} run {first:?}..{last:?}, expected 0..{end} ({counted})"),
        ));
    }
    Ok(())
}
