//! Best-first beam search for maximum inner product.
//!
//! One sorted candidate list of `ef` items ([`crate::scratch::BeamList`]) holds the best nodes
//! seen; the search expands its best unexpanded node until every node in the list is expanded.
//! Neighbours are gathered first (visited check), then scored as one batch with their rows
//! prefetched, and counted once per batch.
//!
//! The loop is compiled three times — baseline x86-64, AVX2 and AVX-512 — and the best version
//! for the running CPU is picked at run time (the crate itself is built for baseline x86-64, so
//! without this the list and visited-set code would be limited to SSE2).

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
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::metric::kernels().isa;
        if isa == "avx512" {
            // SAFETY: the kernel set is "avx512" only when avx512f, avx2, fma and f16c were
            // detected at run time; the extra AVX-512 subsets are checked here.
            if std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl")
            {
                return unsafe {
                    beam_search_avx512(graph, scorer, query, entries, ef, k, scratch, out)
                };
            }
        }
        if isa == "avx512" || isa == "avx2" {
            // SAFETY: the kernel set is "avx2" or "avx512" only when avx2, fma and f16c were
            // detected at run time.
            return unsafe { beam_search_avx2(graph, scorer, query, entries, ef, k, scratch, out) };
        }
    }
    beam_search_impl(graph, scorer, query, entries, ef, k, scratch, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,bmi1,bmi2,popcnt,lzcnt")]
#[allow(clippy::too_many_arguments)]
unsafe fn beam_search_avx2<G: Neighbors + ?Sized>(
    graph: &G,
    scorer: &Scorer<'_>,
    query: &[f32],
    entries: &[&[u32]],
    ef: usize,
    k: usize,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    beam_search_impl(graph, scorer, query, entries, ef, k, scratch, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c,bmi1,bmi2,popcnt,lzcnt")]
#[allow(clippy::too_many_arguments)]
unsafe fn beam_search_avx512<G: Neighbors + ?Sized>(
    graph: &G,
    scorer: &Scorer<'_>,
    query: &[f32],
    entries: &[&[u32]],
    ef: usize,
    k: usize,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    beam_search_impl(graph, scorer, query, entries, ef, k, scratch, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn beam_search_impl<G: Neighbors + ?Sized>(
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
