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

use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
use crate::metric::isa::{loop_isa, LoopIsa};
use crate::scratch::{BeamList, Scratch, VisitedSet};
use crate::search::{SearchOutput, SearchParams, SearchStats};
use crate::store::{Estimate, Scorer};

use super::Neighbors;

/// The knobs of one beam search (usearch's `index_search_config_t`): a candidate list of `ef`
/// items (at least `k`) of which only the best `width` are expanded (`None`: all; a width below
/// `k` walks like a search with a list of `width` items), and the best `k` returned. Entry points
/// and seeds travel beside the settings, not inside them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeamSettings {
    pub ef: usize,
    pub k: usize,
    pub width: Option<usize>,
    /// Stop once the best `k` have not changed for this many expansions in a row (`None`: run
    /// until the list is expanded; [`SearchParams::patience`]).
    pub patience: Option<usize>,
}

impl BeamSettings {
    /// The settings of a search for `k` keys with `params` on an index whose list size is
    /// `default_ef` when `params.ef` is `None` (raised to `k`).
    ///
    /// Errors: `ef < k` ([`Error::InvalidParam`] named `ef`), a beam width of 0 (named `beam`).
    pub fn for_search(params: &SearchParams, k: usize, default_ef: usize) -> Result<Self> {
        let ef = params.ef.unwrap_or(default_ef.max(k));
        if ef < k {
            return Err(Error::invalid_param(
                "ef",
                ef,
                format!("must be at least k = {k}"),
            ));
        }
        if params.beam == Some(0) {
            return Err(Error::invalid_param("beam", 0, "must be at least 1"));
        }
        if let Some(p) = params.patience {
            p.validate()?;
        }
        Ok(BeamSettings {
            ef,
            k,
            width: params.beam,
            patience: params.patience.map(|p| p.expansions(ef)),
        })
    }

    /// An exhaustive-width search for `k` keys with a list of `ef`, without early stop.
    pub fn new(ef: usize, k: usize) -> Self {
        BeamSettings {
            ef,
            k,
            width: None,
            patience: None,
        }
    }
}

/// Searches `graph` for the `settings.k` keys with the largest `query · key`
/// ([`BeamSettings`]), starting from every id of the slices in `entries` (ids out of range are
/// ignored, and so are neighbour ids `≥ graph.node_count()`, which only an unverified file can
/// hold). Writes `out` (cleared first).
pub fn beam_search<G: Neighbors + ?Sized>(
    graph: &G,
    scorer: &Scorer<'_>,
    query: &[f32],
    entries: &[&[u32]],
    settings: &BeamSettings,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    let mut buf = std::mem::take(&mut scratch.query);
    beam_search_by(
        graph,
        &scorer.bind(query, &mut buf),
        entries,
        settings,
        scratch,
        out,
    );
    scratch.query = buf;
}

/// [`beam_search`] ranking by `est`: `out` holds the best `settings.k` nodes by `est`'s scores,
/// with those scores, and every score counted in `distance_computations` (a caller that
/// estimates moves the count, [`super::codes::search_codes`]).
pub fn beam_search_by<G: Neighbors + ?Sized, E: Estimate + ?Sized>(
    graph: &G,
    est: &E,
    entries: &[&[u32]],
    settings: &BeamSettings,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    walk(&Visit { graph, est }, entries, settings, scratch, out)
}

/// How a beam search scores: its entry points, and the neighbours of each node it expands.
pub(crate) trait Walk {
    /// Number of nodes (entry and neighbour ids at or beyond it are skipped).
    fn node_count(&self) -> usize;
    /// Starts loading what expanding `v` reads (a hint; any `v` is allowed).
    fn prefetch(&self, v: u32);
    /// `out[i]` = the score of `ids[i]` (the entry points).
    fn score_ids(&self, ids: &[u32], out: &mut [f32]);
    /// Scores neighbours of `c` and inserts into `beam` those not `visited` that it takes
    /// (marking them visited); `ids` and `scores` are buffers. Returns the scores computed.
    fn expand(
        &self,
        c: u32,
        visited: &mut VisitedSet,
        beam: &mut BeamList,
        ids: &mut Vec<u32>,
        scores: &mut Vec<f32>,
    ) -> u64;
}

/// The walk of [`beam_search_by`]: neighbours filtered by the visited set first, then the new
/// ones scored as one batch and all inserted.
struct Visit<'a, G: ?Sized, E: ?Sized> {
    graph: &'a G,
    est: &'a E,
}

