//! Choosing a far-looking group's training lists by measurement
//! ([`far_check`](super::params::AttentionParams::far_check)).
//!
//! Causal lists tie each key to the queries after it, which suits heads that attend near their
//! position. Some KV groups read from the whole context (Gemma 3 layer 5 at 32K): there one head
//! needs full lists to stay within 1.1× of the full builder's scanned fraction, while a group
//! with the same far-looking profile elsewhere (SmolLM2 layer 16 at 32K) needs causal ones. No
//! statistic of the lists told the two apart (issue 27, pass 5), so for such a group the build
//! makes both graphs and keeps the one that serves held-out recent queries better.
//!
//! The check queries are the group's most recent prefill queries that the thinning left out
//! (so neither graph was built from them), the last ones of each query head: the rows of a
//! pooled group come head-major, each head's rows with rising positions. Each graph is searched
//! at rising `ef` for the exact top-`k` of the keys each query saw (causal: a truth over keys
//! after the query would favour the full lists, which were trained on such keys); the score
//! of a graph is the scanned fraction its worst head needs for recall 0.95, since the target
//! is per head.

use super::params::AttentionParams;
use super::stats::FarCheck;
use super::train_lists::thinned_rows;
use super::AttentionIndex;
use crate::cancel::Cancel;
use crate::error::Result;
use crate::knn::{KnnBackend, KnnOptions, KnnResult};
use crate::scratch::Scratch;
use crate::search::{AnnIndex, SearchOutput, SearchParams};
use crate::store::KeyStore;
use std::sync::Arc;
use std::time::Instant;

/// Positions before the last key among which check queries are taken.
pub(super) const CHECK_RECENT: usize = 512;
/// Check queries per query head, at most.
pub(super) const CHECK_PER_HEAD: usize = 64;
/// Keys each check query asks for.
pub const CHECK_K: usize = 100;

/// The query heads of a pooled group's rows: maximal runs of rows whose visible counts do not
/// fall (as [`check_rows`] splits them, before it drops the heads without check rows).
pub(super) fn head_runs(visible: &[u32]) -> usize {
    (0..visible.len())
        .filter(|&r| r == 0 || visible[r] < visible[r - 1])
        .count()
}

/// The check rows of a pooled group, per query head: rows not kept by the thinning
/// (`thinned_rows(m, per_key, n)`) whose query sees one of the last [`CHECK_RECENT`] keys, the
/// last [`CHECK_PER_HEAD`] of them per head (the nearest to the decode queries). A head is a
/// maximal run of rows whose visible counts do not fall (the sinks' queries see none, the
/// window's all of them). When the thinning left no recent row out (or there is none), the
/// recent rows are taken all the same.
pub(super) fn check_rows(visible: &[u32], per_key: f64, n: usize) -> Vec<Vec<usize>> {
    let m = visible.len();
    let mut kept = vec![false; m];
    if let Some(rows) = thinned_rows(m, per_key, n) {
        for r in rows {
            kept[r] = true;
        }
    }
    let recent_from = n.saturating_sub(CHECK_RECENT);
    let recent_rows = |held_out: bool| {
        let mut heads: Vec<Vec<usize>> = Vec::new();
        for r in 0..m {
            if r == 0 || visible[r] < visible[r - 1] {
                heads.push(Vec::new());
            }
            if visible[r] as usize > recent_from && !(held_out && kept[r]) {
                if let Some(h) = heads.last_mut() {
                    h.push(r);
                }
            }
        }
        heads
    };
    let mut heads = recent_rows(true);
    if heads.iter().all(Vec::is_empty) {
        heads = recent_rows(false);
    }
    heads
        .into_iter()
        .filter(|h| !h.is_empty())
        .map(|h| h[h.len().saturating_sub(CHECK_PER_HEAD)..].to_vec())
        .collect()
}

/// The recall the check asks of each head.
const CHECK_TARGET: f64 = 0.95;
/// Growth of `ef` between the check's sweep steps, and its steps at most.
const EF_STEP: f64 = 1.12;
const MAX_STEPS: usize = 40;

/// The check rows' queries gathered (`rows × dim`) and their exact top-[`CHECK_K`] over the keys
/// each row saw (`visible`; all of them for the decode driver's window rows).
pub(super) struct CheckSet {
    pub picked: Vec<f32>,
    pub exact: KnnResult,
}

