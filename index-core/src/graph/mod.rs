//! The graph toolkit of the graph kinds (attention, HNSW, Vamana): storage, search, and the
//! build steps they share.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`Csr`] adjacency (owned or mapped), the [`Neighbors`] access trait |
//! | `search.rs` | [`beam_search`] and its [`BeamSettings`]; [`beam_search_by`] over any [`Estimate`] |
//! | `codes.rs` | [`codes::search_codes`]: traversal on int8 codes, exact re-rank (issue 26) |
//! | `inline.rs` | [`inline::InlineCodes`]: neighbour codes stored inline with the adjacency, walked by `search_codes` |
//! | `reach.rs` | [`mark_reachable`], the one reachability walk |
//! | `repair.rs` | [`repair::connect`], the connectivity repair of a build |
//! | `prune.rs` | [`prune()`]: top / occlusion / occlusion-fill ([`Prune`]) |
//!
//! ```text
//!  build: candidates ──prune──► adjacency lists ──repair::connect──► Csr ──► beam_search
//!                                     ▲                   │
//!                                     └── mark_reachable ─┘
//! ```

pub mod codes;
pub mod inline;
mod prune;
mod reach;
pub mod repair;
mod search;

pub use crate::store::Estimate;
pub use prune::{prune, Prune};
pub use reach::mark_reachable;
pub use search::{beam_search, beam_search_by, BeamSettings};

use crate::error::{Error, Result};
use crate::store::Buf;

/// Read access to out-neighbours, so that searches run on the final CSR and on the adjacency
/// lists a build is still editing.
pub trait Neighbors {
    /// Number of nodes.
    fn node_count(&self) -> usize;
    /// Out-neighbours of `v` (`v < node_count()`).
    fn neighbors_of(&self, v: u32) -> &[u32];
    /// Starts loading the out-neighbours of `v` into cache (a hint; any `v` is allowed).
    #[inline]
    fn prefetch_neighbors(&self, v: u32) {
        if (v as usize) < self.node_count() {
            crate::metric::prefetch(self.neighbors_of(v));
        }
    }
}

impl Neighbors for Csr {
    fn node_count(&self) -> usize {
        self.len()
    }
    #[inline]
    fn neighbors_of(&self, v: u32) -> &[u32] {
        self.neighbors(v)
    }
}

impl Neighbors for [Vec<u32>] {
    fn node_count(&self) -> usize {
        self.len()
    }
    #[inline]
    fn neighbors_of(&self, v: u32) -> &[u32] {
        &self[v as usize]
    }
}

/// Directed adjacency in compressed sparse rows: the out-neighbours of node `v` are
/// `neighbors[offsets[v]..offsets[v + 1]]`. Every id is `< len()` (checked by [`Csr::new`]).
///
/// The arrays are owned or borrowed from a file mapping ([`crate::io`]). A mapped graph opened
/// without verification has not been scanned; its accessors stay total (a node whose offsets
/// are out of order has no neighbours) and [`beam_search`] skips ids `≥ len()`, so a damaged
/// file can give poor results but never a panic. [`Csr::validate`] runs the full check.
#[derive(Clone, Debug, Default)]
pub struct Csr {
    offsets: Buf<u32>,
    neighbors: Buf<u32>,
}

impl PartialEq for Csr {
    fn eq(&self, other: &Self) -> bool {
        self.offsets() == other.offsets() && self.neighbor_array() == other.neighbor_array()
    }
}

impl Eq for Csr {}

impl Csr {
    /// CSR from per-node lists.
    ///
    /// Errors: [`Error::InvalidParam`] when an id is not below the number of lists (named
    /// `neighbor`) or the edge count overflows the `u32` offsets (named `edges`).
    pub fn from_lists(lists: &[Vec<u32>]) -> Result<Self> {
        let n = lists.len();
        let mut offsets = Vec::with_capacity(n + 1);
        let total: usize = lists.iter().map(Vec::len).sum();
        if u32::try_from(total).is_err() {
            return Err(Error::invalid_param(
                "edges",
                total,
                "more than u32::MAX edges for the CSR offsets",
            ));
        }
        let mut neighbors = Vec::with_capacity(total);
        offsets.push(0);
        for (v, l) in lists.iter().enumerate() {
            if let Some(&bad) = l.iter().find(|&&x| x as usize >= n) {
                return Err(Error::invalid_param(
                    "neighbor",
                    bad,
                    format!("of node {v} is not below n = {n}"),
                ));
            }
            neighbors.extend_from_slice(l);
            offsets.push(neighbors.len() as u32);
        }
        Ok(Csr {
            offsets: Buf::Owned(offsets),
            neighbors: Buf::Owned(neighbors),
        })
    }

