//! Per-thread search buffers: a visited set with epoch tags, the two heaps of beam search and
//! id/score buffers. One `Scratch` serves every index kind and grows on demand; a search that
//! reuses it allocates nothing.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// A key id with its score; ordered by score (total order, NaN-free inputs), then id.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    pub score: f32,
    pub id: u32,
}

impl Eq for Scored {}

impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scored {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.id.cmp(&self.id))
    }
}

/// Visited set over ids `0..n` with `u16` epoch tags: clearing is one increment, and the tags
/// are wiped only when the epoch wraps around (every 65,535 searches).
#[derive(Clone, Debug, Default)]
pub struct VisitedSet {
    tags: Vec<u16>,
    epoch: u16,
}

impl VisitedSet {
    /// Starts a new search over ids `0..n`.
    pub fn reset(&mut self, n: usize) {
        if self.tags.len() < n {
            self.tags.resize(n, 0);
        }
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.tags.fill(0);
            self.epoch = 1;
        }
    }

    /// Marks `id`; returns true when it was not marked before in this search.
    #[inline]
    pub fn insert(&mut self, id: u32) -> bool {
        let t = &mut self.tags[id as usize];
        if *t == self.epoch {
            false
        } else {
            *t = self.epoch;
            true
        }
    }

    /// True when `id` is marked in this search.
    #[inline]
    pub fn contains(&self, id: u32) -> bool {
        self.tags[id as usize] == self.epoch
    }

    /// Current epoch (tests drive it through wraparound).
    pub fn epoch(&self) -> u16 {
        self.epoch
    }
}

/// Bounded selection of the `k` best (largest score) items: a min-heap whose top is the
/// current admission threshold.
#[derive(Clone, Debug, Default)]
pub struct TopK {
    heap: BinaryHeap<Reverse<Scored>>,
    k: usize,
}

impl TopK {
    /// Starts a new selection of `k` items (keeps the allocation).
    pub fn reset(&mut self, k: usize) {
        self.heap.clear();
        self.k = k;
    }

    /// Number of items held.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when no item is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// True when `k` items are held.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.heap.len() >= self.k
    }

    /// The worst score held (the admission threshold once full); −∞ when empty.
    #[inline]
    pub fn worst(&self) -> f32 {
        self.heap.peek().map_or(f32::NEG_INFINITY, |r| r.0.score)
    }

    /// Offers an item; returns true when it was kept.
    #[inline]
    pub fn push(&mut self, score: f32, id: u32) -> bool {
        if self.heap.len() < self.k {
            self.heap.push(Reverse(Scored { score, id }));
            true
        } else if score > self.worst() {
            if let Some(mut top) = self.heap.peek_mut() {
                *top = Reverse(Scored { score, id });
            }
            true
        } else {
            false
        }
    }

    /// Moves the best `k` (or all, when fewer) into `ids`/`scores`, best first, and empties the
    /// selection.
    pub fn drain_sorted(&mut self, k: usize, ids: &mut Vec<u32>, scores: &mut Vec<f32>) {
        while self.heap.len() > k {
            self.heap.pop();
        }
        let start = ids.len();
        while let Some(Reverse(s)) = self.heap.pop() {
            ids.push(s.id);
            scores.push(s.score);
        }
        ids[start..].reverse();
        scores[start..].reverse();
    }
}

/// Reusable buffers of one searching thread.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    pub(crate) visited: VisitedSet,
    /// Beam search frontier (max-heap: best candidate first).
    pub(crate) frontier: BinaryHeap<Scored>,
    /// Beam search result list / top-k selection.
    pub(crate) best: TopK,
    pub(crate) ids: Vec<u32>,
    pub(crate) scores: Vec<f32>,
}

impl Scratch {
    /// A scratch for indexes of up to `n` keys (it grows when used on larger ones).
    pub fn new(n: usize) -> Self {
        let mut s = Scratch::default();
        s.visited.reset(n);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visited_set_survives_epoch_wraparound() {
        let mut v = VisitedSet::default();
        v.reset(4);
        assert!(v.insert(2));
        for _ in 0..70_000 {
            v.reset(4);
            assert!(!v.contains(2));
            assert!(v.insert(2));
            assert!(!v.insert(2));
        }
        assert_ne!(v.epoch(), 0);
    }

    #[test]
    fn topk_keeps_the_best_sorted() {
        let mut t = TopK::default();
        t.reset(3);
        for (i, s) in [0.5, 3.0, -1.0, 2.0, 7.0, 2.5].iter().enumerate() {
            t.push(*s, i as u32);
        }
        let (mut ids, mut scores) = (Vec::new(), Vec::new());
        t.drain_sorted(3, &mut ids, &mut scores);
        assert_eq!(ids, vec![4, 1, 5]);
        assert_eq!(scores, vec![7.0, 3.0, 2.5]);
    }
}
