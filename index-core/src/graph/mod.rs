//! Graph storage (CSR adjacency) and the best-first beam search shared by the graph kinds.

mod search;

pub use search::beam_search;

/// Read access to out-neighbours, so that searches run on the final CSR and on the adjacency
/// lists a build is still editing.
pub trait Neighbors {
    /// Number of nodes.
    fn node_count(&self) -> usize;
    /// Out-neighbours of `v` (`v < node_count()`).
    fn neighbors_of(&self, v: u32) -> &[u32];
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Csr {
    offsets: Vec<u32>,
    neighbors: Vec<u32>,
}

impl Csr {
    /// CSR from per-node lists. Fails (returns `None`) when an id is out of range or the edge
    /// count overflows `u32`.
    pub fn from_lists(lists: &[Vec<u32>]) -> Option<Self> {
        let n = lists.len();
        let mut offsets = Vec::with_capacity(n + 1);
        let total: usize = lists.iter().map(Vec::len).sum();
        u32::try_from(total).ok()?;
        let mut neighbors = Vec::with_capacity(total);
        offsets.push(0);
        for l in lists {
            if l.iter().any(|&x| x as usize >= n) {
                return None;
            }
            neighbors.extend_from_slice(l);
            offsets.push(neighbors.len() as u32);
        }
        Some(Csr { offsets, neighbors })
    }

    /// CSR from raw arrays, validated: offsets start at 0, never decrease, end at
    /// `neighbors.len()`, and every neighbour is `< offsets.len() - 1`.
    pub fn new(offsets: Vec<u32>, neighbors: Vec<u32>) -> Result<Self, String> {
        let n = offsets.len().checked_sub(1).ok_or("offsets is empty")?;
        if offsets[0] != 0 {
            return Err("offsets[0] is not 0".into());
        }
        if offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err("offsets decrease".into());
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
        Ok(Csr { offsets, neighbors })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// True when the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Out-neighbours of `v`.
    #[inline]
    pub fn neighbors(&self, v: u32) -> &[u32] {
        let s = self.offsets[v as usize] as usize;
        let e = self.offsets[v as usize + 1] as usize;
        &self.neighbors[s..e]
    }

    /// Number of edges.
    pub fn edges(&self) -> usize {
        self.neighbors.len()
    }

    /// Largest out-degree.
    pub fn max_degree(&self) -> usize {
        self.offsets
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    }

    /// Raw offsets (`len() + 1` entries).
    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    /// Raw neighbour array.
    pub fn neighbor_array(&self) -> &[u32] {
        &self.neighbors
    }

    /// Bytes held by the adjacency.
    pub fn bytes(&self) -> usize {
        4 * (self.offsets.len() + self.neighbors.len())
    }

    /// Nodes reachable from `entries` (breadth-first), as a mask.
    pub fn reachable(&self, entries: &[u32]) -> Vec<bool> {
        let mut seen = vec![false; self.len()];
        let mut stack: Vec<u32> = Vec::new();
        for &e in entries {
            if (e as usize) < seen.len() && !seen[e as usize] {
                seen[e as usize] = true;
                stack.push(e);
            }
        }
        while let Some(v) = stack.pop() {
            for &w in self.neighbors(v) {
                if !seen[w as usize] {
                    seen[w as usize] = true;
                    stack.push(w);
                }
            }
        }
        seen
    }
}
