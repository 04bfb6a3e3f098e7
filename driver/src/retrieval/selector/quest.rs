//! `quest`: Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context
//! LLM Inference").
//!
//! **The paper.** The KV cache is cut into pages of consecutive tokens (16 by default). Each
//! page keeps the element-wise minimum `m` and maximum `M` of its keys. For the current query
//! `q`, the page's criticality is the upper bound `Σ_i max(q_i·m_i, q_i·M_i)` on `q·k` over
//! every key `k` of the page; attention then reads every key of the top `K / page_size` pages,
//! `K` being the token budget. Quest keeps the first two layers dense.
//!
//! **Here.** The same, over the rest only (rest ids `0..`, our sinks and recent window are
//! the static part the step attends anyway): pages of [`PAGE_SIZE`] consecutive rest keys,
//! the last one possibly partial. The budget `k` maps to `⌊k / 16⌋` pages, at least 1 (so at
//! most `k` keys for `k ≥ 16`, one page of 16 below). A key that leaves the window (upkeep)
//! joins the last page (its min/max widened) or starts a new one when that page is full.
//!
//! **Cost.** A page bound reads `2·d` values (min and max) against `q`: it counts as
//! [`BOUND_INNER_PRODUCTS`] = 2 inner products, so a selection costs `2 · pages`.
//!
//! **Deviation.** Quest's dense first two layers are not built in: dense layers are the shared
//! `--dense-layers` knob of every policy.

use super::{check_key, HeadPrefill, Selection, Selector, TopN};
use crate::retrieval::ids::RestId;
use qkindex_model::ModelError;

/// Keys per page (Quest's page size in its evaluation).
pub const PAGE_SIZE: usize = 16;

/// Inner products a page bound counts for: it reads the page's min and max (`2·d` values).
pub const BOUND_INNER_PRODUCTS: u64 = 2;

/// The pages of one KV head's rest.
#[derive(Debug)]
pub struct Quest {
    hd: usize,
    /// Pages to attend per selection.
    pages: usize,
    /// Keys under the selector.
    n: usize,
    /// Per page, the element-wise min and max of its keys (`n_pages × hd` each).
    min: Vec<f32>,
    max: Vec<f32>,
    bounds: Vec<f32>,
    top: TopN,
    chosen: Vec<u32>,
}

impl Quest {
    pub fn build(prefill: &HeadPrefill<'_>) -> Result<Self, ModelError> {
        let hd = prefill.head_dim;
        if hd == 0 {
            return Err(qkindex::Error::invalid_param("head_dim", 0, "must be at least 1").into());
        }
        let mut q = Quest {
            hd,
            pages: (prefill.cfg.k / PAGE_SIZE).max(1),
            n: 0,
            min: Vec::new(),
            max: Vec::new(),
            bounds: Vec::new(),
            top: TopN::default(),
            chosen: Vec::new(),
        };
        for key in prefill.rest_keys().chunks_exact(hd) {
            q.push(key);
        }
        Ok(q)
    }

    fn n_pages(&self) -> usize {
        self.n.div_ceil(PAGE_SIZE)
    }

    /// Appends `key`: to the last page, or as a new page when that one is full.
    fn push(&mut self, key: &[f32]) {
        if self.n.is_multiple_of(PAGE_SIZE) {
            self.min.extend_from_slice(key);
            self.max.extend_from_slice(key);
        } else {
            let at = self.min.len() - self.hd;
            for ((lo, hi), &x) in self.min[at..].iter_mut().zip(&mut self.max[at..]).zip(key) {
                *lo = lo.min(x);
                *hi = hi.max(x);
            }
        }
        self.n += 1;
    }

    /// Page `p`'s upper bound on `q·k` over its keys.
    fn bound(&self, p: usize, q: &[f32]) -> f32 {
        let at = p * self.hd;
        let (lo, hi) = (&self.min[at..at + self.hd], &self.max[at..at + self.hd]);
        q.iter()
            .zip(lo.iter().zip(hi))
            .map(|(&qi, (&l, &h))| (qi * l).max(qi * h))
            .sum()
    }
}

impl Selector for Quest {
    fn n_keys(&self) -> usize {
        self.n
    }

    fn upkeep(&mut self, key: &[f32], _guide: &[f32]) -> Result<(), ModelError> {
        check_key(key, self.hd)?;
        self.push(key);
        Ok(())
    }

