//! Best-first beam search for maximum inner product.
//!
//! The frontier is a max-heap of scored nodes still to expand; the result list keeps the `ef`
//! best seen. The search stops when the best unexpanded node scores below the worst of a full
//! result list. Neighbours are gathered first (visited check), then scored as one batch with the
//! next row prefetched, and counted once per batch.

use crate::scratch::{Scored, Scratch};
use crate::search::{SearchOutput, SearchStats};
use crate::store::Scorer;

use super::Neighbors;

/// Searches `graph` for the `k` keys with the largest `query · key`, with a result list of
/// `ef ≥ k`, starting from `entries` (ids out of range are ignored). Writes `out` (cleared first).
#[allow(clippy::too_many_arguments)]
pub fn beam_search<G: Neighbors + ?Sized>(
    graph: &G,
    scorer: &Scorer<'_>,
    query: &[f32],
    entries: &[u32],
    ef: usize,
    k: usize,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    out.clear();
    let n = graph.node_count();
    let Scratch {
        visited,
        frontier,
        best,
        ids,
        scores,
    } = scratch;
    visited.reset(n);
    frontier.clear();
    best.reset(ef.max(k));
    let mut stats = SearchStats::default();

    ids.clear();
    for &e in entries {
        if (e as usize) < n && visited.insert(e) {
            ids.push(e);
        }
    }
    scores.resize(ids.len(), 0.0);
    scorer.score_ids(query, ids, scores);
    stats.distance_computations += ids.len() as u64;
    for (&id, &score) in ids.iter().zip(scores.iter()) {
        if best.push(score, id) {
            frontier.push(Scored { score, id });
        }
    }

    while let Some(c) = frontier.pop() {
        if best.is_full() && c.score < best.worst() {
            break;
        }
        stats.hops += 1;
        ids.clear();
        for &w in graph.neighbors_of(c.id) {
            if visited.insert(w) {
                ids.push(w);
            }
        }
        if ids.is_empty() {
            continue;
        }
        scores.resize(ids.len(), 0.0);
        scorer.score_ids(query, ids, scores);
        stats.distance_computations += ids.len() as u64;
        for (&id, &score) in ids.iter().zip(scores.iter()) {
            if !best.is_full() || score > best.worst() {
                best.push(score, id);
                frontier.push(Scored { score, id });
            }
        }
    }
    best.drain_sorted(k, &mut out.ids, &mut out.scores);
    out.stats = stats;
}
