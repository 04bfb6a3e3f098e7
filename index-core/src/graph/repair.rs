//! Connectivity repair: after a build, every node that the entry points cannot reach is linked
//! in, so that a search with `ef = n` finds every key. The attention graph and Vamana share the
//! pass; they differ in how they find the nodes near a lost one and in what they do when every
//! near node's list is full ([`WhenFull`]).

use super::reach::mark_reachable;
use crate::cancel::Cancel;
use crate::error::{Error, Result};

/// What to do when no reachable node near a lost node `u` has a free slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// Splice `u` into the list of the nearest reachable node `r` (or the first entry):
    /// `r → w` becomes `r → u → w`. Whatever was reachable stays reachable (through `u`), and
    /// no path used `u`'s own edges (it was unreachable), so nothing is cut off.
    Splice,
    /// The nearest reachable node with an edge to a node that keeps another in-edge (and is
    /// not an entry point) redirects its last such edge to `u`.
    Redirect,
}

/// How one kind repairs its graph.
#[derive(Clone, Copy, Debug)]
pub struct Repair<'a> {
    /// Where searches start.
    pub entries: &'a [u32],
    /// Out-degree bound of the lists that take new edges.
    pub max_degree: usize,
    /// When no near node has room, try every reachable node (in id order) before [`WhenFull`].
    pub any_with_room: bool,
    pub when_full: WhenFull,
    /// A linked node without out-edges gets its `own_edges` nearest found nodes (0: none).
    pub own_edges: usize,
    /// The parameter named by the error when a node stays unreachable (the degree bound).
    pub degree_name: &'static str,
    /// The operation named by [`Error::Cancelled`].
    pub what: &'static str,
}

/// Links every node of `adj` that `repair.entries` cannot reach; returns how many were linked.
///
/// Each lost node `u` is looked up with `near(adj, reached, u, found)`, which writes the nodes
/// near `u` into `found`, nearest first (a search from the entries; only nodes marked in
/// `reached` take edges). The nearest reachable one with a free slot below `max_degree` gets
/// the edge to `u`; otherwise [`Repair::any_with_room`] and [`Repair::when_full`] apply. Runs up
/// to four passes.
///
/// Errors: [`Error::Cancelled`] once `cancel` is set (checked per pass);
/// [`Error::InvalidParam`] naming [`Repair::degree_name`] when a node is still lost after the
/// passes.
pub fn connect(
    adj: &mut [Vec<u32>],
    repair: &Repair<'_>,
    mut near: impl FnMut(&[Vec<u32>], &[bool], u32, &mut Vec<u32>),
    cancel: &Cancel,
) -> Result<usize> {
    let n = adj.len();
    let m = repair.max_degree;
    let mut stack = Vec::new();
    let mut found = Vec::new();
    let mut indeg = vec![0u32; n];
    for list in adj.iter() {
        for &x in list {
            indeg[x as usize] += 1;
        }
    }
    let mut linked = 0;
    for _pass in 0..4 {
        cancel.check(repair.what)?;
        let mut reached = vec![false; n];
        mark_reachable(&*adj, repair.entries, &mut reached, &mut stack);
        if reached.iter().all(|&r| r) {
            return Ok(linked);
        }
        for u in 0..n as u32 {
            if reached[u as usize] {
                continue;
            }
            found.clear();
            near(adj, &reached, u, &mut found);
            if !link(adj, repair, &reached, &mut indeg, u, &found) {
                continue;
            }
            indeg[u as usize] += 1;
            if repair.own_edges > 0 && adj[u as usize].is_empty() {
                let own: Vec<u32> = found
                    .iter()
                    .copied()
                    .filter(|&r| r != u)
                    .take(repair.own_edges)
                    .collect();
                for &x in &own {
                    indeg[x as usize] += 1;
                }
                adj[u as usize] = own;
            }
            linked += 1;
            mark_reachable(&*adj, &[u], &mut reached, &mut stack);
        }
    }
    let mut reached = vec![false; n];
    mark_reachable(&*adj, repair.entries, &mut reached, &mut stack);
    match reached.iter().position(|&r| !r) {
        Some(lost) => Err(Error::invalid_param(
            repair.degree_name,
            m,
            format!("too small to keep key {lost} reachable"),
        )),
        None => Ok(linked),
    }
}

/// Gives lost node `u` an in-edge from a reachable node; false when none could be found.
fn link(
    adj: &mut [Vec<u32>],
    repair: &Repair<'_>,
    reached: &[bool],
    indeg: &mut [u32],
    u: u32,
    found: &[u32],
) -> bool {
    let m = repair.max_degree;
    let n = adj.len() as u32;
    let reachable = |r: u32| r != u && reached[r as usize];
    let with_room = found
        .iter()
        .copied()
        .find(|&r| reachable(r) && adj[r as usize].len() < m)
        .or_else(|| {
            repair
                .any_with_room
                .then(|| (0..n).find(|&r| reached[r as usize] && adj[r as usize].len() < m))
                .flatten()
        });
    if let Some(from) = with_room {
        adj[from as usize].push(u);
        return true;
    }
    match repair.when_full {
        WhenFull::Splice => {
            let r = found
                .iter()
                .copied()
                .find(|&r| reachable(r))
                .or_else(|| repair.entries.first().copied());
            let Some(r) = r else {
                return false;
            };
            let Some(w) = adj[r as usize].pop() else {
                return false;
            };
            adj[r as usize].push(u);
            let own = &mut adj[u as usize];
            if own.contains(&w) {
                indeg[w as usize] -= 1;
            } else if own.len() < m {
                own.push(w);
            } else if let Some(last) = own.last_mut() {
                indeg[*last as usize] -= 1;
                *last = w;
            }
        }
        WhenFull::Redirect => {
            let spare = found
                .iter()
                .copied()
                .filter(|&x| reachable(x))
                .find_map(|x| {
                    let pos = adj[x as usize].iter().rposition(|&t| {
                        indeg[t as usize] >= 2 && !repair.entries.contains(&t) && t != u
                    })?;
                    Some((x, pos))
                });
            let Some((x, pos)) = spare else {
                return false;
            };
            let old = adj[x as usize][pos];
            indeg[old as usize] -= 1;
            adj[x as usize][pos] = u;
        }
    }
    true
}
