//! `ReTopK`: reuse the top-k sets of similar past queries ("Recall Before You Rank",
//! arXiv 2607.27692), with any [`AnnIndex`] as the exact path.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`ReTopK`] (`prime`, `step`), [`StepPath`], [`StepStats`] |
//! | `params.rs` | [`ReTopKParams`], the paper's defaults and the quality preset |
//! | `cache.rs` | the FIFO cache of (normalized query, chosen ids) and its cosine ranking |
//!
//! One `ReTopK` serves one (layer, query head). It keeps the last `C` pairs (normalized query,
//! ids chosen for it). A step normalizes the new query and computes its cosine with every
//! cached query, then takes one of two paths:
//! - **exact**, when the cache is empty, on a refresh step, or when the best cosine is below
//!   `τ`: the caller's `exact` index answers (a [`crate::FlatIndex`] for the paper's exact
//!   top-K, or a graph index such as [`crate::AttentionIndex`]). With
//!   [`ReTopKParams::seed_fallback`] the recalled sets go to it as seeds
//!   ([`AnnIndex::search_seeded`]).
//! - **reuse** otherwise: the candidates are the union of the id sets of the `R` most similar
//!   cached queries plus the last `W` keys (ids `n − W .. n`), scored exactly against the query;
//!   the best `K` are kept.
//!
//! Either way the chosen ids are pushed into the cache with the normalized query, evicting the
//! oldest pair beyond `C`. The paper recalls sets of past *decode* steps; [`ReTopK::prime`]
//! also lets a head start from its prefill queries.
//!
//! ```
//! use qkindex::{FlatIndex, KeyStore, ReTopK, ReTopKParams, Scratch, SearchOutput, SearchParams};
//! use std::sync::Arc;
//!
//! let data = qkindex::synth::ood(1000, 4, 16, 1);
//! let keys = Arc::new(KeyStore::from_f32(data.keys, 16)?);
//! let exact = FlatIndex::new(keys.clone());
//! let mut rt = ReTopK::new(ReTopKParams { k: 50, ..ReTopKParams::default() }, 16)?;
//! let prefill: Vec<usize> = (1..=1000).collect(); // causal: query i sees keys 0..=i
//! rt.prime(&data.train_queries, &prefill, &keys)?;
//! let (mut scratch, mut out) = (Scratch::default(), SearchOutput::default());
//! let q = &data.test_queries[..16];
//! let stats = rt.step(q, &keys, &exact, &SearchParams::default(), &mut scratch, &mut out)?;
//! println!("{}: {} keys scored", stats.path.name(), stats.candidates);
//! assert_eq!(out.ids.len(), 50);
//! # Ok::<(), qkindex::Error>(())
//! ```
//!
//! Refresh steps: steps are numbered from 1 in the order [`ReTopK::step`] succeeds (a failed
//! step does not count, [`ReTopK::prime`] does not count); step `s` is a refresh step when
//! `s % refresh == 0`, i.e. the `refresh`-th, `2·refresh`-th, … step.

mod cache;
mod params;

pub use params::ReTopKParams;

use crate::error::{check_finite, Error, Result};
use crate::scratch::{Scratch, TopK};
use crate::search::{check_query, AnnIndex, SearchOutput, SearchParams, SearchStats};
use crate::store::KeyStore;
use cache::{normalize_into, QueryCache};

/// Keys scored per kernel call when [`ReTopK::prime`] scans a prefix.
const CHUNK: usize = 512;

/// Which path a step took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepPath {
    /// The recalled sets plus the recent window were re-ranked exactly.
    Reuse,
    /// The best cached query was less similar than `τ`: exact path.
    LowSimilarity,
    /// A refresh step (every `T_r`-th): exact path. Takes precedence over `LowSimilarity`.
    Refresh,
    /// Nothing was cached yet: exact path.
    EmptyCache,
}

impl StepPath {
    /// The name used in reports and in Python (`"reuse"`, `"low_similarity"`, `"refresh"`,
    /// `"empty_cache"`).
    pub fn name(self) -> &'static str {
        match self {
            StepPath::Reuse => "reuse",
            StepPath::LowSimilarity => "low_similarity",
            StepPath::Refresh => "refresh",
            StepPath::EmptyCache => "empty_cache",
        }
    }

    /// True for the paths that ran the exact index.
    pub fn is_exact(self) -> bool {
        self != StepPath::Reuse
    }
}

/// What one [`ReTopK::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct StepStats {
    pub path: StepPath,
    /// Keys scored: on the reuse path the candidates re-ranked (each scored once); on an exact
    /// path the exact index's `distance_computations`.
    pub candidates: usize,
    /// Cosine of the query with the most similar cached query; −∞ when the cache was empty
    /// (serialized as `null` by JSON).
    pub best_similarity: f32,
    /// Cosines computed against cached queries (the cache length before the step); not
    /// counted in `search`.
    pub similarity_computations: u64,
    /// Inner products with keys and graph hops of the step (reuse: `candidates`, 0 hops; exact:
    /// the exact index's stats). Equal to the `stats` of the step's [`SearchOutput`].
    pub search: SearchStats,
}