    fn select(&mut self, _j: usize, query: &[f32], out: &mut Selection) -> Result<(), ModelError> {
        out.clear();
        let n_pages = self.n_pages();
        let mut bounds = std::mem::take(&mut self.bounds);
        bounds.clear();
        bounds.extend((0..n_pages).map(|p| self.bound(p, query)));
        self.top.ids_of(&bounds, self.pages, &mut self.chosen);
        self.bounds = bounds;
        for &p in &self.chosen {
            let first = p as usize * PAGE_SIZE;
            let last = (first + PAGE_SIZE).min(self.n);
            out.ids.extend((first..last).map(|id| RestId(id as u32)));
        }
        out.distance_computations = BOUND_INNER_PRODUCTS * n_pages as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use qkindex::synth::Rng;

    use super::*;
    use crate::retrieval::policy::{PolicyConfig, PolicyKind};
    use crate::retrieval::selector::testing::{assert_valid, small_cfg, Synth};
    use qkindex_model::simd;

    fn cfg(k: usize) -> PolicyConfig {
        small_cfg(PolicyKind::Quest, k, 8)
    }

    #[test]
    fn quest_bound_is_at_least_every_inner_product_of_its_page() {
        let mut rng = Rng::new(3);
        for case in 0..50u64 {
            let n = 12 + 16 + rng.below(100);
            let s = Synth::new(cfg(32), n, 8, 1, case);
            let quest = Quest::build(&s.prefill()).expect("builds");
            let rest = s.prefill().rest_keys();
            for _ in 0..4 {
                let q: Vec<f32> = (0..8).map(|_| 3.0 * rng.normal()).collect();
                for (id, key) in rest.chunks_exact(8).enumerate() {
                    let (b, x) = (quest.bound(id / PAGE_SIZE, &q), simd::dot(&q, key));
                    assert!(b >= x - 1e-4, "case {case}: bound {b} < q·k {x}");
                }
            }
        }
    }

    #[test]
    fn quest_selects_the_page_of_a_dominant_key_and_counts_bounds() {
        let (n, hd) = (12 + 100, 8);
        let mut s = Synth::new(cfg(40), n, hd, 2, 5);
        // Rest id 37 (page 2) is a large copy of the query.
        let q: Vec<f32> = (0..hd)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        for (x, &qi) in s.key_mut(4 + 37).iter_mut().zip(&q) {
            *x = 20.0 * qi;
        }
        let mut quest = Quest::build(&s.prefill()).expect("builds");
        assert_eq!(quest.n_keys(), 100);
        let mut out = Selection::default();
        quest.select(1, &q, &mut out).expect("selects");
        // ⌊40/16⌋ = 2 pages, the best first: 32 keys starting with page 2.
        assert_eq!(out.ids.len(), 32);
        assert_eq!(out.ids[0], RestId(32));
        assert!(out.ids.contains(&RestId(37)));
        assert_valid(&out.ids, quest.n_keys());
        // 7 pages (the last holds 4 keys), 2 inner products each.
        assert_eq!(out.distance_computations, 14);
    }

    #[test]
    fn quest_upkeep_fills_the_last_page_then_starts_one() {
        let s = Synth::new(cfg(1000), 12 + 20, 4, 1, 9);
        let mut quest = Quest::build(&s.prefill()).expect("builds");
        assert_eq!(quest.n_pages(), 2);
        for i in 0..13 {
            quest.upkeep(&[i as f32; 4], &[]).expect("upkeep");
        }
        // 20 + 13 keys: pages of 16, 16, 1.
        assert_eq!((quest.n_keys(), quest.n_pages()), (33, 3));
        // Page 1 took the keys 0..=11, page 2 holds the key of 12s alone.
        assert!(quest.max[4..8].iter().all(|&x| x >= 11.0));
        assert_eq!(
            (&quest.min[8..12], &quest.max[8..12]),
            (&[12.0; 4][..], &[12.0; 4][..])
        );
        // k beyond the rest: every key once.
        let mut out = Selection::default();
        quest.select(0, &[1.0; 4], &mut out).expect("selects");
        assert_eq!(out.ids.len(), 33);
        assert_valid(&out.ids, 33);
        assert!(quest.upkeep(&[1.0; 3], &[]).is_err());
    }

    #[test]
    fn quest_serves_a_rest_smaller_than_a_page_and_a_small_k() {
        let s = Synth::new(cfg(3), 12 + 5, 4, 1, 1);
        let mut quest = Quest::build(&s.prefill()).expect("builds");
        let mut out = Selection::default();
        quest
            .select(0, &[1.0, 0.0, 0.0, 0.0], &mut out)
            .expect("selects");
        // k = 3 < 16: one page, which holds the 5 keys there are.
        assert_eq!(out.ids.len(), 5);
        assert_valid(&out.ids, 5);
        assert_eq!(out.distance_computations, 2);
    }
}