impl CheckSet {
    pub(super) fn new(
        index: &AttentionIndex,
        queries: &[f32],
        visible: &[u32],
        heads: &[Vec<usize>],
        knn: &dyn KnnBackend,
        cancel: &Cancel,
    ) -> Result<Self> {
        let d = index.dim();
        let rows: Vec<usize> = heads.iter().flatten().copied().collect();
        let picked: Vec<f32> = rows
            .iter()
            .flat_map(|&r| queries[r * d..(r + 1) * d].iter().copied())
            .collect();
        // The truth is causal: a check query's keys are those its position saw.
        let seen: Vec<u32> = rows.iter().map(|&r| visible[r]).collect();
        let options = KnnOptions {
            visible: Some(seen.into()),
            cancel: cancel.clone(),
            ..KnnOptions::default()
        };
        let k = CHECK_K.min(index.len());
        let exact = knn.topk(&picked, &index.keys, k, &options)?;
        Ok(CheckSet { picked, exact })
    }
}

/// One step of a check sweep for one head: the `ef` asked, the head's scanned fraction and its
/// mean recall@[`CHECK_K`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Step {
    pub ef: usize,
    pub scanned: f64,
    pub recall: f64,
}

/// The check sweep's `ef` values: from `start` up by [`EF_STEP`], [`MAX_STEPS`] of them at
/// most, capped at `n` (rounded, without repeats).
pub(super) fn ladder(start: usize, n: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::with_capacity(MAX_STEPS);
    let mut ef = start as f64;
    for _ in 0..MAX_STEPS {
        let step = (ef.round() as usize).min(n);
        if out.last() != Some(&step) {
            out.push(step);
        }
        if step >= n {
            break;
        }
        ef *= EF_STEP;
    }
    out
}

/// Per head of `heads` (the check rows of `set`, in order): `index` searched at each of `efs`
/// (rising) until `stop` holds for the head's step. A masked search asks for k + (keys past
/// the query) and drops those keys, so a row that saw fewer than all keys runs at an `ef` of at
/// least that; a search result past what the row saw is a miss.
pub(super) fn sweep(
    index: &AttentionIndex,
    set: &CheckSet,
    visible: &[u32],
    heads: &[Vec<usize>],
    efs: &[usize],
    stop: impl Fn(&Step) -> bool,
    cancel: &Cancel,
) -> Result<Vec<Vec<Step>>> {
    let (n, d) = (index.len(), index.dim());
    let k = CHECK_K.min(n);
    let mut scratch = Scratch::new(n);
    let mut found = SearchOutput::default();
    let mut out: Vec<Vec<Step>> = vec![Vec::new(); heads.len()];
    let mut done = vec![false; heads.len()];
    for &step_ef in efs {
        let mut i = 0;
        for (h, head) in heads.iter().enumerate() {
            if done[h] {
                i += head.len();
                continue;
            }
            cancel.check("check sweep")?;
            let (mut recall, mut products) = (0.0, 0u64);
            for &r in head {
                let q = &set.picked[i * d..(i + 1) * d];
                let seen = (visible[r] as usize).min(n);
                let wide = (k + n - seen).min(n);
                let params = SearchParams::with_ef(step_ef.max(wide));
                index.search_into(q, wide, &params, &mut scratch, &mut found)?;
                let truth = set.exact.row(i);
                let want = truth.iter().filter(|&&id| id != KnnResult::PAD).count();
                let kept = found.ids.iter().filter(|&&id| (id as usize) < seen).take(k);
                let hit = kept.filter(|id| truth.contains(id)).count();
                recall += hit as f64 / want.max(1) as f64;
                products += found.stats.distance_computations;
                i += 1;
            }
            let step = Step {
                ef: step_ef,
                scanned: products as f64 / (head.len() * n) as f64,
                recall: recall / head.len() as f64,
            };
            done[h] = stop(&step);
            out[h].push(step);
        }
        if done.iter().all(|&x| x) {
            break;
        }
    }
    Ok(out)
}

