//! [`TopK`]: the best `k` items of a stream.

use super::{from_order_key, order_key, Scored};

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
