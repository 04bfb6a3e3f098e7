//! [`BeamList`]: the sorted candidate list of beam search.

use super::{from_order_key, order_key, Scored};

/// The candidate list of beam search (DiskANN's "neighbour priority queue"): at most `cap`
/// items sorted best first, each flagged once expanded. One sorted array replaces the frontier
/// heap and the result heap. Each item is one `u64` — the score mapped to an order-preserving
/// `u32`, then the id, then the expanded bit — so a search is one branch-free binary search
/// over integers and an insert moves 8-byte items.
#[derive(Clone, Debug, Default)]
pub struct BeamList {
    items: Vec<u64>,
    cap: usize,
    cursor: usize,
    /// Only items ranked below this are expanded (the beam width; `cap` by default).
    width: usize,
}

impl BeamList {
    /// Empties the list and sets its capacity (`ef`).
    pub fn reset(&mut self, cap: usize) {
        self.items.clear();
        self.items.reserve(cap + 1);
        self.cap = cap;
        self.cursor = 0;
        self.width = cap;
    }

    /// Expands only the best `width` items (at least 1, at most the capacity). Items ranked
    /// lower stay in the list as results but are never expanded: a search of list size `cap`
    /// and width `w < cap` walks exactly as one of list size `w` would, and returns the best
    /// `cap` of every item it scored.
    pub fn set_width(&mut self, width: usize) {
        self.width = width.clamp(1, self.cap.max(1));
    }

    /// Number of items held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when no item is held.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    #[inline(always)]
    fn pack(score: f32, id: u32) -> u64 {
        (u64::from(order_key(score)) << 32) | (u64::from(id & 0x7fff_ffff) << 1)
    }

    /// Inserts an item (`id < 2³¹`) unless the list is full and the item is not better than
    /// its worst; returns true when inserted.
    #[inline(always)]
    pub fn insert(&mut self, score: f32, id: u32) -> bool {
        let item = Self::pack(score, id);
        if self.items.len() >= self.cap {
            match self.items.last() {
                Some(&last) if item > last => {
                    self.items.pop();
                }
                _ => return false,
            }
        }
        // The list is sorted, so the insert position is the number of better items. Counting
        // them is one vectorised pass without the dependent loads of a binary search.
        let pos = self.items.iter().filter(|&&x| x > item).count();
        self.items.insert(pos, item);
        if pos < self.cursor {
            self.cursor = pos;
        }
        true
    }

    /// The score an item must beat to enter: the worst held once the list is full, else −∞.
    #[inline(always)]
    pub fn floor(&self) -> f32 {
        match self.items.last() {
            Some(&last) if self.items.len() >= self.cap => Self::unpack(last).score,
            _ => f32::NEG_INFINITY,
        }
    }

    /// How many of the best `k` are held, and the one ranked last of them without its expanded
    /// bit (0 when none): it changes exactly when an insert lands among the best `k`.
    #[inline(always)]
    pub fn best_k_mark(&self, k: usize) -> (usize, u64) {
        let held = self.items.len().min(k);
        let last = held.checked_sub(1).map_or(0, |i| self.items[i] & !1);
        (held, last)
    }

    /// The best unexpanded item, marked expanded; `None` when every item is expanded.
    #[inline(always)]
    pub fn next_unexpanded(&mut self) -> Option<Scored> {
        let end = self.items.len().min(self.width);
        while self.cursor < end {
            let i = self.cursor;
            self.cursor += 1;
            let item = self.items[i];
            if item & 1 == 0 {
                self.items[i] = item | 1;
                return Some(Self::unpack(item));
            }
        }
        None
    }

    /// The id [`BeamList::next_unexpanded`] would return now, without marking it.
    #[inline(always)]
    pub fn peek_unexpanded(&self) -> Option<u32> {
        let end = self.items.len().min(self.width);
        self.items
            .get(self.cursor..end)?
            .iter()
            .find(|&&item| item & 1 == 0)
            .map(|&item| Self::unpack(item).id)
    }

    #[inline(always)]
    fn unpack(item: u64) -> Scored {
        Scored {
            score: from_order_key((item >> 32) as u32),
            id: ((item as u32) >> 1) & 0x7fff_ffff,
        }
    }

    /// Appends the best `k` items to `ids` / `scores`, best first.
    pub fn copy_best(&self, k: usize, ids: &mut Vec<u32>, scores: &mut Vec<f32>) {
        for &item in self.items.iter().take(k) {
            let s = Self::unpack(item);
            ids.push(s.id);
            scores.push(s.score);
        }
    }
}
