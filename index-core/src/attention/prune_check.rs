//! Choosing the pruning rule by measurement
//! ([`prune_check`](super::params::AttentionParams::prune_check), issue 50).
//!
//! With bracketing sweeps the two rules trade places across the real sets: `top` needs 15 % to
//! 50 % fewer keys than `occlusion-fill` for recall@100 0.95 on Gemma 3 heads at 16K and 32K
//! keys, while on SmolLM2 at 8K they tie at 0.95 and `occlusion-fill` needs 3 % fewer at 0.99
//! and decodes with higher recall (docs/bench/brackets). No single rule is best, so a build
//! can make both graphs from the same training lists (the kNN, the costly phase, runs once) and
//! keep the one whose worst query head needs fewer keys on held-out recent prefill queries: the
//! same check rows and measure as the far check ([`super::far_check`]).
//!
//! Measured on the decode default's builds (docs/bench/brackets/README.md §3b) the check does
//! not beat one rule: its held-out prefill queries prefer `top` on 10 of SmolLM2's 15 KV groups
//! where decode queries need 13 % more keys with `top`. It is off by default.

use super::far_check::{check_rows, worst_head_scanned};
use super::stats::PruneCheck;
use super::AttentionIndex;
use crate::cancel::Cancel;
use crate::error::Result;
use crate::knn::KnnBackend;
use crate::search::AnnIndex;
use std::time::Instant;

/// Of two graphs built from the same lists, `asked` (pruned by the params' rule) and `other`
/// (by `prune_check`, whose params name the asked rule as their `prune_check`), the one whose
/// worst head needs fewer keys on the check rows of `queries`; ties keep `asked`. The kept
/// index's params say its rule; `started` is when the second graph began.
pub(super) fn keep_better_rule(
    asked: AttentionIndex,
    other: AttentionIndex,
    started: Instant,
    queries: &[f32],
    visible: Option<&[u32]>,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<AttentionIndex> {
    let n = asked.len();
    let rows = queries.len() / asked.dim().max(1);
    // Without counts every row saw every key (the check rows are then the last queries).
    let all;
    let visible = match visible {
        Some(v) => v,
        None => {
            all = vec![n as u32; rows];
            &all
        }
    };
    let heads = check_rows(visible, asked.params.queries_per_key, n);
    let mut check = PruneCheck {
        asked: asked.params.prune,
        other: other.params.prune,
        queries: heads.iter().map(Vec::len).sum(),
        heads: heads.len(),
        asked_scanned: f64::INFINITY,
        other_scanned: f64::INFINITY,
        kept_other: false,
        seconds: 0.0,
    };
    if check.queries > 0 {
        let scanned = worst_head_scanned(&[&asked, &other], queries, visible, &heads, knn, cancel)?;
        (check.asked_scanned, check.other_scanned) = (scanned[0], scanned[1]);
        check.kept_other = check.other_scanned < check.asked_scanned;
    }
    check.seconds = started.elapsed().as_secs_f64();
    let mut kept = if check.kept_other { other } else { asked };
    kept.stats.prune_check = Some(check);
    Ok(kept)
}