/// The ReTopK selector of one (layer, query head): the cache and the buffers its steps reuse.
#[derive(Clone, Debug)]
pub struct ReTopK {
    params: ReTopKParams,
    dim: usize,
    cache: QueryCache,
    steps: u64,
    /// The current query, normalized (`dim`).
    unit: Vec<f32>,
    /// `(cosine, cache entry)` of every entry, the `R` most similar first.
    sims: Vec<(f32, usize)>,
    /// Candidate ids of a reuse step, deduplicated.
    candidates: Vec<u32>,
    /// Scores of `candidates`.
    scores: Vec<f32>,
    /// The seeds of the last exact-path search: the caller's, then the recalled ids.
    seeds: Vec<u32>,
}

impl ReTopK {
    /// A selector with an empty cache for queries of dimension `dim`.
    ///
    /// Errors: parameters out of range ([`ReTopKParams::validate`]), `dim == 0`.
    pub fn new(params: ReTopKParams, dim: usize) -> Result<Self> {
        params.validate()?;
        if dim == 0 {
            return Err(Error::invalid_param("dim", dim, "must be positive"));
        }
        Ok(ReTopK {
            cache: QueryCache::new(params.c),
            params,
            dim,
            steps: 0,
            unit: Vec::with_capacity(dim),
            sims: Vec::new(),
            candidates: Vec::new(),
            scores: Vec::new(),
            seeds: Vec::new(),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &ReTopKParams {
        &self.params
    }

    /// Dimension of queries and keys.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Cached pairs (`≤ c`).
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// Successful steps so far (prime does not count).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Overlap of a selected set with the exact top-k: `|found ∩ exact| / |exact|`
    /// ([`crate::eval::recall`]).
    pub fn overlap(found: &[u32], exact: &[u32]) -> f32 {
        crate::eval::recall(found, exact) as f32
    }

    /// Pushes pairs of past queries into the cache (as steps would, without counting steps):
    /// for each of the last `c` queries that see at least one key, oldest first, its exact
    /// top-`min(k, visible[i])` over keys `0..visible[i]`.
    ///
    /// `queries` is `m × dim`, row-major, with `m = visible.len()`; query `i` may only see key
    /// ids `0..visible[i]` (causal prefill: `visible[i] = i + 1`). Queries with `visible[i] == 0`
    /// are skipped. Pairs already cached stay and are evicted oldest first.
    ///
    /// Errors: key or query dimension other than `dim`, non-finite queries,
    /// `visible[i] > keys.len()`.
    pub fn prime(&mut self, queries: &[f32], visible: &[usize], keys: &KeyStore) -> Result<()> {
        if keys.dim() != self.dim {
            return Err(Error::DimensionMismatch {
                what: "keys",
                expected: self.dim,
                got: keys.dim(),
            });
        }
        let m = visible.len();
        if queries.len() != m * self.dim {
            return Err(Error::DimensionMismatch {
                what: "queries (visible.len() rows of dim)",
                expected: m * self.dim,
                got: queries.len(),
            });
        }
        check_finite("queries", queries, self.dim)?;
        let n = keys.len();
        if let Some((i, &v)) = visible.iter().enumerate().find(|(_, &v)| v > n) {
            return Err(Error::invalid_param(
                "visible",
                v,
                format!("visible[{i}] exceeds the number of keys ({n})"),
            ));
        }
        // The last `c` queries that see a key, oldest first.
        let mut first = m;
        let mut picked = 0;
        while first > 0 && picked < self.params.c {
            first -= 1;
            picked += usize::from(visible[first] > 0);
        }
        let scorer = keys.scorer();
        let mut best = TopK::default();
        let mut chunk = vec![0.0f32; CHUNK];
        let (mut ids, mut scores) = (Vec::new(), Vec::new());
        for (query, &v) in queries
            .chunks_exact(self.dim)
            .zip(visible)
            .skip(first)
            .filter(|(_, &v)| v > 0)
        {
            best.reset(self.params.k.min(v));
            let mut start = 0;
            while start < v {
                let len = CHUNK.min(v - start);
                scorer.score_range(query, start, &mut chunk[..len]);
                best.push_block(&chunk[..len], start as u32);
                start += len;
            }
            ids.clear();
            scores.clear();
            best.drain_sorted(&mut ids, &mut scores);
            normalize_into(query, &mut self.unit);
            self.cache.push(&self.unit, &ids);
        }
        Ok(())
    }

    /// Selects the top `min(k, n)` keys for `query` (`dim` values) from `keys` (`n` keys) and
    /// writes them into `out` (cleared first), best first with their exact scores, then caches
    /// the pair. `exact` is the exact path and must index the same ids as `keys` (same `n` and
    /// `dim`); `exact_params` are its search parameters (seeded with the recalled sets when
    /// `seed_fallback` is set).
    ///
    /// On the reuse path the result holds fewer than `k` ids only when fewer candidates exist.
    /// `scratch` serves both paths (sized on demand); once `out`, `scratch` and the cache have
    /// grown, a reuse step allocates nothing.
    ///
    /// Errors: an empty store ([`Error::Empty`]); a query of the wrong dimension or non-finite
    /// ([`Error::DimensionMismatch`], [`Error::NonFinite`]); `keys` or `exact` of another
    /// dimension, or `exact.len() != keys.len()` ([`Error::DimensionMismatch`]); whatever the
    /// exact index returns (for example `ef < k`). A failed step leaves the cache and the step
    /// count unchanged.
    pub fn step(
        &mut self,
        query: &[f32],
        keys: &KeyStore,
        exact: &dyn AnnIndex,
        exact_params: &SearchParams,
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<StepStats> {
        self.step_seeded(query, keys, exact, exact_params, &[], scratch, out)
    }

    /// [`ReTopK::step`] whose exact-path searches also start from the caller's `seeds` (before
    /// the recalled ids).
    #[allow(clippy::too_many_arguments)]
    pub fn step_seeded(
        &mut self,
        query: &[f32],
        keys: &KeyStore,
        exact: &dyn AnnIndex,
        exact_params: &SearchParams,
        seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<StepStats> {
        let n = keys.len();
        if n == 0 {
            return Err(Error::Empty { what: "keys" });
        }
        let k = self.params.k.min(n);
        check_query(query, self.dim, k, n)?;
        if keys.dim() != self.dim {
            return Err(Error::DimensionMismatch {
                what: "keys",
                expected: self.dim,
                got: keys.dim(),
            });
        }
        if exact.dim() != self.dim {
            return Err(Error::DimensionMismatch {
                what: "exact index dimension",
                expected: self.dim,
                got: exact.dim(),
            });
        }
        if exact.len() != n {
            return Err(Error::DimensionMismatch {
                what: "exact index keys (must index the same ids as keys)",
                expected: n,
                got: exact.len(),
            });
        }

        let step_index = self.steps + 1;
        normalize_into(query, &mut self.unit);
        self.cache.rank(&self.unit, self.params.r, &mut self.sims);
        let recalled = self.params.r.min(self.sims.len());
        let best_similarity = self.sims.first().map_or(f32::NEG_INFINITY, |s| s.0);
        let path = if self.cache.is_empty() {
            StepPath::EmptyCache
        } else if step_index.is_multiple_of(self.params.refresh as u64) {
            StepPath::Refresh
        } else if best_similarity < self.params.tau {
            StepPath::LowSimilarity
        } else {
            StepPath::Reuse
        };

        let candidates = if path == StepPath::Reuse {
            // Union of the recalled sets and the window, each id once.
            scratch.visited.reset(n);
            self.candidates.clear();
            for &(_, i) in &self.sims[..recalled] {
                if let Some(e) = self.cache.get(i) {
                    scratch
                        .visited
                        .filter_new_below(&e.ids, n as u32, &mut self.candidates);
                }
            }
            for id in n.saturating_sub(self.params.w) as u32..n as u32 {
                if scratch.visited.insert(id) {
                    self.candidates.push(id);
                }
            }
            self.scores.resize(self.candidates.len(), 0.0);
            keys.scorer()
                .score_ids(query, &self.candidates, &mut self.scores);
            out.clear();
            scratch.best.reset(k);
            for (&id, &score) in self.candidates.iter().zip(&self.scores) {
                scratch.best.push(score, id);
            }
            scratch.best.drain_sorted(&mut out.ids, &mut out.scores);
            out.stats = SearchStats {
                distance_computations: self.candidates.len() as u64,
                hops: 0,
                ..Default::default()
            };
            self.candidates.len()
        } else {
            self.seeds.clear();
            self.seeds.extend_from_slice(seeds);
            if self.params.seed_fallback {
                scratch.visited.reset(n);
                for &(_, i) in &self.sims[..recalled] {
                    if let Some(e) = self.cache.get(i) {
                        scratch
                            .visited
                            .filter_new_below(&e.ids, n as u32, &mut self.seeds);
                    }
                }
            }
            exact.search_seeded(query, k, exact_params, &self.seeds, scratch, out)?;
            usize::try_from(out.stats.distance_computations).unwrap_or(usize::MAX)
        };

        self.cache.push(&self.unit, &out.ids);
        self.steps = step_index;
        Ok(StepStats {
            path,
            candidates,
            best_similarity,
            similarity_computations: self.sims.len() as u64,
            search: out.stats,
        })
    }

    /// The seeds the last exact-path step handed to the exact index (the caller's seeds, then
    /// the recalled ids); for tests and diagnostics.
    pub fn last_seeds(&self) -> &[u32] {
        &self.seeds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FlatIndex;
    use std::sync::Arc;

    fn setup(n: usize, dim: usize, seed: u64) -> (Arc<KeyStore>, FlatIndex, Vec<f32>) {
        let data = crate::synth::ood(n, 40, dim, seed);
        let keys = Arc::new(KeyStore::from_f32(data.keys, dim).expect("keys"));
        let flat = FlatIndex::new(keys.clone());
        (keys, flat, data.test_queries)
    }

    #[test]
    fn first_step_is_exact_then_a_repeated_query_is_reused() {
        let (keys, flat, queries) = setup(300, 16, 1);
        let params = ReTopKParams {
            k: 10,
            ..ReTopKParams::default()
        };
        let mut rt = ReTopK::new(params, 16).expect("new");
        let (mut scratch, mut out) = (Scratch::default(), SearchOutput::default());
        let params = SearchParams::default();
        let mut step = |rt: &mut ReTopK, q: &[f32], out: &mut SearchOutput| {
            rt.step(q, &keys, &flat, &params, &mut scratch, out)
                .expect("step")
        };
        let q = &queries[..16];
        let s = step(&mut rt, q, &mut out);
        assert_eq!(s.path, StepPath::EmptyCache);
        assert!(s.best_similarity == f32::NEG_INFINITY);
        assert_eq!(s.similarity_computations, 0);
        assert_eq!(s.candidates, 300);
        let exact = out.clone();
        // The same query scaled: cosine 1, reuse; the set is its own exact top-k again.
        let q2: Vec<f32> = q.iter().map(|x| 2.0 * x).collect();
        let s = step(&mut rt, &q2, &mut out);
        assert_eq!(s.path, StepPath::Reuse);
        assert!((s.best_similarity - 1.0).abs() < 1e-5);
        assert_eq!(s.similarity_computations, 1);
        assert_eq!(out.ids, exact.ids);
        // 10 recalled ids plus the 32 window ids, less those in both.
        let overlap = exact.ids.iter().filter(|&&i| i >= 300 - 32).count();
        assert_eq!(s.candidates, 10 + 32 - overlap);
        assert_eq!(s.search, out.stats);
        assert_eq!(rt.cache_len(), 2);
        assert_eq!(rt.steps(), 2);
        assert_eq!(ReTopK::overlap(&out.ids, &exact.ids), 1.0);
    }

    #[test]
    fn step_path_names_and_serialization() {
        assert_eq!(StepPath::LowSimilarity.name(), "low_similarity");
        assert!(StepPath::Refresh.is_exact() && !StepPath::Reuse.is_exact());
        let s = StepStats {
            path: StepPath::EmptyCache,
            candidates: 3,
            best_similarity: f32::NEG_INFINITY,
            similarity_computations: 0,
            search: SearchStats::default(),
        };
        let json = serde_json::to_string(&s).expect("json");
        assert!(json.contains("\"path\":\"empty_cache\""), "{json}");
        assert!(json.contains("\"best_similarity\":null"), "{json}");
    }

    #[test]
    fn prime_takes_the_last_c_queries_that_see_a_key() {
        let (keys, _, queries) = setup(100, 8, 2);
        let params = ReTopKParams {
            c: 3,
            r: 1,
            k: 5,
            ..ReTopKParams::default()
        };
        let mut rt = ReTopK::new(params, 8).expect("new");
        let q = &queries[..6 * 8];
        rt.prime(q, &[1, 2, 3, 0, 50, 0], &keys).expect("prime");
        assert_eq!(rt.cache_len(), 3);
        assert_eq!(rt.steps(), 0);
        // Oldest first: queries 1 (sees 2 keys), 2 (3 keys), 4 (50 keys, k = 5).
        let sets: Vec<Vec<u32>> = (0..3)
            .map(|i| rt.cache.get(i).map(|e| e.ids.clone()).unwrap_or_default())
            .collect();
        assert_eq!(sets[0].len(), 2);
        assert!(sets[0].iter().all(|&i| i < 2));
        assert_eq!(sets[1].len(), 3);
        assert_eq!(sets[2].len(), 5);
        let prefix = KeyStore::from_f32(keys.to_f32()[..50 * 8].to_vec(), 8).expect("prefix");
        let flat = FlatIndex::new(Arc::new(prefix));
        let want = flat
            .search(
                &q[4 * 8..5 * 8],
                5,
                &SearchParams::default(),
                &mut Scratch::default(),
            )
            .expect("flat");
        assert_eq!(sets[2], want.ids);
    }
}
