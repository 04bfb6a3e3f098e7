//! Where searches start: the entry points a build chooses ([`EntryRule`]), then the most recent
//! keys ([`AttentionParams::recent_entries`]).

use super::params::{AttentionParams, EntryRule};
use super::projection::Occurrences;
use crate::knn::KnnResult;

/// The build's entry points: those of the params' rule, then the `recent_entries` last keys
/// (newest first) not already among them.
pub(super) fn entry_points(
    params: &AttentionParams,
    occ: &Occurrences,
    lists: &KnnResult,
    keys: &[f32],
    dim: usize,
) -> Vec<u32> {
    let n = keys.len() / dim.max(1);
    let mut entries = choose_entries(params, occ, lists, keys, dim);
    for v in (n.saturating_sub(params.recent_entries)..n).rev() {
        if !entries.contains(&(v as u32)) {
            entries.push(v as u32);
        }
    }
    entries
}

fn choose_entries(
    params: &AttentionParams,
    occ: &Occurrences,
    lists: &KnnResult,
    keys: &[f32],
    dim: usize,
) -> Vec<u32> {
    let n = keys.len() / dim;
    let count = params.entry_count.min(n);
    match params.entry {
        EntryRule::L2Medoid => {
            let mut mean = vec![0.0f64; dim];
            for row in keys.chunks_exact(dim) {
                for (m, &x) in mean.iter_mut().zip(row) {
                    *m += x as f64;
                }
            }
            mean.iter_mut().for_each(|m| *m /= n as f64);
            let mut dist: Vec<(f64, u32)> = keys
                .chunks_exact(dim)
                .enumerate()
                .map(|(i, row)| {
                    let d2 = row
                        .iter()
                        .zip(&mean)
                        .map(|(&x, m)| (x as f64 - m).powi(2))
                        .sum::<f64>();
                    (d2, i as u32)
                })
                .collect();
            dist.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            dist.into_iter().take(count).map(|x| x.1).collect()
        }
        EntryRule::Hub => {
            let mut by_count: Vec<(usize, u32)> =
                (0..n as u32).map(|v| (occ.count(v), v)).collect();
            by_count.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            by_count.into_iter().take(count).map(|x| x.1).collect()
        }
        EntryRule::RecentHub { queries } => {
            let mut counts = vec![0usize; n];
            let rows = lists.rows();
            for r in rows.saturating_sub(queries)..rows {
                for &id in lists.row(r) {
                    counts[id as usize] += 1;
                }
            }
            let mut by_count: Vec<(usize, u32)> = counts
                .iter()
                .enumerate()
                .filter(|x| *x.1 > 0)
                .map(|(v, &c)| (c, v as u32))
                .collect();
            by_count.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut out: Vec<u32> = by_count.into_iter().take(count).map(|x| x.1).collect();
            if out.is_empty() {
                out.push(0);
            }
            out
        }
    }
}
