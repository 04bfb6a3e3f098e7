//! `snapkv`: SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before
//! Generation").
//!
//! **The paper.** At the end of the prefill, the queries of the last `window_size` prompt
//! positions (the observation window) vote for the prompt keys before the window: per query
//! head, the softmax attention weights of the window's queries (scale `1/√d`, causal) are
//! summed over the window, smoothed by a 1-D pooling along the positions, and the top keys are
//! kept (with the window's own keys); the rest of the prompt cache is evicted. Decoding
//! attends the kept keys and every generated token, and never evicts again.
//!
//! **Here.** The knobs are the defaults of the reference implementation
//! (github.com/FasterDecoding/SnapKV, `snapkv/monkeypatch/snapkv_utils.py`, `init_snapkv`):
//! `window_size` = [`WINDOW_SIZE`] = 32, `kernel_size` = [`KERNEL_SIZE`] = 5,
//! `pooling = 'avgpool'` ([`F.avg_pool1d`](https://pytorch.org/docs/stable/generated/torch.nn.functional.avg_pool1d.html)
//! with padding `kernel_size // 2`, stride 1 and zero padding counted: the window sum / 5),
//! pooled over the keys before the observation window as there. The paper's `max_capacity_prompt`
//! is our static part + `k`: per query head of the group (each its own set, as in SnapKV's
//! per-head selection) the `k` rest keys of the highest pooled votes are kept (rest ids
//! `0..`; our sinks and recent window are the static part the step attends). A rest key
//! inside the observation window (only when `window` < 32) is kept first, as SnapKV keeps the
//! window. Keys that leave our window during decode are kept too: their rest ids join every
//! query head's set (SnapKV keeps every generated token), so a head attends `k` + the decode
//! keys that left the window.
//!
//! **Cost.** Each selection returns its fixed set: 0 inner products per step. The one-time
//! vote is `group · Σ_t (t + 1)` inner products (the window's causal rows), reported once in
//! [`RetrievalStats::build_distance_computations`] by the first [`Selector::fold_stats`].
//!
//! **Deviation.** The observation window ends at the last prefill position (our prefill is
//! the whole prompt). SnapKV selects per attention head of the KV cache after `repeat_kv`; the
//! GQA group shares our KV head, so each query head keeps a set of its own over it.

use super::{check_key, HeadPrefill, Selection, Selector, TopN};
use crate::retrieval::stats::RetrievalStats;
use qkindex_model::{simd, ModelError};

/// Prompt positions whose queries vote (SnapKV's `window_size`, reference default).
pub const WINDOW_SIZE: usize = 32;

/// Width of the average pooling of the votes (SnapKV's `kernel_size`, reference default).
pub const KERNEL_SIZE: usize = 5;

/// One fixed key set per query head of the group.
#[derive(Debug)]
pub struct SnapKv {
    /// Per query head: the kept rest ids, best first, then the decode keys in order.
    sets: Vec<Vec<u32>>,
    /// Keys under the selector.
    n: usize,
    hd: usize,
    /// Inner products of the vote, not yet reported.
    build_inner_products: u64,
}

impl SnapKv {
    pub fn build(prefill: &HeadPrefill<'_>) -> Result<Self, ModelError> {
        let (hd, split) = (prefill.head_dim, prefill.split);
        if hd == 0 {
            return Err(qkindex::Error::invalid_param("head_dim", 0, "must be at least 1").into());
        }
        let n = split.n;
        let obs = n.saturating_sub(WINDOW_SIZE)..n;
        let prefix = obs.start;
        let scale = 1.0 / (hd as f32).sqrt();
        let keys = prefill.keys;
        let rest = split.rest();
        let mut top = TopN::default();
        let mut sets = Vec::with_capacity(prefill.group);
        let mut inner = 0u64;
        let (mut votes, mut row) = (vec![0f64; n], Vec::with_capacity(n));
        for j in 0..prefill.group {
            votes.fill(0.0);
            for t in obs.clone() {
                let q = prefill.query(j, t)?;
                row.clear();
                row.extend((0..=t).map(|p| scale * simd::dot(q, &keys[p * hd..(p + 1) * hd])));
                inner += row.len() as u64;
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut z = 0f64;
                for s in row.iter_mut() {
                    *s = (*s - max).exp();
                    z += *s as f64;
                }
                for (v, &w) in votes.iter_mut().zip(&row) {
                    *v += w as f64 / z;
                }
            }
            let scores: Vec<f32> = rest
                .clone()
                .map(|p| match p < prefix {
                    true => avg_pool(&votes[..prefix], p) as f32,
                    false => f32::INFINITY,
                })
                .collect();
            let mut ids = Vec::new();
            top.ids_of(&scores, prefill.cfg.k, &mut ids);
            sets.push(ids);
        }
        Ok(SnapKv {
            sets,
            n: split.rest_len(),
            hd,
            build_inner_products: inner,
        })
    }
}

