//! `infllm`: InfLLM (Xiao et al. 2024, "InfLLM: Unveiling the Intrinsic Capacity of LLMs for
//! Understanding Extremely Long Sequences with Training-Free Memory").
//!
//! **The paper.** Tokens evicted from the local window (of `l_L` tokens) go to a context
//! memory of blocks (memory units) of 128 consecutive tokens. Each block is represented by
//! its `r_k = 4` representative tokens: those with the highest representative score
//! `r_m = (1/l_L) Σ_{j=1..l_L} q_{m+j} · k_m`, the attention the key receives from the
//! queries that follow it within the local window. A block's relevance to the current
//! queries is `Σ_i Σ_{r ∈ reps} q_i · k_r`; the top blocks are attended together with the
//! initial tokens and the local window. Tokens join memory in whole blocks.
//!
//! **Here.** The blocks cut the rest (rest ids `0..`; our sinks and recent window are the
//! static part): [`BLOCK_SIZE`] keys per block, [`REPR_TOPK`] representatives each, picked by
//! `r_m` over the next `l_L` = the policy's `window` positions (our recent window is InfLLM's
//! local window), the queries summed over the GQA group's query heads (the group shares the
//! KV head's blocks). Prefill keys are scored with the prefill queries; every rest key has a
//! full window of them. A key that leaves the window during decode is scored the same way
//! with the decode queries the selector has seen (it keeps the group's summed query of the
//! last `window` positions): when it leaves, the query of the position that evicts it is not
//! yet known, so it is scored over the `window − 1` queries before that one.
//!
//! Keys not yet in a full block (the rest's last `len % 128` keys at the prefill, then the
//! keys leaving the window until 128 are pending) are always attended: in InfLLM, tokens
//! enter memory a block at a time, so these are still part of its local context. When the
//! pending block fills, its representatives are picked and it joins the blocks.
//!
//! **Budget.** `k` maps to `round(k / 128)` blocks, at least 1 (k = 100 → 1 block, 128 keys;
//! k = 1000 → 8 blocks, 1024 keys), plus the pending keys (under 128).
//!
//! **Cost.** A selection scores every representative: `4 · blocks` inner products. The
//! representative scores are build/upkeep work and are not counted in the selections.
//!
//! **Knobs.** [`BLOCK_SIZE`] and [`REPR_TOPK`] are the reference configuration's
//! (github.com/thunlp/InfLLM, `config/mistral-inf-llm.yaml`: `block_size: 128`,
//! `repr_topk: 4`; there also `n_init: 128`, `n_local: 4096`, `topk: 16` blocks, which are our
//! `sink`, `window` and `k / 128`).
//!
//! **Deviations.** The reference code (`inf_llm/attention/context_manager.py`) scores
//! representatives with the softmax weights its local attention gives each key (summed over
//! the queries that saw it) and ranks blocks by `q · mean(reps)` averaged over the heads of a
//! unit, so a unit's heads share one block selection; we use the paper's inner-product `r_m`,
//! rank by `Σ q · r` (the same order as the mean) and select per query head, as every selector
//! here does. No offloading (everything stays in memory).

use std::collections::VecDeque;

use super::{check_key, HeadPrefill, Selection, Selector, TopN};
use crate::retrieval::ids::RestId;
use qkindex_model::{simd, ModelError};

/// Keys per memory block (InfLLM's block size).
pub const BLOCK_SIZE: usize = 128;

/// Representative keys per block (InfLLM's `r_k`).
pub const REPR_TOPK: usize = 4;

/// InfLLM's context memory over one KV head's rest.
#[derive(Debug)]
pub struct InfLlm {
    hd: usize,
    group: usize,
    /// Blocks attended per selection.
    blocks: usize,
    /// Position of rest id 0.
    sink: usize,
    /// InfLLM's `l_L`: queries that score a key (the ones after it).
    local: usize,
    /// Keys under the selector: full blocks, then the pending ones.
    n: usize,
    /// Per full block, its representatives (`REPR_TOPK × hd`).
    reprs: Vec<f32>,
    /// The pending block: its keys and their representative scores.
    pending_keys: Vec<f32>,
    pending_scores: Vec<f32>,
    /// The group's summed query of the last positions (at most `local`), the newest last,
    /// and the positions seen (the newest is `seen − 1`).
    recent: VecDeque<Vec<f32>>,
    seen: usize,
    /// This step's summed query so far, and the query heads in it.
    step_sum: Vec<f32>,
    step_heads: usize,
    relevance: Vec<f32>,
    top: TopN,
    chosen: Vec<u32>,
}

