//! Per-thread search buffers: a visited bitset, the two heaps of beam search and
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

/// Visited set over ids `0..n`: one bit per id, so that it stays in L1/L2 at any size a head
/// reaches (64 KiB at 512K keys, where a byte or tag per id would spill to L3 and miss on
/// every neighbour checked). The ids marked since the last reset are logged while they are few,
/// so that a reset clears only their words; past one id per word it clears the whole set.
#[derive(Clone, Debug, Default)]
pub struct VisitedSet {
    words: Vec<u64>,
    /// Ids marked since the last reset, or the whole set when `all_dirty`.
    marked: Vec<u32>,
    all_dirty: bool,
}

impl VisitedSet {
    /// Starts a new search over ids `0..n` (no id marked).
    pub fn reset(&mut self, n: usize) {
        if self.all_dirty {
            self.words.fill(0);
        } else {
            for &id in &self.marked {
                if let Some(w) = self.words.get_mut((id >> 6) as usize) {
                    *w = 0;
                }
            }
        }
        self.marked.clear();
        self.all_dirty = false;
        let need = n.div_ceil(64);
        if self.words.len() < need {
            self.words.resize(need, 0);
        }
    }

    /// Logs newly marked ids for the next reset (or gives up logging once they outnumber the
    /// words: clearing everything is then cheaper).
    #[inline(always)]
    fn log(&mut self, new: &[u32]) {
        if !self.all_dirty {
            if self.marked.len() + new.len() > self.words.len() {
                self.all_dirty = true;
                self.marked.clear();
            } else {
                self.marked.extend_from_slice(new);
            }
        }
    }

    /// Marks `id`; returns true when it was not marked before in this search.
    #[inline]
    pub fn insert(&mut self, id: u32) -> bool {
        let w = &mut self.words[(id >> 6) as usize];
        let bit = 1u64 << (id & 63);
        if *w & bit != 0 {
            false
        } else {
            *w |= bit;
            self.log(&[id]);
            true
        }
    }

    /// Marks every id of `ids` and appends those not marked before to `out`. Branch-free: each
    /// id is written, and the write position advances only for new ids (graph neighbour lists
    /// are mostly visited, so a branch here would mispredict often).
    #[inline(always)]
    pub fn filter_new(&mut self, ids: &[u32], out: &mut Vec<u32>) {
        self.filter(ids, u32::MAX, out);
    }

    /// [`VisitedSet::filter_new`] that also drops ids `≥ n` (`n ≤` the `n` of the last
    /// [`VisitedSet::reset`]), so a search over a graph read from an unverified file never
    /// touches a row that does not exist.
    #[inline(always)]
    pub fn filter_new_below(&mut self, ids: &[u32], n: u32, out: &mut Vec<u32>) {
        self.filter(ids, n, out);
    }

    #[inline(always)]
    fn filter(&mut self, ids: &[u32], n: u32, out: &mut Vec<u32>) {
        let words = self.words.as_mut_slice();
        let start = out.len();
        out.resize(start + ids.len(), 0);
        let buf = &mut out[start..];
        // Pass 1, loads only: the ids not marked before this call. No load here waits for the
        // store of an earlier id (the ids of one neighbour list are often in the same word, and
        // a test-and-set loop then runs at store-forwarding latency per id).
        let mut fresh = 0;
        for &id in ids {
            if id >= n {
                continue;
            }
            let word = words[(id >> 6) as usize];
            buf[fresh] = id;
            fresh += usize::from(word & (1u64 << (id & 63)) == 0);
        }
        // Pass 2, over the few unmarked ones: mark them, dropping repeats within `ids`.
        let mut len = 0;
        for i in 0..fresh {
            let id = buf[i];
            let w = &mut words[(id >> 6) as usize];
            let bit = 1u64 << (id & 63);
            buf[len] = id;
            len += usize::from(*w & bit == 0);
            *w |= bit;
        }
        out.truncate(start + len);
        self.log(&out[start..]);
    }

    /// True when `id` is marked in this search.
    #[inline]
    pub fn contains(&self, id: u32) -> bool {
        self.words[(id >> 6) as usize] & (1u64 << (id & 63)) != 0
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
    /// Items packed as [`TopK::pack`]: their integer order is [`Scored`]'s order, so selection
    /// and sorting compare integers.
    buf: Vec<u64>,
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
            self.buf.push(Self::pack(score, id));
            if self.buf.len() >= 4 * self.k.max(4) {
                self.compact();
            }
        }
    }

    /// Offers `scores[i]` with id `base + i` for every i.
    #[inline]
    pub fn push_block(&mut self, scores: &[f32], base: u32) {
        let cap = 4 * self.k.max(4);
        for (b, block) in scores.chunks(16).enumerate() {
            // One vectorised comparison gives the mask of the block's scores that can enter;
            // only those are visited (no branch per score).
            let t = self.threshold;
            let mut mask = block
                .iter()
                .enumerate()
                .fold(0u32, |m, (i, &x)| m | (u32::from(x > t) << i));
            if mask == 0 {
                continue;
            }
            let first = base + (16 * b) as u32;
            while mask != 0 {
                let i = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                self.buf.push(Self::pack(block[i], first + i as u32));
            }
            if self.buf.len() >= cap {
                self.compact();
            }
        }
    }

    /// `score` in the high half as an order-preserving integer (its total order), `!id` in the
    /// low half: a higher score is a larger key, and for equal scores the lower id is.
    #[inline(always)]
    fn pack(score: f32, id: u32) -> u64 {
        (u64::from(order_key(score)) << 32) | u64::from(!id)
    }

    #[inline(always)]
    fn unpack(x: u64) -> Scored {
        Scored {
            score: from_order_key((x >> 32) as u32),
            id: !(x as u32),
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
                .min()
                .map_or(f32::INFINITY, |&x| Self::unpack(x).score);
        }
    }

    /// Appends the best `min(k, seen)` items to `ids`/`scores`, best first, and empties the
    /// selection.
    pub fn drain_sorted(&mut self, ids: &mut Vec<u32>, scores: &mut Vec<f32>) {
        self.compact();
        self.buf.sort_unstable_by(|a, b| b.cmp(a));
        for s in self.buf.drain(..).take(self.k).map(Self::unpack) {
            ids.push(s.id);
            scores.push(s.score);
        }
        self.threshold = f32::NEG_INFINITY;
    }
}

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

