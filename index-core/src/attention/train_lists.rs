//! The training-query lists of a build before the projection: thinning the queries
//! ([`queries_per_key`](super::params::AttentionParams::queries_per_key)) and unmasking the
//! causal lists that look far back ([`global_full`](super::params::AttentionParams::global_full)).

use crate::cancel::Cancel;
use crate::error::Result;
use crate::knn::{KnnBackend, KnnOptions, KnnResult};
use crate::store::KeyStore;

/// Keys before a query's position that count as near it for
/// [`global_full`](super::params::AttentionParams::global_full).
pub(super) const NEAR_WINDOW: usize = 1024;

/// The causal rows of `lists` whose query looks far back: it sees more than [`NEAR_WINDOW`]
/// keys (`visible[r]`, or `r + 1` without counts) and less than `share` of its list lies among
/// the last [`NEAR_WINDOW`] of them.
pub(super) fn far_rows(
    lists: &KnnResult,
    visible: Option<&[u32]>,
    n: usize,
    share: f64,
) -> Vec<usize> {
    (0..lists.rows())
        .filter(|&r| {
            let seen = visible.map_or((r + 1).min(n), |v| v[r] as usize);
            let row = lists.row(r);
            let near_from = seen.saturating_sub(NEAR_WINDOW) as u32;
            let near = row.iter().filter(|&&id| id >= near_from).count();
            seen > NEAR_WINDOW && !row.is_empty() && (near as f64) < share * row.len() as f64
        })
        .collect()
}

/// Replaces rows `rows` of `lists` by their queries' top-`k` over every key (no mask).
pub(super) fn unmask_rows(
    lists: &mut KnnResult,
    rows: &[usize],
    queries: &[f32],
    keys: &KeyStore,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let (d, k) = (keys.dim(), lists.k);
    let picked: Vec<f32> = rows
        .iter()
        .flat_map(|&r| queries[r * d..(r + 1) * d].iter().copied())
        .collect();
    let options = KnnOptions {
        cancel: cancel.clone(),
        ..KnnOptions::default()
    };
    let full = knn.topk(&picked, keys, k, &options)?;
    for (i, &r) in rows.iter().enumerate() {
        lists.ids[r * k..(r + 1) * k].copy_from_slice(&full.ids[i * k..(i + 1) * k]);
        lists.scores[r * k..(r + 1) * k].copy_from_slice(&full.scores[i * k..(i + 1) * k]);
    }
    Ok(())
}

/// The training queries the kNN reads: at most `ceil(per_key · n)` rows of `queries`
/// (`dim` columns), evenly strided (row `⌊i · m / max⌋` for `i < max`), in their order; all of
/// them when `per_key` is 0 or they are fewer. Rows that do not divide into `dim` columns are
/// passed on whole, for the kNN to reject.
pub(super) fn thin<T: Clone>(
    queries: &[T],
    dim: usize,
    per_key: f64,
    n: usize,
) -> std::borrow::Cow<'_, [T]> {
    let m = queries.len() / dim.max(1);
    let rows = match thinned_rows(m, per_key, n) {
        Some(rows) if queries.len().is_multiple_of(dim.max(1)) => rows,
        _ => return queries.into(),
    };
    let mut out = Vec::with_capacity(rows.len() * dim);
    for r in rows {
        out.extend_from_slice(&queries[r * dim..(r + 1) * dim]);
    }
    out.into()
}

/// The rows of `m` that [`thin`] keeps for `per_key · n` (`None`: all of them).
pub(super) fn thinned_rows(m: usize, per_key: f64, n: usize) -> Option<Vec<usize>> {
    let max = (per_key * n as f64).ceil() as usize;
    if per_key <= 0.0 || max >= m {
        return None;
    }
    let max = max.max(1);
    Some((0..max).map(|i| i * m / max).collect())
}

#[cfg(test)]
mod tests {
    use super::{far_rows, thin, unmask_rows, NEAR_WINDOW};
    use crate::knn::{CpuKnn, KnnBackend, KnnOptions, KnnResult};
    use crate::store::KeyStore;
    use crate::Cancel;