/// `F.avg_pool1d(x, KERNEL_SIZE, stride=1, padding=KERNEL_SIZE // 2)` at `i`: the window's sum
/// over `KERNEL_SIZE` (padding zeros count).
fn avg_pool(x: &[f64], i: usize) -> f64 {
    let half = KERNEL_SIZE / 2;
    let lo = i.saturating_sub(half);
    let hi = (i + half + 1).min(x.len());
    x[lo..hi].iter().sum::<f64>() / KERNEL_SIZE as f64
}

impl Selector for SnapKv {
    fn n_keys(&self) -> usize {
        self.n
    }

    fn upkeep(&mut self, key: &[f32], _guide: &[f32]) -> Result<(), ModelError> {
        check_key(key, self.hd)?;
        let id = u32::try_from(self.n)
            .map_err(|_| qkindex::Error::invalid_param("rest", self.n, "beyond u32 ids"))?;
        for set in &mut self.sets {
            set.push(id);
        }
        self.n += 1;
        Ok(())
    }

    fn select(&mut self, j: usize, _query: &[f32], out: &mut Selection) -> Result<(), ModelError> {
        let set = self
            .sets
            .get(j)
            .ok_or_else(|| qkindex::Error::invalid_param("query head", j, "not in the group"))?;
        out.fill(set, 0);
        Ok(())
    }

    fn fold_stats(&mut self, stats: &mut RetrievalStats) {
        stats.build_distance_computations += std::mem::take(&mut self.build_inner_products);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retrieval::ids::RestId;
    use crate::retrieval::policy::{PolicyConfig, PolicyKind};
    use crate::retrieval::selector::testing::{assert_valid, small_cfg, Synth};

    fn cfg(k: usize, window: usize) -> PolicyConfig {
        small_cfg(PolicyKind::Snapkv, k, window)
    }

    #[test]
    fn snapkv_keeps_what_the_last_queries_attend_and_the_keys_upkeep_adds() {
        let (hd, window) = (8, 40);
        let n = 4 + 200 + window;
        let mut s = Synth::new(cfg(10, window), n, hd, 2, 23);
        // Head 1's observation window attends rest id 123 strongly; head 0's does not care.
        let q: Vec<f32> = (0..hd).map(|i| if i < 4 { 1.0 } else { -1.0 }).collect();
        for (x, &qi) in s.key_mut(4 + 123).iter_mut().zip(&q) {
            *x = 3.0 * qi;
        }
        for t in n - WINDOW_SIZE..n {
            s.query_mut(1, t).copy_from_slice(&q);
        }
        let mut sel = SnapKv::build(&s.prefill()).expect("builds");
        assert_eq!(sel.n_keys(), 200);
        let mut out = Selection::default();
        sel.select(1, &[0.0; 8], &mut out).expect("selects");
        assert_eq!(out.ids.len(), 10);
        // The pooling spreads the vote for 123 over its kernel: 121..=125 lead.
        let mut lead: Vec<u32> = out.ids[..5].iter().map(|id| id.0).collect();
        lead.sort_unstable();
        assert_eq!(lead, [121, 122, 123, 124, 125]);
        assert_eq!(out.distance_computations, 0);
        assert_valid(&out.ids, 200);
        sel.select(0, &[0.0; 8], &mut out).expect("selects");
        assert_eq!(out.ids.len(), 10);
        // Keys leaving the window are kept by every head.
        sel.upkeep(&[0.0; 8], &[]).expect("upkeep");
        sel.upkeep(&[0.0; 8], &[]).expect("upkeep");
        for j in 0..2 {
            sel.select(j, &q, &mut out).expect("selects");
            assert_eq!(out.ids.len(), 12);
            assert_eq!(&out.ids[10..], &[RestId(200), RestId(201)]);
            assert_valid(&out.ids, sel.n_keys());
        }
        // The vote: 2 heads × the causal rows of the last 32 positions, reported once.
        let rows: u64 = (n - WINDOW_SIZE + 1..=n).map(|r| r as u64).sum();
        let mut stats = RetrievalStats::default();
        sel.fold_stats(&mut stats);
        sel.fold_stats(&mut stats);
        assert_eq!(stats.build_distance_computations, 2 * rows);
        assert!(sel.select(2, &q, &mut out).is_err());
        assert!(sel.upkeep(&[0.0; 3], &[]).is_err());
    }

    #[test]
    fn snapkv_pools_like_avg_pool1d() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(avg_pool(&x, 0), 6.0 / 5.0);
        assert_eq!(avg_pool(&x, 2), 15.0 / 5.0);
        assert_eq!(avg_pool(&x, 5), 15.0 / 5.0);
    }

    #[test]
    fn snapkv_serves_a_short_prefill_a_small_window_and_a_large_k() {
        // 10 positions: the observation window covers them all, the rest (ids 0..4) is in it
        // and kept whole.
        let s = Synth::new(cfg(1000, 2), 4 + 4 + 2, 4, 1, 29);
        let mut sel = SnapKv::build(&s.prefill()).expect("builds");
        let mut out = Selection::default();
        sel.select(0, &[1.0; 4], &mut out).expect("selects");
        assert_eq!(out.ids.len(), 4);
        assert_valid(&out.ids, 4);
    }
}
