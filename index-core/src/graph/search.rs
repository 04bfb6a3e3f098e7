//! Best-first beam search for maximum inner product.
//!
//! One sorted candidate list of `ef` items ([`crate::scratch::BeamList`]) holds the best nodes
//! seen; the search expands its best unexpanded node until every node in the list is expanded. Neighbours are gathered first (visited check), then scored as one batch with the
//! next row prefetched, and counted once per batch.

use crate::scratch::Scratch;
use crate::search::{SearchOutput, SearchStats};
use crate::store::Scorer;

use super::Neighbors;

/// Searches `graph` for the `k` keys with the largest `query · key`, with a result list of
/// `ef ≥ k`, starting from every id of the slices in `entries` (ids out of range are ignored).
/// Writes `out` (cleared first).
#[allow(clippy::too_many_arguments)]
pub fn beam_search<G: Neighbors + ?Sized>(
    graph: &G,
    scorer: &Scorer<'_>,
    query: &[f32],
    entries: &[&[u32]],
    ef: usize,
    k: usize,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    out.clear();
    let n = graph.node_count();
    let Scratch {
        visited,
        beam,
        ids,
        scores,
        ..
    } = scratch;
    visited.reset(n);
    beam.reset(ef.max(k));
    let mut stats = SearchStats::default();

    ids.clear();
    for &e in entries.iter().flat_map(|s| s.iter()) {
        if (e as usize) < n && visited.insert(e) {
            ids.push(e);
        }
    }
    scores.resize(ids.len(), 0.0);
    scorer.score_ids(query, ids, scores);
    stats.distance_computations += ids.len() as u64;
    for (&id, &score) in ids.iter().zip(scores.iter()) {
        beam.insert(score, id);
    }

    while let Some(c) = beam.next_unexpanded() {
        stats.hops += 1;
        ids.clear();
        visited.filter_new(graph.neighbors_of(c.id), ids);
        if ids.is_empty() {
            continue;
        }
        scores.resize(ids.len(), 0.0);
        scorer.score_ids(query, ids, scores);
        stats.distance_computations += ids.len() as u64;
        for (&id, &score) in ids.iter().zip(scores.iter()) {
            beam.insert(score, id);
        }
    }
    beam.copy_best(k, &mut out.ids, &mut out.scores);
    out.stats = stats;
}
