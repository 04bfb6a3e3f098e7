//! The structure measured at build ([`scan_check`](crate::attention::AttentionParams::scan_check)):
//! the graph, or a scan of the keys' int8 codes with an exact re-rank (`flat:codes=i8`).
//!
//! Where a graph search scores a large share of the keys (Qwen2.5's 128-dimensional heads at
//! 8K: 13.7 % for recall 0.95) a scan of one byte per dimension reads the keys in order, and
//! is faster than the walk's scattered rows; where the graph scores 1–3 % (Gemma 3 at 128K) it
//! is not close. The check times both on the held-out recent queries of the `ef` calibration
//! (each query head at its own `ef`, the scan re-ranking its `k + k/4` best), interleaved over
//! [`ROUNDS`] rounds so that a load on the machine hits both alike, and measures their recall@100
//! against the exact top-100 of all keys (decode queries see every key). The scan wins when it
//! is faster and reaches the recall the calibration asked of the graph.

use crate::attention::{AttentionIndex, ScanCheck, CHECK_K};
use crate::cancel::Cancel;
use crate::codes::Codes;
use crate::error::Result;
use crate::flat::{FlatIndex, FlatParams};
use crate::scratch::Scratch;
use crate::search::{AnnIndex, SearchOutput, SearchParams};
use std::time::Instant;

/// Timed rounds of each structure over the check queries; the median round counts.
pub const ROUNDS: usize = 3;

/// The int8 scan that the check weighs against the graph.
pub fn scan_params() -> FlatParams {
    FlatParams {
        codes: Codes::I8,
        rerank: 0,
    }
}

/// Times `index` and the int8 scan of its keys on the check rows of `queries` (`visible`:
/// the pooled group's counts; `None`: every row sees every key), and says which is faster at
/// the recall `target` ([`ScanCheck`]).
pub(super) fn measure(
    index: &AttentionIndex,
    queries: &[f32],
    visible: Option<&[u32]>,
    target: f64,
    cancel: &Cancel,
) -> Result<ScanCheck> {
    let t = Instant::now();
    let (n, d) = (index.len(), index.dim());
    let heads = index.check_rows(queries.len() / d.max(1), visible);
    let k = CHECK_K.min(n);
    let scan = FlatIndex::with_params(index.keys().clone(), &scan_params())?;
    let exact = FlatIndex::new(index.keys().clone());
    let mut scratch = Scratch::new(n);
    let mut out = SearchOutput::default();
    // (query, the query head's index in the group, its exact top-k)
    let mut checks: Vec<(&[f32], usize, Vec<u32>)> = Vec::new();
    for (h, head) in heads.iter().enumerate() {
        for &r in head {
            let q = &queries[r * d..(r + 1) * d];
            exact.search_into(q, k, &SearchParams::default(), &mut scratch, &mut out)?;
            checks.push((q, h, out.ids.clone()));
        }
    }
    let mut result = ScanCheck {
        queries: checks.len(),
        ..ScanCheck::default()
    };
    if checks.is_empty() {
        result.seconds = t.elapsed().as_secs_f64();
        return Ok(result);
    }
    let heads_named = heads.len() > 1;
    let mut run = |which: &dyn AnnIndex, recall: &mut f64| -> Result<f64> {
        let start = Instant::now();
        let mut hits = 0usize;
        for (q, h, truth) in &checks {
            cancel.check("scan check")?;
            let params = SearchParams {
                head: heads_named.then_some(*h),
                ..SearchParams::default()
            };
            which.search_into(q, k, &params, &mut scratch, &mut out)?;
            hits += out.ids.iter().filter(|id| truth.contains(id)).count();
        }
        let s = start.elapsed().as_secs_f64();
        *recall = hits as f64 / (checks.len() * k) as f64;
        Ok(s)
    };
    let (mut graph_s, mut scan_s) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        graph_s.push(run(index, &mut result.graph_recall)?);
        scan_s.push(run(&scan, &mut result.scan_recall)?);
    }
    let per_query = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] / checks.len() as f64
    };
    result.graph_us = 1e6 * per_query(&mut graph_s);
    result.scan_us = 1e6 * per_query(&mut scan_s);
    result.scan_wins = result.scan_us < result.graph_us && result.scan_recall >= target;
    result.seconds = t.elapsed().as_secs_f64();
    Ok(result)
}