impl InfLlm {
    pub fn build(prefill: &HeadPrefill<'_>) -> Result<Self, ModelError> {
        let (hd, split) = (prefill.head_dim, prefill.split);
        if hd == 0 || prefill.group == 0 {
            return Err(
                qkindex::Error::invalid_param("head_dim", hd, "and group must be ≥ 1").into(),
            );
        }
        let local = prefill.cfg.window.max(1);
        // The group's summed prefill query per position.
        let summed = |t: usize| -> Result<Vec<f32>, ModelError> {
            let mut s = vec![0f32; hd];
            for j in 0..prefill.group {
                for (a, &x) in s.iter_mut().zip(prefill.query(j, t)?) {
                    *a += x;
                }
            }
            Ok(s)
        };
        let mut sel = InfLlm {
            hd,
            group: prefill.group,
            blocks: ((prefill.cfg.k + BLOCK_SIZE / 2) / BLOCK_SIZE).max(1),
            sink: split.sink,
            local,
            n: 0,
            reprs: Vec::new(),
            pending_keys: Vec::with_capacity(BLOCK_SIZE * hd),
            pending_scores: Vec::with_capacity(BLOCK_SIZE),
            recent: VecDeque::with_capacity(local + 1),
            seen: split.n,
            step_sum: vec![0.0; hd],
            step_heads: 0,
            relevance: Vec::new(),
            top: TopN::default(),
            chosen: Vec::new(),
        };
        // r_m of each rest key at position m: k_m · W_m / |W_m|, W_m the sum of the summed
        // queries at m+1..=m+local (within the prefill), kept as a sliding sum (f64).
        let mut w = vec![0f64; hd];
        let mut count = 0usize;
        let (first, n) = (split.sink, split.n);
        for t in (first + 1)..(first + 1 + local).min(n) {
            add(&mut w, &summed(t)?, 1.0);
            count += 1;
        }
        let mut wf = vec![0f32; hd];
        for (r, key) in prefill.rest_keys().chunks_exact(hd).enumerate() {
            let m = first + r;
            if r > 0 {
                // Slide from m − 1: drop m, take m + local.
                add(&mut w, &summed(m)?, -1.0);
                count -= 1;
                if m + local < n {
                    add(&mut w, &summed(m + local)?, 1.0);
                    count += 1;
                }
            }
            for (f, &x) in wf.iter_mut().zip(&w) {
                *f = x as f32;
            }
            let score = if count > 0 {
                simd::dot(key, &wf) / count as f32
            } else {
                0.0
            };
            sel.push(key, score);
        }
        for t in n.saturating_sub(local)..n {
            sel.recent.push_back(summed(t)?);
        }
        Ok(sel)
    }

    fn n_blocks(&self) -> usize {
        self.reprs.len() / (REPR_TOPK * self.hd)
    }

    /// Adds `key` with representative score `score` to the pending block; a full pending
    /// block gets its representatives and joins the blocks.
    fn push(&mut self, key: &[f32], score: f32) {
        self.pending_keys.extend_from_slice(key);
        self.pending_scores.push(score);
        self.n += 1;
        if self.pending_scores.len() == BLOCK_SIZE {
            self.top
                .ids_of(&self.pending_scores, REPR_TOPK, &mut self.chosen);
            for &i in &self.chosen {
                let at = i as usize * self.hd;
                self.reprs
                    .extend_from_slice(&self.pending_keys[at..at + self.hd]);
            }
            self.pending_keys.clear();
            self.pending_scores.clear();
        }
    }