    /// CSR over arrays borrowed from a mapping, not scanned (O(1)); `offsets` must hold at least
    /// one value. Callers that need the invariants run [`Csr::validate`].
    pub(crate) fn from_bufs_unchecked(offsets: Buf<u32>, neighbors: Buf<u32>) -> Self {
        Csr { offsets, neighbors }
    }

    /// Checks the invariants of [`Csr::new`] (a scan of both arrays).
    pub fn validate(&self) -> Result<(), String> {
        check_arrays(self.offsets(), self.neighbor_array())
    }

    /// CSR from raw arrays, validated: offsets start at 0, never decrease, end at
    /// `neighbors.len()`, and every neighbour is `< offsets.len() - 1`.
    pub fn new(offsets: Vec<u32>, neighbors: Vec<u32>) -> Result<Self, String> {
        check_arrays(&offsets, &neighbors)?;
        Ok(Csr {
            offsets: Buf::Owned(offsets),
            neighbors: Buf::Owned(neighbors),
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.offsets().len().saturating_sub(1)
    }

    /// True when the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Out-neighbours of `v` (empty when `v` is out of range, or when the offsets of an
    /// unverified mapped graph are damaged).
    #[inline]
    pub fn neighbors(&self, v: u32) -> &[u32] {
        let offsets = self.offsets.as_slice();
        let (Some(&s), Some(&e)) = (offsets.get(v as usize), offsets.get(v as usize + 1)) else {
            return &[];
        };
        self.neighbors
            .as_slice()
            .get(s as usize..e as usize)
            .unwrap_or(&[])
    }

    /// Number of edges.
    pub fn edges(&self) -> usize {
        self.neighbor_array().len()
    }

    /// Largest out-degree.
    pub fn max_degree(&self) -> usize {
        self.offsets()
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as usize)
            .max()
            .unwrap_or(0)
    }

    /// Raw offsets (`len() + 1` entries).
    pub fn offsets(&self) -> &[u32] {
        self.offsets.as_slice()
    }

    /// Raw neighbour array.
    pub fn neighbor_array(&self) -> &[u32] {
        self.neighbors.as_slice()
    }

    /// True when the arrays are borrowed from a file mapping rather than owned.
    pub fn is_mapped(&self) -> bool {
        self.offsets.is_mapped() || self.neighbors.is_mapped()
    }

    /// Bytes held by the adjacency.
    pub fn bytes(&self) -> usize {
        4 * (self.offsets().len() + self.neighbor_array().len())
    }

    /// Nodes reachable from `entries`, as a mask ([`mark_reachable`]).
    pub fn reachable(&self, entries: &[u32]) -> Vec<bool> {
        let mut seen = vec![false; self.len()];
        mark_reachable(self, entries, &mut seen, &mut Vec::new());
        seen
    }
}

/// The CSR invariants: offsets start at 0, never decrease, end at `neighbors.len()`, and every
/// neighbour is `< offsets.len() - 1`.
fn check_arrays(offsets: &[u32], neighbors: &[u32]) -> Result<(), String> {
    let n = offsets.len().checked_sub(1).ok_or("offsets is empty")?;
    if offsets[0] != 0 {
        return Err("offsets[0] is not 0".into());
    }
    if let Some(i) = offsets.windows(2).position(|w| w[0] > w[1]) {
        return Err(format!("offsets decrease at node {i}"));
    }
    if offsets[n] as usize != neighbors.len() {
        return Err(format!(
            "offsets end at {} but there are {} neighbours",
            offsets[n],
            neighbors.len()
        ));
    }
    if let Some(bad) = neighbors.iter().find(|&&x| x as usize >= n) {
        return Err(format!("neighbour id {bad} is not below n = {n}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_lists_builds_the_csr_or_names_the_bad_id() {
        let g = Csr::from_lists(&[vec![1, 2], vec![], vec![0]]).expect("valid lists");
        assert_eq!(g.offsets(), &[0, 2, 2, 3]);
        assert_eq!(g.neighbor_array(), &[1, 2, 0]);
        assert!(g.reachable(&[2]).iter().all(|&r| r));
        assert_eq!(g.reachable(&[1, 9]), vec![false, true, false]);
        match Csr::from_lists(&[vec![1], vec![2]]) {
            Err(Error::InvalidParam { name, value, .. }) => {
                assert_eq!((name, value.as_str()), ("neighbor", "2"));
            }
            other => panic!("expected InvalidParam, got {other:?}"),
        }
    }
}
