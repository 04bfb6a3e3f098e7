//! [`VisitedSet`]: which ids a graph walk has scored.

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
