//! The FIFO cache of (normalized query, chosen ids) pairs and its cosine ranking.
//!
//! Entries live in a `VecDeque` of at most `cap` slots; a push at capacity takes the oldest
//! slot's buffers for the new entry, so a warmed-up cache allocates nothing.

use crate::metric::{kernels, scalar::dot_f64};
use std::collections::VecDeque;

/// One cached pair: a unit-norm (or zero) query of `dim` values and the ids chosen for it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Entry {
    pub query: Vec<f32>,
    pub ids: Vec<u32>,
}

/// At most `cap` entries, oldest first.
#[derive(Clone, Debug)]
pub(crate) struct QueryCache {
    entries: VecDeque<Entry>,
    cap: usize,
}

impl QueryCache {
    /// An empty cache of capacity `cap ≥ 1`.
    pub fn new(cap: usize) -> Self {
        QueryCache {
            entries: VecDeque::with_capacity(cap),
            cap,
        }
    }

    /// Number of entries (`≤ cap`).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entry `i` (0 = oldest).
    pub fn get(&self, i: usize) -> Option<&Entry> {
        self.entries.get(i)
    }

    /// Appends a pair (`query` already normalized), evicting the oldest entry at capacity.
    pub fn push(&mut self, query: &[f32], ids: &[u32]) {
        let mut e = if self.entries.len() >= self.cap {
            self.entries.pop_front().unwrap_or_default()
        } else {
            Entry::default()
        };
        e.query.clear();
        e.query.extend_from_slice(query);
        e.ids.clear();
        e.ids.extend_from_slice(ids);
        self.entries.push_back(e);
    }

    /// Writes `(cosine, entry)` for every entry into `sims`, then moves the `r` most similar
    /// to its front, most similar first (ties: the more recent entry first). `query` must be
    /// normalized like the cached ones; cosines are then plain inner products.
    pub fn rank(&self, query: &[f32], r: usize, sims: &mut Vec<(f32, usize)>) {
        let dot = kernels().dot_f32;
        sims.clear();
        sims.extend(
            self.entries
                .iter()
                .enumerate()
                .map(|(i, e)| (dot(query, &e.query), i)),
        );
        let order = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1));
        let r = r.min(sims.len());
        if r == 0 {
            return;
        }
        if r < sims.len() {
            sims.select_nth_unstable_by(r - 1, order);
        }
        sims[..r].sort_unstable_by(order);
    }
}

/// Writes `query / ‖query‖` into `out` (a zero query stays zero: its cosine with every cached
/// query is 0). The norm is accumulated in f64.
pub(crate) fn normalize_into(query: &[f32], out: &mut Vec<f32>) {
    let norm = dot_f64(query, query).sqrt();
    out.clear();
    if norm > 0.0 {
        out.extend(query.iter().map(|&x| (f64::from(x) / norm) as f32));
    } else {
        out.resize(query.len(), 0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_evicts_the_oldest_and_reuses_buffers() {
        let mut c = QueryCache::new(2);
        c.push(&[1.0, 0.0], &[1, 2]);
        c.push(&[0.0, 1.0], &[3]);
        c.push(&[-1.0, 0.0], &[4, 5, 6]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(0).map(|e| e.ids.clone()), Some(vec![3]));
        assert_eq!(c.get(1).map(|e| e.ids.clone()), Some(vec![4, 5, 6]));
        assert!(c.get(2).is_none());
    }

    #[test]
    fn rank_puts_the_most_similar_first_and_prefers_recent_on_ties() {
        let mut c = QueryCache::new(8);
        let rows: [[f32; 2]; 5] = [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0], [0.6, 0.8]];
        for (i, r) in rows.iter().enumerate() {
            c.push(r, &[i as u32]);
        }
        let mut sims = Vec::new();
        c.rank(&[0.8, 0.6], 3, &mut sims);
        assert_eq!(sims.len(), 5);
        let top: Vec<usize> = sims[..3].iter().map(|s| s.1).collect();
        // 0.6·0.8 + 0.8·0.6 = 0.96 for entries 2 and 4 (4 is newer), then entry 0 (0.8).
        assert_eq!(top, vec![4, 2, 0]);
        assert!((sims[0].0 - 0.96).abs() < 1e-6);
        c.rank(&[0.8, 0.6], 0, &mut sims);
        assert_eq!(sims.len(), 5);
    }

    #[test]
    fn normalize_gives_unit_norm_and_keeps_zero() {
        let mut out = Vec::new();
        normalize_into(&[3.0, 4.0], &mut out);
        assert_eq!(out, vec![0.6, 0.8]);
        normalize_into(&[0.0, 0.0, 0.0], &mut out);
        assert_eq!(out, vec![0.0; 3]);
    }
}