    /// The representative score of the key at position `p` from the summed queries seen at
    /// `p + 1..=p + local`.
    fn decode_score(&self, p: usize, key: &[f32]) -> f32 {
        let front = self.seen - self.recent.len();
        let (mut sum, mut count) = (0f32, 0usize);
        for (i, q) in self.recent.iter().enumerate() {
            let t = front + i;
            if t > p && t <= p + self.local {
                sum += simd::dot(q, key);
                count += 1;
            }
        }
        if count > 0 {
            sum / count as f32
        } else {
            0.0
        }
    }

    /// Adds query head `j`'s query to this step's summed query; the last head of the group
    /// closes the step's position.
    fn observe(&mut self, j: usize, query: &[f32]) {
        if j == 0 {
            self.step_sum.fill(0.0);
            self.step_heads = 0;
        }
        for (a, &x) in self.step_sum.iter_mut().zip(query) {
            *a += x;
        }
        self.step_heads += 1;
        if self.step_heads == self.group {
            self.recent.push_back(self.step_sum.clone());
            if self.recent.len() > self.local {
                self.recent.pop_front();
            }
            self.seen += 1;
        }
    }
}

/// `acc += sign · x`, in f64.
fn add(acc: &mut [f64], x: &[f32], sign: f64) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += sign * v as f64;
    }
}

impl Selector for InfLlm {
    fn n_keys(&self) -> usize {
        self.n
    }

    fn upkeep(&mut self, key: &[f32], _guide: &[f32]) -> Result<(), ModelError> {
        check_key(key, self.hd)?;
        let score = self.decode_score(self.sink + self.n, key);
        self.push(key, score);
        Ok(())
    }