    /// Rows `0..m` of width 2, row `r` holding `(r, r)`.
    fn rows(m: usize) -> Vec<f32> {
        (0..m).flat_map(|r| [r as f32, r as f32]).collect()
    }

    fn firsts(x: &[f32]) -> Vec<usize> {
        x.chunks_exact(2).map(|r| r[0] as usize).collect()
    }

    #[test]
    fn thinning_strides_evenly_and_keeps_order() {
        let q = rows(9);
        assert_eq!(firsts(&thin(&q, 2, 0.0, 4)), (0..9).collect::<Vec<_>>());
        // ceil(0.75 · 4) = 3 of 9 rows: every third.
        assert_eq!(firsts(&thin(&q, 2, 0.75, 4)), vec![0, 3, 6]);
        // ceil(1.25 · 4) = 5 of 9 rows.
        assert_eq!(firsts(&thin(&q, 2, 1.25, 4)), vec![0, 1, 3, 5, 7]);
        // More allowed than given: all of them, borrowed.
        assert!(matches!(thin(&q, 2, 3.0, 4), std::borrow::Cow::Borrowed(_)));
        // A tiny ratio still keeps one row.
        assert_eq!(firsts(&thin(&q, 2, 1e-9, 4)), vec![0]);
        // Ragged input is passed on whole for the kNN to reject.
        assert_eq!(thin(&q[..5], 2, 0.5, 4).len(), 5);
    }

    /// Rows that look far back: more than the window seen, less than the share near the end.
    #[test]
    fn far_rows_are_the_queries_looking_far_back() {
        let w = NEAR_WINDOW as u32;
        let pad = KnnResult::PAD;
        let lists = KnnResult {
            k: 4,
            ids: [
                [1, 2, 3, 4],                   // sees only the window: never far
                [2 * w - 1, 2 * w - 2, 10, 20], // half near the end
                [10, 20, 30, 2 * w - 1],        // a quarter near
                [pad; 4],                       // empty
                [10, 20, pad, pad],             // short and all far
            ]
            .concat(),
            scores: vec![0.0; 20],
        };
        let visible = [w, 2 * w, 2 * w, 3 * w, 3 * w];
        let n = 3 * NEAR_WINDOW;
        assert_eq!(far_rows(&lists, Some(&visible), n, 0.3), vec![2, 4]);
        assert_eq!(far_rows(&lists, Some(&visible), n, 0.6), vec![1, 2, 4]);
        assert_eq!(
            far_rows(&lists, Some(&visible), n, 0.0),
            Vec::<usize>::new()
        );
        // Without counts row r sees r + 1 keys: none of these rows sees past the window.
        assert!(far_rows(&lists, None, n, 1.0).is_empty());
    }

    /// Unmasked rows are the full exact top-k of their queries; the other rows stay.
    #[test]
    fn unmasked_rows_are_the_full_top_k() {
        let (n, d, m, k) = (300, 8, 20, 5);
        let data = crate::synth::ood(n, m, d, 3);
        let keys = KeyStore::from_f32(data.keys[..n * d].to_vec(), d).expect("keys");
        let queries = &data.train_queries[..m * d];
        let causal = CpuKnn
            .topk(queries, &keys, k, &KnnOptions::causal(true))
            .expect("causal");
        let full = CpuKnn
            .topk(queries, &keys, k, &KnnOptions::default())
            .expect("full");
        let mut lists = causal.clone();
        let rows = [3, 11, 19];
        unmask_rows(&mut lists, &rows, queries, &keys, &CpuKnn, &Cancel::new()).expect("unmask");
        for r in 0..m {
            let want = if rows.contains(&r) { &full } else { &causal };
            assert_eq!(lists.row(r), want.row(r), "row {r}");
            assert_eq!(lists.row_scores(r), want.row_scores(r), "row {r}");
        }
    }
}