/// Maps an f32 to a `u32` whose unsigned order is the float's total order.
#[inline(always)]
pub(crate) fn order_key(score: f32) -> u32 {
    let b = score.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Inverse of [`order_key`].
#[inline(always)]
pub(crate) fn from_order_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 {
        k & 0x7fff_ffff
    } else {
        !k
    })
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
    /// The query quantized for code estimates ([`crate::graph::codes`]).
    pub(crate) quant: crate::metric::int8::QuantQuery,
    /// The query transformed for an int8 store ([`crate::store::Scorer::bind`]).
    pub(crate) query: Vec<f32>,
    /// Every key's code estimate, a sample of them, and the candidates above a threshold
    /// ([`crate::flat::ScanCodes`]).
    pub(crate) estimates: Vec<f32>,
    pub(crate) sample: Vec<u32>,
    pub(crate) picked: Vec<u64>,
    /// The list positions of `estimates` ([`crate::ivf::ListCodes`]).
    pub(crate) positions: Vec<u32>,
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
    fn visited_set_resets_after_few_and_after_many_marks() {
        let mut v = VisitedSet::default();
        for n in [4usize, 1000, 130, 70_000] {
            v.reset(n);
            for id in [0u32, 63, 64, (n - 1) as u32]
                .into_iter()
                .filter(|&i| (i as usize) < n)
            {
                assert!(!v.contains(id), "n = {n}: {id} marked after reset");
            }
            // Few marks (logged), then every id (the log gives up and the reset clears all).
            for count in [3usize, n] {
                v.reset(n);
                let ids: Vec<u32> = (0..count as u32).map(|i| (i * 7919) % n as u32).collect();
                let mut fresh = Vec::new();
                v.filter_new(&ids, &mut fresh);
                let mut want = ids.clone();
                want.sort_unstable();
                want.dedup();
                fresh.sort_unstable();
                assert_eq!(fresh, want);
                assert!(ids.iter().all(|&id| v.contains(id) && !v.insert(id)));
                v.reset(n);
                assert!(ids.iter().all(|&id| !v.contains(id)));
                assert!(v.insert(ids[0]));
            }
        }
    }

    proptest::proptest! {
        /// The filter keeps the first occurrence of every in-range id not marked before, in
        /// order, and marks them all (repeats within one list, pre-marked ids and ids past `n`
        /// included).
        #[test]
        fn filter_keeps_first_new_occurrences(
            n in 1u32..300,
            marked in proptest::collection::vec(0u32..300, 0..40),
            ids in proptest::collection::vec(0u32..320, 0..80),
        ) {
            let mut v = VisitedSet::default();
            v.reset(n as usize);
            let mut seen = vec![false; n as usize];
            let mut sink = Vec::new();
            let pre: Vec<u32> = marked.into_iter().filter(|&m| m < n).collect();
            v.filter_new(&pre, &mut sink);
            for &m in &pre {
                seen[m as usize] = true;
            }
            let mut want = Vec::new();
            for &id in &ids {
                if id < n && !seen[id as usize] {
                    seen[id as usize] = true;
                    want.push(id);
                }
            }
            let mut got = vec![7u32];
            v.filter_new_below(&ids, n, &mut got);
            proptest::prop_assert_eq!(got[0], 7);
            proptest::prop_assert_eq!(&got[1..], &want[..]);
            for id in 0..n {
                proptest::prop_assert_eq!(v.contains(id), seen[id as usize]);
            }
        }
    }

    #[test]
    fn order_key_round_trips_and_orders() {
        let xs = [
            f32::NEG_INFINITY,
            -3.5,
            -0.0,
            0.0,
            1e-30,
            2.0,
            7.5e10,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(order_key(w[0]) <= order_key(w[1]));
        }
        for x in xs {
            assert_eq!(from_order_key(order_key(x)).to_bits(), x.to_bits());
        }
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
    fn beam_width_limits_expansion_not_results() {
        let mut b = BeamList::default();
        b.reset(4);
        b.set_width(2);
        for (s, id) in [(1.0, 1), (4.0, 4), (3.0, 3), (2.0, 2)] {
            b.insert(s, id);
        }
        assert_eq!(b.next_unexpanded().map(|s| s.id), Some(4));
        assert_eq!(b.next_unexpanded().map(|s| s.id), Some(3));
        assert_eq!(b.next_unexpanded(), None, "ranks 3 and 4 are results only");
        b.insert(5.0, 5);
        assert_eq!(b.next_unexpanded().map(|s| s.id), Some(5));
        assert_eq!(b.next_unexpanded(), None);
        let (mut ids, mut scores) = (Vec::new(), Vec::new());
        b.copy_best(4, &mut ids, &mut scores);
        assert_eq!(ids, vec![5, 4, 3, 2]);
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