/// For each of `indexes`, the scanned fraction its worst head needs for mean recall@[`CHECK_K`]
/// [`CHECK_TARGET`] over the check rows `heads` of `queries` (`dim` columns), against the exact
/// top-k over the `visible` keys of each row ([`sweep`]), the fraction linearly interpolated
/// between the step that reaches the target and the one before it (the measure the per-head
/// target is stated in). A head that never reaches it counts as infinite.
pub(super) fn worst_head_scanned(
    indexes: &[&AttentionIndex],
    queries: &[f32],
    visible: &[u32],
    heads: &[Vec<usize>],
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<Vec<f64>> {
    let Some(first) = indexes.first() else {
        return Ok(Vec::new());
    };
    let set = CheckSet::new(first, queries, visible, heads, knn, cancel)?;
    let mut out = Vec::with_capacity(indexes.len());
    for index in indexes {
        let efs = ladder(CHECK_K.min(index.len()), index.len());
        let reached = |s: &Step| s.recall >= CHECK_TARGET;
        let steps = sweep(index, &set, visible, heads, &efs, reached, cancel)?;
        let worst = steps
            .iter()
            .map(|head| interpolated(head, CHECK_TARGET))
            .fold(0.0, f64::max);
        out.push(worst);
    }
    Ok(out)
}

/// The scanned fraction at which a head's sweep reaches `target`, interpolated between the
/// step that reaches it and the one before (from (0, 0) when the first step does); infinite
/// when no step reaches it.
fn interpolated(steps: &[Step], target: f64) -> f64 {
    let Some(at) = steps.iter().position(|s| s.recall >= target) else {
        return f64::INFINITY;
    };
    let (s0, r0) = match at {
        0 => (0.0, 0.0),
        _ => (steps[at - 1].scanned, steps[at - 1].recall),
    };
    let s = steps[at];
    s0 + (s.scanned - s0) * (target - r0) / (s.recall - r0)
}

/// The far check of a far-looking group ([`AttentionParams::far_check`]): also builds the
/// graph of full lists from the same queries (`far_share` of whose lists were unmasked) with
/// `build_full` (the builder's one-pass build, handed in: the check does not call the builder), scores
/// both on the held-out recent rows, and leaves in `index` the one whose worst head needs fewer
/// keys, with the figures in its [`FarCheck`].
pub(super) fn keep_better_lists(
    index: &mut AttentionIndex,
    far_share: f64,
    train_queries: &[f32],
    visible: &[u32],
    knn: &dyn KnnBackend,
    cancel: &Cancel,
    build_full: impl FnOnce(Arc<KeyStore>, &AttentionParams) -> Result<AttentionIndex>,
) -> Result<()> {
    let t = Instant::now();
    let params = index.params.clone();
    let full_params = AttentionParams {
        causal: false,
        global_full: None,
        far_check: None,
        auto_ef: None,
        scan_check: false,
        ..params.clone()
    };
    let keys = index.keys.clone();
    let heads = check_rows(visible, params.queries_per_key, keys.len());
    let mut full = build_full(keys, &full_params)?;
    let scanned = worst_head_scanned(&[index, &full], train_queries, visible, &heads, knn, cancel)?;
    let (causal_scanned, full_scanned) = (scanned[0], scanned[1]);
    // Ties (neither reaches the target) keep the causal lists asked for.
    let kept_full = full_scanned < causal_scanned;
    if kept_full {
        // The index keeps the parameters it was asked for; its stats say which lists it holds.
        full.params = params;
        std::mem::swap(index, &mut full);
    }
    index.stats.far_check = Some(FarCheck {
        far_share,
        queries: heads.iter().map(Vec::len).sum(),
        heads: heads.len(),
        causal_scanned,
        full_scanned,
        kept_full,
        seconds: t.elapsed().as_secs_f64(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_rows, CHECK_PER_HEAD, CHECK_RECENT};

    /// Two heads of `p` positions pooled head-major against `p` keys.
    fn pooled(p: usize) -> Vec<u32> {
        (0..2).flat_map(|_| 1..=p as u32).collect()
    }

    #[test]
    fn check_rows_are_recent_held_out_rows_per_head() {
        let p = 4 * CHECK_RECENT;
        let visible = pooled(p);
        // Thinned to 0.5 · p of 2p rows: every 4th row is kept.
        let heads = check_rows(&visible, 0.5, p);
        assert_eq!(heads.len(), 2);
        for (h, rows) in heads.iter().enumerate() {
            assert_eq!(rows.len(), CHECK_PER_HEAD);
            for &r in rows {
                assert_eq!(r / p, h, "row {r} belongs to head {h}");
                assert!(r % 4 != 0, "row {r} is a training row");
                assert!(
                    visible[r] as usize > p - CHECK_RECENT,
                    "row {r} is not recent"
                );
            }
            assert!(rows.windows(2).all(|w| w[0] < w[1]));
        }
        // Unthinned: the recent rows are taken all the same.
        let heads = check_rows(&visible, 0.0, p);
        assert_eq!(heads.len(), 2);
        assert!(heads.iter().all(|h| h.len() == CHECK_PER_HEAD));
        // A short context: fewer recent rows than the cap, all of them.
        let short = pooled(10);
        let heads = check_rows(&short, 0.0, 10);
        assert_eq!(heads, vec![(0..10).collect::<Vec<_>>(), (10..20).collect()]);
        assert!(check_rows(&[], 1.0, 10).is_empty());
        // The decode driver's counts: 0 for the sinks' queries, all keys for the window's.
        let (sink, window, n) = (4usize, 600, 2000);
        let one: Vec<u32> = (0..sink + n + window)
            .map(|t| (t + 1).saturating_sub(sink).min(n) as u32)
            .collect();
        let visible = one.repeat(3);
        let heads = check_rows(&visible, 0.0, n);
        assert_eq!(heads.len(), 3);
        for (h, rows) in heads.iter().enumerate() {
            assert_eq!(rows.len(), CHECK_PER_HEAD);
            assert!(rows.iter().all(|&r| r / one.len() == h));
        }
    }
}