impl<G: Neighbors + ?Sized, E: Estimate + ?Sized> Walk for Visit<'_, G, E> {
    #[inline(always)]
    fn node_count(&self) -> usize {
        self.graph.node_count()
    }
    #[inline(always)]
    fn prefetch(&self, v: u32) {
        self.graph.prefetch_neighbors(v)
    }
    #[inline(always)]
    fn score_ids(&self, ids: &[u32], out: &mut [f32]) {
        self.est.score_ids(ids, out)
    }
    #[inline(always)]
    fn expand(
        &self,
        c: u32,
        visited: &mut VisitedSet,
        beam: &mut BeamList,
        ids: &mut Vec<u32>,
        scores: &mut Vec<f32>,
    ) -> u64 {
        ids.clear();
        let n = self.graph.node_count() as u32;
        visited.filter_new_below(self.graph.neighbors_of(c), n, ids);
        if ids.is_empty() {
            return 0;
        }
        scores.resize(ids.len(), 0.0);
        self.est.score_ids(ids, scores);
        for (&id, &score) in ids.iter().zip(scores.iter()) {
            beam.insert(score, id);
        }
        ids.len() as u64
    }
}

/// Runs the beam search of `w` from `entries` with the best compiled loop for this CPU.
pub(crate) fn walk<W: Walk + ?Sized>(
    w: &W,
    entries: &[&[u32]],
    settings: &BeamSettings,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    let job = Job {
        walk: w,
        entries,
        settings: *settings,
    };
    #[cfg(target_arch = "x86_64")]
    match loop_isa() {
        LoopIsa::Avx512 => {
            // SAFETY: `loop_isa` returns Avx512 only when every feature that
            // `beam_search_avx512` enables was detected on this CPU.
            return unsafe { beam_search_avx512(&job, scratch, out) };
        }
        LoopIsa::Avx2 => {
            // SAFETY: `loop_isa` returns Avx2 only when every feature that `beam_search_avx2`
            // enables was detected on this CPU.
            return unsafe { beam_search_avx2(&job, scratch, out) };
        }
        LoopIsa::Baseline => {}
    }
    beam_search_impl(&job, scratch, out)
}

/// The arguments of one [`beam_search`], as the compiled versions of its loop take them.
struct Job<'a, W: ?Sized> {
    walk: &'a W,
    entries: &'a [&'a [u32]],
    settings: BeamSettings,
}

/// [`beam_search_impl`] compiled with `$features` enabled (callers check them first).
macro_rules! beam_search_with_features {
    ($name:ident, $features:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<W: Walk + ?Sized>(
            job: &Job<'_, W>,
            scratch: &mut Scratch,
            out: &mut SearchOutput,
        ) {
            beam_search_impl(job, scratch, out)
        }
    };
}

beam_search_with_features!(beam_search_avx2, "avx2,fma,f16c,bmi1,bmi2,popcnt,lzcnt");
beam_search_with_features!(
    beam_search_avx512,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c,bmi1,bmi2,popcnt,lzcnt"
);

