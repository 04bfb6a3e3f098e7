//! The structure measured at build ([`scan_check`](crate::attention::AttentionParams::scan_check)):
//! the graph or a scan of the keys' int8 codes with an exact re-rank (the search of
//! `flat:codes=i8`), for a GQA group and then for each of its query heads.
//!
//! Where a graph search scores a large share of the keys (Qwen2.5's 128-dimensional heads at
//! 8K: 13.7 % for recall 0.95) a scan of one byte per dimension reads the keys in order, and
//! is faster than the walk's scattered rows; where the graph scores 1–3 % (Gemma 3 at 128K) it
//! is not close. Under GQA the heads of one group can differ by 8× (Qwen2.5 at 32K, layer 5:
//! one head needs 25 % of the keys from the graph where its five neighbours need 3–6 %). The
//! check times both structures on each head's held-out recent
//! queries of the `ef` calibration (the graph at the head's own `ef`, the scan re-ranking its
//! `k + k/4` best), interleaved over [`ROUNDS`] rounds so that a load on the machine hits both
//! alike, and measures their recall@100 against the exact top-100 of all keys (decode queries
//! see every key). The group takes the scan when the scan is faster over all its heads' queries
//! and reaches the recall the calibration asked of the graph: the build then returns the scan
//! alone, whose decode searches a step's rows in one pass over the codes. A group that keeps the
//! graph routes each head for which the scan is faster on its own queries, at that recall, to a
//! scan of the same keys ([`choose`], [`AttentionIndex::route_heads_to_scan`]). Deciding every
//! head alone was measured and dropped: in the Qwen2.5 32K decode it split 40 of 56 groups,
//! and their walking heads searched slower and less accurately than the check's prefill queries
//! said, where the whole group's scan had been batched (docs/bench/qwen/README.md).

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
    let n_heads = heads.len();
    // hits[structure][head], seconds[structure][head][round]
    let mut hits = [vec![0usize; n_heads], vec![0usize; n_heads]];
    let mut seconds = [vec![Vec::new(); n_heads], vec![Vec::new(); n_heads]];
    let structures: [&dyn AnnIndex; 2] = [index, &scan];
    for round in 0..ROUNDS {
        for h in 0..n_heads {
            for (s, which) in structures.iter().enumerate() {
                let start = Instant::now();
                let mut found = 0usize;
                for (q, _, truth) in checks.iter().filter(|c| c.1 == h) {
                    cancel.check("scan check")?;
                    let params = SearchParams {
                        head: heads_named.then_some(h),
                        ..SearchParams::default()
                    };
                    which.search_into(q, k, &params, &mut scratch, &mut out)?;
                    found += out.ids.iter().filter(|id| truth.contains(id)).count();
                }
                seconds[s][h].push(start.elapsed().as_secs_f64());
                if round == 0 {
                    hits[s][h] = found;
                }
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rows: Vec<usize> = (0..n_heads)
        .map(|h| checks.iter().filter(|c| c.1 == h).count())
        .collect();
    for h in 0..n_heads {
        let per_query = |s: f64| 1e6 * s / rows[h].max(1) as f64;
        let recall = |hits: usize| hits as f64 / (rows[h].max(1) * k) as f64;
        let (graph_s, scan_s) = (median(&mut seconds[0][h]), median(&mut seconds[1][h]));
        result.graph_us += 1e6 * graph_s;
        result.scan_us += 1e6 * scan_s;
        result.head_graph_us.push(per_query(graph_s));
        result.head_scan_us.push(per_query(scan_s));
        result.head_graph_recall.push(recall(hits[0][h]));
        result.head_scan_recall.push(recall(hits[1][h]));
    }
    let all = checks.len() as f64;
    result.graph_us /= all;
    result.scan_us /= all;
    result.graph_recall = hits[0].iter().sum::<usize>() as f64 / (all * k as f64);
    result.scan_recall = hits[1].iter().sum::<usize>() as f64 / (all * k as f64);
    // The group first: its rows share one pass over the codes in a decode step, which the
    // single searches timed here do not see. Only a group that keeps the graph routes the
    // heads the scan serves better on their own.
    result.scan_wins = result.scan_us < result.graph_us && result.scan_recall >= target;
    result.head_scan = match result.scan_wins {
        true => vec![true; n_heads],
        false => choose(
            &result.head_graph_us,
            &result.head_scan_us,
            &result.head_scan_recall,
            target,
        ),
    };
    result.seconds = t.elapsed().as_secs_f64();
    Ok(result)
}

/// Per query head, whether the scan serves it: faster than the graph (each at its median round)
/// and at the calibration's recall `target` on that head's check queries.
pub fn choose(graph_us: &[f64], scan_us: &[f64], scan_recall: &[f64], target: f64) -> Vec<bool> {
    graph_us
        .iter()
        .zip(scan_us)
        .zip(scan_recall)
        .map(|((&g, &s), &r)| s < g && r >= target)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::choose;

    /// A head takes the scan only where it is both faster and at the recall target.
    #[test]
    fn each_head_takes_the_scan_only_where_it_is_faster_at_the_target() {
        let graph = [100.0, 50.0, 200.0, 80.0];
        let scan = [90.0, 90.0, 90.0, 80.0];
        let recall = [1.0, 1.0, 0.9, 1.0];
        assert_eq!(
            choose(&graph, &scan, &recall, 0.95),
            [true, false, false, false]
        );
        assert!(choose(&[], &[], &[], 0.95).is_empty());
    }
}
