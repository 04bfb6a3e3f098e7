//! Per-thread search buffers: a visited set with epoch tags, the two heaps of beam search and
//! id/score buffers. One `Scratch` serves every index kind and grows on demand; a search that
//! reuses it allocates nothing.

use std::cmp::Ordering;

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

    /// Marks every id of `ids` and appends those not marked before to `out`.
    #[inline]
    pub fn filter_new(&mut self, ids: &[u32], out: &mut Vec<u32>) {
        let epoch = self.epoch;
        let tags = self.tags.as_mut_slice();
        for &id in ids {
            let t = &mut tags[id as usize];
            if *t != epoch {
                *t = epoch;
                out.push(id);
            }
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

/// Selection of the `k` best (largest score) items from a stream.
///
/// Items above the current threshold go to a buffer; when it holds `4k` items, a linear-time
/// selection keeps the best `k` and raises the threshold to the k-th best. Unlike a heap, this
/// stays linear on adversarial orders — attention scores often *rise* along a row, because
/// later keys are more recent — and whole blocks below the threshold are skipped with one
/// vectorised comparison ([`TopK::push_block`]).
#[derive(Clone, Debug, Default)]
pub struct TopK {
    buf: Vec<Scored>,
    k: usize,
    threshold: f32,
}

impl TopK {
    /// Starts a new selection of `k` items (keeps the allocation).
    pub fn reset(&mut self, k: usize) {
        self.buf.clear();
        self.buf.reserve(4 * k + 16);
        self.k = k;
        self.threshold = f32::NEG_INFINITY;
    }

    /// Scores at or below this cannot enter the top k (−∞ until k items were seen).
    #[inline]
    pub fn threshold(&self) -> f32 {
        self.threshold
    }

    /// Offers one item.
    #[inline]
    pub fn push(&mut self, score: f32, id: u32) {
        if score > self.threshold || self.k > self.buf.len() && self.threshold == f32::NEG_INFINITY
        {
            self.buf.push(Scored { score, id });
            if self.buf.len() >= 4 * self.k.max(4) {
                self.compact();
            }
        }
    }

    /// Offers `scores[i]` with id `base + i` for every i.
    #[inline]
    pub fn push_block(&mut self, scores: &[f32], base: u32) {
        for (b, block) in scores.chunks(16).enumerate() {
            let t = self.threshold;
            // One vectorised pass decides whether any score of the block can enter.
            if t != f32::NEG_INFINITY && !block.iter().fold(false, |any, &x| any | (x > t)) {
                continue;
            }
            let first = base + (16 * b) as u32;
            for (o, &score) in block.iter().enumerate() {
                self.push(score, first + o as u32);
            }
        }
    }

    /// Keeps the best `k` buffered items and raises the threshold.
    fn compact(&mut self) {
        if self.buf.len() > self.k && self.k > 0 {
            self.buf.select_nth_unstable_by(self.k - 1, |a, b| b.cmp(a));
            self.buf.truncate(self.k);
        }
        if self.buf.len() >= self.k && self.k > 0 {
            self.threshold = self
                .buf
                .iter()
                .map(|x| x.score)
                .fold(f32::INFINITY, f32::min);
        }
    }

    /// Appends the best `min(k, seen)` items to `ids`/`scores`, best first, and empties the
    /// selection.
    pub fn drain_sorted(&mut self, ids: &mut Vec<u32>, scores: &mut Vec<f32>) {
        self.compact();
        self.buf.sort_unstable_by(|a, b| b.cmp(a));
        for s in self.buf.drain(..).take(self.k) {
            ids.push(s.id);
            scores.push(s.score);
        }
        self.threshold = f32::NEG_INFINITY;
    }
}

/// The candidate list of beam search (DiskANN's "neighbour priority queue"): at most `cap`
/// items sorted by score, best first, each flagged once expanded. One sorted array replaces
/// the frontier heap and the result heap: insertion is a binary search and a short move, and
/// the next node to expand is the best unexpanded one, found from a cursor.
#[derive(Clone, Debug, Default)]
pub struct BeamList {
    /// Scores, best first; `ids[i]` belongs to `scores[i]`.
    scores: Vec<f32>,
    /// Ids with [`EXPANDED`] set once the node was expanded.
    ids: Vec<u32>,
    cap: usize,
    cursor: usize,
}

/// Flag bit of [`BeamList`] ids: the node was expanded (graph ids are below 2³¹).
const EXPANDED: u32 = 1 << 31;

impl BeamList {
    /// Empties the list and sets its capacity (`ef`).
    pub fn reset(&mut self, cap: usize) {
        self.scores.clear();
        self.ids.clear();
        self.scores.reserve(cap + 1);
        self.ids.reserve(cap + 1);
        self.cap = cap;
        self.cursor = 0;
    }

    /// Number of items held.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// True when no item is held.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// True when the list cannot take an item scoring `score` (it is full and `score` is not
    /// above its worst).
    #[inline]
    pub fn rejects(&self, score: f32) -> bool {
        self.scores.len() >= self.cap && self.scores.last().is_some_and(|&l| score <= l)
    }

    /// Inserts an item (`id < 2³¹`) unless the list rejects it; returns true when inserted.
    /// Equal scores keep insertion order.
    #[inline]
    pub fn insert(&mut self, score: f32, id: u32) -> bool {
        if self.cap == 0 || self.rejects(score) {
            return false;
        }
        let pos = self.scores.partition_point(|&x| x >= score);
        if self.scores.len() >= self.cap {
            self.scores.pop();
            self.ids.pop();
        }
        self.scores.insert(pos, score);
        self.ids.insert(pos, id & !EXPANDED);
        if pos < self.cursor {
            self.cursor = pos;
        }
        true
    }

    /// The best unexpanded item, marked expanded; `None` when every item is expanded.
    #[inline]
    pub fn next_unexpanded(&mut self) -> Option<Scored> {
        while self.cursor < self.ids.len() {
            let i = self.cursor;
            self.cursor += 1;
            let id = self.ids[i];
            if id & EXPANDED == 0 {
                self.ids[i] = id | EXPANDED;
                return Some(Scored {
                    score: self.scores[i],
                    id,
                });
            }
        }
        None
    }

    /// Appends the best `k` items to `ids` / `scores`, best first.
    pub fn copy_best(&self, k: usize, ids: &mut Vec<u32>, scores: &mut Vec<f32>) {
        let k = k.min(self.scores.len());
        ids.extend(self.ids[..k].iter().map(|&id| id & !EXPANDED));
        scores.extend_from_slice(&self.scores[..k]);
    }
}

/// Reusable buffers of one searching thread.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    pub(crate) visited: VisitedSet,
    /// Beam search candidate list.
    pub(crate) beam: BeamList,
    /// Top-k selection of scans.
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
    fn beam_list_keeps_best_sorted_and_expands_in_order() {
        let mut b = BeamList::default();
        b.reset(3);
        assert!(b.insert(1.0, 1));
        assert!(b.insert(3.0, 3));
        assert_eq!(b.next_unexpanded().map(|s| s.id), Some(3));
        assert!(b.insert(2.0, 2));
        assert!(b.insert(5.0, 5));
        assert!(!b.insert(0.5, 9));
        assert_eq!(b.next_unexpanded().map(|s| s.id), Some(5));
        assert_eq!(b.next_unexpanded().map(|s| s.id), Some(2));
        assert_eq!(b.next_unexpanded(), None);
        let (mut ids, mut scores) = (Vec::new(), Vec::new());
        b.copy_best(2, &mut ids, &mut scores);
        assert_eq!(ids, vec![5, 3]);
        assert_eq!(scores, vec![5.0, 3.0]);
    }

    #[test]
    fn topk_keeps_the_best_sorted() {
        let mut t = TopK::default();
        t.reset(3);
        for (i, s) in [0.5, 3.0, -1.0, 2.0, 7.0, 2.5].iter().enumerate() {
            t.push(*s, i as u32);
        }
        let (mut ids, mut scores) = (Vec::new(), Vec::new());
        t.drain_sorted(&mut ids, &mut scores);
        assert_eq!(ids, vec![4, 1, 5]);
        assert_eq!(scores, vec![7.0, 3.0, 2.5]);
    }

    #[test]
    fn topk_blocks_match_sorting_on_rising_and_random_rows() {
        let mut rng = crate::synth::Rng::new(5);
        for k in [1usize, 5, 100] {
            let rising: Vec<f32> = (0..3000).map(|i| i as f32 * 0.01).collect();
            let random: Vec<f32> = (0..3000).map(|_| rng.normal()).collect();
            for row in [rising, random] {
                let mut t = TopK::default();
                t.reset(k);
                t.push_block(&row[..1234], 0);
                t.push_block(&row[1234..], 1234);
                let (mut ids, mut scores) = (Vec::new(), Vec::new());
                t.drain_sorted(&mut ids, &mut scores);
                let mut want: Vec<(f32, u32)> = row
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| (s, i as u32))
                    .collect();
                want.sort_by(|a, b| b.0.total_cmp(&a.0));
                let want_scores: Vec<f32> = want.iter().take(k).map(|x| x.0).collect();
                assert_eq!(scores, want_scores);
                assert_eq!(ids.len(), k);
            }
        }
    }
}
