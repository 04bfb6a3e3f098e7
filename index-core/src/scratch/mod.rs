//! Per-thread search buffers: a visited bitset, the two heaps of beam search and
//! id/score buffers. One `Scratch` serves every index kind and grows on demand; a search that
//! reuses it allocates nothing.
//!
//! | file | job |
//! |---|---|
//! | `visited.rs` | [`VisitedSet`], the visited bitset of graph walks |
//! | `topk.rs` | [`TopK`], the selection of the best `k` of a stream (scans, re-ranks) |
//! | `beam.rs` | [`BeamList`], the candidate list of beam search |
//! | `mod.rs` | [`Scratch`], [`Scored`], the order-preserving integer keys of scores |

mod beam;
mod topk;
mod visited;

pub use beam::BeamList;
pub use topk::TopK;
pub use visited::VisitedSet;

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
    /// The queries of a batched scan, quantized ([`crate::flat::ScanCodes::search_rows`]).
    pub(crate) quants: Vec<crate::metric::int8::QuantQuery>,
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