    fn select(&mut self, j: usize, query: &[f32], out: &mut Selection) -> Result<(), ModelError> {
        if query.len() != self.hd || j >= self.group {
            return Err(
                qkindex::Error::invalid_param("query", j, "not a query of the group").into(),
            );
        }
        self.observe(j, query);
        out.clear();
        let n_blocks = self.n_blocks();
        let mut relevance = std::mem::take(&mut self.relevance);
        relevance.clear();
        relevance.extend(self.reprs.chunks_exact(REPR_TOPK * self.hd).map(|reps| {
            reps.chunks_exact(self.hd)
                .map(|r| simd::dot(query, r))
                .sum::<f32>()
        }));
        self.top.ids_of(&relevance, self.blocks, &mut self.chosen);
        self.relevance = relevance;
        for &b in &self.chosen {
            let first = b as usize * BLOCK_SIZE;
            out.ids
                .extend((first..first + BLOCK_SIZE).map(|id| RestId(id as u32)));
        }
        let full = n_blocks * BLOCK_SIZE;
        out.ids.extend((full..self.n).map(|id| RestId(id as u32)));
        out.distance_computations = (REPR_TOPK * n_blocks) as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retrieval::policy::{PolicyConfig, PolicyKind};
    use crate::retrieval::selector::testing::{assert_valid, small_cfg, Synth};

    fn cfg(k: usize, window: usize) -> PolicyConfig {
        small_cfg(PolicyKind::Infllm, k, window)
    }

    #[test]
    fn infllm_picks_the_keys_the_next_queries_attend_as_representatives() {
        // One block of rest (ids 0..128) and 10 pending keys; window 8.
        let (hd, window) = (8, 8);
        let n = 4 + 138 + window;
        let mut s = Synth::new(cfg(100, window), n, hd, 2, 11);
        for v in s.keys.iter_mut() {
            *v *= 0.01;
        }
        // Rest ids 5, 40, 77 and 100: keys along e0 that the next queries (both heads)
        // attend, in rising strength.
        for (r, scale) in [(5usize, 1.0f32), (40, 2.0), (77, 3.0), (100, 4.0)] {
            let p = 4 + r;
            s.key_mut(p).fill(0.0);
            s.key_mut(p)[0] = scale;
            for t in p + 1..=p + window {
                for j in 0..2 {
                    s.query_mut(j, t)[0] = 5.0;
                }
            }
        }
        let mut sel = InfLlm::build(&s.prefill()).expect("builds");
        assert_eq!((sel.n_keys(), sel.n_blocks()), (138, 1));
        assert_eq!(sel.pending_scores.len(), 10);
        let mut reprs: Vec<f32> = sel.reprs.chunks_exact(hd).map(|r| r[0]).collect();
        reprs.sort_by(f32::total_cmp);
        assert_eq!(reprs, [1.0, 2.0, 3.0, 4.0]);
        // 1 block + the 10 pending keys; 4 representatives scored.
        let mut out = Selection::default();
        sel.select(0, &[1.0; 8], &mut out).expect("selects");
        assert_eq!(out.ids.len(), 138);
        assert_valid(&out.ids, 138);
        assert_eq!(out.distance_computations, 4);
    }

    #[test]
    fn infllm_selects_the_block_holding_a_planted_key() {
        let (hd, window) = (8, 16);
        let n = 4 + 5 * BLOCK_SIZE + window;
        let mut s = Synth::new(cfg(200, window), n, hd, 2, 13);
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 - 3.5) / 4.0).collect();
        // Rest id 3·128 + 50 matches q and is attended by the queries after it.
        let p = 4 + 3 * BLOCK_SIZE + 50;
        for (x, &qi) in s.key_mut(p).iter_mut().zip(&q) {
            *x = 10.0 * qi;
        }
        for t in p + 1..=p + window {
            for j in 0..2 {
                s.query_mut(j, t).copy_from_slice(&q);
            }
        }
        let mut sel = InfLlm::build(&s.prefill()).expect("builds");
        let mut out = Selection::default();
        sel.select(0, &q, &mut out).expect("selects");
        // round(200/128) = 2 blocks, the planted one first; no pending keys.
        assert_eq!(out.ids.len(), 2 * BLOCK_SIZE);
        assert_eq!(out.ids[0], RestId(3 * BLOCK_SIZE as u32));
        assert_valid(&out.ids, sel.n_keys());
        assert_eq!(out.distance_computations, 5 * 4);
    }

    #[test]
    fn infllm_decode_keys_wait_pending_then_form_a_block() {
        let (hd, window) = (4, 4);
        let s = Synth::new(cfg(1, window), 4 + 130 + window, hd, 2, 17);
        let mut sel = InfLlm::build(&s.prefill()).expect("builds");
        assert_eq!((sel.n_blocks(), sel.pending_scores.len()), (1, 2));
        let mut out = Selection::default();
        for i in 0..126 {
            // The step's queries, then a key leaving the window (the order of step.rs is
            // upkeep then select; either order keeps the bookkeeping).
            sel.select(0, &[1.0; 4], &mut out).expect("selects");
            sel.select(1, &[0.5; 4], &mut out).expect("selects");
            assert_eq!(out.ids.len(), BLOCK_SIZE + 2 + i, "step {i}");
            assert_valid(&out.ids, sel.n_keys());
            sel.upkeep(&[i as f32; 4], &[]).expect("upkeep");
        }
        // The pending block filled: 2 blocks, none pending, one attended (k = 1).
        assert_eq!((sel.n_keys(), sel.n_blocks()), (256, 2));
        sel.select(0, &[1.0; 4], &mut out).expect("selects");
        assert_eq!(out.ids.len(), BLOCK_SIZE);
        assert_eq!(out.distance_computations, 8);
        // Its representatives are the keys of the largest scores: the largest keys here
        // (every query is positive).
        let last: Vec<f32> = sel.reprs[4 * hd..].chunks_exact(hd).map(|r| r[0]).collect();
        assert_eq!(last, [125.0, 124.0, 123.0, 122.0]);
        assert!(sel.upkeep(&[1.0; 3], &[]).is_err());
        assert!(sel.select(2, &[1.0; 4], &mut out).is_err());
    }

    #[test]
    fn infllm_serves_a_rest_smaller_than_a_block_and_a_large_k() {
        let s = Synth::new(cfg(100_000, 8), 4 + 20 + 8, 4, 1, 19);
        let mut sel = InfLlm::build(&s.prefill()).expect("builds");
        let mut out = Selection::default();
        sel.select(0, &[1.0; 4], &mut out).expect("selects");
        assert_eq!(out.ids.len(), 20);
        assert_valid(&out.ids, 20);
        assert_eq!(out.distance_computations, 0);
    }
}
