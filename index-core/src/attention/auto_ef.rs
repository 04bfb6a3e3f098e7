//! The search list size measured at build ([`auto_ef`](super::params::AttentionParams::auto_ef)).
//!
//! A fixed `ef` serves a graph of 8K keys and one of 32K keys unequally: the beam needs more
//! room as the graph grows (at 32K keys of Gemma 3, `ef` 128 loses keys of the exact top-100
//! that a needle's last digit needs, where 256 finds them; docs/bench/tasks). The build
//! therefore measures, on the check rows of the far check (held-out recent prefill queries per
//! query head, [`super::far_check::check_rows`]), the `ef` at which every head's mean
//! recall@100 against the exact top-100 of the keys it saw reaches the target, and makes that
//! the index's `default_ef` (never below the `default_ef` given); and, per query head, the `ef`
//! that head needed, which searches naming their head take ([`crate::SearchParams::head`]): the
//! heads of a group differ (issue 44: decode scored twice the keys the offline bench needs
//! when every head searched at its group's worst head's `ef`).

use super::far_check::{check_rows, head_runs, ladder, sweep, CheckSet, Step, CHECK_K};
use super::stats::AutoEf;
use super::AttentionIndex;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::knn::KnnBackend;
use crate::search::AnnIndex;
use std::time::Instant;

/// Measures the `ef` the check rows of `queries` need for mean recall@[`CHECK_K`] `target` on
/// every head and raises `index`'s `default_ef` to it. Without `visible` every query is taken
/// to see every key (the check rows are then the last training queries).
pub(super) fn calibrate(
    index: &mut AttentionIndex,
    queries: &[f32],
    visible: Option<&[u32]>,
    target: f64,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<AutoEf> {
    let t = Instant::now();
    let n = index.len();
    let rows = queries.len() / index.dim().max(1);
    let all;
    let visible = match visible {
        // The build reads the counts only for causal lists: check them here too.
        Some(v) if v.len() != rows => {
            return Err(Error::DimensionMismatch {
                what: "visible key counts (one per training query)",
                expected: rows,
                got: v.len(),
            })
        }
        Some(v) => v,
        None => {
            all = vec![n as u32; rows];
            &all
        }
    };
    let heads = check_rows(visible, index.params.queries_per_key, n);
    let ef_before = index.params.default_ef;
    // Searches raise a smaller ef to k; the sweep's steps start there.
    let floor = ef_before.clamp(CHECK_K.min(n), n.max(1));
    let mut out = AutoEf {
        target,
        queries: heads.iter().map(Vec::len).sum(),
        heads: heads.len(),
        ef_before,
        ef_after: ef_before,
        reached: true,
        ..AutoEf::default()
    };
    if out.queries == 0 {
        out.seconds = t.elapsed().as_secs_f64();
        return Ok(out);
    }
    let set = CheckSet::new(index, queries, visible, &heads, knn, cancel)?;
    // Swept up from the given default (never lowered), so its recall is the first step's.
    let efs = ladder(floor, n);
    let stop = |s: &Step| s.recall >= target;
    let steps = sweep(index, &set, visible, &heads, &efs, stop, cancel)?;
    let head_needed: Vec<usize> = steps
        .iter()
        .map(|head| match head.iter().find(|s| s.recall >= target) {
            Some(s) => s.ef,
            None => head.last().map_or(0, |s| s.ef),
        })
        .collect();
    out.reached = steps
        .iter()
        .all(|head| head.iter().any(|s| s.recall >= target));
    let needed = head_needed.iter().copied().max().unwrap_or(0);
    let ef_after = floor.max(needed);
    if heads.len() > 1 && heads.len() == head_runs(visible) {
        out.head_ef = head_needed.iter().map(|&e| floor.max(e)).collect();
    }
    // The worst head's recall at an ef: that of its last step at or below it.
    let worst_at = |ef: usize| {
        steps
            .iter()
            .filter_map(|head| head.iter().rev().find(|s| s.ef <= ef).map(|s| s.recall))
            .fold(f64::INFINITY, f64::min)
    };
    out.needed = needed;
    out.ef_after = ef_after;
    out.recall_before = worst_at(floor);
    out.recall_after = worst_at(ef_after);
    index.params.default_ef = ef_after;
    index.params.head_ef.clone_from(&out.head_ef);
    out.seconds = t.elapsed().as_secs_f64();
    Ok(out)
}