#[inline(always)]
fn beam_search_impl<W: Walk + ?Sized>(
    job: &Job<'_, W>,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    let Job {
        walk,
        entries,
        settings:
            BeamSettings {
                ef,
                k,
                width,
                patience,
            },
    } = *job;
    out.clear();
    let n = walk.node_count();
    let Scratch {
        visited,
        beam,
        ids,
        scores,
        ..
    } = scratch;
    visited.reset(n);
    beam.reset(ef.max(k));
    if let Some(w) = width {
        beam.set_width(w);
    }
    let mut stats = SearchStats::default();

    ids.clear();
    for &e in entries.iter().flat_map(|s| s.iter()) {
        if (e as usize) < n && visited.insert(e) {
            ids.push(e);
        }
    }
    scores.resize(ids.len(), 0.0);
    walk.score_ids(ids, scores);
    stats.distance_computations += ids.len() as u64;
    for (&id, &score) in ids.iter().zip(scores.iter()) {
        beam.insert(score, id);
    }

    // Early stop: expansions since the best `k` last changed, against the patience.
    let patience = patience.unwrap_or(usize::MAX);
    let mut mark = beam.best_k_mark(k);
    let mut idle = 0usize;
    while let Some(c) = beam.next_unexpanded() {
        stats.hops += 1;
        // The node expanded next is usually the best unexpanded one now (unless this expansion
        // finds better): start its neighbour-list miss while this one is scored.
        if let Some(next) = beam.peek_unexpanded() {
            walk.prefetch(next);
        }
        stats.distance_computations += walk.expand(c.id, visited, beam, ids, scores);
        let now = beam.best_k_mark(k);
        // Idle only with the best `k` all held: a list short of `k` stops at the graph's end.
        if now != mark || now.0 < k {
            mark = now;
            idle = 0;
        } else {
            idle += 1;
            if idle >= patience {
                break;
            }
        }
    }
    beam.copy_best(k, &mut out.ids, &mut out.scores);
    out.stats = stats;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyStore;

    /// A path graph 0 → 1 → … → n−1 whose scores rise along it, then a long flat tail: the
    /// best `k` keep changing while the walk climbs, then stop changing.
    fn path(n: usize, peak: usize) -> (Vec<Vec<u32>>, KeyStore) {
        let adj: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                if i + 1 < n {
                    vec![i as u32 + 1]
                } else {
                    vec![]
                }
            })
            .collect();
        let rows: Vec<f32> = (0..n)
            .flat_map(|i| {
                let x = if i <= peak { i as f32 } else { -(i as f32) };
                [x, 1.0]
            })
            .collect();
        (adj, KeyStore::from_f32(rows, 2).expect("keys"))
    }

    fn run(adj: &[Vec<u32>], keys: &KeyStore, settings: &BeamSettings) -> SearchOutput {
        let mut scratch = Scratch::new(adj.len());
        let mut out = SearchOutput::default();
        let scorer = keys.scorer();
        beam_search(
            adj,
            &scorer,
            &[1.0, 0.0],
            &[&[0]],
            settings,
            &mut scratch,
            &mut out,
        );
        out
    }

    #[test]
    fn patience_stops_once_the_best_k_settle_and_never_before() {
        let (adj, keys) = path(200, 50);
        let all = run(&adj, &keys, &BeamSettings::new(200, 5));
        assert_eq!(
            all.stats.hops, 200,
            "without patience the whole path is walked"
        );
        // While the walk climbs each expansion changes the best 5, so any patience reaches the
        // peak (node 50, whose expansion is the first idle one); `p` idle expansions end the walk.
        for p in [1, 3, 10] {
            let settings = BeamSettings {
                patience: Some(p),
                ..BeamSettings::new(200, 5)
            };
            let early = run(&adj, &keys, &settings);
            assert_eq!(early.ids, all.ids, "patience {p}");
            assert_eq!(early.stats.hops, 50 + p as u64, "patience {p}");
        }
        // A patience longer than the walk changes nothing.
        let long = BeamSettings {
            patience: Some(1000),
            ..BeamSettings::new(200, 5)
        };
        assert_eq!(run(&adj, &keys, &long), all);
    }

    /// Expansions that find nothing new do not count while the list holds fewer than `k`: a
    /// search asked for more keys than it has found keeps walking (here node 0 links to 1–10,
    /// nodes 1–9 lead back to 0 only, node 10, expanded last, to 11–20).
    #[test]
    fn patience_waits_for_a_full_list() {
        let mut adj: Vec<Vec<u32>> = vec![(1..=10).collect()];
        adj.extend((1..10).map(|_| vec![0]));
        adj.push((11..=20).collect());
        adj.extend((11..=20).map(|_| vec![]));
        let x = |i: usize| match i {
            0 => 100.0,
            1..=9 => 51.0 - i as f32,
            10 => 0.0,
            _ => -(i as f32),
        };
        let rows: Vec<f32> = (0..21).flat_map(|i| [x(i), 1.0]).collect();
        let keys = KeyStore::from_f32(rows, 2).expect("keys");
        let settings = BeamSettings {
            patience: Some(1),
            ..BeamSettings::new(21, 21)
        };
        let out = run(&adj, &keys, &settings);
        assert_eq!(out.ids.len(), 21, "{:?}", out.ids);
        // With k = 5 the best five are settled after node 0's expansion: one idle expansion
        // (node 1's) ends it.
        let five = BeamSettings {
            patience: Some(1),
            ..BeamSettings::new(21, 5)
        };
        let out = run(&adj, &keys, &five);
        assert_eq!(out.ids, [0, 1, 2, 3, 4]);
        assert_eq!(out.stats.hops, 2);
    }

    /// A patience of 0 (of either form) is refused; a count is taken as is, a percentage of
    /// the search's `ef` rounded up (at least 1); the text forms parse and print back.
    #[test]
    fn patience_counts_or_scales_with_ef() {
        use crate::search::Patience;
        for zero in [Patience::Expansions(0), Patience::PercentOfEf(0)] {
            let params = SearchParams {
                patience: Some(zero),
                ..Default::default()
            };
            match BeamSettings::for_search(&params, 10, 64) {
                Err(Error::InvalidParam { name, .. }) => assert_eq!(name, "patience"),
                other => panic!("expected InvalidParam, got {other:?}"),
            }
        }
        let settings = |p: Patience, ef: usize| {
            let params = SearchParams {
                patience: Some(p),
                ef: Some(ef),
                ..Default::default()
            };
            BeamSettings::for_search(&params, 10, 64).expect("settings")
        };
        let s = settings(Patience::Expansions(7), 64);
        assert_eq!((s.ef, s.k, s.patience), (64, 10, Some(7)));
        let quarter = Patience::PercentOfEf(25);
        assert_eq!(settings(quarter, 128).patience, Some(32));
        assert_eq!(settings(quarter, 879).patience, Some(220));
        assert_eq!(settings(Patience::PercentOfEf(1), 10).patience, Some(1));
        for (text, p) in [("32", Patience::Expansions(32)), ("25%", quarter)] {
            assert_eq!(text.parse::<Patience>().expect("parses"), p);
            assert_eq!(p.to_string(), text);
        }
        for bad in ["0", "0%", "-3", "x", "25 %%", ""] {
            assert!(bad.parse::<Patience>().is_err(), "{bad}");
        }
    }
}
