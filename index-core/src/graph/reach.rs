//! Reachability: the one walk that every graph kind's build and checks use.

use super::Neighbors;

/// Marks every node reachable from `from` (the nodes themselves included) in `reached`
/// (`graph.node_count()` entries; nodes already marked are not walked again). Ids out of range,
/// in `from` or in neighbour lists (only an unverified file can hold those), are skipped.
/// `stack` is a reusable buffer (left empty).
pub fn mark_reachable<G: Neighbors + ?Sized>(
    graph: &G,
    from: &[u32],
    reached: &mut [bool],
    stack: &mut Vec<u32>,
) {
    stack.clear();
    for &v in from {
        if let Some(r) = reached.get_mut(v as usize) {
            if !*r {
                *r = true;
                stack.push(v);
            }
        }
    }
    while let Some(x) = stack.pop() {
        for &w in graph.neighbors_of(x) {
            if let Some(r) = reached.get_mut(w as usize) {
                if !*r {
                    *r = true;
                    stack.push(w);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_what_the_entries_reach_and_skips_bad_ids() {
        // 0 → 1 → 2, 3 → 0, 4 alone; 2 points out of range.
        let adj: Vec<Vec<u32>> = vec![vec![1], vec![2], vec![9], vec![0], vec![]];
        let mut reached = vec![false; 5];
        let mut stack = Vec::new();
        mark_reachable(adj.as_slice(), &[0, 7], &mut reached, &mut stack);
        assert_eq!(reached, [true, true, true, false, false]);
        // Marked nodes are not walked again; new entries add what they reach.
        mark_reachable(adj.as_slice(), &[3], &mut reached, &mut stack);
        assert_eq!(reached, [true, true, true, true, false]);
        assert!(stack.is_empty());
    }
}
